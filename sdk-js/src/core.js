// What an operator sees — records, contexts, keyed state, timers — and the rules of each
// call, independent of where it runs (inside a component, or the native harness). A
// call's host has the runtime's functions; everything an operator writes leaves the
// call as effects. Within a call, reads see the call's own writes.

import {
  EVENT_TIME,
  PROCESSING_TIME,
  TEXT_ENCODER,
  Writer,
  bytesId,
  decodeEntries,
  decodeTimers,
  idBytes,
  pack,
  timeToI64,
  unpack,
  Record,
  PUT,
  PUT_MANY,
  DELETE,
  CLEAR,
  APPEND,
  REGISTER_TIMER,
  DELETE_TIMER,
  COUNTER,
} from './codec.js';

const ABSENT = Symbol('absent');
// Why `close` may not emit (the host refuses it too).
const CLOSE_EMITTED =
  "emitted records from `close`, which may not emit: the job's output was committed before it; emit buffered records in `finish`";

/** An error the operator reports on purpose. */
export class SluiceError extends Error {}
/** The configuration cannot be used: the job fails without restarts. */
export class InvalidConfig extends SluiceError {}
/** Anything else: the job restarts from its last checkpoint. */
export class Failed extends SluiceError {}

/** A call failed: `invalid` tells whether it was the configuration. */
export class CallError extends Error {
  constructor(invalid, message) {
    super(message);
    this.invalid = invalid;
  }
}

const asBytes = (b) => (typeof b === 'string' ? TEXT_ENCODER.encode(b) : b);
const wkey = (state, key, userKey) => `${state}|${key.length}|${bytesId(key)}${bytesId(userKey)}`;
const skey = (state, key) => `${state}|${bytesId(key)}`;

class Effects {
  constructor() {
    this.w = new Writer();
  }
  put(state, key, userKey, value) {
    this.w.u8(PUT);
    this.w.u32(state);
    this.w.blob(key);
    this.w.blob(userKey);
    this.w.blob(value);
  }
  delete(state, key, userKey) {
    this.w.u8(DELETE);
    this.w.u32(state);
    this.w.blob(key);
    this.w.blob(userKey);
  }
  clear(state, key) {
    this.w.u8(CLEAR);
    this.w.u32(state);
    this.w.blob(key);
  }
  append(state, key, value) {
    this.w.u8(APPEND);
    this.w.u32(state);
    this.w.blob(key);
    this.w.blob(value);
  }
  timer(register, domain, time, key) {
    this.w.u8(register ? REGISTER_TIMER : DELETE_TIMER);
    this.w.u8(domain);
    this.w.i64(timeToI64(time));
    this.w.blob(key);
  }
  /** Effect 8: a value-state put of each key (empty user key), the values packed. */
  putMany(state, keys, data, ends) {
    const k = pack(keys);
    this.w.u8(PUT_MANY);
    this.w.u32(state);
    this.w.u32(0);
    this.w.u32(keys.length);
    this.w.raw(k.ends);
    this.w.blob(k.data);
    this.w.raw(ends);
    this.w.blob(data);
  }
  counter(name, delta) {
    const d = BigInt(delta);
    if (d < 0n || d >= 2n ** 64n) throw new Failed(`counter \`${name}\`: a delta of ${delta} (counters only grow, by less than 2^64)`);
    this.w.u8(COUNTER);
    this.w.blob(TEXT_ENCODER.encode(name));
    this.w.u64(d);
  }
}

