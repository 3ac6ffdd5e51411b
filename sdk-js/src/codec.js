// The flat encodings of wit/operator.wit: records, timers, entries and effects, read and
// written through DataViews over Uint8Arrays (no object per field, no copies of values:
// a record's key and value are views into the batch).

export const HAS_TIMESTAMP = 0x01;
export const HAS_KEY = 0x02;
export const HAS_HEADERS = 0x04;
export const HAS_PARTITION = 0x08;
export const HAS_OUTPUT = 0x10;
export const EVENT_TIME = 0;
export const PROCESSING_TIME = 1;

const I64_MIN = -(2n ** 63n);
const I64_MAX = 2n ** 63n - 1n;

/** An i64 of the host as a Number: its minimum and maximum as -Infinity and Infinity. */
export function timeFromI64(t) {
  if (t === I64_MIN) return -Infinity;
  if (t === I64_MAX) return Infinity;
  return Number(t);
}

/** A Number time as the host's i64. Times are exact up to 2^53 ms (285,000 years);
 * beyond, a Number is the i64 nearest, and those past the i64 range are its ends. */
export function timeToI64(t) {
  if (!Number.isInteger(t) && Math.abs(t) !== Infinity) throw new TypeError(`time ${t} is not an integer of milliseconds`);
  if (t >= 2 ** 63) return I64_MAX;
  if (t < -(2 ** 63)) return I64_MIN;
  if (t === -(2 ** 63)) return I64_MIN;
  return BigInt(t);
}

export class CodecError extends Error {}

export class Record {
  constructor(value, key = null, timestamp = null, headers = null, partition = null, output = 0) {
    this.value = value;
    this.key = key;
    this.timestamp = timestamp;
    this.headers = headers;
    this.partition = partition;
    this.output = output;
  }

  /** The value as UTF-8 text. */
  valueText() {
    return TEXT_DECODER.decode(this.value);
  }

  /** The value read as JSON: what a source with `format = "json"` or `"avro"` hands
   *  operators (an Avro record is an object of its fields). */
  json() {
    return JSON.parse(TEXT_DECODER.decode(this.value));
  }

  /** The key as UTF-8 text, or null. */
  keyText() {
    return this.key === null ? null : TEXT_DECODER.decode(this.key);
  }
}

export const TEXT_ENCODER = new TextEncoder();
export const TEXT_DECODER = new TextDecoder('utf-8', { fatal: true });

/** Calls `f(record)` for each record of a batch, in order. */
export function forEachRecord(data, f) {
  const view = new DataView(data.buffer, data.byteOffset, data.byteLength);
  const end = data.byteLength;
  let pos = 0;
  const need = (n, start) => {
    if (pos + n > end) throw new CodecError(`records: truncated record at byte ${start}`);
  };
  while (pos < end) {
    const start = pos;
    const flags = data[pos++];
    if (flags & ~0x1f) throw new CodecError(`records: unknown flags 0x${flags.toString(16)} at byte ${start}`);
    let timestamp = null;
    let key = null;
    let headers = null;
    let partition = null;
    let output = 0;
    if (flags & HAS_TIMESTAMP) {
      need(8, start);
      timestamp = timeFromI64(view.getBigInt64(pos, true));
      pos += 8;
    }
    if (flags & HAS_KEY) {
      need(4, start);
      const n = view.getUint32(pos, true);
      need(4 + n, start);
      key = data.subarray(pos + 4, pos + 4 + n);
      pos += 4 + n;
    }
    if (flags & HAS_HEADERS) {
      need(4, start);
      const count = view.getUint32(pos, true);
      pos += 4;
      headers = [];
      for (let i = 0; i < count; i++) {
        const pair = [];
        for (let j = 0; j < 2; j++) {
          need(4, start);
          const n = view.getUint32(pos, true);
          need(4 + n, start);
          pair.push(data.subarray(pos + 4, pos + 4 + n));
          pos += 4 + n;
        }
        headers.push(pair);
      }
    }
    if (flags & HAS_PARTITION) {
      need(4, start);
      partition = view.getUint32(pos, true);
      pos += 4;
    }
    if (flags & HAS_OUTPUT) {
      need(4, start);
      output = view.getUint32(pos, true);
      pos += 4;
    }
    need(4, start);
    const n = view.getUint32(pos, true);
    need(4 + n, start);
    const value = data.subarray(pos + 4, pos + 4 + n);
    pos += 4 + n;
    f(new Record(value, key, timestamp, headers, partition, output));
  }
}

