//! End-to-end tests and benchmarks of Sluice. The library holds the paths of the plugin
//! components that `build.rs` compiled, and helpers shared by tests and benchmarks.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

use anyhow::Result;
use crossbeam_channel::{Receiver, Sender, unbounded};
use sluice::job::{Job, JobControl, JobMonitor, JobReport, RestorePoint, RunOptions};
use sluice::wasm::{EngineSettings, WasmEngine};

pub mod bench;
pub mod cluster;
pub mod graphs;
pub mod kafka;
pub mod native;
pub mod windows;

pub mod plugins {
    //! Paths of the components built from `plugins/`.
    include!(concat!(env!("OUT_DIR"), "/gen.rs"));
}

/// Where the plugins built for WIT 0.1.0 are kept (`tests/fixtures/wit-0.1.0/`).
pub const COMPAT_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/wit-0.1.0");

/// A language with an SDK besides Rust, whose example operators `scripts/test.sh`
/// builds into components before the tests run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Language {
    /// `plugins-python/NAME.py`, in `SLUICE_PYTHON_PLUGINS`.
    Python,
    /// `plugins-js/NAME.js`, in `SLUICE_JS_PLUGINS`.
    JavaScript,
}

impl Language {
    /// Both.
    pub const ALL: [Language; 2] = [Language::Python, Language::JavaScript];

    fn variable(self) -> &'static str {
        match self {
            Language::Python => "PYTHON",
            Language::JavaScript => "JS",
        }
    }

    /// `python` or `js`.
    pub fn name(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::JavaScript => "js",
        }
    }

    /// The component built from the example operator `name` in this language, or
    /// `None` (after saying how to build them) when `SLUICE_<LANG>_PLUGINS` names no
    /// folder of them. Under `scripts/test.sh` (`SLUICE_<LANG>_REQUIRED=1`) that is a
    /// failure, never a skip.
    pub fn plugin(self, name: &str) -> Option<String> {
        let var = self.variable();
        match std::env::var(format!("SLUICE_{var}_PLUGINS")) {
            Ok(dir) if !dir.is_empty() => {
                let path = Path::new(&dir).join(format!("{name}.wasm"));
                assert!(path.is_file(), "{} was not built", path.display());
                Some(path.display().to_string())
            }
            _ if std::env::var_os(format!("SLUICE_{var}_REQUIRED")).is_some() => {
                panic!("SLUICE_{var}_REQUIRED is set but SLUICE_{var}_PLUGINS names no folder")
            }
            _ => {
                eprintln!(
                    "skipped: no {} plugins. Run the whole suite with scripts/test.sh, or \
                     build them with scripts/build-{}-plugin.sh into a folder and set \
                     SLUICE_{var}_PLUGINS to it",
                    self.name(),
                    self.name()
                );
                None
            }
        }
    }
}

/// The path of plugin `name` as built for WIT 0.1.0.
pub fn compat_plugin(name: &str) -> String {
    format!("{COMPAT_DIR}/{name}.wasm")
}

/// Where the plugins built for WIT 0.2.0 are kept (`tests/fixtures/wit-0.2.0/`).
pub const COMPAT_V2_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/wit-0.2.0");

/// The path of plugin `name` as built for WIT 0.2.0.
pub fn compat_v2_plugin(name: &str) -> String {
    format!("{COMPAT_V2_DIR}/{name}.wasm")
}

/// Scratch space for tests, below the system temp directory.
pub fn scratch_root() -> PathBuf {
    std::env::temp_dir().join("sluice-tests")
}

/// One engine per test process, with a compile cache shared by all test runs.
pub fn engine() -> Arc<WasmEngine> {
    static ENGINE: OnceLock<Arc<WasmEngine>> = OnceLock::new();
    ENGINE
        .get_or_init(|| {
            Arc::new(
                WasmEngine::new(EngineSettings {
                    cache_dir: Some(scratch_root().join("cache")),
                    announce_compiles: false,
                })
                .expect("creating the engine"),
            )
        })
        .clone()
}

/// A fresh, empty directory for one test (left behind for inspection).
pub fn test_dir(name: &str) -> PathBuf {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let dir = scratch_root().join(format!("{name}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("creating a test directory");
    dir
}

/// Writes `toml` as `job.toml` in `dir`.
pub fn write_job(dir: &Path, toml: &str) -> PathBuf {
    let path = dir.join("job.toml");
    std::fs::write(&path, toml).expect("writing the job file");
    path
}

/// Whether the checkpoint folder `dir` holds a complete checkpoint or savepoint (one with
/// its `_metadata` written), so a run can resume with `--from-checkpoint latest`.
pub fn has_complete_checkpoint(dir: &Path) -> bool {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .any(|e| e.path().join("_metadata").exists())
        })
        .unwrap_or(false)
}