/** What one call builds up. */
class Call {
  constructor(host, watermark) {
    this.host = host;
    // What the call emitted, in columns (wit/operator.wit's `columns`): a value, key and
    // timestamp per record; partitions once a record has one; [record number, headers]
    // and [record number, side output] where set.
    this.values = [];
    this.keys = [];
    this.timestamps = [];
    this.partitions = null;
    this.headers = [];
    this.outputs = [];
    this.effects = new Effects();
    this.watermark = watermark;
    this.writes = new Map(); // wkey -> [state, key, userKey, value | ABSENT]
    // `putMany`s not in `writes` yet (newer than all of it): [state, keys, data, ends].
    this.pending = [];
    this.cleared = new Set(); // skey
    this.appended = new Map(); // skey -> [values]
    this.newEventTimer = null;
    this.ahead = new Set();
    this.deleted = new Set();
    this.reregistered = new Set();
  }
  get count() {
    return this.values.length;
  }
  /** `writes`, with the `putMany`s of the call in it: a batch's puts cost no string key
   * each unless the call reads or writes state after them. */
  settled() {
    for (const [state, keys, data, ends] of this.pending) {
      const raws = unpack(data, ends, EMPTY);
      for (let i = 0; i < keys.length; i++) this.writes.set(wkey(state, keys[i], EMPTY), [state, keys[i], EMPTY, raws[i]]);
    }
    this.pending = [];
    return this.writes;
  }
  emit(value, key, timestamp, headers = null, partition = null, output = 0) {
    const n = this.values.length;
    this.values.push(value);
    this.keys.push(key);
    this.timestamps.push(timestamp);
    if (this.partitions !== null) this.partitions.push(partition);
    else if (partition !== null && partition !== undefined) {
      this.partitions = new Array(n).fill(null);
      this.partitions.push(partition);
    }
    if (headers && headers.length) this.headers.push([n, headers]);
    if (output) this.outputs.push([n, output]);
  }
  emitBatch(batch) {
    const n = this.values.length;
    for (let i = 0; i < batch.values.length; i++) {
      this.values.push(batch.values[i]);
      this.keys.push(batch.keys[i]);
      this.timestamps.push(batch.timestamps[i]);
    }
    if (batch.partitions.length) {
      if (this.partitions === null) this.partitions = new Array(n).fill(null);
      for (const p of batch.partitions) this.partitions.push(p);
    } else if (this.partitions !== null) {
      for (let i = 0; i < batch.values.length; i++) this.partitions.push(null);
    }
    for (const [i, h] of batch.headers) this.headers.push([n + i, h]);
  }
  /** What the call emitted, as records (for harnesses). */
  records() {
    const headers = new Map(this.headers);
    const outputs = new Map(this.outputs);
    return this.values.map(
      (v, i) => new Record(v, this.keys[i], this.timestamps[i], headers.get(i) ?? null, this.partitions?.[i] ?? null, outputs.get(i) ?? 0),
    );
  }
}

/** Records in columns, as `Operator.processBatch` gets them: `values`, `keys` and
 * `timestamps` are arrays as long as the batch (keys and timestamps may be null);
 * `partitions` is as long too, or empty when no record came from a partitioned source;
 * `headers` lists `[record number, headers]` of the records that have any. */
