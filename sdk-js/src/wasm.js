// The glue between the component's exports and the operator `exportOperator`
// registered; bundled into a component by scripts/build-js-plugin.sh. The instance lives
// in this module for the whole subtask.

import * as runtime from 'sluice:operator/runtime@0.3.0';
import { EXPORTED } from './index.js';
import { Batch, CallError, Instance } from './core.js';
import { forEachRecord, pack, timeFromI64, timeToI64, unpack } from './codec.js';

const payload = (e) => e?.payload ?? e?.message ?? String(e);
// An s64 of the bindings as a time: componentize-js gives some s64s as their unsigned
// bit pattern (i64::MIN as 2^63), so the bits are read as signed first.
const time = (x) => timeFromI64(BigInt.asIntN(64, BigInt(x)));

const host = {
  processingTime: () => time(runtime.processingTime()),
  currentWatermark: () => time(runtime.currentWatermark()),
  declareState(name, kind, ttlMs) {
    try {
      return runtime.declareState(name, kind, ttlMs === null ? undefined : BigInt(ttlMs));
    } catch (e) {
      throw new Error(payload(e));
    }
  },
  stateGet: (state, key, userKey) => runtime.stateGet(state, key, userKey) ?? null,
  stateGetMany: (state, keys, userKey) => runtime.stateGetMany(state, pack(keys), userKey),
  stateEntries: (state, key) => runtime.stateEntries(state, key),
  declareOutput(name) {
    try {
      return runtime.declareOutput(name);
    } catch (e) {
      throw new Error(payload(e));
    }
  },
  log: (level, message) => runtime.log(level, message),
};

let instance = null;

function current() {
  if (instance === null) {
    if (EXPORTED === null) throw new CallError(false, 'the component registered no operator (exportOperator)');
    instance = new Instance(EXPORTED);
  }
  return instance;
}

/** A failure as the WIT's `error` variant, thrown for the `result`'s err. */
function guard(f) {
  try {
    return f();
  } catch (e) {
    const error = e instanceof CallError ? e : new CallError(false, `${e?.stack ?? e}`);
    const variant = { tag: error.invalid ? 'invalid-config' : 'failed', val: error.message };
    throw { payload: variant };
  }
}

const NO_PARTITION = 0xffffffff;
const NONE = new Uint8Array(0);
const LITTLE = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

/** `bytes` (8 per number, little-endian) as a typed array of `Kind` (aligned copy). */
function fixed(Kind, bytes, size) {
  const copy = bytes.slice();
  if (!LITTLE) for (let i = 0; i < copy.length; i += size) copy.subarray(i, i + size).reverse();
  return new Kind(copy.buffer, 0, copy.length / size);
}

function littleBytes(array, size) {
  const bytes = new Uint8Array(array.buffer, array.byteOffset, array.byteLength);
  if (!LITTLE) for (let i = 0; i < bytes.length; i += size) bytes.subarray(i, i + size).reverse();
  return bytes;
}

/** The records of a `process` call: in columns, as `open` asked; flat ones decoded. */
function batchOf(records) {
  if (records.tag === 'flat') {
    const decoded = [];
    forEachRecord(records.val, (r) => decoded.push(r));
    return new Batch(
      decoded.map((r) => r.value),
      decoded.map((r) => r.key),
      decoded.map((r) => r.timestamp),
      decoded.some((r) => r.partition !== null) ? decoded.map((r) => r.partition) : [],
      decoded.flatMap((r, i) => (r.headers ? [[i, r.headers]] : [])),
    );
  }
  const c = records.val;
  const n = c.count;
  const values = unpack(c.values.data, c.values.ends, c.values.absent);
  const keys = unpack(c.keys.data, c.keys.ends, c.keys.absent);
  let timestamps = new Array(n).fill(null);
  if (c.timestamps.length) {
    const ts = fixed(BigInt64Array, c.timestamps, 8);
    timestamps = Array.from(ts, (t, i) => (c.untimed.length && c.untimed[i] ? null : timeFromI64(t)));
  }
  let partitions = [];
  if (c.partitions.length) partitions = Array.from(fixed(Uint32Array, c.partitions, 4), (p) => (p === NO_PARTITION ? null : p));
  return new Batch(values, keys, timestamps, partitions, c.headers);
}

/** What a call emitted, in columns. */
function recordsOf(call) {
  const n = call.values.length;
  let times = NONE;
  let untimed = NONE;
  if (call.timestamps.some((t) => t !== null && t !== undefined)) {
    const ts = new BigInt64Array(n);
    for (let i = 0; i < n; i++) {
      const t = call.timestamps[i];
      if (t === null || t === undefined) {
        if (untimed === NONE) untimed = new Uint8Array(n);
        untimed[i] = 1;
      } else ts[i] = timeToI64(t);
    }
    times = littleBytes(ts, 8);
  }
  let partitions = NONE;
  if (call.partitions !== null) partitions = littleBytes(Uint32Array.from(call.partitions, (p) => p ?? NO_PARTITION), 4);
  return {
    tag: 'columns',
    val: {
      count: n,
      values: pack(call.values),
      keys: pack(call.keys),
      timestamps: times,
      untimed,
      partitions,
      headers: call.headers,
      outputs: call.outputs,
    },
  };
}

const output = (call) => ({ records: recordsOf(call), effects: call.effects.w.finish() });

export const streamOperator = {
  open(ctx) {
    return guard(() => ({
      layout: 'columns',
      output: output(
        current().open(host, {
          job: ctx.job,
          operatorName: ctx.operatorName,
          config: ctx.config,
          subtaskIndex: ctx.subtaskIndex,
          parallelism: ctx.parallelism,
          maxParallelism: ctx.maxParallelism,
          keyed: ctx.keyed,
          restoredState: ctx.restoredState ?? null,
          attempt: ctx.attempt,
          inputs: ctx.inputs.map((i) => ({ name: i.name, broadcast: i.broadcast })),
        }),
      ),
    }));
  },
  process(input, records, watermarks) {
    return guard(() => {
      const given = watermarks.map((w) => [w.before, time(w.watermark)]);
      const [call, passed, stopped] = current().process(host, input, batchOf(records), given);
      return {
        records: recordsOf(call),
        effects: call.effects.w.finish(),
        watermarks: passed.map(([before, wm]) => ({ before, watermark: timeToI64(wm) })),
        stoppedAt: stopped ?? undefined,
      };
    });
  },
  processWatermark(watermark) {
    return guard(() => output(current().processWatermark(host, time(watermark))));
  },
  onTimers(timers) {
    return guard(() => output(current().onTimers(host, timers)));
  },
  snapshot(checkpointId) {
    return guard(() => ({ state: current().snapshot(Number(checkpointId)), effects: new Uint8Array(0) }));
  },
  notifyComplete(checkpointId) {
    guard(() => current().notify(true, Number(checkpointId)));
  },
  notifyAborted(checkpointId) {
    guard(() => current().notify(false, Number(checkpointId)));
  },
  finish() {
    return guard(() => output(current().finish(host)));
  },
  close() {
    return guard(() => output(current().close(host)));
  },
  dispose() {
    if (instance !== null) instance.dispose();
  },
};
