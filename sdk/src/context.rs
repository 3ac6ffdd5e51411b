//! What an operator can do during a call: [`OpenContext`] in `open`, [`Context`] in the
//! other calls that may produce output.

use std::cell::Cell;
use std::ops::Range;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use sluice_codec::{BatchWriter, Effect, EffectWriter, RecordRef, TimeDomain};

use crate::host::{Host, Level, StateKind};
use crate::state::StateCache;
use crate::{Config, Error, ListState, MapState, Record, Result, ValueState, from_bytes, to_bytes};

/// The SDK's side of one operator instance: declared states with their cache, and the
/// output of the call in progress.
#[derive(Debug, Default)]
pub(crate) struct Runtime {
    pub(crate) states: StateCache,
    pub(crate) records: BatchWriter,
    pub(crate) effects: EffectWriter,
    /// Timers registered with the host that have not fired or been deleted: registering
    /// one of them again sends nothing.
    timers: TimerSet,
    registered_timers: usize,
    /// While an `on-timers` call runs, the latest time of its batch.
    firing_until: Option<i64>,
    /// What an `on-timers` call changed in its own batch (see [`BatchTimers`]). Empty
    /// otherwise; allocated on the first such change and kept (out of line: most
    /// operators never need it).
    batch: Option<Box<BatchTimers>>,
    /// The watermark in the current call: as read from the host (once: it changes only
    /// between calls), or as the batch's watermarks advanced it.
    pub(crate) watermark: Cell<Option<i64>>,
    /// The earliest event-time timer registered in this call (new to the host).
    pub(crate) new_event_timer: Option<i64>,
    /// The side outputs declared in `open`.
    outputs: Vec<String>,
}

/// During an `on-timers` call, the timers of its batch that an earlier timer changed.
#[derive(Debug, Default)]
struct BatchTimers {
    /// Deleted since the call began: they must not fire when their turn comes (Flink
    /// pops timers one at a time, so a timer deleted by an earlier one never fires).
    deleted: TimerSet,
    /// Registered since the call began and due no later than the batch's latest time, so
    /// possibly in the batch: one that fires at its turn has its registration cancelled
    /// (Flink's queue would have kept the one entry). Only registrations the SDK did not
    /// know of land here (after a restore, or past `MAX_REMEMBERED_TIMERS`).
    registered: TimerSet,
}

/// A set of timers, looked up by a borrowed key: a short key (as most are) is stored
/// inline, so adding a timer allocates nothing once the table has grown.
#[derive(Debug, Default)]
struct TimerSet(hashbrown::HashSet<OwnedTimer, rustc_hash::FxBuildHasher>);

#[derive(Debug, PartialEq, Eq)]
struct OwnedTimer {
    domain: TimeDomain,
    timestamp: i64,
    key: smallvec::SmallVec<[u8; 16]>,
}

/// A timer as it is looked up; hashes as its [`OwnedTimer`] does.
#[derive(Hash)]
struct TimerRef<'k> {
    domain: TimeDomain,
    timestamp: i64,
    key: &'k [u8],
}

impl std::hash::Hash for OwnedTimer {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        TimerRef {
            domain: self.domain,
            timestamp: self.timestamp,
            key: &self.key,
        }
        .hash(state);
    }
}

impl hashbrown::Equivalent<OwnedTimer> for TimerRef<'_> {
    fn equivalent(&self, timer: &OwnedTimer) -> bool {
        self.domain == timer.domain
            && self.timestamp == timer.timestamp
            && self.key == &timer.key[..]
    }
}

impl TimerSet {
    /// Adds a timer; false when it was already there.
    fn insert(&mut self, domain: TimeDomain, key: &[u8], timestamp: i64) -> bool {
        let mut added = false;
        let timer = TimerRef {
            domain,
            timestamp,
            key,
        };
        self.0.get_or_insert_with(&timer, |t| {
            added = true;
            OwnedTimer {
                domain: t.domain,
                timestamp: t.timestamp,
                key: smallvec::SmallVec::from_slice(t.key),
            }
        });
        added
    }

    /// Removes a timer; false when it was not there.
    fn remove(&mut self, domain: TimeDomain, key: &[u8], timestamp: i64) -> bool {
        self.0.remove(&TimerRef {
            domain,
            timestamp,
            key,
        })
    }