export class Batch {
  constructor(values, keys = null, timestamps = null, partitions = null, headers = null) {
    const n = values.length;
    this.values = values;
    this.keys = keys ?? new Array(n).fill(null);
    this.timestamps = timestamps ?? new Array(n).fill(null);
    this.partitions = partitions ?? [];
    this.headers = headers ?? [];
    if (this.keys.length !== n || this.timestamps.length !== n || (this.partitions.length !== 0 && this.partitions.length !== n)) {
      throw new Failed(`a batch of ${n} values with ${this.keys.length} keys, ${this.timestamps.length} timestamps and ${this.partitions.length} partitions`);
    }
  }
  get length() {
    return this.values.length;
  }
  /** The batch as `Record`s (with their headers and partitions). */
  records() {
    const headers = new Map(this.headers);
    return this.values.map((v, i) => new Record(v, this.keys[i], this.timestamps[i], headers.get(i) ?? null, this.partitions.length ? this.partitions[i] : null));
  }
  /** The records whose `keep[i]` is true, as they are. */
  filter(keep) {
    if (keep.length !== this.values.length) throw new Failed(`filter: ${keep.length} decisions for a batch of ${this.values.length}`);
    const pick = (xs) => xs.filter((_, i) => keep[i]);
    const renumber = new Map();
    let j = 0;
    for (let i = 0; i < keep.length; i++) if (keep[i]) renumber.set(i, j++);
    return new Batch(
      pick(this.values),
      pick(this.keys),
      pick(this.timestamps),
      this.partitions.length ? pick(this.partitions) : [],
      this.headers.filter(([i]) => renumber.has(i)).map(([i, h]) => [renumber.get(i), h]),
    );
  }
  /** The same records (keys, timestamps, partitions, headers) with new values. */
  withValues(values) {
    if (values.length !== this.values.length) throw new Failed(`withValues: ${values.length} values for a batch of ${this.values.length}`);
    return new Batch(values.map(asBytes), this.keys, this.timestamps, this.partitions, this.headers);
  }
  _slice(start, end) {
    if (start === 0 && end >= this.values.length) return this;
    return new Batch(
      this.values.slice(start, end),
      this.keys.slice(start, end),
      this.timestamps.slice(start, end),
      this.partitions.slice(start, end),
      this.headers.filter(([i]) => i >= start && i < end).map(([i, h]) => [i - start, h]),
    );
  }
}

class State {
  constructor(name, id, codec) {
    this.name = name;
    this.id = id;
    this.codec = codec;
  }
  _decode(raw) {
    try {
      return this.codec.decode(raw);
    } catch (e) {
      throw new Failed(`state \`${this.name}\`: cannot decode a value: ${e.message}`);
    }
  }
}

export class ValueState extends State {
  get(ctx, key) {
    const raw = ctx._get(this.id, asBytes(key), EMPTY);
    return raw === null ? null : this._decode(raw);
  }
  put(ctx, key, value) {
    ctx._put(this.id, asBytes(key), EMPTY, this.codec.encode(value));
  }
  /** The value of each of `keys` (null where there is none), read from the host in one
   * call and decoded at once where the codec can (`plain`). */
  getMany(ctx, keys) {
    keys = keys.map(asBytes);
    const call = ctx._call;
    const { data, ends, absent } = call.host.stateGetMany(this.id, keys, EMPTY);
    let values;
    try {
      values = this.codec.decodePacked ? this.codec.decodePacked(data, ends, absent) : unpack(data, ends, absent).map((raw) => (raw === null ? null : this.codec.decode(raw)));
    } catch (e) {
      throw new Failed(`state \`${this.name}\`: cannot decode a value: ${e.message}`);
    }
    const writes = call.settled();
    if (writes.size) {
      // What this call wrote, over what the host had.
      for (let i = 0; i < keys.length; i++) {
        const written = writes.get(wkey(this.id, keys[i], EMPTY));
        if (written) values[i] = written[3] === ABSENT ? null : this._decode(written[3]);
      }
    }
    return values;
  }
  /** Sets the value of each of `keys` to the value at the same place of `values`,
   * encoded at once where the codec can (`plain`). */
  putMany(ctx, keys, values) {
    keys = [...keys].map(asBytes);
    values = [...values];
    if (keys.length !== values.length) throw new Failed(`putMany: ${keys.length} keys and ${values.length} values`);
    const call = ctx._call;
    const packed = this.codec.encodePacked ? this.codec.encodePacked(values) : pack(values.map((v) => this.codec.encode(v)));
    call.effects.putMany(this.id, keys, packed.data, packed.ends);
    call.pending.push([this.id, keys, packed.data, packed.ends]);
  }
  /** Replaces the value with `f(current)` (null clears it); returns the new value. */
  update(ctx, key, f) {
    const next = f(this.get(ctx, key));
    if (next === null || next === undefined) this.clear(ctx, key);
    else this.put(ctx, key, next);
    return next ?? null;
  }
  clear(ctx, key) {
    ctx._delete(this.id, asBytes(key), EMPTY);
  }
}

