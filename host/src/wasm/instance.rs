//! One operator instance: a component instantiated in its own `Store`.

use wasmtime::Store;

use super::bindings::process_v3::{self, RecordsRef};
use super::bindings::{v1, v2, v3};
use super::columns;
use super::limits::MemoryLimitExceeded;
use super::sandbox::{self, Interrupted};
use super::stdio::panic_message;
use super::store::StoreState;
use crate::chain::{
    CallError, CallOutput, OpenInfo, Operator, OperatorIdentity, OperatorState, ProcessOutput,
    TrapKind,
};
use crate::guest_text::{guest_text, printable};
use crate::network::BatchWatermark;

/// A component's exports, of the WIT version it was built for.
pub(crate) enum Bindings {
    /// `sluice:operator@0.3.0`, taking records in the layout it chose in `open`.
    V3(
        v3::Operator,
        v3::sluice::operator::types::Layout,
        process_v3::Process,
    ),
    /// `sluice:operator@0.2.0`.
    V2(v2::Operator),
    /// `sluice:operator@0.1.0`: records without the 0.2.0 extensions, watermarks only
    /// between batches.
    V1(v1::Operator),
}

/// An error the operator returned, of any version, or what it returned that breaks the
/// contract.
enum GuestError {
    InvalidConfig(String),
    Failed(String),
    Contract(String),
}

impl From<v3::sluice::operator::types::Error> for GuestError {
    fn from(e: v3::sluice::operator::types::Error) -> Self {
        use v3::sluice::operator::types::Error as E;
        match e {
            E::InvalidConfig(m) => GuestError::InvalidConfig(m),
            E::Failed(m) => GuestError::Failed(m),
        }
    }
}

impl From<v2::sluice::operator::types::Error> for GuestError {
    fn from(e: v2::sluice::operator::types::Error) -> Self {
        use v2::sluice::operator::types::Error as E;
        match e {
            E::InvalidConfig(m) => GuestError::InvalidConfig(m),
            E::Failed(m) => GuestError::Failed(m),
        }
    }
}

impl From<v1::sluice::operator::types::Error> for GuestError {
    fn from(e: v1::sluice::operator::types::Error) -> Self {
        use v1::sluice::operator::types::Error as E;
        match e {
            E::InvalidConfig(m) => GuestError::InvalidConfig(m),
            E::Failed(m) => GuestError::Failed(m),
        }
    }
}

/// An `output` record of any version, as a [`CallOutput`] (records in the flat encoding).
trait IntoCallOutput {
    fn into_call_output(self) -> Result<CallOutput, GuestError>;
}

impl IntoCallOutput for v3::sluice::operator::types::Output {
    fn into_call_output(self) -> Result<CallOutput, GuestError> {
        Ok(CallOutput {
            records: columns::to_flat(self.records).map_err(GuestError::Contract)?,
            effects: self.effects,
        })
    }
}

impl IntoCallOutput for v2::sluice::operator::types::Output {
    fn into_call_output(self) -> Result<CallOutput, GuestError> {
        Ok(CallOutput {
            records: self.records,
            effects: self.effects,
        })
    }
}

impl IntoCallOutput for v1::sluice::operator::types::Output {
    fn into_call_output(self) -> Result<CallOutput, GuestError> {
        Ok(CallOutput {
            records: self.records,
            effects: self.effects,
        })
    }
}

/// Calls export `$call` of whichever version the instance is, with the same arguments;
/// with `output`, the call returns an `output` record, taken as a [`CallOutput`].
macro_rules! either {
    ($self:ident, $call:ident ( $($arg:expr),* )) => {
        either!($self, $call($($arg),*), |o| Ok(o))
    };
    ($self:ident, $call:ident ( $($arg:expr),* ) output) => {
        either!($self, $call($($arg),*), |o| o.into_call_output())
    };
    ($self:ident, $call:ident ( $($arg:expr),* ), |$o:ident| $map:expr) => {
        $self.call(|b, s| match b {
            Bindings::V3(b, ..) => b
                .sluice_operator_stream_operator()
                .$call(s $(, $arg)*)
                .map(|r| r.map_err(GuestError::from).and_then(|$o| $map)),
            Bindings::V2(b) => b
                .sluice_operator_stream_operator()
                .$call(s $(, $arg)*)
                .map(|r| r.map_err(GuestError::from).and_then(|$o| $map)),
            Bindings::V1(b) => b
                .sluice_operator_stream_operator()
                .$call(s $(, $arg)*)
                .map(|r| r.map_err(GuestError::from).and_then(|$o| $map)),
        })
    };
}

