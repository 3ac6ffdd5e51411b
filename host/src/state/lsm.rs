//! Keyed state in an embedded LSM tree (RocksDB), for state larger than memory.
//!
//! One database per operator instance, in a working folder of its own. A key is its key
//! group (two bytes, big-endian) and then the composite key the heap backend and the
//! checkpoint format use (`state id ‖ key length ‖ key ‖ user key`), so one key group is
//! one contiguous key range and one `(state, key)` is one prefix; a value is the write's
//! processing time (eight bytes, little-endian) and then the operator's bytes. The
//! instance's timers are entries too, in its keys' groups under reserved state ids
//! (`lsm/timers.rs`): on disk, checkpointed and rescaled with the state.
//!
//! There is no write-ahead log: durability is the checkpoint's. The synchronous part of a
//! checkpoint only switches the memtable (RocksDB's flush without waiting: the memtable
//! becomes immutable and is written to a table file in the background), closes the
//! instance's *link gate* and starts a thread that waits for that flush, hard-links the
//! database's table files into a folder of their own (RocksDB's checkpoint, without a
//! flush of its own) and opens the gate (`lsm/link.rs`). The asynchronous part waits
//! for the link and copies only the table files no earlier checkpoint holds into the
//! checkpoint storage (`lsm/files.rs`).
//!
//! The files linked hold exactly the state as of the barrier because nothing written
//! after it reaches a table file before the link: the instance switches memtables itself
//! (when the active one holds `switch_bytes`), never while the gate is closed, and RocksDB's
//! own limit (`write_buffer_size`) sits above what one call can add to that, so RocksDB
//! never switches on its own. A call that finds the memtable full while the gate is closed
//! waits for the link (tens of milliseconds, a flush's time): backpressure, not loss.
//!
//! Memory is a fixed budget per instance (`[state] memory_mb`): a block cache with the
//! index and filter blocks in it, and the memtables the instance switches, both
//! charged to the instance (and its tenant) as keyed state from the moment it opens.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result};
use parking_lot::{Mutex, RwLock};
use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamilyDescriptor, DB, DEFAULT_COLUMN_FAMILY_NAME, Direction,
    FlushOptions, IteratorMode, Options, ReadOptions, WriteBatch, WriteOptions,
    compaction_filter::Decision, properties,
};
use sluice_codec::{EntryWriter, TimeDomain, TimerWriter};

use super::backend::{StateDescriptor, StateError, StateKind};
use crate::timers::TimerQueues;

mod arena;
mod files;
mod link;
mod pending;
mod prefetch;
mod timer_store;
mod timers;
pub use files::{DbFile, LsmFiles, LsmSnapshot, Place, SharedFolder};
use link::{LinkGate, PendingLink, Store};
use pending::Pending;
use prefetch::Prefetched;
pub(crate) use timer_store::read_timers;
pub use timers::decode as timer_of;
use timers::{Head, Heads, Known};

/// How an instance's database is set up.
#[derive(Debug, Clone)]
pub struct LsmConfig {
    /// The instance's working folder (created; deleted when the backend is dropped).
    pub dir: PathBuf,
    /// Memory for its block cache and memtables, in bytes.
    pub memory_bytes: u64,
    /// Where its checkpoints keep table files, when the job checkpoints.
    pub shared: Option<SharedFolder>,
}

/// The least memory an instance's database may be given.
pub const MIN_MEMORY_BYTES: u64 = 8 << 20;