export class ListState extends State {
  get(ctx, key) {
    key = asBytes(key);
    const call = ctx._call;
    const s = skey(this.id, key);
    const raw = call.cleared.has(s) ? [] : decodeEntries(call.host.stateEntries(this.id, key)).map(([, v]) => v);
    return raw.concat(call.appended.get(s) ?? []).map((v) => this._decode(v));
  }
  add(ctx, key, value) {
    key = asBytes(key);
    const encoded = this.codec.encode(value);
    const s = skey(this.id, key);
    const call = ctx._call;
    if (!call.appended.has(s)) call.appended.set(s, []);
    call.appended.get(s).push(encoded);
    call.effects.append(this.id, key, encoded);
  }
  clear(ctx, key) {
    key = asBytes(key);
    const call = ctx._call;
    call.cleared.add(skey(this.id, key));
    call.appended.delete(skey(this.id, key));
    call.effects.clear(this.id, key);
  }
}

export class MapState extends State {
  constructor(name, id, keyCodec, codec) {
    super(name, id, codec);
    this.keyCodec = keyCodec;
  }
  get(ctx, key, mapKey) {
    const raw = ctx._get(this.id, asBytes(key), this.keyCodec.encode(mapKey));
    return raw === null ? null : this._decode(raw);
  }
  put(ctx, key, mapKey, value) {
    ctx._put(this.id, asBytes(key), this.keyCodec.encode(mapKey), this.codec.encode(value));
  }
  remove(ctx, key, mapKey) {
    ctx._delete(this.id, asBytes(key), this.keyCodec.encode(mapKey));
  }
  /** Every `[mapKey, value]` of the map of `key`, in the order of the encoded map keys. */
  entries(ctx, key) {
    key = asBytes(key);
    const call = ctx._call;
    const merged = new Map();
    if (!call.cleared.has(skey(this.id, key))) {
      for (const [uk, v] of decodeEntries(call.host.stateEntries(this.id, key))) merged.set(bytesId(uk), v);
    }
    const kid = bytesId(key);
    for (const [state, k, uk, v] of call.settled().values()) {
      if (state !== this.id || bytesId(k) !== kid) continue;
      if (v === ABSENT) merged.delete(bytesId(uk));
      else merged.set(bytesId(uk), v);
    }
    return [...merged.keys()].sort().map((uk) => [this.keyCodec.decode(idBytes(uk)), this._decode(merged.get(uk))]);
  }
  clear(ctx, key) {
    key = asBytes(key);
    const call = ctx._call;
    call.cleared.add(skey(this.id, key));
    const kid = bytesId(key);
    for (const [w, [state, k]] of [...call.settled().entries()]) {
      if (state === this.id && bytesId(k) === kid) call.writes.delete(w);
    }
    call.effects.clear(this.id, key);
  }
}

const EMPTY = new Uint8Array(0);

