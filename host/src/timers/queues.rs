//! Per-operator timer queues.

use std::sync::Arc;

use imbl::OrdSet;
use sluice_codec::{TimeDomain, TimerWriter};

type Timer = (i64, Arc<[u8]>);

/// The event-time and processing-time timers of one operator instance, deduplicated per
/// `(time, key)` and ordered by time (then key).
///
/// Both queues are persistent sets, so [`TimerQueues::clone`] — what a checkpoint takes —
/// is O(1) and later changes do not affect the copy.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TimerQueues {
    event: OrdSet<Timer>,
    processing: OrdSet<Timer>,
}

impl TimerQueues {
    /// No timers.
    pub fn new() -> Self {
        Self::default()
    }

    fn queue(&mut self, domain: TimeDomain) -> &mut OrdSet<Timer> {
        match domain {
            TimeDomain::EventTime => &mut self.event,
            TimeDomain::ProcessingTime => &mut self.processing,
        }
    }

    /// Registers a timer; registering an existing one again changes nothing.
    pub fn register(&mut self, domain: TimeDomain, timestamp: i64, key: &[u8]) {
        self.queue(domain).insert((timestamp, key.into()));
    }

    /// Deletes a timer if it exists.
    pub fn delete(&mut self, domain: TimeDomain, timestamp: i64, key: &[u8]) {
        self.queue(domain).remove(&(timestamp, key.into()));
    }

    /// The earliest timer of `domain`.
    pub fn next(&self, domain: TimeDomain) -> Option<i64> {
        match domain {
            TimeDomain::EventTime => self.event.get_min(),
            TimeDomain::ProcessingTime => self.processing.get_min(),
        }
        .map(|(ts, _)| *ts)
    }

    /// Removes the timers of `domain` due at `time` (timestamp ≤ time) and returns them
    /// in the `timers` encoding, in order; `None` when none is due.
    pub fn pop_due(&mut self, domain: TimeDomain, time: i64) -> Option<Vec<u8>> {
        let queue = self.queue(domain);
        let mut out = TimerWriter::new();
        while let Some((ts, _)) = queue.get_min() {
            if *ts > time {
                break;
            }
            let (ts, key) = queue.remove_min().expect("peeked");
            out.push(domain, ts, &key);
        }
        (!out.is_empty()).then(|| out.into_bytes())
    }

    /// All timers of `domain`, in order.
    pub fn iter(&self, domain: TimeDomain) -> impl Iterator<Item = (i64, &[u8])> + '_ {
        match domain {
            TimeDomain::EventTime => self.event.iter(),
            TimeDomain::ProcessingTime => self.processing.iter(),
        }
        .map(|(ts, k)| (*ts, &k[..]))
    }

    /// Number of timers in both domains.
    pub fn len(&self) -> usize {
        self.event.len() + self.processing.len()
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
        q.register(TimeDomain::ProcessingTime, 5, b"p");
        assert_eq!(q.next(TimeDomain::EventTime), Some(10));
        let due = q.pop_due(TimeDomain::EventTime, 20).unwrap();
        assert_eq!(decode(&due), vec![(10, b"b".to_vec()), (20, b"a".to_vec())]);
        assert_eq!(q.pop_due(TimeDomain::EventTime, 29), None);
        assert_eq!(q.len(), 2);
        assert_eq!(q.next(TimeDomain::ProcessingTime), Some(5));
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
