// `upper`: uppercases each record's value (UTF-8), keeping key and timestamp.
import { Operator, exportOperator } from 'sluice-sdk';

export class Upper extends Operator {
  process(record, ctx) {
    ctx.emit(record.key, record.valueText().toUpperCase());
  }
}

exportOperator(Upper);