class Shared {
  /** The host's wall clock, in milliseconds since the Unix epoch. */
  processingTime() {
    return this._call.host.processingTime();
  }
  /** No record with an event time at or below it is expected (-Infinity: none yet). */
  currentWatermark() {
    return this._call.watermark;
  }
  registerEventTimer(key, time) {
    this._timer(true, EVENT_TIME, time, asBytes(key));
    const call = this._call;
    if (call.newEventTimer === null || time < call.newEventTimer) call.newEventTimer = time;
  }
  registerProcessingTimer(key, time) {
    this._timer(true, PROCESSING_TIME, time, asBytes(key));
  }
  deleteEventTimer(key, time) {
    this._timer(false, EVENT_TIME, time, asBytes(key));
  }
  deleteProcessingTimer(key, time) {
    this._timer(false, PROCESSING_TIME, time, asBytes(key));
  }
  _timer(register, domain, time, key) {
    const call = this._call;
    const id = `${domain}|${time}|${bytesId(key)}`;
    if (call.ahead.has(id)) {
      if (register) {
        call.deleted.delete(id);
        call.reregistered.add(id);
      } else {
        call.reregistered.delete(id);
        call.deleted.add(id);
      }
    }
    call.effects.timer(register, domain, time, key);
  }
  addCounter(name, delta = 1) {
    this._call.effects.counter(name, delta);
  }
  /** `level`: trace, debug, info, warn or error. */
  log(level, message) {
    const known = ['trace', 'debug', 'info', 'warn', 'error'];
    this._call.host.log(known.includes(level) ? level : 'info', String(message));
  }
  _get(state, key, userKey) {
    const call = this._call;
    const written = call.settled().get(wkey(state, key, userKey));
    if (written) return written[3] === ABSENT ? null : written[3];
    if (call.cleared.has(skey(state, key))) return null;
    return call.host.stateGet(state, key, userKey) ?? null;
  }
  _put(state, key, userKey, value) {
    this._call.settled().set(wkey(state, key, userKey), [state, key, userKey, value]);
    this._call.effects.put(state, key, userKey, value);
  }
  _delete(state, key, userKey) {
    this._call.settled().set(wkey(state, key, userKey), [state, key, userKey, ABSENT]);
    this._call.effects.delete(state, key, userKey);
  }
}

/** What an operator may do in every call after `open`. */
export class Context extends Shared {
  constructor(call) {
    super();
    this._call = call;
    this._timestamp = null;
    this._record = null;
    this._input = 0;
  }
  /** Emits a record; its timestamp is, unless given, the record's being processed, an
   * event-time timer's time, or none. Keys and values are Uint8Arrays or strings. */
  emit(key, value, timestamp = undefined) {
    const ts = timestamp === undefined ? this._timestamp : timestamp;
    const r = this._record;
    // Headers and the source partition go on with what a record leads to.
    this._call.emit(asBytes(value), key === null || key === undefined ? null : asBytes(key), ts, r?.headers ?? null, r?.partition ?? null);
  }
  /** Emits `value` written as JSON text (what a sink with `format = "json"` or
   *  `"avro"` takes); the timestamp as for `emit`. */
  emitJson(key, value, timestamp = undefined) {
    this.emit(key, JSON.stringify(value), timestamp);
  }
  /** Emits a `Batch` as it is, or an array of values with, optionally, a key and a
   * timestamp for each (arrays as long; none when not given). */
  emitBatch(batch, keys = null, timestamps = null) {
    if (!(batch instanceof Batch)) batch = new Batch([...batch].map(asBytes), keys?.map((k) => (k === null || k === undefined ? null : asBytes(k))) ?? null, timestamps);
    this._call.emitBatch(batch);
  }
  /** Emits a record to a side output declared in `open`. */
  emitTo(output, key, value) {
    const r = this._record;
    this._call.emit(asBytes(value), key === null || key === undefined ? null : asBytes(key), this._timestamp, r?.headers ?? null, r?.partition ?? null, output.number);
  }
  /** Emits `record` as it is (headers and partition included). */
  emitRecord(r) {
    this._call.emit(r.value, r.key, r.timestamp, r.headers, r.partition, 0);
  }
  /** The input (of `ctx.inputs` in `open`) the record being processed came from. */
  inputIndex() {
    return this._input;
  }
}

/** What an operator learns in `open`, where it declares keyed state and side outputs. */
export class OpenContext extends Shared {
  constructor(call, info) {
    super();
    this._call = call;
    Object.assign(this, info);
    this.config = new Config(info.config);
  }
  _declare(name, kind, ttlMs) {
    try {
      return this._call.host.declareState(name, kind, ttlMs ?? null);
    } catch (e) {
      throw new InvalidConfig(`declaring state \`${name}\`: ${e?.message ?? e}`);
    }
  }
  valueState(name, codec, ttlMs) {
    return new ValueState(name, this._declare(name, 'value', ttlMs), codec);
  }
  listState(name, codec, ttlMs) {
    return new ListState(name, this._declare(name, 'list', ttlMs), codec);
  }
  mapState(name, keyCodec, codec, ttlMs) {
    return new MapState(name, this._declare(name, 'map', ttlMs), keyCodec, codec);
  }
  /** Declares side output `name`: the job file reads it as `OPERATOR.side:NAME`. */
  sideOutput(name) {
    try {
      return { name, number: this._call.host.declareOutput(name) };
    } catch (e) {
      throw new InvalidConfig(`declaring side output \`${name}\`: ${e?.message ?? e}`);
    }
  }
}

