"""`upper`: uppercases each record's value (UTF-8), keeping key and timestamp."""

from sluice_sdk import Operator, export


class Upper(Operator):
    def process(self, record, ctx):
        ctx.emit(record.key, record.value.decode("utf-8").upper().encode("utf-8"))


export(Upper)
