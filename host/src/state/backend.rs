//! The keyed state of one operator instance.

use imbl::OrdMap;
use serde::{Deserialize, Serialize};
use sluice_codec::EntryWriter;
use std::collections::VecDeque;
use std::ops::Range;

use super::key_groups::key_group_of;

mod table;
pub use table::{Entry, Value};
use table::{Group, Prefix, Slot, new_entry};

/// The kind of a declared state, as in the WIT `state-kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum StateKind {
    /// One value per key.
    Value,
    /// An ordered list per key.
    List,
    /// A map per key.
    Map,
}

/// A state an operator declared in `open`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateDescriptor {
    /// Name, unique within the operator; state is matched by name on restore.
    pub name: String,
    /// Value, list or map.
    pub kind: StateKind,
    /// Entries not written for this many milliseconds read as absent.
    pub ttl_ms: Option<u64>,
}

/// A misuse of keyed state by an operator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateError {
    /// The handle was never returned by `declare-state`.
    UnknownState(u32),
    /// The key hashes to a key group this subtask does not own: the operator used a key
    /// other than the ones its input was partitioned by.
    ForeignKey {
        /// The key group of the key.
        key_group: u32,
        /// The key groups this subtask owns.
        owned: Range<u32>,
    },
    /// An operation that does not fit the state's kind (appending to a value state).
    WrongKind {
        /// The state's name.
        state: String,
        /// Its kind.
        kind: StateKind,
        /// What was attempted.
        operation: &'static str,
    },
    /// The store under the state failed (the LSM backend's disk).
    Storage(String),
}

impl std::fmt::Display for StateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StateError::UnknownState(id) => write!(f, "unknown state handle {id}"),
            StateError::ForeignKey { key_group, owned } => write!(
                f,
                "key belongs to key group {key_group}, but this subtask owns key groups {}..{}; \
                 keyed state and timers may only use the key of the record being processed",
                owned.start, owned.end
            ),
            StateError::WrongKind {
                state,
                kind,
                operation,
            } => write!(f, "cannot {operation} on {kind:?} state '{state}'"),
            StateError::Storage(e) => write!(f, "the state's store failed: {e}"),
        }
    }
}

impl std::error::Error for StateError {}

/// Keyed state of one operator instance: value, list and map states, partitioned by key
/// group.
///
/// Every key group has its own copy-on-write hash map from `(state, key)` to that key's
/// entries, in shards, so [`KeyedStateBackend::snapshot`] costs a few pointer copies per
/// key group, independent of how many entries there are, and a write after a snapshot
/// copies only the shard it falls in. A point access hashes once and compares a key only
/// when its hash matches. A key's entries are one [`Slot`]: the single entry of a value state, or the
/// entries of a list or map state ordered by user key.
///
/// Composite keys (`state id ‖ key length ‖ key ‖ user key`) remain the unit of the
/// checkpoint format and of byte accounting.
#[derive(Debug, Clone)]
pub struct KeyedStateBackend {
    max_parallelism: u32,
    key_groups: Range<u32>,
    descriptors: Vec<StateDescriptor>,
    groups: Vec<Group>,
    /// Bytes held per key group, as [`entry_bytes`] counts them.
    group_bytes: Vec<u64>,
    /// Their sum.
    bytes: u64,
    /// Entries, over all key groups.
    entries: usize,
    /// Reused to build `(state, key)` prefixes for lookups.
    scratch: Vec<u8>,
    /// Entries of TTL states in about the order they were written, for the incremental
    /// cleanup: `(key group, prefix, user key, written at)`, one per entry. An entry
    /// written again since goes back to the end when its turn comes.
    ttl_queue: TtlQueue,
}

/// An item of the TTL cleanup's queue: `(key group, prefix, user key, written at)`.
type Queued = (u32, Prefix, Prefix, i64);

/// The TTL cleanup's queue, and what it holds (counted as keyed state: a guest that
/// writes and deletes entries of a state with a long TTL grows the queue, not the maps).
#[derive(Debug, Clone, Default)]
struct TtlQueue {
    items: VecDeque<Queued>,
    bytes: u64,
}

