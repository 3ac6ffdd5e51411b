//! The cache in guest memory behind the state handles: what is cached, when writes go
//! back to the host, and when the cache is dropped (see the parent module's docs).

use std::collections::BTreeMap;
use std::time::Duration;

use rustc_hash::FxHashMap;
use serde::Serialize;
use serde::de::DeserializeOwned;
use sluice_codec::{Effect, EffectWriter, EntryReader};

use crate::host::{Host, StateKind};
use crate::{Error, Result, from_bytes};

/// The cache is dropped at the end of a call once what it took in since it was last
/// dropped — keys and values, and this many bytes per entry for the tables and lists that
/// hold it — came to more than a quarter of the instance's linear memory limit (64 MiB of
/// the default 256 MiB: about 390,000 small entries). A fixed 100,000 entries made a word
/// count over 200,000 words drop the cache every few calls and read and write nearly
/// every record's count on the host: 4.8× a native program's time, against 1.2–1.4× over
/// 100,000 words.
const ENTRY_OVERHEAD: usize = 160;
/// The instance's memory limit in bytes, which the host sets in the guest's environment.
const MEMORY_VARIABLE: &str = "SLUICE_MEMORY_BYTES";
/// The memory limit assumed without it (the host's default).
const DEFAULT_MEMORY_BYTES: u64 = 256 << 20;

/// What the cache may take in before it is dropped: a quarter of the memory limit.
fn cache_budget() -> usize {
    static BUDGET: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *BUDGET.get_or_init(|| {
        let memory = std::env::var(MEMORY_VARIABLE)
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(DEFAULT_MEMORY_BYTES);
        usize::try_from(memory / 4).unwrap_or(usize::MAX)
    })
}
/// Writes not yet sent to the host are sent at the end of a call once the entries they
/// made dirty came to more bytes than a limit (each counted once at its largest: so large
/// values reach the host, and its state limits, soon, and the guest's memory stays
/// small). What is still dirty at a checkpoint is sent by its `snapshot`, on the task's
/// synchronous part: measured on a count job meeting 250,000 new keys a second, 4 MiB
/// made that write-back 5–90 ms of each checkpoint, 1 MiB 2–60 ms, 256 KiB under 15.
/// The limit starts at this...
const MIN_DIRTY_BYTES: usize = 256 << 10;
/// ... and doubles, up to this, after an early write-back that mostly sent again entries
/// an early write-back of the same checkpoint interval had sent: the operator writes one
/// set of keys over and over, and sending them early only sends them more often (a word
/// count over 100,000 words sent about one value per record at 256 KiB, and ran 2–3×
/// slower than with the whole set sent at the snapshot). It halves again after an
/// interval whose early write-backs mostly sent entries for the first time.
const MAX_DIRTY_BYTES: usize = 4 << 20;
/// An entry's `early_in` before any early write-back sent it.
const NEVER: u32 = u32::MAX;

/// The declared states of an instance and the cache of their entries (see the module
/// docs for what is cached when).
#[derive(Debug)]
pub(crate) struct StateCache {
    slots: Vec<StateSlot>,
    usage: Usage,
    /// What `usage` may reach before the cache is dropped.
    budget: usize,
    /// Bytes written since the last write-back (values counted when they become dirty,
    /// map entries at every write).
    dirty_bytes: usize,
    /// The limit of `dirty_bytes`, from [`MIN_DIRTY_BYTES`] to [`MAX_DIRTY_BYTES`].
    dirty_limit: usize,
    /// Checkpoint intervals so far (snapshot write-backs), numbering early write-backs.
    interval: u32,
    /// What this interval's early write-backs sent.
    early: Tally,
    /// Reused for encoding map keys.
    scratch: Vec<u8>,
}

impl Default for StateCache {
    fn default() -> Self {
        StateCache {
            slots: Vec::new(),
            usage: Usage::default(),
            budget: cache_budget(),
            dirty_bytes: 0,
            dirty_limit: MIN_DIRTY_BYTES,
            interval: 0,
            early: Tally::default(),
            scratch: Vec::new(),
        }
    }
}

/// Entries sent by early write-backs, and of them how many an early write-back of the
/// same checkpoint interval had sent already.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    sent: usize,
    again: usize,
}

impl Tally {
    /// Counts `entry` sent by an early write-back of `interval`.
    fn count(&mut self, early_in: &mut u32, interval: u32) {
        self.sent += 1;
        if *early_in == interval {
            self.again += 1;
        }
        *early_in = interval;
    }
}

/// How much went into the cache since it was last dropped. An upper bound: overwritten
/// entries are counted again, which only makes the cache drop earlier.
#[derive(Debug, Default)]
struct Usage {
    /// Bytes of keys and values, and [`ENTRY_OVERHEAD`] per entry.
    bytes: usize,
}

impl Usage {
    fn add(&mut self, ttl: bool, bytes: usize) {
        // Entries of TTL states leave the cache at the end of the call anyway.
        if !ttl {
            self.bytes += bytes + ENTRY_OVERHEAD;
        }
    }
}

#[derive(Debug)]
struct StateSlot {
    id: u32,
    name: String,
    kind: StateKind,
    ttl: bool,
    /// Value state: key -> value.
    values: FxHashMap<CacheKey, CachedValue>,
    /// Value state: keys written since the last write-back (each once while its entry is
    /// dirty).
    dirty_values: KeyList,
    /// Map state: key -> cached part of its map.
    maps: MapCaches,
    /// List state: key -> what the current call changed.
    lists: FxHashMap<Vec<u8>, ListOverlay>,
    /// Map state: entries (key, user key) written since the last write-back, in one
    /// buffer, each listed when it becomes dirty (again only if a clear or a remove took
    /// it out of the cache meanwhile). Each becomes one effect at the write-back.
    pending: PairList,
}

/// An encoded value of the value cache, inline when short (counts, sums, small records):
/// reading one touches the cache's table only, not a second allocation.
type ValueBytes = smallvec::SmallVec<[u8; 16]>;

/// A key of the value cache, inline when short (as most keys are), so that comparing the
/// key of a probed slot reads the table itself rather than chasing a pointer.
type CacheKey = smallvec::SmallVec<[u8; 16]>;

/// Pairs of byte strings in one buffer, so noting one allocates nothing once the buffer
/// has grown.
#[derive(Debug, Default)]
struct PairList {
    bytes: Vec<u8>,
    /// Where each pair's first and second string end.
    ends: Vec<(usize, usize)>,
}

impl PairList {
    fn push(&mut self, first: &[u8], second: &[u8]) {
        self.bytes.extend_from_slice(first);
        let middle = self.bytes.len();
        self.bytes.extend_from_slice(second);
        self.ends.push((middle, self.bytes.len()));
    }

    fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        let starts = std::iter::once(0).chain(self.ends.iter().map(|e| e.1));
        starts
            .zip(&self.ends)
            .map(|(start, &(middle, end))| (&self.bytes[start..middle], &self.bytes[middle..end]))
    }

    fn clear(&mut self) {
        self.bytes.clear();
        self.ends.clear();
    }
}

/// Keys in one buffer, so noting a key allocates nothing once the buffer has grown.
#[derive(Debug, Default)]
struct KeyList {
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl KeyList {
    fn push(&mut self, key: &[u8]) {
        self.bytes.extend_from_slice(key);
        self.ends.push(self.bytes.len());
    }

    fn iter(&self) -> impl Iterator<Item = &[u8]> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts
            .zip(&self.ends)
            .map(|(start, &end)| &self.bytes[start..end])
    }

    fn clear(&mut self) {
        self.bytes.clear();
        self.ends.clear();
    }
}

#[derive(Debug)]
struct CachedValue {
    /// `None`: known to be absent.
    value: Option<ValueBytes>,
    /// Written and not yet sent to the host.
    dirty: bool,
    /// The checkpoint interval whose early write-back last sent it ([`NEVER`]).
    early_in: u32,
}

