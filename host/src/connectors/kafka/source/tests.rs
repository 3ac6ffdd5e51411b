use std::sync::atomic::Ordering;

use super::*;
use crate::connectors::kafka::stats::{Bounds, END_UNKNOWN_GRACE};
use crate::connectors::kafka::test_support::config;

#[test]
fn partitions_are_owned_as_flink_assigns_them() {
    // Values of Java's `String.hashCode` and of Flink's rule, computed with Java.
    assert_eq!(java_string_hash("events"), -1291329255);
    assert_eq!(java_string_hash("orders"), -1008770331);
    assert_eq!(java_string_hash("événements"), -1479837150);
    assert_eq!(owner_of("events", 0, 4), 3);
    assert_eq!(owner_of("événements", 0, 4), 2);
    // Every partition has one owner, and owners go round-robin.
    for readers in 1..=5 {
        let owners: Vec<u32> = (0..10).map(|p| owner_of("events", p, readers)).collect();
        for w in owners.windows(2) {
            assert_eq!(w[1], (w[0] + 1) % readers);
        }
    }
}

#[test]
fn the_watermark_is_the_smallest_of_the_partitions_not_idle_or_finished() {
    let config = config(false);
    let mut s = KafkaSource::new(config, 0, 1).unwrap();
    let p = |i: i32| ("t".to_string(), i);
    for i in 0..3 {
        s.next.insert(p(i), 0);
        s.assigned_at.insert(p(i), Instant::now());
    }
    s.started = true;
    s.max_timestamps.insert(p(0), 5_000);
    s.max_timestamps.insert(p(1), 900);
    s.last_record.insert(p(0), Instant::now());
    s.last_record.insert(p(1), Instant::now());
    // Partition 2 has no record yet and is not idle: no watermark.
    assert_eq!(s.watermark(100, None), None);
    // Silent since its assignment for longer than the idle time, but with records
    // not read yet (its end unknown, then beyond where the source stands): not idle.
    s.assigned_at
        .insert(p(2), Instant::now() - Duration::from_secs(6));
    assert_eq!(s.watermark(100, Some(Duration::from_secs(5))), None);
    assert!(!s.read_to_end());
    let ends = |s: &mut KafkaSource, e: &[(i32, i64, i64)]| {
        *s.consumer.context().ends.lock() = e
            .iter()
            .map(|&(i, start, end)| (p(i), Bounds { start, end }))
            .collect();
        s.consumer.context().fresh.store(true, Ordering::Relaxed);
        s.take_statistics();
    };
    ends(&mut s, &[(0, 0, 0), (1, 0, 0), (2, 0, 7)]);
    assert_eq!(s.watermark(100, Some(Duration::from_secs(5))), None);
    // Read to its end and silent: left out, the smallest of the others, 900 − 100 − 1.
    ends(&mut s, &[(0, 0, 0), (1, 0, 0), (2, 0, 0)]);
    assert!(s.read_to_end());
    assert_eq!(s.watermark(100, Some(Duration::from_secs(5))), Some(799));
    // Records retention deleted before the position count as read.
    ends(&mut s, &[(0, 0, 0), (1, 0, 0), (2, 7, 7)]);
    assert!(s.read_to_end());
    // An end still unknown long after the assignment no longer holds idleness back.
    ends(&mut s, &[(0, 0, 0), (1, 0, 0)]);
    assert!(!s.read_to_end());
    s.assigned_at
        .insert(p(2), Instant::now() - END_UNKNOWN_GRACE);
    assert!(s.read_to_end());
    assert_eq!(s.watermark(100, Some(Duration::from_secs(5))), Some(799));
    // Every partition idle: event time stands still.
    assert_eq!(s.watermark(100, Some(Duration::ZERO)), None);
    s.max_timestamps.insert(p(2), 3_000);
    s.last_record.insert(p(2), Instant::now());
    assert_eq!(s.watermark(100, None), Some(799));
    // A bounded source's finished partition no longer holds it back.
    s.stops.insert(p(1), 0);
    assert_eq!(s.watermark(100, None), Some(2_899));
}

#[test]
fn positions_round_trip() {
    let config = config(true);
    let mut a = KafkaSource::new(config.clone(), 0, 1).unwrap();
    a.next.insert(("t".into(), 0), 42);
    a.next.insert(("t".into(), 3), 7);
    a.stops.insert(("t".into(), 0), 50);
    let mut b = KafkaSource::new(config, 0, 1).unwrap();
    b.seek(&a.position()).unwrap();
    assert_eq!(
        b.restored,
        Some(BTreeMap::from([
            (("t".into(), 0), 42),
            (("t".into(), 3), 7)
        ]))
    );
    assert_eq!(b.stops, a.stops);
    // A checkpoint before the first poll after a restore keeps the restored offsets
    // (not none, which would read the partitions again from their start).
    assert_eq!(b.position(), a.position());
    // Two subtasks' positions merged: a source of another parallelism finds both.
    let mut c = KafkaSource::new(a.config.clone(), 1, 2).unwrap();
    c.next.insert(("t".into(), 1), 9);
    let merged = merge_positions(&[a.position(), c.position()]).unwrap();
    b.seek(&merged).unwrap();
    assert_eq!(
        b.restored,
        Some(BTreeMap::from([
            (("t".into(), 0), 42),
            (("t".into(), 1), 9),
            (("t".into(), 3), 7)
        ]))
    );
    assert!(b.seek(b"\xff\xff\xff").is_err());
}
