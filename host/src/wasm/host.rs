use super::bindings::sluice::operator::runtime::Host;
use super::bindings::sluice::operator::types::{Level, StateKind};
use super::store::StoreState;
use crate::state::{StateDescriptor, StateKind as Kind};
use crate::timers::now_millis;

/// Most states one operator instance may declare.
const MAX_STATES: usize = 1024;
/// Longest state name.
const MAX_STATE_NAME_BYTES: usize = 1024;

impl super::bindings::sluice::operator::types::Host for StoreState {}

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
            self.operator.unkeyed_state = Some(crate::wasm::printable(&name).into_owned());
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
                crate::wasm::printable(&name)
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
        let backend = self.keyed_backend("state-entries")?;
        backend
            .entries(state, &key, now_millis())
            .map_err(|e| wasmtime::format_err!("state-entries: {e}"))
    }

    fn log(&mut self, level: Level, message: String) -> wasmtime::Result<()> {
        let mut output = self.output.lock().unwrap_or_else(|e| e.into_inner());
        let id = output.identity().clone();
        if !output.rate().admit(&id, message.len()) {
            return Ok(());
        }
        let message = super::guest_text(&message, self.limits.max_guest_string_bytes);
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
    fn keyed_backend(&self, call: &str) -> wasmtime::Result<&crate::state::KeyedStateBackend> {
        self.operator.keyed.as_ref().ok_or_else(|| {
            wasmtime::format_err!(
                "{call}: the operator's input is not keyed, so it has no keyed state"
            )
        })
    }
}
