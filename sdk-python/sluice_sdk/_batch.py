"""A batch of records in columns, as `Operator.process_batch` gets and `Context.emit_batch`
takes them."""

from __future__ import annotations

from itertools import compress
from typing import Any, Iterable, Iterator, List, Optional, Tuple

from .codec import Record


class Batch:
    """Records in columns, as `Operator.process_batch` gets them: `values`, `keys` and
    `timestamps` are lists as long as the batch (record `i` is the `i`th of each; keys
    and timestamps may be `None`); `partitions` is as long too, or empty when no record
    came from a partitioned source; `headers` lists `(record number, headers)` of the
    records that have any. Filter or map it with list comprehensions, and emit what
    comes of it with `Context.emit_batch`."""

    __slots__ = ("values", "keys", "timestamps", "partitions", "headers")

    def __init__(
        self,
        values: List[bytes],
        keys: Optional[List[Optional[bytes]]] = None,
        timestamps: Optional[List[Optional[int]]] = None,
        partitions: Optional[List[Optional[int]]] = None,
        headers: Optional[List[Tuple[int, Any]]] = None,
    ):
        n = len(values)
        self.values = values
        self.keys = [None] * n if keys is None else keys
        self.timestamps = [None] * n if timestamps is None else timestamps
        self.partitions = partitions or []
        self.headers = headers or []
        if len(self.keys) != n or len(self.timestamps) != n or len(self.partitions) not in (0, n):
            raise ValueError(
                f"a batch of {n} values with {len(self.keys)} keys, "
                f"{len(self.timestamps)} timestamps and {len(self.partitions)} partitions"
            )

    def __len__(self) -> int:
        return len(self.values)

    def __iter__(self) -> Iterator[Record]:
        return iter(self.records())

    def records(self) -> List[Record]:
        """The batch as `Record`s (with their headers and partitions)."""
        headers = dict(self.headers)
        partitions = self.partitions or [None] * len(self.values)
        return [
            Record(v, k, ts, tuple(headers.get(i, ())), p)
            for i, (v, k, ts, p) in enumerate(
                zip(self.values, self.keys, self.timestamps, partitions)
            )
        ]

    def filter(self, keep: Iterable[Any]) -> "Batch":
        """The records whose `keep` is true (one per record), as they are."""
        keep = list(keep)
        if len(keep) != len(self.values):
            raise ValueError(f"filter: {len(keep)} decisions for a batch of {len(self.values)}")
        kept = list(compress(range(len(keep)), keep))
        if len(kept) == len(keep):
            return self
        renumber = {old: new for new, old in enumerate(kept)} if self.headers else {}
        return Batch(
            list(compress(self.values, keep)),
            list(compress(self.keys, keep)),
            list(compress(self.timestamps, keep)),
            list(compress(self.partitions, keep)),
            [(renumber[i], h) for i, h in self.headers if i in renumber],
        )

    def with_values(self, values: List[bytes]) -> "Batch":
        """The same records (keys, timestamps, partitions, headers) with new values."""
        if len(values) != len(self.values):
            raise ValueError(f"with_values: {len(values)} values for a batch of {len(self.values)}")
        return Batch(values, self.keys, self.timestamps, self.partitions, self.headers)

    def _slice(self, start: int, end: int) -> "Batch":
        if start == 0 and end >= len(self.values):
            return self
        return Batch(
            self.values[start:end],
            self.keys[start:end],
            self.timestamps[start:end],
            self.partitions[start:end],
            [(i - start, h) for i, h in self.headers if start <= i < end],
        )
