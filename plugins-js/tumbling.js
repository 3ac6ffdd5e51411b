// `tumbling`: sums per key in tumbling event-time windows, with timers. Records are
// `timestamp,key,value` lines; each window of `size-ms` (default 10000) fires when the
// watermark passes its end: `start,end,sum`. Records for a window that already fired are
// late: dropped, counted (`late-records-dropped`) and sent to side output `late`.
import { InvalidConfig, Operator, exportOperator, postcard } from 'sluice-sdk';

export class Tumbling extends Operator {
  static open(ctx) {
    ctx.config.checkKnown(['size-ms']);
    const op = new Tumbling();
    op.size = ctx.config.int('size-ms', 10000);
    if (op.size <= 0) throw new InvalidConfig(`config \`size-ms\` = ${op.size}: must be positive`);
    if (!ctx.keyed) throw new InvalidConfig('tumbling needs keyed input (`key_by` in the job file)');
    op.sums = ctx.mapState('sums', postcard.I64, postcard.F64);
    op.late = ctx.sideOutput('late');
    return op;
  }

  process(record, ctx) {
    const ts = record.timestamp;
    if (ts === null) throw new Error('the record has no event time (configure `timestamp` on the source)');
    const start = ts - (((ts % this.size) + this.size) % this.size);
    const end = start + this.size;
    if (end - 1 <= ctx.currentWatermark()) {
      ctx.addCounter('late-records-dropped');
      ctx.emitTo(this.late, record.key, record.value);
      return;
    }
    const value = Number(record.valueText().split(',')[2]);
    let total = this.sums.get(ctx, record.key, start);
    if (total === null) {
      ctx.registerEventTimer(record.key, end - 1);
      total = 0;
    }
    this.sums.put(ctx, record.key, start, total + value);
  }

  onTimer(timer, ctx) {
    const start = timer.timestamp + 1 - this.size;
    const total = this.sums.get(ctx, timer.key, start);
    if (total !== null) {
      ctx.emit(timer.key, `${start},${start + this.size},${total}`);
      this.sums.remove(ctx, timer.key, start);
    }
  }
}

exportOperator(Tumbling);
