//! The keyed state of an operator instance in either backend, and its snapshots.
//!
//! The heap backend keeps small, hot state in copy-on-write maps; the LSM backend keeps
//! state larger than memory in RocksDB. Both take the same calls and restore each other's
//! checkpoints and savepoints (a job may change backend between runs).

use std::ops::Range;
use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::backend::{KeyedStateBackend, KeyedStateSnapshot, StateDescriptor, StateError};
use super::lsm::{LsmBackend, LsmConfig, LsmFiles, LsmSnapshot, timer_of};
use crate::timers::TimerQueues;

/// Which backend keeps a job's keyed state.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// In memory, for small and hot state (the default).
    #[default]
    Heap,
    /// In RocksDB on local disk, for state larger than memory, with incremental
    /// checkpoints.
    Rocksdb,
}

impl BackendKind {
    /// Its name in job and host files.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Heap => "heap",
            BackendKind::Rocksdb => "rocksdb",
        }
    }
}

/// Keyed state of one operator instance.
#[derive(Debug)]
pub enum KeyedState {
    /// In memory.
    Heap(KeyedStateBackend),
    /// In an embedded LSM tree.
    Lsm(Box<LsmBackend>),
}

/// A keyed state's snapshot, as the synchronous part takes it or a checkpoint keeps it.
#[derive(Debug, Clone)]
pub enum KeyedSnapshot {
    /// The heap backend's O(1) view; also what savepoints (canonical) read back as.
    Heap(KeyedStateSnapshot),
    /// An LSM instance's local checkpoint, to be uploaded or written out.
    Lsm(LsmSnapshot),
    /// An LSM instance's files, as a checkpoint keeps them.
    Files(LsmFiles),
}

impl KeyedSnapshot {
    /// Declared states, by id.
    pub fn descriptors(&self) -> &[StateDescriptor] {
        match self {
            KeyedSnapshot::Heap(s) => &s.descriptors,
            KeyedSnapshot::Lsm(s) => &s.descriptors,
            KeyedSnapshot::Files(f) => &f.descriptors,
        }
    }
}

macro_rules! each {
    ($self:expr, $b:ident => $e:expr) => {
        match $self {
            KeyedState::Heap($b) => $e,
            KeyedState::Lsm($b) => $e,
        }
    };
}

impl KeyedState {
    /// An empty heap backend.
    pub fn heap(max_parallelism: u32, key_groups: Range<u32>) -> Self {
        KeyedState::Heap(KeyedStateBackend::new(max_parallelism, key_groups))
    }

    /// An empty LSM backend.
    pub fn lsm(config: LsmConfig, max_parallelism: u32, key_groups: Range<u32>) -> Result<Self> {
        Ok(KeyedState::Lsm(Box::new(LsmBackend::open(
            config,
            max_parallelism,
            key_groups,
        )?)))
    }

    /// Number of key groups of the job.
    pub fn max_parallelism(&self) -> u32 {
        each!(self, b => b.max_parallelism())
    }

    /// The key groups it holds.
    pub fn key_groups(&self) -> Range<u32> {
        each!(self, b => b.key_groups())
    }

    /// Declared states, indexed by id.
    pub fn descriptors(&self) -> &[StateDescriptor] {
        each!(self, b => b.descriptors())
    }

    /// Declares a state or returns the id it already has.
    pub fn declare(&mut self, descriptor: StateDescriptor) -> Result<u32, String> {
        each!(self, b => b.declare(descriptor))
    }

    /// Memory the host holds for it: the heap backend's entries as counted, or the LSM
    /// backend's fixed budget.
    pub fn bytes(&self) -> u64 {
        each!(self, b => b.bytes())
    }

    /// Disk its entries take: the LSM backend's table files (0 on the heap).
    pub fn disk_bytes(&self) -> u64 {
        match self {
            KeyedState::Heap(_) => 0,
            KeyedState::Lsm(b) => b.disk_bytes(),
        }
    }

    /// Number of entries (an estimate for the LSM backend).
    pub fn len(&self) -> usize {
        each!(self, b => b.len())
    }

    /// True when it holds no entry.
    pub fn is_empty(&self) -> bool {
        each!(self, b => b.is_empty())
    }

    /// Reads one entry; `None` when absent or expired at `now`.
    pub fn get(
        &self,
        state: u32,
        key: &[u8],
        user_key: &[u8],
        now: i64,
    ) -> Result<Option<Vec<u8>>, StateError> {
        each!(self, b => b.get(state, key, user_key, now))
    }

    /// All live entries of `(state, key)` in the `entries` encoding.
    pub fn entries(&mut self, state: u32, key: &[u8], now: i64) -> Result<Vec<u8>, StateError> {
        each!(self, b => b.entries(state, key, now))
    }

    /// Reads ahead what a call processing `records` will read (the LSM backend; the heap
    /// backend answers reads from memory anyway).
    pub fn prefetch(&mut self, records: &[u8]) -> Result<(), StateError> {
        match self {
            KeyedState::Heap(_) => Ok(()),
            KeyedState::Lsm(b) => b.prefetch(records),
        }
    }

    /// Writes what the LSM backend holds of the effects applied so far (the heap backend
    /// applies each at once).
    pub fn commit(&mut self) -> Result<(), StateError> {
        match self {
            KeyedState::Heap(_) => Ok(()),
            KeyedState::Lsm(b) => b.commit(),
        }
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
        each!(self, b => b.put(state, key, user_key, value, now))
    }

    /// Removes one entry.
    pub fn delete(&mut self, state: u32, key: &[u8], user_key: &[u8]) -> Result<(), StateError> {
        each!(self, b => b.delete(state, key, user_key))
    }