/// The `open-context` of WIT version module `$v` (0.2.0 on) for `$info`.
macro_rules! open_context {
    ($v:ident, $info:expr) => {{
        use $v::sluice::operator::types::{InputInfo, OpenContext};
        let info = $info;
        OpenContext {
            job: info.job.clone(),
            operator_name: info.operator.clone(),
            config: info.config.clone(),
            subtask_index: info.subtask,
            parallelism: info.parallelism,
            max_parallelism: info.max_parallelism,
            keyed: info.keyed,
            restored_state: info.restored_state.clone(),
            attempt: info.attempt,
            inputs: info
                .inputs
                .iter()
                .map(|i| InputInfo {
                    name: i.name.clone(),
                    broadcast: i.broadcast,
                })
                .collect(),
        }
    }};
}

/// A batch's watermarks as WIT type `$wit` (`batch-watermark` of 0.2.0 on) has them.
macro_rules! to_wit_watermarks {
    ($wit:ident, $watermarks:expr) => {
        $watermarks
            .iter()
            .map(|w| $wit {
                before: w.before,
                watermark: w.watermark,
            })
            .collect()
    };
}

/// The `batch-watermark`s an operator returned, of any version from 0.2.0 on.
macro_rules! from_wit_watermarks {
    ($watermarks:expr) => {
        $watermarks
            .into_iter()
            .map(|w| BatchWatermark {
                before: w.before,
                watermark: w.watermark,
            })
            .collect()
    };
}

