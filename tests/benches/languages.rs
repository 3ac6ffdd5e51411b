//! The same operators written in Rust, Python and JavaScript, per record through the
//! same chain code, as ratios to Rust in one run: `count` (keyed state, one value per
//! key, a running count emitted per record) with each SDK's per-record API and, for
//! Python and JavaScript, their batch APIs (`count_batch`); and `filter` on values, per
//! record and per batch (`filter_batch`). The Python and JavaScript plugins are built first with
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

/// The time of one run of the job at `job`, started over.
fn job_once(dir: &Path, job: &Path) -> Duration {
    let _ = std::fs::remove_file(dir.join("out.txt"));
    let start = Instant::now();
    run_job(job).expect("the job runs");
    start.elapsed()
}

/// Each count's marginal cost per word in a whole job: the job with and without it, run
/// alternately (after one warm-up run of each, which compiles the plugins).
fn whole_jobs(runs: usize, counts: &[(&str, String, u64)]) {
    println!(
        "count in a whole job (generator → tokenize → count → file, minus the job without count), median of {runs} pairs"
    );
    let mut rust = None;
    for (label, path, lines) in counts {
        let (dir_with, dir_without) = (test_dir("languages-with"), test_dir("languages-without"));
        let with_job = write_job(&dir_with, &word_job(*lines, Some(path)));
        let without_job = write_job(&dir_without, &word_job(*lines, None));
        job_once(&dir_with, &with_job);
        job_once(&dir_without, &without_job);
        let pairs: Vec<(f64, f64)> = (0..runs)
            .map(|_| {
                let without = job_once(&dir_without, &without_job).as_secs_f64();
                let with = job_once(&dir_with, &with_job).as_secs_f64();
                (with, without)
            })
            .collect();
        let per = median(
            pairs
                .iter()
                .map(|(with, without)| {
                    (with - without).max(0.0) * 1e9 / (lines * WORDS_PER_LINE) as f64
                })
                .collect(),
        );
        let rust = *rust.get_or_insert(per);
        println!(
            "  {label:<18} {per:>9.0} ns/word   / rust {:.0}   ({lines} lines: {:.2} s with, {:.2} s without)",
            per / rust,
            median(pairs.iter().map(|p| p.0).collect()),
            median(pairs.iter().map(|p| p.1).collect()),
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
        case("javascript batch", js("count_batch"), &[]),
    ];
    let contains = [("contains", "7")];
    let mut filters = vec![
        case("rust", FILTER.into(), &contains),
        case("python", python("filter"), &contains),
        case("python batch", python("filter_batch"), &contains),
        case("javascript", js("filter"), &contains),
        case("javascript batch", js("filter_batch"), &contains),
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
                "javascript batch" => 10_000,
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
    let once = |c: &Case, name: &str, keyed: bool| -> Duration {
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
    };
    let per = |d: Duration| d.as_secs_f64() * 1e9 / RECORDS as f64;
    for (operator, cases, keyed) in [("count", counts, true), ("filter", filters, false)] {
        // Instantiating (and a first compile, cached after) is part of none: warm up.
        for c in cases {
            once(c, operator, keyed);
        }
        // Rounds of every case one after another, so that the machine's changes of
        // speed fall on all of them alike; each case's median, and the median of its
        // ratios to Rust's time in the same round.
        let rounds: Vec<Vec<f64>> = (0..runs)
            .map(|_| {
                cases
                    .iter()
                    .map(|c| per(once(c, operator, keyed)))
                    .collect()
            })
            .collect();
        println!(
            "{operator}, {RECORDS} records{}, batch {BATCH}, median of {runs} rounds",
            if keyed {
                format!(" over {KEYS} keys")
            } else {
                String::new()
            }
        );
        for (i, c) in cases.iter().enumerate() {
            let t = median(rounds.iter().map(|r| r[i]).collect());
            let ratio = median(rounds.iter().map(|r| r[i] / r[0]).collect());
            println!("  {:<18} {t:>9.0} ns/record   / rust {ratio:.1}", c.label);
        }
    }
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}
