//! Per-operator timer queues.

use std::sync::Arc;

use imbl::OrdMap;
use sluice_codec::{TimeDomain, TimerWriter};

/// The keys with a timer at one time. Shared between a queue and its copies until one of
/// them changes it.
type Keys = Arc<hashbrown::HashSet<Box<[u8]>, foldhash::fast::RandomState>>;

/// Timers taken out of a queue: `(time, key)` each.
pub type Taken = Vec<(i64, Vec<u8>)>;

/// The event-time and processing-time timers of one operator instance, deduplicated per
/// `(time, key)` and ordered by time (then key).
///
/// A queue is a persistent ordered map from time to the keys with a timer then, so
/// [`TimerQueues::clone`] — what a checkpoint takes — is O(1) and later changes do not
/// affect the copy (a change to a time's keys copies that time's set once). Timers share
/// their time far more often than their key (every key's window ends at the same time),
/// so registering one is a search among times and a hash lookup, not a search comparing
/// keys; a time's keys are sorted when they fire.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TimerQueues {
    event: Queue,
    processing: Queue,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Queue {
    times: OrdMap<i64, Keys>,
    len: usize,
    /// The bytes of all its timers' keys.
    key_bytes: usize,
}

impl Queue {
    fn insert(&mut self, timestamp: i64, key: &[u8]) {
        if self.times.get(&timestamp).is_some_and(|k| k.contains(key)) {
            return;
        }
        let keys = self.times.entry(timestamp).or_default();
        Arc::make_mut(keys).insert(key.into());
        self.len += 1;
        self.key_bytes += key.len();
    }

    fn remove(&mut self, timestamp: i64, key: &[u8]) {
        if !self.times.get(&timestamp).is_some_and(|k| k.contains(key)) {
            return;
        }
        let keys = self.times.get_mut(&timestamp).expect("looked up");
        let keys = Arc::make_mut(keys);
        keys.remove(key);
        if keys.is_empty() {
            self.times.remove(&timestamp);
        }
        self.len -= 1;
        self.key_bytes -= key.len();
    }

    /// The keys at `time` in order.
    fn sorted(keys: &Keys) -> Vec<&[u8]> {
        let mut sorted: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
        sorted.sort_unstable();
        sorted
    }
}

impl TimerQueues {
    /// No timers.
    pub fn new() -> Self {
        Self::default()
    }

    fn queue(&mut self, domain: TimeDomain) -> &mut Queue {
        match domain {
            TimeDomain::EventTime => &mut self.event,
            TimeDomain::ProcessingTime => &mut self.processing,
        }
    }

    fn queue_ref(&self, domain: TimeDomain) -> &Queue {
        match domain {
            TimeDomain::EventTime => &self.event,
            TimeDomain::ProcessingTime => &self.processing,
        }
    }

    /// Registers a timer; registering an existing one again changes nothing.
    pub fn register(&mut self, domain: TimeDomain, timestamp: i64, key: &[u8]) {
        self.queue(domain).insert(timestamp, key);
    }

    /// Deletes a timer if it exists.
    pub fn delete(&mut self, domain: TimeDomain, timestamp: i64, key: &[u8]) {
        self.queue(domain).remove(timestamp, key);
    }

    /// The earliest timer of `domain`.
    pub fn next(&self, domain: TimeDomain) -> Option<i64> {
        self.queue_ref(domain).times.get_min().map(|(ts, _)| *ts)
    }

    /// Removes the timers of `domain` due at `time` (timestamp ≤ time) and returns them
    /// in the `timers` encoding, in order; `None` when none is due.
    pub fn pop_due(&mut self, domain: TimeDomain, time: i64) -> Option<Vec<u8>> {
        let mut out = TimerWriter::new();
        self.pop_due_into(&mut out, domain, time, usize::MAX);
        (!out.is_empty()).then(|| out.into_bytes())
    }

