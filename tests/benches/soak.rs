//! The kill soaks: each runs a word count, SIGKILLs it at random moments `KILLS` times
//! (default 100), then checks the committed output against the input: lost and
//! duplicated records, which must both be 0. Not part of the test suite: they take
//! minutes.
//!
//! - `file`: file → file in a `sluice run` process, resumed from the latest checkpoint
//!   after each kill, at `count` parallelism 1 and 4; compared line by line with a
//!   failure-free run. Its keyed state is on the backend `STATE_BACKEND` names (`heap`,
//!   the default, or `rocksdb`).
//! - `kafka`: topic → topic, exactly once, in a `sluice run` process resumed from the
//!   latest checkpoint after each kill; every running count of every word must be in the
//!   output topic once.
//! - `cluster`: topic → topic over two hosts (`sluice run --cluster`); one of them, by
//!   chance, is SIGKILLed and started again, once the other took its units over, while
//!   input keeps coming; the same check.
//! - `windows` (not in the default set): event-time sliding windows with allowed lateness
//!   over 5,000 keys (a timer per key and window: with `rocksdb`'s least memory most are
//!   in its database), file → file at parallelism 1 and 4, compared line by line with a
//!   failure-free run on the heap. On `STATE_BACKEND` as `file`.
//!
//! ```text
//! cargo bench -p sluice-tests --bench soak                 # all three
//! SOAK=kafka,cluster KILLS=20 cargo bench -p sluice-tests --bench soak
//! SOAK=file STATE_BACKEND=rocksdb cargo bench -p sluice-tests --bench soak
//! SOAK=windows STATE_BACKEND=rocksdb cargo bench -p sluice-tests --bench soak
//! ```
//!
//! The Kafka soaks use the broker in `SLUICE_KAFKA`, or start one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sluice_tests::cluster::{owned_units, spawn_host, started_units};
use sluice_tests::kafka::{BenchBroker, Read, create_topic, produce, read_committed, unique_topic};
use sluice_tests::plugins::{COUNT, TEST_MISBEHAVE, TOKENIZE};
use sluice_tests::{
    expected_word_counts, killable_windows, run_job, sample_text, sluice_run, test_dir,
    throttled_wordcount, write_job,
};

const BIN: &str = env!("CARGO_BIN_EXE_sluice-test-cli");

/// The next pseudo-random number of `seed` (a 64-bit LCG's high bits).
fn next(seed: &mut u64) -> u64 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *seed >> 33
}

/// Runs `job` in `sluice run` processes, each resumed from the latest checkpoint in
/// `checkpoints`, SIGKILLing each after a random 150–1,050 ms, `kills` times; the last
/// runs to its end. Returns the kills made (fewer when the job ended before).
fn kill_loop(job: &Path, checkpoints: &Path, kills: usize, seed: &mut u64) -> usize {
    let mut killed = 0;
    loop {
        let mut child = sluice_run(BIN, job, Some(checkpoints))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawning sluice");
        if killed == kills {
            assert!(child.wait().unwrap().success(), "the last run failed");
            return killed;
        }
        let delay = Duration::from_millis(150 + next(seed) % 900);
        let deadline = Instant::now() + delay;
        while Instant::now() < deadline && child.try_wait().unwrap().is_none() {
            thread::sleep(Duration::from_millis(5));
        }
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "a run failed");
            return killed;
        }
        child.kill().unwrap();
        child.wait().unwrap();
        killed += 1;
    }
}

