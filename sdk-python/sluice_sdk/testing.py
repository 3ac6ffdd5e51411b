"""Runs an operator in plain CPython, as the host would run its component: feed records
(of any input) and watermarks, fire timers, take snapshots and restore from them, and
look at what it emitted, its keyed state, timers and counters. For pytest.

```python
h = Harness(Count, keyed=True)
h.process(b"a", b"x")
assert h.take_values() == [b"1"]
```
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Tuple, Type

from . import codec
from ._core import Batch, CallError, Instance, Operator
from .codec import EVENT_TIME, PROCESSING_TIME, Record

I64_MIN = -(1 << 63)


class HarnessError(Exception):
    """A call failed; `invalid_config` tells which way."""

    def __init__(self, error: CallError):
        super().__init__(error.message)
        self.invalid_config = error.invalid
        self.message = error.message


@dataclass
class Snapshot:
    """What a checkpoint keeps of one instance: its own state, keyed state and timers."""

    operator_state: bytes
    states: Dict[str, Tuple[int, str]]
    values: Dict[Tuple[int, bytes, bytes], bytes]
    lists: Dict[Tuple[int, bytes], List[Tuple[int, bytes]]]
    timers: set
    watermark: int
    written: Dict[Tuple[int, bytes, bytes], int] = field(default_factory=dict)
    ttls: Dict[int, int] = field(default_factory=dict)


@dataclass
class _Store:
    """The host's side: keyed state, timers, clocks."""

    keyed: bool
    processing_time: int = 0
    watermark: int = I64_MIN
    states: Dict[str, Tuple[int, str]] = field(default_factory=dict)
    values: Dict[Tuple[int, bytes, bytes], bytes] = field(default_factory=dict)
    # List elements with the processing time each was appended at.
    lists: Dict[Tuple[int, bytes], List[Tuple[int, bytes]]] = field(default_factory=dict)
    # When each value or map entry was last written (for time-to-live).
    written: Dict[Tuple[int, bytes, bytes], int] = field(default_factory=dict)
    # State id -> time-to-live in milliseconds.
    ttls: Dict[int, int] = field(default_factory=dict)
    timers: set = field(default_factory=set)
    counters: Dict[str, int] = field(default_factory=dict)
    logs: List[Tuple[str, str]] = field(default_factory=list)
    outputs: List[str] = field(default_factory=list)
    opening: bool = True


def _batch(records: List[Record]) -> Batch:
    """Records in columns, as a component gets them (checked as the host checks them)."""
    for r in records:
        if r.output:
            raise ValueError(f"{r!r}: records given to an operator go to no side output")
    return Batch(
        [bytes(r.value) for r in records],
        [None if r.key is None else bytes(r.key) for r in records],
        [r.timestamp for r in records],
        [r.partition for r in records] if any(r.partition is not None for r in records) else [],
        [(i, list(r.headers)) for i, r in enumerate(records) if r.headers],
    )


class _HarnessHost:
    def __init__(self, store: _Store):
        self.s = store

    def processing_time(self) -> int:
        return self.s.processing_time

    def current_watermark(self) -> int:
        return self.s.watermark

    def declare_state(self, name: str, kind: str, ttl_ms: Optional[int]) -> int:
        if not self.s.opening:
            raise ValueError("states are declared in `open` only")
        if not self.s.keyed:
            raise ValueError("keyed state needs keyed input (`key_by` in the job file)")
        known = self.s.states.get(name)
        if known is not None:
            if known[1] != kind:
                raise ValueError(f"state `{name}` is a {known[1]} state, not a {kind} state")
            return known[0]
        state_id = len(self.s.states)
        self.s.states[name] = (state_id, kind)
        if ttl_ms is not None:
            self.s.ttls[state_id] = ttl_ms
        return state_id

    def _live(self, state: int, written: int) -> bool:
        """Whether an entry written at `written` still reads, as the host decides: a
        state with a time-to-live drops entries not written for that long."""
        ttl = self.s.ttls.get(state)
        return ttl is None or self.s.processing_time < written + ttl

    def state_get(self, state: int, key: bytes, user_key: bytes) -> Optional[bytes]:
        entry = (state, bytes(key), bytes(user_key))
        if entry in self.s.values and not self._live(state, self.s.written.get(entry, 0)):
            return None
        return self.s.values.get(entry)

    def state_get_many(self, state: int, keys: List[bytes], user_key: bytes) -> Tuple[bytes, bytes, bytes]:
        return codec.pack([self.state_get(state, k, user_key) for k in keys])

    def state_entries(self, state: int, key: bytes) -> bytes:
        lists = self.s.lists.get((state, bytes(key)))
        if lists is not None:
            return codec.encode_entries([(b"", v) for t, v in lists if self._live(state, t)])
        entries = sorted(
            (uk, v)
            for (s, k, uk), v in self.s.values.items()
            if s == state and k == key and self._live(state, self.s.written.get((s, k, uk), 0))
        )
        return codec.encode_entries(entries)

    def declare_output(self, name: str) -> int:
        if not self.s.opening:
            raise ValueError("side outputs are declared in `open` only")
        if name in self.s.outputs:
            raise ValueError(f"side output `{name}` is declared twice")
        if len(self.s.outputs) >= 64:
            raise ValueError("at most 64 side outputs")
        self.s.outputs.append(name)
        return len(self.s.outputs)

    def log(self, level: str, message: str) -> None:
        self.s.logs.append((level, message))


