//! The operator interface of the host: what a chain calls, whether the operator is a Wasm
//! component or native code (sinks, test operators).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use parking_lot::Mutex;
use sluice_codec::{Effect, EffectReader, TimeDomain, TimerWriter};

use crate::network::BatchWatermark;
use crate::state::lsm::LsmBackend;
use crate::state::{Account, Holding, KeyedState, StateError, key_groups::key_group_of};
use crate::timers::TimerQueues;

/// Who an operator instance is: used in every log line and error about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorIdentity {
    /// Tenant the job runs for.
    pub tenant: String,
    /// Job name.
    pub job: String,
    /// Operator name from the job file.
    pub operator: String,
    /// Index of this parallel instance.
    pub subtask: u32,
    /// Parallelism of the operator.
    pub parallelism: u32,
}

impl fmt::Display for OperatorIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "operator '{}' (subtask {}/{}) of job '{}' (tenant '{}')",
            self.operator,
            self.subtask + 1,
            self.parallelism,
            self.job,
            self.tenant
        )
    }
}

/// The calls of the operator contract, for error messages and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Call {
    /// `open`
    Open,
    /// `process`
    Process,
    /// `process-watermark`
    ProcessWatermark,
    /// `on-timers`
    OnTimers,
    /// `snapshot`
    Snapshot,
    /// `notify-complete`
    NotifyComplete,
    /// `notify-aborted`
    NotifyAborted,
    /// `finish`
    Finish,
    /// `close`
    Close,
    /// `dispose`
    Dispose,
}

impl Call {
    /// Every call, in the order of their numbers (`call as u8`).
    const ALL: [Call; 10] = [
        Call::Open,
        Call::Process,
        Call::ProcessWatermark,
        Call::OnTimers,
        Call::Snapshot,
        Call::NotifyComplete,
        Call::NotifyAborted,
        Call::Finish,
        Call::Close,
        Call::Dispose,
    ];

    /// The call numbered `index` (`call as u8`).
    pub fn from_index(index: u8) -> Option<Call> {
        Call::ALL.get(usize::from(index)).copied()
    }

    /// The call's name in the WIT.
    pub fn as_str(self) -> &'static str {
        match self {
            Call::Open => "open",
            Call::Process => "process",
            Call::ProcessWatermark => "process-watermark",
            Call::OnTimers => "on-timers",
            Call::Snapshot => "snapshot",
            Call::NotifyComplete => "notify-complete",
            Call::NotifyAborted => "notify-aborted",
            Call::Finish => "finish",
            Call::Close => "close",
            Call::Dispose => "dispose",
        }
    }
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What `open` is told.
#[derive(Debug, Clone, Default)]
pub struct OpenInfo {
    /// Job name.
    pub job: String,
    /// Operator name.
    pub operator: String,
    /// The operator's config table, as strings.
    pub config: Vec<(String, String)>,
    /// Index of this instance.
    pub subtask: u32,
    /// Parallelism of the operator.
    pub parallelism: u32,
    /// Number of key groups.
    pub max_parallelism: u32,
    /// Whether the input is partitioned by key.
    pub keyed: bool,
    /// What this subtask's `snapshot` returned in the restored checkpoint.
    pub restored_state: Option<Vec<u8>>,
    /// Restart attempt (0 on first start).
    pub attempt: u32,
    /// Its inputs, as the job file names them.
    pub inputs: Vec<InputInfo>,
}

/// One input of an operator.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InputInfo {
    /// The source or operator it comes from.
    pub name: String,
    /// Every record reaches every subtask.
    pub broadcast: bool,
}

/// What a call produced: records in the batch encoding and effects in the effect
/// encoding (see `sluice-codec`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CallOutput {
    /// Emitted records.
    pub records: Vec<u8>,
    /// State and timer mutations, counter increments.
    pub effects: Vec<u8>,
}

