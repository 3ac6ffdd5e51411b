// The example plugins in the native harness.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { Harness } from 'sluice-sdk/testing';
import { Upper } from '../upper.js';
import { Filter } from '../filter.js';
import { Count } from '../count.js';
import { Tumbling } from '../tumbling.js';

test('upper', () => {
  const h = new Harness(Upper);
  h.process('k', 'straße');
  assert.deepEqual(h.takeValues(), ['STRASSE']);
  h.process('k', Uint8Array.of(0xff, 0x61)); // not UTF-8: ASCII letters only
  assert.deepEqual([...h.takeOutput()[0].value], [0xff, 0x41]);
});

test('filter', () => {
  const h = new Harness(Filter, { config: { prefix: 'a', 'min-length': '2' } });
  for (const v of ['ab', 'a', 'ba']) h.process(null, v);
  assert.deepEqual(h.takeValues(), ['ab']);
  assert.throws(() => new Harness(Filter, { config: { prefx: 'a' } }), /unknown config key `prefx`/);
});

test('count, every record and final', () => {
  let h = new Harness(Count, { keyed: true });
  for (const k of ['x', 'y', 'x']) h.process(k, '');
  assert.deepEqual(h.takeValues(), ['1', '1', '2']);
  h = new Harness(Count, { keyed: true, config: { format: 'postcard' } });
  h.process('x', '');
  assert.deepEqual([...h.takeOutput()[0].value], [1]);
  h = new Harness(Count, { keyed: true, config: { emit: 'final' } });
  for (const k of ['x', 'y', 'x']) h.process(k, '');
  h.finish();
  assert.deepEqual(h.takeValues().sort(), ['1', '2']);
});

test('tumbling windows and late records', () => {
  const h = new Harness(Tumbling, { keyed: true, config: { 'size-ms': '10' } });
  for (const [ts, v] of [[1, 2], [5, 3], [12, 4]]) h.process('k', `${ts},k,${v}`, ts);
  h.processWatermark(10);
  assert.deepEqual(h.takeValues(), ['0,10,5']);
  h.process('k', '3,k,1', 3);
  assert.equal(h.counter('late-records-dropped'), 1);
  assert.deepEqual(h.takeSideOutput('late').map((r) => new TextDecoder().decode(r.value)), ['3,k,1']);
  h.finish();
  assert.deepEqual(h.takeValues(), ['10,20,4']);
});
