//! The operator's imports (`runtime`), for both WIT versions: 0.2.0's implementation is
//! the host's; 0.1.0's calls it.

use super::bindings::v2::sluice::operator::runtime::Host;
use super::bindings::v2::sluice::operator::types::{Level, StateKind};
use super::bindings::{v1, v2};
use super::store::StoreState;
use crate::state::{StateDescriptor, StateKind as Kind};
use crate::timers::now_millis;

/// Most states one operator instance may declare.
const MAX_STATES: usize = 1024;
/// Longest state or output name.
const MAX_STATE_NAME_BYTES: usize = 1024;
/// Most side outputs one operator may declare.
pub const MAX_OUTPUTS: usize = 64;

impl v2::sluice::operator::types::Host for StoreState {}
impl v1::sluice::operator::types::Host for StoreState {}

impl Host for StoreState {
    fn processing_time(&mut self) -> wasmtime::Result<i64> {
        Ok(now_millis())
    }

    fn current_watermark(&mut self) -> wasmtime::Result<i64> {
        Ok(self.operator.watermark)
    }

    fn declare_state(
        &mut self,
        name: String,
        kind: StateKind,
        ttl_ms: Option<u64>,
    ) -> wasmtime::Result<Result<u32, String>> {
        if !self.operator.opening {
            return Ok(Err(format!(
                "declare-state('{name}') is only allowed during `open`"
            )));
        }
        if name.len() > MAX_STATE_NAME_BYTES {
            return Ok(Err(format!(
                "declare-state: a state name of {} bytes is longer than the limit of \
                 {MAX_STATE_NAME_BYTES}",
                name.len()
            )));
        }
        let Some(backend) = self.operator.keyed.as_mut() else {
            self.operator.unkeyed_state = Some(crate::guest_text::printable(&name).into_owned());
            return Ok(Err(format!(
                "cannot declare keyed state '{name}': the operator's input is not keyed \
                 (set `key_by` for this operator in the job file)"
            )));
        };
        let kind = match kind {
            StateKind::Value => Kind::Value,
            StateKind::List => Kind::List,
            StateKind::Map => Kind::Map,
        };
        if backend.descriptors().len() >= MAX_STATES
            && !backend.descriptors().iter().any(|d| d.name == name)
        {
            return Ok(Err(format!(
                "declare-state('{}'): an operator may declare at most {MAX_STATES} states",
                crate::guest_text::printable(&name)
            )));
        }
        Ok(backend.declare(StateDescriptor { name, kind, ttl_ms }))
    }

    fn state_get(
        &mut self,
        state: u32,
        key: Vec<u8>,
        user_key: Vec<u8>,
    ) -> wasmtime::Result<Option<Vec<u8>>> {
        let backend = self.keyed_backend("state-get")?;
        let value = backend
            .get(state, &key, &user_key, now_millis())
            .map_err(|e| wasmtime::format_err!("state-get: {e}"))?;
        Ok(value)
    }

    fn state_entries(&mut self, state: u32, key: Vec<u8>) -> wasmtime::Result<Vec<u8>> {
        let backend = self.keyed_backend_mut("state-entries")?;
        backend
            .entries(state, &key, now_millis())
            .map_err(|e| wasmtime::format_err!("state-entries: {e}"))
    }

    fn declare_output(&mut self, name: String) -> wasmtime::Result<Result<u32, String>> {
        let shown = crate::guest_text::printable(&name).into_owned();
        if !self.operator.opening {
            return Ok(Err(format!(
                "declare-output('{shown}') is only allowed during `open`"
            )));
        }
        if name.is_empty() || name.len() > MAX_STATE_NAME_BYTES {
            return Ok(Err(format!(
                "declare-output: an output name must have 1 to {MAX_STATE_NAME_BYTES} bytes, \
                 not {}",
                name.len()
            )));
        }
        let outputs = &mut self.operator.outputs;
        if let Some(i) = outputs.iter().position(|o| *o == name) {
            return Ok(Ok(i as u32 + 1));
        }
        if outputs.len() >= MAX_OUTPUTS {
            return Ok(Err(format!(
                "declare-output('{shown}'): an operator may declare at most {MAX_OUTPUTS} \
                 side outputs"
            )));
        }
        outputs.push(name);
        Ok(Ok(outputs.len() as u32))
    }

    fn log(&mut self, level: Level, message: String) -> wasmtime::Result<()> {
        let mut output = self.output.lock();
        let id = output.identity().clone();
        if !output.rate().admit(&id, message.len()) {
            return Ok(());
        }
        let message = crate::guest_text::guest_text(&message, self.limits.max_guest_string_bytes);
        macro_rules! event {
            ($lvl:expr) => {
                tracing::event!(
                    target: "sluice::guest", $lvl,
                    tenant = %id.tenant, job = %id.job, operator = %id.operator,
                    subtask = id.subtask, "{message}"
                )
            };
        }
        match level {
            Level::Trace => event!(tracing::Level::TRACE),
            Level::Debug => event!(tracing::Level::DEBUG),
            Level::Info => event!(tracing::Level::INFO),
            Level::Warn => event!(tracing::Level::WARN),
            Level::Error => event!(tracing::Level::ERROR),
        }
        Ok(())
    }
}

impl StoreState {
    fn keyed_backend(&self, call: &str) -> wasmtime::Result<&crate::state::KeyedState> {
        self.operator.keyed.as_ref().ok_or_else(|| {
            wasmtime::format_err!(
                "{call}: the operator's input is not keyed, so it has no keyed state"
            )
        })
    }

    fn keyed_backend_mut(&mut self, call: &str) -> wasmtime::Result<&mut crate::state::KeyedState> {
        self.operator.keyed.as_mut().ok_or_else(|| {
            wasmtime::format_err!(
                "{call}: the operator's input is not keyed, so it has no keyed state"
            )
        })
    }
}

impl v1::sluice::operator::runtime::Host for StoreState {
    fn processing_time(&mut self) -> wasmtime::Result<i64> {
        Host::processing_time(self)
    }

    fn current_watermark(&mut self) -> wasmtime::Result<i64> {
        Host::current_watermark(self)
    }

    fn declare_state(
        &mut self,
        name: String,
        kind: v1::sluice::operator::types::StateKind,
        ttl_ms: Option<u64>,
    ) -> wasmtime::Result<Result<u32, String>> {
        use v1::sluice::operator::types::StateKind as V1;
        let kind = match kind {
            V1::Value => StateKind::Value,
            V1::List => StateKind::List,
            V1::Map => StateKind::Map,
        };
        Host::declare_state(self, name, kind, ttl_ms)
    }

    fn state_get(
        &mut self,
        state: u32,
        key: Vec<u8>,
        user_key: Vec<u8>,
    ) -> wasmtime::Result<Option<Vec<u8>>> {
        Host::state_get(self, state, key, user_key)
    }

    fn state_entries(&mut self, state: u32, key: Vec<u8>) -> wasmtime::Result<Vec<u8>> {
        Host::state_entries(self, state, key)
    }

    fn log(
        &mut self,
        level: v1::sluice::operator::types::Level,
        message: String,
    ) -> wasmtime::Result<()> {
        use v1::sluice::operator::types::Level as V1;
        let level = match level {
            V1::Trace => Level::Trace,
            V1::Debug => Level::Debug,
            V1::Info => Level::Info,
            V1::Warn => Level::Warn,
            V1::Error => Level::Error,
        };
        Host::log(self, level, message)
    }
}
