"""Sluice operators in Python: subclass `Operator`, register it with `export`, build it
into a component with `scripts/build-python-plugin.sh`, and test it natively with
`sluice_sdk.testing.Harness`.

```python
from sluice_sdk import Operator, export, postcard

class Count(Operator):
    @classmethod
    def open(cls, ctx):
        op = cls()
        op.counts = ctx.value_state("count", postcard.U64)
        return op

    def process(self, record, ctx):
        n = self.counts.update(ctx, record.key, lambda n: (n or 0) + 1)
        ctx.emit(record.key, str(n).encode())

export(Count)
```

Keyed state values use postcard (`sluice_sdk.postcard`), as the Rust SDK does, so a
Python and a Rust operator with the same state names and types restore each other's
checkpoints.
"""

from . import plain, postcard
from ._core import (
    Batch,
    Config,
    Context,
    Failed,
    Input,
    InvalidConfig,
    ListState,
    MapState,
    OpenContext,
    Operator,
    SideOutput,
    SluiceError,
    Timer,
    ValueState,
)
from .codec import EVENT_TIME, PROCESSING_TIME, Record

__version__ = "0.2.0"

#: The operator class `export` registered: the one a built component runs.
EXPORTED = None


def export(cls):
    """Registers `cls` (an `Operator` subclass) as the operator of this component."""
    global EXPORTED
    if not (isinstance(cls, type) and issubclass(cls, Operator)):
        raise TypeError(f"export({cls!r}): not a subclass of sluice_sdk.Operator")
    EXPORTED = cls
    return cls


__all__ = [
    "Batch",
    "Config",
    "Context",
    "EVENT_TIME",
    "Failed",
    "Input",
    "InvalidConfig",
    "ListState",
    "MapState",
    "OpenContext",
    "Operator",
    "PROCESSING_TIME",
    "Record",
    "SideOutput",
    "SluiceError",
    "Timer",
    "ValueState",
    "export",
    "plain",
    "postcard",
]
