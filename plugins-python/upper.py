"""`upper`: uppercases each record's value (UTF-8; a value that is not UTF-8 gets its
ASCII letters uppercased, as the Rust `uppercase` does), keeping key and timestamp."""

from sluice_sdk import Operator, export


class Upper(Operator):
    def process(self, record, ctx):
        try:
            upper = record.value.decode("utf-8").upper().encode("utf-8")
        except UnicodeDecodeError:
            upper = record.value.upper()  # bytes: ASCII letters only
        ctx.emit(record.key, upper)


export(Upper)
