// Runs an operator in plain Node, as the host would run its component: feed records (of
// any input) and watermarks, fire timers, snapshot and restore, look at what it emitted,
// its keyed state, timers and counters. For `node --test`.

import {
  EVENT_TIME,
  PROCESSING_TIME,
  Record,
  Writer,
  bytesId,
  decodeEffects,
  encodeEntries,
  encodeTimers,
  idBytes,
  pack,
  writeRecord,
  PUT,
  DELETE,
  CLEAR,
  APPEND,
  REGISTER_TIMER,
  DELETE_TIMER,
  COUNTER,
} from './codec.js';
import { Batch, CallError, Instance } from './core.js';

export class HarnessError extends Error {
  constructor(e) {
    super(e.message);
    this.invalidConfig = e.invalid;
  }
}

const enc = (b) => (typeof b === 'string' ? new TextEncoder().encode(b) : b);
const vkey = (s, k, uk) => `${s}|${k.length}|${bytesId(k)}${bytesId(uk)}`;
const timerId = (d, t, k) => `${d}|${t}|${bytesId(k)}`;

class Store {
  constructor(keyed) {
    this.keyed = keyed;
    this.processingTime = 0;
    this.watermark = -Infinity;
    this.states = new Map(); // name -> [id, kind]
    this.values = new Map(); // vkey -> [state, key, userKey, value]
    this.lists = new Map(); // `${state}|${bytesId(key)}` -> [[time appended, value]]
    this.written = new Map(); // vkey -> processing time of the last write
    this.ttls = new Map(); // state id -> time-to-live (ms)
    this.timers = new Map(); // timerId -> [domain, time, key]
    this.counters = new Map();
    this.logs = [];
    this.outputs = [];
    this.opening = true;
  }
}

/** One operator instance, opened at construction (or `HarnessError`). */
export class Harness {
  constructor(cls, { config = {}, keyed = false, inputs = [['input', false]], subtask = 0, parallelism = 1, maxParallelism = 128, attempt = 0, restore = null, processingTime = 0, maxOutputBytes = 64 * 1024 * 1024 } = {}) {
    // What one call may return (the host's `max_output_mb`, 64 MiB by default).
    this.maxOutputBytes = maxOutputBytes;
    const store = new Store(keyed);
    store.processingTime = processingTime;
    if (restore) {
      store.states = new Map(restore.states);
      store.values = new Map(restore.values);
      store.lists = new Map([...restore.lists].map(([k, v]) => [k, [...v]]));
      store.timers = new Map(restore.timers);
      store.written = new Map(restore.written);
      store.ttls = new Map(restore.ttls);
      store.watermark = restore.watermark;
    }
    this.store = store;
    // Whether an entry written at `written` still reads: a state with a time-to-live
    // drops entries not written for that long, as the host does.
    const live = (state, written) => !store.ttls.has(state) || store.processingTime < written + store.ttls.get(state);
    this.host = {
      processingTime: () => store.processingTime,
      currentWatermark: () => store.watermark,
      declareState(name, kind, ttlMs) {
        if (!store.opening) throw new Error('states are declared in `open` only');
        if (!store.keyed) throw new Error('keyed state needs keyed input (`key_by` in the job file)');
        const known = store.states.get(name);
        if (known) {
          if (known[1] !== kind) throw new Error(`state \`${name}\` is a ${known[1]} state, not a ${kind} state`);
          return known[0];
        }
        store.states.set(name, [store.states.size, kind]);
        if (ttlMs !== null && ttlMs !== undefined) store.ttls.set(store.states.size - 1, ttlMs);
        return store.states.size - 1;
      },
      stateGet(s, k, uk) {
        const key = vkey(s, k, uk);
        return live(s, store.written.get(key) ?? 0) ? (store.values.get(key)?.[3] ?? null) : null;
      },
      stateGetMany(s, keys, uk) {
        return pack(keys.map((k) => this.stateGet(s, k, uk)));
      },
      stateEntries(s, k) {
        const list = store.lists.get(`${s}|${bytesId(k)}`);
        if (list) return encodeEntries(list.filter(([t]) => live(s, t)).map(([, v]) => [new Uint8Array(0), v]));
        const kid = bytesId(k);
        const entries = [...store.values.entries()]
          .filter(([w, [st, key]]) => st === s && bytesId(key) === kid && live(s, store.written.get(w) ?? 0))
          .map(([, [, , uk, v]]) => [uk, v]);
        entries.sort((a, b) => (bytesId(a[0]) < bytesId(b[0]) ? -1 : 1));
        return encodeEntries(entries);
      },
      declareOutput(name) {
        if (!store.opening) throw new Error('side outputs are declared in `open` only');
        if (store.outputs.includes(name)) throw new Error(`side output \`${name}\` is declared twice`);
        store.outputs.push(name);
        return store.outputs.length;
      },
      log: (level, message) => store.logs.push([level, message]),
    };
    this.instance = new Instance(cls);
    this.output = [];
    this.side = [];
    this.inputs = inputs.length;
    const info = {
      job: 'test-job',
      operatorName: 'test-operator',
      config: Object.entries(config).map(([k, v]) => [k, String(v)]),
      subtaskIndex: subtask,
      parallelism,
      maxParallelism,
      keyed,
      restoredState: restore ? restore.operatorState : null,
      attempt,
      inputs: inputs.map(([name, broadcast]) => ({ name, broadcast })),
    };
    try {
      this._apply(this.instance.open(this.host, info));
    } catch (e) {
      throw e instanceof CallError ? new HarnessError(e) : e;
    } finally {
      store.opening = false;
    }
  }