/// Keyed state of one operator instance in RocksDB.
pub struct LsmBackend {
    /// The database and its working folder, shared with the asynchronous part of a
    /// checkpoint until it has linked its files.
    store: Arc<Store>,
    /// Closed from a checkpoint's memtable switch until its files are linked.
    gate: Arc<LinkGate>,
    /// The active memtable is switched once it holds this many bytes.
    switch_bytes: u64,
    config: LsmConfig,
    max_parallelism: u32,
    key_groups: Range<u32>,
    descriptors: Vec<StateDescriptor>,
    /// The states' TTLs by id, for the compaction filter (which runs on RocksDB's threads).
    ttls: Arc<RwLock<Vec<Option<u64>>>>,
    write: WriteOptions,
    /// Reused to build keys.
    key: Vec<u8>,
    /// Reused to build values.
    value: Vec<u8>,
    /// Puts and deletes not yet written: the effects of the call being applied.
    pending: Pending,
    /// Timers registered and deleted, not yet written (apart from `pending`, whose reads
    /// of single entries look through what it holds).
    timer_writes: Pending,
    /// The earliest timers, as far as known.
    timers: Heads,
    /// Timers registered lately, so registering one again writes nothing.
    known_timers: Known,
    /// Per domain (event, processing): the timers before this time are not in the
    /// database but on the heap, in the operator's queues; those at or after it are here.
    near_until: [i64; 2],
    /// Value states of the keys of the batch being processed, read before the call.
    prefetched: Prefetched,
    /// Table files of this database already in the shared folder, by their name here.
    uploaded: Arc<Mutex<BTreeMap<String, DbFile>>>,
    /// Local checkpoints taken, to name each one's folder uniquely.
    checkpoints: u64,
}

impl std::fmt::Debug for LsmBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LsmBackend")
            .field("dir", &self.config.dir)
            .field("key_groups", &self.key_groups)
            .finish_non_exhaustive()
    }
}

/// The database's folder inside an instance's working folder.
const DB_DIR: &str = "db";

/// Bytes before the composite key: the key group.
const GROUP_BYTES: usize = 2;

/// Bytes before the operator's value: the write's time.
const TIME_BYTES: usize = 8;

impl LsmBackend {
    /// An empty database for the key groups `key_groups` out of `max_parallelism`.
    pub fn open(config: LsmConfig, max_parallelism: u32, key_groups: Range<u32>) -> Result<Self> {
        Self::open_with(config, max_parallelism, key_groups, Vec::new())
    }

    /// Opens the database in `config.dir` (new, or a restored one put there), knowing
    /// `uploaded`: the table files of it the shared folder already holds.
    fn open_with(
        config: LsmConfig,
        max_parallelism: u32,
        key_groups: Range<u32>,
        uploaded: Vec<DbFile>,
    ) -> Result<Self> {
        let ttls: Arc<RwLock<Vec<Option<u64>>>> = Arc::default();
        let options = options(config.memory_bytes, ttls.clone());
        let path = config.dir.join(DB_DIR);
        // Opened with its default column family named, so that a handle to it exists
        // (multi-gets need one).
        let default = ColumnFamilyDescriptor::new(DEFAULT_COLUMN_FAMILY_NAME, options.clone());
        let db = DB::open_cf_descriptors(&options, &path, [default])
            .with_context(|| format!("opening the state database in {}", path.display()))?;
        let mut write = WriteOptions::default();
        write.disable_wal(true);
        Ok(LsmBackend {
            store: Arc::new(Store::new(db, config.dir.clone())),
            gate: Arc::default(),
            switch_bytes: switch_bytes(config.memory_bytes),
            max_parallelism,
            descriptors: Vec::new(),
            ttls,
            write,
            key: Vec::new(),
            value: Vec::new(),
            pending: Pending::default(),
            timer_writes: Pending::default(),
            timers: Heads::unknown(key_groups.clone()),
            known_timers: Known::new(known_timer_bytes(config.memory_bytes)),
            // No timer is in a new database: all may be on the heap.
            near_until: [i64::MAX; 2],
            key_groups,
            prefetched: Prefetched::default(),
            uploaded: Arc::new(Mutex::new(
                uploaded.into_iter().map(|f| (f.name.clone(), f)).collect(),
            )),
            checkpoints: 0,
            config,
        })
    }