impl TtlQueue {
    /// What one item holds: its place, and its keys where they do not fit inline.
    fn item_bytes((_, prefix, user_key, _): &Queued) -> u64 {
        let spilled = |k: &Prefix| if k.spilled() { k.len() } else { 0 };
        (size_of::<Queued>() + spilled(prefix) + spilled(user_key)) as u64
    }

    fn push_back(&mut self, item: Queued) {
        self.bytes += Self::item_bytes(&item);
        self.items.push_back(item);
    }

    fn front(&self) -> Option<&Queued> {
        self.items.front()
    }

    fn pop_front(&mut self) -> Option<Queued> {
        let item = self.items.pop_front()?;
        self.bytes -= Self::item_bytes(&item);
        Some(item)
    }

    fn retain(&mut self, keep: impl FnMut(&Queued) -> bool) {
        self.items.retain(keep);
        self.bytes = self.items.iter().map(Self::item_bytes).sum();
    }

    /// Takes every item, leaving it empty.
    fn take(&mut self) -> Vec<Queued> {
        self.bytes = 0;
        std::mem::take(&mut self.items).into()
    }

    /// Replaces the items.
    fn set(&mut self, items: Vec<Queued>) {
        self.bytes = items.iter().map(Self::item_bytes).sum();
        self.items = items.into();
    }
}

/// `(state id here, key, user key)` of a restored entry's composite key, whose state id
/// is mapped through `ids` (restored descriptors' ids here, by their index there).
pub(super) fn restored_key<'a>(
    ids: &[u32],
    composite: &'a [u8],
) -> Result<(u32, &'a [u8], &'a [u8]), String> {
    let (state, key, user_key) = split_composite(composite)
        .ok_or_else(|| "a restored state entry has a malformed key".to_string())?;
    let id = *ids
        .get(state as usize)
        .ok_or_else(|| format!("a restored state entry names unknown state {state}"))?;
    Ok((id, key, user_key))
}

/// The key group of `key` out of `max_parallelism`, when it is one of `owned`; else the
/// error naming both.
pub(super) fn owned_key_group(
    key: &[u8],
    max_parallelism: u32,
    owned: &Range<u32>,
) -> Result<u32, StateError> {
    let kg = key_group_of(key, max_parallelism);
    if owned.contains(&kg) {
        Ok(kg)
    } else {
        Err(StateError::ForeignKey {
            key_group: kg,
            owned: owned.clone(),
        })
    }
}

/// Declares `descriptor` among `descriptors`, or finds it there: `(its id, whether it
/// gained a TTL)`. Fails when the name is known with another kind.
pub(super) fn declare_in(
    descriptors: &mut Vec<StateDescriptor>,
    descriptor: StateDescriptor,
) -> Result<(u32, bool), String> {
    if let Some(id) = descriptors.iter().position(|d| d.name == descriptor.name) {
        let existing = &mut descriptors[id];
        if existing.kind != descriptor.kind {
            return Err(format!(
                "state '{}' is declared as {:?} state, but it exists as {:?} state \
                 (declared earlier or restored from a checkpoint)",
                descriptor.name, descriptor.kind, existing.kind
            ));
        }
        let gains_ttl = existing.ttl_ms.is_none() && descriptor.ttl_ms.is_some();
        existing.ttl_ms = descriptor.ttl_ms;
        return Ok((id as u32, gains_ttl));
    }
    descriptors.push(descriptor);
    Ok((descriptors.len() as u32 - 1, false))
}

/// What the host counts one entry as holding: its composite key, its value, and an
/// estimate of the maps' and the reference counts' overhead per entry.
pub fn entry_bytes(composite_key_len: usize, value_len: usize) -> u64 {
    (ENTRY_OVERHEAD + composite_key_len + value_len) as u64
}

/// Map node share, the value's reference-counted buffer and the entry itself, rounded up.
const ENTRY_OVERHEAD: usize = 96;

/// An immutable view of a [`KeyedStateBackend`] at one instant; taken in O(key groups).
#[derive(Debug, Clone)]
pub struct KeyedStateSnapshot {
    /// Declared states; the index is the state id used in composite keys.
    pub descriptors: Vec<StateDescriptor>,
    /// First key group of `groups`.
    pub first_key_group: u32,
    groups: Vec<Group>,
    group_bytes: Vec<u64>,
    entries: usize,
    /// Processing time when it was taken: entries expired by then are not part of it.
    taken_at: i64,
}

