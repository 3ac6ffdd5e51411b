//! The per-record cost of crossing into one Wasm operator: a pass-through operator
//! (`test-misbehave` with `behavior = "none"`, which emits every record unchanged through
//! the SDK) against the same pass-through in native Rust over the same flat batches
//! (`BatchReader` in, `BatchWriter` out), both called through the same chain code, at
//! batch sizes from 1 to 4096 records of 32-byte values.
//!
//! `cargo bench -p sluice-tests --bench crossing`

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use sluice::chain::{
    ChainOutput, ChainedOperator, OpenInfo, Operator, OperatorChain, OperatorIdentity,
    OperatorState,
};
use sluice::wasm::SandboxLimits;
use sluice_codec::{BatchWriter, RecordRef};
use sluice_tests::bench::{paired, runs};
use sluice_tests::engine;
use sluice_tests::native::{Native, discard};
use sluice_tests::plugins::TEST_MISBEHAVE;

const RECORDS: usize = 1 << 21;

fn chain(op: Box<dyn Operator>) -> OperatorChain {
    let info = OpenInfo {
        operator: "pass".into(),
        config: vec![("behavior".into(), "none".into())],
        parallelism: 1,
        max_parallelism: 128,
        ..OpenInfo::default()
    };
    let ops = vec![
        ChainedOperator {
            operator: op,
            open_info: info,
            metrics: Arc::default(),
        },
        ChainedOperator {
            operator: Box::new(discard()),
            open_info: OpenInfo::default(),
            metrics: Arc::default(),
        },
    ];
    let mut c = OperatorChain::new(ops, ChainOutput::None, Arc::default());
    c.open_all().unwrap();
    c
}

fn wasm() -> Box<dyn Operator> {
    let plugin = engine().load_plugin(Path::new(TEST_MISBEHAVE)).unwrap();
    let identity = OperatorIdentity {
        tenant: "bench".into(),
        job: "bench".into(),
        operator: "pass".into(),
        subtask: 0,
        parallelism: 1,
    };
    let limits = SandboxLimits {
        call_deadline: None,
        ..SandboxLimits::default()
    };
    Box::new(
        plugin
            .instantiate(
                identity,
                limits,
                OperatorState::new(None),
                Arc::new(AtomicBool::new(false)),
            )
            .unwrap(),
    )
}

fn native() -> Box<dyn Operator> {
    Box::new(Native::new(
        "pass",
        |r: RecordRef<'_>, out: &mut BatchWriter| out.push_record(r),
    ))
}

fn main() {
    let runs = runs(7);
    println!(
        "crossing into one pass-through operator, {RECORDS} records of 32 bytes, median of {runs} alternating runs"
    );
    println!(
        "{:>6} {:>14} {:>14} {:>12}",
        "batch", "native ns/rec", "wasm ns/rec", "wasm/native"
    );
    for batch in [1usize, 4, 16, 64, 256, 1024, 4096] {
        let batches: Vec<Vec<u8>> = (0..RECORDS / batch)
            .map(|b| {
                let mut w = BatchWriter::new();
                for i in 0..batch {
                    w.push(None, format!("{:>32}", b * batch + i).as_bytes(), None);
                }
                w.into_bytes()
            })
            .collect();
        let run = |c: &mut OperatorChain| {
            for bytes in &batches {
                c.process(bytes.clone(), batch).unwrap();
            }
        };
        let (mut native, mut wasm) = (chain(native()), chain(wasm()));
        let p = paired(runs, || run(&mut native), || run(&mut wasm));
        let per_record = |d: std::time::Duration| d.as_secs_f64() * 1e9 / RECORDS as f64;
        println!(
            "{batch:>6} {:>14.1} {:>14.1} {:>12.2}",
            per_record(p.baseline),
            per_record(p.subject),
            1.0 / p.speed
        );
    }
}
