import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Harness } from 'sluice-sdk/testing';
import { Upper } from './{{lib}}.js';

test('uppercases values', () => {
  const h = new Harness(Upper);
  h.process('k', 'straße');
  assert.deepEqual(h.takeValues(), ['STRASSE']);
});