/// `sluice run --quiet JOB` with the shared compile cache; `bin` is the test binary's
/// `env!("CARGO_BIN_EXE_sluice-test-cli")` (only tests and benches know it). Resumes from
/// the latest checkpoint when `checkpoints` holds a complete one.
pub fn sluice_run(bin: &str, job: &Path, resume_from: Option<&Path>) -> std::process::Command {
    let mut command = std::process::Command::new(bin);
    command
        .args(["run", "--quiet"])
        .arg(job)
        .env("SLUICE_CACHE_DIR", scratch_root().join("cache"))
        .env_remove("FAILPOINTS");
    if resume_from.is_some_and(has_complete_checkpoint) {
        command.args(["--from-checkpoint", "latest"]);
    }
    command
}

/// A host configuration with tenant `acme` limited as `limits` says (TOML lines), and
/// tenant `quiet` with the defaults, written into `dir`.
pub fn acme_host(dir: &Path, limits: &str) -> sluice::tenant::HostConfig {
    let path = dir.join("host.toml");
    std::fs::write(&path, format!("[tenant.acme]\n{limits}\n[tenant.quiet]\n"))
        .expect("writing the host configuration");
    sluice::tenant::HostConfig::load(&path).expect("loading the host configuration")
}

/// Job `name` of `tenant`: `in.txt -> tokenize -> count (key_by, parallelism) ->
/// counts.tsv` (key-value), without checkpoints.
pub fn file_wordcount(name: &str, tenant: &str, parallelism: u32) -> String {
    format!(
        r#"
name = "{name}"
tenant = "{tenant}"
[source]
type = "file"
path = "in.txt"
[[operator]]
name = "tokenize"
plugin = "{}"
[[operator]]
name = "count"
plugin = "{}"
key_by = "key"
parallelism = {parallelism}
[sink]
type = "file"
path = "counts.tsv"
format = "key-value"
"#,
        plugins::TOKENIZE,
        plugins::COUNT
    )
}

/// A job of 50 generated records whose operator fails in its first two attempts, then
/// finishes (its restart strategy allows three), with checkpoints every 100 ms.
pub fn twice_failing_job() -> String {
    format!(
        r#"
name = "flaky"
[source]
type = "generator"
records = 50
[[operator]]
name = "flaky"
plugin = "{}"
config = {{ behavior = "error-in-process", attempts = "0,1" }}
[sink]
type = "file"
path = "out.txt"
[checkpoint]
interval_ms = 100
[restart]
strategy = "fixed-delay"
attempts = 3
delay_ms = 10
"#,
        plugins::TEST_MISBEHAVE
    )
}

/// A word count over generated lines, throttled so that it runs for a few seconds, with
/// checkpoints every 100 ms (in `checkpoints/`) and its counts in `out/counts.tsv`.
pub fn throttled_wordcount(count_parallelism: u32, records: u64, rate: f64) -> String {
    format!(
        r#"
name = "killable"
[source]
type = "generator"
records = {records}
words_per_record = 6
vocabulary = 300
seed = 5
rate = {rate}
[[operator]]
name = "tokenize"
plugin = "{}"
[[operator]]
name = "count"
plugin = "{}"
parallelism = {count_parallelism}
key_by = "key"
[sink]
type = "file"
path = "out/counts.tsv"
format = "key-value"
[checkpoint]
interval_ms = 100
dir = "checkpoints"
[runtime]
batch_size = 200
"#,
        plugins::TOKENIZE,
        plugins::COUNT
    )
}

/// Event-time sliding windows (1 s, sliding by 250 ms, 100 ms allowed lateness) summing
/// `records` generated events over 5,000 keys (a timer per key and window), at `rate` a
/// second or as fast as it goes, with checkpoints every 100 ms (in `checkpoints/`), its
/// results in `out/counts.tsv` and its keyed state and timers in `backend` with its least
/// memory (so with `rocksdb` most timers are in its database).
pub fn killable_windows(
    parallelism: u32,
    records: u64,
    rate: Option<f64>,
    backend: &str,
) -> String {
    let rate = rate.map_or(String::new(), |r| format!("rate = {r:.1}\n"));
    format!(
        r#"
name = "windowed"
[source]
type = "generator"
shape = "events"
records = {records}
keys = 5000
step_ms = 1
jitter_ms = 1000
{rate}timestamp = {{ field = 0 }}
out_of_orderness_ms = 250
[[operator]]
name = "window"
plugin = "{}"
parallelism = {parallelism}
key_by = {{ field = 1 }}
config = {{ kind = "sliding", size-ms = 1000, slide-ms = 250, aggregate = "sum", allowed-lateness-ms = 100 }}
[sink]
type = "file"
path = "out/counts.tsv"
format = "key-value"
[checkpoint]
interval_ms = 100
dir = "checkpoints"
[runtime]
batch_size = 10
[state]
backend = "{backend}"
memory_mb = 8
"#,
        plugins::WINDOW
    )
}

/// A running or finished job driven from a test.
pub struct TestJob {
    /// The loaded job.
    pub job: Job,
    /// Sends control requests.
    pub control: Sender<JobControl>,
    control_rx: Receiver<JobControl>,
    /// Live metrics.
    pub monitor: Arc<JobMonitor>,
}

