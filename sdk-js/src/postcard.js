// The subset of postcard (https://postcard.jamesmunns.com) keyed state values use, so
// that JavaScript, Python and Rust operators read each other's state:
// `ctx.valueState("count", postcard.U64)` holds what the Rust SDK's `ValueState<u64>`
// holds. Integers decode to Numbers when they are safe integers, else to BigInts;
// encoders take either.

import { TEXT_DECODER, TEXT_ENCODER } from './codec.js';

export class PostcardError extends Error {}

class Out {
  constructor() {
    this.parts = [];
    this.length = 0;
  }
  push(bytes) {
    this.parts.push(bytes);
    this.length += bytes.length;
  }
  finish() {
    if (this.parts.length === 1) return this.parts[0];
    const out = new Uint8Array(this.length);
    let at = 0;
    for (const p of this.parts) {
      out.set(p, at);
      at += p.length;
    }
    return out;
  }
}

function varint(n) {
  // `n`: a non-negative BigInt or safe Number.
  if (typeof n === 'number' && n < 0x80) return Uint8Array.of(n);
  let x = BigInt(n);
  const bytes = [];
  for (;;) {
    const b = Number(x & 0x7fn);
    x >>= 7n;
    if (x) bytes.push(b | 0x80);
    else {
      bytes.push(b);
      return Uint8Array.from(bytes);
    }
  }
}

function readVarint(data, pos, bits) {
  if (pos < data.length && data[pos] < 0x80) return [BigInt(data[pos]), pos + 1];
  let n = 0n;
  let shift = 0n;
  for (;;) {
    if (pos >= data.length) throw new PostcardError('truncated varint');
    const b = data[pos++];
    n |= BigInt(b & 0x7f) << shift;
    if (!(b & 0x80)) {
      if (n >> BigInt(bits)) throw new PostcardError(`varint beyond ${bits} bits`);
      return [n, pos];
    }
    shift += 7n;
    if (shift > BigInt(bits + 7)) throw new PostcardError('varint too long');
  }
}

const plain = (n) => (n <= BigInt(Number.MAX_SAFE_INTEGER) && n >= BigInt(Number.MIN_SAFE_INTEGER) ? Number(n) : n);

class Codec {
  encode(value) {
    const out = new Out();
    this.write(out, value);
    return out.finish();
  }
  decode(data) {
    const [value, pos] = this.read(data, 0);
    if (pos !== data.length) throw new PostcardError(`${data.length - pos} bytes left after the value`);
    return value;
  }
}

class Unsigned extends Codec {
  constructor(bits) {
    super();
    this.bits = bits;
  }
  write(out, value) {
    if (typeof value === 'number' && value >= 0 && value < 0x80 && Number.isInteger(value)) {
      out.push(Uint8Array.of(value));
      return;
    }
    const v = BigInt(value);
    if (v < 0n || v >> BigInt(this.bits)) throw new PostcardError(`${value} is not a u${this.bits}`);
    out.push(varint(v));
  }
  read(data, pos) {
    if (pos < data.length && data[pos] < 0x80) return [data[pos], pos + 1];
    const [n, next] = readVarint(data, pos, this.bits);
    return [plain(n), next];
  }
}

class Signed extends Codec {
  constructor(bits) {
    super();
    this.bits = bits;
  }
  write(out, value) {
    const v = BigInt(value);
    const half = 1n << BigInt(this.bits - 1);
    if (v < -half || v >= half) throw new PostcardError(`${value} is not an i${this.bits}`);
    const zigzag = v >= 0n ? v << 1n : (-v << 1n) - 1n;
    out.push(varint(zigzag));
  }
  read(data, pos) {
    const [n, next] = readVarint(data, pos, this.bits);
    const v = n & 1n ? -((n + 1n) >> 1n) : n >> 1n;
    return [plain(v), next];
  }
}

class Float extends Codec {
  write(out, value) {
    const b = new Uint8Array(8);
    new DataView(b.buffer).setFloat64(0, value, true);
    out.push(b);
  }
  read(data, pos) {
    if (pos + 8 > data.length) throw new PostcardError('truncated f64');
    return [new DataView(data.buffer, data.byteOffset + pos, 8).getFloat64(0, true), pos + 8];
  }
}

