//! Timers kept in the instance's database, beside its keyed state, so that a job with a
//! timer per key (a window per key, a session per user) holds them on disk, checkpoints
//! them incrementally with the rest, and rescales them by key-group range.
//!
//! A timer is an entry of its key's group whose composite key is a reserved state id per
//! time domain (above any declared state's), the time (eight bytes, big-endian with the
//! sign bit flipped, so byte order is time order) and the key: one key group's timers of
//! one domain are one contiguous range in time order. The value is empty (the stored
//! value's time only, as every entry has).
//!
//! The earliest timer is asked for after every batch, so it is kept in memory: each key
//! group's first time per domain (found by one seek when unknown) and the least of them.
//! Registering lowers a group's head; deleting the head makes it unknown until asked for
//! again, with a floor no timer of the group is below, and reads start at the head or the
//! floor: the deletes of timers already fired lie before it and are never scanned.
//!
//! Operators register the same timer again and again (a window registers its end for
//! every record it takes), so the timers registered lately are remembered, within a
//! bound, and registering one of them again writes nothing.

use sluice_codec::TimeDomain;

/// The state id of event-time timers.
const EVENT: u32 = 0xFFFF_FFFE;
/// The state id of processing-time timers.
const PROCESSING: u32 = 0xFFFF_FFFF;

/// Bytes of a timer's composite key before its key: the domain's id and the time.
const PREFIX_BYTES: usize = 4 + 8;

/// The reserved state id of `domain`'s timers.
pub fn domain_id(domain: TimeDomain) -> u32 {
    match domain {
        TimeDomain::EventTime => EVENT,
        TimeDomain::ProcessingTime => PROCESSING,
    }
}

/// `id ‖ time ‖ key`: a timer's composite key (after its key group) into `out`.
pub fn compose(out: &mut Vec<u8>, kg: u32, domain: TimeDomain, time: i64, key: &[u8]) {
    out.clear();
    out.extend_from_slice(&(kg as u16).to_be_bytes());
    out.extend_from_slice(&domain_id(domain).to_be_bytes());
    out.extend_from_slice(&sortable(time));
    out.extend_from_slice(key);
}

/// The first key of `domain`'s timers in key group `kg`, and the first key past them
/// (none past the last group's).
pub fn range(kg: u32, domain: TimeDomain) -> (Vec<u8>, Option<Vec<u8>>) {
    let mut start = (kg as u16).to_be_bytes().to_vec();
    start.extend_from_slice(&domain_id(domain).to_be_bytes());
    let end = super::successor(&start);
    (start, end)
}

/// The first key of `domain`'s timers at or after `time` in key group `kg`, and the first
/// key past the group's timers of `domain`.
pub fn range_from(kg: u32, domain: TimeDomain, time: i64) -> (Vec<u8>, Option<Vec<u8>>) {
    let (mut start, end) = range(kg, domain);
    start.extend_from_slice(&sortable(time));
    (start, end)
}

/// The domain, time and key of a timer's composite key (without its key group); `None`
/// when `composite` is a state entry's.
pub fn decode(composite: &[u8]) -> Option<(TimeDomain, i64, &[u8])> {
    let id = u32::from_be_bytes(composite.get(..4)?.try_into().ok()?);
    let domain = match id {
        EVENT => TimeDomain::EventTime,
        PROCESSING => TimeDomain::ProcessingTime,
        _ => return None,
    };
    let time = composite.get(4..PREFIX_BYTES)?.try_into().ok()?;
    Some((domain, unsortable(time), &composite[PREFIX_BYTES..]))
}

/// True when `composite` (without its key group) is a timer's.
pub fn is_timer(composite: &[u8]) -> bool {
    composite
        .get(..4)
        .is_some_and(|id| u32::from_be_bytes(id.try_into().expect("four bytes")) >= EVENT)
}

fn sortable(time: i64) -> [u8; 8] {
    ((time as u64) ^ (1 << 63)).to_be_bytes()
}

fn unsortable(bytes: [u8; 8]) -> i64 {
    (u64::from_be_bytes(bytes) ^ (1 << 63)) as i64
}

/// A key group's earliest timer of one domain, as far as it is known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Head {
    /// Not known, but none is before this time: found by a seek from it when asked for.
    Unknown(i64),
    /// The group has no timer of the domain.
    Empty,
    /// Its earliest timer's time.
    At(i64),
}

