//! Event time from Kafka: the records' own timestamps, a watermark per partition, and
//! idleness that only a partition with nothing left to read reaches.

use std::collections::BTreeMap;
use std::path::Path;

use sluice_tests::kafka::{broker, create_topic, produce, produce_to, unique_topic, wait_for_end};
use sluice_tests::plugins::WINDOW;
use sluice_tests::{run_job, test_dir, write_job};

/// A bounded Kafka source of `topic` with event time from the records' timestamps →
/// tumbling window counts of `size_ms` per key → `windows.tsv`.
fn window_counts_job(dir: &Path, broker: &str, topic: &str, size_ms: i64) -> std::path::PathBuf {
    window_counts_job_timed(dir, broker, topic, size_ms, "\"record\"")
}

/// [`window_counts_job`] with event time from `timestamp`.
fn window_counts_job_timed(
    dir: &Path,
    broker: &str,
    topic: &str,
    size_ms: i64,
    timestamp: &str,
) -> std::path::PathBuf {
    write_job(
        dir,
        &format!(
            r#"
name = "kafka-windows"
[source]
type = "kafka"
bootstrap = "{broker}"
topics = "{topic}"
bounded = true
timestamp = {timestamp}
[[operator]]
name = "window"
plugin = "{WINDOW}"
key_by = "key"
config = {{ kind = "tumbling", size-ms = {size_ms}, aggregate = "count" }}
[sink]
type = "file"
path = "windows.tsv"
format = "key-value"
[runtime]
batch_size = 10
"#
        ),
    )
}

/// Event time from the records' own Kafka timestamps: tumbling counts per key.
#[test]
fn kafka_record_timestamps_drive_event_time() {
    let Some(broker) = broker() else { return };
    let topic = unique_topic("timed");
    create_topic(&broker, &topic, 1);
    let records: Vec<(Option<&str>, &str, Option<i64>)> = [
        ("k", 1_000),
        ("k", 4_000),
        ("j", 9_999),
        ("k", 10_000),
        ("k", 25_000),
    ]
    .iter()
    .map(|&(k, ts)| (Some(k), "x", Some(ts)))
    .collect();
    produce(&broker, &topic, &records);
    let dir = test_dir("kafka-event-time");
    let job = window_counts_job(&dir, &broker, &topic, 10_000);
    run_job(&job).expect("the job runs");
    let mut got: Vec<String> = std::fs::read_to_string(dir.join("windows.tsv"))
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    got.sort();
    let want: BTreeMap<&str, ()> = [
        ("j\t0,10000,1", ()),
        ("k\t0,10000,2", ()),
        ("k\t10000,20000,1", ()),
        ("k\t20000,30000,1", ()),
    ]
    .into_iter()
    .collect();
    assert_eq!(got, want.keys().map(|s| s.to_string()).collect::<Vec<_>>());
}