/// What [`Operator::process_batch`] produced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessOutput {
    /// Records and effects.
    pub output: CallOutput,
    /// Where the watermarks it passed on fall among its records.
    pub watermarks: Vec<BatchWatermark>,
    /// `None`: it handled the whole batch; `Some(n)`: it stopped before the batch's
    /// watermark number `n` (see the WIT's `processed.stopped-at`).
    pub stopped_at: Option<u32>,
}

impl From<CallOutput> for ProcessOutput {
    fn from(output: CallOutput) -> Self {
        ProcessOutput {
            output,
            ..ProcessOutput::default()
        }
    }
}

/// Why a trap happened, as far as the host can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TrapKind {
    /// The guest panicked or aborted (`unreachable` executed).
    Panic,
    /// The task was cancelled while the operator was running.
    Cancelled,
    /// The call ran longer than the tenant's deadline per call.
    Deadline,
    /// The operator tried to grow its memory past the tenant's limit.
    Memory,
    /// The call stack overflowed.
    StackOverflow,
    /// The operator accessed memory outside its linear memory.
    MemoryAccess,
    /// The call used up its fuel.
    Fuel,
    /// A host import refused to continue the call (contract violation).
    Host,
    /// Anything else (out-of-bounds access, division by zero, ...).
    Other,
}

impl TrapKind {
    /// A short name for metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            TrapKind::Panic => "panic",
            TrapKind::Cancelled => "cancelled",
            TrapKind::Deadline => "deadline",
            TrapKind::Memory => "memory",
            TrapKind::StackOverflow => "stack-overflow",
            TrapKind::MemoryAccess => "memory-access",
            TrapKind::Fuel => "fuel",
            TrapKind::Host => "host",
            TrapKind::Other => "other",
        }
    }
}

/// How many entries of an operator with TTL states the host looks at after each call
/// at least, dropping the expired ones (see [`KeyedState::expire_some`]).
const TTL_CLEANUP_PER_CALL: usize = 64;

/// How a call into an operator failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// The operator rejected its configuration: restarting will not help.
    InvalidConfig(String),
    /// The operator reported a failure.
    Failed(String),
    /// The call trapped; the instance can no longer be used.
    Trap {
        /// What kind of trap.
        kind: TrapKind,
        /// What happened (with the guest's panic message when there is one).
        message: String,
    },
    /// The operator broke the contract in what it returned (malformed buffers, output
    /// over its limit, effects it may not have); the instance is not trusted further.
    Contract(String),
    /// Going on would lose or take back data (a sink asked to rewind committed output):
    /// restarting will not help; the user must choose.
    Unrecoverable(String),
    /// The operator made the host hold more than its tenant allows (keyed state, timers,
    /// counters) or kept the task busy past a bound (timers that are due again at once).
    Limit(String),
}

impl CallError {
    /// True when retrying cannot succeed (the job should fail, not restart).
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            CallError::InvalidConfig(_) | CallError::Unrecoverable(_)
        )
    }
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallError::InvalidConfig(m) => write!(f, "invalid configuration: {m}"),
            CallError::Failed(m) => write!(f, "operator error: {m}"),
            CallError::Trap { kind, message } => match kind {
                TrapKind::Panic => write!(f, "panicked: {message}"),
                _ => write!(f, "trapped ({}): {message}", kind.as_str()),
            },
            CallError::Contract(m) => write!(f, "broke the operator contract: {m}"),
            CallError::Unrecoverable(m) => write!(f, "cannot recover: {m}"),
            CallError::Limit(m) => write!(f, "exceeded a limit: {m}"),
        }
    }
}

impl std::error::Error for CallError {}

impl From<anyhow::Error> for CallError {
    fn from(e: anyhow::Error) -> Self {
        CallError::Failed(format!("{e:#}"))
    }
}