/// The running counts in `records` (key: word, value: its count so far) against every
/// count from 1 to its total in `expected`: (lost, duplicated).
fn running_count_diff(records: &[Read], expected: &BTreeMap<String, u64>) -> (u64, u64) {
    let mut got: BTreeMap<&str, BTreeMap<u64, u64>> = BTreeMap::new();
    for r in records {
        let count = r.value.parse().unwrap_or(0);
        *got.entry(r.key.as_deref().unwrap_or(""))
            .or_default()
            .entry(count)
            .or_default() += 1;
    }
    let (mut lost, mut duplicated) = (0, 0);
    for (word, total) in expected {
        let seen = got.remove(word.as_str()).unwrap_or_default();
        for c in 1..=*total {
            match seen.get(&c) {
                None => lost += 1,
                Some(n) => duplicated += n - 1,
            }
        }
        duplicated += seen
            .iter()
            .filter(|(c, _)| **c == 0 || **c > *total)
            .map(|(_, n)| n)
            .sum::<u64>();
    }
    duplicated += got.values().flat_map(|s| s.values()).sum::<u64>();
    (lost, duplicated)
}

/// Lines by how often they occur.
fn multiset(text: &str) -> BTreeMap<&str, i64> {
    let mut m = BTreeMap::new();
    for line in text.lines() {
        *m.entry(line).or_insert(0) += 1;
    }
    m
}

fn soak(parallelism: u32, kills: usize, seed: &mut u64) {
    // Long enough that every kill lands while it runs: about 1 s of input per kill.
    let records = 5_000 * (kills as u64 + 2);
    let rate = 5000.0;
    let backend = std::env::var("STATE_BACKEND").unwrap_or_else(|_| "heap".into());
    let text = format!(
        "{}[state]\nbackend = \"{backend}\"\n",
        throttled_wordcount(parallelism, records, rate)
    );
    // The same records, unthrottled.
    let reference_dir = test_dir(&format!("soak-reference-{parallelism}"));
    let unthrottled = text.replace(&format!("rate = {rate}\n"), "");
    run_job(&write_job(&reference_dir, &unthrottled)).expect("the failure-free run");
    let reference = std::fs::read_to_string(reference_dir.join("out/counts.tsv")).unwrap();

    let dir = test_dir(&format!("soak-{parallelism}"));
    let job = write_job(&dir, &text);
    let started = Instant::now();
    let killed = kill_loop(&job, &dir.join("checkpoints"), kills, seed);
    let output = std::fs::read_to_string(dir.join("out/counts.tsv")).unwrap();
    let (lost, duplicated) = line_diff(&reference, &output);
    println!(
        "file, {backend}, parallelism {parallelism}: {killed} kills in {:.0} s, {} lines expected, {lost} lost, {duplicated} duplicated",
        started.elapsed().as_secs_f64(),
        reference.lines().count()
    );
}

/// Lines of `reference` missing from `output`, and lines of `output` past `reference`'s,
/// counting repeats.
fn line_diff(reference: &str, output: &str) -> (i64, i64) {
    let (want, got) = (multiset(reference), multiset(output));
    let mut lost = 0;
    let mut duplicated = 0;
    for (line, n) in &want {
        let diff = got.get(line).copied().unwrap_or(0) - n;
        if diff < 0 {
            lost += -diff;
        } else {
            duplicated += diff;
        }
    }
    duplicated += got
        .iter()
        .filter(|(line, _)| !want.contains_key(*line))
        .map(|(_, n)| n)
        .sum::<i64>();
    (lost, duplicated)
}

fn windows_soak(parallelism: u32, kills: usize, seed: &mut u64) {
    let records = 5_000 * (kills as u64 + 2);
    let backend = std::env::var("STATE_BACKEND").unwrap_or_else(|_| "heap".into());
    let reference_dir = test_dir(&format!("soak-windows-reference-{parallelism}"));
    let reference_job = killable_windows(parallelism, records, None, "heap");
    run_job(&write_job(&reference_dir, &reference_job)).expect("the failure-free run");
    let reference = std::fs::read_to_string(reference_dir.join("out/counts.tsv")).unwrap();
    let dir = test_dir(&format!("soak-windows-{parallelism}"));
    let job = write_job(
        &dir,
        &killable_windows(parallelism, records, Some(5000.0), &backend),
    );
    let started = Instant::now();
    let killed = kill_loop(&job, &dir.join("checkpoints"), kills, seed);
    let output = std::fs::read_to_string(dir.join("out/counts.tsv")).unwrap();
    let (lost, duplicated) = line_diff(&reference, &output);
    println!(
        "windows, {backend}, parallelism {parallelism}: {killed} kills in {:.0} s, {} lines expected, {lost} lost, {duplicated} duplicated",
        started.elapsed().as_secs_f64(),
        reference.lines().count()
    );
}

