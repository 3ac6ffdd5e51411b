"""What an operator sees — records, contexts, keyed state, timers — and the rules of each
call, independent of where it runs (inside a Wasm component, or the native harness).

The host of a call is an object with the runtime's functions (`processing_time`,
`current_watermark`, `declare_state`, `state_get`, `state_entries`, `declare_output`,
`log`); everything an operator writes leaves the call as effects, applied by the host
when the call returns. Within a call, reads see the call's own writes (an overlay over
the host's state as of the call's start).
"""

from __future__ import annotations

import json as _json
import traceback
from itertools import repeat
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple, Type

from . import codec
from .codec import EVENT_TIME, PROCESSING_TIME, EffectWriter, Record
from ._batch import Batch
from .postcard import Codec

I64_MIN = -(1 << 63)

_ABSENT = object()


class SluiceError(Exception):
    """An error the operator reports on purpose."""


class InvalidConfig(SluiceError):
    """The configuration given to `open` cannot be used: the job fails without restarts."""


class Failed(SluiceError):
    """Anything else: the task fails and the job restarts from its last checkpoint."""


class Timer:
    """A timer that is due: its clock (`EVENT_TIME` or `PROCESSING_TIME`), the time it
    was registered for, and its key."""

    __slots__ = ("domain", "timestamp", "key")

    def __init__(self, domain: int, timestamp: int, key: bytes):
        self.domain, self.timestamp, self.key = domain, timestamp, key

    def __repr__(self) -> str:
        clock = "event" if self.domain == EVENT_TIME else "processing"
        return f"Timer({clock}, {self.timestamp}, {self.key!r})"


class Input:
    """One input of the operator, as the job file names it."""

    __slots__ = ("name", "broadcast")

    def __init__(self, name: str, broadcast: bool):
        self.name, self.broadcast = name, broadcast


class Config(dict):
    """The operator's `config` table, as strings."""

    def require(self, key: str) -> str:
        if key not in self:
            raise InvalidConfig(f"config `{key}` is required")
        return self[key]

    def parse(self, key: str, kind: Callable[[str], Any], default: Any = None) -> Any:
        """`kind(value)` (e.g. `int`), or `default` when the key is not set."""
        if key not in self:
            return default
        try:
            return kind(self[key])
        except ValueError:
            raise InvalidConfig(
                f"config `{key}` = {self[key]!r} is not a {getattr(kind, '__name__', kind)}"
            ) from None

    def check_known(self, known: List[str]) -> None:
        """Refuses keys the operator does not know (a typo would otherwise be ignored)."""
        unknown = sorted(set(self) - set(known))
        if unknown:
            raise InvalidConfig(
                f"unknown config key{'s' if len(unknown) > 1 else ''} "
                f"{', '.join(f'`{k}`' for k in unknown)} (known: {', '.join(known)})"
            )


#: Values kept in an instance's read cache at most; beyond, it starts over.
CACHE_ENTRIES = 100_000


class _Cache:
    """What the host's keyed state holds, as far as this instance has read it one key at
    a time: nothing else changes the host's state of its keys while it lives (a restore
    makes a new instance), so a value read once is answered here afterwards, which saves
    a host call per record; what a call writes brings what is cached up to date. States
    with a time-to-live are not cached (the host expires them), nor what `get_many`
    reads (one host call for a whole batch already)."""

    def __init__(self) -> None:
        # (state, key) -> user key -> value bytes, or _ABSENT when known absent.
        self.maps: Dict[Tuple[int, bytes], Dict[bytes, Any]] = {}
        self.entries = 0
        self.uncached: set = set()

    def get(self, state: int, key: bytes, user_key: bytes) -> Any:
        """The cached value, `_ABSENT`, or None when not known."""
        values = self.maps.get((state, key))
        return None if values is None else values.get(user_key)

    def put(self, state: int, key: bytes, user_key: bytes, value: Any) -> None:
        if state in self.uncached:
            return
        if self.entries >= CACHE_ENTRIES:
            self.maps.clear()
            self.entries = 0
        values = self.maps.setdefault((state, key), {})
        if user_key not in values:
            self.entries += 1
        values[user_key] = value

    def merge(self, call: "_Call") -> None:
        """What a call that succeeded wrote (the host applies the same effects)."""
        for state_key in call.cleared:
            dropped = self.maps.pop(state_key, None)
            if dropped:
                self.entries -= len(dropped)
        maps = self.maps
        if not maps:
            return
        for (state, key, user_key), value in call.writes.items():
            values = maps.get((state, key))
            if values is not None:
                if user_key not in values:
                    self.entries += 1
                values[user_key] = _raw(value)


