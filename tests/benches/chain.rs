//! The 3-operator chain `tokenize -> filter -> count` as Wasm components and as native
//! Rust operators over the same flat batch layout, driven through the same chain code, at
//! several batch sizes, over 100,000 lines (long enough runs for steady ratios on a
//! shared machine). Two native baselines: `count` with its counts in a `HashMap`
//! (plain native code, not checkpointable) and in the host's keyed state (what a native
//! operator of a checkpointed job does; the Wasm `count` keeps them there too). Prints
//! lines/s and the ratio Wasm / native against each.
//!
//! `cargo bench -p sluice-tests --bench chain`

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use sluice::chain::{
    ChainOutput, ChainedOperator, OpenInfo, Operator, OperatorChain, OperatorIdentity,
    OperatorState,
};
use sluice::state::KeyedStateBackend;
use sluice::wasm::SandboxLimits;
use sluice_codec::BatchWriter;
use sluice_tests::bench::{paired, rate, runs};
use sluice_tests::plugins::{COUNT, FILTER, TOKENIZE};
use sluice_tests::{engine, native, sample_text};

const STOP_WORDS: &[&str] = &["the", "of", "x"];

fn chained(operators: Vec<(Box<dyn Operator>, OpenInfo)>) -> OperatorChain {
    let operators = operators
        .into_iter()
        .map(|(operator, open_info)| ChainedOperator {
            operator,
            open_info,
            metrics: Arc::default(),
        })
        .collect();
    let mut chain = OperatorChain::new(operators, ChainOutput::None, Arc::default());
    chain.open_all().expect("opening the chain");
    chain
}

fn info(name: &str, config: &[(&str, &str)], keyed: bool) -> OpenInfo {
    OpenInfo {
        job: "bench".into(),
        operator: name.into(),
        config: config
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        subtask: 0,
        parallelism: 1,
        max_parallelism: 128,
        keyed,
        restored_state: None,
        attempt: 0,
    }
}

fn wasm(path: &str, name: &str, keyed: bool) -> Box<dyn Operator> {
    let engine = engine();
    let plugin = engine
        .load_plugin(Path::new(path))
        .expect("loading a plugin");
    let state = OperatorState::new(keyed.then(|| KeyedStateBackend::new(128, 0..128)));
    let identity = OperatorIdentity {
        tenant: "bench".into(),
        job: "bench".into(),
        operator: name.into(),
        subtask: 0,
        parallelism: 1,
    };
    let limits = SandboxLimits {
        call_deadline: None,
        ..SandboxLimits::default()
    };
    Box::new(
        plugin
            .instantiate(identity, limits, state, Arc::new(AtomicBool::new(false)))
            .expect("instantiating"),
    )
}

fn wasm_chain() -> OperatorChain {
    let stop = STOP_WORDS.join(",");
    chained(vec![
        (
            wasm(TOKENIZE, "tokenize", false),
            info("tokenize", &[("min-length", "1")], false),
        ),
        (
            wasm(FILTER, "filter", false),
            info("filter", &[("none-of", &stop)], false),
        ),
        (wasm(COUNT, "count", true), info("count", &[], true)),
        (Box::new(native::discard()), info("sink", &[], false)),
    ])
}

fn native_chain(keyed_state: bool) -> OperatorChain {
    let count: Box<dyn Operator> = if keyed_state {
        Box::new(native::keyed_count(128))
    } else {
        Box::new(native::count())
    };
    chained(vec![
        (Box::new(native::tokenize(1)), info("tokenize", &[], false)),
        (
            Box::new(native::filter_none_of(STOP_WORDS)),
            info("filter", &[], false),
        ),
        (count, info("count", &[], false)),
        (Box::new(native::discard()), info("sink", &[], false)),
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
                chain.process(bytes.clone(), *n).expect("processing");
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