    /// Removes the first `limit` timers of `domain` due at `time`, by time and then key,
    /// and appends them to `out`; returns how many.
    pub fn pop_due_into(
        &mut self,
        out: &mut TimerWriter,
        domain: TimeDomain,
        time: i64,
        limit: usize,
    ) -> usize {
        let queue = self.queue(domain);
        let mut taken = 0;
        while taken < limit
            && let Some((ts, keys)) = queue.times.get_min().map(|(ts, keys)| (*ts, keys.clone()))
            && ts <= time
        {
            if keys.len() <= limit - taken {
                let keys = queue.times.remove(&ts).expect("looked up");
                queue.len -= keys.len();
                for key in Queue::sorted(&keys) {
                    queue.key_bytes -= key.len();
                    out.push(domain, ts, key);
                }
                taken += keys.len();
                continue;
            }
            // Part of a time's keys: the first ones in key order, selected without sorting
            // them all (a window over a million keys fires a million timers at one time).
            let want = limit - taken;
            let mut all: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
            all.select_nth_unstable(want - 1);
            all.truncate(want);
            all.sort_unstable();
            let first: Vec<Box<[u8]>> = all.into_iter().map(Box::from).collect();
            for key in &first {
                out.push(domain, ts, key);
                queue.remove(ts, key);
            }
            taken = limit;
        }
        taken
    }