def _raw(written: Any) -> Any:
    """What the overlay holds of an entry as bytes (or `_ABSENT`): `put_many` leaves its
    values there unencoded, as `(codec, value)`, encoded only if they are read so."""
    if type(written) is tuple:
        codec_, value = written
        return codec_.encode(value)
    return written


# Why `close` may not emit (the host refuses it too).
CLOSE_EMITTED = (
    "emitted records from `close`, which may not emit: the job's output was committed "
    "before it; emit buffered records in `finish`"
)


class _Call:
    """What one call builds up: its output records, effects and state overlay."""

    def __init__(self, host: Any, watermark: int, cache: Optional[_Cache] = None):
        self.host = host
        self.cache = cache if cache is not None else _Cache()
        # What the call emitted, in columns (`wit/operator.wit`'s `columns`): values,
        # keys and timestamps one per record; partitions once any record has one;
        # (record number, headers) and (record number, side output) where set.
        self.values: List[bytes] = []
        self.keys: List[Optional[bytes]] = []
        self.timestamps: List[Optional[int]] = []
        self.partitions: Optional[List[Optional[int]]] = None
        self.headers: List[Tuple[int, List[Tuple[bytes, bytes]]]] = []
        self.outputs: List[Tuple[int, int]] = []
        self.effects = EffectWriter()
        self.watermark = watermark
        # (state, key, user key) -> value bytes or _ABSENT, written in this call.
        self.writes: Dict[Tuple[int, bytes, bytes], Any] = {}
        # (state, key) whose map or list this call cleared.
        self.cleared: set = set()
        # (state, key) -> elements this call appended to a list.
        self.appended: Dict[Tuple[int, bytes], List[bytes]] = {}
        # The smallest event-time timer registered in this call.
        self.new_event_timer: Optional[int] = None
        # During `on-timers`: the list's timers not fired yet, and what this call did to
        # them (deleted, or registered again).
        self.ahead: set = set()
        self.deleted: set = set()
        self.reregistered: set = set()

    @property
    def count(self) -> int:
        """How many records the call emitted."""
        return len(self.values)

    def emit(
        self,
        value: bytes,
        key: Optional[bytes],
        timestamp: Optional[int],
        headers: Any = (),
        partition: Optional[int] = None,
        output: int = 0,
    ) -> None:
        n = len(self.values)
        self.values.append(value)
        self.keys.append(key)
        self.timestamps.append(timestamp)
        partitions = self.partitions
        if partitions is not None:
            partitions.append(partition)
        elif partition is not None:
            self.partitions = [None] * n + [partition]
        if headers:
            self.headers.append((n, list(headers)))
        if output:
            self.outputs.append((n, output))

    def emit_batch(self, batch: "Batch") -> None:
        n = len(self.values)
        self.values += batch.values
        self.keys += batch.keys
        self.timestamps += batch.timestamps
        if batch.partitions:
            if self.partitions is None:
                self.partitions = [None] * n
            self.partitions += batch.partitions
        elif self.partitions is not None:
            self.partitions += [None] * len(batch.values)
        self.headers += [(n + i, list(h)) for i, h in batch.headers]

    def records(self) -> List[Record]:
        """What the call emitted, as records (for harnesses)."""
        headers, outputs = dict(self.headers), dict(self.outputs)
        partitions = self.partitions or [None] * len(self.values)
        return [
            Record(v, k, ts, tuple(headers.get(i, ())), p, outputs.get(i, 0))
            for i, (v, k, ts, p) in enumerate(
                zip(self.values, self.keys, self.timestamps, partitions)
            )
        ]


class SideOutput:
    """A side output declared in `open` (`ctx.side_output(name)`)."""

    __slots__ = ("name", "number")

    def __init__(self, name: str, number: int):
        self.name, self.number = name, number


class _State:
    def __init__(self, name: str, state_id: int, value: Codec):
        self.name, self.id, self.codec = name, state_id, value

    def _decode(self, raw: bytes) -> Any:
        try:
            return self.codec.decode(raw)
        except ValueError as e:
            raise Failed(f"state `{self.name}`: cannot decode a value: {e}") from None