  _apply(call) {
    const s = this.store;
    const effects = call.effects.w.finish();
    const records = call.records();
    // As the host: a call that returns more than the limit fails, and nothing of it counts
    // (the host measures records in the flat encoding).
    const flat = new Writer();
    for (const r of records) writeRecord(flat, r.value, r.key, r.timestamp, r.headers, r.partition, r.output);
    const size = effects.length + flat.length;
    if (size > this.maxOutputBytes) {
      throw new HarnessError(new CallError(false, `returned ${size} bytes of records and effects from one call; the limit is ${this.maxOutputBytes}`));
    }
    for (const e of decodeEffects(effects)) {
      const [kind] = e;
      if (kind === PUT) {
        s.values.set(vkey(e[1], e[2], e[3]), [e[1], e[2].slice(), e[3].slice(), e[4].slice()]);
        s.written.set(vkey(e[1], e[2], e[3]), s.processingTime);
      }
      else if (kind === DELETE) s.values.delete(vkey(e[1], e[2], e[3]));
      else if (kind === CLEAR) {
        s.lists.delete(`${e[1]}|${bytesId(e[2])}`);
        const kid = bytesId(e[2]);
        for (const [k, [st, key]] of [...s.values]) if (st === e[1] && bytesId(key) === kid) s.values.delete(k);
      } else if (kind === APPEND) {
        const l = `${e[1]}|${bytesId(e[2])}`;
        if (!s.lists.has(l)) s.lists.set(l, []);
        s.lists.get(l).push([s.processingTime, e[3].slice()]);
      } else if (kind === REGISTER_TIMER) s.timers.set(timerId(e[1], e[2], e[3]), [e[1], e[2], e[3].slice()]);
      else if (kind === DELETE_TIMER) s.timers.delete(timerId(e[1], e[2], e[3]));
      else if (kind === COUNTER) s.counters.set(e[1], (s.counters.get(e[1]) ?? 0n) + e[2]);
    }
    for (const r of records) {
      const copy = new Record(r.value.slice(), r.key?.slice() ?? null, r.timestamp, r.headers, r.partition, r.output);
      if (r.output) this.side.push(copy);
      else this.output.push(copy);
    }
  }

  _call(f) {
    let result;
    try {
      result = f();
    } catch (e) {
      throw e instanceof CallError ? new HarnessError(e) : e;
    }
    this._apply(Array.isArray(result) ? result[0] : result);
    return result;
  }

  /** One record (of input number `input`), as a batch of one. */
  process(key, value, timestamp = null, input = 0) {
    this.processBatch([new Record(enc(value), key === null ? null : enc(key), timestamp)], [], input);
  }

