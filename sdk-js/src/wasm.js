// The glue between the component's exports and the operator `exportOperator`
// registered; bundled into a component by scripts/build-js-plugin.sh. The instance lives
// in this module for the whole subtask.

import * as runtime from 'sluice:operator/runtime@0.2.0';
import { EXPORTED } from './index.js';
import { CallError, Instance } from './core.js';
import { timeFromI64, timeToI64 } from './codec.js';

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

const output = (call) => ({ records: call.records.finish(), effects: call.effects.w.finish() });

export const streamOperator = {
  open(ctx) {
    return guard(() =>
      output(
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
    );
  },
  process(input, records, watermarks) {
    return guard(() => {
      const given = watermarks.map((w) => [w.before, time(w.watermark)]);
      const [call, passed, stopped] = current().process(host, input, records, given);
      return {
        records: call.records.finish(),
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
