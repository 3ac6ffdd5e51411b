// Sluice operators in JavaScript: extend `Operator`, register it with `exportOperator`,
// build it with scripts/build-js-plugin.sh, test it natively with `Harness` from
// 'sluice-sdk/testing'. Keys and values are Uint8Arrays (strings are accepted where
// bytes go in); times are Numbers of milliseconds (-Infinity / Infinity for the host's
// minimum and maximum); state values use postcard, as the Rust and Python SDKs do.

export * as postcard from './postcard.js';
export * as plain from './plain.js';
export { Record, EVENT_TIME, PROCESSING_TIME } from './codec.js';
export { Operator, Batch, Context, OpenContext, Config, InvalidConfig, Failed, SluiceError, ValueState, ListState, MapState } from './core.js';

/** The operator class `exportOperator` registered. */
export let EXPORTED = null;

import { Operator as Base } from './core.js';

/** Registers `cls` (a subclass of `Operator`) as the operator of this component. */
export function exportOperator(cls) {
  if (!(typeof cls === 'function' && cls.prototype instanceof Base)) {
    throw new TypeError(`exportOperator(${cls}): not a subclass of Operator`);
  }
  EXPORTED = cls;
  return cls;
}