    /// All timers of `domain`, in order.
    pub fn iter(&self, domain: TimeDomain) -> impl Iterator<Item = (i64, &[u8])> + '_ {
        self.queue_ref(domain)
            .times
            .iter()
            .flat_map(|(ts, keys)| Queue::sorted(keys).into_iter().map(move |k| (*ts, k)))
    }

    /// Removes `domain`'s timers at its latest times, all of a time together, until at
    /// least `count` are removed; returns the earliest time removed and the timers, or
    /// `None` when there is none.
    pub fn pop_latest(&mut self, domain: TimeDomain, count: usize) -> Option<(i64, Taken)> {
        let queue = self.queue(domain);
        let mut removed = Vec::new();
        let mut earliest = None;
        while removed.len() < count
            && let Some(ts) = queue.times.get_max().map(|(ts, _)| *ts)
        {
            let keys = queue.times.remove(&ts).expect("looked up");
            queue.len -= keys.len();
            for key in keys.iter() {
                queue.key_bytes -= key.len();
                removed.push((ts, key.to_vec()));
            }
            earliest = Some(ts);
        }
        earliest.map(|ts| (ts, removed))
    }

    /// Number of timers of `domain`.
    pub fn len_of(&self, domain: TimeDomain) -> usize {
        self.queue_ref(domain).len
    }

    /// Number of timers in both domains.
    pub fn len(&self) -> usize {
        self.event.len + self.processing.len
    }

    /// The bytes of the keys of the timers in both domains.
    pub fn key_bytes(&self) -> usize {
        self.event.key_bytes + self.processing.key_bytes
    }

    /// True when there is no timer.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_codec::TimerReader;

    fn decode(bytes: &[u8]) -> Vec<(i64, Vec<u8>)> {
        TimerReader::new(bytes)
            .map(|t| {
                let t = t.unwrap();
                (t.timestamp, t.key.to_vec())
            })
            .collect()
    }

    #[test]
    fn due_timers_come_out_in_time_order_deduplicated() {
        let mut q = TimerQueues::new();
        q.register(TimeDomain::EventTime, 30, b"a");
        q.register(TimeDomain::EventTime, 10, b"b");
        q.register(TimeDomain::EventTime, 10, b"b");
        q.register(TimeDomain::EventTime, 20, b"a");
        q.register(TimeDomain::ProcessingTime, 5, b"pp");
        assert_eq!(q.key_bytes(), 5, "a, b, a and pp");
        assert_eq!(q.next(TimeDomain::EventTime), Some(10));
        let due = q.pop_due(TimeDomain::EventTime, 20).unwrap();
        assert_eq!(decode(&due), vec![(10, b"b".to_vec()), (20, b"a".to_vec())]);
        assert_eq!(q.pop_due(TimeDomain::EventTime, 29), None);
        assert_eq!(q.len(), 2);
        assert_eq!(q.key_bytes(), 3);
        assert_eq!(q.next(TimeDomain::ProcessingTime), Some(5));
        q.delete(TimeDomain::ProcessingTime, 5, b"pp");
        assert_eq!(q.key_bytes(), 1);
    }

    #[test]
    fn delete_removes_only_the_named_timer() {
        let mut q = TimerQueues::new();
        q.register(TimeDomain::EventTime, 10, b"a");
        q.register(TimeDomain::EventTime, 10, b"b");
        q.delete(TimeDomain::EventTime, 10, b"a");
        q.delete(TimeDomain::ProcessingTime, 10, b"b");
        let due = q.pop_due(TimeDomain::EventTime, i64::MAX).unwrap();
        assert_eq!(decode(&due), vec![(10, b"b".to_vec())]);
    }

    #[test]
    fn timers_of_one_time_come_out_by_key_and_a_copy_keeps_its_own() {
        let mut q = TimerQueues::new();
        for k in ["m", "c", "x", "a"] {
            q.register(TimeDomain::EventTime, 7, k.as_bytes());
        }
        let copy = q.clone();
        q.register(TimeDomain::EventTime, 7, b"b");
        q.delete(TimeDomain::EventTime, 7, b"x");
        q.delete(TimeDomain::EventTime, 7, b"never");
        assert_eq!(q.len(), 4);
        assert_eq!(copy.len(), 4);
        let keys = |q: &TimerQueues| {
            q.iter(TimeDomain::EventTime)
                .map(|(_, k)| String::from_utf8(k.to_vec()).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(keys(&copy), ["a", "c", "m", "x"]);
        assert_eq!(keys(&q), ["a", "b", "c", "m"]);
        let due = q.pop_due(TimeDomain::EventTime, 7).unwrap();
        let keys: Vec<Vec<u8>> = decode(&due).into_iter().map(|(_, k)| k).collect();
        assert_eq!(keys, [b"a", b"b", b"c", b"m"]);
        assert!(q.is_empty());
        assert_eq!(copy.len(), 4);
    }

    #[test]
    fn due_timers_come_out_a_limited_number_at_a_time_in_order() {
        let mut q = TimerQueues::new();
        let mut all = TimerQueues::new();
        for (ts, k) in [
            (3, "b"),
            (1, "z"),
            (3, "a"),
            (3, "d"),
            (3, "c"),
            (2, "m"),
            (9, "x"),
        ] {
            q.register(TimeDomain::EventTime, ts, k.as_bytes());
            all.register(TimeDomain::EventTime, ts, k.as_bytes());
        }
        let mut chunks = Vec::new();
        loop {
            let mut out = TimerWriter::new();
            let n = q.pop_due_into(&mut out, TimeDomain::EventTime, 5, 3);
            if n == 0 {
                break;
            }
            chunks.push(decode(&out.into_bytes()));
        }
        let keys = |c: &Vec<(i64, Vec<u8>)>| {
            c.iter()
                .map(|(t, k)| format!("{t}{}", String::from_utf8_lossy(k)))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let chunks: Vec<String> = chunks.iter().map(keys).collect();
        assert_eq!(chunks, ["1z 2m 3a", "3b 3c 3d"]);
        assert_eq!((q.len(), q.key_bytes()), (1, 1));
        assert_eq!(
            keys(&decode(&all.pop_due(TimeDomain::EventTime, 5).unwrap())),
            "1z 2m 3a 3b 3c 3d"
        );
    }

    #[test]
    fn the_latest_timers_come_off_whole_times_at_a_time() {
        let mut q = TimerQueues::new();
        for (ts, k) in [(5, "a"), (9, "b"), (9, "c"), (7, "d"), (1, "e")] {
            q.register(TimeDomain::EventTime, ts, k.as_bytes());
        }
        q.register(TimeDomain::ProcessingTime, 100, b"p");
        let (from, mut moved) = q.pop_latest(TimeDomain::EventTime, 3).unwrap();
        moved.sort();
        assert_eq!(from, 7);
        assert_eq!(
            moved,
            [(7, b"d".to_vec()), (9, b"b".to_vec()), (9, b"c".to_vec())]
        );
        assert_eq!((q.len_of(TimeDomain::EventTime), q.key_bytes()), (2, 3));
        assert_eq!(q.pop_latest(TimeDomain::EventTime, 1).unwrap().0, 5);
        assert_eq!(q.pop_latest(TimeDomain::ProcessingTime, 5).unwrap().0, 100);
        assert_eq!(q.pop_latest(TimeDomain::ProcessingTime, 5), None);
    }

    #[test]
    fn a_copy_is_a_snapshot() {
        let mut q = TimerQueues::new();
        q.register(TimeDomain::EventTime, 1, b"a");
        let snap = q.clone();
        q.register(TimeDomain::EventTime, 2, b"a");
        q.pop_due(TimeDomain::EventTime, 1);
        assert_eq!(
            snap.iter(TimeDomain::EventTime).collect::<Vec<_>>(),
            vec![(1, &b"a"[..])]
        );
    }
}