/// Each partition has its own watermark, the source's is the smallest: a partition far
/// ahead in event time does not make the records of one behind it late. With one
/// watermark over all records, most of partition 0's records would come after some of
/// partition 1's and be dropped as late.
#[test]
fn kafka_partitions_keep_their_own_watermarks() {
    let Some(broker) = broker() else { return };
    // Event time from the records' Kafka timestamps, and from a field of their values.
    for from_field in [false, true] {
        let topic = unique_topic("skewed");
        create_topic(&broker, &topic, 2);
        let values: Vec<String> = (0..2_000)
            // (From 1: librdkafka stamps a record of timestamp 0 with the time it is sent.)
            .flat_map(|i| [1 + i * 10, 1_000_001 + i * 10])
            .map(|ts| format!("{ts},x"))
            .collect();
        let records = |key: &'static str, ahead: bool| -> Vec<(Option<&str>, &str, Option<i64>)> {
            values
                .iter()
                .skip(ahead as usize)
                .step_by(2)
                .map(|v| {
                    let ts: i64 = v.split(',').next().unwrap().parse().unwrap();
                    let value = if from_field { v.as_str() } else { "x" };
                    (Some(key), value, (!from_field).then_some(ts))
                })
                .collect()
        };
        // In record batches of 100, which small fetches deliver interleaved.
        let (ahead, behind) = (records("ahead", true), records("behind", false));
        for (a, b) in ahead.chunks(100).zip(behind.chunks(100)) {
            produce_to(&broker, &topic, Some(1), a);
            produce_to(&broker, &topic, Some(0), b);
        }
        // The bounded source ends where the partitions end when it starts.
        wait_for_end(&broker, &topic, 4_000);
        let dir = test_dir("kafka-partition-watermarks");
        let timestamp = if from_field {
            "{ field = 0 }"
        } else {
            "\"record\""
        };
        // Small fetches, so that the partitions' records come interleaved.
        let timestamp =
            format!("{timestamp}\nproperties = {{ \"max.partition.fetch.bytes\" = \"512\" }}");
        let job = window_counts_job_timed(&dir, &broker, &topic, 100_000, &timestamp);
        let report = run_job(&job).expect("the job runs");
        let mut counted: BTreeMap<String, u64> = BTreeMap::new();
        for line in std::fs::read_to_string(dir.join("windows.tsv"))
            .unwrap()
            .lines()
        {
            let (key, value) = line.split_once('\t').unwrap();
            let count: u64 = value.rsplit(',').next().unwrap().parse().unwrap();
            *counted.entry(key.to_string()).or_default() += count;
        }
        assert_eq!(
            counted,
            BTreeMap::from([("ahead".to_string(), 2_000), ("behind".to_string(), 2_000)]),
            "from a field: {from_field}; {report:?}"
        );
    }
}

/// A partition silent for longer than the idle timeout only because its records have
/// not been fetched yet (fetches held a second apart here) is not idle: the other input,
/// ended long before, does not carry event time past its records, and none is late.
#[test]
fn a_partition_behind_its_end_is_not_idle_however_long_it_is_silent() {
    let Some(broker) = broker() else { return };
    let topic = unique_topic("behind");
    create_topic(&broker, &topic, 1);
    // Five record batches of two records each, event time 1 to 10 ms.
    for batch in 0..5 {
        let values: Vec<String> = (1..=2)
            .map(|i| format!("{},slow,1", batch * 2 + i))
            .collect();
        let records: Vec<_> = values.iter().map(|v| (None, v.as_str(), None)).collect();
        produce_to(&broker, &topic, Some(0), &records);
    }
    wait_for_end(&broker, &topic, 10);
    let dir = test_dir("kafka-behind");
    let fast: String = (0..600).map(|i| format!("{},fast,1\n", i * 100)).collect();
    std::fs::write(dir.join("events.csv"), fast).unwrap();
    let job = write_job(
        &dir,
        &format!(
            r#"
name = "behind"
[[source]]
name = "fast"
type = "file"
path = "events.csv"
timestamp = {{ field = 0 }}
[[source]]
name = "slow"
type = "kafka"
bootstrap = "{broker}"
topics = "{topic}"
bounded = true
timestamp = {{ field = 0 }}
idle_timeout_ms = 300
# One record batch per fetch, and a second between fetches.
properties = {{ "max.partition.fetch.bytes" = "1", "queued.min.messages" = "1", "fetch.queue.backoff.ms" = "1000" }}
[[operator]]
name = "window"
plugin = "{WINDOW}"
key_by = {{ field = 1 }}
config = {{ kind = "tumbling", size-ms = 10000, aggregate = "count" }}
[sink]
type = "file"
path = "out.tsv"
format = "key-value"
"#
        ),
    );
    let report = run_job(&job).expect("the job runs");
    let output = std::fs::read_to_string(dir.join("out.tsv")).unwrap();
    let dropped = crate::event_time::dropped(&report);
    assert!(
        output.lines().any(|l| l == "slow\t0,10000,10") && dropped == 0,
        "{dropped} dropped as late; windows: {output}"
    );
}
