//! One operator instance: a component instantiated in its own `Store`.

use wasmtime::Store;

use super::bindings::Operator as Bindings;
use super::bindings::exports::sluice::operator::stream_operator::Guest;
use super::bindings::sluice::operator::types::{Error as GuestError, OpenContext, Output};
use super::limits::MemoryLimitExceeded;
use super::sandbox::{self, Interrupted, guest_text};
use super::stdio::panic_message;
use super::store::StoreState;
use crate::chain::{
    CallError, CallOutput, OpenInfo, Operator, OperatorIdentity, OperatorState, TrapKind,
};

/// An operator component instance. Implements [`Operator`] by calling the component's
/// exports, with the call deadline armed and traps turned into [`CallError::Trap`].
///
/// A trap leaves the `Store` unusable (every later call would fail), so after one the
/// instance refuses further calls and is not disposed; the task fails and a restart
/// creates a fresh instance.
pub struct WasmOperator {
    store: Store<StoreState>,
    bindings: Bindings,
    identity: OperatorIdentity,
    poisoned: Option<String>,
}

impl WasmOperator {
    pub(crate) fn new(
        store: Store<StoreState>,
        bindings: Bindings,
        identity: OperatorIdentity,
    ) -> Self {
        WasmOperator {
            store,
            bindings,
            identity,
            poisoned: None,
        }
    }

    fn call<R>(
        &mut self,
        f: impl FnOnce(&Guest, &mut Store<StoreState>) -> wasmtime::Result<Result<R, GuestError>>,
    ) -> Result<R, CallError> {
        if let Some(reason) = &self.poisoned {
            return Err(CallError::Trap {
                kind: TrapKind::Other,
                message: format!("instance is unusable after an earlier trap ({reason})"),
            });
        }
        self.store
            .data_mut()
            .output
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear_stderr_tail();
        let (cpu, tenant) = {
            let data = self.store.data();
            (data.cpu.clone(), data.cpu_tenant.clone())
        };
        let (_, started) = cpu.start(&tenant);
        sandbox::arm_at(&mut self.store, started);
        let result = f(
            self.bindings.sluice_operator_stream_operator(),
            &mut self.store,
        );
        cpu.end(&tenant);
        match result {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => {
                // The guest's message is kept (failures, logs) and printed: bounded.
                let max = self.store.data().limits.max_guest_string_bytes;
                Err(match e {
                    GuestError::InvalidConfig(m) => CallError::InvalidConfig(guest_text(&m, max)),
                    GuestError::Failed(m) => CallError::Failed(guest_text(&m, max)),
                })
            }
            Err(trap) => {
                let error = self.classify(&trap);
                tracing::debug!("{}: trap details: {trap:?}", self.identity);
                self.poisoned = Some(error.to_string());
                Err(error)
            }
        }
    }

    fn output(&mut self, result: Result<Output, CallError>) -> Result<CallOutput, CallError> {
        let Output { records, effects } = result?;
        let limit = self.store.data().limits.max_output_bytes;
        let size = records.len() + effects.len();
        if size > limit {
            return Err(CallError::Contract(format!(
                "returned {size} bytes of records and effects from one call; the limit is {limit}"
            )));
        }
        Ok(CallOutput { records, effects })
    }

    fn classify(&self, trap: &wasmtime::Error) -> CallError {
        let (kind, message) = if let Some(i) = trap.downcast_ref::<Interrupted>() {
            let kind = match i {
                Interrupted::Cancelled => TrapKind::Cancelled,
                Interrupted::DeadlineExceeded(_) => TrapKind::Deadline,
            };
            (kind, i.to_string())
        } else if let Some(m) = trap.downcast_ref::<MemoryLimitExceeded>() {
            (TrapKind::Memory, m.to_string())
        } else if let Some(t) = trap.downcast_ref::<wasmtime::Trap>() {
            match t {
                wasmtime::Trap::StackOverflow => {
                    (TrapKind::StackOverflow, "call stack exhausted".into())
                }
                wasmtime::Trap::MemoryOutOfBounds => (
                    TrapKind::MemoryAccess,
                    "out of bounds memory access (languages that keep their stack in linear \
                     memory, like Rust, end this way when the stack overflows, e.g. on runaway \
                     recursion)"
                        .into(),
                ),
                wasmtime::Trap::OutOfFuel => {
                    (TrapKind::Fuel, "ran out of fuel for this call".into())
                }
                wasmtime::Trap::UnreachableCodeReached => {
                    let stderr = self
                        .store
                        .data()
                        .output
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .stderr_tail();
                    match panic_message(&stderr) {
                        Some(m) => (TrapKind::Panic, sandbox::printable(&m).into_owned()),
                        None if stderr.trim().is_empty() => (
                            TrapKind::Panic,
                            "the operator aborted (wasm `unreachable` executed) without a message"
                                .into(),
                        ),
                        None => (
                            TrapKind::Panic,
                            format!(
                                "the operator aborted; its stderr: {}",
                                sandbox::printable(stderr.trim())
                            ),
                        ),
                    }
                }
                other => (TrapKind::Other, other.to_string()),
            }
        } else {
            (TrapKind::Host, format!("{trap:#}"))
        };
        CallError::Trap { kind, message }
    }
}

