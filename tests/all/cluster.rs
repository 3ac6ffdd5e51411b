//! One job over several hosts (`sluice run --cluster`), against the real broker: host
//! processes share the units of a job, a killed or stopped host's units move, and the
//! committed output is checked against counts computed here.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use sluice_tests::kafka::{broker, create_topic, read_committed, unique_topic};
use sluice_tests::plugins::{COUNT, TEST_MISBEHAVE, TOKENIZE};
use sluice_tests::{scratch_root, test_dir, write_job};

use crate::kafka::{as_count_lines, assert_counts, topic_of_lines};

/// A word count from `input` (bounded) to `output` over several hosts: a slow operator,
/// `tokenize`, then `count` by word after an exchange topic of 4 partitions.
fn cluster_word_count(dir: &Path, broker: &str, input: &str, output: &str) -> PathBuf {
    write_job(
        dir,
        &format!(
            r#"
name = "{output}"
[source]
type = "kafka"
bootstrap = "{broker}"
topics = "{input}"
bounded = true
[[operator]]
name = "slow"
plugin = "{TEST_MISBEHAVE}"
config = {{ behavior = "slow-process", delay-ms = 2 }}
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
[[operator]]
name = "count"
plugin = "{COUNT}"
key_by = "key"
[sink]
type = "kafka"
bootstrap = "{broker}"
topic = "{output}"
[checkpoint]
interval_ms = 100
[runtime]
batch_size = 20
buffer_timeout_ms = 5
[cluster]
checkpoints = "store"
exchange_partitions = 4
session_timeout_ms = 6000
"#
        ),
    )
}

/// A host process of the job, logging into `dir/host-N.log`.
fn spawn_host(dir: &Path, job: &Path, broker: &str, n: usize) -> Child {
    let log = std::fs::File::create(dir.join(format!("host-{n}.log"))).unwrap();
    Command::new(env!("CARGO_BIN_EXE_sluice-test-cli"))
        .args(["--log", "info", "run", "--quiet"])
        .arg(job)
        .args(["--cluster", broker])
        .env("SLUICE_CACHE_DIR", scratch_root().join("cache"))
        .env_remove("FAILPOINTS")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawning sluice")
}

fn log_of(dir: &Path, n: usize) -> String {
    std::fs::read_to_string(dir.join(format!("host-{n}.log"))).unwrap_or_default()
}

/// Waits for `host` to end, successfully, within `limit`.
fn wait_success(dir: &Path, host: &mut Child, n: usize, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = host.try_wait().unwrap() {
            assert!(status.success(), "host {n} failed: {}", log_of(dir, n));
            return;
        }
        if Instant::now() > deadline {
            let _ = host.kill();
            panic!("host {n} did not end within {limit:?}: {}", log_of(dir, n));
        }
        thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until the committed output holds at least `records`, every host running.
fn wait_for_output(dir: &Path, hosts: &mut [Child], broker: &str, topic: &str, records: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while read_committed(broker, topic).len() < records {
        for (n, host) in hosts.iter_mut().enumerate() {
            if let Some(status) = host.try_wait().unwrap() {
                panic!("host {n} ended ({status}) early: {}", log_of(dir, n));
            }
        }
        assert!(
            Instant::now() < deadline,
            "no output of {records} records in 2 minutes"
        );
        thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn three_hosts_share_a_job_and_a_killed_hosts_units_move() {
    let Some(broker) = broker() else { return };
    let (input, text) = topic_of_lines(&broker, "cluster-in", 4, 31, 1_600);
    let output = unique_topic("cluster-out");
    create_topic(&broker, &output, 2);
    let dir = test_dir("cluster-kill");
    let job = cluster_word_count(&dir, &broker, &input, &output);
    let mut hosts: Vec<Child> = (0..3).map(|n| spawn_host(&dir, &job, &broker, n)).collect();
    // Killed once some output is committed: mid-run, with units of both stages busy.
    wait_for_output(&dir, &mut hosts, &broker, &output, 200);
    hosts[0].kill().unwrap(); // SIGKILL
    hosts[0].wait().unwrap();
    for (n, host) in hosts.iter_mut().enumerate().skip(1) {
        wait_success(&dir, host, n, Duration::from_secs(180));
    }
    assert_counts(&as_count_lines(&read_committed(&broker, &output)), &text);
    let logs = log_of(&dir, 1) + &log_of(&dir, 2);
    assert!(logs.contains("finished"), "{logs}");
}
