"""`tumbling`: sums per key in tumbling event-time windows, with timers.

Records are `timestamp,key,value` lines (event time from the source); each window of
`size-ms` (default 10000) fires when the watermark passes its end and emits
`start,end,sum` with key = the record's key. Records for a window that already fired
are late: dropped, counted as `late-records-dropped`, and sent to side output `late`.
Sums live in keyed map state `sums` (window start → sum).
"""

from sluice_sdk import InvalidConfig, Operator, export, postcard


class Tumbling(Operator):
    @classmethod
    def open(cls, ctx):
        ctx.config.check_known(["size-ms"])
        op = cls()
        op.size = ctx.config.parse("size-ms", int, 10_000)
        if op.size <= 0:
            raise InvalidConfig(f"config `size-ms` = {op.size}: must be positive")
        if not ctx.keyed:
            raise InvalidConfig("tumbling needs keyed input (`key_by` in the job file)")
        op.sums = ctx.map_state("sums", postcard.I64, postcard.F64)
        op.late = ctx.side_output("late")
        return op

    def process(self, record, ctx):
        if record.timestamp is None:
            raise ValueError("the record has no event time (configure `timestamp` on the source)")
        start = record.timestamp - record.timestamp % self.size
        end = start + self.size
        if end - 1 <= ctx.current_watermark():
            ctx.add_counter("late-records-dropped")
            ctx.emit_to(self.late, record.key, record.value)
            return
        value = float(record.value.decode().split(",")[2])
        total = self.sums.get(ctx, record.key, start)
        if total is None:
            ctx.register_event_timer(record.key, end - 1)
            total = 0.0
        self.sums.put(ctx, record.key, start, total + value)

    def on_timer(self, timer, ctx):
        start = timer.timestamp + 1 - self.size
        total = self.sums.get(ctx, timer.key, start)
        if total is not None:
            ctx.emit(timer.key, f"{start},{start + self.size},{_number(total)}".encode())
            self.sums.remove(ctx, timer.key, start)


def _number(x):
    return str(int(x)) if x == int(x) else repr(x)


export(Tumbling)