impl TestJob {
    /// Loads the job file at `path` with the shared engine.
    pub fn load(path: &Path) -> Result<TestJob> {
        Self::load_with(path, &sluice::tenant::HostConfig::default())
    }

    /// Loads the job file at `path` under the host configuration `host`.
    pub fn load_with(path: &Path, host: &sluice::tenant::HostConfig) -> Result<TestJob> {
        let (control, control_rx) = unbounded();
        Ok(TestJob {
            job: Job::load_with(path, &engine(), host)?,
            control,
            control_rx,
            monitor: Arc::new(JobMonitor::default()),
        })
    }

    /// Runs it to its end.
    pub fn run(&self, restore: RestorePoint) -> Result<JobReport> {
        self.job.run(restore, &self.control_rx, &self.monitor)
    }

    /// Runs it to its end with `options`.
    pub fn run_with(&self, options: RunOptions) -> Result<JobReport> {
        self.job.run(options, &self.control_rx, &self.monitor)
    }
}

/// Loads and runs the job at `path` from scratch.
pub fn run_job(path: &Path) -> Result<JobReport> {
    TestJob::load(path)?.run(RestorePoint::Fresh)
}

/// Deterministic text with mixed case, punctuation, digits and non-ASCII letters: the
/// input of word-count tests. `lines` lines from `seed`.
pub fn sample_text(seed: u64, lines: usize) -> String {
    const WORDS: &[&str] = &[
        "Stream",
        "stream",
        "WASM",
        "operator",
        "barrier",
        "checkpoint",
        "état",
        "Größe",
        "naïve",
        "日本語",
        "x",
        "of",
        "the",
        "The",
        "key",
        "group",
        "watermark",
        "2024",
        "a1b2",
        "timer",
        "TIMER",
        "sink",
        "source",
        "über",
        "Ñandú",
        "mailbox",
        "flink",
        "rust",
    ];
    const SEPARATORS: &[&str] = &[" ", "  ", ", ", ". ", "! ", " - ", "\t", "; ", "...", "'"];
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = move |n: usize| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 33) as usize) % n
    };
    let mut text = String::new();
    for _ in 0..lines {
        let words = next(12);
        for w in 0..words {
            if w > 0 {
                text.push_str(SEPARATORS[next(SEPARATORS.len())]);
            }
            text.push_str(WORDS[next(WORDS.len())]);
        }
        text.push('\n');
    }
    text
}

/// Word counts of `text` by the rules of the `tokenize` plugin, computed here
/// independently: lowercase, split on every character that is not alphanumeric, drop
/// words shorter than `min_length` characters.
pub fn expected_word_counts(text: &str, min_length: usize) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for line in text.lines() {
        for word in line.split(|c: char| !c.is_alphanumeric()) {
            if !word.is_empty() && word.chars().count() >= min_length {
                *counts.entry(word.to_lowercase()).or_insert(0) += 1;
            }
        }
    }
    counts
}

/// Reads a `word<TAB>count` file of running counts and checks that every word's counts
/// are exactly 1, 2, …, n in order — no count lost, none repeated — then returns the final
/// count per word.
pub fn final_counts(output: &str) -> Result<BTreeMap<String, u64>> {
    let mut counts: BTreeMap<String, u64> = BTreeMap::new();
    for (i, line) in output.lines().enumerate() {
        let (word, count) = line
            .split_once('\t')
            .ok_or_else(|| anyhow::anyhow!("line {}: no tab in {line:?}", i + 1))?;
        let count: u64 = count.parse()?;
        let last = counts.entry(word.to_string()).or_insert(0);
        anyhow::ensure!(
            count == *last + 1,
            "line {}: word {word:?} counted {count} after {last}",
            i + 1
        );
        *last = count;
    }
    Ok(counts)
}

/// Like [`final_counts`] for output whose lines of one word may come in any order (from
/// several sink subtasks): every word's counts must still be exactly 1, 2, …, n.
pub fn final_counts_any_order(output: &str) -> Result<BTreeMap<String, u64>> {
    let mut lines: Vec<(String, u64)> = output
        .lines()
        .map(|line| {
            let (word, count) = line
                .split_once('\t')
                .ok_or_else(|| anyhow::anyhow!("no tab in {line:?}"))?;
            Ok((word.to_string(), count.parse()?))
        })
        .collect::<Result<_>>()?;
    lines.sort();
    let sorted: String = lines.iter().map(|(w, c)| format!("{w}\t{c}\n")).collect();
    final_counts(&sorted)
}

/// All output files of a file sink: `path` itself, or `stem-N.ext` per subtask.
pub fn read_sink_output(path: &Path, parallelism: u32) -> String {
    if parallelism <= 1 {
        return std::fs::read_to_string(path).unwrap_or_default();
    }
    let stem = path.file_stem().unwrap().to_string_lossy();
    let ext = path
        .extension()
        .map(|e| format!(".{}", e.to_string_lossy()))
        .unwrap_or_default();
    (0..parallelism)
        .map(|i| {
            std::fs::read_to_string(path.with_file_name(format!("{stem}-{i}{ext}")))
                .unwrap_or_default()
        })
        .collect()
}