    /// Number of key groups of the job.
    pub fn max_parallelism(&self) -> u32 {
        self.max_parallelism
    }

    /// The key groups this backend holds.
    pub fn key_groups(&self) -> Range<u32> {
        self.key_groups.clone()
    }

    /// Declared states, indexed by id.
    pub fn descriptors(&self) -> &[StateDescriptor] {
        &self.descriptors
    }

    /// Declares a state or returns the id it already has, as the heap backend does.
    pub fn declare(&mut self, descriptor: StateDescriptor) -> Result<u32, String> {
        let (id, _) = super::backend::declare_in(&mut self.descriptors, descriptor)?;
        *self.ttls.write() = self.descriptors.iter().map(|d| d.ttl_ms).collect();
        Ok(id)
    }

    /// The memory the instance holds for its state: its database's budget.
    pub fn bytes(&self) -> u64 {
        self.config.memory_bytes
    }

    /// RocksDB's estimate of the number of entries.
    pub fn len(&self) -> usize {
        self.store
            .db
            .property_int_value(properties::ESTIMATE_NUM_KEYS)
            .ok()
            .flatten()
            .unwrap_or(0) as usize
    }

    /// True when the estimate is no entries.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of its files on disk.
    pub fn disk_bytes(&self) -> u64 {
        self.store
            .db
            .property_int_value(properties::TOTAL_SST_FILES_SIZE)
            .ok()
            .flatten()
            .unwrap_or(0)
    }

    fn descriptor(&self, state: u32) -> Result<&StateDescriptor, StateError> {
        self.descriptors
            .get(state as usize)
            .ok_or(StateError::UnknownState(state))
    }

    fn group_of(&self, key: &[u8]) -> Result<u32, StateError> {
        super::backend::owned_key_group(key, self.max_parallelism, &self.key_groups)
    }

    /// Builds `kg ‖ state ‖ key length ‖ key ‖ user_key` in `self.key`.
    fn compose(&mut self, state: u32, key: &[u8], user_key: &[u8]) -> Result<(), StateError> {
        let kg = self.group_of(key)?;
        compose(&mut self.key, kg, state, key, user_key);
        Ok(())
    }

    /// Reads one entry; `None` when absent or expired at `now`.
    pub fn get(
        &self,
        state: u32,
        key: &[u8],
        user_key: &[u8],
        now: i64,
    ) -> Result<Option<Vec<u8>>, StateError> {
        let ttl = self.descriptor(state)?.ttl_ms;
        let mut k = Vec::with_capacity(GROUP_BYTES + 8 + key.len() + user_key.len());
        compose(&mut k, self.group_of(key)?, state, key, user_key);
        let live = |v: &[u8]| {
            let (written_at, value) = split_value(v)?;
            alive(written_at, ttl, now).then(|| value.to_vec())
        };
        if let Some(held) = self.pending.get(&k) {
            return Ok(held.and_then(live));
        }
        if user_key.is_empty()
            && let Some(read) = self.prefetched.get(&k)
        {
            return Ok(read.and_then(live));
        }
        let found = self.store.db.get_pinned(&k).map_err(storage_error)?;
        Ok(found.and_then(|v| live(&v)))
    }

    /// Writes the puts and deletes held so far to the database, in one batch in key
    /// order. The chain calls it once a call's effects are applied; reads of more than
    /// one entry call it first.
    pub fn commit(&mut self) -> Result<(), StateError> {
        if self.pending.is_empty() && self.timer_writes.is_empty() {
            return Ok(());
        }
        // What was read ahead may be about to change.
        self.prefetched.forget();
        let mut batch = WriteBatch::default();
        self.pending.drain_into(&mut batch);
        self.timer_writes.drain_into(&mut batch);
        self.store
            .db
            .write_opt(batch, &self.write)
            .map_err(storage_error)?;
        let active = (self.store.db)
            .property_int_value(properties::CUR_SIZE_ACTIVE_MEM_TABLE)
            .map_err(storage_error)?
            .unwrap_or(0);
        if active >= self.switch_bytes {
            // Not while a checkpoint's files are being linked: what goes into a table
            // file now must not be written after its barrier.
            self.gate.wait();
            self.switch_memtable()?;
        }
        Ok(())
    }

