// `count`: the number of records per key, as the Rust and Python `count` plugins keep it:
// keyed value state `count` holds a postcard u64, so the three restore each other's
// checkpoints. `emit = "every"` (default): the running count after each record;
// `emit = "final"`: each key's total once, from an event-time timer at the end of time.
import { InvalidConfig, Operator, exportOperator, postcard } from 'sluice-sdk';

export class Count extends Operator {
  static open(ctx) {
    ctx.config.checkKnown(['emit']);
    const emit = ctx.config.get('emit', 'every');
    if (emit !== 'every' && emit !== 'final') throw new InvalidConfig(`config \`emit\` = ${JSON.stringify(emit)}: expected every or final`);
    if (!ctx.keyed) throw new InvalidConfig('count needs keyed input: partition its input with `key_by` in the job file');
    const op = new Count();
    op.final = emit === 'final';
    op.counts = ctx.valueState('count', postcard.U64);
    return op;
  }

  process(record, ctx) {
    if (record.key === null) throw new Error('the record has no key');
    const n = this.counts.update(ctx, record.key, (n) => (n ?? 0) + 1);
    if (!this.final) ctx.emit(record.key, String(n));
    else if (n === 1) ctx.registerEventTimer(record.key, Infinity);
  }

  onTimer(timer, ctx) {
    const n = this.counts.get(ctx, timer.key);
    if (n !== null) {
      ctx.emit(timer.key, String(n));
      this.counts.clear(ctx, timer.key);
    }
  }
}

exportOperator(Count);