/// What `process` returned, of any version, with its records in the flat encoding.
struct Processed2 {
    records: Vec<u8>,
    effects: Vec<u8>,
    watermarks: Vec<BatchWatermark>,
    stopped_at: Option<u32>,
}

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
        f: impl FnOnce(&Bindings, &mut Store<StoreState>) -> wasmtime::Result<Result<R, GuestError>>,
    ) -> Result<R, CallError> {
        if let Some(reason) = &self.poisoned {
            return Err(CallError::Trap {
                kind: TrapKind::Other,
                message: format!("instance is unusable after an earlier trap ({reason})"),
            });
        }
        self.store.data_mut().output.lock().clear_stderr_tail();
        let (cpu, tenant) = {
            let data = self.store.data();
            (data.cpu.clone(), data.cpu_tenant.clone())
        };
        let (_, started) = cpu.start(&tenant);
        sandbox::arm_at(&mut self.store, started);
        let result = f(&self.bindings, &mut self.store);
        cpu.end(&tenant);
        match result {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => {
                // The guest's message is kept (failures, logs) and printed: bounded.
                let max = self.store.data().limits.max_guest_string_bytes;
                Err(match e {
                    GuestError::InvalidConfig(m) => CallError::InvalidConfig(guest_text(&m, max)),
                    GuestError::Failed(m) => CallError::Failed(guest_text(&m, max)),
                    GuestError::Contract(m) => CallError::Contract(m),
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

    fn output(&mut self, result: Result<CallOutput, CallError>) -> Result<CallOutput, CallError> {
        let CallOutput { records, effects } = result?;
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
                    let stderr = self.store.data().output.lock().stderr_tail();
                    match panic_message(&stderr) {
                        Some(m) => (TrapKind::Panic, printable(&m).into_owned()),
                        None if stderr.trim().is_empty() => (
                            TrapKind::Panic,
                            "the operator aborted (wasm `unreachable` executed) without a message"
                                .into(),
                        ),
                        None => (
                            TrapKind::Panic,
                            format!(
                                "the operator aborted; its stderr: {}",
                                printable(stderr.trim())
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
        self.store.data().output.lock().rate().dropped
    }

    fn open(&mut self, info: &OpenInfo) -> Result<CallOutput, CallError> {
        self.store.data_mut().operator.opening = true;
        let result =
            match &self.bindings {
                Bindings::V3(..) => {
                    let ctx = open_context!(v3, info);
                    let opened = self.call(|b, s| match b {
                        Bindings::V3(b, ..) => b
                            .sluice_operator_stream_operator()
                            .call_open(s, &ctx)
                            .map(|r| {
                                r.map_err(GuestError::from)
                                    .and_then(|o| Ok((o.layout, o.output.into_call_output()?)))
                            }),
                        _ => unreachable!("matched above"),
                    });
                    opened.map(|(layout, output)| {
                        if let Bindings::V3(_, chosen, _) = &mut self.bindings {
                            *chosen = layout;
                        }
                        output
                    })
                }
                Bindings::V2(_) => {
                    let ctx = open_context!(v2, info);
                    self.call(|b, s| match b {
                        Bindings::V2(b) => b
                            .sluice_operator_stream_operator()
                            .call_open(s, &ctx)
                            .map(|r| {
                                r.map_err(GuestError::from)
                                    .and_then(|o| o.into_call_output())
                            }),
                        _ => unreachable!("matched above"),
                    })
                }
                Bindings::V1(_) => {
                    let ctx = v1::sluice::operator::types::OpenContext {
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
                    self.call(|b, s| match b {
                        Bindings::V1(b) => b
                            .sluice_operator_stream_operator()
                            .call_open(s, &ctx)
                            .map(|r| {
                                r.map_err(GuestError::from)
                                    .and_then(|o| o.into_call_output())
                            }),
                        _ => unreachable!("matched above"),
                    })
                }
            };
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
        Ok(self.process_batch(0, records, &[])?.output)
    }

    fn takes_batch_watermarks(&self) -> bool {
        !matches!(self.bindings, Bindings::V1(_))
    }

    fn process_batch(
        &mut self,
        input: u32,
        records: &[u8],
        watermarks: &[BatchWatermark],
    ) -> Result<ProcessOutput, CallError> {
        if let Some(keyed) = self.store.data_mut().operator.keyed.as_mut() {
            keyed
                .prefetch(records)
                .map_err(|e| CallError::Failed(format!("reading keyed state: {e}")))?;
        }
        if let Bindings::V1(_) = self.bindings {
            // A 0.1.0 operator cannot read headers or partitions: it gets the records
            // without them (and the watermarks after the batch, from the chain).
            let stripped = sluice_codec::strip_extensions(records)
                .map_err(|e| CallError::Contract(format!("given {e}")))?;
            let records = stripped.as_deref().unwrap_or(records);
            let output = self.call(|b, s| match b {
                Bindings::V1(b) => b
                    .sluice_operator_stream_operator()
                    .call_process(s, records)
                    .map(|r| {
                        r.map_err(GuestError::from)
                            .and_then(|o| o.into_call_output())
                    }),
                _ => unreachable!("matched above"),
            });
            let output = self.output(output)?;
            // A 0.1.0 operator's records know only the 0.1.0 flags.
            let scan = sluice_codec::BatchReader::scan(&output.records)
                .map_err(|e| CallError::Contract(format!("returned {e}")))?;
            if scan.extended {
                return Err(CallError::Contract(
                    "returned records with flags that sluice:operator@0.1.0 does not have \
                     (headers, partitions or side outputs)"
                        .into(),
                ));
            }
            return Ok(ProcessOutput {
                output,
                ..ProcessOutput::default()
            });
        }
        let processed = match &self.bindings {
            Bindings::V3(_, layout, _) => {
                use v3::sluice::operator::types::{BatchWatermark as Wit, Layout, Processed};
                let given: Vec<Wit> = to_wit_watermarks!(Wit, watermarks);
                let in_columns = match layout {
                    Layout::Flat => None,
                    Layout::Columns => Some(
                        columns::to_columns(records)
                            .map_err(|e| CallError::Contract(format!("given {e}")))?,
                    ),
                };
                let records = match &in_columns {
                    None => RecordsRef::Flat(records),
                    Some(c) => RecordsRef::Columns(c),
                };
                self.call(|b, s| match b {
                    Bindings::V3(_, _, process) => {
                        process.call(s, input, records, &given).map(|r| {
                            r.map_err(GuestError::from).and_then(|p: Processed| {
                                Ok(Processed2 {
                                    records: columns::to_flat(p.records)
                                        .map_err(GuestError::Contract)?,
                                    effects: p.effects,
                                    watermarks: from_wit_watermarks!(p.watermarks),
                                    stopped_at: p.stopped_at,
                                })
                            })
                        })
                    }
                    _ => unreachable!("matched above"),
                })?
            }
            _ => {
                use v2::sluice::operator::types::BatchWatermark as Wit;
                let given: Vec<Wit> = to_wit_watermarks!(Wit, watermarks);
                self.call(|b, s| match b {
                    Bindings::V2(b) => b
                        .sluice_operator_stream_operator()
                        .call_process(s, input, records, &given)
                        .map(|r| {
                            r.map_err(GuestError::from).map(|p| Processed2 {
                                records: p.records,
                                effects: p.effects,
                                watermarks: from_wit_watermarks!(p.watermarks),
                                stopped_at: p.stopped_at,
                            })
                        }),
                    _ => unreachable!("matched above"),
                })?
            }
        };
        // Positions are at most one per record and one after the last.
        if processed.watermarks.len() > processed.records.len() + 1 {
            return Err(CallError::Contract(format!(
                "returned {} watermarks with {} bytes of records",
                processed.watermarks.len(),
                processed.records.len()
            )));
        }
        let output = self.output(Ok(CallOutput {
            records: processed.records,
            effects: processed.effects,
        }))?;
        Ok(ProcessOutput {
            output,
            watermarks: processed.watermarks,
            stopped_at: processed.stopped_at,
        })
    }

    fn process_watermark(&mut self, watermark: i64) -> Result<CallOutput, CallError> {
        let result = either!(self, call_process_watermark(watermark) output);
        self.output(result)
    }

    fn on_timers(&mut self, timers: &[u8]) -> Result<CallOutput, CallError> {
        let result = either!(self, call_on_timers(timers) output);
        self.output(result)
    }

    fn snapshot(&mut self, checkpoint_id: u64) -> Result<Vec<u8>, CallError> {
        let (state, effects) = match &self.bindings {
            Bindings::V3(..) => {
                let out = self.call(|b, s| match b {
                    Bindings::V3(b, ..) => b
                        .sluice_operator_stream_operator()
                        .call_snapshot(s, checkpoint_id)
                        .map(|r| r.map_err(GuestError::from)),
                    _ => unreachable!("matched above"),
                })?;
                (out.state, out.effects)
            }
            Bindings::V2(_) => {
                let out = self.call(|b, s| match b {
                    Bindings::V2(b) => b
                        .sluice_operator_stream_operator()
                        .call_snapshot(s, checkpoint_id)
                        .map(|r| r.map_err(GuestError::from)),
                    _ => unreachable!("matched above"),
                })?;
                (out.state, out.effects)
            }
            Bindings::V1(_) => {
                let state = self.call(|b, s| match b {
                    Bindings::V1(b) => b
                        .sluice_operator_stream_operator()
                        .call_snapshot(s, checkpoint_id)
                        .map(|r| r.map_err(GuestError::from)),
                    _ => unreachable!("matched above"),
                })?;
                (state, Vec::new())
            }
        };
        let limit = self.store.data().limits.max_output_bytes;
        if state.len() + effects.len() > limit {
            return Err(CallError::Contract(format!(
                "returned {} bytes of operator state and effects from `snapshot`; the limit \
                 is {limit} (keep large state in keyed state)",
                state.len() + effects.len()
            )));
        }
        if !effects.is_empty() {
            // Written back before the host copies keyed state for the checkpoint.
            let now = crate::timers::now_millis();
            let operator = &mut self.store.data_mut().operator;
            let writes = operator.apply_effects(&effects, now)?;
            operator.settle(now, writes)?;
        }
        Ok(state)
    }

    fn notify_complete(&mut self, checkpoint_id: u64) -> Result<(), CallError> {
        either!(self, call_notify_complete(checkpoint_id))
    }

    fn notify_aborted(&mut self, checkpoint_id: u64) -> Result<(), CallError> {
        either!(self, call_notify_aborted(checkpoint_id))
    }

    fn finish(&mut self) -> Result<CallOutput, CallError> {
        let result = either!(self, call_finish() output);
        self.output(result)
    }

    fn close(&mut self) -> Result<CallOutput, CallError> {
        let result = either!(self, call_close() output);
        self.output(result)
    }

    fn dispose(&mut self) -> Result<(), CallError> {
        if self.poisoned.is_some() {
            // A trapped store cannot run code any more; dropping it releases everything.
            return Ok(());
        }
        self.call(|b, s| match b {
            Bindings::V3(b, ..) => b.sluice_operator_stream_operator().call_dispose(s).map(Ok),
            Bindings::V2(b) => b.sluice_operator_stream_operator().call_dispose(s).map(Ok),
            Bindings::V1(b) => b.sluice_operator_stream_operator().call_dispose(s).map(Ok),
        })
    }
}
