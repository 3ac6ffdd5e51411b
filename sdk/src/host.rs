//! The host as the SDK sees it: the `runtime` imports of the WIT world behind a trait, so
//! the same SDK code runs against the real host (in Wasm) and the test harness (natively).

use crate::bindings::sluice::operator::runtime;
use crate::bindings::sluice::operator::types as wit;

/// Severity of a log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Level {
    /// Very detailed tracing.
    Trace,
    /// Debugging detail.
    Debug,
    /// Normal operation worth noting.
    Info,
    /// Something unexpected that the operator handled.
    Warn,
    /// Something failed.
    Error,
}

/// The kind of a keyed state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum StateKind {
    Value,
    List,
    Map,
}

/// What an operator call may ask of the host while it runs. Mutations are not here: they
/// travel as effects in the call's output.
pub(crate) trait Host {
    fn processing_time(&self) -> i64;
    fn current_watermark(&self) -> i64;
    fn declare_state(
        &self,
        name: &str,
        kind: StateKind,
        ttl_ms: Option<u64>,
    ) -> Result<u32, String>;
    /// The entry as of the start of the current call.
    fn state_get(&self, state: u32, key: &[u8], user_key: &[u8]) -> Option<Vec<u8>>;
    /// All entries of `key` in the `entries` encoding, as of the start of the current call.
    fn state_entries(&self, state: u32, key: &[u8]) -> Vec<u8>;
    fn log(&self, level: Level, message: &str);
    /// Declares side output `name` (only during `open`); its number for emitted records.
    fn declare_output(&self, name: &str) -> Result<u32, String> {
        Err(format!("side output '{name}': this host has none"))
    }
}

/// The real host, reached through the component's imports.
pub(crate) struct WasmHost;

impl Host for WasmHost {
    fn processing_time(&self) -> i64 {
        runtime::processing_time()
    }

    fn current_watermark(&self) -> i64 {
        runtime::current_watermark()
    }

    fn declare_state(
        &self,
        name: &str,
        kind: StateKind,
        ttl_ms: Option<u64>,
    ) -> Result<u32, String> {
        let kind = match kind {
            StateKind::Value => wit::StateKind::Value,
            StateKind::List => wit::StateKind::List,
            StateKind::Map => wit::StateKind::Map,
        };
        runtime::declare_state(name, kind, ttl_ms)
    }

    fn state_get(&self, state: u32, key: &[u8], user_key: &[u8]) -> Option<Vec<u8>> {
        runtime::state_get(state, key, user_key)
    }

    fn state_entries(&self, state: u32, key: &[u8]) -> Vec<u8> {
        runtime::state_entries(state, key)
    }

    fn declare_output(&self, name: &str) -> Result<u32, String> {
        runtime::declare_output(name)
    }

    fn log(&self, level: Level, message: &str) {
        let level = match level {
            Level::Trace => wit::Level::Trace,
            Level::Debug => wit::Level::Debug,
            Level::Info => wit::Level::Info,
            Level::Warn => wit::Level::Warn,
            Level::Error => wit::Level::Error,
        };
        runtime::log(level, message);
    }
}
