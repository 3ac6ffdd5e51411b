//! What checkpoints cost, as ratios measured in this run:
//!
//! * throughput of a keyed word-count job with a checkpoint every second against the same
//!   job without checkpoints;
//! * the task thread's stall in the synchronous part of a checkpoint (the operator's
//!   `snapshot` call plus O(1) copies of keyed state and timers) with 10k, 1M and 10M keys
//!   of keyed state — it must not grow with the state (that is what asynchronous means) —
//!   and, for scale, how long the asynchronous part takes to write that state;
//! * the whole stall a task thread sees in a real job: the word count with a file sink
//!   (whose synchronous part flushes, fsyncs and renames its staged output) and
//!   checkpoints every 100 ms, the longest synchronous part of any task per checkpoint;
//! * recovery: from the moment the supervisor learns that an operator trapped to the first
//!   record processed by the restored job (cancel the failed attempt, load the latest
//!   checkpoint, instantiate and restore every operator), with 10k, 100k and 1M keys of
//!   keyed state, against a fresh start of the same job in the same engine.
//!
//! `cargo bench -p sluice-tests --bench checkpoint` (`SLUICE_BENCH_MAX_KEYS` caps the
//! largest state, default 10M).

use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::unbounded;

use sluice::chain::{OperatorChain, OperatorState};
use sluice::checkpoint::{CheckpointStorage, SnapshotKind};
use sluice::job::{Job, JobControl, JobMonitor, RestorePoint};
use sluice::state::{KeyedState, KeyedStateBackend, StateDescriptor, StateKind};
use sluice::tenant::HostConfig;
use sluice_codec::BatchWriter;
use sluice_tests::bench::{open_info, opened_chain, paired, rate, runs, wasm_operator};
use sluice_tests::plugins::{COUNT, TEST_MISBEHAVE, TOKENIZE};
use sluice_tests::{engine, run_job, test_dir, write_job};

fn job(checkpoints: bool, records: u64) -> String {
    let checkpoint = if checkpoints {
        "[checkpoint]\ninterval_ms = 1000\n"
    } else {
        ""
    };
    format!(
        r#"
name = "throughput"
[source]
type = "generator"
records = {records}
words_per_record = 8
vocabulary = 5000
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
[[operator]]
name = "count"
plugin = "{COUNT}"
parallelism = 2
key_by = "key"
[sink]
type = "file"
path = "out.tsv"
format = "key-value"
{checkpoint}"#
    )
}

fn throughput() {
    let records = 1_500_000u64;
    let runs = runs(3);
    let completed = std::cell::Cell::new(0);
    let run = |checkpoints: bool| {
        let dir = test_dir("bench-throughput");
        let report = run_job(&write_job(&dir, &job(checkpoints, records))).unwrap();
        if checkpoints {
            completed.set(report.checkpoints.completed.len());
        }
        let _ = std::fs::remove_dir_all(&dir);
    };
    let p = paired(runs, || run(false), || run(true));
    let completed = completed.get();
    let rate_of = |d: Duration| records as f64 / d.as_secs_f64();
    println!("word count, {records} lines of 8 words, count x2, median of {runs} alternating runs");
    println!(
        "  no checkpoints          {:>12}",
        rate(rate_of(p.baseline))
    );
    println!(
        "  checkpoint every 1 s    {:>12}  ({completed} checkpoints per run)",
        rate(rate_of(p.subject))
    );
    println!("  with / without          {:>12.2}", p.speed);
}

fn count_chain(keys: u64) -> OperatorChain {
    let mut backend = KeyedStateBackend::new(128, 0..128);
    let state = backend
        .declare(StateDescriptor {
            name: "count".into(),
            kind: StateKind::Value,
            ttl_ms: None,
        })
        .unwrap();
    for i in 0..keys {
        backend
            .put(
                state,
                format!("key{i}").as_bytes(),
                b"",
                // The SDK stores a u64 as postcard: 1 is the single byte 0x01.
                &[1],
                0,
            )
            .unwrap();
    }
    opened_chain(vec![
        (
            wasm_operator(
                COUNT,
                "count",
                OperatorState::new(Some(KeyedState::Heap(backend))),
            ),
            open_info("count", &[], true),
        ),
        (
            Box::new(sluice_tests::native::discard()),
            open_info("sink", &[], false),
        ),
    ])
}

