//! Where the heap backend keeps its entries: per key group, `(state, key)` prefixes in
//! shards of copy-on-write hash tables, each to a [`Slot`] (a value state's one entry, or
//! a list or map state's entries by user key), values inline when short.

use std::hash::BuildHasher;
use std::sync::Arc;

use hashbrown::HashTable;
use imbl::OrdMap;
use smallvec::SmallVec;

/// One stored entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The bytes the operator stored.
    pub value: Value,
    /// Processing time of the last write, for TTL.
    pub written_at: i64,
}

/// The value of an entry: inline when short, shared when long. Most values (counts,
/// sums, window accumulators) are a few bytes; inline, reading or overwriting one touches
/// its hash-table slot only, not a second cache line elsewhere in the heap. A long value
/// is shared, so copying a shard for a snapshot copies a pointer, not the bytes.
#[derive(Clone)]
pub struct Value(Repr);

#[derive(Clone)]
enum Repr {
    /// `len` ≤ [`INLINE`] bytes at the start of `bytes`.
    Inline {
        len: u8,
        bytes: [u8; INLINE],
    },
    Shared(Arc<[u8]>),
}

/// The longest value kept inline: with its length and the enum's tag, the size of the
/// shared form (a fat pointer) rounded up, 24 bytes.
const INLINE: usize = 22;

impl Value {
    /// Overwrites the value in place when it fits (inline, or shared by nobody with the
    /// same length); otherwise stores a new one.
    fn set(&mut self, value: &[u8]) {
        match &mut self.0 {
            Repr::Inline { len, bytes } if value.len() <= INLINE => {
                bytes[..value.len()].copy_from_slice(value);
                *len = value.len() as u8;
            }
            Repr::Shared(shared) => match Arc::get_mut(shared) {
                Some(bytes) if bytes.len() == value.len() => bytes.copy_from_slice(value),
                _ => *self = Value::from(value),
            },
            _ => *self = Value::from(value),
        }
    }
}

impl From<&[u8]> for Value {
    fn from(value: &[u8]) -> Self {
        Value(if value.len() <= INLINE {
            let mut bytes = [0; INLINE];
            bytes[..value.len()].copy_from_slice(value);
            Repr::Inline {
                len: value.len() as u8,
                bytes,
            }
        } else {
            Repr::Shared(value.into())
        })
    }
}

impl std::ops::Deref for Value {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.0 {
            Repr::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Repr::Shared(bytes) => bytes,
        }
    }
}

impl PartialEq for Value {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for Value {}

impl std::fmt::Debug for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// `state id ‖ key length ‖ key`, inline when short (as most are).
pub(super) type Prefix = SmallVec<[u8; 24]>;

/// One key group: `(state, key)` to its entries, in [`SHARDS`] hash tables, each shared
/// with the snapshots taken since it was last written (copy-on-write per shard). A point
/// access hashes once and probes one table.
#[derive(Debug, Clone)]
pub(super) struct Group {
    /// Shared as a whole too, so a snapshot copies one pointer per key group.
    shards: Arc<Vec<Arc<Shard>>>,
}

/// One shard of a key group.
type Shard = HashTable<(Prefix, Slot)>;

/// Shards per key group: the first write to a shard after a snapshot copies that shard
/// only (and the group's list of shards).
const SHARDS: usize = 16;

/// The hash of every prefix in this process (one seed, so that a restored snapshot's
/// tables can be shared as they are).
fn hash_of(prefix: &[u8]) -> u64 {
    static SEED: std::sync::OnceLock<foldhash::fast::RandomState> = std::sync::OnceLock::new();
    SEED.get_or_init(foldhash::fast::RandomState::default)
        .hash_one(prefix)
}

/// The shard of a hash: bits the tables themselves use neither for the bucket (low bits)
/// nor for the control byte (top bits).
fn shard_of(hash: u64) -> usize {
    ((hash >> 32) as usize) % SHARDS
}

impl Default for Group {
    fn default() -> Self {
        Group {
            shards: Arc::new((0..SHARDS).map(|_| Arc::new(HashTable::new())).collect()),
        }
    }
}

impl Group {
    pub(super) fn get(&self, prefix: &[u8]) -> Option<&Slot> {
        let hash = hash_of(prefix);
        self.shards[shard_of(hash)]
            .find(hash, |(k, _)| k[..] == *prefix)
            .map(|(_, slot)| slot)
    }

