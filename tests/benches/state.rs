//! Keyed state backends side by side: the same count job on `heap` and on `rocksdb`, one
//! run after the other (`RUNS` pairs, default 1), each a `sluice run` of its own.
//!
//! - `many keys`: `tokenize -> count` over `LINES` generated lines (default 4,000,000) of
//!   3 words out of a vocabulary of a billion: about 3 distinct words a line, 12 M keys
//!   at the default. The heap backend is given `state_mb = 8192` (the default 1024 is too
//!   little for it); `rocksdb` runs with the defaults.
//! - `small vocabulary`: `SMALL_LINES` lines (default 1,000,000) of 8 words out of 1,000.
//! - `many timers`: `window` summing `WINDOW_EVENTS` generated events (default 2,000,000)
//!   over as many keys in tumbling windows of 1,000 s: a timer per key and window, about
//!   1.3 M at a time at the default, all due together when a window ends. The heap backend
//!   is given `state_mb = 8192`.
//!
//! Both with checkpoints every second, file → file. Prints per backend the median wall
//! time, the peak resident memory of the process, the bytes all checkpoints wrote, the
//! last checkpoint's whole state, their ratio, and the median synchronous part; then
//! rocksdb's speed as a fraction of the heap's. Each run's time and ratio go to stderr
//! as it ends. `BACKENDS=rocksdb` (or `heap`) runs one backend only, `CASES=many timers`
//! (names, comma-separated) some cases only.
//!
//! With `RECOVERY_LINES` (e.g. 33,000,000: about 100 M keys), instead, the recovery of a
//! `rocksdb` run of the many-keys job over that many lines: SIGKILLed after
//! `KILL_AFTER_S` seconds (default 60), then resumed from its latest checkpoint; prints
//! the state it restored and the time from the new process's start to the count
//! operator's first record (read from its metrics), and that run's own figures.
//!
//! `cargo bench -p sluice-tests --bench state`
//! `RECOVERY_LINES=33000000 cargo bench -p sluice-tests --bench state`

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sluice_tests::bench::env_or;
use sluice_tests::plugins::{COUNT, TOKENIZE, WINDOW};
use sluice_tests::{scratch_root, test_dir};

/// `window` summing `events` generated events over as many keys in tumbling windows of
/// 1,000 s, its keyed state and timers in `backend`.
fn windows_job(events: u64, backend: &str) -> String {
    format!(
        r#"
name = "timers-{backend}"
[source]
type = "generator"
shape = "events"
records = {events}
keys = {events}
step_ms = 1
jitter_ms = 1000
timestamp = {{ field = 0 }}
out_of_orderness_ms = 2000
[[operator]]
name = "window"
plugin = "{WINDOW}"
key_by = {{ field = 1 }}
config = {{ kind = "tumbling", size-ms = 1000000, aggregate = "sum" }}
[sink]
type = "file"
path = "out.tsv"
format = "key-value"
[checkpoint]
interval_ms = 1000
dir = "checkpoints"
[state]
backend = "{backend}"
"#
    )
}

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
    finish(Instant::now(), start(dir, &[], Stdio::null()))
}

/// Starts `sluice run` on the job and host files in `dir`, with `more` arguments.
fn start(dir: &Path, more: &[&str], stderr: Stdio) -> Child {
    Command::new(env!("CARGO_BIN_EXE_sluice-test-cli"))
        .args(["run", "--quiet", "--json", "--host-config"])
        .arg(dir.join("host.toml"))
        .arg(dir.join("job.toml"))
        .args(more)
        .env("SLUICE_CACHE_DIR", scratch_root().join("cache"))
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap()
}