    fn contains(&self, domain: TimeDomain, key: &[u8], timestamp: i64) -> bool {
        self.0.contains(&TimerRef {
            domain,
            timestamp,
            key,
        })
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn clear(&mut self) {
        self.0.clear();
    }
}

/// Past this many remembered timers the SDK forgets them (and may register some again,
/// which the host ignores).
const MAX_REMEMBERED_TIMERS: usize = 100_000;

/// What a successful call hands back to the host.
#[derive(Debug, Default)]
pub(crate) struct CallOutput {
    /// Emitted records, in the `records` encoding.
    pub(crate) records: Vec<u8>,
    /// Effects, in the `effects` encoding.
    pub(crate) effects: Vec<u8>,
}

impl Runtime {
    /// Ends the current call and takes its output; after a failure the output is dropped
    /// (the host would discard it) and the state cache forgets the call's writes.
    pub(crate) fn end_call(&mut self, success: bool) -> CallOutput {
        self.watermark.set(None);
        self.new_event_timer = None;
        self.states.end_call(success, &mut self.effects);
        self.firing_until = None;
        if let Some(batch) = &mut self.batch {
            batch.deleted.clear();
            batch.registered.clear();
        }
        if !success || self.registered_timers > MAX_REMEMBERED_TIMERS {
            self.timers = TimerSet::default();
            self.registered_timers = 0;
        }
        if success {
            CallOutput {
                records: self.records.take(),
                effects: self.effects.take(),
            }
        } else {
            self.records.clear();
            self.effects.take();
            CallOutput::default()
        }
    }

    fn timer(&mut self, register: bool, domain: TimeDomain, key: &[u8], timestamp: i64) {
        if register {
            if !self.timers.insert(domain, key, timestamp) {
                return;
            }
            self.registered_timers += 1;
            if domain == TimeDomain::EventTime {
                self.new_event_timer =
                    Some(self.new_event_timer.map_or(timestamp, |t| t.min(timestamp)));
            }
            if self.firing_until.is_some_and(|until| timestamp <= until) {
                self.batch
                    .get_or_insert_default()
                    .registered
                    .insert(domain, key, timestamp);
            }
            self.effects.push(Effect::RegisterTimer {
                domain,
                timestamp,
                key,
            });
        } else {
            self.forget_timer(domain, key, timestamp);
            if self.firing_until.is_some() {
                let batch = self.batch.get_or_insert_default();
                batch.registered.remove(domain, key, timestamp);
                batch.deleted.insert(domain, key, timestamp);
            }
            self.effects.push(Effect::DeleteTimer {
                domain,
                timestamp,
                key,
            });
        }
    }

    /// The timer was deleted (or fires): registering it again must reach the host.
    fn forget_timer(&mut self, domain: TimeDomain, key: &[u8], timestamp: i64) {
        self.timers.remove(domain, key, timestamp);
    }

    /// Starts an `on-timers` call whose batch reaches up to `until`: until it ends, the
    /// timers deleted and registered are remembered for [`fire_timer`](Self::fire_timer).
    pub(crate) fn begin_timers(&mut self, until: i64) {
        self.firing_until = Some(until);
    }

    /// The turn of a timer of the `on-timers` batch: whether it fires, as it would from
    /// Flink's queue, which pops timers one at a time. It does not if it was deleted
    /// during the call (by an earlier timer of the batch) and not registered again. When
    /// it fires after an earlier timer registered it (again), that registration is
    /// cancelled: the host applies the call's effects only after it, and would fire the
    /// timer a second time.
    pub(crate) fn fire_timer(&mut self, domain: TimeDomain, key: &[u8], timestamp: i64) -> bool {
        // Only a batch in which something was deleted or registered pays for lookups.
        let (deleted, registered) = match &mut self.batch {
            Some(batch) => {
                let taken =
                    |set: &mut TimerSet| !set.is_empty() && set.remove(domain, key, timestamp);
                (taken(&mut batch.deleted), taken(&mut batch.registered))
            }
            None => (false, false),
        };
        if deleted && !self.timers.contains(domain, key, timestamp) {
            return false;
        }
        if registered {
            self.effects.push(Effect::DeleteTimer {
                domain,
                timestamp,
                key,
            });
        }
        // It fires: registering it again (from its own `on_timer`) must reach the host.
        self.forget_timer(domain, key, timestamp);
        true
    }

