"""The subset of postcard (https://postcard.jamesmunns.com) that keyed state values use,
so that Python and Rust operators read each other's state: `ctx.value_state("count",
postcard.U64)` holds what the Rust SDK's `ValueState<u64>` holds.

A codec has `encode(value) -> bytes` and `decode(bytes) -> value`.
"""

from __future__ import annotations

import struct
from typing import Any, Callable, List, Optional, Sequence, Tuple


from . import codec as _codec


class PostcardError(ValueError):
    """Bytes that are not the postcard encoding of the expected type."""


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(data: bytes, pos: int, bits: int) -> Tuple[int, int]:
    n = shift = 0
    while True:
        if pos >= len(data):
            raise PostcardError("truncated varint")
        byte = data[pos]
        pos += 1
        n |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if n >> bits:
                raise PostcardError(f"varint beyond {bits} bits")
            return n, pos
        shift += 7
        if shift > bits + 7:
            raise PostcardError("varint too long")


class Codec:
    """Encodes values of one type."""

    def write(self, out: bytearray, value: Any) -> None:
        raise NotImplementedError

    def read(self, data: bytes, pos: int) -> Tuple[Any, int]:
        raise NotImplementedError

    def encode(self, value: Any) -> bytes:
        out = bytearray()
        self.write(out, value)
        return bytes(out)

    def decode(self, data: bytes) -> Any:
        value, pos = self.read(bytes(data), 0)
        if pos != len(data):
            raise PostcardError(f"{len(data) - pos} bytes left after the value")
        return value

    def encode_packed(self, values: List[Any]) -> Tuple[bytes, bytes]:
        """Values packed (`data`, `ends`) as `wit/operator.wit`'s `packed` holds them."""
        data, ends, _ = _codec.pack([self.encode(v) for v in values])
        return data, ends

    def decode_packed(self, data: bytes, ends: bytes, absent: bytes) -> List[Any]:
        """The values of a `packed`, `None` where absent."""
        decode = self.decode
        return [None if raw is None else decode(raw) for raw in _codec.unpack(data, ends, absent)]


class _Unsigned(Codec):
    def __init__(self, bits: int):
        self.bits = bits

    def encode(self, value: int) -> bytes:
        # One or two bytes: most counts.
        if 0 <= value < 0x80:
            return bytes((value,))
        if 0x80 <= value < 0x4000:
            return bytes((value & 0x7F | 0x80, value >> 7))
        return super().encode(value)

    def decode(self, data: bytes) -> int:
        n = len(data)
        if n == 1 and data[0] < 0x80:
            return data[0]
        if n == 2 and data[0] & 0x80 and 0 < data[1] < 0x80:
            return data[0] & 0x7F | data[1] << 7
        return super().decode(data)

    def write(self, out: bytearray, value: int) -> None:
        if not 0 <= value < 1 << self.bits:
            raise PostcardError(f"{value} is not a u{self.bits}")
        out += _varint(value)

    def read(self, data: bytes, pos: int) -> Tuple[int, int]:
        return _read_varint(data, pos, self.bits)


class _Signed(Codec):
    def __init__(self, bits: int):
        self.bits = bits

    def write(self, out: bytearray, value: int) -> None:
        if not -(1 << (self.bits - 1)) <= value < 1 << (self.bits - 1):
            raise PostcardError(f"{value} is not an i{self.bits}")
        out += _varint(((value << 1) ^ (value >> (self.bits - 1))) & ((1 << self.bits) - 1))

    def read(self, data: bytes, pos: int) -> Tuple[int, int]:
        n, pos = _read_varint(data, pos, self.bits)
        return (n >> 1) ^ -(n & 1), pos


class _Float(Codec):
    def write(self, out: bytearray, value: float) -> None:
        out += struct.pack("<d", value)

    def read(self, data: bytes, pos: int) -> Tuple[float, int]:
        if pos + 8 > len(data):
            raise PostcardError("truncated f64")
        return struct.unpack_from("<d", data, pos)[0], pos + 8


class _Bool(Codec):
    def write(self, out: bytearray, value: bool) -> None:
        out.append(1 if value else 0)

    def read(self, data: bytes, pos: int) -> Tuple[bool, int]:
        if pos >= len(data) or data[pos] > 1:
            raise PostcardError("not a bool")
        return data[pos] == 1, pos + 1