/// Map state: key -> cached part of its map. `hashbrown` for `entry_ref`: finding a
/// key's cache, or making it, is one probe without copying the key.
type MapCaches = hashbrown::HashMap<Vec<u8>, MapCache, rustc_hash::FxBuildHasher>;

#[derive(Debug, Default)]
struct MapCache {
    /// `entries` holds every entry of the key, so a missing map key is absent.
    complete: bool,
    entries: BTreeMap<Vec<u8>, MapEntry>,
}

/// A cached map entry.
#[derive(Debug)]
struct MapEntry {
    /// `None`: known to be absent.
    value: Option<Vec<u8>>,
    /// Written and not yet sent to the host (and so listed in `pending`).
    dirty: bool,
    /// While dirty: the most bytes it counted towards the call's written bytes.
    counted: usize,
    /// The checkpoint interval whose early write-back last sent it ([`NEVER`]).
    early_in: u32,
}

impl MapEntry {
    /// As the host has it.
    fn clean(value: Option<Vec<u8>>) -> Self {
        MapEntry {
            value,
            dirty: false,
            counted: 0,
            early_in: NEVER,
        }
    }

    /// Notes a write of the entry `(key, user_key)`: listed for the next write-back the
    /// first time only, however often it is written until then.
    #[inline]
    fn written(
        &mut self,
        pending: &mut PairList,
        dirty_bytes: &mut usize,
        key: &[u8],
        user_key: &[u8],
    ) {
        let size = key.len() + user_key.len() + self.value.as_ref().map_or(0, Vec::len);
        if !self.dirty {
            self.dirty = true;
            self.counted = size;
            pending.push(key, user_key);
            *dirty_bytes += size;
        } else if size > self.counted {
            // A value that grows counts as it grows.
            *dirty_bytes += size - self.counted;
            self.counted = size;
        }
    }
}

#[derive(Debug, Default)]
struct ListOverlay {
    /// This call cleared the list, so the host's copy no longer counts.
    cleared: bool,
    /// Elements this call appended.
    appended: Vec<Vec<u8>>,
}

impl StateSlot {
    /// One effect per value written since the last write-back (however often it was
    /// written): a put, or a delete if it was removed.
    /// `early`: an early write-back, of which checkpoint interval, counted where.
    fn write_back_values(
        &mut self,
        effects: &mut EffectWriter,
        mut early: Option<(u32, &mut Tally)>,
    ) {
        for key in self.dirty_values.iter() {
            // A key cleared after its write is no longer dirty; one written again after a
            // clear is listed twice but sent once.
            let Some(cached) = self.values.get_mut(key).filter(|c| c.dirty) else {
                continue;
            };
            cached.dirty = false;
            if let Some((interval, tally)) = &mut early {
                tally.count(&mut cached.early_in, *interval);
            }
            effects.push(match &cached.value {
                Some(value) => Effect::Put {
                    state: self.id,
                    key,
                    user_key: &[],
                    value,
                },
                None => Effect::Delete {
                    state: self.id,
                    key,
                    user_key: &[],
                },
            });
        }
        self.dirty_values.clear();
    }

    /// One effect per map entry written since the last write-back, with its last value;
    /// an entry no longer cached (removed from a map held whole, or cleared) is deleted.
    fn send_pending_map_entries(
        &mut self,
        effects: &mut EffectWriter,
        mut early: Option<(u32, &mut Tally)>,
    ) {
        for (key, user_key) in self.pending.iter() {
            let entry = self
                .maps
                .get_mut(key)
                .and_then(|m| m.entries.get_mut(user_key));
            let value = match entry {
                Some(entry) if entry.dirty => {
                    entry.dirty = false;
                    if let Some((interval, tally)) = &mut early {
                        tally.count(&mut entry.early_in, *interval);
                    }
                    entry.value.as_deref()
                }
                // Listed twice (written again after a remove or a clear): sent already.
                Some(_) => continue,
                None => None,
            };
            effects.push(match value {
                Some(value) => Effect::Put {
                    state: self.id,
                    key,
                    user_key,
                    value,
                },
                None => Effect::Delete {
                    state: self.id,
                    key,
                    user_key,
                },
            });
        }
        self.pending.clear();
    }

    fn context(&self) -> impl FnOnce(Error) -> Error + '_ {
        move |e| e.context(format_args!("state `{}`", self.name))
    }
}

fn unknown_handle() -> Error {
    Error::failed("a state handle was used with an operator instance that did not declare it")
}

