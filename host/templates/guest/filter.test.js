import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Harness } from 'sluice-sdk/testing';
import { Filter } from './{{lib}}.js';

test('keeps what matches', () => {
  const h = new Harness(Filter, { config: { contains: 'na' } });
  for (const v of ['banana', 'apple']) h.process(null, v);
  assert.deepEqual(h.takeValues(), ['banana']);
});
