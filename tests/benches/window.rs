//! A keyed tumbling event-time window (1000 keys, 10 s windows, sum) as the `window`
//! plugin and as the same logic in native Rust, through the same chain code: events/s
//! and the ratio Wasm / native. Each batch is followed by its watermark, as a source
//! sends it.
//!
//! `cargo bench -p sluice-tests --bench window`

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use sluice::chain::{
    ChainOutput, ChainedOperator, OpenInfo, Operator, OperatorChain, OperatorIdentity,
    OperatorState,
};
use sluice::connectors::generated_event;
use sluice::state::KeyedStateBackend;
use sluice::wasm::SandboxLimits;
use sluice_codec::BatchWriter;
use sluice_tests::bench::{paired, rate, runs};
use sluice_tests::engine;
use sluice_tests::native::{TumblingSum, discard};
use sluice_tests::plugins::WINDOW;

const EVENTS: u64 = 500_000;
const KEYS: u64 = 1000;
const BATCH: usize = 1024;

fn chain(window: Box<dyn Operator>, keyed: bool) -> OperatorChain {
    let info = OpenInfo {
        operator: "window".into(),
        config: [
            ("kind", "tumbling"),
            ("size-ms", "10000"),
            ("aggregate", "sum"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
        parallelism: 1,
        max_parallelism: 128,
        keyed,
        ..OpenInfo::default()
    };
    let ops = vec![
        ChainedOperator {
            operator: window,
            open_info: info,
            metrics: Arc::default(),
        },
        ChainedOperator {
            operator: Box::new(discard()),
            open_info: OpenInfo::default(),
            metrics: Arc::default(),
        },
    ];
    let mut chain = OperatorChain::new(ops, ChainOutput::None, Arc::default());
    chain.open_all().unwrap();
    chain
}

fn wasm_window() -> Box<dyn Operator> {
    let engine = engine();
    let plugin = engine.load_plugin(Path::new(WINDOW)).unwrap();
    let identity = OperatorIdentity {
        tenant: "bench".into(),
        job: "bench".into(),
        operator: "window".into(),
        subtask: 0,
        parallelism: 1,
    };
    let limits = SandboxLimits {
        call_deadline: None,
        ..SandboxLimits::default()
    };
    let state = OperatorState::new(Some(KeyedStateBackend::new(128, 0..128)));
    Box::new(
        plugin
            .instantiate(identity, limits, state, Arc::new(AtomicBool::new(false)))
            .unwrap(),
    )
}

fn main() {
    // One event per millisecond of event time over 1000 keys: 10,000 events per window.
    let batches: Vec<(Vec<u8>, usize, i64)> = (0..EVENTS)
        .collect::<Vec<_>>()
        .chunks(BATCH)
        .map(|chunk| {
            let mut w = BatchWriter::new();
            let mut max_ts = i64::MIN;
            for &i in chunk {
                let (ts, key, value) = generated_event(1, i, KEYS, 1, 0);
                let key = format!("k{key}");
                let line = format!("{ts},{key},{value}");
                w.push(Some(key.as_bytes()), line.as_bytes(), Some(ts));
                max_ts = max_ts.max(ts);
            }
            (w.into_bytes(), chunk.len(), max_ts - 1)
        })
        .collect();
    let runs = runs(5);
    let run = |mut c: OperatorChain| {
        for (bytes, n, watermark) in &batches {
            c.process(bytes.clone(), *n).unwrap();
            c.advance_watermark(*watermark).unwrap();
        }
        c.advance_watermark(i64::MAX).unwrap();
    };
    let p = paired(
        runs,
        || run(chain(Box::new(TumblingSum::new(10_000)), false)),
        || run(chain(wasm_window(), true)),
    );
    let (n, w) = (
        EVENTS as f64 / p.baseline.as_secs_f64(),
        EVENTS as f64 / p.subject.as_secs_f64(),
    );
    println!(
        "keyed tumbling window, {EVENTS} events, {KEYS} keys, 10 s windows, sum; median of {runs} alternating runs"
    );
    println!("  native        {:>12}", rate(n));
    println!("  wasm plugin   {:>12}", rate(w));
    println!("  wasm / native {:>12.2}", p.speed);
}
