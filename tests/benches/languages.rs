//! The same operators written in Rust, Python and JavaScript, per record through the
//! same chain code, as ratios to Rust in one run: `count` (keyed state, one value per
//! key, a running count emitted per record) with each SDK's per-record API and, for
//! Python, its batch API (`count_batch`); and `filter` on values, per record and (Python)
//! per batch (`filter_batch`). The Python and JavaScript plugins are built first with
//! `scripts/build-{python,js}-plugin.sh` unless `SLUICE_PYTHON_PLUGINS` and
//! `SLUICE_JS_PLUGINS` name folders of them. `SLUICE_PYTHON_BASELINE` may name a folder
//! of Python plugins built otherwise (an earlier SDK) to measure in the same run;
//! `SLUICE_BENCH_ONLY` a label (`python batch`) to time only that and Rust.
//!
//! Then each `count` as its marginal cost in a whole job: `generator → tokenize → count →
//! file` minus the same job without `count`, per word, same input, same run (more lines
//! for Rust, whose cost per word is too small to see against a short job's).
//!
//! `cargo bench -p sluice-tests --bench languages`

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use sluice::chain::{Operator, OperatorChain, OperatorState};
use sluice_codec::BatchWriter;
use sluice_tests::bench::{keyed_state, open_info, opened_chain, runs, wasm_operator};
use sluice_tests::native::discard;
use sluice_tests::plugins::TOKENIZE;
use sluice_tests::plugins::{COUNT, FILTER};
use sluice_tests::{run_job, test_dir, write_job};

const RECORDS: usize = 100_000;
const KEYS: usize = 1000;
const BATCH: usize = 1024;

