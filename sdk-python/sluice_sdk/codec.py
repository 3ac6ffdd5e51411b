"""The flat encodings of `wit/operator.wit`: records, timers, entries and effects.

Every integer is little-endian; `bytes` is a u32 length and that many bytes. Operators
never see these: the SDK decodes what the host gives and encodes what they emit.
"""

from __future__ import annotations

import json as _json
import struct
from array import array
from itertools import accumulate
from typing import Iterator, List, Optional, Tuple

_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_U64 = struct.Struct("<Q")

HAS_TIMESTAMP = 0x01
HAS_KEY = 0x02
HAS_HEADERS = 0x04
HAS_PARTITION = 0x08
HAS_OUTPUT = 0x10

EVENT_TIME = 0
PROCESSING_TIME = 1


class CodecError(ValueError):
    """A buffer that does not follow the encoding."""


class Record:
    """A record: key and value are bytes; timestamp is event time in milliseconds."""

    __slots__ = ("value", "key", "timestamp", "headers", "partition", "output")

    def __init__(
        self,
        value: bytes,
        key: Optional[bytes] = None,
        timestamp: Optional[int] = None,
        headers: Tuple[Tuple[bytes, bytes], ...] = (),
        partition: Optional[int] = None,
        output: int = 0,
    ):
        self.value = value
        self.key = key
        self.timestamp = timestamp
        self.headers = headers
        self.partition = partition
        self.output = output

    def _fields(self) -> tuple:
        return (self.value, self.key, self.timestamp, self.headers, self.partition, self.output)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Record) and self._fields() == other._fields()

    def __repr__(self) -> str:
        return (
            f"Record(value={self.value!r}, key={self.key!r}, timestamp={self.timestamp!r}"
            + (f", headers={self.headers!r}" if self.headers else "")
            + (f", partition={self.partition!r}" if self.partition is not None else "")
            + (f", output={self.output!r}" if self.output else "")
            + ")"
        )

    def value_str(self) -> str:
        """The value as UTF-8 text."""
        return self.value.decode("utf-8")

    def json(self):
        """The value read as JSON: what a source with `format = "json"` or `"avro"`
        hands operators (an Avro record is a dict of its fields)."""
        return _json.loads(self.value)

    def key_str(self) -> Optional[str]:
        """The key as UTF-8 text, if there is one."""
        return None if self.key is None else self.key.decode("utf-8")

    def header(self, name: str) -> Optional[bytes]:
        """The value of the first header called `name`."""
        wanted = name.encode()
        return next((v for n, v in self.headers if n == wanted), None)


class _Reader:
    def __init__(self, data: bytes, what: str):
        self.data = memoryview(data)
        self.pos = 0
        self.what = what

    def done(self) -> bool:
        return self.pos >= len(self.data)

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.data):
            raise CodecError(f"{self.what}: truncated at byte {self.pos}")
        out = bytes(self.data[self.pos : end])
        self.pos = end
        return out

    def u8(self) -> int:
        return self.take(1)[0]

    def u32(self) -> int:
        return _U32.unpack(self.take(4))[0]

    def i64(self) -> int:
        return _I64.unpack(self.take(8))[0]

    def u64(self) -> int:
        return _U64.unpack(self.take(8))[0]

    def bytes(self) -> bytes:
        return self.take(self.u32())


def _bytes(out: bytearray, b: bytes) -> None:
    out += _U32.pack(len(b))
    out += b


def decode_records(data: bytes) -> Iterator[Record]:
    """The records of a batch, in order. (The hot path of every operator: one loop
    without helper calls.)"""
    data = bytes(data)
    end = len(data)
    pos = 0
    u32 = _U32.unpack_from
    try:
        while pos < end:
            start = pos
            flags = data[pos]
            pos += 1
            if flags & ~0x1F:
                raise CodecError(f"records: unknown flags {flags:#x} at byte {start}")
            ts = key = partition = None
            headers: Tuple[Tuple[bytes, bytes], ...] = ()
            output = 0
            if flags & HAS_TIMESTAMP:
                ts = _I64.unpack_from(data, pos)[0]
                pos += 8
            if flags & HAS_KEY:
                n = u32(data, pos)[0]
                key = data[pos + 4 : pos + 4 + n]
                pos += 4 + n
            if flags & HAS_HEADERS:
                r = _Reader(data, "records")
                r.pos = pos
                headers = tuple((r.bytes(), r.bytes()) for _ in range(r.u32()))
                pos = r.pos
            if flags & HAS_PARTITION:
                partition = u32(data, pos)[0]
                pos += 4
            if flags & HAS_OUTPUT:
                output = u32(data, pos)[0]
                pos += 4
            n = u32(data, pos)[0]
            value = data[pos + 4 : pos + 4 + n]
            pos += 4 + n
            if pos > end:
                raise CodecError(f"records: truncated record at byte {start}")
            yield Record(value, key, ts, headers, partition, output)
    except struct.error:
        raise CodecError(f"records: truncated at byte {pos}") from None


