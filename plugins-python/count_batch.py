"""`count_batch`: `count` (the running count per key, emitted after each record) written
with the batch API: a batch's keys read from state in one call, counted in a dict, the
new counts written back and the outputs emitted at once. Output as `count`'s with
`emit = "every"` and `format = "text"`; its state `count` holds plain i64s
(`sluice_sdk.plain`, decoded and encoded a batch at a time), which the Rust SDK reads as
`Plain<i64>`, not `count`'s postcard u64s.
"""

from sluice_sdk import InvalidConfig, Operator, export, plain


class CountBatch(Operator):
    @classmethod
    def open(cls, ctx):
        ctx.config.check_known([])
        if not ctx.keyed:
            raise InvalidConfig(
                "count_batch needs keyed input: partition its input with `key_by` in the job file"
            )
        op = cls()
        op.counts = ctx.value_state("count", plain.I64)
        return op

    def process_batch(self, batch, ctx):
        keys = batch.keys
        distinct = list(dict.fromkeys(keys))
        if None in distinct:
            raise ValueError("a record has no key")
        totals = {k: n or 0 for k, n in zip(distinct, self.counts.get_many(ctx, distinct))}
        running = []
        for key in keys:
            n = totals[key] + 1
            totals[key] = n
            running.append(b"%d" % n)
        self.counts.put_many(ctx, totals.keys(), totals.values())
        ctx.emit_batch(running, keys, batch.timestamps)


export(CountBatch)