impl StateCache {
    /// Declares a state with the host and returns the slot its handle refers to.
    pub(crate) fn declare(
        &mut self,
        host: &dyn Host,
        name: &str,
        kind: StateKind,
        ttl: Option<Duration>,
    ) -> Result<usize> {
        let ttl_ms = match ttl {
            None => None,
            Some(ttl) if ttl < Duration::from_millis(1) => {
                return Err(Error::failed(format!(
                    "cannot declare state `{name}`: the time-to-live must be at least 1 ms"
                )));
            }
            Some(ttl) => Some(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX)),
        };
        let id = host
            .declare_state(name, kind, ttl_ms)
            .map_err(|e| Error::failed(format!("cannot declare state `{name}`: {e}")))?;
        // Declaring a name twice yields the same state: share the slot so the cache stays
        // coherent between the two handles.
        if let Some(i) = self.slots.iter().position(|s| s.id == id) {
            self.slots[i].ttl |= ttl_ms.is_some();
            return Ok(i);
        }
        self.slots.push(StateSlot {
            id,
            name: name.to_owned(),
            kind,
            ttl: ttl_ms.is_some(),
            values: FxHashMap::default(),
            dirty_values: KeyList::default(),
            maps: MapCaches::default(),
            lists: FxHashMap::default(),
            pending: PairList::default(),
        });
        Ok(self.slots.len() - 1)
    }

    /// Runs `f` on the cached value of `key` (with the state's name and its list of dirty
    /// keys), reading it from the host first when it is not cached.
    fn with_value<R>(
        &mut self,
        host: &dyn Host,
        slot: usize,
        key: &[u8],
        f: impl FnOnce(&str, &mut CachedValue, &mut KeyList, &mut usize) -> Result<R>,
    ) -> Result<R> {
        let s = self.slots.get_mut(slot).ok_or_else(unknown_handle)?;
        let cached = match s.values.get_mut(key) {
            Some(cached) => cached,
            None => {
                let value = host.state_get(s.id, key, &[]);
                self.usage
                    .add(s.ttl, key.len() + value.as_ref().map_or(0, Vec::len));
                let cached = CachedValue {
                    value: value.map(ValueBytes::from_vec),
                    dirty: false,
                    early_in: NEVER,
                };
                s.values.entry(CacheKey::from_slice(key)).or_insert(cached)
            }
        };
        f(&s.name, cached, &mut s.dirty_values, &mut self.dirty_bytes)
    }

    pub(crate) fn value_get<T: DeserializeOwned>(
        &mut self,
        host: &dyn Host,
        slot: usize,
        key: &[u8],
    ) -> Result<Option<T>> {
        self.with_value(host, slot, key, |name, cached, _, _| {
            decode_value(name, cached.value.as_deref())
        })
    }

    /// Reads, changes and writes back the value of `key` with one lookup in the cache:
    /// what [`ValueState::update`] does for every record of a counter. A `None` from `f`
    /// is left for the caller to clear.
    pub(crate) fn value_update<T: Serialize + DeserializeOwned>(
        &mut self,
        host: &dyn Host,
        slot: usize,
        key: &[u8],
        f: impl FnOnce(Option<T>) -> Option<T>,
    ) -> Result<Option<T>> {
        self.with_value(
            host,
            slot,
            key,
            |name, cached, dirty_values, dirty_bytes| {
                let new = f(decode_value(name, cached.value.as_deref())?);
                if let Some(value) = &new {
                    let mut buf = cached.value.take().unwrap_or_default();
                    buf.clear();
                    let encoded = postcard::to_extend(value, buf)
                        .map_err(|e| Error::from(e).context(format_args!("state `{name}`")))?;
                    if !cached.dirty {
                        cached.dirty = true;
                        dirty_values.push(key);
                        *dirty_bytes += key.len() + encoded.len();
                    }
                    cached.value = Some(encoded);
                }
                Ok(new)
            },
        )
    }

    #[cfg(test)]
    fn value_put(
        &mut self,
        _effects: &mut EffectWriter,
        slot: usize,
        key: &[u8],
        value: Vec<u8>,
    ) -> Result<()> {
        self.value_put_with(slot, key, |mut buf| {
            buf.clear();
            buf.extend_from_slice(&value);
            Ok(buf)
        })
    }

    /// Sets the value of `key` to what `encode` appends to an empty buffer; the buffer of
    /// the value it replaces is reused, so updating an entry allocates nothing.
    pub(crate) fn value_put_with(
        &mut self,
        slot: usize,
        key: &[u8],
        encode: impl FnOnce(ValueBytes) -> Result<ValueBytes>,
    ) -> Result<()> {
        let s = self.slots.get_mut(slot).ok_or_else(unknown_handle)?;
        match s.values.get_mut(key) {
            Some(cached) => {
                let mut buf = cached.value.take().unwrap_or_default();
                buf.clear();
                let value =
                    encode(buf).map_err(|e| e.context(format_args!("state `{}`", s.name)))?;
                if !cached.dirty {
                    cached.dirty = true;
                    s.dirty_values.push(key);
                    self.dirty_bytes += key.len() + value.len();
                }
                cached.value = Some(value);
            }
            None => {
                let value = encode(ValueBytes::new())
                    .map_err(|e| e.context(format_args!("state `{}`", s.name)))?;
                self.usage.add(s.ttl, key.len() + value.len());
                self.dirty_bytes += key.len() + value.len();
                let cached = CachedValue {
                    value: Some(value),
                    dirty: true,
                    early_in: NEVER,
                };
                s.values.insert(CacheKey::from_slice(key), cached);
                s.dirty_values.push(key);
            }
        }
        Ok(())
    }

    /// Removes every entry of `key` (the whole value, list or map).
    pub(crate) fn clear(
        &mut self,
        effects: &mut EffectWriter,
        slot: usize,
        key: &[u8],
    ) -> Result<()> {
        let s = self.slots.get_mut(slot).ok_or_else(unknown_handle)?;
        // Map entries of the key written earlier in this call are gone from the cache, so
        // at the end of the call they become deletes after this clear (changing nothing);
        // entries written after it become puts.
        effects.push(Effect::Clear { state: s.id, key });
        self.usage.add(s.ttl, key.len());
        match s.kind {
            StateKind::Value => {
                let absent = CachedValue {
                    value: None,
                    dirty: false,
                    early_in: NEVER,
                };
                s.values.insert(CacheKey::from_slice(key), absent);
            }
            StateKind::Map => {
                let empty = MapCache {
                    complete: true,
                    entries: BTreeMap::new(),
                };
                s.maps.insert(key.to_vec(), empty);
            }
            StateKind::List => {
                s.lists.insert(
                    key.to_vec(),
                    ListOverlay {
                        cleared: true,
                        appended: Vec::new(),
                    },
                );
            }
        }
        Ok(())
    }

    pub(crate) fn map_get<K: Serialize, V: DeserializeOwned>(
        &mut self,
        host: &dyn Host,
        slot: usize,
        key: &[u8],
        map_key: &K,
    ) -> Result<Option<V>> {
        let user_key = encode_into(&mut self.scratch, map_key)?;
        let result = self.map_get_encoded(host, slot, key, &user_key);
        self.scratch = user_key;
        result
    }

    fn map_get_encoded<V: DeserializeOwned>(
        &mut self,
        host: &dyn Host,
        slot: usize,
        key: &[u8],
        user_key: &[u8],
    ) -> Result<Option<V>> {
        let s = self.slots.get_mut(slot).ok_or_else(unknown_handle)?;
        let cache = map_cache(&mut s.maps, key);
        let name = &s.name;
        let entry = cached_map_entry(
            host,
            &mut self.usage,
            s.id,
            s.ttl,
            name,
            cache,
            key,
            user_key,
        )?;
        entry
            .and_then(|e| e.value.as_deref())
            .map(from_bytes)
            .transpose()
            .map_err(|e| e.context(format_args!("state `{name}`")))
    }

    /// Replaces the value of `map_key` in the map of `key` with what `f` makes of the
    /// current one (`None` removes it) and returns the new value: one lookup where a
    /// `get` and a `put` take two each.
    pub(crate) fn map_update<K: Serialize, V: Serialize + DeserializeOwned>(
        &mut self,
        host: &dyn Host,
        slot: usize,
        key: &[u8],
        map_key: &K,
        f: impl FnOnce(Option<V>) -> Option<V>,
    ) -> Result<Option<V>> {
        let user_key = encode_into(&mut self.scratch, map_key)?;
        let result = self.map_update_encoded(host, slot, key, &user_key, f);
        self.scratch = user_key;
        result
    }

    fn map_update_encoded<V: Serialize + DeserializeOwned>(
        &mut self,
        host: &dyn Host,
        slot: usize,
        key: &[u8],
        user_key: &[u8],
        f: impl FnOnce(Option<V>) -> Option<V>,
    ) -> Result<Option<V>> {
        let s = self.slots.get_mut(slot).ok_or_else(unknown_handle)?;
        let cache = map_cache(&mut s.maps, key);
        let name = &s.name;
        let context = |e: Error| e.context(format_args!("state `{name}`"));
        let entry = cached_map_entry(
            host,
            &mut self.usage,
            s.id,
            s.ttl,
            name,
            cache,
            key,
            user_key,
        )?;
        let old = match entry.as_ref().and_then(|e| e.value.as_deref()) {
            Some(bytes) => Some(from_bytes(bytes).map_err(context)?),
            None => None,
        };
        let was_present = old.is_some();
        let new = f(old);
        let (pending, dirty_bytes) = (&mut s.pending, &mut self.dirty_bytes);
        match (&new, entry) {
            (Some(value), Some(entry)) => {
                let mut buf = entry.value.take().unwrap_or_default();
                buf.clear();
                entry.value = Some(postcard::to_extend(value, buf).map_err(|e| context(e.into()))?);
                entry.written(pending, dirty_bytes, key, user_key);
            }
            (Some(value), None) => {
                let value =
                    postcard::to_extend(value, Vec::new()).map_err(|e| context(e.into()))?;
                self.usage
                    .add(s.ttl, key.len() + user_key.len() + value.len());
                let mut entry = MapEntry::clean(Some(value));
                entry.written(pending, dirty_bytes, key, user_key);
                cache.entries.insert(user_key.to_vec(), entry);
            }
            (None, Some(entry)) if was_present => {
                entry.value = None;
                entry.written(pending, dirty_bytes, key, user_key);
                if cache.complete {
                    // A complete map holds only what exists (the entry stays listed).
                    cache.entries.remove(user_key);
                }
            }
            (None, _) => {}
        }
        Ok(new)
    }

    #[cfg(test)]
    fn map_put(
        &mut self,
        _effects: &mut EffectWriter,
        slot: usize,
        key: &[u8],
        user_key: Vec<u8>,
        value: Vec<u8>,
    ) -> Result<()> {
        self.map_put_encoded(slot, key, &user_key, |mut buf| {
            buf.extend_from_slice(&value);
            Ok(buf)
        })
    }

    /// Sets `map_key` of `key` to what `encode` appends to an empty buffer. Neither the
    /// map key nor, when the entry is cached, the value needs an allocation.
    pub(crate) fn map_put_with<K: Serialize>(
        &mut self,
        slot: usize,
        key: &[u8],
        map_key: &K,
        encode: impl FnOnce(Vec<u8>) -> Result<Vec<u8>>,
    ) -> Result<()> {
        let user_key = encode_into(&mut self.scratch, map_key)?;
        let result = self.map_put_encoded(slot, key, &user_key, encode);
        self.scratch = user_key;
        result
    }

    fn map_put_encoded(
        &mut self,
        slot: usize,
        key: &[u8],
        user_key: &[u8],
        encode: impl FnOnce(Vec<u8>) -> Result<Vec<u8>>,
    ) -> Result<()> {
        let s = self.slots.get_mut(slot).ok_or_else(unknown_handle)?;
        let cache = map_cache(&mut s.maps, key);
        let name = &s.name;
        let context = |e: Error| e.context(format_args!("state `{name}`"));
        let entry = match cache.entries.get_mut(user_key) {
            Some(entry) => {
                let mut buf = entry.value.take().unwrap_or_default();
                buf.clear();
                entry.value = Some(encode(buf).map_err(context)?);
                entry
            }
            None => {
                let value = encode(Vec::new()).map_err(context)?;
                self.usage
                    .add(s.ttl, key.len() + user_key.len() + value.len());
                cache
                    .entries
                    .entry(user_key.to_vec())
                    .or_insert(MapEntry::clean(Some(value)))
            }
        };
        entry.written(&mut s.pending, &mut self.dirty_bytes, key, user_key);
        Ok(())
    }

    /// Removes `map_key` from the map of `key`, encoding it without an allocation.
    pub(crate) fn map_remove_key<K: Serialize>(
        &mut self,
        slot: usize,
        key: &[u8],
        map_key: &K,
    ) -> Result<()> {
        let user_key = encode_into(&mut self.scratch, map_key)?;
        let result = self.map_remove(slot, key, &user_key);
        self.scratch = user_key;
        result
    }

    fn map_remove(&mut self, slot: usize, key: &[u8], user_key: &[u8]) -> Result<()> {
        let s = self.slots.get_mut(slot).ok_or_else(unknown_handle)?;
        let (pending, dirty_bytes) = (&mut s.pending, &mut self.dirty_bytes);
        let cache = map_cache(&mut s.maps, key);
        if cache.complete {
            // Absent from a complete map, an entry is absent from the host too, or its
            // delete is listed already.
            if let Some(mut entry) = cache.entries.remove(user_key) {
                entry.value = None;
                entry.written(pending, dirty_bytes, key, user_key);
            }
        } else {
            let entry = match cache.entries.get_mut(user_key) {
                Some(entry) => entry,
                None => {
                    self.usage.add(s.ttl, key.len() + user_key.len());
                    cache
                        .entries
                        .entry(user_key.to_vec())
                        .or_insert(MapEntry::clean(None))
                }
            };
            entry.value = None;
            entry.written(pending, dirty_bytes, key, user_key);
        }
        Ok(())
    }

    /// Calls `f` with every `(map key, value)` of `key`, in ascending order of map key.
    pub(crate) fn map_for_each(
        &mut self,
        host: &dyn Host,
        slot: usize,
        key: &[u8],
        mut f: impl FnMut(&[u8], &[u8]) -> Result<()>,
    ) -> Result<()> {
        let s = self.slots.get_mut(slot).ok_or_else(unknown_handle)?;
        if !s.maps.get(key).is_some_and(|c| c.complete) {
            // The host's entries as of the start of the call, overlaid with what the cache
            // knows (which includes every write not yet applied by the host).
            let encoded = host.state_entries(s.id, key);
            let mut entries = BTreeMap::new();
            for entry in EntryReader::new(&encoded) {
                let (user_key, value) = entry
                    .map_err(|e| Error::from(e).context(format_args!("state `{}`", s.name)))?;
                self.usage.add(s.ttl, user_key.len() + value.len());
                entries.insert(user_key.to_vec(), MapEntry::clean(Some(value.to_vec())));
            }
            if let Some(known) = s.maps.remove(key) {
                // (A dirty entry known absent stays listed for its delete.)
                for (user_key, entry) in known.entries {
                    match entry.value {
                        Some(_) => entries.insert(user_key, entry),
                        None => entries.remove(&user_key),
                    };
                }
            }
            let complete = MapCache {
                complete: true,
                entries,
            };
            s.maps.insert(key.to_vec(), complete);
        }
        for (user_key, entry) in &s.maps[key].entries {
            if let Some(value) = &entry.value {
                f(user_key, value).map_err(s.context())?;
            }
        }
        Ok(())
    }

    pub(crate) fn list_add(
        &mut self,
        effects: &mut EffectWriter,
        slot: usize,
        key: &[u8],
        value: Vec<u8>,
    ) -> Result<()> {
        let s = self.slots.get_mut(slot).ok_or_else(unknown_handle)?;
        effects.push(Effect::Append {
            state: s.id,
            key,
            value: &value,
        });
        match s.lists.get_mut(key) {
            Some(overlay) => overlay.appended.push(value),
            None => {
                let overlay = ListOverlay {
                    cleared: false,
                    appended: vec![value],
                };
                s.lists.insert(key.to_vec(), overlay);
            }
        }
        Ok(())
    }

    /// Calls `f` with every element of the list of `key`, in append order.
    pub(crate) fn list_for_each(
        &mut self,
        host: &dyn Host,
        slot: usize,
        key: &[u8],
        mut f: impl FnMut(&[u8]) -> Result<()>,
    ) -> Result<()> {
        let s = self.slots.get(slot).ok_or_else(unknown_handle)?;
        let overlay = s.lists.get(key);
        if !overlay.is_some_and(|o| o.cleared) {
            let encoded = host.state_entries(s.id, key);
            for entry in EntryReader::new(&encoded) {
                let (_position, value) = entry
                    .map_err(|e| Error::from(e).context(format_args!("state `{}`", s.name)))?;
                f(value).map_err(s.context())?;
            }
        }
        for value in overlay.map_or(&[][..], |o| &o.appended) {
            f(value).map_err(s.context())?;
        }
        Ok(())
    }

    /// Ends a call: sends the call's pending writes to the host (one effect per entry,
    /// with its last value) and forgets what is only valid within one call; after a
    /// failure (whose effects the host drops) or when the cache grew too big, everything.
    pub(crate) fn end_call(&mut self, success: bool, effects: &mut EffectWriter) {
        let drop_all = !success || self.usage.bytes > self.budget;
        let heavy = self.dirty_bytes > self.dirty_limit;
        if drop_all || heavy {
            self.dirty_bytes = 0;
        }
        // An early write-back: for the many bytes written, not for a full cache.
        let early = success && heavy && !drop_all;
        let mut tally = Tally::default();
        for s in &mut self.slots {
            if success {
                // Values and map entries are written back at `snapshot` (or when the
                // cache is dropped, or the writes carried many bytes); states with a
                // time-to-live at the end of every call, since the host expires their
                // entries between calls.
                if s.ttl || drop_all || heavy {
                    let counted = early && !s.ttl;
                    s.write_back_values(effects, counted.then_some((self.interval, &mut tally)));
                    s.send_pending_map_entries(
                        effects,
                        counted.then_some((self.interval, &mut tally)),
                    );
                }
            } else {
                s.pending.clear();
            }
            s.lists.clear();
            if drop_all {
                // After a failed call the instance is discarded (its task fails), so
                // values not yet written back are given up with it.
                s.dirty_values.clear();
                s.values = FxHashMap::default();
                s.maps = MapCaches::default();
            } else if s.ttl {
                s.values.clear();
                s.maps.clear();
            }
        }
        if drop_all {
            self.usage = Usage::default();
        }
        if early {
            self.early.sent += tally.sent;
            self.early.again += tally.again;
            if tally.again * 2 > tally.sent {
                self.dirty_limit = (self.dirty_limit * 2).min(MAX_DIRTY_BYTES);
            }
        }
    }

    /// Sends every value written since it was last sent: what `snapshot` returns, so that
    /// the host's copy for the checkpoint holds it.
    pub(crate) fn write_back(&mut self, effects: &mut EffectWriter) {
        self.dirty_bytes = 0;
        for s in &mut self.slots {
            s.write_back_values(effects, None);
            s.send_pending_map_entries(effects, None);
        }
        // A new checkpoint interval.
        if self.early.sent > 0 && self.early.again * 4 < self.early.sent {
            self.dirty_limit = (self.dirty_limit / 2).max(MIN_DIRTY_BYTES);
        }
        self.early = Tally::default();
        self.interval = (self.interval + 1) % NEVER;
    }

    /// Number of value and map entries cached (for tests).
    #[cfg(test)]
    pub(crate) fn cached_entries(&self) -> usize {
        self.slots
            .iter()
            .map(|s| s.values.len() + s.maps.values().map(|m| m.entries.len()).sum::<usize>())
            .sum()
    }
}