/// A composite key as two parts: `state id ‖ key length ‖ key`, and the user key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompositeKey<'a> {
    /// `state id ‖ key length ‖ key`.
    pub prefix: &'a [u8],
    /// The user key.
    pub user_key: &'a [u8],
}

impl CompositeKey<'_> {
    /// Length of the whole key.
    pub fn len(&self) -> usize {
        self.prefix.len() + self.user_key.len()
    }

    /// Never empty: the prefix has at least a state id and a length.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The whole key.
    pub fn to_vec(self) -> Vec<u8> {
        [self.prefix, self.user_key].concat()
    }
}

impl KeyedStateBackend {
    /// An empty backend for the key groups `key_groups` out of `max_parallelism`.
    pub fn new(max_parallelism: u32, key_groups: Range<u32>) -> Self {
        let groups: Vec<Group> = key_groups.clone().map(|_| Group::default()).collect();
        KeyedStateBackend {
            max_parallelism,
            key_groups,
            descriptors: Vec::new(),
            group_bytes: vec![0; groups.len()],
            groups,
            bytes: 0,
            entries: 0,
            scratch: Vec::new(),
            ttl_queue: TtlQueue::default(),
        }
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

    /// Declares a state or returns the id it already has (from an earlier declaration or
    /// a restored checkpoint). Fails when the name is known with another kind.
    pub fn declare(&mut self, descriptor: StateDescriptor) -> Result<u32, String> {
        let (id, gains_ttl) = declare_in(&mut self.descriptors, descriptor)?;
        if gains_ttl {
            self.queue_ttl_entries(id);
        }
        Ok(id)
    }

    /// Number of entries over all states and key groups.
    pub fn len(&self) -> usize {
        self.entries
    }

    /// True when no entry is stored.
    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    /// Bytes the entries hold, as [`entry_bytes`] counts them.
    pub fn bytes(&self) -> u64 {
        self.bytes + self.ttl_queue.bytes
    }

    fn add_bytes(&mut self, group: usize, added: u64, removed: u64) {
        self.group_bytes[group] = (self.group_bytes[group] + added).saturating_sub(removed);
        self.bytes = (self.bytes + added).saturating_sub(removed);
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
        let group = self.group_index(key)?;
        let prefix = prefix_of(state, key);
        let entry = self.groups[group]
            .get(&prefix[..])
            .and_then(|slot| slot.get(user_key));
        Ok(entry
            .filter(|e| alive(e, ttl, now))
            .map(|e| e.value.to_vec()))
    }

    /// All live entries of `(state, key)` in the `entries` encoding, by user key.
    pub fn entries(&self, state: u32, key: &[u8], now: i64) -> Result<Vec<u8>, StateError> {
        let ttl = self.descriptor(state)?.ttl_ms;
        let group = self.group_index(key)?;
        let mut out = EntryWriter::new();
        if let Some(slot) = self.groups[group].get(&prefix_of(state, key)[..]) {
            for (user_key, e) in slot.iter() {
                if alive(e, ttl, now) {
                    out.push(user_key, &e.value);
                }
            }
        }
        Ok(out.into_bytes())
    }

    /// Sets one entry. An existing entry is updated in place; its value buffer is reused
    /// when no snapshot shares it and the length is the same.
    pub fn put(
        &mut self,
        state: u32,
        key: &[u8],
        user_key: &[u8],
        value: &[u8],
        now: i64,
    ) -> Result<(), StateError> {
        let ttl = self.descriptor(state)?.ttl_ms.is_some();
        let group = self.group_index(key)?;
        compose(&mut self.scratch, state, key, &[]);
        let map = &mut self.groups[group];
        let replaced = match map.get_mut(&self.scratch[..]) {
            Some(slot) => slot.put(user_key, value, now),
            None => {
                let slot = if user_key.is_empty() {
                    Slot::One(new_entry(value, now))
                } else {
                    let mut m = OrdMap::new();
                    m.insert(Prefix::from_slice(user_key), new_entry(value, now));
                    Slot::Many(m)
                };
                map.insert_new(Prefix::from_slice(&self.scratch), slot);
                None
            }
        };
        let key_len = self.scratch.len() + user_key.len();
        match replaced {
            Some(old) => self.add_bytes(group, value.len() as u64, old as u64),
            None => {
                self.entries += 1;
                self.add_bytes(group, entry_bytes(key_len, value.len()), 0);
                if ttl {
                    // Queued once per entry; a later write moves it back in the queue
                    // when its turn comes (see `expire_some`).
                    let prefix = Prefix::from_slice(&self.scratch);
                    self.ttl_queue.push_back((
                        group as u32,
                        prefix,
                        Prefix::from_slice(user_key),
                        now,
                    ));
                }
            }
        }
        Ok(())
    }

    /// Removes one entry.
    pub fn delete(&mut self, state: u32, key: &[u8], user_key: &[u8]) -> Result<(), StateError> {
        self.descriptor(state)?;
        let group = self.group_index(key)?;
        compose(&mut self.scratch, state, key, &[]);
        self.remove_entry(group, user_key);
        Ok(())
    }

    /// Removes the entry `user_key` of the slot at `self.scratch` in `group`.
    fn remove_entry(&mut self, group: usize, user_key: &[u8]) -> Option<Entry> {
        let map = &mut self.groups[group];
        let slot = map.get_mut(&self.scratch[..])?;
        let removed = slot.remove(user_key);
        if slot.len() == 0 {
            map.remove(&self.scratch[..]);
        }
        let e = removed?;
        self.entries -= 1;
        let freed = entry_bytes(self.scratch.len() + user_key.len(), e.value.len());
        self.add_bytes(group, 0, freed);
        Some(e)
    }

    /// Removes every entry of `(state, key)`.
    pub fn clear(&mut self, state: u32, key: &[u8]) -> Result<(), StateError> {
        self.descriptor(state)?;
        let group = self.group_index(key)?;
        let prefix = prefix_of(state, key);
        if let Some(slot) = self.groups[group].remove(&prefix[..]) {
            let freed: u64 = slot
                .iter()
                .map(|(uk, e)| entry_bytes(prefix.len() + uk.len(), e.value.len()))
                .sum();
            self.entries -= slot.len();
            self.add_bytes(group, 0, freed);
        }
        Ok(())
    }

    /// Appends an element to a list state. The element's user key is its position
    /// (big-endian, so user-key order is append order).
    pub fn append(
        &mut self,
        state: u32,
        key: &[u8],
        value: &[u8],
        now: i64,
    ) -> Result<(), StateError> {
        let d = self.descriptor(state)?;
        if d.kind != StateKind::List {
            return Err(StateError::WrongKind {
                state: d.name.clone(),
                kind: d.kind,
                operation: "append",
            });
        }
        let group = self.group_index(key)?;
        let next = match self.groups[group].get(&prefix_of(state, key)[..]) {
            Some(Slot::Many(m)) => m.get_max().map_or(0, |(k, _)| {
                let pos: [u8; 8] = k[..].try_into().unwrap_or([0xff; 8]);
                u64::from_be_bytes(pos).saturating_add(1)
            }),
            // An element under the empty user key sorts first: the list goes on at 0.
            Some(Slot::One(_)) | None => 0,
        };
        self.put(state, key, &next.to_be_bytes(), value, now)
    }

    /// Drops every entry whose TTL has passed at `now`; returns how many.
    pub fn expire(&mut self, now: i64) -> usize {
        let ttls: Vec<Option<u64>> = self.descriptors.iter().map(|d| d.ttl_ms).collect();
        if ttls.iter().all(Option::is_none) {
            return 0;
        }
        let mut removed = 0;
        for g in 0..self.groups.len() {
            let mut expired: Vec<(Prefix, Prefix)> = Vec::new();
            for (prefix, slot) in self.groups[g].iter() {
                let ttl = ttls.get(state_of(prefix) as usize).copied().flatten();
                for (uk, e) in slot.iter() {
                    if !alive(e, ttl, now) {
                        expired.push((prefix.clone(), Prefix::from_slice(uk)));
                    }
                }
            }
            for (prefix, user_key) in expired {
                self.scratch.clear();
                self.scratch.extend_from_slice(&prefix);
                removed += usize::from(self.remove_entry(g, &user_key).is_some());
            }
        }
        removed
    }

    /// Looks at up to `budget` entries of TTL states, oldest writes first, and drops those
    /// whose TTL has passed at `now`; returns how many. Called with a budget after each
    /// call of an operator with TTL states, it cleans its state over time at a bounded
    /// cost per call (as Flink's incremental cleanup does); nothing is looked at without
    /// TTL states.
    pub fn expire_some(&mut self, now: i64, budget: usize) -> usize {
        let mut removed = 0;
        for _ in 0..budget {
            let Some((_, prefix, _, written_at)) = self.ttl_queue.front() else {
                break;
            };
            let ttl = self
                .descriptors
                .get(state_of(prefix) as usize)
                .and_then(|d| d.ttl_ms);
            let Some(ttl) = ttl else {
                // Its state was declared again without a TTL: nothing to clean.
                self.ttl_queue.pop_front();
                continue;
            };
            if now.saturating_sub(*written_at) < ttl as i64 {
                // The oldest write is alive: so are all later ones.
                break;
            }
            let (g, prefix, user_key, written_at) =
                self.ttl_queue.pop_front().expect("looked at above");
            let gi = g as usize;
            let now_written = self.groups[gi]
                .get(&prefix[..])
                .and_then(|s| s.get(&user_key))
                .map(|e| e.written_at);
            match now_written {
                // Gone already (deleted, cleared).
                None => {}
                // Written again since: back in the queue, at its new time.
                Some(at) if at != written_at => {
                    self.ttl_queue.push_back((g, prefix, user_key, at));
                }
                Some(_) => {
                    self.scratch.clear();
                    self.scratch.extend_from_slice(&prefix);
                    removed += usize::from(self.remove_entry(gi, &user_key).is_some());
                }
            }
        }
        removed
    }

    /// Queues every entry of `state` for the TTL cleanup, oldest first (for state that
    /// gained a TTL, or was restored).
    fn queue_ttl_entries(&mut self, state: u32) {
        let mut found: Vec<(u32, Prefix, Prefix, i64)> = Vec::new();
        for (g, group) in self.groups.iter().enumerate() {
            for (prefix, slot) in group.iter() {
                if state_of(prefix) != state {
                    continue;
                }
                for (uk, e) in slot.iter() {
                    found.push((
                        g as u32,
                        prefix.clone(),
                        Prefix::from_slice(uk),
                        e.written_at,
                    ));
                }
            }
        }
        found.sort_by_key(|(_, _, _, at)| *at);
        let mut queue = self.ttl_queue.take();
        queue.extend(found);
        queue.sort_by_key(|(_, _, _, at)| *at);
        self.ttl_queue.set(queue);
    }

    /// A consistent view of all state at processing time `now` (entries expired by then
    /// are left out when it is read), in O(key groups).
    pub fn snapshot(&self, now: i64) -> KeyedStateSnapshot {
        KeyedStateSnapshot {
            descriptors: self.descriptors.clone(),
            first_key_group: self.key_groups.start,
            groups: self.groups.clone(),
            group_bytes: self.group_bytes.clone(),
            entries: self.entries,
            taken_at: now,
        }
    }

    /// Adds the entries of `snapshot` that fall into this backend's key groups, mapping
    /// its states to this backend's by name (declaring them as needed).
    pub fn restore(&mut self, snapshot: &KeyedStateSnapshot) -> Result<(), String> {
        let ids = snapshot
            .descriptors
            .iter()
            .map(|d| self.declare(d.clone()))
            .collect::<Result<Vec<u32>, String>>()?;
        let same_ids = ids.iter().enumerate().all(|(i, id)| *id as usize == i);
        for (i, entries) in snapshot.groups.iter().enumerate() {
            let kg = snapshot.first_key_group + i as u32;
            if !self.key_groups.contains(&kg) {
                continue;
            }
            let g = (kg - self.key_groups.start) as usize;
            if same_ids && self.groups[g].is_empty() {
                // The usual case: share the snapshot's map, in O(1).
                self.groups[g] = entries.clone();
                self.entries += entries.iter().map(|(_, slot)| slot.len()).sum::<usize>();
                self.add_bytes(g, snapshot.group_bytes[i], 0);
                continue;
            }
            for (prefix, slot) in entries.iter() {
                let id = ids[state_of(prefix) as usize];
                let mut prefix = prefix.clone();
                prefix[..4].copy_from_slice(&id.to_be_bytes());
                for (uk, e) in slot.iter() {
                    self.insert_entry(g, &prefix, uk, e.clone());
                }
            }
        }
        self.queue_restored_ttls();
        Ok(())
    }

    /// Queues the entries of every TTL state anew, after entries were restored.
    pub fn queue_restored_ttls(&mut self) {
        for (id, d) in self.descriptors.clone().iter().enumerate() {
            if d.ttl_ms.is_some() {
                self.ttl_queue
                    .retain(|(_, p, _, _)| state_of(p) != id as u32);
                self.queue_ttl_entries(id as u32);
            }
        }
    }

    /// Declares the states of `descriptors` (restored ones): their ids here, by their
    /// index there.
    pub fn declare_all(&mut self, descriptors: &[StateDescriptor]) -> Result<Vec<u32>, String> {
        descriptors
            .iter()
            .map(|d| self.declare(d.clone()))
            .collect()
    }

    /// Inserts one restored entry of key group `kg` (`composite`: its key with the state
    /// id it had, mapped through `ids`); entries of other key groups are left out. Call
    /// [`KeyedStateBackend::queue_restored_ttls`] after the last.
    pub fn restore_entry(
        &mut self,
        ids: &[u32],
        kg: u32,
        composite: &[u8],
        written_at: i64,
        value: &[u8],
    ) -> Result<(), String> {
        if !self.key_groups.contains(&kg) {
            return Ok(());
        }
        let (id, key, user_key) = restored_key(ids, composite)?;
        let prefix = prefix_of(id, key);
        let g = (kg - self.key_groups.start) as usize;
        let entry = Entry {
            value: Value::from(value),
            written_at,
        };
        self.insert_entry(g, &prefix, user_key, entry);
        Ok(())
    }

    /// Inserts `entry` as it is (a restored one) under `prefix ‖ user_key` in group `g`.
    fn insert_entry(&mut self, g: usize, prefix: &[u8], user_key: &[u8], entry: Entry) {
        let bytes = entry_bytes(prefix.len() + user_key.len(), entry.value.len());
        let map = &mut self.groups[g];
        let replaced = match map.get_mut(prefix) {
            Some(Slot::Many(m)) => m.insert(Prefix::from_slice(user_key), entry),
            Some(slot @ Slot::One(_)) if !user_key.is_empty() => {
                let Slot::One(one) = slot.clone() else {
                    unreachable!("matched above")
                };
                let mut m = OrdMap::new();
                m.insert(Prefix::new(), one);
                m.insert(Prefix::from_slice(user_key), entry);
                *slot = Slot::Many(m);
                None
            }
            Some(Slot::One(one)) => Some(std::mem::replace(one, entry)),
            None => {
                let slot = if user_key.is_empty() {
                    Slot::One(entry)
                } else {
                    let mut m = OrdMap::new();
                    m.insert(Prefix::from_slice(user_key), entry);
                    Slot::Many(m)
                };
                map.insert_new(Prefix::from_slice(prefix), slot);
                None
            }
        };
        match replaced {
            Some(old) => self.add_bytes(
                g,
                bytes,
                entry_bytes(prefix.len() + user_key.len(), old.value.len()),
            ),
            None => {
                self.entries += 1;
                self.add_bytes(g, bytes, 0);
            }
        }
    }

    fn descriptor(&self, state: u32) -> Result<&StateDescriptor, StateError> {
        self.descriptors
            .get(state as usize)
            .ok_or(StateError::UnknownState(state))
    }

    fn group_index(&self, key: &[u8]) -> Result<usize, StateError> {
        let kg = owned_key_group(key, self.max_parallelism, &self.key_groups)?;
        Ok((kg - self.key_groups.start) as usize)
    }
}

impl KeyedStateSnapshot {
    /// Builds a snapshot from decoded parts (used when reading a checkpoint): per key
    /// group, its entries as `(composite key, entry)`. Fails on a key that is not a
    /// composite key of a declared state.
    pub fn from_parts(
        descriptors: Vec<StateDescriptor>,
        first_key_group: u32,
        groups: Vec<Vec<(Vec<u8>, Entry)>>,
    ) -> Result<Self, String> {
        let mut backend = KeyedStateBackend::new(
            u32::MAX,
            first_key_group..first_key_group + groups.len() as u32,
        );
        backend.descriptors = descriptors;
        for (g, entries) in groups.into_iter().enumerate() {
            for (k, e) in entries {
                let (state, key, user_key) = split_composite(&k)
                    .filter(|(state, _, _)| (*state as usize) < backend.descriptors.len())
                    .ok_or_else(|| format!("a malformed state key of {} bytes", k.len()))?;
                let prefix = prefix_of(state, key);
                backend.insert_entry(g, &prefix, user_key, e);
            }
        }
        Ok(KeyedStateSnapshot {
            descriptors: backend.descriptors,
            first_key_group,
            groups: backend.groups,
            group_bytes: backend.group_bytes,
            entries: backend.entries,
            // Written without the entries expired then.
            taken_at: i64::MIN,
        })
    }

