// The SDK's encodings and call rules, natively in Node.
import assert from 'node:assert/strict';
import { test } from 'node:test';

import { Record, Writer, forEachRecord, writeRecord, CodecError } from '../src/codec.js';
import * as postcard from '../src/postcard.js';
import { Operator } from '../src/core.js';
import { Harness, HarnessError } from '../src/testing.js';

const bytes = (s) => new TextEncoder().encode(s);
const hex = (b) => Buffer.from(b).toString('hex');

test('records round-trip with every field, in the layout of the WIT', () => {
  const w = new Writer();
  writeRecord(w, bytes('v'), bytes('k'), 42, [[bytes('h'), bytes('1')]], 3, 2);
  writeRecord(w, bytes(''), null, null);
  writeRecord(w, bytes('x'), bytes(''), -Infinity);
  const got = [];
  forEachRecord(w.finish(), (r) => got.push([r.valueText(), r.keyText(), r.timestamp, r.headers?.length ?? 0, r.partition, r.output]));
  assert.deepEqual(got, [
    ['v', 'k', 42, 1, 3, 2],
    ['', null, null, 0, null, 0],
    ['x', '', -Infinity, 0, null, 0],
  ]);
  const one = new Writer();
  writeRecord(one, bytes('v'), bytes('k'), 1);
  assert.equal(hex(one.finish()), '03' + '0100000000000000' + '010000006b' + '0100000076');
  assert.throws(() => forEachRecord(Uint8Array.of(2, 5, 0, 0, 0, 97), () => {}), CodecError);
});

test('postcard matches the Rust encodings', () => {
  assert.equal(hex(postcard.U64.encode(300)), 'ac02');
  assert.equal(hex(postcard.I64.encode(-1)), '01');
  assert.equal(hex(postcard.I64.encode(-65)), '8101');
  assert.equal(hex(postcard.F64.encode(1.5)), '000000000000f83f');
  assert.equal(hex(postcard.STR.encode('ab')), '026162');
  assert.equal(hex(new postcard.Tuple(postcard.I64, postcard.U64).encode([1, 2])), '0202');
  assert.equal(postcard.U64.decode(postcard.U64.encode(2n ** 64n - 1n)), 2n ** 64n - 1n);
  assert.equal(postcard.I64.decode(postcard.I64.encode(-(2n ** 63n))), -(2n ** 63n));
  assert.equal(postcard.I64.decode(postcard.I64.encode(-123456)), -123456);
  assert.equal(hex(postcard.U8.encode(200)), 'c8'); // u8 and i8: one raw byte
  assert.equal(hex(postcard.I8.encode(-1)), 'ff');
  assert.equal(hex(new postcard.Seq(postcard.U8).encode([200])), '01c8');
  assert.equal(postcard.I8.decode(Uint8Array.of(0x80)), -128);
  assert.throws(() => postcard.U64.encode(-1));
  assert.throws(() => postcard.U64.decode(Uint8Array.of(0x80)));
});

class Keyed extends Operator {
  static open(ctx) {
    const op = new Keyed();
    op.n = ctx.valueState('n', postcard.U64);
    op.seen = ctx.mapState('seen', postcard.STR, postcard.U64);
    op.log = ctx.listState('log', postcard.BYTES);
    return op;
  }
  process(record, ctx) {
    const n = this.n.update(ctx, record.key, (n) => (n ?? 0) + 1);
    assert.equal(this.n.get(ctx, record.key), n); // reads see this call's writes
    this.seen.put(ctx, record.key, record.valueText(), n);
    this.log.add(ctx, record.key, record.value);
    ctx.registerEventTimer(record.key, record.timestamp + 10);
  }
  onTimer(timer, ctx) {
    const entries = this.seen.entries(ctx, timer.key);
    const log = this.log.get(ctx, timer.key).map((b) => new TextDecoder().decode(b));
    ctx.emit(timer.key, JSON.stringify([entries, log]));
  }
}