/// A cached value of state `name`, decoded.
fn decode_value<T: DeserializeOwned>(name: &str, bytes: Option<&[u8]>) -> Result<Option<T>> {
    bytes
        .map(from_bytes)
        .transpose()
        .map_err(|e| e.context(format_args!("state `{name}`")))
}

/// `value` encoded into `buf` (cleared first); the buffer comes back either way.
#[inline]
fn encode_into<T: Serialize + ?Sized>(buf: &mut Vec<u8>, value: &T) -> Result<Vec<u8>> {
    let mut bytes = std::mem::take(buf);
    bytes.clear();
    postcard::to_extend(value, bytes).map_err(Error::from)
}

#[inline]
fn map_cache<'m>(maps: &'m mut MapCaches, key: &[u8]) -> &'m mut MapCache {
    maps.entry_ref(key).or_default()
}

/// The cached entry of `user_key` in the map of `key` (`Some(None)`: known absent), read
/// from the host first if it is not cached; `None` when the cache holds the whole map and
/// the entry is not in it. The first read of a key loads its whole map in one host call:
/// later reads of other map keys (a new window, say) are then answered here.
#[allow(clippy::too_many_arguments)]
#[inline]
fn cached_map_entry<'c>(
    host: &dyn Host,
    usage: &mut Usage,
    id: u32,
    ttl: bool,
    name: &str,
    cache: &'c mut MapCache,
    key: &[u8],
    user_key: &[u8],
) -> Result<Option<&'c mut MapEntry>> {
    if !cache.complete && cache.entries.is_empty() {
        let encoded = host.state_entries(id, key);
        for entry in EntryReader::new(&encoded) {
            let (k, v) =
                entry.map_err(|e| Error::from(e).context(format_args!("state `{name}`")))?;
            usage.add(ttl, k.len() + v.len());
            cache
                .entries
                .insert(k.to_vec(), MapEntry::clean(Some(v.to_vec())));
        }
        cache.complete = true;
    }
    if !cache.complete && !cache.entries.contains_key(user_key) {
        let value = host.state_get(id, key, user_key);
        usage.add(
            ttl,
            key.len() + user_key.len() + value.as_ref().map_or(0, Vec::len),
        );
        cache
            .entries
            .insert(user_key.to_vec(), MapEntry::clean(value));
    }
    Ok(cache.entries.get_mut(user_key))
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use sluice_codec::EntryWriter;

    use super::*;
    use crate::host::Level;
    use crate::to_bytes;

    /// A host whose every key holds `[0]` (value and map entries) and the entries `a`, `b`,
    /// and which counts reads.
    #[derive(Default)]
    struct CountingHost {
        gets: Cell<usize>,
        entry_reads: Cell<usize>,
    }

    impl Host for CountingHost {
        fn processing_time(&self) -> i64 {
            0
        }
        fn current_watermark(&self) -> i64 {
            i64::MIN
        }
        fn declare_state(&self, _: &str, kind: StateKind, _: Option<u64>) -> Result<u32, String> {
            Ok(kind as u32)
        }
        fn state_get(&self, _: u32, _: &[u8], _: &[u8]) -> Option<Vec<u8>> {
            self.gets.set(self.gets.get() + 1);
            Some(vec![0])
        }
        fn state_entries(&self, _: u32, _: &[u8]) -> Vec<u8> {
            self.entry_reads.set(self.entry_reads.get() + 1);
            let mut entries = EntryWriter::new();
            entries.push(&to_bytes("a").unwrap(), &[1]);
            entries.push(&to_bytes("b").unwrap(), &[2]);
            entries.into_bytes()
        }
        fn log(&self, _: Level, _: &str) {}
    }

    fn cache(host: &CountingHost, kind: StateKind, ttl: Option<Duration>) -> (StateCache, usize) {
        let mut cache = StateCache::default();
        let slot = cache.declare(host, "s", kind, ttl).unwrap();
        (cache, slot)
    }

    #[test]
    fn value_reads_go_to_the_host_once() {
        let host = CountingHost::default();
        let (mut cache, slot) = cache(&host, StateKind::Value, None);
        let mut effects = EffectWriter::new();
        for _ in 0..3 {
            assert_eq!(cache.value_get::<u8>(&host, slot, b"k").unwrap(), Some(0));
            cache.end_call(true, &mut effects);
        }
        assert_eq!(host.gets.get(), 1);
        // A write needs no read, and later reads see it.
        cache
            .value_put(&mut effects, slot, b"new", vec![5])
            .unwrap();
        cache.end_call(true, &mut effects);
        assert_eq!(cache.value_get::<u8>(&host, slot, b"new").unwrap(), Some(5));
        assert_eq!(host.gets.get(), 1);
        // Written back at the next snapshot, not at the end of the call.
        assert!(effects.take().is_empty());
        cache.write_back(&mut effects);
        let effects = effects.take();
        let effects: Vec<_> = sluice_codec::EffectReader::new(&effects)
            .map(Result::unwrap)
            .collect();
        assert_eq!(
            effects,
            [Effect::Put {
                state: 0,
                key: b"new",
                user_key: b"",
                value: &[5]
            }]
        );
    }

    #[test]
    fn written_values_go_back_once_each_after_the_clears() {
        let host = CountingHost::default();
        let (mut cache, slot) = cache(&host, StateKind::Value, None);
        let mut effects = EffectWriter::new();
        for v in 1..=100u8 {
            cache.value_put(&mut effects, slot, b"k", vec![v]).unwrap();
        }
        cache
            .value_put(&mut effects, slot, b"gone", vec![1])
            .unwrap();
        cache.clear(&mut effects, slot, b"gone").unwrap();
        cache.clear(&mut effects, slot, b"k2").unwrap();
        cache.value_put(&mut effects, slot, b"k2", vec![9]).unwrap();
        // Written, cleared and written again: the clear, then the last value once.
        for v in [1, 2] {
            cache
                .value_put(&mut effects, slot, b"again", vec![v])
                .unwrap();
            if v == 1 {
                cache.clear(&mut effects, slot, b"again").unwrap();
            }
        }
        cache.end_call(true, &mut effects);
        cache.write_back(&mut effects);
        let bytes = effects.take();
        let mut got: Vec<_> = sluice_codec::EffectReader::new(&bytes)
            .map(Result::unwrap)
            .collect();
        // Clears go first, as they happened; then each written entry once, last value.
        let writes = got.split_off(3);
        assert_eq!(
            got,
            [
                Effect::Clear {
                    state: 0,
                    key: b"gone"
                },
                Effect::Clear {
                    state: 0,
                    key: b"k2"
                },
                Effect::Clear {
                    state: 0,
                    key: b"again"
                }
            ]
        );
        let mut writes: Vec<(Vec<u8>, Vec<u8>)> = writes
            .into_iter()
            .map(|e| match e {
                Effect::Put { key, value, .. } => (key.to_vec(), value.to_vec()),
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        writes.sort();
        assert_eq!(
            writes,
            [
                (b"again".to_vec(), vec![2]),
                (b"k".to_vec(), vec![100]),
                (b"k2".to_vec(), vec![9])
            ]
        );
    }

    #[test]
    fn updates_read_the_host_once_and_go_back_once_per_snapshot() {
        let host = CountingHost::default();
        let (mut cache, slot) = cache(&host, StateKind::Value, None);
        let mut effects = EffectWriter::new();
        for round in 0..2u8 {
            for _call in 0..3 {
                for _ in 0..10 {
                    let new = cache
                        .value_update::<u8>(&host, slot, b"k", |n| Some(n.unwrap_or(0) + 1))
                        .unwrap();
                    assert!(new.is_some());
                }
                cache.end_call(true, &mut effects);
                assert!(effects.take().is_empty());
            }
            cache.write_back(&mut effects);
            let bytes = effects.take();
            let got: Vec<_> = sluice_codec::EffectReader::new(&bytes)
                .map(Result::unwrap)
                .collect();
            // The host's value was 0: 30 at the first write-back, 60 at the second.
            assert_eq!(
                got,
                [Effect::Put {
                    state: 0,
                    key: b"k",
                    user_key: b"",
                    value: &[30 * (round + 1)]
                }]
            );
            // Nothing written since: nothing to write back.
            cache.write_back(&mut effects);
            assert!(effects.take().is_empty());
        }
        assert_eq!(host.gets.get(), 1);
        // `None` leaves the cached value alone (the caller clears) and writes nothing.
        let new = cache
            .value_update::<u8>(&host, slot, b"k", |_| None)
            .unwrap();
        assert_eq!(new, None);
        cache.end_call(true, &mut effects);
        cache.write_back(&mut effects);
        assert!(effects.take().is_empty());
    }

    #[test]
    fn an_entry_written_often_is_listed_and_sent_once() {
        let host = CountingHost::default();
        let (mut cache, slot) = cache(&host, StateKind::Map, None);
        let mut effects = EffectWriter::new();
        let user_key = to_bytes("w").unwrap();
        for call in 0..3u8 {
            for i in 0..1000u32 {
                let value = (i as u8).wrapping_add(call);
                cache
                    .map_put(&mut effects, slot, b"k", user_key.clone(), vec![value])
                    .unwrap();
                cache
                    .map_update::<String, u8>(&host, slot, b"k", &"u".to_string(), |v| {
                        Some(v.unwrap_or(0).wrapping_add(1))
                    })
                    .unwrap();
            }
            cache.end_call(true, &mut effects);
        }
        assert!(effects.take().is_empty());
        assert_eq!(cache.slots[slot].pending.ends.len(), 2);
        cache.write_back(&mut effects);
        let bytes = effects.take();
        let mut got: Vec<_> = sluice_codec::EffectReader::new(&bytes)
            .map(Result::unwrap)
            .collect();
        got.sort_by_key(|e| format!("{e:?}"));
        let u = to_bytes("u").unwrap();
        // "u" was read from the host as [0], then incremented 3000 times.
        let expected = [
            Effect::Put {
                state: 2,
                key: b"k",
                user_key: &u,
                value: &[(3000 % 256) as u8],
            },
            Effect::Put {
                state: 2,
                key: b"k",
                user_key: &user_key,
                value: &[(999 + 2) as u8],
            },
        ];
        assert_eq!(got, expected);
        // Sent: nothing is left to send.
        cache.write_back(&mut effects);
        assert!(effects.take().is_empty());
    }

    #[test]
    fn large_writes_go_back_at_the_end_of_the_call() {
        let host = CountingHost::default();
        let (mut cache, slot) = cache(&host, StateKind::Value, None);
        let mut effects = EffectWriter::new();
        let big = MIN_DIRTY_BYTES / 16 + 1;
        for i in 0..16u32 {
            cache
                .value_put(&mut effects, slot, &i.to_le_bytes(), vec![1; big])
                .unwrap();
        }
        cache.end_call(true, &mut effects);
        let bytes = effects.take();
        assert_eq!(sluice_codec::EffectReader::new(&bytes).count(), 16);
        // Small writes wait for the snapshot again.
        cache.value_put(&mut effects, slot, b"k", vec![1]).unwrap();
        cache.end_call(true, &mut effects);
        assert!(effects.take().is_empty());
    }

    /// Effects sent at the end of a call that wrote the values of `keys` (8-byte keys,
    /// values of `len` bytes).
    fn call_writing(
        cache: &mut StateCache,
        slot: usize,
        effects: &mut EffectWriter,
        keys: std::ops::Range<u64>,
        len: usize,
    ) -> usize {
        for i in keys {
            cache
                .value_put(effects, slot, &i.to_le_bytes(), vec![1; len])
                .unwrap();
        }
        cache.end_call(true, effects);
        sluice_codec::EffectReader::new(&effects.take()).count()
    }

    #[test]
    fn keys_written_over_and_over_wait_for_the_snapshot() {
        let host = CountingHost::default();
        let (mut cache, slot) = cache(&host, StateKind::Value, None);
        let mut effects = EffectWriter::new();
        // 50,000 keys of 16 bytes written in every call: 800 KB, three times the first
        // limit. The first two calls send them early; the second sent them all again,
        // and so did the third (at twice the limit): from then on they fit.
        let keys = 0..50_000;
        let sent: Vec<usize> = (0..10)
            .map(|_| call_writing(&mut cache, slot, &mut effects, keys.clone(), 8))
            .collect();
        assert_eq!(sent, [50_000, 50_000, 50_000, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(cache.dirty_limit, 4 * MIN_DIRTY_BYTES);
        // The snapshot sends each once; the limit stays for the next interval.
        cache.write_back(&mut effects);
        assert_eq!(
            sluice_codec::EffectReader::new(&effects.take()).count(),
            50_000
        );
        assert_eq!(cache.dirty_limit, 4 * MIN_DIRTY_BYTES);
        assert_eq!(call_writing(&mut cache, slot, &mut effects, keys, 8), 0);
    }

    #[test]
    fn new_keys_go_back_early_and_bring_the_limit_down() {
        let host = CountingHost::default();
        let (mut cache, slot) = cache(&host, StateKind::Value, None);
        let mut effects = EffectWriter::new();
        // 5,000 new keys in every call (360 KB): each call sends its own, and the limit
        // stays where it starts.
        let new_keys = |call: u64| call * 5_000..(call + 1) * 5_000;
        for call in 0..10 {
            assert_eq!(
                call_writing(&mut cache, slot, &mut effects, new_keys(call), 64),
                5_000
            );
        }
        assert_eq!(cache.dirty_limit, MIN_DIRTY_BYTES);
        // Raised by keys sent again in the same interval (20,000 of 16 bytes, 320 KB)...
        assert_eq!(
            call_writing(&mut cache, slot, &mut effects, 0..20_000, 8),
            20_000
        );
        assert_eq!(cache.dirty_limit, 2 * MIN_DIRTY_BYTES);
        assert_eq!(
            call_writing(&mut cache, slot, &mut effects, 0..20_000, 8),
            0
        );
        cache.write_back(&mut effects);
        effects.take();
        assert_eq!(cache.dirty_limit, 2 * MIN_DIRTY_BYTES);
        // ... and lowered after an interval whose early write-backs sent new keys.
        let sent: usize = (10..16)
            .map(|call| call_writing(&mut cache, slot, &mut effects, new_keys(call), 64))
            .sum();
        assert_eq!(sent, 30_000);
        cache.write_back(&mut effects);
        assert_eq!(cache.dirty_limit, MIN_DIRTY_BYTES);
    }

    #[test]
    fn a_map_entry_that_grows_large_goes_back_at_the_end_of_the_call() {
        let host = CountingHost::default();
        let (mut cache, slot) = cache(&host, StateKind::Map, None);
        let mut effects = EffectWriter::new();
        let user_key = to_bytes("w").unwrap();
        // Dirty while small (and while removed), then large.
        cache
            .map_put(&mut effects, slot, b"k", user_key.clone(), vec![1])
            .unwrap();
        cache.map_remove(slot, b"k", &user_key).unwrap();
        cache.end_call(true, &mut effects);
        assert!(effects.take().is_empty());
        cache
            .map_put(
                &mut effects,
                slot,
                b"k",
                user_key.clone(),
                vec![1; MIN_DIRTY_BYTES],
            )
            .unwrap();
        cache.end_call(true, &mut effects);
        let bytes = effects.take();
        assert_eq!(sluice_codec::EffectReader::new(&bytes).count(), 1);
    }

    /// Room in the cache for `n` entries of a 4-byte key and a 1-byte value.
    fn room_for(n: usize) -> usize {
        n * (4 + 1 + ENTRY_OVERHEAD)
    }

    #[test]
    fn a_full_cache_writes_back_before_it_is_dropped() {
        let host = CountingHost::default();
        let (mut cache, slot) = cache(&host, StateKind::Value, None);
        cache.budget = room_for(1000);
        let mut effects = EffectWriter::new();
        let n = 1001;
        for i in 0..n as u32 {
            cache
                .value_put(&mut effects, slot, &i.to_le_bytes(), vec![1])
                .unwrap();
        }
        cache.end_call(true, &mut effects);
        let bytes = effects.take();
        assert_eq!(sluice_codec::EffectReader::new(&bytes).count(), n);
        assert_eq!(cache.cached_entries(), 0);
        cache.write_back(&mut effects);
        assert!(effects.take().is_empty());
    }

    #[test]
    fn ttl_states_are_cached_only_within_a_call() {
        let host = CountingHost::default();
        let (mut cache, slot) = cache(&host, StateKind::Value, Some(Duration::from_secs(1)));
        let mut effects = EffectWriter::new();
        cache.value_put(&mut effects, slot, b"k", vec![7]).unwrap();
        assert_eq!(cache.value_get::<u8>(&host, slot, b"k").unwrap(), Some(7));
        cache.end_call(true, &mut effects);
        assert_eq!(cache.value_get::<u8>(&host, slot, b"k").unwrap(), Some(0));
        assert_eq!(host.gets.get(), 1);
        let err = cache
            .declare(&host, "zero", StateKind::Value, Some(Duration::ZERO))
            .unwrap_err();
        assert!(err.message().contains("at least 1 ms"), "{err}");
    }

    #[test]
    fn the_cache_takes_a_quarter_of_the_memory_limit() {
        // Unset in a native test: the host's default limit.
        assert_eq!(std::env::var(MEMORY_VARIABLE).ok(), None);
        assert_eq!(cache_budget(), 64 << 20);
        let host = CountingHost::default();
        let (mut cache, slot) = cache(&host, StateKind::Value, None);
        let mut effects = EffectWriter::new();
        // 200,000 small counts stay cached.
        for i in 0..200_000u32 {
            cache
                .value_put(&mut effects, slot, &i.to_le_bytes(), vec![1])
                .unwrap();
        }
        cache.end_call(true, &mut effects);
        assert_eq!(cache.cached_entries(), 200_000);
    }

    #[test]
    fn a_failed_call_drops_the_cache() {
        let host = CountingHost::default();
        let (mut cache, slot) = cache(&host, StateKind::Value, None);
        let mut effects = EffectWriter::new();
        cache.value_put(&mut effects, slot, b"k", vec![7]).unwrap();
        cache.end_call(false, &mut effects);
        assert_eq!(cache.cached_entries(), 0);
        assert_eq!(cache.value_get::<u8>(&host, slot, b"k").unwrap(), Some(0));
    }

    #[test]
    fn the_cache_is_bounded() {
        let host = CountingHost::default();
        let (mut cache, slot) = cache(&host, StateKind::Value, None);
        cache.budget = room_for(1000);
        let mut effects = EffectWriter::new();
        for i in 0..1000u32 {
            cache
                .value_put(&mut effects, slot, &i.to_le_bytes(), vec![1])
                .unwrap();
        }
        cache.end_call(true, &mut effects);
        assert_eq!(cache.cached_entries(), 1000);
        cache
            .value_put(&mut effects, slot, b"more", vec![1])
            .unwrap();
        cache.end_call(true, &mut effects);
        assert_eq!(cache.cached_entries(), 0);
    }

    #[test]
    fn map_writes_go_back_once_per_entry_and_respect_clears() {
        let host = CountingHost::default();
        let (mut cache, slot) = cache(&host, StateKind::Map, None);
        let mut effects = EffectWriter::new();
        let put = |cache: &mut StateCache, key: &[u8], map_key: &str, value: u8| {
            cache
                .map_put_with(slot, key, &map_key, |mut buf| {
                    buf.push(value);
                    Ok(buf)
                })
                .unwrap()
        };
        for v in 1..=50 {
            put(&mut cache, b"k", "a", v);
        }
        put(&mut cache, b"k", "b", 1);
        put(&mut cache, b"gone", "x", 1);
        cache.clear(&mut effects, slot, b"gone").unwrap();
        put(&mut cache, b"gone", "y", 2);
        cache.end_call(true, &mut effects);
        cache.write_back(&mut effects);
        // Applied in order, the effects leave exactly the call's final entries.
        let bytes = effects.take();
        let host = ModelHost::default();
        host.apply(&bytes);
        let model = host.entries.into_inner();
        let puts = sluice_codec::EffectReader::new(&bytes)
            .filter(|e| matches!(e, Ok(Effect::Put { .. })))
            .count();
        let entry = |k: &[u8], m: &str, v: u8| ((k.to_vec(), to_bytes(m).unwrap()), vec![v]);
        assert_eq!(
            model,
            BTreeMap::from([
                entry(b"gone", "y", 2),
                entry(b"k", "a", 50),
                entry(b"k", "b", 1)
            ])
        );
        // One put per entry written, however often: a, b and y.
        assert_eq!(puts, 3);
    }

    type Entries = BTreeMap<(Vec<u8>, Vec<u8>), Vec<u8>>;

    /// A host that keeps map entries and applies a call's effects after it, as the real
    /// one does.
    #[derive(Default)]
    struct ModelHost {
        entries: std::cell::RefCell<Entries>,
    }

    impl ModelHost {
        fn apply(&self, effects: &[u8]) {
            let mut entries = self.entries.borrow_mut();
            for effect in sluice_codec::EffectReader::new(effects) {
                match effect.unwrap() {
                    Effect::Put {
                        key,
                        user_key,
                        value,
                        ..
                    } => {
                        entries.insert((key.to_vec(), user_key.to_vec()), value.to_vec());
                    }
                    Effect::Delete { key, user_key, .. } => {
                        entries.remove(&(key.to_vec(), user_key.to_vec()));
                    }
                    Effect::Clear { key, .. } => entries.retain(|(k, _), _| k != key),
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
    }

    impl Host for ModelHost {
        fn processing_time(&self) -> i64 {
            0
        }
        fn current_watermark(&self) -> i64 {
            i64::MIN
        }
        fn declare_state(&self, _: &str, _: StateKind, _: Option<u64>) -> Result<u32, String> {
            Ok(1)
        }
        fn state_get(&self, _: u32, key: &[u8], user_key: &[u8]) -> Option<Vec<u8>> {
            let entries = self.entries.borrow();
            entries.get(&(key.to_vec(), user_key.to_vec())).cloned()
        }
        fn state_entries(&self, _: u32, key: &[u8]) -> Vec<u8> {
            let mut out = EntryWriter::new();
            for ((k, user_key), value) in self.entries.borrow().iter() {
                if k == key {
                    out.push(user_key, value);
                }
            }
            out.into_bytes()
        }
        fn log(&self, _: Level, _: &str) {}
    }

    /// Random puts, updates, removes, clears and reads of a few map entries over many
    /// calls, against a plain map: every read sees the last write, and the host holds
    /// exactly the plain map after each write-back however the writes were batched
    /// (instances started from the host's entries read the same).
    #[test]
    fn map_state_behaves_as_a_plain_map_across_calls_and_write_backs() {
        let host = ModelHost::default();
        let mut cache = StateCache::default();
        let slot = cache.declare(&host, "m", StateKind::Map, None).unwrap();
        let mut effects = EffectWriter::new();
        let mut model: BTreeMap<(Vec<u8>, u8), u8> = BTreeMap::new();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for step in 0..20_000 {
            let key = vec![b'k', next(3) as u8];
            let map_key = next(4) as u8;
            let value = next(256) as u8;
            match next(8) {
                0 | 1 => {
                    cache
                        .map_put_with(slot, &key, &map_key, |mut b| {
                            b.push(value);
                            Ok(b)
                        })
                        .unwrap();
                    model.insert((key.clone(), map_key), value);
                }
                2 | 3 => {
                    let got = cache
                        .map_update::<u8, u8>(&host, slot, &key, &map_key, |v| {
                            (!value.is_multiple_of(4)).then(|| v.unwrap_or(0).wrapping_add(value))
                        })
                        .unwrap();
                    let m = model.entry((key.clone(), map_key));
                    let want = (!value.is_multiple_of(4)).then(|| match &m {
                        std::collections::btree_map::Entry::Occupied(o) => {
                            o.get().wrapping_add(value)
                        }
                        std::collections::btree_map::Entry::Vacant(_) => value,
                    });
                    match want {
                        Some(v) => {
                            m.insert_entry(v);
                        }
                        None => {
                            if let std::collections::btree_map::Entry::Occupied(o) = m {
                                o.remove();
                            }
                        }
                    }
                    assert_eq!(got, want, "step {step}");
                }
                4 => {
                    cache.map_remove_key(slot, &key, &map_key).unwrap();
                    model.remove(&(key.clone(), map_key));
                }
                5 if next(4) == 0 => {
                    cache.clear(&mut effects, slot, &key).unwrap();
                    model.retain(|(k, _), _| *k != key);
                }
                6 => {
                    let mut seen = Vec::new();
                    cache
                        .map_for_each(&host, slot, &key, |u, v| {
                            seen.push((from_bytes::<u8>(u)?, v[0]));
                            Ok(())
                        })
                        .unwrap();
                    let want: Vec<(u8, u8)> = model
                        .iter()
                        .filter(|((k, _), _)| *k == key)
                        .map(|((_, m), v)| (*m, *v))
                        .collect();
                    assert_eq!(seen, want, "step {step}");
                }
                _ => {
                    let got = cache
                        .map_get::<u8, u8>(&host, slot, &key, &map_key)
                        .unwrap();
                    assert_eq!(
                        got,
                        model.get(&(key.clone(), map_key)).copied(),
                        "step {step}"
                    );
                }
            }
            if next(20) == 0 {
                cache.end_call(true, &mut effects);
                let snapshot = next(5) == 0;
                if snapshot {
                    cache.write_back(&mut effects);
                }
                host.apply(&effects.take());
                if snapshot && next(2) == 0 {
                    // A new instance (as after a restore) reads only what the host has.
                    cache = StateCache::default();
                    cache.declare(&host, "m", StateKind::Map, None).unwrap();
                }
            }
        }
        cache.end_call(true, &mut effects);
        cache.write_back(&mut effects);
        host.apply(&effects.take());
        let held: BTreeMap<(Vec<u8>, u8), u8> = host
            .entries
            .borrow()
            .iter()
            .map(|((k, u), v)| ((k.clone(), from_bytes(u).unwrap()), v[0]))
            .collect();
        assert_eq!(held, model);
    }

    #[test]
    fn map_entries_are_read_once_then_served_from_the_cache() {
        let host = CountingHost::default();
        let (mut cache, slot) = cache(&host, StateKind::Map, None);
        let mut effects = EffectWriter::new();
        let key = |s: &str| to_bytes(s).unwrap();
        cache.map_remove(slot, b"k", &key("a")).unwrap();
        cache
            .map_put(&mut effects, slot, b"k", key("c"), vec![3])
            .unwrap();
        let mut seen = Vec::new();
        let mut collect = |cache: &mut StateCache| {
            seen.clear();
            cache
                .map_for_each(&host, slot, b"k", |k, v| {
                    seen.push((from_bytes::<String>(k)?, v[0]));
                    Ok(())
                })
                .unwrap();
            seen.clone()
        };
        let expected = [("b".to_owned(), 2), ("c".to_owned(), 3)];
        assert_eq!(collect(&mut cache), expected);
        cache.end_call(true, &mut effects);
        assert_eq!(collect(&mut cache), expected);
        assert_eq!(host.entry_reads.get(), 1);
        // The complete map also answers point reads, including absent ones.
        assert_eq!(
            cache
                .map_get_encoded::<u8>(&host, slot, b"k", &key("zz"))
                .unwrap(),
            None
        );
        assert_eq!(host.gets.get(), 0);
    }

    #[test]
    fn map_update_reads_writes_and_removes_in_one_step() {
        let host = CountingHost::default();
        let (mut cache, slot) = cache(&host, StateKind::Map, None);
        let mut effects = EffectWriter::new();
        let update = |cache: &mut StateCache, map_key: &str, f: fn(Option<u8>) -> Option<u8>| {
            cache
                .map_update(&host, slot, b"k", &map_key.to_owned(), f)
                .unwrap()
        };
        // The host holds a = 1 and b = 2.
        assert_eq!(update(&mut cache, "a", |v| v.map(|v| v + 10)), Some(11));
        assert_eq!(update(&mut cache, "a", |v| v.map(|v| v + 10)), Some(21));
        assert_eq!(update(&mut cache, "b", |_| None), None);
        assert_eq!(update(&mut cache, "z", |v| Some(v.unwrap_or(5))), Some(5));
        assert_eq!(update(&mut cache, "y", |v| v), None);
        cache.end_call(true, &mut effects);
        assert!(effects.take().is_empty(), "written back at the snapshot");
        cache.write_back(&mut effects);
        let bytes = effects.take();
        let mut model = BTreeMap::from([("a".to_owned(), 1u8), ("b".to_owned(), 2)]);
        for effect in sluice_codec::EffectReader::new(&bytes) {
            match effect.unwrap() {
                Effect::Put {
                    user_key, value, ..
                } => {
                    model.insert(from_bytes(user_key).unwrap(), from_bytes(value).unwrap());
                }
                Effect::Delete { user_key, .. } => {
                    model.remove(&from_bytes::<String>(user_key).unwrap());
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        let expected = BTreeMap::from([("a".to_owned(), 21), ("z".to_owned(), 5)]);
        assert_eq!(model, expected);
        let mut cached = BTreeMap::new();
        cache
            .map_for_each(&host, slot, b"k", |k, v| {
                cached.insert(from_bytes::<String>(k)?, from_bytes::<u8>(v)?);
                Ok(())
            })
            .unwrap();
        assert_eq!(cached, expected);
        assert_eq!((host.entry_reads.get(), host.gets.get()), (1, 0));
    }

    #[test]
    fn the_first_read_of_a_key_loads_its_whole_map() {
        let host = CountingHost::default();
        let (mut cache, slot) = cache(&host, StateKind::Map, None);
        let key = |s: &str| to_bytes(s).unwrap();
        assert_eq!(
            cache
                .map_get_encoded::<u8>(&host, slot, b"k", &key("a"))
                .unwrap(),
            Some(1)
        );
        // Other map keys, present or not, need no further host call.
        assert_eq!(
            cache
                .map_get_encoded::<u8>(&host, slot, b"k", &key("b"))
                .unwrap(),
            Some(2)
        );
        assert_eq!(
            cache
                .map_get_encoded::<u8>(&host, slot, b"k", &key("new"))
                .unwrap(),
            None
        );
        assert_eq!((host.entry_reads.get(), host.gets.get()), (1, 0));
    }

    #[test]
    fn decode_errors_name_the_state() {
        let host = CountingHost::default();
        let (mut cache, slot) = cache(&host, StateKind::Value, None);
        let err = cache.value_get::<(u8, u8)>(&host, slot, b"k").unwrap_err();
        assert!(err.message().starts_with("state `s`: "), "{err}");
    }
}