    pub(super) fn get_mut(&mut self, prefix: &[u8]) -> Option<&mut Slot> {
        let hash = hash_of(prefix);
        // Copies the shard if a snapshot shares it (a miss is followed by an insert,
        // which would copy it anyway).
        Arc::make_mut(&mut Arc::make_mut(&mut self.shards)[shard_of(hash)])
            .find_mut(hash, |(k, _)| k[..] == *prefix)
            .map(|(_, slot)| slot)
    }

    /// Inserts a `(state, key)` that is not there.
    pub(super) fn insert_new(&mut self, prefix: Prefix, slot: Slot) {
        let hash = hash_of(&prefix);
        Arc::make_mut(&mut Arc::make_mut(&mut self.shards)[shard_of(hash)]).insert_unique(
            hash,
            (prefix, slot),
            |(k, _)| hash_of(k),
        );
    }

    pub(super) fn remove(&mut self, prefix: &[u8]) -> Option<Slot> {
        let hash = hash_of(prefix);
        self.shards[shard_of(hash)].find(hash, |(k, _)| k[..] == *prefix)?;
        let shard = &mut Arc::make_mut(&mut self.shards)[shard_of(hash)];
        match Arc::make_mut(shard).find_entry(hash, |(k, _)| k[..] == *prefix) {
            Ok(entry) => Some(entry.remove().0.1),
            Err(_) => None,
        }
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&Prefix, &Slot)> {
        self.shards
            .iter()
            .flat_map(|shard| shard.iter().map(|(k, slot)| (k, slot)))
    }

    pub(super) fn is_empty(&self) -> bool {
        self.shards.iter().all(|shard| shard.is_empty())
    }
}

/// The entries of one `(state, key)`.
#[derive(Debug, Clone)]
pub(super) enum Slot {
    /// One entry under the empty user key (a value state).
    One(Entry),
    /// Entries by user key (a list or map state), in order.
    Many(OrdMap<Prefix, Entry>),
}

impl Slot {
    pub(super) fn len(&self) -> usize {
        match self {
            Slot::One(_) => 1,
            Slot::Many(m) => m.len(),
        }
    }

    pub(super) fn get(&self, user_key: &[u8]) -> Option<&Entry> {
        match self {
            Slot::One(e) => user_key.is_empty().then_some(e),
            Slot::Many(m) => m.get(user_key),
        }
    }

    /// Every entry as `(user key, entry)`, in user-key order.
    pub(super) fn iter(&self) -> Box<dyn Iterator<Item = (&[u8], &Entry)> + '_> {
        match self {
            Slot::One(e) => Box::new(std::iter::once((&[][..], e))),
            Slot::Many(m) => Box::new(m.iter().map(|(k, e)| (&k[..], e))),
        }
    }

    /// Sets the entry of `user_key`; returns the length of the value it replaced.
    pub(super) fn put(&mut self, user_key: &[u8], value: &[u8], now: i64) -> Option<usize> {
        if let Slot::One(e) = self {
            if user_key.is_empty() {
                return Some(set(e, value, now));
            }
            let mut m = OrdMap::new();
            m.insert(Prefix::new(), e.clone());
            *self = Slot::Many(m);
        }
        let Slot::Many(m) = self else {
            unreachable!("made a map above")
        };
        match m.get_mut(user_key) {
            Some(e) => Some(set(e, value, now)),
            None => {
                m.insert(Prefix::from_slice(user_key), new_entry(value, now));
                None
            }
        }
    }

    /// Removes the entry of `user_key`; returns it. The slot may be left empty.
    pub(super) fn remove(&mut self, user_key: &[u8]) -> Option<Entry> {
        match self {
            Slot::One(e) if user_key.is_empty() => {
                let e = e.clone();
                *self = Slot::Many(OrdMap::new());
                Some(e)
            }
            Slot::One(_) => None,
            Slot::Many(m) => m.remove(user_key),
        }
    }
}

pub(super) fn new_entry(value: &[u8], now: i64) -> Entry {
    Entry {
        value: value.into(),
        written_at: now,
    }
}

/// Overwrites `e` (in place where it can, see [`Value::set`]); returns the old value's
/// length.
fn set(e: &mut Entry, value: &[u8], now: i64) -> usize {
    let old = e.value.len();
    e.written_at = now;
    e.value.set(value);
    old
}