test('keyed state and timers survive a snapshot', () => {
  const h = new Harness(Keyed, { keyed: true });
  h.process('k', 'a', 100);
  h.process('k', 'b', 105);
  assert.deepEqual(h.timers(), [[110, 'k'], [115, 'k']]);
  const h2 = new Harness(Keyed, { keyed: true, restore: h.snapshot() });
  h2.processWatermark(112);
  assert.deepEqual(h2.takeValues(), [JSON.stringify([[['a', 1], ['b', 2]], ['a', 'b']])]);
  assert.equal(postcard.U64.decode(h2.stateValue('n', 'k')), 2);
});

test('keyed state needs keyed input and says so', () => {
  assert.throws(() => new Harness(Keyed), (e) => e instanceof HarnessError && e.invalidConfig && /keyed/.test(e.message));
});

class Throws extends Operator {
  process() {
    null.field;
  }
}

test('an exception fails the call with its stack', () => {
  const h = new Harness(Throws);
  assert.throws(() => h.process(null, 'x'), (e) => !e.invalidConfig && /`process` threw TypeError/.test(e.message) && /sdk\.test\.js/.test(e.message));
});

class EmitsInClose extends Operator {
  close(ctx) {
    ctx.emit(null, 'late');
  }
}

test('emitting in close fails the call, as on the host', () => {
  const h = new Harness(EmitsInClose);
  h.finish();
  assert.throws(() => h.close(), (e) => /from `close`, which may not emit/.test(e.message));
});

class Timed extends Operator {
  process(record, ctx) {
    ctx.registerEventTimer(record.key, record.timestamp + 1);
    ctx.emit(record.key, 'r' + record.valueText());
  }
  onTimer(timer, ctx) {
    ctx.emit(timer.key, `t${timer.timestamp}`);
  }
}

test('a batch with watermarks inside fires timers where they are due', () => {
  const h = new Harness(Timed);
  const records = [0, 1, 2, 3].map((i) => new Record(bytes(String(i)), bytes('k'), i * 10));
  h.processBatch(records, [[2, 15], [3, 25]]);
  assert.deepEqual(h.takeValues(), ['r0', 'r1', 't1', 't11', 'r2', 't21', 'r3']);
  assert.equal(h.watermark, 25);
});

class TwoInputs extends Operator {
  process(record, ctx) {
    ctx.emit(null, `${ctx.inputIndex()}:${record.valueText()}`);
  }
}

test('records say which input they came from', () => {
  const h = new Harness(TwoInputs, { inputs: [['left', false], ['right', true]] });
  h.process(null, 'a', null, 1);
  h.process(null, 'b');
  assert.deepEqual(h.takeValues(), ['1:a', '0:b']);
  assert.throws(() => h.process(null, 'c', null, 2), RangeError);
});

class Discount extends Operator {
  process(record, ctx) {
    const order = record.json();
    ctx.emitJson(record.key, { user: order.user, total: order.amount * 0.9 });
  }
}

test('JSON values are read and written as objects', () => {
  const h = new Harness(Discount);
  h.process('k', '{"user": "zo\\u00eb", "amount": 10.0, "tags": []}');
  assert.deepEqual(h.takeValues(), ['{"user":"zoë","total":9}']);
  assert.throws(() => h.process('k', 'not json'), HarnessError);
});

class Juggler extends Operator {
  static open(ctx) {
    const op = new Juggler();
    op.plans = ctx.mapState('plans', postcard.I64, postcard.STR);
    return op;
  }
  process(record, ctx) {
    this.plans.put(ctx, record.key, record.timestamp, record.valueText());
    ctx.registerEventTimer(record.key, record.timestamp);
  }
  onTimer(timer, ctx) {
    ctx.emit(timer.key, `t${timer.timestamp}`);
    const [action, at] = (this.plans.get(ctx, timer.key, timer.timestamp) ?? '').split(':');
    if (action === 'delete') ctx.deleteEventTimer(timer.key, Number(at));
    if (action === 'again') ctx.registerEventTimer(timer.key, Number(at));
  }
}

test('a timer deleted by an earlier one of the list does not fire', () => {
  const h = new Harness(Juggler, { keyed: true });
  h.process('k', 'delete:20', 10);
  h.process('k', '', 20);
  h.processWatermark(30);
  assert.deepEqual(h.takeValues(), ['t10']);
  assert.deepEqual(h.timers(), []);
});

