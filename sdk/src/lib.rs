//! Write Sluice stream operators in Rust.
//!
//! A Sluice operator is a WebAssembly component that the Sluice host runs once per parallel
//! subtask, feeding it batches of records, watermarks and timers and taking checkpoints of
//! it. This crate hides the component interface: implement [`Operator`] for a type, export
//! it with [`export!`], and build the crate as a `cdylib` for `wasm32-wasip2`:
//!
//! ```toml
//! [lib]
//! crate-type = ["cdylib"]
//!
//! [dependencies]
//! sluice-sdk = "0.1"
//! ```
//!
//! ```sh
//! cargo build --release --target wasm32-wasip2   # target/wasm32-wasip2/release/<name>.wasm
//! ```
//!
//! # Example
//!
//! Counts the records of each key and emits the running count, keeping the counts in the
//! host's keyed state so that they survive failures and rescaling:
//!
//! ```
//! use sluice_sdk::{Context, OpenContext, Operator, Record, Result, ValueState};
//!
//! struct CountPerKey {
//!     counts: ValueState<u64>,
//!     /// Only count records whose value is at least this long (config `min-length`).
//!     min_length: usize,
//! }
//!
//! impl Operator for CountPerKey {
//!     fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
//!         ctx.config().check_known(&["min-length"])?;
//!         Ok(CountPerKey {
//!             counts: ctx.value_state("counts")?,
//!             min_length: ctx.config().parse_or("min-length", 0)?,
//!         })
//!     }
//!
//!     fn process(&mut self, record: Record<'_>, ctx: &mut Context<'_>) -> Result<()> {
//!         if record.value.len() < self.min_length {
//!             return Ok(());
//!         }
//!         let key = record.require_key()?;
//!         let count = self.counts.get(ctx, key)?.unwrap_or(0) + 1;
//!         self.counts.put(ctx, key, &count)?;
//!         ctx.emit(Some(key), count.to_string().as_bytes());
//!         Ok(())
//!     }
//! }
//!
//! sluice_sdk::export!(CountPerKey);
//!
//! // The same operator, run natively by the test harness:
//! use sluice_sdk::testing::Harness;
//!
//! let mut harness = Harness::<CountPerKey>::builder()
//!     .keyed(true)
//!     .config("min-length", "2")
//!     .open()?;
//! harness.process(Some("a"), "xx", None)?;
//! harness.process(Some("b"), "x", None)?; // too short
//! harness.process(Some("a"), "yy", None)?;
//! assert_eq!(harness.output_values_str(), ["1", "2"]);
//!
//! // Keyed state survives a checkpoint and restore.
//! let snapshot = harness.snapshot(1)?;
//! let mut restored = Harness::<CountPerKey>::builder()
//!     .keyed(true)
//!     .restore_from(&snapshot)
//!     .open()?;
//! restored.process(Some("a"), "zz", None)?;
//! assert_eq!(restored.output_values_str(), ["3"]);
//! # Ok::<(), sluice_sdk::Error>(())
//! ```
//!
//! # What the SDK does for you
//!
//! - **Records** arrive and leave in flat batches; [`Operator::process`] sees one
//!   [`Record`] at a time and [`Context::emit`] appends to the call's output batch.
//! - **Keyed state** ([`ValueState`], [`ListState`], [`MapState`]) is the host's, so the
//!   host snapshots it asynchronously. Writes leave the operator as effects applied when
//!   the call succeeds; a cache in guest memory makes reads see earlier writes (see
//!   [`state`] for exactly what a read sees).
//! - **Timers** are registered through the [`Context`] and come back through
//!   [`Operator::on_timer`].
//! - **Errors**: return [`Error::InvalidConfig`] for a configuration that cannot work (the
//!   job fails without restarts) and [`Error::Failed`] for anything else (the job restarts
//!   from its last checkpoint). A panic traps the instance.
//! - **Tests** run natively with [`testing::Harness`], which goes through the same
//!   encodings and applies state, timer and counter effects as the host does.

#![warn(missing_docs)]

#[doc(hidden)]
#[path = "rt.rs"]
pub mod __rt;
#[doc(hidden)]
pub mod bindings;
mod config;
mod context;
mod error;
mod export;
mod host;
mod operator;
pub mod plain;
mod record;
pub mod state;
pub mod testing;

pub use config::Config;
pub use context::{Context, Input, OpenContext, SideOutput, Timer};
pub use error::{Error, Result};
pub use host::Level;
pub use operator::Operator;
pub use record::{OwnedRecord, Record, from_bytes, to_bytes};
/// The flat encodings of the boundary (records, timers, effects), for tests that look at
/// what a call produced byte for byte.
pub use sluice_codec as codec;
pub use sluice_codec::TimeDomain;
pub use state::{ListState, MapState, ValueState};