/// Every key group's [`Head`] per domain, and the least of them when known.
#[derive(Debug)]
pub struct Heads {
    first_group: u32,
    /// By domain (event, processing), then by key group from `first_group`.
    heads: [Vec<Head>; 2],
    /// The earliest time per domain: `Some(None)` when there is no timer, `None` when it
    /// must be worked out from the groups' heads.
    least: [Option<Option<i64>>; 2],
}

/// A domain's place in per-domain arrays.
pub fn slot(domain: TimeDomain) -> usize {
    match domain {
        TimeDomain::EventTime => 0,
        TimeDomain::ProcessingTime => 1,
    }
}

impl Heads {
    /// Nothing known of key groups `groups`.
    pub fn unknown(groups: std::ops::Range<u32>) -> Self {
        let n = groups.len();
        let unknown = Head::Unknown(i64::MIN);
        Heads {
            first_group: groups.start,
            heads: [vec![unknown; n], vec![unknown; n]],
            least: [None, None],
        }
    }

    /// A timer at `time` was registered in group `kg`.
    pub fn registered(&mut self, domain: TimeDomain, kg: u32, time: i64) {
        let s = slot(domain);
        let head = &mut self.heads[s][(kg - self.first_group) as usize];
        *head = match *head {
            Head::Unknown(floor) => Head::Unknown(floor.min(time)),
            Head::Empty => Head::At(time),
            Head::At(t) => Head::At(t.min(time)),
        };
        if let Some(least) = &mut self.least[s] {
            *least = Some(least.map_or(time, |l| l.min(time)));
        }
    }

    /// A timer at `time` of group `kg` was deleted (or fired).
    pub fn deleted(&mut self, domain: TimeDomain, kg: u32, time: i64) {
        let s = slot(domain);
        let head = &mut self.heads[s][(kg - self.first_group) as usize];
        if *head == Head::At(time) {
            *head = Head::Unknown(time);
            self.least[s] = None;
        }
    }

    /// Sets group `kg`'s head as read from the database.
    pub fn set(&mut self, domain: TimeDomain, kg: u32, head: Head) {
        let s = slot(domain);
        self.heads[s][(kg - self.first_group) as usize] = head;
        self.least[s] = None;
    }

    /// The earliest time of `domain`, if known without reading.
    pub fn least(&self, domain: TimeDomain) -> Option<Option<i64>> {
        self.least[slot(domain)]
    }

    /// The groups whose head of `domain` is unknown, each with its floor.
    pub fn unknown_groups(&self, domain: TimeDomain) -> Vec<(u32, i64)> {
        (self.heads[slot(domain)].iter().enumerate())
            .filter_map(|(i, h)| match h {
                Head::Unknown(floor) => Some((self.first_group + i as u32, *floor)),
                _ => None,
            })
            .collect()
    }

    /// The groups with a timer of `domain` due at `time`, each with its earliest time.
    pub fn due_groups(&self, domain: TimeDomain, time: i64) -> Vec<(u32, i64)> {
        (self.heads[slot(domain)].iter().enumerate())
            .filter_map(|(i, h)| match h {
                Head::At(t) if *t <= time => Some((self.first_group + i as u32, *t)),
                _ => None,
            })
            .collect()
    }

    /// Works out the earliest time of `domain` from the groups' heads, all known.
    pub fn settle(&mut self, domain: TimeDomain) -> Option<i64> {
        let s = slot(domain);
        let least = (self.heads[s].iter())
            .filter_map(|h| match h {
                Head::At(t) => Some(*t),
                _ => None,
            })
            .min();
        self.least[s] = Some(least);
        least
    }
}

/// Timers registered lately and not deleted or fired since, by their database keys: all
/// in the database (or in the writes about to go to it). Forgotten all at once when they
/// would hold more than their bound.
#[derive(Debug)]
pub struct Known {
    keys: hashbrown::HashSet<Box<[u8]>, foldhash::fast::RandomState>,
    bytes: usize,
    limit: usize,
}

/// What remembering a timer is counted as beside its key: the set's slot and the box.
const KNOWN_OVERHEAD: usize = 48;

impl Known {
    /// Remembers timers of up to `limit` bytes.
    pub fn new(limit: usize) -> Self {
        Known {
            keys: Default::default(),
            bytes: 0,
            limit,
        }
    }

    /// True when the timer with database key `key` is known to be registered.
    pub fn contains(&self, key: &[u8]) -> bool {
        self.keys.contains(key)
    }

