// `count_batch`: `count` (the running count per key, emitted after each record) written
// with the batch API: a batch's keys read from state in one call, counted in a Map, the
// new counts written back and the outputs emitted at once. Output as `count`'s with
// `emit = "every"` and `format = "text"`; its state `count` holds plain i64s
// (`plain.I64`, decoded and encoded a batch at a time), not `count`'s postcard u64s.
import { InvalidConfig, Operator, exportOperator, plain } from 'sluice-sdk';

const ENCODER = new TextEncoder();

export class CountBatch extends Operator {
  static open(ctx) {
    ctx.config.checkKnown([]);
    if (!ctx.keyed) throw new InvalidConfig('count_batch needs keyed input: partition its input with `key_by` in the job file');
    const op = new CountBatch();
    op.counts = ctx.valueState('count', plain.I64);
    return op;
  }

  processBatch(batch, ctx) {
    // Keys as strings for the Map (one per distinct key), the bytes kept for state.
    const ids = batch.keys.map((k) => {
      if (k === null) throw new Error('a record has no key');
      return String.fromCharCode.apply(null, k);
    });
    const first = new Map();
    ids.forEach((id, i) => first.has(id) || first.set(id, i));
    const distinct = [...first.values()].map((i) => batch.keys[i]);
    const totals = new Map();
    const stored = this.counts.getMany(ctx, distinct);
    [...first.keys()].forEach((id, j) => totals.set(id, Number(stored[j] ?? 0)));
    const running = ids.map((id) => {
      const n = totals.get(id) + 1;
      totals.set(id, n);
      return ENCODER.encode(String(n));
    });
    this.counts.putMany(ctx, distinct, [...totals.values()]);
    ctx.emitBatch(running, batch.keys, batch.timestamps);
  }
}

exportOperator(CountBatch);
