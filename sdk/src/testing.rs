//! Run an operator natively in unit tests, the way the host runs it.
//!
//! [`Harness`] drives an [`Operator`] through the same glue as the Wasm exports: it encodes
//! input batches and timer lists, calls the hooks, decodes the records and effects the call
//! returns and applies the effects to an in-memory model of the host:
//!
//! - keyed state per `(state, key, map key)`, read as of the start of each call, with a
//!   call's effects applied in order only when it succeeds; list appends get increasing
//!   positions; entries of states with a time-to-live expire by the harness's processing
//!   time;
//! - event-time and processing-time timers, deduplicated and deletable, fired in time order
//!   when the watermark or the clock reaches them (before the watermark itself is
//!   processed), the due ones in one `on-timers` call as the host does; as in Flink, a
//!   timer deleted while an earlier one of the call is handled does not fire;
//! - counters and log lines.
//!
//! ```
//! # use sluice_sdk::{Context, OpenContext, Operator, Record, Result};
//! # struct Upper;
//! # impl Operator for Upper {
//! #     fn open(_: &mut OpenContext<'_>) -> Result<Self> { Ok(Upper) }
//! #     fn process(&mut self, r: Record<'_>, ctx: &mut Context<'_>) -> Result<()> {
//! #         ctx.emit(r.key, r.value_str()?.to_uppercase().as_bytes());
//! #         Ok(())
//! #     }
//! # }
//! use sluice_sdk::testing::Harness;
//!
//! let mut harness = Harness::<Upper>::builder().open()?;
//! harness.process_value("hello")?;
//! harness.process(Some("k"), "world", Some(42))?;
//! assert_eq!(harness.output_values_str(), ["HELLO", "WORLD"]);
//! assert_eq!(harness.output()[1].timestamp, Some(42));
//! # Ok::<(), sluice_sdk::Error>(())
//! ```
//!
//! Errors the operator returns come back as `Err`. A panic in the operator is an ordinary
//! Rust panic here (in Wasm it traps the instance), so test it with `#[should_panic]`.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::marker::PhantomData;

use serde::de::DeserializeOwned;
use sluice_codec::{
    BatchReader, BatchWriter, Effect, EffectReader, EntryWriter, TimeDomain, TimerWriter,
};

use crate::__rt::{self as rt, Slot};
use crate::context::{CallOutput, OpenInfo};
use crate::host::{Host, StateKind};
use crate::{Config, Error, Level, Operator, OwnedRecord, Record, Result, from_bytes};

/// A log line written by the operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// Its severity.
    pub level: Level,
    /// Its text.
    pub message: String,
}

/// The state of an operator as of a checkpoint: what its `snapshot` returned plus a copy of
/// its keyed state and timers. Restore it with [`HarnessBuilder::restore_from`].
#[derive(Clone)]
pub struct Snapshot {
    checkpoint_id: u64,
    operator_state: Vec<u8>,
    keyed: KeyedState,
}

impl Snapshot {
    /// The checkpoint this snapshot was taken for.
    pub fn checkpoint_id(&self) -> u64 {
        self.checkpoint_id
    }

    /// The bytes the operator's `snapshot` returned.
    pub fn operator_state(&self) -> &[u8] {
        &self.operator_state
    }
}

impl fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Snapshot")
            .field("checkpoint_id", &self.checkpoint_id)
            .field("operator_state_len", &self.operator_state.len())
            .field("states", &self.keyed.states.len())
            .field("entries", &self.keyed.entries.len())
            .field("event_timers", &self.keyed.event_timers.len())
            .field("processing_timers", &self.keyed.processing_timers.len())
            .finish()
    }
}

/// A keyed state as declared with the host.
#[derive(Debug, Clone)]
struct DeclaredState {
    name: String,
    kind: StateKind,
    ttl_ms: Option<u64>,
}

/// One stored entry of keyed state.
#[derive(Debug, Clone)]
struct Stored {
    value: Vec<u8>,
    /// Processing time of the last write, for TTL.
    written_at: i64,
}