    /// Makes the active memtable immutable, to be written to a table file in the
    /// background (RocksDB's flush, without waiting for it).
    fn switch_memtable(&mut self) -> Result<(), StateError> {
        let mut flush = FlushOptions::default();
        flush.set_wait(false);
        self.store.db.flush_opt(&flush).map_err(storage_error)
    }

    /// Reads the value states of the keys of `records` (an encoded batch) in one
    /// multi-get, for the call about to process them: its `state-get`s of them are
    /// answered from what was read, until the call's effects are committed.
    pub fn prefetch(&mut self, records: &[u8]) -> Result<(), StateError> {
        self.prefetched.forget();
        let values: Vec<u32> = (self.descriptors.iter().enumerate())
            .filter(|(_, d)| d.kind == StateKind::Value)
            .map(|(id, _)| id as u32)
            .collect();
        if values.is_empty() || !self.pending.is_empty() || !self.prefetched.wanted() {
            return Ok(());
        }
        let mut keys: Vec<Vec<u8>> = Vec::new();
        for record in sluice_codec::BatchReader::new(records) {
            let Ok(record) = record else { break };
            // Keys of other subtasks' groups: the call's own reads fail on them.
            let Some((key, kg)) = record.key.and_then(|k| Some((k, self.group_of(k).ok()?))) else {
                continue;
            };
            for &state in &values {
                let mut k = Vec::new();
                compose(&mut k, kg, state, key, &[]);
                keys.push(k);
            }
        }
        keys.sort_unstable();
        keys.dedup();
        let Some(cf) = self.store.db.cf_handle(DEFAULT_COLUMN_FAMILY_NAME) else {
            return Ok(());
        };
        let read = ReadOptions::default();
        let found = self
            .store
            .db
            .batched_multi_get_cf_opt(cf, &keys, true, &read);
        for (key, value) in keys.iter().zip(found) {
            let value = value.map_err(storage_error)?;
            self.prefetched.push(key, value.as_deref());
        }
        Ok(())
    }

    /// All live entries of `(state, key)` in the `entries` encoding, by user key.
    pub fn entries(&mut self, state: u32, key: &[u8], now: i64) -> Result<Vec<u8>, StateError> {
        self.commit()?;
        let ttl = self.descriptor(state)?.ttl_ms;
        let mut prefix = Vec::new();
        compose(&mut prefix, self.group_of(key)?, state, key, &[]);
        let mut out = EntryWriter::new();
        self.scan_prefix(&prefix, |user_key, written_at, value| {
            if alive(written_at, ttl, now) {
                out.push(user_key, value);
            }
        })?;
        Ok(out.into_bytes())
    }

    /// Calls `f(user key, written at, value)` for every entry under `prefix`, in order.
    fn scan_prefix(
        &self,
        prefix: &[u8],
        mut f: impl FnMut(&[u8], i64, &[u8]),
    ) -> Result<(), StateError> {
        let mut read = ReadOptions::default();
        if let Some(end) = successor(prefix) {
            read.set_iterate_upper_bound(end);
        }
        let mut it = self.store.db.raw_iterator_opt(read);
        it.seek(prefix);
        while let (Some(k), Some(v)) = (it.key(), it.value()) {
            if let Some((written_at, value)) = split_value(v) {
                f(&k[prefix.len()..], written_at, value);
            }
            it.next();
        }
        it.status().map_err(storage_error)
    }

