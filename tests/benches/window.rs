//! A keyed tumbling event-time window (1000 keys, 10 s windows, sum) as the `window`
//! plugin and as the same logic in native Rust, through the same chain code: events/s
//! and the ratio Wasm / native. Each batch is followed by its watermark, as a source
//! sends it.
//!
//! `cargo bench -p sluice-tests --bench window`

use sluice::chain::{Operator, OperatorChain};
use sluice::connectors::generated_event;
use sluice_codec::BatchWriter;
use sluice_tests::bench::{
    keyed_state, open_info, opened_chain, paired, rate, runs, wasm_operator,
};
use sluice_tests::native::{TumblingSum, discard};
use sluice_tests::plugins::WINDOW;

const EVENTS: u64 = 500_000;
const KEYS: u64 = 1000;
const BATCH: usize = 1024;

fn chain(window: Box<dyn Operator>, keyed: bool) -> OperatorChain {
    let config = [
        ("kind", "tumbling"),
        ("size-ms", "10000"),
        ("aggregate", "sum"),
    ];
    opened_chain(vec![
        (window, open_info("window", &config, keyed)),
        (Box::new(discard()), open_info("sink", &[], false)),
    ])
}

fn wasm_window() -> Box<dyn Operator> {
    wasm_operator(WINDOW, "window", keyed_state())
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
            c.process(0, bytes.clone(), *n, Vec::new()).unwrap();
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