/// State id, record key, user key (empty for value state, position for list state).
type EntryKey = (u32, Vec<u8>, Vec<u8>);

/// The part of the host's state that a checkpoint captures. State ids are indices into
/// `states`, so they stay valid across a restore.
#[derive(Debug, Clone, Default)]
struct KeyedState {
    states: Vec<DeclaredState>,
    entries: BTreeMap<EntryKey, Stored>,
    next_position: u64,
    event_timers: BTreeSet<(i64, Vec<u8>)>,
    processing_timers: BTreeSet<(i64, Vec<u8>)>,
}

/// The in-memory host.
#[derive(Debug)]
struct Store {
    keyed_input: bool,
    processing_time: i64,
    watermark: i64,
    /// Declared states may change only during `open`, through `&self`.
    states: RefCell<Vec<DeclaredState>>,
    opening: Cell<bool>,
    logs: RefCell<Vec<LogLine>>,
    entries: BTreeMap<EntryKey, Stored>,
    next_position: u64,
    event_timers: BTreeSet<(i64, Vec<u8>)>,
    processing_timers: BTreeSet<(i64, Vec<u8>)>,
    counters: BTreeMap<String, u64>,
    /// Side outputs declared in `open`.
    outputs: RefCell<Vec<String>>,
}

impl Store {
    fn is_live(&self, state: u32, stored: &Stored) -> bool {
        let ttl = self
            .states
            .borrow()
            .get(state as usize)
            .and_then(|s| s.ttl_ms);
        match ttl {
            None => true,
            Some(ttl) => {
                let ttl = i64::try_from(ttl).unwrap_or(i64::MAX);
                self.processing_time < stored.written_at.saturating_add(ttl)
            }
        }
    }

    /// Drops expired entries.
    fn expire(&mut self) {
        let expired: Vec<EntryKey> = self
            .entries
            .iter()
            .filter(|((state, _, _), stored)| !self.is_live(*state, stored))
            .map(|(k, _)| k.clone())
            .collect();
        for k in expired {
            self.entries.remove(&k);
        }
    }

    fn keyed_state(&self) -> KeyedState {
        KeyedState {
            states: self.states.borrow().clone(),
            entries: self
                .entries
                .iter()
                .filter(|((state, _, _), stored)| self.is_live(*state, stored))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            next_position: self.next_position,
            event_timers: self.event_timers.clone(),
            processing_timers: self.processing_timers.clone(),
        }
    }

    fn key_range(&self, state: u32, key: &[u8]) -> impl Iterator<Item = (&EntryKey, &Stored)> {
        self.entries
            .range((state, key.to_vec(), Vec::new())..)
            .take_while(move |((s, k, _), _)| *s == state && k.as_slice() == key)
    }

    fn state(&self, state: u32) -> Result<DeclaredState> {
        self.states
            .borrow()
            .get(state as usize)
            .cloned()
            .ok_or_else(|| Error::failed(format!("effect names undeclared state id {state}")))
    }

    fn timers(&mut self, domain: TimeDomain) -> &mut BTreeSet<(i64, Vec<u8>)> {
        match domain {
            TimeDomain::EventTime => &mut self.event_timers,
            TimeDomain::ProcessingTime => &mut self.processing_timers,
        }
    }

