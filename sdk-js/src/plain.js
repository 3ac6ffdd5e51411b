// Plain keyed-state values: fixed layouts every SDK reads the same way
// (wit/operator.wit, "Plain values"): `I64`, `U64` as 8 little-endian bytes (two's
// complement for I64), `F64` as the 8 little-endian bytes of a double, `STR` as UTF-8,
// `BYTES` as they are. `ValueState.getMany` and `putMany` decode and encode a batch of
// numbers at once through typed arrays, where postcard's varints take a loop per value.
// Integers decode to Numbers when they are safe integers, else to BigInts.

import { CodecError, TEXT_DECODER, TEXT_ENCODER, pack, unpack } from './codec.js';

export class PlainError extends CodecError {}

const LITTLE = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

/** `n` 8-byte numbers of `data` (a copy, aligned) as a typed array of `Kind`. */
function numbers(Kind, data) {
  const copy = data.slice();
  if (!LITTLE) {
    for (let i = 0; i < copy.length; i += 8) copy.subarray(i, i + 8).reverse();
  }
  return new Kind(copy.buffer, 0, copy.length / 8);
}

function bytesOf(array) {
  const bytes = new Uint8Array(array.buffer, array.byteOffset, array.byteLength);
  if (!LITTLE) for (let i = 0; i < bytes.length; i += 8) bytes.subarray(i, i + 8).reverse();
  return bytes;
}

/** Checks that `ends`/`absent` describe 8 bytes per present value. */
function checkFixed(name, data, ends, absent) {
  const view = new DataView(ends.buffer, ends.byteOffset, ends.byteLength);
  let want = 0;
  for (let i = 0; i < ends.length / 4; i++) {
    if (!(absent.length && absent[i])) want += 8;
    if (view.getUint32(4 * i, true) !== want) throw new PlainError(`a ${name} is 8 bytes: packed values of other sizes`);
  }
  if (ends.length % 4 || want !== data.length) throw new PlainError(`a ${name} is 8 bytes: packed values of other sizes`);
}

class Fixed {
  constructor(name, Kind, fromRaw, toRaw) {
    this.name = name;
    this.Kind = Kind;
    this.fromRaw = fromRaw;
    this.toRaw = toRaw;
  }
  encode(value) {
    return bytesOf(new this.Kind([this.toRaw(value)]));
  }
  decode(data) {
    if (data.length !== 8) throw new PlainError(`a ${this.name} is 8 bytes, not ${data.length}`);
    return this.fromRaw(numbers(this.Kind, data)[0]);
  }
  encodePacked(values) {
    const data = bytesOf(this.Kind.from(values, this.toRaw));
    const ends = new Uint32Array(values.length);
    for (let i = 0; i < values.length; i++) ends[i] = 8 * (i + 1);
    return { data, ends: new Uint8Array(ends.buffer) };
  }
  decodePacked(data, ends, absent) {
    checkFixed(this.name, data, ends, absent);
    const present = numbers(this.Kind, data);
    const n = ends.length / 4;
    const out = new Array(n);
    let j = 0;
    for (let i = 0; i < n; i++) out[i] = absent.length && absent[i] ? null : this.fromRaw(present[j++]);
    return out;
  }
}

const safe = (x) => (x <= BigInt(Number.MAX_SAFE_INTEGER) && x >= BigInt(Number.MIN_SAFE_INTEGER) ? Number(x) : x);
const int = (name, min, max) => (v) => {
  const x = BigInt(v);
  if (x < min || x > max) throw new PlainError(`${v} is no ${name}`);
  return x;
};

export const I64 = new Fixed('i64', BigInt64Array, safe, int('i64', -(2n ** 63n), 2n ** 63n - 1n));
export const U64 = new Fixed('u64', BigUint64Array, safe, int('u64', 0n, 2n ** 64n - 1n));
export const F64 = new Fixed('f64', Float64Array, (x) => x, (v) => Number(v));

export const STR = {
  encode: (v) => TEXT_ENCODER.encode(v),
  decode: (data) => TEXT_DECODER.decode(data),
};

export const BYTES = {
  encode: (v) => v,
  decode: (data) => data,
  encodePacked: (values) => pack(values),
  decodePacked: (data, ends, absent) => unpack(data, ends, absent),
};
