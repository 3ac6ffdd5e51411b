// `count`: the number of records per key, as the Rust and Python `count` plugins keep it:
// keyed value state `count` holds a postcard u64, so the three restore each other's
// checkpoints. `emit = "every"` (default): the running count after each record;
// `emit = "final"`: each key's total once, from an event-time timer at the end of time.
// `format`: `text` (default) or `postcard`.
import { InvalidConfig, Operator, exportOperator, postcard } from 'sluice-sdk';

export class Count extends Operator {
  static open(ctx) {
    ctx.config.checkKnown(['format', 'emit']);
    const format = ctx.config.get('format', 'text');
    if (format !== 'text' && format !== 'postcard') throw new InvalidConfig(`config \`format\` = ${JSON.stringify(format)}: expected text or postcard`);
    const emit = ctx.config.get('emit', 'every');
    if (emit !== 'every' && emit !== 'final') throw new InvalidConfig(`config \`emit\` = ${JSON.stringify(emit)}: expected every or final`);
    if (!ctx.keyed) throw new InvalidConfig('count needs keyed input: partition its input with `key_by` in the job file');
    const op = new Count();
    op.final = emit === 'final';
    op.postcard = format === 'postcard';
    op.counts = ctx.valueState('count', postcard.U64);
    return op;
  }

  process(record, ctx) {
    if (record.key === null) throw new Error('the record has no key');
    const n = this.counts.update(ctx, record.key, (n) => (n ?? 0) + 1);
    if (!this.final) this.emitCount(ctx, record.key, n);
    else if (n === 1) ctx.registerEventTimer(record.key, Infinity);
  }

  onTimer(timer, ctx) {
    const n = this.counts.get(ctx, timer.key);
    if (n !== null) {
      this.emitCount(ctx, timer.key, n);
      this.counts.clear(ctx, timer.key);
    }
  }

  emitCount(ctx, key, n) {
    ctx.emit(key, this.postcard ? postcard.U64.encode(n) : String(n));
  }
}

exportOperator(Count);
