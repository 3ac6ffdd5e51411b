// `upper`: uppercases each record's value (UTF-8; a value that is not UTF-8 gets its
// ASCII letters uppercased, as the Rust `uppercase` does), keeping key and timestamp.
import { Operator, exportOperator } from 'sluice-sdk';

export class Upper extends Operator {
  process(record, ctx) {
    let upper;
    try {
      upper = record.valueText().toUpperCase();
    } catch {
      upper = record.value.map((b) => (b >= 0x61 && b <= 0x7a ? b - 32 : b));
    }
    ctx.emit(record.key, upper);
  }
}

exportOperator(Upper);