class ValueState(_State):
    """One value per key."""

    def get(self, ctx: "Context", key: bytes) -> Any:
        raw = ctx._get(self.id, key, b"")
        return None if raw is None else self._decode(raw)

    def put(self, ctx: "Context", key: bytes, value: Any) -> None:
        ctx._put(self.id, key, b"", self.codec.encode(value))

    def get_many(self, ctx: "Context", keys: List[bytes]) -> List[Any]:
        """The value of each of `keys` (`None` where there is none), read from the host
        in one call and decoded at once where the codec can (`sluice_sdk.plain`)."""
        call = ctx._call
        keys = [bytes(k) for k in keys]
        data, ends, absent = call.host.state_get_many(self.id, keys, b"")
        try:
            values = self.codec.decode_packed(data, ends, absent)
        except ValueError as e:
            raise Failed(f"state `{self.name}`: cannot decode a value: {e}") from None
        writes = call.writes
        if writes:
            # What this call wrote, over what the host had.
            state = self.id
            for i, key in enumerate(keys):
                written = writes.get((state, key, b""))
                if written is not None:
                    if written is _ABSENT:
                        values[i] = None
                    elif type(written) is tuple:
                        values[i] = written[1]
                    else:
                        values[i] = self._decode(written)
        return values

    def put_many(self, ctx: "Context", keys: Iterable[bytes], values: Iterable[Any]) -> None:
        """Sets the value of each of `keys` to the value at the same place of `values`,
        encoded at once where the codec can (`sluice_sdk.plain`)."""
        keys = [bytes(k) for k in keys]
        values = list(values)
        if len(keys) != len(values):
            raise ValueError(f"put_many: {len(keys)} keys and {len(values)} values")
        call = ctx._call
        data, ends = self.codec.encode_packed(values)
        call.effects.put_many(self.id, keys, data, ends)
        state, codec_ = self.id, self.codec
        call.writes.update(
            zip(zip(repeat(state), keys, repeat(b"")), zip(repeat(codec_), values))
        )

    def update(self, ctx: "Context", key: bytes, f: Callable[[Any], Any]) -> Any:
        """Replaces the value with `f(current)` (`None` clears it); returns the new one."""
        if type(key) is not bytes:
            key = bytes(key)
        raw = ctx._get(self.id, key, b"")
        new = f(None if raw is None else self._decode(raw))
        if new is None:
            ctx._delete(self.id, key, b"")
        else:
            ctx._put(self.id, key, b"", self.codec.encode(new))
        return new

    def clear(self, ctx: "Context", key: bytes) -> None:
        ctx._delete(self.id, key, b"")


class ListState(_State):
    """An ordered list per key, appended to."""

    def get(self, ctx: "Context", key: bytes) -> List[Any]:
        call = ctx._call
        raw: List[bytes] = []
        if (self.id, key) not in call.cleared:
            raw = [v for _, v in codec.decode_entries(call.host.state_entries(self.id, key))]
        raw += call.appended.get((self.id, key), [])
        return [self._decode(v) for v in raw]

    def add(self, ctx: "Context", key: bytes, value: Any) -> None:
        encoded = self.codec.encode(value)
        ctx._call.appended.setdefault((self.id, key), []).append(encoded)
        ctx._call.effects.append(self.id, key, encoded)

    def clear(self, ctx: "Context", key: bytes) -> None:
        ctx._call.cleared.add((self.id, key))
        ctx._call.appended.pop((self.id, key), None)
        ctx._call.effects.clear(self.id, key)