    /// Sets one entry.
    pub fn put(
        &mut self,
        state: u32,
        key: &[u8],
        user_key: &[u8],
        value: &[u8],
        now: i64,
    ) -> Result<(), StateError> {
        self.descriptor(state)?;
        self.compose(state, key, user_key)?;
        encode_value(&mut self.value, now, value);
        self.pending.put(&self.key, &self.value);
        if self.pending.bytes() >= pending::FLUSH_BYTES {
            self.commit()?;
        }
        Ok(())
    }

    /// Removes one entry.
    pub fn delete(&mut self, state: u32, key: &[u8], user_key: &[u8]) -> Result<(), StateError> {
        self.descriptor(state)?;
        self.compose(state, key, user_key)?;
        self.pending.delete(&self.key);
        Ok(())
    }

    /// Removes every entry of `(state, key)`.
    pub fn clear(&mut self, state: u32, key: &[u8]) -> Result<(), StateError> {
        self.commit()?;
        self.descriptor(state)?;
        self.compose(state, key, &[])?;
        let prefix = self.key.clone();
        let mut keys = Vec::new();
        self.scan_prefix(&prefix, |user_key, _, _| {
            let mut k = prefix.clone();
            k.extend_from_slice(user_key);
            keys.push(k);
        })?;
        // Through the held writes, so the memtable is switched as after any write.
        for k in keys {
            self.pending.delete(&k);
        }
        self.commit()
    }

    /// Appends an element to a list state, at the position after its last one
    /// (big-endian, so user-key order is append order), as the heap backend does.
    pub fn append(
        &mut self,
        state: u32,
        key: &[u8],
        value: &[u8],
        now: i64,
    ) -> Result<(), StateError> {
        self.commit()?;
        let d = self.descriptor(state)?;
        if d.kind != StateKind::List {
            return Err(StateError::WrongKind {
                state: d.name.clone(),
                kind: d.kind,
                operation: "append",
            });
        }
        self.compose(state, key, &[])?;
        let prefix = self.key.clone();
        let mut read = ReadOptions::default();
        read.set_iterate_lower_bound(prefix.clone());
        if let Some(end) = successor(&prefix) {
            read.set_iterate_upper_bound(end);
        }
        let mut it = self.store.db.raw_iterator_opt(read);
        it.seek_to_last();
        let next = match it.key() {
            // An element under the empty user key sorts first: the list goes on at 0.
            Some(last) => match &last[prefix.len()..] {
                [] => 0,
                pos => u64::from_be_bytes(pos.try_into().unwrap_or([0xff; 8])).saturating_add(1),
            },
            None => {
                it.status().map_err(storage_error)?;
                0
            }
        };
        drop(it);
        self.put(state, key, &next.to_be_bytes(), value, now)
    }

    /// Entries are dropped when read after their TTL and by compaction: nothing to do
    /// per call.
    pub fn expire_some(&mut self, _now: i64, _budget: usize) -> usize {
        0
    }

    /// The synchronous part of checkpoint `id`: switches the memtable and starts the link
    /// (see the module docs). The asynchronous part copies from the folder linked and
    /// then deletes it.
    pub fn snapshot(&mut self, id: u64, now: i64) -> Result<LsmSnapshot> {
        self.commit()
            .context("writing the state before a checkpoint")?;
        // The last checkpoint's link first: until then nothing may reach a table file.
        self.gate.wait();
        self.switch_memtable()
            .context("switching the memtable for a checkpoint")?;
        self.checkpoints += 1;
        let local = self
            .config
            .dir
            .join(format!("chk-{id:010}-{}", self.checkpoints));
        let link = PendingLink::start(self.store.clone(), self.gate.clone(), local.clone());
        Ok(LsmSnapshot::new(
            local,
            link,
            self.descriptors.clone(),
            self.key_groups.clone(),
            now,
            self.uploaded.clone(),
            self.config.shared.clone(),
        ))
    }