    /// Removes every entry of `(state, key)`.
    pub fn clear(&mut self, state: u32, key: &[u8]) -> Result<(), StateError> {
        each!(self, b => b.clear(state, key))
    }

    /// Appends an element to a list state.
    pub fn append(
        &mut self,
        state: u32,
        key: &[u8],
        value: &[u8],
        now: i64,
    ) -> Result<(), StateError> {
        each!(self, b => b.append(state, key, value, now))
    }

    /// Drops up to `budget` expired entries (the heap backend; the LSM backend drops
    /// them in compaction).
    pub fn expire_some(&mut self, now: i64, budget: usize) -> usize {
        each!(self, b => b.expire_some(now, budget))
    }

    /// The synchronous part of checkpoint `id` at processing time `now`.
    pub fn snapshot(&mut self, id: u64, now: i64) -> Result<KeyedSnapshot> {
        Ok(match self {
            KeyedState::Heap(b) => KeyedSnapshot::Heap(b.snapshot(now)),
            KeyedState::Lsm(b) => KeyedSnapshot::Lsm(b.snapshot(id, now)?),
        })
    }

    /// Restores the entries of `snapshots` in its key groups, and the instance's timers:
    /// `timers` (restored in the heap's layout) and those an LSM backend's files hold.
    /// Returns the timers the heap keeps: none when this is an LSM backend, which keeps
    /// them in its database. An LSM backend given the files of exactly its key groups
    /// reopens them (no entry is read); otherwise each snapshot's entries of its key
    /// groups are read, seeking to them.
    pub fn restore(
        &mut self,
        snapshots: &[KeyedSnapshot],
        mut timers: TimerQueues,
    ) -> Result<TimerQueues> {
        if let (KeyedState::Lsm(b), [KeyedSnapshot::Files(files)]) = (&mut *self, snapshots)
            && files.key_groups == b.key_groups()
            && b.descriptors().is_empty()
        {
            let config = b.config().clone();
            let (max, groups) = (b.max_parallelism(), b.key_groups());
            // The fresh database goes (and its folder with it) before the restored one
            // takes the folder.
            *self = KeyedState::heap(max, groups.clone());
            let mut restored = LsmBackend::open_restored(config, max, groups, files)?;
            restored.restore_timers(&timers)?;
            *self = KeyedState::Lsm(Box::new(restored));
            return Ok(TimerQueues::new());
        }
        for snapshot in snapshots {
            self.restore_one(snapshot, &mut timers)?;
        }
        match self {
            KeyedState::Heap(b) => {
                b.queue_restored_ttls();
                Ok(timers)
            }
            KeyedState::Lsm(b) => {
                b.restore_timers(&timers)?;
                Ok(TimerQueues::new())
            }
        }
    }

    fn restore_one(&mut self, snapshot: &KeyedSnapshot, timers: &mut TimerQueues) -> Result<()> {
        let mine = self.key_groups();
        match snapshot {
            KeyedSnapshot::Heap(s) => match self {
                KeyedState::Heap(b) => b.restore(s).map_err(anyhow::Error::msg),
                KeyedState::Lsm(b) => {
                    let mut writer = b.restorer(&s.descriptors).map_err(anyhow::Error::msg)?;
                    for (kg, entries) in s.key_groups() {
                        for (k, e) in entries {
                            writer.put(kg, &k.to_vec(), e.written_at, &e.value)?;
                        }
                    }
                    writer.finish()
                }
            },
            KeyedSnapshot::Files(files) => {
                let range = overlap(&mine, &files.key_groups);
                if range.is_empty() {
                    return Ok(());
                }
                let scratch = scratch_dir(self, files)?;
                match self {
                    KeyedState::Heap(b) => {
                        let ids = b
                            .declare_all(&files.descriptors)
                            .map_err(anyhow::Error::msg)?;
                        files.read_entries(&scratch, range, |kg, k, at, v| {
                            if let Some((domain, time, key)) = timer_of(k) {
                                timers.register(domain, time, key);
                                return Ok(());
                            }
                            b.restore_entry(&ids, kg, k, at, v)
                                .map_err(anyhow::Error::msg)
                        })
                    }
                    KeyedState::Lsm(b) => {
                        let mut writer =
                            b.restorer(&files.descriptors).map_err(anyhow::Error::msg)?;
                        files.read_entries(&scratch, range, |kg, k, at, v| {
                            writer.put(kg, k, at, v)
                        })?;
                        writer.finish()
                    }
                }
            }
            KeyedSnapshot::Lsm(_) => {
                anyhow::bail!("a local state checkpoint cannot be restored before it is written")
            }
        }
    }
}

/// The key groups both ranges hold.
fn overlap(a: &Range<u32>, b: &Range<u32>) -> Range<u32> {
    let start = a.start.max(b.start);
    start..a.end.min(b.end).max(start)
}

/// A new folder to open a copy of `files`' database in: beside the LSM backend's own
/// database (one file system: its tables are linked, not copied), else beside the shared
/// folder.
fn scratch_dir(state: &KeyedState, files: &LsmFiles) -> Result<std::path::PathBuf> {
    let base: &Path = match (state, &files.shared) {
        (KeyedState::Lsm(b), _) => b.dir(),
        (KeyedState::Heap(_), Some(shared)) => shared
            .path()
            .parent()
            .context("the shared state folder has no parent")?,
        (KeyedState::Heap(_), None) => anyhow::bail!("the state's manifest names no folder"),
    };
    let dir = base.join(format!("restore-{}", uuid::Uuid::new_v4().simple()));
    Ok(dir)
}