class Harness:
    """One operator instance, opened at construction (or `HarnessError`)."""

    def __init__(
        self,
        cls: Type[Operator],
        config: Optional[Dict[str, str]] = None,
        keyed: bool = False,
        inputs: Optional[List[Tuple[str, bool]]] = None,
        subtask: int = 0,
        parallelism: int = 1,
        max_parallelism: int = 128,
        attempt: int = 0,
        restore: Optional[Snapshot] = None,
        processing_time: int = 0,
        max_output_bytes: int = 64 << 20,
    ):
        # What one call may return (the host's `max_output_mb`, 64 MiB by default).
        self.max_output_bytes = max_output_bytes
        self.store = _Store(keyed=keyed, processing_time=processing_time)
        if restore is not None:
            self.store.states = dict(restore.states)
            self.store.values = dict(restore.values)
            self.store.lists = {k: list(v) for k, v in restore.lists.items()}
            self.store.written = dict(restore.written)
            self.store.ttls = dict(restore.ttls)
            self.store.timers = set(restore.timers)
            self.store.watermark = restore.watermark
        self.host = _HarnessHost(self.store)
        self.instance = Instance(cls)
        self.output: List[Record] = []
        self.side: List[Tuple[int, Record]] = []
        info = {
            "job": "test-job",
            "operator_name": "test-operator",
            "config": {k: str(v) for k, v in (config or {}).items()},
            "subtask_index": subtask,
            "parallelism": parallelism,
            "max_parallelism": max_parallelism,
            "keyed": keyed,
            "restored_state": None if restore is None else restore.operator_state,
            "attempt": attempt,
            "inputs": inputs or [("input", False)],
        }
        self._inputs = len(info["inputs"])
        try:
            self._apply(self.instance.open(self.host, info))
        except CallError as e:
            raise HarnessError(e) from None
        finally:
            self.store.opening = False

    # Calls.
    def _apply(self, call) -> None:
        effects, records = bytes(call.effects.out), call.records()
        # As the host: a call that returns more than the limit fails, and nothing of it
        # counts (the host measures records in the flat encoding).
        flat = bytearray()
        for record in records:
            codec.encode_record(flat, record)
        size = len(effects) + len(flat)
        if size > self.max_output_bytes:
            raise HarnessError(
                CallError(
                    False,
                    f"returned {size} bytes of records and effects from one call; "
                    f"the limit is {self.max_output_bytes}",
                )
            )
        for effect in codec.decode_effects(effects):
            kind = effect[0]
            if kind == codec.PUT:
                _, s, k, uk, v = effect
                self.store.values[(s, k, uk)] = v
                self.store.written[(s, k, uk)] = self.store.processing_time
            elif kind == codec.DELETE:
                _, s, k, uk = effect
                self.store.values.pop((s, k, uk), None)
            elif kind == codec.CLEAR:
                _, s, k = effect
                self.store.lists.pop((s, k), None)
                for entry in [e for e in self.store.values if e[0] == s and e[1] == k]:
                    del self.store.values[entry]
            elif kind == codec.APPEND:
                _, s, k, v = effect
                self.store.lists.setdefault((s, k), []).append((self.store.processing_time, v))
            elif kind == codec.REGISTER_TIMER:
                _, d, ts, k = effect
                self.store.timers.add((d, ts, k))
            elif kind == codec.DELETE_TIMER:
                _, d, ts, k = effect
                self.store.timers.discard((d, ts, k))
            elif kind == codec.COUNTER:
                _, name, delta = effect
                self.store.counters[name] = self.store.counters.get(name, 0) + delta
        for record in records:
            if record.output:
                self.side.append((record.output, record))
            else:
                self.output.append(record)

    def _call(self, f) -> Any:
        try:
            result = f()
        except CallError as e:
            raise HarnessError(e) from None
        call = result[0] if isinstance(result, tuple) else result
        self._apply(call)
        return result

    def process(
        self,
        key: Optional[bytes],
        value: bytes,
        timestamp: Optional[int] = None,
        input: int = 0,
    ) -> None:
        """One record (of input number `input`), as a batch of one."""
        self.process_batch([Record(value, key, timestamp)], [], input)

    def process_batch(
        self,
        records: Iterable[Record],
        watermarks: List[Tuple[int, int]] = (),
        input: int = 0,
    ) -> None:
        """`records` as one batch with `watermarks` among them (`(before, watermark)`: it
        arrived before record number `before`), as the host gives a batch: event-time
        timers fire at the watermark that makes them due, before the records after it."""
        if not 0 <= input < self._inputs:
            raise ValueError(f"the operator has {self._inputs} inputs; there is no input {input}")
        records = list(records)
        watermarks = list(watermarks)
        first = k = 0

        def due(start: int) -> Optional[int]:
            event = [ts for d, ts, _ in self.store.timers if d == EVENT_TIME]
            if not event:
                return None
            nxt = min(event)
            for j in range(start, len(watermarks)):
                w = watermarks[j][1]
                if w > self.store.watermark and w >= nxt:
                    return j
            return None

        while first < len(records) or k < len(watermarks):
            cut = due(k)
            if cut is not None and watermarks[cut][0] <= first:
                self.store.watermark = watermarks[cut][1]
                self._fire(EVENT_TIME, watermarks[cut][1])
                cut = due(cut + 1)
            if cut is None:
                end, wm_end = len(records), len(watermarks)
            else:
                end, wm_end = min(watermarks[cut][0], len(records)), cut
            batch = _batch(records[first:end])
            given = [(max(before - first, 0), w) for before, w in watermarks[k:wm_end]]
            _, _, stopped = self._call(
                lambda: self.instance.process(self.host, input, batch, given)
            )
            if stopped is None:
                handled, handled_wms = end - first, len(given)
            else:
                handled, handled_wms = given[stopped][0], stopped
            if handled_wms:
                self.store.watermark = max(self.store.watermark, given[handled_wms - 1][1])
            first += handled
            k += handled_wms

    def process_watermark(self, watermark: int) -> None:
        """Advances event time: fires the due event-time timers, then `process_watermark`.
        A watermark that does not advance is ignored, as the host never sends one."""
        if watermark <= self.store.watermark:
            return
        self.store.watermark = watermark
        self._fire(EVENT_TIME, watermark)
        self._call(lambda: self.instance.process_watermark(self.host, watermark))

    def set_processing_time(self, now: int) -> None:
        """Moves the clock (never back) and fires the due processing-time timers."""
        self.store.processing_time = max(self.store.processing_time, now)
        self._fire(PROCESSING_TIME, self.store.processing_time)

    def _fire(self, domain: int, time: int) -> None:
        for _ in range(1000):
            due = sorted(t for t in self.store.timers if t[0] == domain and t[1] <= time)
            if not due:
                return
            for t in due:
                self.store.timers.discard(t)
            encoded = codec.encode_timers(due)
            self._call(lambda: self.instance.on_timers(self.host, encoded))
        raise HarnessError(CallError(False, "timers keep registering due timers"))

    def snapshot(self, checkpoint_id: int = 1) -> Snapshot:
        try:
            state = self.instance.snapshot(checkpoint_id)
        except CallError as e:
            raise HarnessError(e) from None
        if len(state) > self.max_output_bytes:
            raise HarnessError(
                CallError(
                    False,
                    f"returned {len(state)} bytes of operator state from `snapshot`; the "
                    f"limit is {self.max_output_bytes} (keep large state in keyed state)",
                )
            )
        return Snapshot(
            state,
            dict(self.store.states),
            dict(self.store.values),
            {k: list(v) for k, v in self.store.lists.items()},
            set(self.store.timers),
            self.store.watermark,
            dict(self.store.written),
            dict(self.store.ttls),
        )

    def notify_complete(self, checkpoint_id: int) -> None:
        try:
            self.instance.notify(True, checkpoint_id)
        except CallError as e:
            raise HarnessError(e) from None

    def finish(self) -> None:
        """End of input: event time to the end (every timer fires), then `finish`."""
        self.process_watermark((1 << 63) - 1)
        self._call(lambda: self.instance.finish(self.host))

    def close(self) -> None:
        self._call(lambda: self.instance.close(self.host))
        self.instance.dispose()

    # What it did.
    def take_output(self) -> List[Record]:
        out, self.output = self.output, []
        return out

    def take_values(self) -> List[bytes]:
        return [r.value for r in self.take_output()]

    def take_side_output(self, name: str) -> List[Record]:
        if name not in self.store.outputs:
            return []
        number = self.store.outputs.index(name) + 1
        taken = [r for o, r in self.side if o == number]
        self.side = [(o, r) for o, r in self.side if o != number]
        return taken

    def counter(self, name: str) -> int:
        return self.store.counters.get(name, 0)

    @property
    def logs(self) -> List[Tuple[str, str]]:
        return self.store.logs

    @property
    def watermark(self) -> int:
        return self.store.watermark

    def timers(self, domain: int = EVENT_TIME) -> List[Tuple[int, bytes]]:
        return sorted((ts, k) for d, ts, k in self.store.timers if d == domain)

    def state_value(self, state: str, key: bytes, user_key: bytes = b"") -> Optional[bytes]:
        """The encoded value of `key` (and map key) in state `state`, as the host holds it."""
        state_id = self.store.states[state][0]
        return self.store.values.get((state_id, key, user_key))