/** The operator's `config` table, as strings. */
export class Config {
  constructor(pairs) {
    this.map = new Map(pairs);
  }
  get(key, fallback = null) {
    return this.map.has(key) ? this.map.get(key) : fallback;
  }
  require(key) {
    if (!this.map.has(key)) throw new InvalidConfig(`config \`${key}\` is required`);
    return this.map.get(key);
  }
  /** An integer, or `fallback` when not set. */
  int(key, fallback = null) {
    if (!this.map.has(key)) return fallback;
    const v = this.map.get(key);
    if (!/^-?\d+$/.test(v)) throw new InvalidConfig(`config \`${key}\` = ${JSON.stringify(v)} is not an integer`);
    return Number(v);
  }
  checkKnown(known) {
    const unknown = [...this.map.keys()].filter((k) => !known.includes(k)).sort();
    if (unknown.length) {
      throw new InvalidConfig(`unknown config key${unknown.length > 1 ? 's' : ''} ${unknown.map((k) => `\`${k}\``).join(', ')} (known: ${known.join(', ')})`);
    }
  }
}

/** Base class of an operator; override what it needs (`static open(ctx)` returns the
 * instance). Throw `InvalidConfig` or `Failed`; anything else fails the call with its
 * stack. */
export class Operator {
  static open(_ctx) {
    return new this();
  }
  process(_record, _ctx) {}
  /** The records of a batch that arrived together (between two watermarks): calls
   * `process` for each unless overridden. Override it to work on the whole batch
   * (`batch.values`, `batch.keys`, ...), reading and writing keyed state for all its
   * keys at once (`getMany`, `putMany`) and emitting with `ctx.emitBatch`; `ctx.emit`
   * here gives a record no timestamp unless it is given one. */
  processBatch(batch, ctx) {
    const plain = !batch.headers.length && !batch.partitions.length;
    const records = plain ? null : batch.records();
    for (let i = 0; i < batch.values.length; i++) {
      const record = plain ? new Record(batch.values[i], batch.keys[i], batch.timestamps[i]) : records[i];
      ctx._timestamp = record.timestamp;
      ctx._record = record;
      this.process(record, ctx);
    }
    ctx._timestamp = null;
    ctx._record = null;
  }
  processWatermark(_watermark, _ctx) {}
  onTimer(_timer, _ctx) {}
  snapshot(_checkpointId) {
    return new Uint8Array(0);
  }
  notifyComplete(_checkpointId) {}
  notifyAborted(_checkpointId) {}
  finish(_ctx) {}
  close(_ctx) {}
  dispose() {}
}

function failure(name, e) {
  if (e instanceof InvalidConfig) return new CallError(true, e.message);
  if (e instanceof Failed) return new CallError(false, e.message);
  const what = e instanceof Error ? `${e.name}: ${e.message}` : String(e);
  const stack = e instanceof Error && e.stack ? `\n${e.stack}` : '';
  return new CallError(false, `\`${name}\` threw ${what}${stack}`);
}