    fn add_counter(&mut self, name: &str, delta: u64) {
        self.effects.push(Effect::Counter {
            name: name.as_bytes(),
            delta,
        });
    }
}

/// Everything `open` learns from the host.
#[derive(Debug, Clone, Default)]
pub(crate) struct OpenInfo {
    pub(crate) job: String,
    pub(crate) operator_name: String,
    pub(crate) config: Config,
    pub(crate) subtask_index: u32,
    pub(crate) parallelism: u32,
    pub(crate) max_parallelism: u32,
    pub(crate) keyed: bool,
    pub(crate) restored_state: Option<Vec<u8>>,
    pub(crate) attempt: u32,
    pub(crate) inputs: Vec<Input>,
}

/// One input of an operator, as the job file names it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Input {
    /// The source or operator it comes from.
    pub name: String,
    /// Every record of it reaches every subtask.
    pub broadcast: bool,
}

/// A side output declared with [`OpenContext::side_output`], for
/// [`Context::emit_to`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SideOutput(u32);

/// A timer that fired, as passed to [`Operator::on_timer`](crate::Operator::on_timer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timer<'a> {
    /// The clock the timer followed.
    pub domain: TimeDomain,
    /// The time it was registered for (a processing-time timer may fire later than that).
    pub timestamp: i64,
    /// The key it was registered for; use it to reach the key's state.
    pub key: &'a [u8],
}

/// Implements the timer, counter, clock and log methods shared by both contexts.
macro_rules! shared_context_methods {
    () => {
        /// The host's wall clock, in milliseconds since the Unix epoch.
        pub fn processing_time(&self) -> i64 {
            self.host.processing_time()
        }

        /// The operator's input watermark: no record with a smaller event timestamp is
        /// expected any more (`i64::MIN` before the first watermark).
        pub fn current_watermark(&self) -> i64 {
            match self.rt.watermark.get() {
                Some(watermark) => watermark,
                None => {
                    let watermark = self.host.current_watermark();
                    self.rt.watermark.set(Some(watermark));
                    watermark
                }
            }
        }

        /// Calls [`Operator::on_timer`](crate::Operator::on_timer) for `key` once the
        /// watermark reaches `timestamp`. Registering the same timer twice keeps one.
        /// On unkeyed input use an empty key.
        pub fn register_event_timer(&mut self, key: &[u8], timestamp: i64) {
            self.rt.timer(true, TimeDomain::EventTime, key, timestamp);
        }

        /// Calls [`Operator::on_timer`](crate::Operator::on_timer) for `key` once the
        /// wall clock reaches `timestamp`. Registering the same timer twice keeps one.
        pub fn register_processing_timer(&mut self, key: &[u8], timestamp: i64) {
            self.rt
                .timer(true, TimeDomain::ProcessingTime, key, timestamp);
        }

        /// Deletes an event-time timer, if it is registered. A timer due in the same
        /// `on_timer` batch as the one being handled is deleted too: it does not fire
        /// (unless registered again before its turn).
        pub fn delete_event_timer(&mut self, key: &[u8], timestamp: i64) {
            self.rt.timer(false, TimeDomain::EventTime, key, timestamp);
        }

        /// Deletes a processing-time timer, if it is registered (as with
        /// [`delete_event_timer`](Self::delete_event_timer), also one due in the same
        /// `on_timer` batch).
        pub fn delete_processing_timer(&mut self, key: &[u8], timestamp: i64) {
            self.rt
                .timer(false, TimeDomain::ProcessingTime, key, timestamp);
        }

        /// Adds `delta` to the operator's counter `name` (a metric the host reports).
        pub fn add_counter(&mut self, name: &str, delta: u64) {
            self.rt.add_counter(name, delta);
        }

        /// Writes a line to the host's log, which tags it with tenant, job, operator and
        /// subtask. The host may drop lines beyond the tenant's log rate.
        pub fn log(&self, level: Level, message: &str) {
            self.host.log(level, message);
        }

        /// [`log`](Self::log) at [`Level::Debug`].
        pub fn debug(&self, message: &str) {
            self.log(Level::Debug, message);
        }

        /// [`log`](Self::log) at [`Level::Info`].
        pub fn info(&self, message: &str) {
            self.log(Level::Info, message);
        }

        /// [`log`](Self::log) at [`Level::Warn`].
        pub fn warn(&self, message: &str) {
            self.log(Level::Warn, message);
        }

        /// [`log`](Self::log) at [`Level::Error`].
        pub fn error(&self, message: &str) {
            self.log(Level::Error, message);
        }
    };
}