/// A failed call, with the operator and call it happened in. This is the error a user
/// sees at the top of a failed job's error chain.
#[derive(Debug, Clone)]
pub struct OperatorFailure {
    /// The instance that failed.
    pub identity: OperatorIdentity,
    /// The call that failed.
    pub call: Call,
    /// How it failed.
    pub error: CallError,
}

impl fmt::Display for OperatorFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} failed in `{}`: {}",
            self.identity, self.call, self.error
        )
    }
}

impl std::error::Error for OperatorFailure {}

/// The host-managed part of an operator instance: its keyed state, timers, current
/// watermark and counters. The host reads it during calls (`state-get`) and changes it
/// only by applying a call's effects after the call returned.
#[derive(Debug)]
pub struct OperatorState {
    /// Keyed state; `None` when the operator's input is not keyed.
    pub keyed: Option<KeyedState>,
    /// Event- and processing-time timers, when the keyed state is not in an LSM backend
    /// (which keeps them in its database).
    pub timers: TimerQueues,
    /// The operator's current input watermark.
    pub watermark: i64,
    /// Counters the operator incremented (shared with its metrics).
    pub counters: Arc<Mutex<BTreeMap<String, u64>>>,
    /// True while `open` runs: the only time states may be declared.
    pub opening: bool,
    /// The keyed state `open` declared although the input is not keyed (refused), so
    /// that a failed `open` is known not to be one a restart could fix.
    pub unkeyed_state: Option<String>,
    /// The side outputs it declared in `open` (output `i + 1` is `outputs[i]`).
    pub outputs: Vec<String>,
    /// What the instance makes the host hold, charged to its tenant.
    pub account: Account,
    /// What its counter names hold, as [`COUNTER_BYTES`] counts them.
    pub counter_bytes: u64,
    /// While timers of a domain fire at a time: that domain and time, and how many timers
    /// the calls firing them registered that are due at once.
    pub firing: Option<Firing>,
}

/// Timers of `domain` firing at `time`, and the timers already due at it that the calls
/// firing them registered.
#[derive(Debug, Clone, Copy)]
pub struct Firing {
    /// The domain firing.
    pub domain: TimeDomain,
    /// The time it fires at.
    pub time: i64,
    /// Timers registered since, due at once.
    pub due_again: u64,
}

/// What the host counts one timer as holding beside its key: its place in the
/// time-ordered map and the key set at its time. Measured: 2 M processing-time timers
/// at distinct times raised a host's resident memory by 232 bytes each.
pub const TIMER_BYTES: u64 = 240;

/// What the host counts one counter as holding beside its name: its map entry and the
/// copies in metrics reports.
pub const COUNTER_BYTES: u64 = 96;

impl OperatorState {
    /// State for an instance; `keyed` holds the backend when the input is keyed.
    pub fn new(keyed: Option<KeyedState>) -> Self {
        OperatorState {
            keyed,
            timers: TimerQueues::new(),
            watermark: i64::MIN,
            counters: Arc::default(),
            opening: false,
            unkeyed_state: None,
            outputs: Vec::new(),
            account: Account::default(),
            counter_bytes: 0,
            firing: None,
        }
    }

    /// Takes `counters` (kept across restarts, in the instance's metrics) as its
    /// counters, charging the names they already hold.
    pub fn share_counters(&mut self, counters: Arc<Mutex<BTreeMap<String, u64>>>) {
        self.counter_bytes = counters
            .lock()
            .keys()
            .map(|name| name.len() as u64 + COUNTER_BYTES)
            .sum();
        self.counters = counters;
    }

    /// After a call that wrote `writes` entries (and after a restore): drops entries
    /// whose TTL has passed, oldest write first, up to more than twice as many as were
    /// written, so cleanup keeps up with any write rate — and charges what the instance
    /// holds now.
    /// Fails when that is over a limit.
    pub fn settle(&mut self, now: i64, writes: usize) -> Result<(), CallError> {
        if let Some(keyed) = self.keyed.as_mut() {
            keyed.expire_some(now, TTL_CLEANUP_PER_CALL + 2 * writes);
        }
        self.account
            .charge(self.holding())
            .map_err(CallError::Limit)
    }