class _Bytes(Codec):
    def write(self, out: bytearray, value: bytes) -> None:
        out += _varint(len(value))
        out += value

    def read(self, data: bytes, pos: int) -> Tuple[bytes, int]:
        n, pos = _read_varint(data, pos, 64)
        if pos + n > len(data):
            raise PostcardError("truncated bytes")
        return bytes(data[pos : pos + n]), pos + n


class _Str(Codec):
    def write(self, out: bytearray, value: str) -> None:
        BYTES.write(out, value.encode("utf-8"))

    def read(self, data: bytes, pos: int) -> Tuple[str, int]:
        raw, pos = BYTES.read(data, pos)
        try:
            return raw.decode("utf-8"), pos
        except UnicodeDecodeError as e:
            raise PostcardError(f"not UTF-8: {e}") from None


class Option(Codec):
    """`Option<T>`: `None` or a value of `inner`."""

    def __init__(self, inner: Codec):
        self.inner = inner

    def write(self, out: bytearray, value: Any) -> None:
        if value is None:
            out.append(0)
        else:
            out.append(1)
            self.inner.write(out, value)

    def read(self, data: bytes, pos: int) -> Tuple[Any, int]:
        if pos >= len(data) or data[pos] > 1:
            raise PostcardError("not an option")
        if data[pos] == 0:
            return None, pos + 1
        return self.inner.read(data, pos + 1)


class Seq(Codec):
    """`Vec<T>`: a list of values of `inner`."""

    def __init__(self, inner: Codec):
        self.inner = inner

    def write(self, out: bytearray, value: Sequence[Any]) -> None:
        out += _varint(len(value))
        for v in value:
            self.inner.write(out, v)

    def read(self, data: bytes, pos: int) -> Tuple[List[Any], int]:
        n, pos = _read_varint(data, pos, 64)
        items = []
        for _ in range(n):
            item, pos = self.inner.read(data, pos)
            items.append(item)
        return items, pos


class Tuple_(Codec):
    """A tuple or struct: its fields one after the other (as serde's derive writes a
    Rust struct of these field types, in declaration order)."""

    def __init__(self, *fields: Codec):
        self.fields = fields

    def write(self, out: bytearray, value: Sequence[Any]) -> None:
        if len(value) != len(self.fields):
            raise PostcardError(f"{len(value)} fields where {len(self.fields)} are expected")
        for codec, v in zip(self.fields, value):
            codec.write(out, v)

    def read(self, data: bytes, pos: int) -> Tuple[tuple, int]:
        values = []
        for codec in self.fields:
            v, pos = codec.read(data, pos)
            values.append(v)
        return tuple(values), pos


class Raw(Codec):
    """The bytes as they are (no length): for values only this operator reads."""

    def write(self, out: bytearray, value: bytes) -> None:
        out += value

    def read(self, data: bytes, pos: int) -> Tuple[bytes, int]:
        return bytes(data[pos:]), len(data)


class _Byte(Codec):
    """`u8` or `i8`: postcard writes them as one raw byte (only wider integers are
    varints)."""

    def __init__(self, signed: bool):
        self.signed = signed

    def write(self, out: bytearray, value: int) -> None:
        low, high = (-128, 127) if self.signed else (0, 255)
        if not low <= value <= high:
            raise PostcardError(f"{value} is not a{'n i' if self.signed else ' u'}8")
        out.append(value & 0xFF)

    def read(self, data: bytes, pos: int) -> Tuple[int, int]:
        if pos >= len(data):
            raise PostcardError("truncated byte")
        b = data[pos]
        return (b - 256 if self.signed and b > 127 else b), pos + 1


U8, U16, U32, U64 = _Byte(False), _Unsigned(16), _Unsigned(32), _Unsigned(64)
I8, I16, I32, I64 = _Byte(True), _Signed(16), _Signed(32), _Signed(64)
F64 = _Float()
BOOL = _Bool()
BYTES = _Bytes()
STR = _Str()
RAW = Raw()
Tuple = Tuple_  # noqa: F811  (the public name)