/** A growable byte buffer with little-endian writers. */
export class Writer {
  constructor(capacity = 256) {
    this.bytes = new Uint8Array(capacity);
    this.view = new DataView(this.bytes.buffer);
    this.length = 0;
  }

  reserve(n) {
    if (this.length + n <= this.bytes.length) return;
    let size = this.bytes.length * 2;
    while (size < this.length + n) size *= 2;
    const bigger = new Uint8Array(size);
    bigger.set(this.bytes.subarray(0, this.length));
    this.bytes = bigger;
    this.view = new DataView(bigger.buffer);
  }

  u8(x) {
    this.reserve(1);
    this.bytes[this.length++] = x;
  }

  u32(x) {
    this.reserve(4);
    this.view.setUint32(this.length, x, true);
    this.length += 4;
  }

  i64(x) {
    this.reserve(8);
    this.view.setBigInt64(this.length, x, true);
    this.length += 8;
  }

  u64(x) {
    this.reserve(8);
    this.view.setBigUint64(this.length, x, true);
    this.length += 8;
  }

  raw(b) {
    if (typeof b === 'string') b = TEXT_ENCODER.encode(b);
    else if (b === null || typeof b !== 'object' || typeof b.length !== 'number') {
      throw new TypeError(`expected bytes (a Uint8Array or a string), not ${b === null ? 'null' : typeof b}`);
    }
    this.reserve(b.length);
    this.bytes.set(b, this.length);
    this.length += b.length;
  }

  /** A u32 length, then the bytes. */
  blob(b) {
    this.u32(b.length);
    this.raw(b);
  }

  finish() {
    return this.bytes.slice(0, this.length);
  }
}

/** Appends a record to a batch being written. */
export function writeRecord(w, value, key, timestamp, headers = null, partition = null, output = 0) {
  let flags = 0;
  if (timestamp !== null && timestamp !== undefined) flags |= HAS_TIMESTAMP;
  if (key !== null && key !== undefined) flags |= HAS_KEY;
  if (headers && headers.length) flags |= HAS_HEADERS;
  if (partition !== null && partition !== undefined) flags |= HAS_PARTITION;
  if (output) flags |= HAS_OUTPUT;
  w.u8(flags);
  if (flags & HAS_TIMESTAMP) w.i64(timeToI64(timestamp));
  if (flags & HAS_KEY) w.blob(key);
  if (flags & HAS_HEADERS) {
    w.u32(headers.length);
    for (const [n, v] of headers) {
      w.blob(n);
      w.blob(v);
    }
  }
  if (flags & HAS_PARTITION) w.u32(partition);
  if (flags & HAS_OUTPUT) w.u32(output);
  w.blob(value);
}

/** `[domain, time, key]` of each timer. */
export function decodeTimers(data) {
  const view = new DataView(data.buffer, data.byteOffset, data.byteLength);
  const out = [];
  let pos = 0;
  while (pos < data.byteLength) {
    if (pos + 13 > data.byteLength) throw new CodecError('timers: truncated');
    const domain = data[pos];
    const time = timeFromI64(view.getBigInt64(pos + 1, true));
    const n = view.getUint32(pos + 9, true);
    if (pos + 13 + n > data.byteLength) throw new CodecError('timers: truncated');
    out.push([domain, time, data.subarray(pos + 13, pos + 13 + n)]);
    pos += 13 + n;
  }
  return out;
}

export function encodeTimers(timers) {
  const w = new Writer();
  for (const [domain, time, key] of timers) {
    w.u8(domain);
    w.i64(timeToI64(time));
    w.blob(key);
  }
  return w.finish();
}

/** `[userKey, value]` of each entry. */
export function decodeEntries(data) {
  const view = new DataView(data.buffer, data.byteOffset, data.byteLength);
  const out = [];
  let pos = 0;
  while (pos < data.byteLength) {
    const a = view.getUint32(pos, true);
    const userKey = data.subarray(pos + 4, pos + 4 + a);
    pos += 4 + a;
    const b = view.getUint32(pos, true);
    out.push([userKey, data.subarray(pos + 4, pos + 4 + b)]);
    pos += 4 + b;
  }
  if (pos !== data.byteLength) throw new CodecError('entries: truncated');
  return out;
}

export function encodeEntries(entries) {
  const w = new Writer();
  for (const [k, v] of entries) {
    w.blob(k);
    w.blob(v);
  }
  return w.finish();
}