class MapState(_State):
    """A map per key from map keys (encoded with `key_codec`) to values."""

    def __init__(self, name: str, state_id: int, key_codec: Codec, value: Codec):
        super().__init__(name, state_id, value)
        self.key_codec = key_codec

    def get(self, ctx: "Context", key: bytes, map_key: Any) -> Any:
        raw = ctx._get(self.id, key, self.key_codec.encode(map_key))
        return None if raw is None else self._decode(raw)

    def put(self, ctx: "Context", key: bytes, map_key: Any, value: Any) -> None:
        ctx._put(self.id, key, self.key_codec.encode(map_key), self.codec.encode(value))

    def remove(self, ctx: "Context", key: bytes, map_key: Any) -> None:
        ctx._delete(self.id, key, self.key_codec.encode(map_key))

    def entries(self, ctx: "Context", key: bytes) -> List[Tuple[Any, Any]]:
        """Every entry of the map of `key`, in the order of the encoded map keys."""
        call = ctx._call
        merged: Dict[bytes, bytes] = {}
        if (self.id, key) not in call.cleared:
            merged = dict(codec.decode_entries(call.host.state_entries(self.id, key)))
        for (state, k, user_key), value in call.writes.items():
            if state == self.id and k == key:
                if value is _ABSENT:
                    merged.pop(user_key, None)
                else:
                    merged[user_key] = value
        return [
            (self.key_codec.decode(uk), self._decode(v)) for uk, v in sorted(merged.items())
        ]

    def clear(self, ctx: "Context", key: bytes) -> None:
        call = ctx._call
        call.cleared.add((self.id, key))
        for write in [w for w in call.writes if w[0] == self.id and w[1] == key]:
            del call.writes[write]
        call.effects.clear(self.id, key)


class _Shared:
    """The methods both contexts have: time, timers, counters, logging."""

    _call: _Call

    def processing_time(self) -> int:
        """The host's wall clock, in milliseconds since the Unix epoch."""
        return self._call.host.processing_time()

    def current_watermark(self) -> int:
        """The watermark: no record with an event time at or below it is expected."""
        return self._call.watermark

    def register_event_timer(self, key: bytes, timestamp: int) -> None:
        self._timer(True, EVENT_TIME, timestamp, key)
        call = self._call
        if call.new_event_timer is None or timestamp < call.new_event_timer:
            call.new_event_timer = timestamp

    def register_processing_timer(self, key: bytes, timestamp: int) -> None:
        self._timer(True, PROCESSING_TIME, timestamp, key)

    def delete_event_timer(self, key: bytes, timestamp: int) -> None:
        self._timer(False, EVENT_TIME, timestamp, key)

    def delete_processing_timer(self, key: bytes, timestamp: int) -> None:
        self._timer(False, PROCESSING_TIME, timestamp, key)

    def _timer(self, register: bool, domain: int, timestamp: int, key: bytes) -> None:
        call = self._call
        timer = (domain, timestamp, bytes(key))
        if timer in call.ahead:
            if register:
                call.deleted.discard(timer)
                call.reregistered.add(timer)
            else:
                call.reregistered.discard(timer)
                call.deleted.add(timer)
        call.effects.timer(register, domain, timestamp, key)

    def add_counter(self, name: str, delta: int = 1) -> None:
        self._call.effects.counter(name, delta)

    def log(self, level: str, message: str) -> None:
        """`level`: `trace`, `debug`, `info`, `warn` or `error`."""
        self._call.host.log(level, message)

    def debug(self, message: str) -> None:
        self.log("debug", message)

    def info(self, message: str) -> None:
        self.log("info", message)

    def warn(self, message: str) -> None:
        self.log("warn", message)

    def error(self, message: str) -> None:
        self.log("error", message)

    # State access through the call's overlay.
    def _get(self, state: int, key: bytes, user_key: bytes) -> Optional[bytes]:
        if type(key) is not bytes:
            key = bytes(key)
        call = self._call
        written = call.writes.get((state, key, user_key))
        if written is None:
            if call.cleared and (state, key) in call.cleared:
                return None
            known = call.cache.maps.get((state, key))
            if known is not None:
                written = known.get(user_key)
        if written is _ABSENT:
            return None
        if written is not None:
            return _raw(written)
        value = call.host.state_get(state, key, user_key)
        call.cache.put(state, key, user_key, _ABSENT if value is None else value)
        return value

    def _put(self, state: int, key: bytes, user_key: bytes, value: bytes) -> None:
        if type(key) is not bytes:
            key = bytes(key)
        call = self._call
        call.writes[(state, key, user_key)] = value
        call.effects.put(state, key, user_key, value)

    def _delete(self, state: int, key: bytes, user_key: bytes) -> None:
        key = bytes(key)
        self._call.writes[(state, key, user_key)] = _ABSENT
        self._call.effects.delete(state, key, user_key)