def encode_record(out: bytearray, record: Record) -> None:
    """Appends `record` to a batch."""
    if not record.headers and record.partition is None and not record.output:
        encode_simple(out, record.value, record.key, record.timestamp)
        return
    flags = 0
    if record.timestamp is not None:
        flags |= HAS_TIMESTAMP
    if record.key is not None:
        flags |= HAS_KEY
    if record.headers:
        flags |= HAS_HEADERS
    if record.partition is not None:
        flags |= HAS_PARTITION
    if record.output:
        flags |= HAS_OUTPUT
    out.append(flags)
    if record.timestamp is not None:
        out += _I64.pack(record.timestamp)
    if record.key is not None:
        _bytes(out, record.key)
    if record.headers:
        out += _U32.pack(len(record.headers))
        for name, value in record.headers:
            _bytes(out, name)
            _bytes(out, value)
    if record.partition is not None:
        out += _U32.pack(record.partition)
    if record.output:
        out += _U32.pack(record.output)
    _bytes(out, record.value)


def encode_simple(out: bytearray, value: bytes, key: Optional[bytes], ts: Optional[int]) -> None:
    """Appends a record of a value, maybe a key and a timestamp (what most emit)."""
    if ts is None:
        if key is None:
            out += b"\x00"
        else:
            out += b"\x02"
            out += _U32.pack(len(key))
            out += key
    else:
        out += b"\x03" if key is not None else b"\x01"
        out += _I64.pack(ts)
        if key is not None:
            out += _U32.pack(len(key))
            out += key
    out += _U32.pack(len(value))
    out += value


def pack(strings: List[Optional[bytes]]) -> Tuple[bytes, bytes, bytes]:
    """Byte strings (`None`: absent) as `wit/operator.wit`'s `packed` holds them:
    `(data, ends, absent)`, made by native functions (no bytecode per string unless some
    are absent)."""
    absent = b""
    if None in strings:
        absent = bytes([s is None for s in strings])
        strings = [b"" if s is None else s for s in strings]
    return b"".join(strings), array("I", accumulate(map(len, strings))).tobytes(), absent


def unpack(data: bytes, ends: bytes, absent: bytes) -> List[Optional[bytes]]:
    """The strings of a `packed`, `None` where absent: one slice each (a comprehension,
    measured faster than `map` over `slice` objects)."""
    if len(ends) % 4 or (absent and len(absent) * 4 != len(ends)):
        raise CodecError(f"packed: {len(ends)} bytes of ends and {len(absent)} of absent")
    stops = memoryview(ends).cast("I").tolist()
    if stops and (stops[-1] > len(data) or any(map(int.__gt__, [0] + stops[:-1], stops))):
        raise CodecError("packed: ends out of order or beyond the data")
    strings: List[Optional[bytes]] = [data[a:b] for a, b in zip([0] + stops[:-1], stops)]
    if absent:
        strings = [None if no else s for s, no in zip(strings, absent)]
    return strings


def decode_timers(data: bytes) -> Iterator[Tuple[int, int, bytes]]:
    """`(domain, timestamp, key)` of each timer."""
    r = _Reader(data, "timers")
    while not r.done():
        yield r.u8(), r.i64(), r.bytes()


def encode_timers(timers: List[Tuple[int, int, bytes]]) -> bytes:
    out = bytearray()
    for domain, ts, key in timers:
        out.append(domain)
        out += _I64.pack(ts)
        _bytes(out, key)
    return bytes(out)


def decode_entries(data: bytes) -> Iterator[Tuple[bytes, bytes]]:
    """`(user key, value)` of each entry."""
    r = _Reader(data, "entries")
    while not r.done():
        yield r.bytes(), r.bytes()