export const PUT = 1, DELETE = 2, CLEAR = 3, APPEND = 4, REGISTER_TIMER = 5, DELETE_TIMER = 6, COUNTER = 7, PUT_MANY = 8;

const EMPTY_BYTES = new Uint8Array(0);

/** Byte strings (null: absent) as wit/operator.wit's `packed` holds them: `{data, ends,
 * absent}` — the strings one after another, a little-endian u32 end each, and a byte
 * per string (1: absent) or nothing when all are there. */
export function pack(strings) {
  const n = strings.length;
  const ends = new Uint32Array(n);
  let total = 0;
  let absent = EMPTY_BYTES;
  for (let i = 0; i < n; i++) {
    const s = strings[i];
    if (s === null || s === undefined) {
      if (absent === EMPTY_BYTES) absent = new Uint8Array(n);
      absent[i] = 1;
    } else total += s.length;
    ends[i] = total;
  }
  const data = new Uint8Array(total);
  let at = 0;
  for (let i = 0; i < n; i++) {
    const s = strings[i];
    if (s !== null && s !== undefined) {
      data.set(s, at);
      at += s.length;
    }
  }
  return { data, ends: new Uint8Array(ends.buffer), absent };
}

/** The strings of a `packed` (views into `data`), null where absent. */
export function unpack(data, ends, absent) {
  if (ends.length % 4 || (absent.length && absent.length * 4 !== ends.length)) {
    throw new CodecError(`packed: ${ends.length} bytes of ends and ${absent.length} of absent`);
  }
  const view = new DataView(ends.buffer, ends.byteOffset, ends.byteLength);
  const n = ends.length / 4;
  const out = new Array(n);
  let start = 0;
  for (let i = 0; i < n; i++) {
    const end = view.getUint32(4 * i, true);
    if (end < start || end > data.length) throw new CodecError(`packed: string ${i} ends at byte ${end}, out of order or beyond the data`);
    out[i] = absent.length && absent[i] ? null : data.subarray(start, end);
    start = end;
  }
  return out;
}

/** Decodes effects into arrays `[kind, ...fields]` (for harnesses and tests). */
export function decodeEffects(data) {
  const view = new DataView(data.buffer, data.byteOffset, data.byteLength);
  const out = [];
  let pos = 0;
  const blob = () => {
    const n = view.getUint32(pos, true);
    const b = data.subarray(pos + 4, pos + 4 + n);
    pos += 4 + n;
    return b;
  };
  const u32 = () => {
    const x = view.getUint32(pos, true);
    pos += 4;
    return x;
  };
  while (pos < data.byteLength) {
    const kind = data[pos++];
    if (kind === PUT) out.push([kind, u32(), blob(), blob(), blob()]);
    else if (kind === DELETE) out.push([kind, u32(), blob(), blob()]);
    else if (kind === CLEAR) out.push([kind, u32(), blob()]);
    else if (kind === APPEND) out.push([kind, u32(), blob(), blob()]);
    else if (kind === REGISTER_TIMER || kind === DELETE_TIMER) {
      const domain = data[pos++];
      const time = timeFromI64(view.getBigInt64(pos, true));
      pos += 8;
      out.push([kind, domain, time, blob()]);
    } else if (kind === COUNTER) {
      const name = TEXT_DECODER.decode(blob());
      const delta = view.getBigUint64(pos, true);
      pos += 8;
      out.push([kind, name, delta]);
    } else if (kind === PUT_MANY) {
      // As the host reads it: one put per key, in order.
      const state = u32();
      const userKey = blob();
      const count = u32();
      const keyEnds = data.subarray(pos, pos + 4 * count);
      pos += 4 * count;
      const keys = unpack(blob(), keyEnds, EMPTY_BYTES);
      const valueEnds = data.subarray(pos, pos + 4 * count);
      pos += 4 * count;
      const values = unpack(blob(), valueEnds, EMPTY_BYTES);
      for (let i = 0; i < count; i++) out.push([PUT, state, keys[i], userKey, values[i]]);
    } else throw new CodecError(`effects: unknown effect ${kind}`);
  }
  return out;
}

/** A byte string as a JavaScript string key (one char per byte), for Maps. */
export function bytesId(b) {
  if (b.length <= 4096) return String.fromCharCode.apply(null, b);
  let s = '';
  for (let i = 0; i < b.length; i += 4096) s += String.fromCharCode.apply(null, b.subarray(i, i + 4096));
  return s;
}

/** The bytes of a `bytesId`. */
export function idBytes(s) {
  const b = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) b[i] = s.charCodeAt(i);
  return b;
}