class Bool extends Codec {
  write(out, value) {
    out.push(Uint8Array.of(value ? 1 : 0));
  }
  read(data, pos) {
    if (pos >= data.length || data[pos] > 1) throw new PostcardError('not a bool');
    return [data[pos] === 1, pos + 1];
  }
}

class Bytes extends Codec {
  write(out, value) {
    if (typeof value === 'string') value = TEXT_ENCODER.encode(value);
    out.push(varint(value.length));
    out.push(value);
  }
  read(data, pos) {
    const [n, next] = readVarint(data, pos, 64);
    const end = next + Number(n);
    if (end > data.length) throw new PostcardError('truncated bytes');
    return [data.slice(next, end), end];
  }
}

class Str extends Codec {
  write(out, value) {
    BYTES.write(out, TEXT_ENCODER.encode(value));
  }
  read(data, pos) {
    const [raw, next] = BYTES.read(data, pos);
    return [TEXT_DECODER.decode(raw), next];
  }
}

export class Option extends Codec {
  constructor(inner) {
    super();
    this.inner = inner;
  }
  write(out, value) {
    if (value === null || value === undefined) out.push(Uint8Array.of(0));
    else {
      out.push(Uint8Array.of(1));
      this.inner.write(out, value);
    }
  }
  read(data, pos) {
    if (pos >= data.length || data[pos] > 1) throw new PostcardError('not an option');
    return data[pos] === 0 ? [null, pos + 1] : this.inner.read(data, pos + 1);
  }
}

export class Seq extends Codec {
  constructor(inner) {
    super();
    this.inner = inner;
  }
  write(out, value) {
    out.push(varint(value.length));
    for (const v of value) this.inner.write(out, v);
  }
  read(data, pos) {
    let [n, next] = readVarint(data, pos, 64);
    const items = [];
    for (let i = 0n; i < n; i++) {
      const [v, p] = this.inner.read(data, next);
      items.push(v);
      next = p;
    }
    return [items, next];
  }
}

/** A tuple or struct: its fields one after the other (as serde writes a Rust struct). */
export class Tuple extends Codec {
  constructor(...fields) {
    super();
    this.fields = fields;
  }
  write(out, value) {
    if (value.length !== this.fields.length) throw new PostcardError(`${value.length} fields where ${this.fields.length} are expected`);
    this.fields.forEach((c, i) => c.write(out, value[i]));
  }
  read(data, pos) {
    const values = [];
    for (const c of this.fields) {
      const [v, p] = c.read(data, pos);
      values.push(v);
      pos = p;
    }
    return [values, pos];
  }
}

/** The bytes as they are (no length): for values only this operator reads. */
class Raw extends Codec {
  write(out, value) {
    out.push(value);
  }
  read(data, pos) {
    return [data.slice(pos), data.length];
  }
}

/** `u8` or `i8`: postcard writes them as one raw byte (only wider integers are varints). */
class Byte extends Codec {
  constructor(signed) {
    super();
    this.signed = signed;
  }
  write(out, value) {
    const [low, high] = this.signed ? [-128, 127] : [0, 255];
    if (!Number.isInteger(Number(value)) || value < low || value > high) throw new PostcardError(`${value} is not a${this.signed ? 'n i' : ' u'}8`);
    out.push(Uint8Array.of(Number(value) & 0xff));
  }
  read(data, pos) {
    if (pos >= data.length) throw new PostcardError('truncated byte');
    const b = data[pos];
    return [this.signed && b > 127 ? b - 256 : b, pos + 1];
  }
}

export const U8 = new Byte(false), U16 = new Unsigned(16), U32 = new Unsigned(32), U64 = new Unsigned(64);
export const I8 = new Byte(true), I16 = new Signed(16), I32 = new Signed(32), I64 = new Signed(64);
export const F64 = new Float();
export const BOOL = new Bool();
export const BYTES = new Bytes();
export const STR = new Str();
export const RAW = new Raw();