/// Waits for `child` (started at `start`) to end, and reads its summary.
fn finish(start: Instant, mut child: Child) -> Measured {
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

/// The count operator's records in, from the metrics at `address`.
fn count_records_in(address: &str) -> Option<u64> {
    let mut stream = std::net::TcpStream::connect(address).ok()?;
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    let line = text.lines().find(|l| {
        l.starts_with("sluice_operator_records_in_total{") && l.contains("operator=\"count\"")
    })?;
    // Prometheus' text format: a float.
    let n: f64 = line.rsplit(' ').next()?.parse().ok()?;
    Some(n as u64)
}

/// Starts the job in `dir` again from its latest checkpoint; returns the process and the
/// time from its start to the count operator's first record.
fn resume(dir: &Path) -> (Child, Duration) {
    let started = Instant::now();
    let mut again = start(
        dir,
        &["--from-checkpoint", "latest", "--metrics", "127.0.0.1:0"],
        Stdio::piped(),
    );
    let mut stderr = BufReader::new(again.stderr.take().unwrap());
    let mut line = String::new();
    let address = loop {
        line.clear();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "no metrics address"
        );
        if let Some(a) = line.trim().strip_prefix("sluice: metrics at http://") {
            break a.trim_end_matches("/metrics").to_string();
        }
    };
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    let first_record = loop {
        if count_records_in(&address).is_some_and(|n| n > 0) {
            break started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "no record counted in 10 minutes (metrics at {address})"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    (again, first_record)
}

/// Runs the many-keys job over `lines` on `rocksdb`, SIGKILLs it after `kill_after`,
/// and measures its recovery from the latest checkpoint: at another parallelism (its
/// entries read) and at the same (its files reopened), which then runs to the end.
fn recovery(root: &Path, lines: u64, kill_after: Duration) {
    let dir = root.join("recovery");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let text = job(lines, 3, 1_000_000_000, "rocksdb");
    std::fs::write(dir.join("job.toml"), &text).unwrap();
    std::fs::write(dir.join("host.toml"), "").unwrap();
    let mut first = start(&dir, &[], Stdio::null());
    let began = Instant::now();
    let mut peak = 0;
    while began.elapsed() < kill_after && first.try_wait().unwrap().is_none() {
        peak = peak_rss(first.id()).unwrap_or(peak).max(peak);
        std::thread::sleep(Duration::from_millis(50));
    }
    first.kill().unwrap();
    first.wait().unwrap();
    let restored: u64 = std::fs::read_dir(dir.join("checkpoints/state-rocksdb/shared"))
        .map(|d| d.flatten().map(|e| e.metadata().unwrap().len()).sum())
        .unwrap_or(0);
    println!(
        "  killed after {:.0} s (peak RSS {:.0} MiB), {:.0} MiB of table files checkpointed",
        kill_after.as_secs_f64(),
        mib(peak),
        mib(restored)
    );
    // The same checkpoint (copied to a folder of its own) at another parallelism: each
    // instance reads the entries of its key groups.
    let rescaled = root.join("recovery-rescaled");
    let _ = std::fs::remove_dir_all(&rescaled);
    let copied = Command::new("cp")
        .arg("-a")
        .arg(&dir)
        .arg(&rescaled)
        .status();
    assert!(copied.unwrap().success(), "copying {}", dir.display());
    let two = text.replace("key_by = \"key\"", "key_by = \"key\"\nparallelism = 2");
    std::fs::write(rescaled.join("job.toml"), two).unwrap();
    let (mut child, first_record) = resume(&rescaled);
    println!(
        "  resumed at parallelism 2 (entries read): first record counted {:.2} s after the \
         process started",
        first_record.as_secs_f64()
    );
    child.kill().unwrap();
    child.wait().unwrap();
    let started = Instant::now();
    let (again, first_record) = resume(&dir);
    println!(
        "  resumed at parallelism 1 (files reopened): first record counted {:.2} s after \
         the process started",
        first_record.as_secs_f64()
    );
    let m = finish(started, again);
    println!(
        "  the resumed run: {:.1} s, peak RSS {:.0} MiB, checkpoints {}, sync part {:.1} ms \
         median, last state {:.1} MiB",
        m.wall.as_secs_f64(),
        mib(m.peak_rss),
        m.completed,
        m.sync_ms,
        mib(m.full)
    );
}

fn mib(b: u64) -> f64 {
    b as f64 / (1 << 20) as f64
}

fn main() {
    let runs = env_or("RUNS", 1) as usize;
    let lines = env_or("LINES", 4_000_000);
    let small = env_or("SMALL_LINES", 1_000_000);
    let root = test_dir("bench-state");
    let recovery_lines = env_or("RECOVERY_LINES", 0);
    if recovery_lines > 0 {
        println!("recovery: {recovery_lines} lines of 3 words out of 1000000000, rocksdb");
        let kill_after = Duration::from_secs(env_or("KILL_AFTER_S", 60));
        recovery(&root, recovery_lines, kill_after);
        return;
    }
    let roomy = "[defaults]\nstate_mb = 8192\ntenant_state_mb = 16384\n";
    let events = env_or("WINDOW_EVENTS", 2_000_000);
    type Job = Box<dyn Fn(&str) -> String>;
    let cases: [(String, Job); 3] = [
        (
            format!("many keys: {lines} lines of 3 words out of 1000000000"),
            Box::new(move |b| job(lines, 3, 1_000_000_000, b)),
        ),
        (
            format!("small vocabulary: {small} lines of 8 words out of 1000"),
            Box::new(move |b| job(small, 8, 1_000, b)),
        ),
        (
            format!("many timers: {events} events over {events} keys, 1000 s tumbling windows"),
            Box::new(move |b| windows_job(events, b)),
        ),
    ];
    let only_cases = std::env::var("CASES").unwrap_or_default();
    for (name, job) in cases {
        if !only_cases.split(',').any(|c| name.starts_with(c)) {
            continue;
        }
        println!("{name}");
        let only = std::env::var("BACKENDS").unwrap_or_default();
        let mut results: Vec<(&str, Vec<Measured>)> = ["heap", "rocksdb"]
            .into_iter()
            .filter(|b| only.is_empty() || only.split(',').any(|o| o == *b))
            .map(|b| (b, Vec::new()))
            .collect();
        for _ in 0..runs {
            for (backend, measured) in &mut results {
                let backend: &str = backend;
                let host = if backend == "heap" { roomy } else { "" };
                let m = run(&root.join(backend), &job(backend), host);
                eprintln!(
                    "    {backend}: {:.2} s, wrote / state {:.2}×",
                    m.wall.as_secs_f64(),
                    m.written as f64 / m.full.max(1) as f64
                );
                measured.push(m);
            }
        }
        let mut walls = Vec::new();
        for (backend, measured) in &mut results {
            let mut ratios: Vec<f64> = measured
                .iter()
                .map(|m| m.written as f64 / m.full.max(1) as f64)
                .collect();
            ratios.sort_by(f64::total_cmp);
            println!(
                "  {backend:<8} wrote / last state, median of the runs: {:.2}×",
                ratios[ratios.len() / 2]
            );
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
        if let [heap, rocksdb] = walls[..] {
            println!(
                "  rocksdb / heap speed  {:.2}",
                heap.as_secs_f64() / rocksdb.as_secs_f64()
            );
        }
    }
}
