//! Event time over several hosts: tumbling windows whose watermarks cross the exchange
//! topic, and a source partition that never gets a record not holding them back.

use std::path::PathBuf;
use std::process::Child;
use std::thread;
use std::time::{Duration, Instant};

use sluice_tests::kafka::{broker, create_topic, produce_to, read_committed, unique_topic};
use sluice_tests::plugins::{TEST_MISBEHAVE, WINDOW};
use sluice_tests::{test_dir, write_job};

use super::{log_of, wait_success};

/// Tumbling windows (5 s, counts) over two hosts from a topic of three partitions, of
/// which `filled` get records (timestamps rising with jitter within the bound, so none is
/// late), after `source` in the job's `[source]`. Returns the hosts, the output topic and
/// the expected windows, each with its end (`key\tstart,end,count`).
fn windows_over_two_hosts(
    name: &str,
    broker: &str,
    filled: &[i32],
    source: &str,
    checkpoint_ms: u64,
) -> (Vec<Child>, PathBuf, String, Vec<(i64, String)>) {
    let input = unique_topic("cluster-timed");
    create_topic(broker, &input, 3);
    let mut expected: std::collections::BTreeMap<(String, i64), u64> = Default::default();
    for &p in filled {
        let mut records = Vec::new();
        for i in 0..900i64 {
            // (From 1,000: a timestamp of 0 would make the producer stamp the time.)
            let ts = 1_000 + i * 37 + (i * 7919 + i64::from(p)) % 300;
            let key = format!("k{}", (i * 13 + i64::from(p)) % 7);
            *expected
                .entry((key.clone(), ts / 5_000 * 5_000))
                .or_default() += 1;
            records.push((key, ts));
        }
        let records: Vec<(Option<&str>, &str, Option<i64>)> = records
            .iter()
            .map(|(k, ts)| (Some(k.as_str()), "x", Some(*ts)))
            .collect();
        produce_to(broker, &input, Some(p), &records);
    }
    let output = unique_topic("cluster-windows");
    create_topic(broker, &output, 1);
    let dir = test_dir(name);
    let job = write_job(
        &dir,
        &format!(
            r#"
name = "{output}"
[source]
type = "kafka"
bootstrap = "{broker}"
topics = "{input}"
timestamp = "record"
out_of_orderness_ms = 500
{source}
[[operator]]
name = "slow"
plugin = "{TEST_MISBEHAVE}"
config = {{ behavior = "slow-process", delay-ms = 1 }}
[[operator]]
name = "window"
plugin = "{WINDOW}"
key_by = "key"
config = {{ kind = "tumbling", size-ms = 5000, aggregate = "count" }}
[sink]
type = "kafka"
bootstrap = "{broker}"
topic = "{output}"
[checkpoint]
interval_ms = {checkpoint_ms}
[runtime]
batch_size = 20
[cluster]
exchange_partitions = 3
"#
        ),
    );
    // The store and the session timeout come from the machine's host file.
    let host_file = dir.join("host.toml");
    std::fs::write(
        &host_file,
        "[cluster]\ncheckpoints = \"store\"\nsession_timeout_ms = 6000\n",
    )
    .unwrap();
    let hosts = (0..2)
        .map(|n| {
            sluice_tests::cluster::spawn_host_with(
                env!("CARGO_BIN_EXE_sluice-test-cli"),
                &job,
                broker,
                &dir.join(format!("host-{n}.log")),
                &["--host-config", host_file.to_str().unwrap()],
            )
        })
        .collect();
    let expected = expected
        .iter()
        .map(|((k, start), n)| (start + 5_000, format!("{k}\t{start},{},{n}", start + 5_000)))
        .collect();
    (hosts, dir, output, expected)
}

/// The committed windows of `output`, sorted.
fn committed_windows(broker: &str, output: &str) -> Vec<String> {
    let mut got: Vec<String> = read_committed(broker, output)
        .iter()
        .map(|r| format!("{}\t{}", r.key.as_deref().unwrap_or(""), r.value))
        .collect();
    got.sort();
    got
}

/// Event time crosses the exchange topic: tumbling windows over three partitions on two
/// hosts give the counts computed here (as one host gives them). The hosts' checkpoint
/// store comes from their host file's `[cluster]`.
#[test]
fn event_time_windows_over_two_hosts() {
    let Some(broker) = broker() else { return };
    let (mut hosts, dir, output, expected) = windows_over_two_hosts(
        "cluster-windows",
        &broker,
        &[0, 1, 2],
        "bounded = true",
        100,
    );
    for (n, host) in hosts.iter_mut().enumerate() {
        wait_success(&dir, host, n, Duration::from_secs(180));
    }
    let mut want: Vec<String> = expected.into_iter().map(|(_, w)| w).collect();
    want.sort();
    assert_eq!(committed_windows(&broker, &output), want);
}

/// An idle source partition (one that never gets a record, of an unbounded source with
/// an idle timeout) does not hold event time back on the other side of the exchange: its
/// unit tells the readers it is idle, and the windows the other partitions' watermarks
/// pass fire, exactly those. The filled partitions go idle too once read, sooner than
/// the next checkpoint: each unit's last watermark reaches the readers in the same
/// record as its idleness, and still counts.
#[test]
fn an_idle_partition_does_not_hold_event_time_across_hosts() {
    let Some(broker) = broker() else { return };
    let (mut hosts, dir, output, expected) = windows_over_two_hosts(
        "cluster-idle",
        &broker,
        &[0, 1],
        "bounded = false\nidle_timeout_ms = 100",
        1_500,
    );
    // The watermark the two filled partitions reach once every unit reading the source
    // is idle: the larger of their last timestamps, less the bound and 1 (the unit of
    // the empty one is left out).
    let last = |p: i64| {
        (0..900i64)
            .map(|i| 1_000 + i * 37 + (i * 7919 + p) % 300)
            .max()
            .unwrap()
    };
    let watermark = last(0).max(last(1)) - 500 - 1;
    let mut want: Vec<String> = expected
        .into_iter()
        .filter(|(end, _)| end - 1 <= watermark)
        .map(|(_, w)| w)
        .collect();
    want.sort();
    assert!(want.len() > 10, "a test of too few windows: {want:?}");
    let deadline = Instant::now() + Duration::from_secs(120);
    let got = loop {
        let got = committed_windows(&broker, &output);
        if got.len() >= want.len() {
            break got;
        }
        for (n, host) in hosts.iter_mut().enumerate() {
            if let Some(status) = host.try_wait().unwrap() {
                panic!("host {n} ended ({status}): {}", log_of(&dir, n));
            }
        }
        assert!(
            Instant::now() < deadline,
            "{} of {} windows fired in 2 minutes: {}",
            got.len(),
            want.len(),
            log_of(&dir, 0)
        );
        thread::sleep(Duration::from_millis(200));
    };
    for host in &mut hosts {
        let _ = host.kill();
        let _ = host.wait();
    }
    assert_eq!(got, want);
}