    /// A writer of restored entries of states `descriptors`, mapped to this backend's
    /// by name (declared as needed).
    pub fn restorer(&mut self, descriptors: &[StateDescriptor]) -> Result<Restorer<'_>, String> {
        let ids = descriptors
            .iter()
            .map(|d| self.declare(d.clone()))
            .collect::<Result<Vec<u32>, String>>()?;
        Ok(Restorer {
            backend: self,
            ids,
            batch: WriteBatch::default(),
            key: Vec::new(),
            value: Vec::new(),
        })
    }

    /// Its configuration.
    pub fn config(&self) -> &LsmConfig {
        &self.config
    }

    /// Opens the database of `files` as this instance's, when they hold exactly its key
    /// groups: its table files are linked (or copied) into the working folder, never
    /// read entry by entry.
    pub fn open_restored(
        config: LsmConfig,
        max_parallelism: u32,
        key_groups: Range<u32>,
        files: &LsmFiles,
    ) -> Result<Self> {
        let db = config.dir.join(DB_DIR);
        files.materialize(&db)?;
        // Files that are the shared folder's already need not be copied again.
        let reused = match (&config.shared, &files.shared) {
            (Some(mine), Some(theirs)) if mine.same_as(theirs) => files
                .files
                .iter()
                .filter(|f| matches!(f.place, Place::Shared(_)))
                .cloned()
                .collect(),
            _ => Vec::new(),
        };
        let mut backend = Self::open_with(config, max_parallelism, key_groups, reused)?;
        // Its timers are in the database until `raise_near_until` finds where they start.
        backend.near_until = [i64::MIN; 2];
        for d in &files.descriptors {
            backend.declare(d.clone()).map_err(anyhow::Error::msg)?;
        }
        Ok(backend)
    }

    /// The working folder.
    pub fn dir(&self) -> &Path {
        &self.config.dir
    }
}

/// Writes restored entries into an LSM backend, in batches.
pub struct Restorer<'a> {
    backend: &'a mut LsmBackend,
    ids: Vec<u32>,
    batch: WriteBatch,
    key: Vec<u8>,
    value: Vec<u8>,
}

impl Restorer<'_> {
    /// Writes one entry (`composite`: `state ‖ key length ‖ key ‖ user key`, the state
    /// by its id in the restored descriptors) if it is of the backend's key groups.
    pub fn put(&mut self, kg: u32, composite: &[u8], written_at: i64, value: &[u8]) -> Result<()> {
        if !self.backend.key_groups.contains(&kg) {
            return Ok(());
        }
        if timers::is_timer(composite) {
            self.key.clear();
            self.key.extend_from_slice(&group_start(kg));
            self.key.extend_from_slice(composite);
            encode_value(&mut self.value, written_at, value);
            self.batch.put(&self.key, &self.value);
            return Ok(());
        }
        let (id, key, user_key) =
            super::backend::restored_key(&self.ids, composite).map_err(anyhow::Error::msg)?;
        compose(&mut self.key, kg, id, key, user_key);
        encode_value(&mut self.value, written_at, value);
        self.batch.put(&self.key, &self.value);
        if self.batch.size_in_bytes() >= 4 << 20 {
            self.write()?;
        }
        Ok(())
    }

    fn write(&mut self) -> Result<()> {
        let batch = std::mem::take(&mut self.batch);
        self.backend
            .store
            .db
            .write_opt(batch, &self.backend.write)
            .context("writing restored state")
    }

    /// Writes what is left.
    pub fn finish(mut self) -> Result<()> {
        self.write()?;
        // Timers may have been written: their heads are read again when asked for, and
        // none is on the heap until `raise_near_until` says from where.
        self.backend.timers = Heads::unknown(self.backend.key_groups.clone());
        self.backend.near_until = [i64::MIN; 2];
        Ok(())
    }
}