    /// Applies one effect of a successful call, as the host does.
    fn apply(&mut self, effect: Effect<'_>) -> Result<()> {
        let now = self.processing_time;
        match effect {
            Effect::Put {
                state,
                key,
                user_key,
                value,
            } => {
                self.state(state)?;
                let stored = Stored {
                    value: value.to_vec(),
                    written_at: now,
                };
                self.entries
                    .insert((state, key.to_vec(), user_key.to_vec()), stored);
            }
            Effect::Delete {
                state,
                key,
                user_key,
            } => {
                self.state(state)?;
                self.entries
                    .remove(&(state, key.to_vec(), user_key.to_vec()));
            }
            Effect::Clear { state, key } => {
                self.state(state)?;
                let doomed: Vec<EntryKey> =
                    self.key_range(state, key).map(|(k, _)| k.clone()).collect();
                for k in doomed {
                    self.entries.remove(&k);
                }
            }
            Effect::Append { state, key, value } => {
                let declared = self.state(state)?;
                if declared.kind != StateKind::List {
                    return Err(Error::failed(format!(
                        "append to state `{}`, which is not a list state",
                        declared.name
                    )));
                }
                // Big-endian, so that byte order is append order.
                let position = self.next_position.to_be_bytes().to_vec();
                self.next_position += 1;
                let stored = Stored {
                    value: value.to_vec(),
                    written_at: now,
                };
                self.entries.insert((state, key.to_vec(), position), stored);
            }
            Effect::RegisterTimer {
                domain,
                timestamp,
                key,
            } => {
                self.timers(domain).insert((timestamp, key.to_vec()));
            }
            Effect::DeleteTimer {
                domain,
                timestamp,
                key,
            } => {
                self.timers(domain).remove(&(timestamp, key.to_vec()));
            }
            Effect::Counter { name, delta } => {
                let name = String::from_utf8_lossy(name).into_owned();
                let counter = self.counters.entry(name).or_default();
                *counter = counter.saturating_add(delta);
            }
        }
        Ok(())
    }
}

/// The harness's answers to the SDK's host calls.
struct HarnessHost<'a>(&'a Store);

impl Host for HarnessHost<'_> {
    fn processing_time(&self) -> i64 {
        self.0.processing_time
    }

    fn current_watermark(&self) -> i64 {
        self.0.watermark
    }

    fn declare_state(
        &self,
        name: &str,
        kind: StateKind,
        ttl_ms: Option<u64>,
    ) -> Result<u32, String> {
        if !self.0.opening.get() {
            return Err("states can only be declared during open".to_owned());
        }
        if !self.0.keyed_input {
            return Err(
                "the operator's input is not keyed (set `key_by` in the job file)".to_owned(),
            );
        }
        let mut states = self.0.states.borrow_mut();
        if let Some(id) = states.iter().position(|s| s.name == name) {
            let existing = &mut states[id];
            if existing.kind != kind {
                return Err(format!(
                    "state `{name}` is already declared as {:?} state, not {kind:?}",
                    existing.kind
                ));
            }
            existing.ttl_ms = ttl_ms;
            return u32::try_from(id).map_err(|e| e.to_string());
        }
        states.push(DeclaredState {
            name: name.to_owned(),
            kind,
            ttl_ms,
        });
        u32::try_from(states.len() - 1).map_err(|e| e.to_string())
    }

    fn state_get(&self, state: u32, key: &[u8], user_key: &[u8]) -> Option<Vec<u8>> {
        self.0
            .entries
            .get(&(state, key.to_vec(), user_key.to_vec()))
            .filter(|stored| self.0.is_live(state, stored))
            .map(|stored| stored.value.clone())
    }

    fn state_entries(&self, state: u32, key: &[u8]) -> Vec<u8> {
        let mut entries = EntryWriter::new();
        for ((_, _, user_key), stored) in self.0.key_range(state, key) {
            if self.0.is_live(state, stored) {
                entries.push(user_key, &stored.value);
            }
        }
        entries.into_bytes()
    }

    fn declare_output(&self, name: &str) -> Result<u32, String> {
        if !self.0.opening.get() {
            return Err("side outputs can only be declared during open".to_owned());
        }
        let mut outputs = self.0.outputs.borrow_mut();
        if let Some(i) = outputs.iter().position(|o| o == name) {
            return Ok(i as u32 + 1);
        }
        outputs.push(name.to_owned());
        Ok(outputs.len() as u32)
    }

    fn log(&self, level: Level, message: &str) {
        self.0.logs.borrow_mut().push(LogLine {
            level,
            message: message.to_owned(),
        });
    }
}

/// Configures and opens a [`Harness`]. Defaults: no config, unkeyed input, subtask 0 of 1,
/// max parallelism 128, attempt 0, processing time 0, fresh state.
pub struct HarnessBuilder<T> {
    info: OpenInfo,
    config: Vec<(String, String)>,
    restore: Option<Snapshot>,
    processing_time: i64,
    max_output_bytes: usize,
    _operator: PhantomData<fn() -> T>,
}

