//! A job over several hosts (`sluice run --cluster`) against the same job on one host:
//! the word count (`tokenize → count`, every running count out, checkpoints every
//! second) from a topic of 4 partitions to a topic, exactly once; then the time from a
//! host's death to its units running on the other host.
//!
//! On one 2-core machine more hosts bring no speed: what this shows is the cost of the
//! exchange topic between the stages (every record written to Kafka and read back, in
//! transactions), as a ratio of lines/s against the single-host job in the same run.
//!
//! Uses the broker in `SLUICE_KAFKA`, or starts one. `LINES` sets the input (default
//! 200,000 lines of 8 words).
//!
//! `cargo bench -p sluice-tests --bench cluster`

use std::path::{Path, PathBuf};
use std::process::Child;
use std::thread;
use std::time::{Duration, Instant};

use sluice_tests::cluster::{owned_units, spawn_run, started_units};
use sluice_tests::kafka::{BenchBroker, create_topic, produce, unique_topic};
use sluice_tests::plugins::{COUNT, TEST_MISBEHAVE, TOKENIZE};
use sluice_tests::{sample_text, test_dir};

const SESSION_TIMEOUT_MS: u64 = 6_000;

/// The word count from `input` to a new topic; over several hosts with `cluster`.
fn job(
    dir: &Path,
    broker: &str,
    input: &str,
    parallelism: u32,
    cluster: bool,
    slow: bool,
) -> PathBuf {
    let name = unique_topic("bench-cluster");
    let output = name.clone();
    create_topic(broker, &output, 4);
    let slow = if slow {
        format!(
            "[[operator]]\nname = \"slow\"\nplugin = \"{TEST_MISBEHAVE}\"\n\
             config = {{ behavior = \"slow-process\", delay-ms = 1 }}\nparallelism = {parallelism}\n"
        )
    } else {
        String::new()
    };
    let cluster = if cluster {
        format!(
            "[cluster]\ncheckpoints = \"store-{name}\"\nexchange_partitions = 4\n\
             session_timeout_ms = {SESSION_TIMEOUT_MS}\nwork_dir = \"work-{name}\"\n"
        )
    } else {
        String::new()
    };
    let toml = format!(
        r#"
name = "{name}"
[source]
type = "kafka"
bootstrap = "{broker}"
topics = "{input}"
bounded = true
parallelism = {parallelism}
{slow}
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
parallelism = {parallelism}
[[operator]]
name = "count"
plugin = "{COUNT}"
key_by = "key"
parallelism = {parallelism}
[sink]
type = "kafka"
bootstrap = "{broker}"
topic = "{output}"
parallelism = {parallelism}
[checkpoint]
interval_ms = 1000
dir = "checkpoints-{name}"
{cluster}
"#
    );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, toml).unwrap();
    path
}

fn sluice(job: &Path, cluster: Option<&str>, log: &Path) -> Child {
    spawn_run(env!("CARGO_BIN_EXE_sluice-test-cli"), job, cluster, log)
}