/// The database's options: memory within `memory` bytes, entries past their state's TTL
/// dropped by compaction.
fn options(memory: u64, ttls: Arc<RwLock<Vec<Option<u64>>>>) -> Options {
    let memory = memory.max(MIN_MEMORY_BYTES) as usize;
    let mut o = Options::default();
    o.create_if_missing(true);
    o.set_log_level(rocksdb::LogLevel::Warn);
    o.set_stats_dump_period_sec(0);
    // Memtables: half of the budget, an active one and one being flushed, each switched
    // by the instance at `switch_bytes` (see the module docs); RocksDB's own limit is
    // above that, never reached. (Smaller memtables make more, smaller table files, which
    // compaction then rewrites: switched earlier, the 12 M-key count's checkpoints wrote
    // 4.5× the state, not 3.3×.) A bloom filter over each memtable's keys answers the
    // lookups of keys it does not hold (most of them, in a job that keeps meeting new
    // keys) without a search; it is sized from RocksDB's limit but counts in the
    // memtable's size, so it is made a tenth of the size the memtable is switched at.
    let buffers = memory / 2;
    let switch = switch_bytes(memory as u64) as usize;
    let limit = (switch + 4 * pending::FLUSH_BYTES).max(buffers);
    o.set_write_buffer_size(limit);
    o.set_max_write_buffer_number(3);
    o.set_memtable_whole_key_filtering(true);
    o.set_memtable_prefix_bloom_ratio(0.1 * switch as f64 / limit as f64);
    let cache = Cache::new_lru_cache(memory - buffers);
    let mut table = BlockBasedOptions::default();
    table.set_block_cache(&cache);
    // Index and filter blocks in the cache, so memory stays within the budget however
    // many keys there are; partitioned, so a lookup loads a 16 KiB partition of a
    // table's filter, not the whole filter (whole ones thrash the cache once tables
    // are large: measured, most of a lookup's time went into re-reading them). Finding
    // the partition is a search of the table's partition index for every table a
    // lookup checks: partitions of 16 KiB rather than 4 KiB made the 12 M-key count
    // 10–14% faster (alternating runs), 32 KiB no faster still.
    table.set_cache_index_and_filter_blocks(true);
    table.set_cache_index_and_filter_blocks_with_high_priority(true);
    table.set_index_type(rocksdb::BlockBasedIndexType::TwoLevelIndexSearch);
    table.set_partition_filters(true);
    table.set_metadata_block_size(16 << 10);
    table.set_pin_top_level_index_and_filter(true);
    table.set_pin_l0_filter_and_index_blocks_in_cache(true);
    table.set_bloom_filter(10.0, false);
    table.set_block_size(16 << 10);
    o.set_block_based_table_factory(&table);
    o.set_compression_type(rocksdb::DBCompressionType::Lz4);
    o.set_bottommost_compression_type(rocksdb::DBCompressionType::Lz4);
    // Universal compaction: each checkpoint uploads what compaction wrote since the last
    // one, and universal compaction writes less than levelled (measured on 12 M keys with
    // checkpoints every second: 4.5–6.0× the final state uploaded in all, against 9.0×, at
    // the same speed). A checkpoint every second makes a sorted run a second, and each
    // byte is rewritten about log_k(runs) times when runs are merged k at a time: merging
    // once there are twelve took that to a median of 2.5× (2.2–3.2×; eight: 2.7–3.5×,
    // six: 3.2–4.1×), the filters of the extra runs answering a lookup from the cache
    // at about a tenth more time a lookup (sixteen wrote 2.0–2.3× but ran slower still).
    o.set_compaction_style(rocksdb::DBCompactionStyle::Universal);
    o.set_level_zero_file_num_compaction_trigger(12);
    o.set_max_open_files(256);
    o.set_keep_log_file_num(2);
    o.set_max_log_file_size(1 << 20);
    o.set_compaction_filter("sluice-ttl", move |_level, key: &[u8], value: &[u8]| {
        let state = key
            .get(GROUP_BYTES..GROUP_BYTES + 4)
            .map(|s| u32::from_be_bytes(s.try_into().expect("four bytes")));
        let ttl = state.and_then(|s| ttls.read().get(s as usize).copied().flatten());
        match (ttl, split_value(value)) {
            (Some(ttl), Some((written_at, _)))
                if !alive(written_at, Some(ttl), crate::timers::now_millis()) =>
            {
                Decision::Remove
            }
            _ => Decision::Keep,
        }
    });
    o
}