def encode_entries(entries: List[Tuple[bytes, bytes]]) -> bytes:
    out = bytearray()
    for user_key, value in entries:
        _bytes(out, user_key)
        _bytes(out, value)
    return bytes(out)


# Effects.
PUT, DELETE, CLEAR, APPEND, REGISTER_TIMER, DELETE_TIMER, COUNTER = range(1, 8)
_PUT_HEAD = struct.Struct("<BII")
PUT_MANY = 8
# Effect 8 with an empty user key: tag, state, user key length, count.
_MANY_HEAD = struct.Struct("<BIII")


class EffectWriter:
    """The effects of one call, in order."""

    def __init__(self) -> None:
        self.out = bytearray()

    def put(self, state: int, key: bytes, user_key: bytes, value: bytes) -> None:
        out = self.out
        out += _PUT_HEAD.pack(PUT, state, len(key))
        out += key
        out += _U32.pack(len(user_key))
        out += user_key
        out += _U32.pack(len(value))
        out += value

    def put_many(self, state: int, keys: List[bytes], data: bytes, ends: bytes) -> None:
        """A value-state put of each key (empty user key), its value packed in `data`
        and `ends` (effect 8: one effect for the lot, packed by native functions)."""
        key_ends = array("I", accumulate(map(len, keys))).tobytes()
        out = self.out
        out += _MANY_HEAD.pack(PUT_MANY, state, 0, len(keys))
        out += key_ends
        out += _U32.pack(sum(map(len, keys)))
        out += b"".join(keys)
        out += ends
        out += _U32.pack(len(data))
        out += data

    def delete(self, state: int, key: bytes, user_key: bytes) -> None:
        self.out.append(DELETE)
        self.out += _U32.pack(state)
        _bytes(self.out, key)
        _bytes(self.out, user_key)

    def clear(self, state: int, key: bytes) -> None:
        self.out.append(CLEAR)
        self.out += _U32.pack(state)
        _bytes(self.out, key)

    def append(self, state: int, key: bytes, value: bytes) -> None:
        self.out.append(APPEND)
        self.out += _U32.pack(state)
        _bytes(self.out, key)
        _bytes(self.out, value)

    def timer(self, register: bool, domain: int, ts: int, key: bytes) -> None:
        self.out.append(REGISTER_TIMER if register else DELETE_TIMER)
        self.out.append(domain)
        self.out += _I64.pack(ts)
        _bytes(self.out, key)

    def counter(self, name: str, delta: int) -> None:
        self.out.append(COUNTER)
        _bytes(self.out, name.encode())
        self.out += _U64.pack(delta)


def decode_effects(data: bytes) -> Iterator[tuple]:
    """Each effect as a tuple `(kind, ...fields)` (for harnesses and tests)."""
    r = _Reader(data, "effects")
    while not r.done():
        kind = r.u8()
        if kind == PUT:
            yield PUT, r.u32(), r.bytes(), r.bytes(), r.bytes()
        elif kind == DELETE:
            yield DELETE, r.u32(), r.bytes(), r.bytes()
        elif kind == CLEAR:
            yield CLEAR, r.u32(), r.bytes()
        elif kind == APPEND:
            yield APPEND, r.u32(), r.bytes(), r.bytes()
        elif kind in (REGISTER_TIMER, DELETE_TIMER):
            yield kind, r.u8(), r.i64(), r.bytes()
        elif kind == COUNTER:
            yield COUNTER, r.bytes().decode(), r.u64()
        elif kind == PUT_MANY:
            # As the host reads it: one put per key, in order.
            state, user_key, count = r.u32(), r.bytes(), r.u32()
            key_ends = [r.u32() for _ in range(count)]
            keys = r.bytes()
            value_ends = [r.u32() for _ in range(count)]
            values = r.bytes()
            k = v = 0
            for ke, ve in zip(key_ends, value_ends):
                if not (k <= ke <= len(keys) and v <= ve <= len(values)):
                    raise CodecError(f"effects: puts whose ends are out of order at byte {r.pos}")
                yield PUT, state, keys[k:ke], user_key, values[v:ve]
                k, v = ke, ve
        else:
            raise CodecError(f"effects: unknown effect {kind} at byte {r.pos - 1}")