/** One operator instance and the rules of every call. */
export class Instance {
  constructor(cls) {
    this.cls = cls;
    this.operator = null;
  }
  _run(name, host, f) {
    const call = new Call(host, host.currentWatermark());
    try {
      f(call);
    } catch (e) {
      throw failure(name, e);
    }
    return call;
  }
  _op(name) {
    if (!this.operator) throw new CallError(false, `\`${name}\` before a successful \`open\``);
    return this.operator;
  }
  open(host, info) {
    return this._run('open', host, (call) => {
      const op = this.cls.open(new OpenContext(call, info));
      if (!(op instanceof Operator)) throw new Failed(`${this.cls.name}.open returned ${op}, not the operator`);
      if (call.count) throw new Failed('`open` emitted records, which it may not');
      this.operator = op;
    });
  }
  /** The records between two watermarks to `processBatch` at a time; returns `[call,
   * passed watermarks, stoppedAt]` (see the WIT's `processed`). */
  process(host, input, batch, watermarks) {
    const op = this._op('process');
    const passed = [];
    let stopped = null;
    const call = this._run('process', host, (call) => {
      const ctx = new Context(call);
      ctx._input = input;
      let handled = 0;
      const before = (n) => {
        while (handled < watermarks.length && watermarks[handled][0] <= n) {
          const wm = watermarks[handled][1];
          if (call.newEventTimer !== null && call.newEventTimer <= wm) {
            stopped = handled;
            return false;
          }
          call.watermark = wm;
          ctx._timestamp = null;
          ctx._record = null;
          op.processWatermark(wm, ctx);
          const at = call.count;
          if (passed.length && passed[passed.length - 1][0] === at) passed[passed.length - 1] = [at, wm];
          else passed.push([at, wm]);
          handled++;
        }
        return true;
      };
      const count = batch.length;
      let start = 0;
      for (;;) {
        if (!before(start) || start >= count) return;
        const end = handled < watermarks.length ? Math.min(watermarks[handled][0], count) : count;
        op.processBatch(batch._slice(start, end), ctx);
        ctx._timestamp = null;
        ctx._record = null;
        start = end;
      }
    });
    return [call, passed, stopped];
  }
  processWatermark(host, wm) {
    const op = this._op('process-watermark');
    return this._run('process-watermark', host, (call) => op.processWatermark(wm, new Context(call)));
  }
  onTimers(host, timers) {
    const op = this._op('on-timers');
    return this._run('on-timers', host, (call) => {
      const due = decodeTimers(timers);
      for (const [d, t, k] of due) call.ahead.add(`${d}|${t}|${bytesId(k)}`);
      const ctx = new Context(call);
      for (const [domain, time, key] of due) {
        const id = `${domain}|${time}|${bytesId(key)}`;
        call.ahead.delete(id);
        if (call.deleted.has(id)) {
          call.deleted.delete(id);
          continue;
        }
        if (call.reregistered.has(id)) {
          // Registered again by an earlier one and firing now: not once more (deleted
          // before it runs, so it may register itself again).
          call.reregistered.delete(id);
          call.effects.timer(false, domain, time, key);
        }
        ctx._timestamp = domain === EVENT_TIME ? time : null;
        op.onTimer({ domain, timestamp: time, key }, ctx);
      }
    });
  }
  snapshot(id) {
    const op = this._op('snapshot');
    let state;
    try {
      state = op.snapshot(id);
    } catch (e) {
      throw failure('snapshot', e);
    }
    if (!(state instanceof Uint8Array)) throw new CallError(false, '`snapshot` returned no Uint8Array');
    return state;
  }
  notify(complete, id) {
    const op = this._op('notify');
    try {
      if (complete) op.notifyComplete(id);
      else op.notifyAborted(id);
    } catch (e) {
      throw failure(complete ? 'notify-complete' : 'notify-aborted', e);
    }
  }
  finish(host) {
    const op = this._op('finish');
    return this._run('finish', host, (call) => op.finish(new Context(call)));
  }
  close(host) {
    const op = this._op('close');
    return this._run('close', host, (call) => {
      op.close(new Context(call));
      if (call.count) throw new Failed(CLOSE_EMITTED);
    });
  }
  dispose() {
    try {
      this.operator?.dispose();
    } catch {
      // dispose cannot fail
    }
    this.operator = null;
  }
}