    /// What the instance makes the host hold now: its timers (their keys and
    /// [`TIMER_BYTES`] each) and its counter names count as keyed state, so that what is
    /// charged follows the memory they take.
    fn holding(&self) -> Holding {
        let timers = self.timers.len() as u64;
        Holding {
            state_bytes: self.keyed.as_ref().map_or(0, KeyedState::bytes)
                + self.timers.key_bytes() as u64
                + timers * TIMER_BYTES
                + self.counter_bytes,
            timers,
        }
    }

    /// Applies the effects of a successful call, in order. `now` is the processing
    /// time (for state TTL). An error means the operator sent effects it may not
    /// (malformed, state of an unkeyed operator, a key of another subtask); effects
    /// before the bad one stay applied, and the task fails anyway. Returns how many
    /// state entries were written.
    pub fn apply_effects(&mut self, effects: &[u8], now: i64) -> Result<usize, CallError> {
        let applied = self.apply_all(effects, now);
        // The LSM backend writes a call's puts and deletes at once, in key order.
        let committed = match self.keyed.as_mut() {
            // Not the operator's fault when the store fails (a full disk): a failure to
            // restart from, not a broken contract.
            Some(keyed) => keyed
                .commit()
                .map_err(|e| CallError::Failed(format!("writing keyed state: {e}"))),
            None => Ok(()),
        };
        let writes = applied?;
        committed?;
        Ok(writes)
    }

    fn apply_all(&mut self, effects: &[u8], now: i64) -> Result<usize, CallError> {
        let mut writes = 0;
        for effect in EffectReader::new(effects) {
            let effect = effect.map_err(|e| CallError::Contract(e.to_string()))?;
            let grows = match effect {
                Effect::Put { .. } | Effect::Append { .. } => {
                    writes += 1;
                    true
                }
                Effect::RegisterTimer { .. } => true,
                _ => false,
            };
            self.apply(effect, now)?;
            if grows {
                // The instance's own limits hold effect by effect; the tenant is charged
                // once per call, in `settle`.
                self.account
                    .check(self.holding())
                    .map_err(CallError::Limit)?;
            }
        }
        Ok(writes)
    }

    fn apply(&mut self, effect: Effect<'_>, now: i64) -> Result<(), CallError> {
        let state_err = |e: StateError| CallError::Contract(e.to_string());
        match effect {
            Effect::Put {
                state,
                key,
                user_key,
                value,
            } => self
                .backend()?
                .put(state, key, user_key, value, now)
                .map_err(state_err),
            Effect::Delete {
                state,
                key,
                user_key,
            } => self
                .backend()?
                .delete(state, key, user_key)
                .map_err(state_err),
            Effect::Clear { state, key } => self.backend()?.clear(state, key).map_err(state_err),
            Effect::Append { state, key, value } => self
                .backend()?
                .append(state, key, value, now)
                .map_err(state_err),
            Effect::RegisterTimer {
                domain,
                timestamp,
                key,
            } => {
                let max = self.account.limits().string_bytes;
                if key.len() > max {
                    return Err(CallError::Limit(format!(
                        "a timer key of {} bytes is longer than the limit of {max} bytes \
                         (`guest_string_kb`)",
                        key.len()
                    )));
                }
                self.check_timer_key(key).map_err(CallError::Contract)?;
                if let Some(f) = self.firing.as_mut()
                    && f.domain == domain
                    && timestamp <= f.time
                {
                    f.due_again += 1;
                }
                self.register_timer(domain, timestamp, key)
                    .map_err(|e| CallError::Failed(format!("registering a timer: {e}")))
            }
            Effect::DeleteTimer {
                domain,
                timestamp,
                key,
            } => match self.delete_timer(domain, timestamp, key) {
                // A key of another subtask has no timer here: nothing to delete.
                Err(StateError::ForeignKey { .. }) | Ok(()) => Ok(()),
                Err(e) => Err(CallError::Failed(format!("deleting a timer: {e}"))),
            },
            Effect::Counter { name, delta } => self.count(name, delta),
        }
    }