/// What one call may return by default: the host's `max_output_mb` default, 64 MiB.
const MAX_OUTPUT_BYTES: usize = 64 << 20;

impl<T: Operator> HarnessBuilder<T> {
    fn new() -> Self {
        HarnessBuilder {
            info: OpenInfo {
                job: "test-job".to_owned(),
                operator_name: "test-operator".to_owned(),
                parallelism: 1,
                max_parallelism: 128,
                ..OpenInfo::default()
            },
            config: Vec::new(),
            restore: None,
            processing_time: 0,
            max_output_bytes: MAX_OUTPUT_BYTES,
            _operator: PhantomData,
        }
    }

    /// Sets config `key` to `value`.
    pub fn config(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.config.push((key.into(), value.into()));
        self
    }

    /// Whether the input is partitioned by key (required for keyed state).
    pub fn keyed(mut self, keyed: bool) -> Self {
        self.info.keyed = keyed;
        self
    }

    /// Makes this instance subtask `index` of `parallelism`.
    pub fn subtask(mut self, index: u32, parallelism: u32) -> Self {
        self.info.subtask_index = index;
        self.info.parallelism = parallelism;
        self
    }

    /// Sets the number of key groups.
    pub fn max_parallelism(mut self, max_parallelism: u32) -> Self {
        self.info.max_parallelism = max_parallelism;
        self
    }

    /// Sets the restart attempt the operator sees.
    pub fn attempt(mut self, attempt: u32) -> Self {
        self.info.attempt = attempt;
        self
    }

    /// Sets the job name.
    pub fn job(mut self, job: impl Into<String>) -> Self {
        self.info.job = job.into();
        self
    }

    /// Sets the operator's name.
    pub fn operator_name(mut self, name: impl Into<String>) -> Self {
        self.info.operator_name = name.into();
        self
    }

    /// Restores from `snapshot`: the operator gets its snapshot bytes in `open`, and the
    /// keyed state and timers are as they were.
    pub fn restore_from(mut self, snapshot: &Snapshot) -> Self {
        self.restore = Some(snapshot.clone());
        self
    }

    /// Adds an input (numbered from 0 in the order added), as a job file's `inputs`
    /// gives them; without any the operator has one input, `input`. Feed input `n` with
    /// [`Harness::process_on`] or [`Harness::process_batch_on`].
    pub fn input(mut self, name: impl Into<String>, broadcast: bool) -> Self {
        self.info.inputs.push(crate::context::Input {
            name: name.into(),
            broadcast,
        });
        self
    }

    /// Sets the processing time (milliseconds) the harness starts at.
    pub fn processing_time(mut self, start: i64) -> Self {
        self.processing_time = start;
        self
    }

    /// Sets how many bytes of records and effects one call may return (the host's
    /// `max_output_mb`; 64 MiB by default): a call that returns more fails, as on the host.
    pub fn max_output_bytes(mut self, bytes: usize) -> Self {
        self.max_output_bytes = bytes;
        self
    }

    /// Opens the operator.
    ///
    /// # Errors
    ///
    /// The error the operator's `open` returned.
    pub fn open(self) -> Result<Harness<T>> {
        let mut info = self.info;
        info.config = Config::from_pairs(self.config);
        if info.inputs.is_empty() {
            info.inputs.push(crate::context::Input {
                name: "input".to_owned(),
                broadcast: false,
            });
        }
        let inputs = info.inputs.len() as u32;
        let keyed = match self.restore {
            Some(snapshot) => {
                info.restored_state = Some(snapshot.operator_state);
                snapshot.keyed
            }
            None => KeyedState::default(),
        };
        let mut harness = Harness {
            slot: Slot::new(),
            store: Store {
                keyed_input: info.keyed,
                processing_time: self.processing_time,
                watermark: i64::MIN,
                states: RefCell::new(keyed.states),
                opening: Cell::new(true),
                logs: RefCell::new(Vec::new()),
                entries: keyed.entries,
                next_position: keyed.next_position,
                event_timers: keyed.event_timers,
                processing_timers: keyed.processing_timers,
                counters: BTreeMap::new(),
                outputs: RefCell::new(Vec::new()),
            },
            output: Vec::new(),
            side: Vec::new(),
            raw_output: Vec::new(),
            logs: Vec::new(),
            inputs,
            max_output_bytes: self.max_output_bytes,
        };
        let opened = harness.call(|slot, host| rt::open(slot, host, &info));
        harness.store.opening.set(false);
        opened?;
        harness.store.expire();
        Ok(harness)
    }
}