impl Operator for WasmOperator {
    fn identity(&self) -> &OperatorIdentity {
        &self.identity
    }

    fn state(&mut self) -> &mut OperatorState {
        &mut self.store.data_mut().operator
    }

    fn memory_bytes(&self) -> u64 {
        self.store
            .data()
            .limiter
            .peak
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    fn log_lines_dropped(&self) -> u64 {
        self.store
            .data()
            .output
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .rate()
            .dropped
    }

    fn open(&mut self, info: &OpenInfo) -> Result<CallOutput, CallError> {
        let ctx = OpenContext {
            job: info.job.clone(),
            operator_name: info.operator.clone(),
            config: info.config.clone(),
            subtask_index: info.subtask,
            parallelism: info.parallelism,
            max_parallelism: info.max_parallelism,
            keyed: info.keyed,
            restored_state: info.restored_state.clone(),
            attempt: info.attempt,
        };
        self.store.data_mut().operator.opening = true;
        let result = self.call(|g, s| g.call_open(s, &ctx));
        let operator = &mut self.store.data_mut().operator;
        operator.opening = false;
        // Keyed state on unkeyed input fails every attempt alike: not worth a restart.
        let result = match (result, operator.unkeyed_state.take()) {
            (Err(CallError::Failed(m)), Some(name)) => Err(CallError::InvalidConfig(format!(
                "{m} (it declared keyed state '{name}', but its input is not keyed: set \
                 `key_by` for this operator in the job file)"
            ))),
            (result, _) => result,
        };
        self.output(result)
    }

    fn process(&mut self, records: &[u8]) -> Result<CallOutput, CallError> {
        let result = self.call(|g, s| g.call_process(s, records));
        self.output(result)
    }

    fn process_watermark(&mut self, watermark: i64) -> Result<CallOutput, CallError> {
        let result = self.call(|g, s| g.call_process_watermark(s, watermark));
        self.output(result)
    }

    fn on_timers(&mut self, timers: &[u8]) -> Result<CallOutput, CallError> {
        let result = self.call(|g, s| g.call_on_timers(s, timers));
        self.output(result)
    }

    fn snapshot(&mut self, checkpoint_id: u64) -> Result<Vec<u8>, CallError> {
        let state = self.call(|g, s| g.call_snapshot(s, checkpoint_id))?;
        let limit = self.store.data().limits.max_output_bytes;
        if state.len() > limit {
            return Err(CallError::Contract(format!(
                "returned {} bytes of operator state from `snapshot`; the limit is {limit} \
                 (keep large state in keyed state)",
                state.len()
            )));
        }
        Ok(state)
    }

    fn notify_complete(&mut self, checkpoint_id: u64) -> Result<(), CallError> {
        self.call(|g, s| g.call_notify_complete(s, checkpoint_id))
    }

    fn notify_aborted(&mut self, checkpoint_id: u64) -> Result<(), CallError> {
        self.call(|g, s| g.call_notify_aborted(s, checkpoint_id))
    }

    fn finish(&mut self) -> Result<CallOutput, CallError> {
        let result = self.call(|g, s| g.call_finish(s));
        self.output(result)
    }

    fn close(&mut self) -> Result<CallOutput, CallError> {
        let result = self.call(|g, s| g.call_close(s));
        self.output(result)
    }

    fn dispose(&mut self) -> Result<(), CallError> {
        if self.poisoned.is_some() {
            // A trapped store cannot run code any more; dropping it releases everything.
            return Ok(());
        }
        self.call(|g, s| g.call_dispose(s).map(Ok))
    }
}