    // Timers of an instance whose keyed state is in an LSM backend are in two tiers: the
    // earliest (before the backend's `near_until`) on the heap, in `timers`, as long as
    // they fit in the backend's share for them; the rest in its database. So a job with
    // a timer per key holds nothing per key in memory, and one with few timers (a window
    // per key over a few thousand keys) never writes them to disk. Every timer has one
    // place, decided by its time, so one registered twice is still one timer; the heap's
    // timers all come before the database's, so the earliest is the heap's if it has
    // any, and those due fire heap first, then the database's, in time and key order.

    /// The LSM backend that keeps the instance's later timers, when its keyed state is in
    /// one.
    fn lsm(&mut self) -> Option<&mut LsmBackend> {
        match self.keyed.as_mut()? {
            KeyedState::Lsm(b) => Some(b),
            KeyedState::Heap(_) => None,
        }
    }

    /// Registers a timer; registering an existing one again changes nothing.
    pub fn register_timer(
        &mut self,
        domain: TimeDomain,
        time: i64,
        key: &[u8],
    ) -> Result<(), StateError> {
        let Some(KeyedState::Lsm(lsm)) = self.keyed.as_mut() else {
            self.timers.register(domain, time, key);
            return Ok(());
        };
        if time >= lsm.near_until(domain) {
            return lsm.register_timer(domain, time, key);
        }
        self.timers.register(domain, time, key);
        let held = self.timers.key_bytes() as u64 + self.timers.len() as u64 * TIMER_BYTES;
        if held <= lsm.near_timer_bytes() {
            return Ok(());
        }
        // Over its share: the later half of the fuller domain goes to the database.
        let fuller = [TimeDomain::EventTime, TimeDomain::ProcessingTime]
            .into_iter()
            .max_by_key(|d| self.timers.len_of(*d))
            .expect("two domains");
        let half = self.timers.len_of(fuller).div_ceil(2);
        if let Some((from, moved)) = self.timers.pop_latest(fuller, half) {
            for (at, key) in moved {
                lsm.register_timer(fuller, at, &key)?;
            }
            lsm.lower_near_until(fuller, from);
        }
        Ok(())
    }

    /// Deletes a timer if it exists.
    pub fn delete_timer(
        &mut self,
        domain: TimeDomain,
        time: i64,
        key: &[u8],
    ) -> Result<(), StateError> {
        match self.keyed.as_mut() {
            Some(KeyedState::Lsm(lsm)) if time >= lsm.near_until(domain) => {
                lsm.delete_timer(domain, time, key)
            }
            _ => {
                self.timers.delete(domain, time, key);
                Ok(())
            }
        }
    }

    /// The time of the instance's earliest timer of `domain`.
    pub fn next_timer(&mut self, domain: TimeDomain) -> Result<Option<i64>, StateError> {
        if let Some(next) = self.timers.next(domain) {
            return Ok(Some(next));
        }
        match self.lsm() {
            // None on the heap: the heap may take the timers up to the database's first.
            Some(lsm) => lsm.raise_near_until(domain),
            None => Ok(None),
        }
    }

