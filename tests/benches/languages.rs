//! The same operator written in Rust, Python and JavaScript: per-record cost of `count`
//! (keyed state, one value per key, a running count emitted per record) through the
//! same chain code, as ratios to Rust in one run. The Python and JavaScript plugins are
//! built first with `scripts/build-{python,js}-plugin.sh` unless `SLUICE_PYTHON_PLUGINS`
//! and `SLUICE_JS_PLUGINS` name folders of them.
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

/// The `count` plugin of `language` (`python` or `js`), built if need be.
fn guest_count(language: &str, variable: &str, extension: &str) -> String {
    if let Ok(dir) = std::env::var(variable) {
        return Path::new(&dir).join("count.wasm").display().to_string();
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = root.join(format!("target/{language}-plugins/count.wasm"));
    let status = Command::new(root.join(format!("scripts/build-{language}-plugin.sh")))
        .arg(root.join(format!("plugins-{language}/count.{extension}")))
        .arg(&out)
        .status()
        .expect("running the build script");
    assert!(status.success(), "building the {language} count failed");
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
    let python = guest_count("python", "SLUICE_PYTHON_PLUGINS", "py");
    let js = guest_count("js", "SLUICE_JS_PLUGINS", "js");
    let runs = runs(3);
    let time = |path: &str| -> Duration {
        median_time(runs, || {
            let mut c = chain(wasm_operator(path, "count", keyed_state()));
            for (bytes, n) in &batches {
                c.process(0, bytes.clone(), *n, Vec::new()).unwrap();
            }
        })
    };
    // Instantiating (and a first compile, cached after) is part of none: warm up.
    for path in [COUNT, python.as_str(), js.as_str()] {
        time(path);
    }
    let per = |d: Duration| d.as_secs_f64() * 1e9 / RECORDS as f64;
    let rust = per(time(COUNT));
    println!("count, {RECORDS} records over {KEYS} keys, batch {BATCH}, median of {runs}");
    println!("  rust         {rust:>9.0} ns/record");
    for (name, path) in [("python", &python), ("javascript", &js)] {
        let t = per(time(path));
        println!("  {name:<12} {t:>9.0} ns/record   / rust {:.1}", t / rust);
    }
}
