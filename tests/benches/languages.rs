//! The same operator written in Rust and in Python: per-record cost of `count` (keyed
//! state, one value per key, a running count emitted per record) through the same chain
//! code, as a ratio Python / Rust in one run. The Python plugin is built first with
//! `scripts/build-python-plugin.sh` unless `SLUICE_PYTHON_PLUGINS` names a folder of them.
//!
//! `cargo bench -p sluice-tests --bench languages`

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use sluice::chain::{Operator, OperatorChain};
use sluice_codec::BatchWriter;
use sluice_tests::bench::{keyed_state, median_time, open_info, opened_chain, runs, wasm_operator};
use sluice_tests::native::discard;
use sluice_tests::plugins::COUNT;

const RECORDS: usize = 100_000;
const KEYS: usize = 1000;
const BATCH: usize = 1024;

fn python_count() -> String {
    if let Ok(dir) = std::env::var("SLUICE_PYTHON_PLUGINS") {
        return Path::new(&dir).join("count.wasm").display().to_string();
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = root.join("target/python-plugins/count.wasm");
    let status = Command::new(root.join("scripts/build-python-plugin.sh"))
        .arg(root.join("plugins-python/count.py"))
        .arg(&out)
        .status()
        .expect("running scripts/build-python-plugin.sh");
    assert!(status.success(), "building the Python count failed");
    out.display().to_string()
}

fn chain(count: Box<dyn Operator>) -> OperatorChain {
    opened_chain(vec![
        (count, open_info("count", &[], true)),
        (Box::new(discard()), open_info("sink", &[], false)),
    ])
}

fn main() {
    let batches: Vec<(Vec<u8>, usize)> = (0..RECORDS)
        .collect::<Vec<_>>()
        .chunks(BATCH)
        .map(|chunk| {
            let mut w = BatchWriter::new();
            for &i in chunk {
                let key = format!("word{}", (i * 7919) % KEYS);
                w.push(Some(key.as_bytes()), b"", None);
            }
            (w.into_bytes(), chunk.len())
        })
        .collect();
    let python = python_count();
    let runs = runs(3);
    let time = |path: &str| -> Duration {
        median_time(runs, || {
            let mut c = chain(wasm_operator(path, "count", keyed_state()));
            for (bytes, n) in &batches {
                c.process(0, bytes.clone(), *n, Vec::new()).unwrap();
            }
        })
    };
    // Instantiating (and a first compile, cached after) is part of neither: warm up.
    time(COUNT);
    time(&python);
    let rust = time(COUNT);
    let py = time(&python);
    let per = |d: Duration| d.as_secs_f64() * 1e9 / RECORDS as f64;
    println!("count, {RECORDS} records over {KEYS} keys, batch {BATCH}, median of {runs}");
    println!("  rust     {:>9.0} ns/record", per(rust));
    println!(
        "  python   {:>9.0} ns/record   python / rust {:.1}",
        per(py),
        per(py) / per(rust)
    );
}