    /// Removes the first `limit` timers of `domain` due at `time`, by time and then key,
    /// and returns them in the `timers` encoding with their number; `None` when none is
    /// due.
    pub fn pop_due_timers(
        &mut self,
        domain: TimeDomain,
        time: i64,
        limit: usize,
    ) -> Result<Option<(Vec<u8>, usize)>, StateError> {
        let mut out = TimerWriter::new();
        let mut taken = self.timers.pop_due_into(&mut out, domain, time, limit);
        if let Some(KeyedState::Lsm(lsm)) = self.keyed.as_mut()
            && taken < limit
            && time >= lsm.near_until(domain)
        {
            taken += lsm.pop_due_timers(&mut out, domain, time, limit - taken)?;
            lsm.raise_near_until(domain)?;
        }
        Ok((taken > 0).then(|| (out.into_bytes(), taken)))
    }

    /// Adds `delta` to counter `name`, within the instance's limits on counters.
    fn count(&mut self, name: &[u8], delta: u64) -> Result<(), CallError> {
        let limits = *self.account.limits();
        if name.len() > limits.string_bytes {
            return Err(CallError::Limit(format!(
                "a counter name of {} bytes is longer than the limit of {} bytes \
                 (`guest_string_kb`)",
                name.len(),
                limits.string_bytes
            )));
        }
        let mut counters = self.counters.lock();
        // Names are printed (metrics, summaries): no control characters.
        let name = String::from_utf8_lossy(name);
        let name = crate::guest_text::printable(&name);
        let known = counters.len();
        if let Some(c) = counters.get_mut(name.as_ref()) {
            *c = c.saturating_add(delta);
        } else if known >= limits.counters {
            return Err(CallError::Limit(format!(
                "counter '{name}' would be counter number {} of the instance; the limit is {} \
                 (`counters`)",
                known + 1,
                limits.counters
            )));
        } else {
            self.counter_bytes += name.len() as u64 + COUNTER_BYTES;
            counters.insert(name.into_owned(), delta);
        }
        Ok(())
    }

    fn backend(&mut self) -> Result<&mut KeyedState, CallError> {
        self.keyed.as_mut().ok_or_else(|| {
            CallError::Contract(
                "keyed state used, but the operator's input is not keyed (set `key_by` in the \
                 job file)"
                    .to_string(),
            )
        })
    }

    /// A keyed operator may only set timers for keys of its own key groups.
    fn check_timer_key(&self, key: &[u8]) -> Result<(), String> {
        let Some(backend) = &self.keyed else {
            return Ok(());
        };
        let owned = backend.key_groups();
        let kg = key_group_of(key, backend.max_parallelism());
        if owned.contains(&kg) {
            Ok(())
        } else {
            Err(StateError::ForeignKey {
                key_group: kg,
                owned,
            }
            .to_string())
        }
    }
}

/// One operator instance as the chain sees it.
///
/// Calls happen on the task thread, one at a time, in the order the WIT documents. A
/// returned [`CallOutput`] has not been applied yet: the chain applies its effects to
/// [`Operator::state`] and passes its records on.
pub trait Operator: Send {
    /// Who this instance is.
    fn identity(&self) -> &OperatorIdentity;
    /// The host-managed state of this instance.
    fn state(&mut self) -> &mut OperatorState;
    /// The most linear memory the instance has had (0 for native operators).
    fn memory_bytes(&self) -> u64 {
        0
    }
    /// Log lines of the instance dropped by its tenant's log rate.
    fn log_lines_dropped(&self) -> u64 {
        0
    }
    /// `open`.
    fn open(&mut self, info: &OpenInfo) -> Result<CallOutput, CallError>;
    /// `process`.
    fn process(&mut self, records: &[u8]) -> Result<CallOutput, CallError>;

    /// True when the operator takes watermarks inside batches ([`Operator::process_batch`],
    /// WIT 0.2.0). Others get a batch's watermarks after it, as between batches.
    fn takes_batch_watermarks(&self) -> bool {
        false
    }