/// The word count from topic `input` to topic `output` at `parallelism`, exactly once,
/// checkpoints every `interval_ms`, each line first waiting 1 ms (so that kills land
/// while it runs); `more` is appended (a `[cluster]` table).
fn kafka_job(
    dir: &Path,
    broker: &str,
    (input, output): (&str, &str),
    bounded: bool,
    parallelism: u32,
    interval_ms: u32,
    more: &str,
) -> PathBuf {
    write_job(
        dir,
        &format!(
            r#"
name = "{output}"
[source]
type = "kafka"
bootstrap = "{broker}"
topics = "{input}"
bounded = {bounded}
parallelism = {parallelism}
[[operator]]
name = "slow"
plugin = "{TEST_MISBEHAVE}"
config = {{ behavior = "slow-process", delay-ms = 1 }}
parallelism = {parallelism}
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
interval_ms = {interval_ms}
dir = "checkpoints"
[runtime]
batch_size = 50
{more}
"#
        ),
    )
}

/// Writes `text`'s lines to `topic`, unkeyed.
fn produce_lines(broker: &str, topic: &str, text: &str) {
    let records: Vec<(Option<&str>, &str, Option<i64>)> =
        text.lines().map(|l| (None, l, None)).collect();
    produce(broker, topic, &records);
}

/// Topic → topic in one `sluice run` process, killed `kills` times.
fn kafka_soak(broker: &str, kills: usize, seed: &mut u64) {
    let dir = test_dir("soak-kafka");
    // About 1 s of input per kill, at 2 × 1,000 lines/s.
    let text = sample_text(*seed, 1_000 * (kills + 2));
    let (input, output) = (unique_topic("soak-in"), unique_topic("soak-out"));
    create_topic(broker, &input, 2);
    create_topic(broker, &output, 3);
    produce_lines(broker, &input, &text);
    let job = kafka_job(&dir, broker, (&input, &output), true, 2, 100, "");
    let started = Instant::now();
    let killed = kill_loop(&job, &dir.join("checkpoints"), kills, seed);
    let expected = expected_word_counts(&text, 1);
    let (lost, duplicated) = running_count_diff(&read_committed(broker, &output), &expected);
    println!(
        "kafka → kafka, parallelism 2: {killed} kills in {:.0} s, {} records expected, {lost} lost, {duplicated} duplicated",
        started.elapsed().as_secs_f64(),
        expected.values().sum::<u64>()
    );
}

/// Waits until `ready` (checked every 50 ms), at most `limit`.
fn wait(what: &str, limit: Duration, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !ready() {
        assert!(Instant::now() < deadline, "waited {limit:?} for {what}");
        thread::sleep(Duration::from_millis(50));
    }
}