    /// Every key group with its entries as `(composite key, entry)`, by `(state, key)`
    /// and then user key, without the entries whose TTL had passed when the snapshot was
    /// taken.
    pub fn key_groups(
        &self,
    ) -> impl Iterator<Item = (u32, impl Iterator<Item = (CompositeKey<'_>, &Entry)>)> + '_ {
        let ttls: Vec<Option<u64>> = self.descriptors.iter().map(|d| d.ttl_ms).collect();
        self.groups.iter().enumerate().map(move |(i, g)| {
            let ttls = ttls.clone();
            let taken_at = self.taken_at;
            (
                self.first_key_group + i as u32,
                g.iter().flat_map(move |(prefix, slot)| {
                    let ttl = ttls.get(state_of(prefix) as usize).copied().flatten();
                    slot.iter()
                        .filter(move |(_, e)| alive(e, ttl, taken_at))
                        .map(move |(user_key, e)| {
                            (
                                CompositeKey {
                                    prefix: &prefix[..],
                                    user_key,
                                },
                                e,
                            )
                        })
                }),
            )
        })
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries
    }

    /// True when there are no entries.
    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }
}

/// Splits a composite key into `(state id, key, user key)`; `None` when it is too short
/// for what it says.
pub fn split_composite(k: &[u8]) -> Option<(u32, &[u8], &[u8])> {
    let state = u32::from_be_bytes(k.get(..4)?.try_into().ok()?);
    let len = u32::from_be_bytes(k.get(4..8)?.try_into().ok()?) as usize;
    let key = k.get(8..8usize.checked_add(len)?)?;
    Some((state, key, &k[8 + len..]))
}

fn state_of(k: &[u8]) -> u32 {
    u32::from_be_bytes(
        k[..4]
            .try_into()
            .expect("composite keys start with a state id"),
    )
}

fn prefix_of(state: u32, key: &[u8]) -> Prefix {
    let mut p = Prefix::with_capacity(8 + key.len());
    p.extend_from_slice(&state.to_be_bytes());
    p.extend_from_slice(&(key.len() as u32).to_be_bytes());
    p.extend_from_slice(key);
    p
}

/// Writes the composite key of `(state, key, user_key)` into `out`.
fn compose(out: &mut Vec<u8>, state: u32, key: &[u8], user_key: &[u8]) {
    out.clear();
    out.extend_from_slice(&state.to_be_bytes());
    out.extend_from_slice(&(key.len() as u32).to_be_bytes());
    out.extend_from_slice(key);
    out.extend_from_slice(user_key);
}

fn alive(e: &Entry, ttl: Option<u64>, now: i64) -> bool {
    ttl.is_none_or(|ttl| now.saturating_sub(e.written_at) < ttl as i64)
}

#[cfg(test)]
mod tests;