/// Runs one operator instance natively; see the [module docs](self).
pub struct Harness<T: Operator> {
    slot: Slot<T>,
    store: Store,
    output: Vec<OwnedRecord>,
    /// Records sent to side outputs, with the output's number.
    side: Vec<(u32, OwnedRecord)>,
    /// Encoded outputs of `process_with_headers`.
    raw_output: Vec<Vec<u8>>,
    logs: Vec<LogLine>,
    /// How many inputs the operator has.
    inputs: u32,
    max_output_bytes: usize,
}

impl<T: Operator> Harness<T> {
    /// A builder for a harness running `T`.
    pub fn builder() -> HarnessBuilder<T> {
        HarnessBuilder::new()
    }

    /// Runs one host call and, if it succeeds, takes in its records and applies its effects.
    fn call(
        &mut self,
        f: impl FnOnce(&mut Slot<T>, &dyn Host) -> Result<CallOutput>,
    ) -> Result<()> {
        let result = f(&mut self.slot, &HarnessHost(&self.store));
        self.logs.append(&mut self.store.logs.borrow_mut());
        let output = result?;
        // As the host: a call that returns more than the limit fails, and nothing of it
        // counts.
        let size = output.records.len() + output.effects.len();
        if size > self.max_output_bytes {
            return Err(Error::failed(format!(
                "returned {size} bytes of records and effects from one call; the limit is {}",
                self.max_output_bytes
            )));
        }
        // The harness shows keyed state as the host holds it at a checkpoint: written
        // back after every call.
        let written_back = rt::write_back(&mut self.slot);
        self.apply_effects(&written_back)?;
        let records = BatchReader::new(&output.records)
            .map(|r| r.map(|r| (r.output, Record::from(r).to_owned_record())))
            .collect::<Result<Vec<_>, _>>()?;
        let effects = EffectReader::new(&output.effects).collect::<Result<Vec<_>, _>>()?;
        for effect in effects {
            self.store.apply(effect)?;
        }
        for (output, record) in records {
            if output == 0 {
                self.output.push(record);
            } else {
                self.side.push((output, record));
            }
        }
        Ok(())
    }

    fn apply_effects(&mut self, effects: &[u8]) -> Result<()> {
        for effect in EffectReader::new(effects) {
            self.store.apply(effect?)?;
        }
        Ok(())
    }

    /// Takes the records sent to side output `name` so far.
    pub fn take_side_output(&mut self, name: &str) -> Vec<OwnedRecord> {
        let Some(i) = self.store.outputs.borrow().iter().position(|o| o == name) else {
            return Vec::new();
        };
        let id = i as u32 + 1;
        let (taken, kept) = std::mem::take(&mut self.side)
            .into_iter()
            .partition(|(o, _)| *o == id);
        self.side = kept;
        taken.into_iter().map(|(_, r)| r).collect()
    }