test('a timer registered again while due fires once, deleted before it runs', async () => {
  let h = new Harness(Juggler, { keyed: true });
  h.process('k', 'again:20', 10);
  h.process('k', '', 20);
  h.processWatermark(30);
  assert.deepEqual(h.takeValues(), ['t10', 't20']);
  h = new Harness(Juggler, { keyed: true });
  h.process('k', 'again:20', 10);
  h.process('k', 'again:20', 20);
  const { encodeTimers, decodeEffects } = await import('../src/codec.js');
  const call = h.instance.onTimers(h.host, encodeTimers([[0, 10, bytes('k')], [0, 20, bytes('k')]]));
  assert.deepEqual(decodeEffects(call.effects.w.finish()).map((e) => e[0]), [5, 6, 5]);
});

test('records emitted keep the headers and partition of the record processed', () => {
  class Echo extends Operator {
    process(record, ctx) {
      ctx.emit(null, record.value);
    }
  }
  const h = new Harness(Echo);
  h.processBatch([new Record(bytes('a'), null, null, [[bytes('h'), bytes('1')]], 3)]);
  const [out] = h.takeOutput();
  assert.equal(out.partition, 3);
  assert.equal(out.headers.length, 1);
});

class Remembers extends Operator {
  static open(ctx) {
    const op = new Remembers();
    op.last = ctx.valueState('last', postcard.STR, 100);
    op.seen = ctx.listState('seen', postcard.STR, 100);
    return op;
  }
  process(record, ctx) {
    ctx.emit(record.key, JSON.stringify([this.last.get(ctx, record.key), this.seen.get(ctx, record.key).length]));
    this.last.put(ctx, record.key, record.valueText());
    this.seen.add(ctx, record.key, record.valueText());
  }
}

test('state with a time-to-live reads as absent once it expired', () => {
  const h = new Harness(Remembers, { keyed: true, processingTime: 1000 });
  h.process('k', 'a');
  h.setProcessingTime(1099);
  h.process('k', 'b');
  h.setProcessingTime(1150); // "a" expired at 1100, "b" (written at 1099) lives
  h.process('k', 'c');
  h.setProcessingTime(1300);
  h.process('k', 'd');
  assert.deepEqual(h.takeValues(), ['[null,0]', '["a",1]', '["b",1]', '[null,0]']);
});

// Emits as many bytes as the record's value says, and keeps that many in its own state.
class Floods extends Operator {
  process(record, ctx) {
    this.size = Number(record.valueText());
    ctx.emit(null, 'x'.repeat(this.size));
  }
  snapshot() {
    return new Uint8Array(this.size ?? 0);
  }
}

test('a call returning more than the output limit fails as on the host', () => {
  const h = new Harness(Floods, { maxOutputBytes: 1000 });
  h.process(null, '500');
  assert.equal(h.takeValues().length, 1);
  h.snapshot();
  assert.throws(() => h.process(null, '2000'), (e) => e instanceof HarnessError && !e.invalidConfig && /bytes of records and effects from one call; the limit is 1000/.test(e.message));
  // Nothing of the failed call counts.
  assert.deepEqual(h.takeValues(), []);
  assert.throws(() => h.snapshot(), (e) => e instanceof HarnessError && /the limit is 1000/.test(e.message));
});