/// Plugin `name` of `language` (`python` or `js`), built if need be.
fn guest(language: &str, variable: &str, name: &str, extension: &str) -> String {
    if let Ok(dir) = std::env::var(variable) {
        return Path::new(&dir)
            .join(format!("{name}.wasm"))
            .display()
            .to_string();
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = root.join(format!("target/{language}-plugins/{name}.wasm"));
    let status = Command::new(root.join(format!("scripts/build-{language}-plugin.sh")))
        .arg(root.join(format!("plugins-{language}/{name}.{extension}")))
        .arg(&out)
        .status()
        .expect("running the build script");
    assert!(status.success(), "building the {language} {name} failed");
    out.display().to_string()
}

fn chain(
    operator: Box<dyn Operator>,
    name: &str,
    config: &[(&str, &str)],
    keyed: bool,
) -> OperatorChain {
    opened_chain(vec![
        (operator, open_info(name, config, keyed)),
        (Box::new(discard()), open_info("sink", &[], false)),
    ])
}

/// `RECORDS` records in batches of `BATCH`: keys over `KEYS`, values `record-N`.
fn batches() -> Vec<(Vec<u8>, usize)> {
    (0..RECORDS)
        .collect::<Vec<_>>()
        .chunks(BATCH)
        .map(|chunk| {
            let mut w = BatchWriter::new();
            for &i in chunk {
                let key = format!("word{}", (i * 7919) % KEYS);
                w.push(Some(key.as_bytes()), format!("record-{i}").as_bytes(), None);
            }
            (w.into_bytes(), chunk.len())
        })
        .collect()
}

/// One operator to time: what it is called, its plugin, its config.
struct Case {
    label: String,
    path: String,
    config: Vec<(&'static str, &'static str)>,
}

fn case(label: &str, path: String, config: &[(&'static str, &'static str)]) -> Case {
    Case {
        label: label.into(),
        path,
        config: config.to_vec(),
    }
}

/// Words per generated line (the generator's default).
const WORDS_PER_LINE: u64 = 8;

/// `generator (lines) → tokenize → [count] → file`, at parallelism 1.
fn word_job(lines: u64, count: Option<&str>) -> String {
    let count = count.map_or(String::new(), |plugin| {
        format!("[[operator]]\nname = \"count\"\nplugin = \"{plugin}\"\nkey_by = \"key\"\n")
    });
    format!(
        r#"
name = "languages"
[source]
type = "generator"
records = {lines}
shape = "words"
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
{count}
[sink]
type = "file"
path = "out.txt"
"#
    )
}

/// Median time of the job, started over each time.
fn job_time(runs: usize, toml: &str) -> Duration {
    let dir = test_dir("languages-job");
    let job = write_job(&dir, toml);
    let mut times: Vec<Duration> = (0..=runs)
        .map(|_| {
            let _ = std::fs::remove_file(dir.join("out.txt"));
            let start = Instant::now();
            run_job(&job).expect("the job runs");
            start.elapsed()
        })
        .skip(1) // the first compiles the plugins (cached after)
        .collect();
    times.sort();
    times[times.len() / 2]
}

/// Each count's marginal cost per word in a whole job.
fn whole_jobs(runs: usize, counts: &[(&str, String, u64)]) {
    println!(
        "count in a whole job (generator → tokenize → count → file, minus the job without count), median of {runs}"
    );
    let mut rust = None;
    for (label, path, lines) in counts {
        let without = job_time(runs, &word_job(*lines, None));
        let with = job_time(runs, &word_job(*lines, Some(path)));
        let per =
            with.saturating_sub(without).as_secs_f64() * 1e9 / (lines * WORDS_PER_LINE) as f64;
        let rust = *rust.get_or_insert(per);
        println!(
            "  {label:<18} {per:>9.0} ns/word   / rust {:.0}   ({lines} lines: {:.2} s with, {:.2} s without)",
            per / rust,
            with.as_secs_f64(),
            without.as_secs_f64()
        );
    }
}

fn main() {
    let batches = batches();
    let python = |name: &str| guest("python", "SLUICE_PYTHON_PLUGINS", name, "py");
    let js = |name: &str| guest("js", "SLUICE_JS_PLUGINS", name, "js");
    let baseline = std::env::var("SLUICE_PYTHON_BASELINE").ok();
    let mut counts = vec![
        case("rust", COUNT.into(), &[]),
        case("python", python("count"), &[]),
        case("python batch", python("count_batch"), &[]),
        case("javascript", js("count"), &[]),
    ];
    let contains = [("contains", "7")];
    let mut filters = vec![
        case("rust", FILTER.into(), &contains),
        case("python", python("filter"), &contains),
        case("python batch", python("filter_batch"), &contains),
    ];
    if let Some(dir) = &baseline {
        let at = |name: &str| {
            Path::new(dir)
                .join(format!("{name}.wasm"))
                .display()
                .to_string()
        };
        counts.insert(2, case("python (baseline)", at("count"), &[]));
        filters.insert(2, case("python (baseline)", at("filter"), &contains));
    }
    // `SLUICE_BENCH_ONLY=NAME`: only the cases so labelled, and Rust (to profile one).
    if let Ok(only) = std::env::var("SLUICE_BENCH_ONLY") {
        counts.retain(|c| c.label == "rust" || c.label == only);
        filters.retain(|c| c.label == "rust" || c.label == only);
    }
    let runs = runs(3);
    if std::env::var_os("SLUICE_BENCH_SKIP_CALLS").is_none() {
        per_call(&batches, runs, &counts, &filters);
    }
    let jobs: Vec<(&str, String, u64)> = counts
        .iter()
        .filter(|c| !c.label.contains("baseline"))
        .map(|c| {
            let lines = match c.label.as_str() {
                "rust" => 1_000_000,
                "javascript" => 5_000,
                _ => 25_000,
            };
            (c.label.as_str(), c.path.clone(), lines)
        })
        .collect();
    whole_jobs(runs, &jobs);
}

/// Each case's cost per record through the same chain code.
fn per_call(batches: &[(Vec<u8>, usize)], runs: usize, counts: &[Case], filters: &[Case]) {
    // Only processing is timed: loading and instantiating a component (tens of
    // milliseconds for an interpreter's) is not a cost per record.
    let time = |c: &Case, name: &str, keyed: bool| -> Duration {
        let mut times: Vec<Duration> = (0..runs)
            .map(|_| {
                let state = if keyed {
                    keyed_state()
                } else {
                    OperatorState::new(None)
                };
                let mut chain = chain(wasm_operator(&c.path, name, state), name, &c.config, keyed);
                let start = Instant::now();
                for (bytes, n) in batches {
                    chain.process(0, bytes.clone(), *n, Vec::new()).unwrap();
                }
                start.elapsed()
            })
            .collect();
        times.sort();
        times[times.len() / 2]
    };
    let per = |d: Duration| d.as_secs_f64() * 1e9 / RECORDS as f64;
    for (operator, cases, keyed) in [("count", counts, true), ("filter", filters, false)] {
        // Instantiating (and a first compile, cached after) is part of none: warm up.
        for c in cases {
            time(c, operator, keyed);
        }
        println!(
            "{operator}, {RECORDS} records{}, batch {BATCH}, median of {runs}",
            if keyed {
                format!(" over {KEYS} keys")
            } else {
                String::new()
            }
        );
        let rust = per(time(&cases[0], operator, keyed));
        for c in cases {
            let t = if c.label == "rust" {
                rust
            } else {
                per(time(c, operator, keyed))
            };
            println!(
                "  {:<18} {t:>9.0} ns/record   / rust {:.1}",
                c.label,
                t / rust
            );
        }
    }
}