/// Topic → topic over two hosts, one of which is killed `kills` times.
fn cluster_soak(broker: &str, kills: usize, seed: &mut u64) {
    let dir = test_dir("soak-cluster");
    let (input, output) = (unique_topic("soak-cin"), unique_topic("soak-cout"));
    create_topic(broker, &input, 4);
    create_topic(broker, &output, 4);
    let cluster = "[cluster]\ncheckpoints = \"store\"\nexchange_partitions = 4\n\
                   session_timeout_ms = 6000\nwork_dir = \"work\"";
    let job = kafka_job(&dir, broker, (&input, &output), false, 1, 200, cluster);
    // Input keeps coming, 20 lines at a time, at most 200 lines/s, until the kills are
    // over.
    let text = Arc::new(sample_text(*seed, 200 * 15 * (kills + 2)));
    let stop = Arc::new(AtomicBool::new(false));
    let producer = {
        let (broker, input, text, stop) = (
            broker.to_string(),
            input.clone(),
            text.clone(),
            stop.clone(),
        );
        thread::spawn(move || {
            let lines: Vec<&str> = text.lines().collect();
            let mut written = 0;
            for chunk in lines.chunks(20) {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                produce_lines(&broker, &input, &chunk.join("\n"));
                written += chunk.len();
                thread::sleep(Duration::from_millis(100));
            }
            written
        })
    };
    let log = |n: usize, run: usize| dir.join(format!("host-{n}-{run}.log"));
    let read = |path: &Path| std::fs::read_to_string(path).unwrap_or_default();
    let mut runs = [0, 0];
    let mut hosts: Vec<Child> = (0..2)
        .map(|n| spawn_host(BIN, &job, broker, &log(n, 0)))
        .collect();
    // Both hosts own units, and have started them all.
    let shared = |runs: &[usize; 2]| {
        (0..2).all(|n| {
            let l = read(&log(n, runs[n]));
            owned_units(&l).is_some_and(|u| u > 0 && started_units(&l) >= u)
        })
    };
    let started = Instant::now();
    wait(
        "the hosts to share the units",
        Duration::from_secs(120),
        || shared(&runs),
    );
    for _ in 0..kills {
        thread::sleep(Duration::from_millis(500 + next(seed) % 2_500));
        let victim = (next(seed) % 2) as usize;
        hosts[victim].kill().unwrap();
        hosts[victim].wait().unwrap();
        runs[victim] += 1;
        hosts[victim] = spawn_host(BIN, &job, broker, &log(victim, runs[victim]));
        wait(
            "the units to be shared again",
            Duration::from_secs(180),
            || {
                for (n, h) in hosts.iter_mut().enumerate() {
                    assert!(
                        h.try_wait().unwrap().is_none(),
                        "host {n} ended: {}",
                        read(&log(n, runs[n]))
                    );
                }
                shared(&runs)
            },
        );
    }
    stop.store(true, Ordering::Relaxed);
    let written = producer.join().unwrap();
    let produced: String = text.lines().take(written).collect::<Vec<_>>().join("\n");
    let expected = expected_word_counts(&produced, 1);
    // Every count committed, or the last diff after five minutes.
    let deadline = Instant::now() + Duration::from_secs(300);
    let (lost, duplicated) = loop {
        let diff = running_count_diff(&read_committed(broker, &output), &expected);
        if diff.0 == 0 || Instant::now() > deadline {
            break diff;
        }
        thread::sleep(Duration::from_secs(5));
    };
    for h in &mut hosts {
        let _ = h.kill();
        let _ = h.wait();
    }
    println!(
        "cluster, 2 hosts, 8 units: {kills} kills in {:.0} s, {written} lines, {} records expected, {lost} lost, {duplicated} duplicated",
        started.elapsed().as_secs_f64(),
        expected.values().sum::<u64>()
    );
}

fn main() {
    let kills: usize = std::env::var("KILLS")
        .ok()
        .and_then(|k| k.parse().ok())
        .unwrap_or(100);
    let soaks = std::env::var("SOAK").unwrap_or_else(|_| "file,kafka,cluster".into());
    let mut seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    println!("kill soaks {soaks}: {kills} SIGKILLs each, seed {seed}");
    let soaks: Vec<&str> = soaks.split(',').map(str::trim).collect();
    if soaks.contains(&"file") {
        for parallelism in [1, 4] {
            soak(parallelism, kills, &mut seed);
        }
    }
    if soaks.contains(&"windows") {
        for parallelism in [1, 4] {
            windows_soak(parallelism, kills, &mut seed);
        }
    }
    if soaks.contains(&"kafka") || soaks.contains(&"cluster") {
        let broker = BenchBroker::get();
        if soaks.contains(&"kafka") {
            kafka_soak(&broker.address, kills, &mut seed);
        }
        if soaks.contains(&"cluster") {
            cluster_soak(&broker.address, kills, &mut seed);
        }
    }
}
