"""Plain keyed-state values: fixed layouts that every SDK reads the same way
(`wit/operator.wit`, "Plain values"), where `sluice_sdk.postcard` encodes value by value
in the interpreter:

- `I64`, `U64`: 8 bytes, little-endian, two's complement for `I64`;
- `F64`: the 8 bytes of an IEEE 754 double, little-endian;
- `STR`: UTF-8; `BYTES`: the bytes as they are.

`ValueState.get_many` and `put_many` decode and encode a batch of `I64`, `U64` and `F64`
values at once, in native code (`array`, `memoryview`): no bytecode runs per value.

```python
op.counts = ctx.value_state("count", plain.I64)
```
"""

from __future__ import annotations

import struct
from array import array
from itertools import accumulate
from typing import Any, List, Optional, Tuple

from . import codec as _codec
from .postcard import Codec, PostcardError


class PlainError(PostcardError):
    """Bytes that are not a plain value of the expected type."""


class _Fixed(Codec):
    """8 bytes per value, as `array` typecode `code` lays them out on a little-endian
    machine (WebAssembly is one; elsewhere the bytes are swapped)."""

    def __init__(self, code: str, name: str):
        self.code, self.name = code, name
        self.struct = struct.Struct("<" + code)

    def encode(self, value: Any) -> bytes:
        try:
            return self.struct.pack(value)
        except struct.error as e:
            raise PlainError(f"{value!r} is no {self.name}: {e}") from None

    def decode(self, data: bytes) -> Any:
        if len(data) != 8:
            raise PlainError(f"a {self.name} is 8 bytes, not {len(data)}")
        return self.struct.unpack(data)[0]

    def write(self, out: bytearray, value: Any) -> None:
        out += self.encode(value)

    def read(self, data: bytes, pos: int) -> Tuple[Any, int]:
        return self.decode(data[pos : pos + 8]), pos + 8

    def _array(self, values: Any) -> array:
        a = array(self.code, values)
        if a.itemsize != 8:
            raise PlainError(f"array typecode {self.code!r} is not 8 bytes here")
        if _BIG_ENDIAN:
            a.byteswap()
        return a

    def encode_packed(self, values: List[Any]) -> Tuple[bytes, bytes]:
        try:
            data = self._array(values).tobytes()
        except (OverflowError, TypeError) as e:
            raise PlainError(f"a value is no {self.name}: {e}") from None
        return data, array("I", range(8, 8 * len(values) + 1, 8)).tobytes()

    def decode_packed(self, data: bytes, ends: bytes, absent: bytes) -> List[Optional[Any]]:
        count = len(ends) // 4
        if absent:
            sizes = map((8).__mul__, map((1).__xor__, absent))
        else:
            sizes = [8] * count
        if len(ends) % 4 or ends != array("I", accumulate(sizes)).tobytes() or len(data) % 8:
            raise PlainError(f"a {self.name} is 8 bytes: packed values of other sizes")
        a = array(self.code)
        a.frombytes(data)
        if _BIG_ENDIAN:
            a.byteswap()
        values = a.tolist()
        if not absent:
            return values
        present = iter(values)
        return [None if no else next(present) for no in absent]


class _Text(Codec):
    def encode(self, value: str) -> bytes:
        return value.encode("utf-8")

    def decode(self, data: bytes) -> str:
        try:
            return bytes(data).decode("utf-8")
        except UnicodeDecodeError as e:
            raise PlainError(f"not UTF-8: {e}") from None

    def write(self, out: bytearray, value: str) -> None:
        out += self.encode(value)

    def read(self, data: bytes, pos: int) -> Tuple[str, int]:
        return self.decode(data[pos:]), len(data)


class _Bytes(Codec):
    def encode(self, value: bytes) -> bytes:
        return bytes(value)

    def decode(self, data: bytes) -> bytes:
        return bytes(data)

    def write(self, out: bytearray, value: bytes) -> None:
        out += value

    def read(self, data: bytes, pos: int) -> Tuple[bytes, int]:
        return bytes(data[pos:]), len(data)

    def encode_packed(self, values: List[Any]) -> Tuple[bytes, bytes]:
        data, ends, _ = _codec.pack([bytes(v) for v in values])
        return data, ends

    def decode_packed(self, data: bytes, ends: bytes, absent: bytes) -> List[Optional[Any]]:
        return _codec.unpack(data, ends, absent)


import sys as _sys  # noqa: E402

_BIG_ENDIAN = _sys.byteorder == "big"

I64 = _Fixed("q", "i64")
U64 = _Fixed("Q", "u64")
F64 = _Fixed("d", "f64")
STR = _Text()
BYTES = _Bytes()