/// What [`Operator::open`](crate::Operator::open) can see and do: the configuration and
/// placement of this instance, its restored state, declaring keyed state and registering
/// timers. Records cannot be emitted from `open`.
pub struct OpenContext<'a> {
    pub(crate) host: &'a dyn Host,
    pub(crate) rt: &'a mut Runtime,
    pub(crate) info: &'a OpenInfo,
}

impl OpenContext<'_> {
    /// Name of the job.
    pub fn job(&self) -> &str {
        &self.info.job
    }

    /// Name of this operator in the job file.
    pub fn operator_name(&self) -> &str {
        &self.info.operator_name
    }

    /// The operator's `config` table from the job file.
    pub fn config(&self) -> &Config {
        &self.info.config
    }

    /// Index of this parallel instance, `0 .. parallelism`.
    pub fn subtask_index(&self) -> u32 {
        self.info.subtask_index
    }

    /// Number of parallel instances of this operator.
    pub fn parallelism(&self) -> u32 {
        self.info.parallelism
    }

    /// Number of key groups, the unit in which keyed state moves when the parallelism
    /// changes.
    pub fn max_parallelism(&self) -> u32 {
        self.info.max_parallelism
    }

    /// True when the input is partitioned by key, so keyed state and per-key timers can be
    /// used.
    pub fn is_keyed(&self) -> bool {
        self.info.keyed
    }

    /// How many times the job has been restarted after a failure (0 on the first start).
    pub fn attempt(&self) -> u32 {
        self.info.attempt
    }

    /// The bytes [`Operator::snapshot`](crate::Operator::snapshot) returned in the
    /// checkpoint being restored, or `None` on a fresh start. (Keyed state and timers are
    /// restored by the host.)
    pub fn restored_state(&self) -> Option<&[u8]> {
        self.info.restored_state.as_deref()
    }

    /// The restored state decoded from postcard, as written by returning [`to_bytes`] from
    /// `snapshot`. `None` on a fresh start and when the snapshot was empty (the default
    /// `snapshot` returns no bytes).
    ///
    /// # Errors
    ///
    /// [`Error::Failed`](crate::Error::Failed) when the bytes do not decode as `T`.
    pub fn restore<T: DeserializeOwned>(&self) -> Result<Option<T>> {
        match self.restored_state() {
            None | Some([]) => Ok(None),
            Some(bytes) => from_bytes(bytes)
                .map(Some)
                .map_err(|e| e.context("cannot restore the operator state")),
        }
    }

    /// Declares a [`ValueState`] named `name`.
    ///
    /// States are matched by name on restore, so a name must keep its kind and value type
    /// across versions of the operator.
    ///
    /// # Errors
    ///
    /// [`Error::Failed`](crate::Error::Failed) naming the state when the host refuses it: the input is not
    /// keyed, or the name is already declared with another kind.
    pub fn value_state<T>(&mut self, name: &str) -> Result<ValueState<T>> {
        self.declare(name, StateKind::Value, None)
            .map(ValueState::new)
    }

    /// Declares a [`ValueState`] whose entries expire `ttl` after they were last written
    /// (measured by the host's processing time).
    pub fn value_state_with_ttl<T>(&mut self, name: &str, ttl: Duration) -> Result<ValueState<T>> {
        self.declare(name, StateKind::Value, Some(ttl))
            .map(ValueState::new)
    }

    /// Declares a [`ListState`] named `name`; see [`value_state`](Self::value_state).
    pub fn list_state<T>(&mut self, name: &str) -> Result<ListState<T>> {
        self.declare(name, StateKind::List, None)
            .map(ListState::new)
    }

    /// Declares a [`ListState`] whose elements expire `ttl` after they were appended.
    pub fn list_state_with_ttl<T>(&mut self, name: &str, ttl: Duration) -> Result<ListState<T>> {
        self.declare(name, StateKind::List, Some(ttl))
            .map(ListState::new)
    }

    /// Declares a [`MapState`] named `name`; see [`value_state`](Self::value_state).
    pub fn map_state<K, V>(&mut self, name: &str) -> Result<MapState<K, V>> {
        self.declare(name, StateKind::Map, None).map(MapState::new)
    }

    /// Declares a [`MapState`] whose entries expire `ttl` after they were last written.
    pub fn map_state_with_ttl<K, V>(
        &mut self,
        name: &str,
        ttl: Duration,
    ) -> Result<MapState<K, V>> {
        self.declare(name, StateKind::Map, Some(ttl))
            .map(MapState::new)
    }

    /// The operator's inputs; [`Context::input_index`] says which one a record came from.
    pub fn inputs(&self) -> &[Input] {
        &self.info.inputs
    }

    /// Declares side output `name`: records sent there with [`Context::emit_to`] go where
    /// the job file connects `OPERATOR.side:NAME` in the `inputs` of an operator or sink
    /// (nowhere if it does not: dropped and counted, as in Flink).
    ///
    /// # Errors
    ///
    /// The host's refusal (outside `open`, a bad name, too many outputs).
    pub fn side_output(&mut self, name: &str) -> Result<SideOutput> {
        let id = self
            .host
            .declare_output(name)
            .map_err(|e| Error::failed(format!("declaring side output '{name}': {e}")))?;
        self.rt.outputs.push(name.to_owned());
        Ok(SideOutput(id))
    }

    fn declare(&mut self, name: &str, kind: StateKind, ttl: Option<Duration>) -> Result<usize> {
        self.rt.states.declare(self.host, name, kind, ttl)
    }

    shared_context_methods!();
}