    /// Remembers that the timer with database key `key` is registered.
    pub fn insert(&mut self, key: &[u8]) {
        if self.keys.contains(key) {
            return;
        }
        if self.bytes + key.len() + KNOWN_OVERHEAD > self.limit {
            self.keys.clear();
            self.bytes = 0;
        }
        self.keys.insert(key.into());
        self.bytes += key.len() + KNOWN_OVERHEAD;
    }

    /// Forgets the timer with database key `key` (deleted or fired).
    pub fn remove(&mut self, key: &[u8]) {
        if self.keys.remove(key) {
            self.bytes -= key.len() + KNOWN_OVERHEAD;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn composite_keys_sort_by_time_and_decode_back() {
        let mut keys = Vec::new();
        for time in [i64::MIN, -5, -1, 0, 3, i64::MAX] {
            let mut k = Vec::new();
            compose(&mut k, 7, TimeDomain::EventTime, time, b"key");
            keys.push((k, time));
        }
        assert!(
            keys.windows(2).all(|w| w[0].0 < w[1].0),
            "byte order is time order"
        );
        for (k, time) in &keys {
            assert_eq!(
                decode(&k[2..]),
                Some((TimeDomain::EventTime, *time, &b"key"[..]))
            );
            let (start, end) = range(7, TimeDomain::EventTime);
            assert!(start <= *k && *k < end.unwrap());
            let (from, _) = range_from(7, TimeDomain::EventTime, *time);
            assert!(k.starts_with(&from), "a timer's key starts with its time's");
            let (start, _) = range(7, TimeDomain::ProcessingTime);
            assert!(
                *k < start,
                "event-time timers sort before processing-time ones"
            );
        }
        let mut state = Vec::new();
        state.extend_from_slice(&3u32.to_be_bytes());
        state.extend_from_slice(&[0, 0, 0, 1, b'k']);
        assert_eq!(decode(&state), None);
        assert!(!is_timer(&state) && is_timer(&keys[0].0[2..]));
        let (_, end) = range(7, TimeDomain::ProcessingTime);
        assert_eq!(
            end.unwrap(),
            [0, 8],
            "the last range ends where the next group starts"
        );
    }

    #[test]
    fn heads_know_the_least_time_until_the_head_goes() {
        let mut h = Heads::unknown(10..13);
        assert_eq!(h.least(TimeDomain::EventTime), None);
        assert_eq!(
            h.unknown_groups(TimeDomain::EventTime),
            [(10, i64::MIN), (11, i64::MIN), (12, i64::MIN)]
        );
        for kg in 10..13 {
            h.set(TimeDomain::EventTime, kg, Head::Empty);
        }
        assert_eq!(h.settle(TimeDomain::EventTime), None);
        h.registered(TimeDomain::EventTime, 11, 50);
        h.registered(TimeDomain::EventTime, 12, 40);
        h.registered(TimeDomain::EventTime, 11, 30);
        assert_eq!(h.least(TimeDomain::EventTime), Some(Some(30)));
        assert_eq!(
            h.due_groups(TimeDomain::EventTime, 45),
            [(11, 30), (12, 40)]
        );
        h.deleted(TimeDomain::EventTime, 12, 99);
        assert_eq!(h.least(TimeDomain::EventTime), Some(Some(30)), "not a head");
        h.deleted(TimeDomain::EventTime, 11, 30);
        assert_eq!(h.least(TimeDomain::EventTime), None);
        assert_eq!(h.unknown_groups(TimeDomain::EventTime), [(11, 30)]);
        h.registered(TimeDomain::EventTime, 11, 20);
        assert_eq!(
            h.unknown_groups(TimeDomain::EventTime),
            [(11, 20)],
            "a timer registered below the floor lowers it"
        );
        assert_eq!(h.least(TimeDomain::ProcessingTime), None, "domains apart");
    }

    #[test]
    fn known_timers_are_forgotten_at_their_bound() {
        let mut known = Known::new(3 * (KNOWN_OVERHEAD + 4));
        for k in [b"aaaa", b"bbbb", b"cccc"] {
            known.insert(k);
        }
        known.insert(b"aaaa");
        assert!(known.contains(b"aaaa") && known.contains(b"cccc"));
        known.remove(b"bbbb");
        known.insert(b"dddd");
        assert!(
            known.contains(b"aaaa") && known.contains(b"dddd"),
            "room again"
        );
        known.insert(b"eeee");
        assert!(!known.contains(b"aaaa"), "over the bound: forgotten");
        assert!(known.contains(b"eeee"));
    }
}