    /// A batch of input `input` with the watermarks that arrived among its records, for
    /// an operator that [takes them](Operator::takes_batch_watermarks).
    fn process_batch(
        &mut self,
        input: u32,
        records: &[u8],
        watermarks: &[BatchWatermark],
    ) -> Result<ProcessOutput, CallError> {
        let _ = (input, watermarks);
        Ok(ProcessOutput {
            output: self.process(records)?,
            watermarks: Vec::new(),
            stopped_at: None,
        })
    }
    /// `process-watermark`.
    fn process_watermark(&mut self, watermark: i64) -> Result<CallOutput, CallError>;
    /// The task's input became idle (`true`) or active again: of use only to a sink that
    /// passes event time on (an exchange topic's writer).
    fn set_idle(&mut self, idle: bool) {
        let _ = idle;
    }
    /// `on-timers`.
    fn on_timers(&mut self, timers: &[u8]) -> Result<CallOutput, CallError>;
    /// `snapshot`.
    fn snapshot(&mut self, checkpoint_id: u64) -> Result<Vec<u8>, CallError>;
    /// `notify-complete`.
    fn notify_complete(&mut self, checkpoint_id: u64) -> Result<(), CallError>;
    /// `notify-aborted`.
    fn notify_aborted(&mut self, checkpoint_id: u64) -> Result<(), CallError>;
    /// `finish`.
    fn finish(&mut self) -> Result<CallOutput, CallError>;
    /// `close`.
    fn close(&mut self) -> Result<CallOutput, CallError>;
    /// `dispose`; errors are reported but never stop the disposal of other operators.
    fn dispose(&mut self) -> Result<(), CallError>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{StateDescriptor, StateKind};
    use sluice_codec::EffectWriter;

    #[test]
    fn effects_update_state_timers_and_counters() {
        let mut backend = KeyedState::heap(128, 0..128);
        let s = backend
            .declare(StateDescriptor {
                name: "count".into(),
                kind: StateKind::Value,
                ttl_ms: None,
            })
            .unwrap();
        let mut state = OperatorState::new(Some(backend));
        let mut w = EffectWriter::new();
        w.push(Effect::Put {
            state: s,
            key: b"k",
            user_key: b"",
            value: b"1",
        });
        w.push(Effect::RegisterTimer {
            domain: TimeDomain::EventTime,
            timestamp: 5,
            key: b"k",
        });
        w.push(Effect::Counter {
            name: b"seen",
            delta: 2,
        });
        w.push(Effect::Counter {
            name: b"seen",
            delta: 3,
        });
        state.apply_effects(&w.take(), 0).unwrap();
        let keyed = state.keyed.as_ref().unwrap();
        assert_eq!(&*keyed.get(s, b"k", b"", 0).unwrap().unwrap(), b"1");
        assert_eq!(state.timers.next(TimeDomain::EventTime), Some(5));
        assert_eq!(state.counters.lock()["seen"], 5);
    }

    #[test]
    fn state_effects_of_an_unkeyed_operator_are_a_contract_violation() {
        let mut state = OperatorState::new(None);
        let mut w = EffectWriter::new();
        w.push(Effect::Put {
            state: 0,
            key: b"k",
            user_key: b"",
            value: b"1",
        });
        let err = state.apply_effects(&w.take(), 0).unwrap_err();
        assert!(err.to_string().contains("set `key_by`"), "{err}");
        let err = state.apply_effects(&[42], 0).unwrap_err();
        assert!(err.to_string().contains("unknown effect tag"), "{err}");
    }

    #[test]
    fn failure_message_names_operator_subtask_job_tenant_and_call() {
        let failure = OperatorFailure {
            identity: OperatorIdentity {
                tenant: "acme".into(),
                job: "wc".into(),
                operator: "count".into(),
                subtask: 1,
                parallelism: 4,
            },
            call: Call::Process,
            error: CallError::Trap {
                kind: TrapKind::Panic,
                message: "boom".into(),
            },
        };
        assert_eq!(
            failure.to_string(),
            "operator 'count' (subtask 2/4) of job 'wc' (tenant 'acme') failed in `process`: panicked: boom"
        );
    }
}