/// The active memtable's size at which an instance with `memory` bytes switches it: a
/// quarter of the budget, so the active and the immutable memtable take half of it (and
/// at most one commit more each: `pending::FLUSH_BYTES` of keys and values). RocksDB's
/// own limit is above that by four commits' worth: it is never reached.
fn switch_bytes(memory: u64) -> u64 {
    memory.max(MIN_MEMORY_BYTES) / 4
}

/// What an instance with `memory` bytes may hold remembering the timers it registered
/// lately: a sixteenth, within the budget's slack (the memtables are switched at a quarter
/// each and the cache's index and filter blocks are the rest).
fn known_timer_bytes(memory: u64) -> usize {
    (memory.max(MIN_MEMORY_BYTES) / 16) as usize
}

/// `kg ‖ state ‖ key length ‖ key ‖ user_key` into `out`.
fn compose(out: &mut Vec<u8>, kg: u32, state: u32, key: &[u8], user_key: &[u8]) {
    out.clear();
    out.extend_from_slice(&(kg as u16).to_be_bytes());
    out.extend_from_slice(&state.to_be_bytes());
    out.extend_from_slice(&(key.len() as u32).to_be_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(user_key);
}

/// The first key of key group `kg`.
fn group_start(kg: u32) -> [u8; GROUP_BYTES] {
    (kg as u16).to_be_bytes()
}

/// A stored value: `written_at ‖ value`, into `out`.
fn encode_value(out: &mut Vec<u8>, written_at: i64, value: &[u8]) {
    out.clear();
    out.extend_from_slice(&written_at.to_le_bytes());
    out.extend_from_slice(value);
}

/// `(written at, value)` of a stored value.
fn split_value(v: &[u8]) -> Option<(i64, &[u8])> {
    let at = i64::from_le_bytes(v.get(..TIME_BYTES)?.try_into().ok()?);
    Some((at, &v[TIME_BYTES..]))
}

/// The least key above every key that starts with `prefix`; `None` when there is none.
fn successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

fn alive(written_at: i64, ttl: Option<u64>, now: i64) -> bool {
    ttl.is_none_or(|ttl| now.saturating_sub(written_at) < ttl as i64)
}

fn storage_error(e: rocksdb::Error) -> StateError {
    StateError::Storage(e.to_string())
}

/// Reads every entry of key groups `range` from the database in `path` (opened read
/// only), calling `f(key group, composite key, written at, value)` in key order. Seeks to
/// the range: other key groups are never read.
pub(crate) fn read_entries(
    path: &Path,
    range: Range<u32>,
    mut f: impl FnMut(u32, &[u8], i64, &[u8]) -> Result<()>,
) -> Result<()> {
    let db = DB::open_for_read_only(&Options::default(), path, false)
        .with_context(|| format!("opening the state database in {}", path.display()))?;
    let mut read = ReadOptions::default();
    read.set_iterate_upper_bound(group_start(range.end).to_vec());
    read.fill_cache(false);
    let start = group_start(range.start);
    let it = db.iterator_opt(IteratorMode::From(&start, Direction::Forward), read);
    for item in it {
        let (k, v) = item.with_context(|| format!("reading {}", path.display()))?;
        let kg = u16::from_be_bytes([k[0], k[1]]) as u32;
        let (written_at, value) = split_value(&v)
            .with_context(|| format!("{}: a value without its time", path.display()))?;
        f(kg, &k[GROUP_BYTES..], written_at, value)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