  /** `records` as one batch with `watermarks` (`[before, watermark]`) among them, as the
   * host gives it: event-time timers fire at the watermark that makes them due. */
  processBatch(records, watermarks = [], input = 0) {
    if (!(input >= 0 && input < this.inputs)) throw new RangeError(`the operator has ${this.inputs} inputs; there is no input ${input}`);
    const s = this.store;
    let first = 0;
    let k = 0;
    const due = (start) => {
      let next = null;
      for (const [d, t] of s.timers.values()) if (d === EVENT_TIME && (next === null || t < next)) next = t;
      if (next === null) return null;
      for (let j = start; j < watermarks.length; j++) {
        const w = watermarks[j][1];
        if (w > s.watermark && w >= next) return j;
      }
      return null;
    };
    while (first < records.length || k < watermarks.length) {
      let cut = due(k);
      if (cut !== null && watermarks[cut][0] <= first) {
        s.watermark = watermarks[cut][1];
        this._fire(EVENT_TIME, watermarks[cut][1]);
        cut = due(cut + 1);
      }
      const [end, wmEnd] = cut === null ? [records.length, watermarks.length] : [Math.min(watermarks[cut][0], records.length), cut];
      const part = records.slice(first, end);
      for (const r of part) if (r.output) throw new RangeError('records given to an operator go to no side output');
      const batch = new Batch(
        part.map((r) => enc(r.value)),
        part.map((r) => (r.key === null || r.key === undefined ? null : enc(r.key))),
        part.map((r) => r.timestamp ?? null),
        part.some((r) => r.partition !== null && r.partition !== undefined) ? part.map((r) => r.partition ?? null) : [],
        part.flatMap((r, i) => (r.headers && r.headers.length ? [[i, r.headers]] : [])),
      );
      const given = watermarks.slice(k, wmEnd).map(([before, wm]) => [Math.max(before - first, 0), wm]);
      const [, , stopped] = this._call(() => this.instance.process(this.host, input, batch, given));
      const [handled, handledWms] = stopped === null ? [end - first, given.length] : [given[stopped][0], stopped];
      if (handledWms) s.watermark = Math.max(s.watermark, given[handledWms - 1][1]);
      first += handled;
      k += handledWms;
    }
  }

  /** Advances event time: fires the due event-time timers, then `processWatermark`. */
  processWatermark(watermark) {
    if (watermark <= this.store.watermark) return;
    this.store.watermark = watermark;
    this._fire(EVENT_TIME, watermark);
    this._call(() => this.instance.processWatermark(this.host, watermark));
  }

  /** Moves the clock (never back) and fires the due processing-time timers. */
  setProcessingTime(now) {
    this.store.processingTime = Math.max(this.store.processingTime, now);
    this._fire(PROCESSING_TIME, this.store.processingTime);
  }

  _fire(domain, time) {
    for (let round = 0; round < 1000; round++) {
      const due = [...this.store.timers.entries()].filter(([, [d, t]]) => d === domain && t <= time);
      if (!due.length) return;
      due.sort((a, b) => a[1][1] - b[1][1] || (bytesId(a[1][2]) < bytesId(b[1][2]) ? -1 : 1));
      for (const [id] of due) this.store.timers.delete(id);
      const encoded = encodeTimers(due.map(([, t]) => t));
      this._call(() => this.instance.onTimers(this.host, encoded));
    }
    throw new HarnessError(new CallError(false, 'timers keep registering due timers'));
  }

  snapshot(checkpointId = 1) {
    let state;
    try {
      state = this.instance.snapshot(checkpointId);
    } catch (e) {
      throw e instanceof CallError ? new HarnessError(e) : e;
    }
    if (state.length > this.maxOutputBytes) {
      throw new HarnessError(new CallError(false, `returned ${state.length} bytes of operator state from \`snapshot\`; the limit is ${this.maxOutputBytes} (keep large state in keyed state)`));
    }
    const s = this.store;
    return {
      operatorState: state,
      states: new Map(s.states),
      values: new Map(s.values),
      lists: new Map([...s.lists].map(([k, v]) => [k, [...v]])),
      timers: new Map(s.timers),
      watermark: s.watermark,
      written: new Map(s.written),
      ttls: new Map(s.ttls),
    };
  }

  /** End of input: event time to the end (every timer fires), then `finish`. */
  finish() {
    this.processWatermark(Infinity);
    this._call(() => this.instance.finish(this.host));
  }

  /** Clean shutdown: `close` (which may not emit). */
  close() {
    this._call(() => this.instance.close(this.host));
  }

  takeOutput() {
    const out = this.output;
    this.output = [];
    return out;
  }

  /** The values emitted since the last take, as UTF-8 strings. */
  takeValues() {
    return this.takeOutput().map((r) => new TextDecoder().decode(r.value));
  }

  takeSideOutput(name) {
    const number = this.store.outputs.indexOf(name) + 1;
    const taken = this.side.filter((r) => r.output === number);
    this.side = this.side.filter((r) => r.output !== number);
    return taken;
  }

  counter(name) {
    return Number(this.store.counters.get(name) ?? 0n);
  }

  get watermark() {
    return this.store.watermark;
  }

  timers(domain = EVENT_TIME) {
    return [...this.store.timers.values()].filter(([d]) => d === domain).map(([, t, k]) => [t, new TextDecoder().decode(k)]).sort((a, b) => a[0] - b[0]);
  }

  /** The encoded value of `key` (and map key) in state `name`, as the host holds it. */
  stateValue(name, key, userKey = new Uint8Array(0)) {
    const [id] = this.store.states.get(name);
    return this.store.values.get(vkey(id, enc(key), userKey))?.[3] ?? null;
  }
}
