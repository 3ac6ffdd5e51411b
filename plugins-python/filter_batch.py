"""`filter_batch`: `filter` written with the batch API — keeps the records whose value
contains `contains` (bytes, UTF-8), as they are, one list comprehension per batch.
"""

from sluice_sdk import Operator, export


class FilterBatch(Operator):
    @classmethod
    def open(cls, ctx):
        ctx.config.check_known(["contains"])
        op = cls()
        op.contains = ctx.config.require("contains").encode()
        return op

    def process_batch(self, batch, ctx):
        contains = self.contains
        ctx.emit_batch(batch.filter([contains in v for v in batch.values]))


export(FilterBatch)
