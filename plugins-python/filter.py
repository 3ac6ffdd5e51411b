"""`filter`: keeps the records whose value (UTF-8) matches every condition given.

Config: `contains`, `prefix`, `min-length` (characters), `negate` (`true`: keep the
others instead).
"""

from sluice_sdk import Operator, export

KEYS = ["contains", "prefix", "min-length", "negate"]


class Filter(Operator):
    @classmethod
    def open(cls, ctx):
        ctx.config.check_known(KEYS)
        op = cls()
        op.contains = ctx.config.get("contains")
        op.prefix = ctx.config.get("prefix")
        op.min_length = ctx.config.parse("min-length", int, 0)
        op.negate = ctx.config.parse("negate", _boolean, False)
        return op

    def process(self, record, ctx):
        text = record.value.decode("utf-8", errors="replace")
        keep = (
            (self.contains is None or self.contains in text)
            and (self.prefix is None or text.startswith(self.prefix))
            and len(text) >= self.min_length
        )
        if keep != self.negate:
            ctx.emit_record(record)


def _boolean(text):
    if text not in ("true", "false"):
        raise ValueError(text)
    return text == "true"


export(Filter)