/// What an operator can do while it processes records, watermarks and timers, and in
/// `finish` and `close`: emit records, reach keyed state (through the state handles),
/// register timers, count and log.
///
/// Emitted records go to the next operator of the chain in the order they were emitted.
pub struct Context<'a> {
    pub(crate) host: &'a dyn Host,
    pub(crate) rt: &'a mut Runtime,
    pub(crate) timestamp: Option<i64>,
    /// The input record being processed, with where its encoded bytes lie in `batch`:
    /// emitting it unchanged copies those bytes instead of encoding it again.
    pub(crate) input: Option<(RecordRef<'a>, Range<usize>)>,
    /// The batch `process` is reading (empty in other calls).
    pub(crate) batch: &'a [u8],
    /// Input records emitted unchanged and not copied to the output yet: the bytes
    /// `batch[range]`, holding `count` records. Consecutive ones (a filter passing a run
    /// of records) are copied at once, when something else is emitted or the call ends.
    pub(crate) unchanged: (Range<usize>, usize),
    /// The input the batch being processed came from.
    pub(crate) input_index: u32,
}

impl Context<'_> {
    /// Emits a record with the timestamp of what is being processed: the input record's
    /// timestamp in `process`, an event-time timer's time in `on_timer`, and none
    /// otherwise (see [`timestamp`](Self::timestamp)).
    #[inline]
    pub fn emit(&mut self, key: Option<&[u8]>, value: &[u8]) {
        self.emit_at(key, value, self.timestamp);
    }

    /// Emits a record with the given timestamp (with the input record's headers and
    /// partition, as [`emit`](Self::emit)).
    #[inline]
    pub fn emit_at(&mut self, key: Option<&[u8]>, value: &[u8], timestamp: Option<i64>) {
        self.copy_unchanged();
        match &self.input {
            Some((input, _)) if input.headers.is_some() || input.partition.is_some() => {
                self.rt.records.push_record(RecordRef {
                    key,
                    value,
                    timestamp,
                    headers: input.headers,
                    partition: input.partition,
                    output: 0,
                });
            }
            _ => self.rt.records.push(key, value, timestamp),
        }
    }

    /// Emits a record to side output `output` (timestamp, headers and partition as
    /// [`emit`](Self::emit)).
    pub fn emit_to(&mut self, output: SideOutput, key: Option<&[u8]>, value: &[u8]) {
        self.copy_unchanged();
        let input = self.input.as_ref().map(|(input, _)| *input);
        self.rt.records.push_record(RecordRef {
            key,
            value,
            timestamp: self.timestamp,
            headers: input.and_then(|i| i.headers),
            partition: input.and_then(|i| i.partition),
            output: output.0,
        });
    }

    /// The input (of [`OpenContext::inputs`]) the record being processed came from.
    pub fn input_index(&self) -> u32 {
        self.input_index
    }

    /// The headers of the record being processed (a Kafka record's), in order.
    pub fn headers(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        self.input
            .as_ref()
            .and_then(|(input, _)| input.headers)
            .into_iter()
            .flat_map(|h| h.iter())
    }

    /// The value of the first header `name` of the record being processed.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.input
            .as_ref()
            .and_then(|(input, _)| input.headers)
            .and_then(|h| h.get(name.as_bytes()))
    }

    /// The source partition the record being processed was read from, if its source
    /// has partitions (a Kafka source).
    pub fn partition(&self) -> Option<u32> {
        self.input.as_ref().and_then(|(input, _)| input.partition)
    }

    /// Emits `record` as it is (for example the input record, unchanged).
    #[inline]
    pub fn emit_record(&mut self, record: Record<'_>) {
        if let Some((input, encoded)) = &self.input
            && same_slice(record.value, input.value)
            && record.timestamp == input.timestamp
            && match (record.key, input.key) {
                (Some(a), Some(b)) => same_slice(a, b),
                (None, None) => true,
                _ => false,
            }
        {
            let encoded = encoded.clone();
            let (run, count) = &mut self.unchanged;
            if *count > 0 && run.end == encoded.start {
                run.end = encoded.end;
                *count += 1;
            } else {
                self.copy_unchanged();
                self.unchanged = (encoded, 1);
            }
            return;
        }
        self.emit_at(record.key, record.value, record.timestamp);
    }

    /// Copies the input records emitted unchanged so far to the output, so that what is
    /// emitted next follows them.
    #[inline]
    pub(crate) fn copy_unchanged(&mut self) {
        if self.unchanged.1 > 0 {
            let (run, count) = std::mem::take(&mut self.unchanged);
            self.rt.records.extend_encoded(&self.batch[run], count);
        }
    }

    /// Emits `value` as JSON text (what a sink with `format = "json"` or `"avro"`
    /// writes); the timestamp is as for [`emit`](Self::emit).
    pub fn emit_json<T: Serialize + ?Sized>(
        &mut self,
        key: Option<&[u8]>,
        value: &T,
    ) -> Result<()> {
        let bytes = serde_json::to_vec(value)
            .map_err(|e| Error::failed(format!("cannot write a value as JSON: {e}")))?;
        self.emit(key, &bytes);
        Ok(())
    }

    /// Emits `value` encoded with postcard, readable with [`Record::decode`]; the
    /// timestamp is as for [`emit`](Self::emit).
    pub fn emit_typed<T: Serialize + ?Sized>(
        &mut self,
        key: Option<&[u8]>,
        value: &T,
    ) -> Result<()> {
        let bytes = to_bytes(value)?;
        self.emit(key, &bytes);
        Ok(())
    }

    /// The timestamp [`emit`](Self::emit) gives records.
    pub fn timestamp(&self) -> Option<i64> {
        self.timestamp
    }

    shared_context_methods!();
}

impl From<crate::bindings::sluice::operator::types::OpenContext> for OpenInfo {
    fn from(ctx: crate::bindings::sluice::operator::types::OpenContext) -> Self {
        OpenInfo {
            job: ctx.job,
            operator_name: ctx.operator_name,
            config: Config::from_pairs(ctx.config),
            subtask_index: ctx.subtask_index,
            parallelism: ctx.parallelism,
            max_parallelism: ctx.max_parallelism,
            keyed: ctx.keyed,
            restored_state: ctx.restored_state,
            attempt: ctx.attempt,
            inputs: ctx
                .inputs
                .into_iter()
                .map(|i| Input {
                    name: i.name,
                    broadcast: i.broadcast,
                })
                .collect(),
        }
    }
}

/// True when `a` and `b` are the same bytes in memory (not just equal bytes).
fn same_slice(a: &[u8], b: &[u8]) -> bool {
    std::ptr::eq(a, b)
}
