// `filter`: keeps the records whose value (UTF-8) matches every condition given.
// Config: `contains`, `prefix`, `min-length` (characters), `negate` (`true`: the others).
import { InvalidConfig, Operator, exportOperator } from 'sluice-sdk';

export class Filter extends Operator {
  static open(ctx) {
    ctx.config.checkKnown(['contains', 'prefix', 'min-length', 'negate']);
    const op = new Filter();
    op.contains = ctx.config.get('contains');
    op.prefix = ctx.config.get('prefix');
    op.minLength = ctx.config.int('min-length', 0);
    const negate = ctx.config.get('negate', 'false');
    if (negate !== 'true' && negate !== 'false') throw new InvalidConfig(`config \`negate\` = ${JSON.stringify(negate)}: expected true or false`);
    op.negate = negate === 'true';
    return op;
  }

  process(record, ctx) {
    const text = record.valueText();
    const keep = (this.contains === null || text.includes(this.contains)) && (this.prefix === null || text.startsWith(this.prefix)) && [...text].length >= this.minLength;
    if (keep !== this.negate) ctx.emitRecord(record);
  }
}

exportOperator(Filter);