    /// Processes `records` as one batch with `watermarks` among them (`(before,
    /// watermark)`: the watermark arrived before record number `before`), as the host
    /// gives a batch: event-time timers fire at the watermark that makes them due, before
    /// the records after it — the same as records and watermarks one at a time.
    pub fn process_batch<'r>(
        &mut self,
        records: impl IntoIterator<Item = Record<'r>>,
        watermarks: &[(usize, i64)],
    ) -> Result<()> {
        self.process_batch_on(0, records, watermarks)
    }

    /// [`process_batch`](Self::process_batch) for input number `input` (see
    /// [`HarnessBuilder::input`]).
    ///
    /// # Panics
    ///
    /// If the operator has no input `input`: a mistake of the test.
    pub fn process_batch_on<'r>(
        &mut self,
        input: u32,
        records: impl IntoIterator<Item = Record<'r>>,
        watermarks: &[(usize, i64)],
    ) -> Result<()> {
        assert!(
            input < self.inputs,
            "the operator has {} inputs; there is no input {input}",
            self.inputs
        );
        let records: Vec<Record<'r>> = records.into_iter().collect();
        let (mut first, mut k) = (0, 0);
        // The first watermark from `from` on that makes a registered timer due.
        let due = |store: &Store, from: usize| {
            let next = store.event_timers.first()?.0;
            watermarks[from..]
                .iter()
                .position(|&(_, w)| w > store.watermark && w >= next)
                .map(|j| from + j)
        };
        while first < records.len() || k < watermarks.len() {
            let mut cut = due(&self.store, k);
            if let Some(j) = cut
                && watermarks[j].0 <= first
            {
                self.store.watermark = watermarks[j].1;
                self.fire_timers(TimeDomain::EventTime, watermarks[j].1)?;
                cut = due(&self.store, j + 1);
            }
            let (end, wm_end) = cut.map_or((records.len(), watermarks.len()), |j| {
                (watermarks[j].0.min(records.len()), j)
            });
            let mut batch = BatchWriter::new();
            for record in &records[first..end] {
                batch.push(record.key, record.value, record.timestamp);
            }
            let batch = batch.into_bytes();
            let given: Vec<(u32, i64)> = watermarks[k..wm_end]
                .iter()
                .map(|&(before, w)| (before.saturating_sub(first) as u32, w))
                .collect();
            let mut stopped = None;
            self.call(|slot, host| {
                let p = rt::process(slot, host, input, &batch, &given)?;
                stopped = p.stopped_at.map(|s| s as usize);
                Ok(p.output)
            })?;
            let (handled, handled_wms) = match stopped {
                Some(s) => (given[s].0 as usize, s),
                None => (end - first, given.len()),
            };
            if let Some(&(_, w)) = given[..handled_wms].last() {
                self.store.watermark = self.store.watermark.max(w);
            }
            first += handled;
            k += handled_wms;
        }
        Ok(())
    }

    /// Processes one record, as a batch of one.
    pub fn process<K: AsRef<[u8]>>(
        &mut self,
        key: Option<K>,
        value: impl AsRef<[u8]>,
        timestamp: Option<i64>,
    ) -> Result<()> {
        self.process_on(0, key, value, timestamp)
    }

    /// Processes one record of input number `input` (see [`HarnessBuilder::input`]), as
    /// a batch of one.
    ///
    /// # Panics
    ///
    /// If the operator has no input `input`: a mistake of the test.
    pub fn process_on<K: AsRef<[u8]>>(
        &mut self,
        input: u32,
        key: Option<K>,
        value: impl AsRef<[u8]>,
        timestamp: Option<i64>,
    ) -> Result<()> {
        let record = Record {
            key: key.as_ref().map(AsRef::as_ref),
            value: value.as_ref(),
            timestamp,
        };
        self.process_batch_on(input, [record], &[])
    }

    /// Processes one record with headers (as a Kafka source gives them) and a source
    /// partition, as a batch of one.
    pub fn process_with_headers(
        &mut self,
        record: Record<'_>,
        headers: &[(&str, &str)],
        partition: Option<u32>,
    ) -> Result<()> {
        let headers =
            sluice_codec::encode_headers(headers.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())));
        let mut batch = BatchWriter::new();
        batch.push_record(sluice_codec::RecordRef {
            key: record.key,
            value: record.value,
            timestamp: record.timestamp,
            headers: Some(sluice_codec::Headers::decode(&headers)?),
            partition,
            output: 0,
        });
        let batch = batch.into_bytes();
        let mut output = Vec::new();
        self.call(|slot, host| {
            let p = rt::process(slot, host, 0, &batch, &[])?;
            output.clone_from(&p.output.records);
            Ok(p.output)
        })?;
        self.raw_output.push(output);
        Ok(())
    }

    /// The encoded output batches of the calls made with
    /// [`process_with_headers`](Self::process_with_headers), for checking what records
    /// carry besides key, value and timestamp.
    pub fn take_raw_output(&mut self) -> Vec<Vec<u8>> {
        std::mem::take(&mut self.raw_output)
    }

    /// Processes one record without key and timestamp.
    pub fn process_value(&mut self, value: impl AsRef<[u8]>) -> Result<()> {
        self.process(None::<&[u8]>, value, None)
    }

    /// Processes `records` as one batch (one `process` call).
    pub fn process_records<'r>(
        &mut self,
        records: impl IntoIterator<Item = Record<'r>>,
    ) -> Result<()> {
        let mut batch = BatchWriter::new();
        for record in records {
            batch.push(record.key, record.value, record.timestamp);
        }
        let batch = batch.into_bytes();
        self.call(|slot, host| rt::process(slot, host, 0, &batch, &[]).map(|p| p.output))
    }

    /// Advances the watermark to `watermark`: fires the due event-time timers through
    /// `on_timer` (in time order, repeating while timers fired so register more due ones),
    /// then calls `process_watermark`. A watermark that does not advance is ignored, as
    /// the host never sends one.
    pub fn process_watermark(&mut self, watermark: i64) -> Result<()> {
        if watermark <= self.store.watermark {
            return Ok(());
        }
        self.store.watermark = watermark;
        self.fire_timers(TimeDomain::EventTime, watermark)?;
        self.call(|slot, host| rt::process_watermark(slot, host, watermark))
    }

    /// Sets the processing time (never backwards), expires state past its time-to-live and
    /// fires the due processing-time timers.
    pub fn set_processing_time(&mut self, now: i64) -> Result<()> {
        self.store.processing_time = self.store.processing_time.max(now);
        self.store.expire();
        self.fire_timers(TimeDomain::ProcessingTime, self.store.processing_time)
    }

    /// Advances the processing time by `millis`; see [`set_processing_time`](Self::set_processing_time).
    pub fn advance_processing_time(&mut self, millis: i64) -> Result<()> {
        self.set_processing_time(self.store.processing_time.saturating_add(millis))
    }

    /// Fires the timers of `domain` due at `up_to`, in batches of what is due, until none is.
    fn fire_timers(&mut self, domain: TimeDomain, up_to: i64) -> Result<()> {
        loop {
            let timers = self.store.timers(domain);
            let due = match up_to.checked_add(1) {
                Some(later) => {
                    let later = timers.split_off(&(later, Vec::new()));
                    std::mem::replace(timers, later)
                }
                None => std::mem::take(timers),
            };
            if due.is_empty() {
                return Ok(());
            }
            let mut encoded = TimerWriter::new();
            for (timestamp, key) in &due {
                encoded.push(domain, *timestamp, key);
            }
            let encoded = encoded.into_bytes();
            if let Err(e) = self.call(|slot, host| rt::on_timers(slot, host, &encoded)) {
                // The failed call changed nothing: the timers are still registered.
                self.store.timers(domain).extend(due);
                return Err(e);
            }
        }
    }

    /// Takes checkpoint `checkpoint_id`: calls `snapshot` and copies the keyed state and
    /// timers.
    pub fn snapshot(&mut self, checkpoint_id: u64) -> Result<Snapshot> {
        let (operator_state, effects) = rt::snapshot(&mut self.slot, checkpoint_id)?;
        let size = operator_state.len() + effects.len();
        if size > self.max_output_bytes {
            return Err(Error::failed(format!(
                "returned {size} bytes of operator state and effects from `snapshot`; the \
                 limit is {} (keep large state in keyed state)",
                self.max_output_bytes
            )));
        }
        self.apply_effects(&effects)?;
        Ok(Snapshot {
            checkpoint_id,
            operator_state,
            keyed: self.store.keyed_state(),
        })
    }

    /// Calls `notify_complete`.
    pub fn notify_complete(&mut self, checkpoint_id: u64) -> Result<()> {
        rt::notify_complete(&mut self.slot, checkpoint_id)
    }

    /// Calls `notify_aborted`.
    pub fn notify_aborted(&mut self, checkpoint_id: u64) -> Result<()> {
        rt::notify_aborted(&mut self.slot, checkpoint_id)
    }

    /// Ends the input: advances event time to the end (firing every event-time timer and
    /// processing the final watermark `i64::MAX`), then calls `finish`.
    pub fn finish(&mut self) -> Result<()> {
        self.process_watermark(i64::MAX)?;
        self.call(|slot, host| rt::finish(slot, host))
    }

    /// Calls `close`.
    pub fn close(&mut self) -> Result<()> {
        self.call(|slot, host| rt::close(slot, host))
    }

    /// Calls `dispose`; afterwards every call fails. Dropping the harness disposes too.
    pub fn dispose(&mut self) {
        rt::dispose(&mut self.slot);
    }

    /// The records emitted so far, in order.
    pub fn output(&self) -> &[OwnedRecord] {
        &self.output
    }

    /// Takes the records emitted so far.
    pub fn take_output(&mut self) -> Vec<OwnedRecord> {
        std::mem::take(&mut self.output)
    }

    /// The values of the records emitted so far, as text (invalid UTF-8 replaced).
    pub fn output_values_str(&self) -> Vec<String> {
        self.output
            .iter()
            .map(|r| String::from_utf8_lossy(&r.value).into_owned())
            .collect()
    }

    /// The counters the operator added to.
    pub fn counters(&self) -> &BTreeMap<String, u64> {
        &self.store.counters
    }

    /// The value of counter `name` (0 if never added to).
    pub fn counter(&self, name: &str) -> u64 {
        self.store.counters.get(name).copied().unwrap_or(0)
    }

    /// The log lines written so far.
    pub fn logs(&self) -> &[LogLine] {
        &self.logs
    }

    /// The operator, while it is open.
    pub fn operator(&self) -> Option<&T> {
        self.slot.operator()
    }

    /// The current processing time.
    pub fn processing_time(&self) -> i64 {
        self.store.processing_time
    }

    /// The current watermark (`i64::MIN` before the first).
    pub fn watermark(&self) -> i64 {
        self.store.watermark
    }

    /// The registered timers of `domain` that have not fired, as `(time, key)` in firing
    /// order.
    pub fn timers(&self, domain: TimeDomain) -> Vec<(i64, Vec<u8>)> {
        match domain {
            TimeDomain::EventTime => &self.store.event_timers,
            TimeDomain::ProcessingTime => &self.store.processing_timers,
        }
        .iter()
        .cloned()
        .collect()
    }

    /// The live entries of state `state` for `key` as the host holds them (map keys for map
    /// state, 8-byte positions for list state, empty for value state), in order.
    pub fn state_entries(&self, state: &str, key: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        let Some(id) = self.state_id(state) else {
            return Vec::new();
        };
        self.store
            .key_range(id, key)
            .filter(|(_, stored)| self.store.is_live(id, stored))
            .map(|((_, _, user_key), stored)| (user_key.clone(), stored.value.clone()))
            .collect()
    }

    /// The value of value state `state` for `key` as the host holds it.
    pub fn state_value<V: DeserializeOwned>(&self, state: &str, key: &[u8]) -> Result<Option<V>> {
        self.state_entries(state, key)
            .first()
            .map(|(_, value)| from_bytes(value))
            .transpose()
    }

    fn state_id(&self, name: &str) -> Option<u32> {
        let states = self.store.states.borrow();
        let id = states.iter().position(|s| s.name == name)?;
        u32::try_from(id).ok()
    }
}

impl<T: Operator> Drop for Harness<T> {
    fn drop(&mut self) {
        // Unless a test is already failing: a second panic from `dispose` would abort.
        if !std::thread::panicking() {
            self.dispose();
        }
    }
}

impl<T: Operator> fmt::Debug for Harness<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Harness")
            .field("processing_time", &self.store.processing_time)
            .field("watermark", &self.store.watermark)
            .field("output", &self.output.len())
            .finish_non_exhaustive()
    }
}