class Context(_Shared):
    """What an operator may do in every call after `open`: emit records, use keyed state
    and timers, count, log. In `process`, also what the record being processed carries."""

    def __init__(self, call: _Call, outputs: List[str]):
        self._call = call
        self._outputs = outputs
        self._timestamp: Optional[int] = None
        self._record: Optional[Record] = None
        self._input = 0

    def emit_json(self, key: Optional[bytes], value: Any, timestamp: Any = _ABSENT) -> None:
        """Emits `value` written as JSON text (what a sink with `format = "json"` or
        `"avro"` takes); the timestamp as for `emit`."""
        self.emit(key, _json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode(), timestamp)

    def emit(self, key: Optional[bytes], value: bytes, timestamp: Any = _ABSENT) -> None:
        """Emits a record. Its timestamp is, unless given: the record's being processed,
        an event-time timer's time, or none."""
        ts = self._timestamp if timestamp is _ABSENT else timestamp
        record = self._record
        if record is not None and (record.headers or record.partition is not None):
            # Headers and the source partition go on with what a record leads to.
            self._call.emit(
                bytes(value),
                None if key is None else bytes(key),
                ts,
                record.headers,
                record.partition,
            )
        else:
            call = self._call
            call.values.append(value if type(value) is bytes else bytes(value))
            call.keys.append(key if key is None or type(key) is bytes else bytes(key))
            call.timestamps.append(ts)
            if call.partitions is not None:
                call.partitions.append(None)

    def emit_batch(
        self,
        batch: Any,
        keys: Optional[List[Optional[bytes]]] = None,
        timestamps: Optional[List[Optional[int]]] = None,
    ) -> None:
        """Emits a `Batch` as it is (keys, timestamps, partitions and headers with it),
        or a list of values with, optionally, a key and a timestamp for each (lists as
        long; none when not given)."""
        if not isinstance(batch, Batch):
            batch = Batch([bytes(v) for v in batch], keys, timestamps)
        self._call.emit_batch(batch)

    def emit_to(self, output: SideOutput, key: Optional[bytes], value: bytes) -> None:
        """Emits a record to a side output declared in `open`."""
        current = self._record
        self._call.emit(
            bytes(value),
            None if key is None else bytes(key),
            self._timestamp,
            current.headers if current is not None else (),
            current.partition if current is not None else None,
            output.number,
        )

    def emit_record(self, record: Record) -> None:
        """Emits `record` as it is (headers and partition included)."""
        self._call.emit(
            bytes(record.value),
            None if record.key is None else bytes(record.key),
            record.timestamp,
            record.headers,
            record.partition,
            record.output,
        )

    def input_index(self) -> int:
        """The input (of `OpenContext.inputs`) the record being processed came from."""
        return self._input

    def record(self) -> Optional[Record]:
        """The record being processed, with its headers and partition."""
        return self._record


class OpenContext(_Shared):
    """What an operator learns in `open`, and where it declares keyed state and side
    outputs."""

    def __init__(self, call: _Call, info: Dict[str, Any], outputs: List[str]):
        self._call = call
        self.job: str = info["job"]
        self.operator_name: str = info["operator_name"]
        self.config = Config(info["config"])
        self.subtask_index: int = info["subtask_index"]
        self.parallelism: int = info["parallelism"]
        self.max_parallelism: int = info["max_parallelism"]
        self.keyed: bool = info["keyed"]
        self.restored_state: Optional[bytes] = info["restored_state"]
        self.attempt: int = info["attempt"]
        self.inputs: List[Input] = [Input(n, b) for n, b in info["inputs"]]
        self._outputs = outputs

    def _declare(self, name: str, kind: str, ttl_ms: Optional[int]) -> int:
        try:
            state = self._call.host.declare_state(name, kind, ttl_ms)
        except SluiceError:
            raise
        except Exception as e:  # the host's refusal
            raise InvalidConfig(f"declaring state `{name}`: {e}") from None
        if ttl_ms is not None or kind == "list":
            self._call.cache.uncached.add(state)
        return state

    def value_state(self, name: str, value: Codec, ttl_ms: Optional[int] = None) -> ValueState:
        return ValueState(name, self._declare(name, "value", ttl_ms), value)

    def list_state(self, name: str, value: Codec, ttl_ms: Optional[int] = None) -> ListState:
        return ListState(name, self._declare(name, "list", ttl_ms), value)

    def map_state(
        self, name: str, key: Codec, value: Codec, ttl_ms: Optional[int] = None
    ) -> MapState:
        return MapState(name, self._declare(name, "map", ttl_ms), key, value)

    def side_output(self, name: str) -> SideOutput:
        """Declares side output `name`: the job file reads it as `OPERATOR.side:NAME`."""
        try:
            number = self._call.host.declare_output(name)
        except Exception as e:
            raise InvalidConfig(f"declaring side output `{name}`: {e}") from None
        self._outputs.append(name)
        return SideOutput(name, number)


