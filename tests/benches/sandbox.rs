//! What sandboxing and tenants cost, measured in this run:
//!
//! * isolation: tenant B's job alone, and while tenant A keeps eight subtasks busy in Wasm
//!   all the time (each call spins 5 ms, within its deadline, so nothing cuts it), at
//!   equal CPU weights; B's throughput then as a ratio of B alone. Also while A's operator
//!   loops forever (cut at its deadline and restarted with backoff) or eats memory;
//! * host memory attacks: the host's resident memory while a tenant's operator writes
//!   distinct keys, appends to a list or registers timers without end, each cut at the
//!   tenant's limits (64 MiB of keyed state, 1 M timers per instance);
//! * start-up: from loading the job (a new engine, as in a new process) to the first
//!   record processed by its first operator, with an empty compile cache and a warm one;
//! * memory per operator instance, with 1,000 instances of `count` open in one host.
//!
//! `cargo bench -p sluice-tests --bench sandbox`

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::unbounded;
use sluice::chain::{OpenInfo, Operator, OperatorIdentity, OperatorState};
use sluice::job::{Job, JobControl, JobMonitor, RestorePoint};
use sluice::state::KeyedState;
use sluice::tenant::HostConfig;
use sluice::wasm::{EngineSettings, SandboxLimits, WasmEngine};
use sluice_tests::bench::{median_time, rate, runs};
use sluice_tests::plugins::{COUNT, TEST_HOG, TEST_MISBEHAVE, TOKENIZE, UPPERCASE};
use sluice_tests::{engine, test_dir};

const B_RECORDS: u64 = 400_000;

fn host(dir: &Path) -> HostConfig {
    let path = dir.join("host.toml");
    std::fs::write(
        &path,
        "[tenant.a]\ncall_deadline_ms = 100\nmemory_mb = 32\n[tenant.b]\n\
         [tenant.h]\nstate_mb = 64\ntimers = 1000000\n",
    )
    .unwrap();
    HostConfig::load(&path).unwrap()
}

fn write(dir: &Path, name: &str, text: String) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// Tenant B: one subtask (generator, tokenize, uppercase and sink chained), so alone it
/// keeps one core busy — its fair share of two at equal weights.
fn tenant_b(dir: &Path) -> PathBuf {
    write(
        dir,
        "b.toml",
        format!(
            r#"
name = "b"
tenant = "b"
[source]
type = "generator"
records = {B_RECORDS}
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
[[operator]]
name = "uppercase"
plugin = "{UPPERCASE}"
[sink]
type = "file"
path = "b.tsv"
"#
        ),
    )
}