/// Runs `hosts` processes of `job` (one without `--cluster` when `hosts` is 0) to their
/// end; returns the wall time.
fn run(dir: &Path, job: &Path, broker: &str, hosts: usize) -> Duration {
    let start = Instant::now();
    let children: Vec<Child> = (0..hosts.max(1))
        .map(|n| {
            let log = dir.join(format!("host-{n}.log"));
            sluice(job, (hosts > 0).then_some(broker), &log)
        })
        .collect();
    for (n, mut child) in children.into_iter().enumerate() {
        let status = child.wait().unwrap();
        assert!(
            status.success(),
            "host {n} failed: {}",
            std::fs::read_to_string(dir.join(format!("host-{n}.log"))).unwrap_or_default()
        );
    }
    start.elapsed()
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

/// Two hosts; once output flows one is SIGKILLed: the time until the other owns every
/// unit, and until it has restored them all.
fn failover(dir: &Path, broker: &str, input: &str) -> (Duration, Duration) {
    let job = job(dir, broker, input, 1, true, true);
    let logs: Vec<PathBuf> = (0..2)
        .map(|n| dir.join(format!("failover-{n}.log")))
        .collect();
    let mut hosts: Vec<Child> = logs.iter().map(|l| sluice(&job, Some(broker), l)).collect();
    let read = |n: usize| std::fs::read_to_string(&logs[n]).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(120);
    // Both hosts own units, and host 0 runs all of its own.
    while !(owned_units(&read(0)).is_some_and(|u| u > 0 && started_units(&read(0)) >= u)
        && owned_units(&read(1)).is_some_and(|u| u > 0))
    {
        assert!(
            Instant::now() < deadline,
            "the hosts did not share the units"
        );
        thread::sleep(Duration::from_millis(20));
    }
    thread::sleep(Duration::from_secs(2));
    let moving = owned_units(&read(0)).unwrap_or(0);
    let restored_before =
        read(1).matches("): restoring ").count() + read(1).matches("): starting").count();
    hosts[0].kill().unwrap();
    hosts[0].wait().unwrap();
    let killed = Instant::now();
    let mut owns_all = None;
    loop {
        let log = read(1);
        if owns_all.is_none() && owned_units(&log) == Some(8) {
            owns_all = Some(killed.elapsed());
        }
        let restored = started_units(&log);
        if let Some(owns_all) = owns_all
            && restored >= restored_before + moving
        {
            let all_running = killed.elapsed();
            let _ = hosts[1].kill();
            let _ = hosts[1].wait();
            return (owns_all, all_running);
        }
        assert!(
            killed.elapsed() < Duration::from_secs(120),
            "the units did not move: {log}"
        );
        thread::sleep(Duration::from_millis(20));
    }
}

fn main() {
    let lines: usize = std::env::var("LINES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    let runs = sluice_tests::bench::runs(3);
    let broker = BenchBroker::get();
    let b = &broker.address;
    let dir = test_dir("bench-cluster");
    let text = sample_text(11, lines);
    let input = unique_topic("bench-cluster-in");
    create_topic(b, &input, 4);
    let records: Vec<(Option<&str>, &str, Option<i64>)> =
        text.lines().map(|l| (None, l, None)).collect();
    produce(b, &input, &records);

    let mut rows: Vec<(String, Duration)> = Vec::new();
    for (what, parallelism, hosts) in [
        ("one host, parallelism 1", 1, 0),
        ("one host, parallelism 2", 2, 0),
        ("--cluster, 1 host", 1, 1),
        ("--cluster, 2 hosts", 1, 2),
        ("--cluster, 3 hosts", 1, 3),
    ] {
        let times = (0..runs)
            .map(|_| {
                run(
                    &dir,
                    &job(&dir, b, &input, parallelism, hosts > 0, false),
                    b,
                    hosts,
                )
            })
            .collect();
        rows.push((what.to_string(), median(times)));
    }
    let rate = |d: Duration| lines as f64 / d.as_secs_f64();
    let baseline = rows[0].1;
    println!(
        "word count (tokenize -> count, every running count out), {lines} lines from a topic \
         of 4 partitions to a topic, exactly once, checkpoints every second, median of {runs}; \
         over several hosts: 8 units (4 source partitions, 4 exchange partitions)"
    );
    for (what, d) in &rows {
        println!(
            "  {what:<26} {:>7.2} s {:>10.0} lines/s   {:.2} of one host at parallelism 1",
            d.as_secs_f64(),
            rate(*d),
            rate(*d) / rate(baseline)
        );
    }
    let (owns_all, all_running) = failover(&dir, b, &input);
    println!(
        "failover, 2 hosts, one SIGKILLed (session timeout {} s): the other owns its units \
         after {:.1} s, runs them all after {:.1} s",
        SESSION_TIMEOUT_MS / 1000,
        owns_all.as_secs_f64(),
        all_running.as_secs_f64()
    );
}