fn stall() {
    let max_keys: u64 = std::env::var("SLUICE_BENCH_MAX_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000);
    let runs = runs(9);
    println!("synchronous part of a checkpoint of the count operator, median of {runs}");
    println!(
        "{:>12} {:>14} {:>12} {:>22} {:>16}",
        "keys", "sync stall", "vs 10k", "while last is written", "async write"
    );
    let mut base = None;
    for keys in [10_000u64, 1_000_000, 10_000_000]
        .into_iter()
        .filter(|k| *k <= max_keys)
    {
        let fill = Instant::now();
        let mut chain = count_chain(keys);
        let filled = fill.elapsed();
        // Between two snapshots the operator updates some keys, so every snapshot shares
        // structure with live state that is being written.
        let mut batch = BatchWriter::new();
        for i in 0..256u64 {
            let key = format!("key{}", i * 7919 % keys);
            batch.push(Some(key.as_bytes()), b"", None);
        }
        let batch = batch.into_bytes();
        // The operator writes its values back in `snapshot`: the stall grows with the
        // values written since the last checkpoint (256 here), and more when the last
        // checkpoint's state is still shared with an asynchronous write in progress
        // (its touched shards are copied then, as any write would copy them).
        let mut stalls = Vec::new();
        let mut shared_stalls = Vec::new();
        let mut last = None;
        for id in 1..=runs as u64 {
            chain.process(0, batch.clone(), 256, Vec::new()).unwrap();
            let start = Instant::now();
            let snapshot = chain.snapshot(id).unwrap();
            shared_stalls.push(start.elapsed());
            last = Some(snapshot);
        }
        for id in runs as u64 + 1..=2 * runs as u64 {
            // The previous checkpoint's write is done: its snapshot is released.
            drop(last.take());
            chain.process(0, batch.clone(), 256, Vec::new()).unwrap();
            let start = Instant::now();
            let snapshot = chain.snapshot(id).unwrap();
            stalls.push(start.elapsed());
            last = Some(snapshot);
        }
        shared_stalls.sort();
        let shared = shared_stalls[shared_stalls.len() / 2];
        stalls.sort();
        let stall = stalls[stalls.len() / 2];
        let id = 2 * runs as u64;
        let snapshots = last.unwrap();
        let dir = test_dir("bench-stall");
        let storage = CheckpointStorage::new(&dir).unwrap();
        let write = Instant::now();
        for s in &snapshots {
            storage
                .write_operator_state(
                    &storage.folder(id, SnapshotKind::Checkpoint),
                    SnapshotKind::Checkpoint,
                    s,
                    0,
                )
                .unwrap();
        }
        let written = write.elapsed();
        let _ = std::fs::remove_dir_all(&dir);
        let base = *base.get_or_insert(stall);
        println!(
            "{keys:>12} {:>12.1}µs {:>12.2} {:>20.1}µs {:>14.2}s   (state built in {:.1}s)",
            stall.as_secs_f64() * 1e6,
            stall.as_secs_f64() / base.as_secs_f64().max(1e-9),
            shared.as_secs_f64() * 1e6,
            written.as_secs_f64(),
            filled.as_secs_f64()
        );
        drop(chain);
    }
}

/// Keyed counts of `keys` keys, with an operator that traps at record `fail_after` in the
/// first attempt only, checkpoints every 200 ms and an immediate restart.
fn recovery_job(keys: u64, fail_after: u64) -> String {
    format!(
        r#"
name = "recovery"
[source]
type = "generator"
shape = "events"
records = 1000000000
keys = {keys}
[[operator]]
name = "boom"
plugin = "{TEST_MISBEHAVE}"
config = {{ behavior = "panic-in-process", after = {fail_after}, attempts = "0" }}
[[operator]]
name = "count"
plugin = "{COUNT}"
key_by = {{ field = 1, separator = "," }}
config = {{ emit = "final" }}
[sink]
type = "file"
path = "out.tsv"
[checkpoint]
interval_ms = 200
[restart]
strategy = "fixed-delay"
attempts = 1
delay_ms = 0
"#
    )
}

/// Polls `ready` until it holds and returns when it first did.
fn wait_until(mut ready: impl FnMut() -> bool) -> Instant {
    while !ready() {
        thread::sleep(Duration::from_micros(100));
    }
    Instant::now()
}

/// True when the current attempt's `count` operator has processed a record.
fn count_started(monitor: &JobMonitor, attempt: u32) -> bool {
    monitor.attempt() == attempt
        && monitor.is_running()
        && monitor
            .tasks()
            .iter()
            .flat_map(|t| &t.operators)
            .any(|o| o.operator == "count" && o.records_in > 0)
}

struct Recovery {
    fresh_start: Duration,
    recovery: Duration,
    restored_bytes: u64,
}

/// One run: a fresh start to the first counted record, then a failure and the recovery
/// to the first counted record of the restored attempt.
fn recover_once(job: &Job) -> Recovery {
    let (control, rx) = unbounded();
    let monitor = JobMonitor::default();
    let start = Instant::now();
    thread::scope(|scope| {
        let run = scope.spawn(|| job.run(RestorePoint::Fresh, &rx, &monitor));
        let fresh_start = wait_until(|| count_started(&monitor, 0)) - start;
        let mut restored_bytes = 0;
        let failed_at = loop {
            if let Some(at) = monitor.last_failure_at() {
                break at;
            }
            if let Some(c) = monitor.checkpoints().completed.last() {
                restored_bytes = c.bytes;
            }
            thread::sleep(Duration::from_micros(100));
        };
        let recovery = wait_until(|| count_started(&monitor, 1)) - failed_at;
        control.send(JobControl::Cancel).unwrap();
        run.join().unwrap().unwrap();
        Recovery {
            fresh_start,
            recovery,
            restored_bytes,
        }
    })
}

fn recovery() {
    let runs = runs(3);
    let max_keys: u64 = std::env::var("SLUICE_BENCH_MAX_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000);
    let engine = engine();
    println!("recovery after an operator trap, median of {runs} runs");
    println!(
        "{:>10} {:>12} {:>12} {:>14} {:>16}",
        "keys", "fresh start", "recovery", "recovery/fresh", "state restored"
    );
    for keys in [10_000u64, 100_000, 1_000_000]
        .into_iter()
        .filter(|k| *k <= max_keys)
    {
        // Enough records that nearly every key has a count before the failure.
        let text = recovery_job(keys, (4 * keys).max(1_000_000));
        let mut results: Vec<Recovery> = (0..runs)
            .map(|_| {
                let dir = test_dir("bench-recovery");
                let path = write_job(&dir, &text);
                let job = Job::load_with(&path, &engine, &HostConfig::default()).unwrap();
                let result = recover_once(&job);
                let _ = std::fs::remove_dir_all(&dir);
                result
            })
            .collect();
        let median = |f: fn(&Recovery) -> Duration, results: &mut Vec<Recovery>| {
            results.sort_by_key(f);
            f(&results[results.len() / 2])
        };
        let fresh = median(|r| r.fresh_start, &mut results);
        let recovery = median(|r| r.recovery, &mut results);
        let bytes = results[results.len() / 2].restored_bytes;
        println!(
            "{keys:>10} {:>10.1}ms {:>10.1}ms {:>14.2} {:>12.1} MiB",
            fresh.as_secs_f64() * 1e3,
            recovery.as_secs_f64() * 1e3,
            recovery.as_secs_f64() / fresh.as_secs_f64(),
            bytes as f64 / (1 << 20) as f64
        );
    }
}

/// The longest synchronous part of any task, per checkpoint of a real job: barrier
/// broadcast, every operator's snapshot and the file sink's pre-commit included.
fn job_stall() {
    let records = 1_500_000u64;
    let dir = test_dir("bench-job-stall");
    let text = job(true, records).replace("interval_ms = 1000", "interval_ms = 100");
    let report = run_job(&write_job(&dir, &text)).unwrap();
    let mut stalls: Vec<Duration> = report
        .checkpoints
        .completed
        .iter()
        .map(|c| c.max_sync)
        .collect();
    stalls.sort();
    let at = |q: f64| stalls[((stalls.len() - 1) as f64 * q) as usize];
    println!(
        "longest synchronous part per checkpoint in the word count with its file sink \
         ({} checkpoints every 100 ms)",
        stalls.len()
    );
    println!(
        "  median {:>9.1?}   p90 {:>9.1?}   max {:>9.1?}",
        at(0.5),
        at(0.9),
        at(1.0)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn main() {
    throughput();
    stall();
    job_stall();
    recovery();
}