fn tenant_a(dir: &Path, behavior: &str) -> PathBuf {
    // Busy: eight subtasks, each spinning 5 ms per record in calls of 4 records (well
    // within the deadline), never failing. Otherwise one subtask failing as `behavior`
    // says, restarted with backoff.
    let (parallelism, source, runtime, config) = match behavior {
        "busy" => (
            8,
            "",
            "batch_size = 4",
            r#"behavior = "slow-process", after = 0, delay-ms = 5"#.to_string(),
        ),
        _ => (
            1,
            "rate = 1000.0",
            "",
            format!(r#"behavior = "{behavior}", after = 10"#),
        ),
    };
    write(
        dir,
        "a.toml",
        format!(
            r#"
name = "a"
tenant = "a"
[source]
type = "generator"
records = 1000000000
parallelism = {parallelism}
{source}
[[operator]]
name = "suspect"
plugin = "{TEST_MISBEHAVE}"
parallelism = {parallelism}
config = {{ {config} }}
[sink]
type = "file"
path = "a.txt"
[restart]
strategy = "exponential"
attempts = 1000000
delay_ms = 100
max_delay_ms = 2000
[runtime]
{runtime}
"#
        ),
    )
}

fn run_b(dir: &Path, host: &HostConfig) -> Duration {
    // Each run starts over: the last one's output goes.
    let _ = std::fs::remove_file(dir.join("b.tsv"));
    let job = Job::load_with(&tenant_b(dir), &engine(), host).unwrap();
    let (_tx, rx) = unbounded();
    let start = Instant::now();
    job.run(RestorePoint::Fresh, &rx, &JobMonitor::default())
        .unwrap();
    start.elapsed()
}

fn isolation() {
    let runs = runs(3);
    let dir = test_dir("bench-isolation");
    let host = host(&dir);
    let alone = median_time(runs, || {
        run_b(&dir, &host);
    });
    println!("isolation: tenant b's one-subtask job ({B_RECORDS} lines), median of {runs}");
    println!(
        "  b alone                      {:>12}",
        rate(B_RECORDS as f64 / alone.as_secs_f64())
    );
    for (behavior, what) in [
        ("busy", "keeps 8 cores busy"),
        ("loop-in-process", "loops forever"),
        ("memory-bomb", "eats memory"),
    ] {
        let _ = std::fs::remove_file(dir.join("a.txt"));
        let job = Job::load_with(&tenant_a(&dir, behavior), &engine(), &host).unwrap();
        let (control, rx) = unbounded();
        let monitor = Arc::new(JobMonitor::default());
        let m = monitor.clone();
        let a = thread::spawn(move || job.run(RestorePoint::Fresh, &rx, &m));
        // Until A is at it: failing once, or (busy) reading records.
        while monitor.failures_by_kind().is_empty() && monitor.records_read_written().0 < 100 {
            thread::sleep(Duration::from_millis(5));
        }
        let with = median_time(runs, || {
            run_b(&dir, &host);
        });
        control.send(JobControl::Cancel).unwrap();
        a.join().unwrap().unwrap();
        let failures: u64 = monitor.failures_by_kind().values().sum();
        println!(
            "  b while a {what:<16}   {:>12}   ratio {:.2}   (a failed {failures} times)",
            rate(B_RECORDS as f64 / with.as_secs_f64()),
            alone.as_secs_f64() / with.as_secs_f64()
        );
    }
}

fn startup_job(dir: &Path) -> PathBuf {
    write(
        dir,
        "startup.toml",
        format!(
            r#"
name = "startup"
[source]
type = "generator"
records = 1000000
rate = 1000.0
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
[[operator]]
name = "count"
plugin = "{COUNT}"
key_by = "key"
[sink]
type = "file"
path = "startup.tsv"
"#
        ),
    )
}

/// From a new engine and loading the job to the first record the first operator processed.
fn time_to_first_record(cache: Option<PathBuf>, job: &Path) -> Duration {
    let start = Instant::now();
    let engine = WasmEngine::new(EngineSettings {
        cache_dir: cache,
        announce_compiles: false,
    })
    .unwrap();
    let job = Job::load_with(job, &engine, &HostConfig::default()).unwrap();
    let (control, rx) = unbounded();
    let monitor = Arc::new(JobMonitor::default());
    let m = monitor.clone();
    let run = thread::spawn(move || job.run(RestorePoint::Fresh, &rx, &m));
    let first = loop {
        let started = monitor
            .tasks()
            .iter()
            .flat_map(|t| &t.operators)
            .any(|o| o.operator == "tokenize" && o.records_in > 0);
        if started {
            break start.elapsed();
        }
        thread::sleep(Duration::from_micros(200));
    };
    control.send(JobControl::Cancel).unwrap();
    run.join().unwrap().unwrap();
    first
}

fn startup() {
    let runs = runs(5);
    let dir = test_dir("bench-startup");
    let job = startup_job(&dir);
    let cold = median_time(runs, || {
        let cache = dir.join(format!("cache-{}", rand_suffix()));
        time_to_first_record(Some(cache), &job);
    });
    let warm_cache = dir.join("warm-cache");
    let _ = time_to_first_record(Some(warm_cache.clone()), &job);
    let mut warm_times: Vec<Duration> = (0..runs)
        .map(|_| time_to_first_record(Some(warm_cache.clone()), &job))
        .collect();
    warm_times.sort();
    let warm = warm_times[warm_times.len() / 2];
    println!(
        "start-up to the first processed record (new engine, load job, run), median of {runs}"
    );
    println!(
        "  cold (compile 2 components)  {:>9.1} ms",
        cold.as_secs_f64() * 1e3
    );
    println!(
        "  warm (compile cache on disk) {:>9.1} ms",
        warm.as_secs_f64() * 1e3
    );
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn instances() {
    const N: usize = 1000;
    let engine = engine();
    let plugin = sluice::wasm::Plugin::load(&engine, Path::new(COUNT), false).unwrap();
    let before = rss_bytes();
    let start = Instant::now();
    let mut ops = Vec::with_capacity(N);
    for i in 0..N {
        let identity = OperatorIdentity {
            tenant: "bench".into(),
            job: "bench".into(),
            operator: "count".into(),
            subtask: i as u32,
            parallelism: N as u32,
        };
        let state = OperatorState::new(Some(KeyedState::heap(128, 0..128)));
        let mut op = plugin
            .instantiate(
                identity,
                SandboxLimits::default(),
                state,
                Arc::new(AtomicBool::new(false)),
            )
            .unwrap();
        let info = OpenInfo {
            operator: "count".into(),
            parallelism: 1,
            max_parallelism: 128,
            keyed: true,
            ..OpenInfo::default()
        };
        op.state().opening = true;
        op.open(&info).unwrap();
        op.state().opening = false;
        ops.push(op);
    }
    let elapsed = start.elapsed();
    let after = rss_bytes();
    let linear: u64 = ops.iter().map(|o| o.memory_bytes()).sum::<u64>() / N as u64;
    println!("{N} instances of `count` open in one host");
    println!(
        "  instantiate + open            {:>9.1} µs each",
        elapsed.as_secs_f64() * 1e6 / N as f64
    );
    println!(
        "  resident memory               {:>9.1} KiB each ({:.1} MiB in all)",
        (after.saturating_sub(before)) as f64 / 1024.0 / N as f64,
        (after.saturating_sub(before)) as f64 / (1 << 20) as f64
    );
    println!(
        "  linear memory (reserved)      {:>9.1} KiB each",
        linear as f64 / 1024.0
    );
}

/// The hog job of tenant `a`: a generator into `test-hog` doing `hog` without end.
fn hog_job(dir: &Path, hog: &str) -> PathBuf {
    write(
        dir,
        "hog.toml",
        format!(
            r#"
name = "hog"
tenant = "h"
[source]
type = "generator"
records = 1000000000
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
[[operator]]
name = "hog"
plugin = "{TEST_HOG}"
key_by = "key"
config = {{ hog = "{hog}" }}
[sink]
type = "file"
path = "hog.txt"
[restart]
strategy = "none"
[runtime]
batch_size = 64
buffer_bytes = 4096
"#
        ),
    )
}

/// Host RSS while each host-memory attack runs until tenant `a`'s limits cut it.
fn host_memory() {
    let dir = test_dir("bench-host-memory");
    let host = host(&dir);
    println!("host memory attacks (tenant limits: 64 MiB keyed state, 1 M timers per instance)");
    for (hog, what) in [
        ("keys", "distinct keys"),
        ("values", "16 KiB values"),
        ("list", "list appends"),
        ("timers", "timers"),
    ] {
        let _ = std::fs::remove_file(dir.join("hog.txt"));
        let job = Job::load_with(&hog_job(&dir, hog), &engine(), &host).unwrap();
        let before = rss_bytes();
        let done = Arc::new(AtomicBool::new(false));
        let sampler = {
            let done = done.clone();
            thread::spawn(move || {
                let mut peak = 0;
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    peak = peak.max(rss_bytes());
                    thread::sleep(Duration::from_millis(5));
                }
                peak
            })
        };
        let (_tx, rx) = unbounded();
        let started = Instant::now();
        let result = job.run(RestorePoint::Fresh, &rx, &JobMonitor::default());
        let took = started.elapsed();
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        let peak = sampler.join().unwrap();
        let cause = match result {
            Ok(_) => "not cut".to_string(),
            Err(e) => {
                let e = format!("{e:#}");
                e.split("exceeded a limit: ")
                    .nth(1)
                    .and_then(|r| r.split(" (limit").next())
                    .unwrap_or(&e)
                    .to_string()
            }
        };
        println!(
            "  {what:<16} cut after {:>6.2} s; host RSS {:>6.0} MiB before, peak {:>6.0} MiB ({cause})",
            took.as_secs_f64(),
            before as f64 / f64::from(1 << 20),
            peak as f64 / f64::from(1 << 20)
        );
    }
}

fn main() {
    host_memory();
    isolation();
    startup();
    instances();
}