test('the batch API gives what the per-record one does', async () => {
  const { Count } = await import('../../plugins-js/count.js');
  const { CountBatch } = await import('../../plugins-js/count_batch.js');
  const { FilterBatch } = await import('../../plugins-js/filter_batch.js');
  const enc = (s) => new TextEncoder().encode(s);
  const keys = Array.from({ length: 40 }, (_, i) => enc(`k${(i * 7) % 5}`));
  const one = new Harness(Count, { keyed: true });
  const batched = new Harness(CountBatch, { keyed: true });
  for (const h of [one, batched]) {
    // Batches split by watermarks, and a later batch reading what the earlier wrote.
    h.processBatch(keys.slice(0, 25).map((k, i) => new Record(enc(''), k, i)), [[10, 5], [20, 9]]);
    h.processBatch(keys.slice(25).map((k, i) => new Record(enc(''), k, i)));
  }
  const values = (h) => h.takeOutput().map((r) => [new TextDecoder().decode(r.key), new TextDecoder().decode(r.value), r.timestamp]);
  assert.deepEqual(values(batched), values(one));
  const k0 = new DataView(batched.stateValue('count', enc('k0')).buffer);
  assert.equal(k0.getBigInt64(0, true), 8n);

  const h = new Harness(FilterBatch, { config: { contains: '7' } });
  const records = [
    new Record(enc('a7'), enc('k'), 1, [[enc('h'), enc('1')]], 0),
    new Record(enc('b'), null, null, [[enc('h'), enc('2')]], 1),
    new Record(enc('77'), null, 3, [[enc('h'), enc('3')]], 2),
  ];
  h.processBatch(records);
  // Kept as they are: keys, timestamps, headers (renumbered) and partitions.
  const out = h.takeOutput();
  assert.deepEqual(out.map((r) => [r.value, r.key, r.timestamp, r.headers, r.partition]), [records[0], records[2]].map((r) => [r.value, r.key, r.timestamp, r.headers, r.partition]));
});

test('getMany sees the call\'s own writes and what earlier calls wrote', async () => {
  const { plain } = await import('../src/index.js');
  class Batched extends Operator {
    static open(ctx) {
      const op = new Batched();
      op.v = ctx.valueState('v', plain.I64);
      return op;
    }
    processBatch(batch, ctx) {
      const before = this.v.getMany(ctx, batch.keys);
      this.v.putMany(ctx, batch.keys, batch.values.map((v) => Number(new TextDecoder().decode(v))));
      const after = this.v.getMany(ctx, batch.keys);
      ctx.emitBatch(before.map((b, i) => `${b}->${after[i]}`), batch.keys);
    }
  }
  const enc = (s) => new TextEncoder().encode(s);
  const h = new Harness(Batched, { keyed: true });
  h.processBatch([new Record(enc('1'), enc('a')), new Record(enc('2'), enc('b'))]);
  h.processBatch([new Record(enc('3'), enc('a')), new Record(enc('4'), enc('c'))]);
  assert.deepEqual(h.takeOutput().map((r) => new TextDecoder().decode(r.value)), ['null->1', 'null->2', '1->3', 'null->4']);
});

test('state values match the golden vectors every SDK reads', async () => {
  const { readFileSync } = await import('node:fs');
  const plain = await import('../src/plain.js');
  const path = new URL('../../tests/fixtures/state-values.json', import.meta.url);
  const { values } = JSON.parse(readFileSync(path, 'utf8'));
  const int = (v) => {
    const n = BigInt(v);
    return n <= BigInt(Number.MAX_SAFE_INTEGER) && n >= BigInt(Number.MIN_SAFE_INTEGER) ? Number(n) : n;
  };
  const codecs = {
    u64: [postcard.U64, int],
    i64: [postcard.I64, int],
    f64: [postcard.F64, (v) => v],
    str: [postcard.STR, (v) => v],
    bytes: [postcard.BYTES, (v) => Uint8Array.from(v)],
    'option<u64>': [new postcard.Option(postcard.U64), (v) => (v === null ? null : int(v))],
    'seq<u8>': [new postcard.Seq(postcard.U8), (v) => v],
    'tuple<i64,u64>': [new postcard.Tuple(postcard.I64, postcard.U64), (v) => v.map(int)],
    'plain-i64': [plain.I64, int],
    'plain-u64': [plain.U64, int],
    'plain-f64': [plain.F64, (v) => v],
  };
  assert.deepEqual(new Set(values.map((v) => v.type)), new Set(Object.keys(codecs)));
  const hex = (b) => Buffer.from(b).toString('hex');
  for (const v of values) {
    const [codec, convert] = codecs[v.type];
    const value = convert(v.value);
    assert.equal(hex(codec.encode(value)), v.hex, JSON.stringify(v));
    assert.deepEqual(codec.decode(Uint8Array.from(Buffer.from(v.hex, 'hex'))), value, JSON.stringify(v));
  }
});