class Operator:
    """Base class of an operator: override what it needs (`open` is a classmethod that
    returns the instance). Every hook may raise `InvalidConfig` or `Failed`; any other
    exception fails the call with its traceback."""

    @classmethod
    def open(cls, ctx: OpenContext) -> "Operator":
        return cls()

    def process(self, record: Record, ctx: Context) -> None:
        pass

    def process_batch(self, batch: Batch, ctx: Context) -> None:
        """The records of a batch that arrived together (between two watermarks): calls
        `process` for each record unless overridden. Override it to work on the whole
        batch in list comprehensions (`batch.values`, `batch.keys`, ...), reading and
        writing keyed state for all its keys at once (`get_many`, `put_many`) and
        emitting with `ctx.emit_batch`; `ctx.emit` here gives a record no timestamp
        unless it is given one."""
        process = self.process
        if not batch.headers and not batch.partitions:
            for value, key, ts in zip(batch.values, batch.keys, batch.timestamps):
                record = Record(value, key, ts)
                ctx._timestamp, ctx._record = ts, record
                process(record, ctx)
        else:
            for record in batch.records():
                ctx._timestamp, ctx._record = record.timestamp, record
                process(record, ctx)
        ctx._timestamp = ctx._record = None

    def process_watermark(self, watermark: int, ctx: Context) -> None:
        pass

    def on_timer(self, timer: Timer, ctx: Context) -> None:
        pass

    def snapshot(self, checkpoint_id: int) -> bytes:
        """This subtask's own state (small; keyed state belongs to the host)."""
        return b""

    def notify_complete(self, checkpoint_id: int) -> None:
        pass

    def notify_aborted(self, checkpoint_id: int) -> None:
        pass

    def finish(self, ctx: Context) -> None:
        pass

    def close(self, ctx: Context) -> None:
        pass

    def dispose(self) -> None:
        pass


class CallError(Exception):
    """A call failed: `invalid` says whether it was the configuration; `message` has the
    operator's words and, for an unexpected exception, its traceback."""

    def __init__(self, invalid: bool, message: str):
        super().__init__(message)
        self.invalid, self.message = invalid, message


def _failure(call: str, error: BaseException) -> CallError:
    if isinstance(error, InvalidConfig):
        return CallError(True, str(error))
    if isinstance(error, Failed):
        return CallError(False, str(error))
    trace = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    return CallError(False, f"`{call}` raised {type(error).__name__}: {error}\n{trace}")


