//! Keyed state backends side by side: the same count job on `heap` and on `rocksdb`, one
//! run after the other (`RUNS` pairs, default 1), each a `sluice run` of its own.
//!
//! - `many keys`: `tokenize -> count` over `LINES` generated lines (default 4,000,000) of
//!   3 words out of a vocabulary of a billion: about 3 distinct words a line, 12 M keys
//!   at the default. The heap backend is given `state_mb = 8192` (the default 1024 is too
//!   little for it); `rocksdb` runs with the defaults.
//! - `small vocabulary`: `SMALL_LINES` lines (default 1,000,000) of 8 words out of 1,000.
//!
//! Both with checkpoints every second, file → file. Prints per backend the median wall
//! time, the peak resident memory of the process, the bytes all checkpoints wrote, the
//! last checkpoint's whole state, their ratio, and the median synchronous part; then
//! rocksdb's speed as a fraction of the heap's.
//!
//! `cargo bench -p sluice-tests --bench state`

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sluice_tests::bench::env_or;
use sluice_tests::plugins::{COUNT, TOKENIZE};
use sluice_tests::{scratch_root, test_dir};

/// What one run measured.
struct Measured {
    wall: Duration,
    peak_rss: u64,
    written: u64,
    full: u64,
    sync_ms: f64,
    completed: u64,
}

fn job(lines: u64, words: u64, vocabulary: u64, backend: &str) -> String {
    format!(
        r#"
name = "state-{backend}"
[source]
type = "generator"
records = {lines}
words_per_record = {words}
vocabulary = {vocabulary}
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
[[operator]]
name = "count"
plugin = "{COUNT}"
key_by = "key"
[sink]
type = "file"
path = "out.tsv"
format = "key-value"
[checkpoint]
interval_ms = 1000
[state]
backend = "{backend}"
"#
    )
}

/// The peak resident memory of process `pid` so far (`VmHWM`), bytes.
fn peak_rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib << 10)
}

/// Runs `job` in a fresh folder under `dir` with the host configuration `host`.
fn run(dir: &Path, job: &str, host: &str) -> Measured {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("job.toml"), job).unwrap();
    std::fs::write(dir.join("host.toml"), host).unwrap();
    let start = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice-test-cli"))
        .args(["run", "--quiet", "--json", "--host-config"])
        .arg(dir.join("host.toml"))
        .arg(dir.join("job.toml"))
        .env("SLUICE_CACHE_DIR", scratch_root().join("cache"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || std::io::read_to_string(stdout).unwrap());
    let mut peak = 0;
    while child.try_wait().unwrap().is_none() {
        peak = peak_rss(pid).unwrap_or(peak).max(peak);
        std::thread::sleep(Duration::from_millis(50));
    }
    let wall = start.elapsed();
    let status = child.wait().unwrap();
    let out = reader.join().unwrap();
    assert!(status.success(), "the job failed: {out}");
    let summary: serde_json::Value = serde_json::from_str(&out).unwrap();
    let c = &summary["jobs"][0]["checkpoints"];
    Measured {
        wall,
        peak_rss: peak,
        written: c["written_bytes"].as_u64().unwrap(),
        full: c["last_full_bytes"].as_u64().unwrap(),
        sync_ms: c["sync_ms_median"].as_f64().unwrap(),
        completed: c["completed"].as_u64().unwrap(),
    }
}

fn mib(b: u64) -> f64 {
    b as f64 / (1 << 20) as f64
}

fn main() {
    let runs = env_or("RUNS", 1) as usize;
    let lines = env_or("LINES", 4_000_000);
    let small = env_or("SMALL_LINES", 1_000_000);
    let root = test_dir("bench-state");
    let roomy = "[defaults]\nstate_mb = 8192\ntenant_state_mb = 16384\n";
    let cases = [
        ("many keys", lines, 3, 1_000_000_000),
        ("small vocabulary", small, 8, 1_000),
    ];
    for (name, lines, words, vocabulary) in cases {
        println!("{name}: {lines} lines of {words} words out of {vocabulary}");
        let mut results: Vec<(&str, Vec<Measured>)> =
            vec![("heap", Vec::new()), ("rocksdb", Vec::new())];
        for _ in 0..runs {
            for (backend, measured) in &mut results {
                let backend: &str = backend;
                let host = if backend == "heap" { roomy } else { "" };
                let m = run(
                    &root.join(backend),
                    &job(lines, words, vocabulary, backend),
                    host,
                );
                measured.push(m);
            }
        }
        let mut walls = Vec::new();
        for (backend, measured) in &mut results {
            measured.sort_by_key(|m| m.wall);
            let m = &measured[measured.len() / 2];
            walls.push(m.wall);
            println!(
                "  {backend:<8} {:>7.2} s  peak RSS {:>7.0} MiB  checkpoints {:>3}: wrote \
                 {:>8.1} MiB, last state {:>7.1} MiB ({:.1}×)  sync part {:.1} ms median",
                m.wall.as_secs_f64(),
                mib(m.peak_rss),
                m.completed,
                mib(m.written),
                mib(m.full),
                m.written as f64 / m.full.max(1) as f64,
                m.sync_ms
            );
        }
        println!(
            "  rocksdb / heap speed  {:.2}",
            walls[0].as_secs_f64() / walls[1].as_secs_f64()
        );
    }
}
