//! The 3-operator chain `tokenize -> filter -> count` as Wasm components and as native
//! Rust operators over the same flat batch layout, driven through the same chain code, at
//! several batch sizes, over 100,000 lines (long enough runs for steady ratios on a
//! shared machine). Two native baselines: `count` with its counts in a `HashMap`
//! (plain native code, not checkpointable) and in the host's keyed state (what a native
//! operator of a checkpointed job does; the Wasm `count` keeps them there too). Prints
//! lines/s and the ratio Wasm / native against each. `SLUICE_BENCH_BATCH=N` runs one
//! batch size only.
//!
//! `cargo bench -p sluice-tests --bench chain`

use sluice::chain::{Operator, OperatorChain, OperatorState};
use sluice_codec::BatchWriter;
use sluice_tests::bench::{
    keyed_state, measures_batch, open_info, opened_chain, paired, rate, runs, wasm_operator,
};
use sluice_tests::plugins::{COUNT, FILTER, TOKENIZE};
use sluice_tests::{native, sample_text};

const STOP_WORDS: &[&str] = &["the", "of", "x"];

fn wasm_chain() -> OperatorChain {
    let stop = STOP_WORDS.join(",");
    opened_chain(vec![
        (
            wasm_operator(TOKENIZE, "tokenize", OperatorState::new(None)),
            open_info("tokenize", &[("min-length", "1")], false),
        ),
        (
            wasm_operator(FILTER, "filter", OperatorState::new(None)),
            open_info("filter", &[("none-of", &stop)], false),
        ),
        (
            wasm_operator(COUNT, "count", keyed_state()),
            open_info("count", &[], true),
        ),
        (Box::new(native::discard()), open_info("sink", &[], false)),
    ])
}

fn native_chain(host_state: bool) -> OperatorChain {
    let count: Box<dyn Operator> = if host_state {
        Box::new(native::keyed_count(128))
    } else {
        Box::new(native::count())
    };
    opened_chain(vec![
        (
            Box::new(native::tokenize(1)),
            open_info("tokenize", &[], false),
        ),
        (
            Box::new(native::filter_none_of(STOP_WORDS)),
            open_info("filter", &[], false),
        ),
        (count, open_info("count", &[], false)),
        (Box::new(native::discard()), open_info("sink", &[], false)),
    ])
}

fn main() {
    let text = sample_text(1, 100_000);
    let lines: Vec<&str> = text.lines().collect();
    let words: usize = lines
        .iter()
        .map(|l| {
            l.split(|c: char| !c.is_alphanumeric())
                .filter(|w| !w.is_empty())
                .count()
        })
        .sum();
    let runs = runs(7);
    println!(
        "3-operator chain tokenize -> filter -> count: {} lines ({words} words), median of {runs} alternating runs",
        lines.len()
    );
    println!(
        "{:>6} {:>14} {:>14} {:>14} {:>8} {:>8}",
        "batch", "native", "native+state", "wasm", "vs nat.", "vs n+s"
    );
    for batch_size in [1usize, 64, 1024] {
        if !measures_batch(batch_size) {
            continue;
        }
        let batches: Vec<(Vec<u8>, usize)> = lines
            .chunks(batch_size)
            .map(|chunk| {
                let mut w = BatchWriter::new();
                for l in chunk {
                    w.push(None, l.as_bytes(), None);
                }
                (w.into_bytes(), chunk.len())
            })
            .collect();
        let run = |chain: &mut OperatorChain| {
            for (bytes, n) in &batches {
                chain
                    .process(0, bytes.clone(), *n, Vec::new())
                    .expect("processing");
            }
        };
        let (mut native, mut keyed, mut wasm) =
            (native_chain(false), native_chain(true), wasm_chain());
        let p = paired(runs, || run(&mut native), || run(&mut wasm));
        let k = paired(runs, || run(&mut keyed), || run(&mut wasm));
        let n = lines.len() as f64;
        println!(
            "{batch_size:>6} {:>14} {:>14} {:>14} {:>8.2} {:>8.2}",
            rate(n / p.baseline.as_secs_f64()),
            rate(n / k.baseline.as_secs_f64()),
            rate(n / p.subject.as_secs_f64()),
            p.speed,
            k.speed
        );
    }
}
