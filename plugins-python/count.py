"""`count`: the number of records per key, as the Rust `count` plugin keeps it.

Keyed `ValueState` `count` holds a postcard u64, the encoding of the Rust SDK's
`ValueState<u64>`: either plugin restores the other's checkpoints. `emit = "every"`
(default) emits the running count after each record; `emit = "final"` each key's
total once, from an event-time timer at the end of time. `format`: `text` (default)
or `postcard`.
"""

from sluice_sdk import InvalidConfig, Operator, export, postcard

END_OF_TIME = (1 << 63) - 1


class Count(Operator):
    @classmethod
    def open(cls, ctx):
        ctx.config.check_known(["format", "emit"])
        op = cls()
        op.postcard = _choice(ctx.config, "format", ["text", "postcard"]) == "postcard"
        op.final = _choice(ctx.config, "emit", ["every", "final"]) == "final"
        if not ctx.keyed:
            raise InvalidConfig(
                "count needs keyed input: partition its input with `key_by` in the job file"
            )
        op.counts = ctx.value_state("count", postcard.U64)
        return op

    def process(self, record, ctx):
        if record.key is None:
            raise ValueError("the record has no key")
        n = self.counts.update(ctx, record.key, lambda n: (n or 0) + 1)
        if not self.final:
            self._emit(ctx, record.key, n)
        elif n == 1:
            ctx.register_event_timer(record.key, END_OF_TIME)

    def on_timer(self, timer, ctx):
        n = self.counts.get(ctx, timer.key)
        if n is not None:
            self._emit(ctx, timer.key, n)
            self.counts.clear(ctx, timer.key)

    def _emit(self, ctx, key, n):
        ctx.emit(key, postcard.U64.encode(n) if self.postcard else str(n).encode())


def _choice(config, key, choices):
    value = config.get(key, choices[0])
    if value not in choices:
        raise InvalidConfig(f"config `{key}` = {value!r}: expected {' or '.join(choices)}")
    return value


export(Count)
