import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Harness } from 'sluice-sdk/testing';
import { Count } from './{{lib}}.js';

test('counts per key and restores', () => {
  let h = new Harness(Count, { keyed: true });
  for (const k of ['x', 'y', 'x']) h.process(k, '');
  assert.deepEqual(h.takeValues(), ['1', '1', '2']);
  h = new Harness(Count, { keyed: true, restore: h.snapshot() });
  h.process('x', '');
  assert.deepEqual(h.takeValues(), ['3']);
});