class Instance:
    """One operator instance and the rules of every call. The glue (Wasm or harness)
    calls these with its host; each returns `(records, effects)` and more."""

    def __init__(self, cls: Type[Operator]):
        self.cls = cls
        self.operator: Optional[Operator] = None
        self.outputs: List[str] = []
        self.cache = _Cache()

    def _run(self, name: str, host: Any, f: Callable[[_Call], None]) -> _Call:
        call = _Call(host, host.current_watermark(), self.cache)
        try:
            f(call)
        except BaseException as e:  # noqa: BLE001 - every failure becomes the call's error
            raise _failure(name, e) from None
        self.cache.merge(call)
        return call

    def _operator(self, name: str) -> Operator:
        if self.operator is None:
            raise CallError(False, f"`{name}` before a successful `open`")
        return self.operator

    def open(self, host: Any, info: Dict[str, Any]) -> _Call:
        def run(call: _Call) -> None:
            operator = self.cls.open(OpenContext(call, info, self.outputs))
            if not isinstance(operator, Operator):
                raise Failed(f"{self.cls.__name__}.open returned {operator!r}, not the operator")
            if call.count:
                raise Failed("`open` emitted records, which it may not")
            self.operator = operator

        return self._run("open", host, run)

    def process(
        self, host: Any, input: int, batch: Batch, watermarks: List[Tuple[int, int]]
    ) -> Tuple[_Call, List[Tuple[int, int]], Optional[int]]:
        """The records between two watermarks to `process_batch` at a time; each
        watermark handled (`process_watermark`) before the records after it, and passed
        on where the output reached it; stops before a watermark that makes due an
        event-time timer this call registered (the host fires it there and calls again
        with the rest)."""
        operator = self._operator("process")
        passed: List[Tuple[int, int]] = []
        stopped: List[Optional[int]] = [None]

        def run(call: _Call) -> None:
            ctx = Context(call, self.outputs)
            ctx._input = input
            count = len(batch)
            start = handled = 0
            while True:
                handled = _watermarks_before(operator, ctx, watermarks, handled, start, passed)
                if handled < 0:
                    stopped[0] = -handled - 1
                    return
                if start >= count:
                    return
                end = min(watermarks[handled][0], count) if handled < len(watermarks) else count
                operator.process_batch(batch._slice(start, end), ctx)
                ctx._timestamp = ctx._record = None
                start = end

        call = self._run("process", host, run)
        return call, passed, stopped[0]

    def process_watermark(self, host: Any, watermark: int) -> _Call:
        operator = self._operator("process-watermark")
        return self._run(
            "process-watermark",
            host,
            lambda call: operator.process_watermark(watermark, Context(call, self.outputs)),
        )

    def on_timers(self, host: Any, timers: bytes) -> _Call:
        operator = self._operator("on-timers")

        def run(call: _Call) -> None:
            due = list(codec.decode_timers(timers))
            call.ahead = {(d, ts, bytes(k)) for d, ts, k in due}
            ctx = Context(call, self.outputs)
            for domain, ts, key in due:
                timer = (domain, ts, bytes(key))
                call.ahead.discard(timer)
                # A timer an earlier one of the list deleted does not fire (as in Flink).
                if timer in call.deleted:
                    call.deleted.discard(timer)
                    continue
                if timer in call.reregistered:
                    # Registered again by an earlier one and firing now: not once more
                    # (deleted before it runs, so it may register itself again).
                    call.reregistered.discard(timer)
                    call.effects.timer(False, domain, ts, key)
                ctx._timestamp = ts if domain == EVENT_TIME else None
                operator.on_timer(Timer(domain, ts, bytes(key)), ctx)

        return self._run("on-timers", host, run)

    def snapshot(self, checkpoint_id: int) -> bytes:
        operator = self._operator("snapshot")
        try:
            state = operator.snapshot(checkpoint_id)
        except BaseException as e:  # noqa: BLE001
            raise _failure("snapshot", e) from None
        if not isinstance(state, (bytes, bytearray)):
            raise CallError(False, f"`snapshot` returned {type(state).__name__}, not bytes")
        return bytes(state)

    def notify(self, complete: bool, checkpoint_id: int) -> None:
        operator = self._operator("notify")
        try:
            if complete:
                operator.notify_complete(checkpoint_id)
            else:
                operator.notify_aborted(checkpoint_id)
        except BaseException as e:  # noqa: BLE001
            raise _failure("notify-complete" if complete else "notify-aborted", e) from None

    def finish(self, host: Any) -> _Call:
        operator = self._operator("finish")
        return self._run("finish", host, lambda call: operator.finish(Context(call, self.outputs)))

    def close(self, host: Any) -> _Call:
        operator = self._operator("close")

        def run(call: _Call) -> None:
            operator.close(Context(call, self.outputs))
            if call.count:
                raise Failed(CLOSE_EMITTED)

        return self._run("close", host, run)

    def dispose(self) -> None:
        if self.operator is not None:
            try:
                self.operator.dispose()
            except BaseException:  # noqa: BLE001 - dispose cannot fail
                pass
        self.operator = None


def _watermarks_before(
    operator: Operator,
    ctx: Context,
    watermarks: List[Tuple[int, int]],
    handled: int,
    n: int,
    passed: List[Tuple[int, int]],
) -> int:
    """Handles the watermarks from number `handled` on that come before record `n`;
    returns how many are handled then, or `-(i + 1)` to stop before watermark `i`: it
    makes due an event-time timer this call registered."""
    call = ctx._call
    while handled < len(watermarks) and watermarks[handled][0] <= n:
        watermark = watermarks[handled][1]
        if call.new_event_timer is not None and call.new_event_timer <= watermark:
            return -(handled + 1)
        call.watermark = watermark
        ctx._timestamp, ctx._record = None, None
        operator.process_watermark(watermark, ctx)
        at = call.count
        if passed and passed[-1][0] == at:
            passed[-1] = (at, watermark)
        else:
            passed.append((at, watermark))
        handled += 1
    return handled
