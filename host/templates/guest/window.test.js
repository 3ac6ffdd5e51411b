import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Harness } from 'sluice-sdk/testing';
import { Tumbling } from './{{lib}}.js';

test('sums per window when the watermark passes', () => {
  const h = new Harness(Tumbling, { keyed: true, config: { 'size-ms': '10' } });
  for (const [ts, v] of [[1, 2], [5, 3], [12, 4]]) h.process('k', `${ts},k,${v}`, ts);
  h.processWatermark(10);
  assert.deepEqual(h.takeValues(), ['0,10,5']);
});
