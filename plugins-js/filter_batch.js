// `filter_batch`: `filter` written with the batch API — keeps the records whose value
// contains `contains` (UTF-8), as they are.
import { Operator, exportOperator } from 'sluice-sdk';

const DECODER = new TextDecoder();

export class FilterBatch extends Operator {
  static open(ctx) {
    ctx.config.checkKnown(['contains']);
    const op = new FilterBatch();
    op.contains = ctx.config.require('contains');
    return op;
  }

  processBatch(batch, ctx) {
    ctx.emitBatch(batch.filter(batch.values.map((v) => DECODER.decode(v).includes(this.contains))));
  }
}

exportOperator(FilterBatch);
