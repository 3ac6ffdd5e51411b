//! What checkpoints cost, as ratios measured in this run:
//!
//! * throughput of a keyed word-count job with a checkpoint every second against the same
//!   job without checkpoints;
//! * the task thread's stall in the synchronous part of a checkpoint (the operator's
//!   `snapshot` call plus O(1) copies of keyed state and timers) with 10k, 1M and 10M keys
//!   of keyed state — it must not grow with the state (that is what asynchronous means) —
//!   and, for scale, how long the asynchronous part takes to write that state.
//!
//! `cargo bench -p sluice-tests --bench checkpoint` (`SLUICE_BENCH_MAX_KEYS` caps the
//! largest state, default 10M).

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use sluice::chain::{
    ChainOutput, ChainedOperator, OpenInfo, OperatorChain, OperatorIdentity, OperatorState,
};
use sluice::checkpoint::{CheckpointStorage, SnapshotKind};
use sluice::state::{KeyedStateBackend, StateDescriptor, StateKind};
use sluice::wasm::SandboxLimits;
use sluice_codec::BatchWriter;
use sluice_tests::bench::{median_time, rate, runs};
use sluice_tests::plugins::{COUNT, TOKENIZE};
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
    let measure = |checkpoints: bool| {
        let mut completed = 0;
        let time = median_time(runs, || {
            let dir = test_dir("bench-throughput");
            let report = run_job(&write_job(&dir, &job(checkpoints, records))).unwrap();
            completed = report.checkpoints.completed.len();
            let _ = std::fs::remove_dir_all(&dir);
        });
        (records as f64 / time.as_secs_f64(), completed)
    };
    let (without, _) = measure(false);
    let (with, completed) = measure(true);
    println!("word count, {records} lines of 8 words, count x2, median of {runs} runs");
    println!("  no checkpoints          {:>12}", rate(without));
    println!(
        "  checkpoint every 1 s    {:>12}  ({completed} checkpoints per run)",
        rate(with)
    );
    println!("  with / without          {:>12.2}", with / without);
}

fn count_chain(keys: u64) -> OperatorChain {
    let engine = engine();
    let plugin = engine.load_plugin(Path::new(COUNT)).unwrap();
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
    let identity = OperatorIdentity {
        tenant: "bench".into(),
        job: "bench".into(),
        operator: "count".into(),
        subtask: 0,
        parallelism: 1,
    };
    let limits = SandboxLimits {
        call_deadline: None,
        ..SandboxLimits::default()
    };
    let op = plugin
        .instantiate(
            identity,
            limits,
            OperatorState::new(Some(backend)),
            Arc::new(AtomicBool::new(false)),
        )
        .unwrap();
    let open_info = OpenInfo {
        operator: "count".into(),
        parallelism: 1,
        max_parallelism: 128,
        keyed: true,
        ..OpenInfo::default()
    };
    let sink = ChainedOperator {
        operator: Box::new(sluice_tests::native::discard()),
        open_info: OpenInfo::default(),
        metrics: Arc::default(),
    };
    let count = ChainedOperator {
        operator: Box::new(op),
        open_info,
        metrics: Arc::default(),
    };
    let mut chain = OperatorChain::new(vec![count, sink], ChainOutput::None, Arc::default());
    chain.open_all().unwrap();
    chain
}

fn stall() {
    let max_keys: u64 = std::env::var("SLUICE_BENCH_MAX_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000);
    let runs = runs(9);
    println!("synchronous part of a checkpoint of the count operator, median of {runs}");
    println!(
        "{:>12} {:>14} {:>12} {:>16}",
        "keys", "sync stall", "vs 10k", "async write"
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
        let mut stalls = Vec::new();
        let mut last = None;
        for id in 1..=runs as u64 {
            chain.process(batch.clone(), 256).unwrap();
            let start = Instant::now();
            let snapshot = chain.snapshot(id).unwrap();
            stalls.push(start.elapsed());
            last = Some(snapshot);
        }
        stalls.sort();
        let stall = stalls[stalls.len() / 2];
        let id = runs as u64;
        let snapshots = last.unwrap();
        let dir = test_dir("bench-stall");
        let storage = CheckpointStorage::new(&dir).unwrap();
        let write = Instant::now();
        for s in &snapshots {
            storage
                .write_operator_state(&storage.folder(id, SnapshotKind::Checkpoint), s, 0)
                .unwrap();
        }
        let written = write.elapsed();
        let _ = std::fs::remove_dir_all(&dir);
        let base = *base.get_or_insert(stall);
        println!(
            "{keys:>12} {:>12.1}µs {:>12.2} {:>14.2}s   (state built in {:.1}s)",
            stall.as_secs_f64() * 1e6,
            stall.as_secs_f64() / base.as_secs_f64().max(1e-9),
            written.as_secs_f64(),
            filled.as_secs_f64()
        );
        drop(chain);
    }
}

fn main() {
    throughput();
    stall();
}
