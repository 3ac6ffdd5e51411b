//! The per-record cost of crossing into one Wasm operator: a pass-through operator
//! (`test-misbehave` with `behavior = "none"`, which emits every record unchanged through
//! the SDK) against the same pass-through in native Rust over the same flat batches
//! (`BatchReader` in, `BatchWriter` out), both called through the same chain code, at
//! batch sizes from 1 to 4096 records of 32-byte values.
//!
//! `cargo bench -p sluice-tests --bench crossing`

use sluice::chain::{Operator, OperatorChain, OperatorState};
use sluice_codec::{BatchWriter, RecordRef};
use sluice_tests::bench::{measures_batch, open_info, opened_chain, paired, runs, wasm_operator};
use sluice_tests::native::{Native, discard};
use sluice_tests::plugins::TEST_MISBEHAVE;

const RECORDS: usize = 1 << 21;

fn chain(op: Box<dyn Operator>) -> OperatorChain {
    opened_chain(vec![
        (op, open_info("pass", &[("behavior", "none")], false)),
        (Box::new(discard()), open_info("sink", &[], false)),
    ])
}

fn wasm() -> Box<dyn Operator> {
    wasm_operator(TEST_MISBEHAVE, "pass", OperatorState::new(None))
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
        if !measures_batch(batch) {
            continue;
        }
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
                c.process(0, bytes.clone(), batch, Vec::new()).unwrap();
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
