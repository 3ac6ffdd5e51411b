//! The two jobs a user compares with Flink, end to end through the whole runtime (file
//! source, Wasm operators, keyed exchange, host state, checkpoints, file sink), each against
//! the same work done by one plain native Rust program over the same input file, timed in
//! the same run:
//!
//! * word count: `LINES` lines (default 1 M) of 8 words from a vocabulary of 100,000,
//!   words of at least 3 characters counted per word, each total once at the end,
//!   checkpoints every second;
//! * events: `EVENTS` out-of-order events (default 1 M), summed per key in 10 s tumbling
//!   windows with a watermark 2 s behind the largest timestamp, at batch sizes 1, 16 and
//!   1024 (the native program: the independent window model, record by record). Batch 1
//!   must not stall (it once waited for the buffer timeout), so its rate is printed as a
//!   ratio of batch 1024's too;
//! * join: two streams of `JOIN_EVENTS` out-of-order events each (default 500,000) over
//!   200 keys, interval-joined by key within ±250 ms (the `join` plugin, two inputs
//!   aligned at every checkpoint, checkpoints every second), at parallelism 1 and 2; the
//!   native program reads both files, indexes the right stream by key and time, and
//!   writes the same pairs.
//!
//! Prints seconds, records/s and the ratio Sluice / native (time). Inputs are written
//! before timing; the compile cache is warm (one untimed run first).
//!
//! `cargo bench -p sluice-tests --bench end_to_end`

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use sluice::job::JobReport;
use sluice_tests::bench::{median_time, runs};
use sluice_tests::plugins::{COUNT, JOIN, TOKENIZE, WINDOW};
use sluice_tests::windows::{Aggregate, Kind, expected, mixed_events};
use sluice_tests::{expected_word_counts, run_job, test_dir, write_job};

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs the job at `job` (starting over each time) and returns how long it took.
fn sluice(dir: &Path, job: &Path, output: &str) -> Duration {
    sluice_report(dir, job, output).0
}

/// [`sluice`], with the job's report.
fn sluice_report(dir: &Path, job: &Path, output: &str) -> (Duration, JobReport) {
    let _ = std::fs::remove_file(dir.join(output));
    let _ = std::fs::remove_dir_all(dir.join("checkpoints"));
    let start = Instant::now();
    let report = run_job(job).expect("the job runs");
    (start.elapsed(), report)
}

/// `lines` lines of `words` words each, drawn from a vocabulary of `vocabulary` words of
/// 3 to 9 letters (as a generated source would give).
fn wordy_text(lines: usize, words: usize, vocabulary: u64) -> String {
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let word = |n: u64| {
        let len = 3 + (n % 7) as usize;
        let mut w = String::with_capacity(len);
        let mut x = n.wrapping_mul(0x2545_f491_4f6c_dd1d);
        for _ in 0..len {
            w.push((b'a' + (x % 26) as u8) as char);
            x /= 26;
        }
        w
    };
    let mut text = String::new();
    for _ in 0..lines {
        for i in 0..words {
            if i > 0 {
                text.push(' ');
            }
            text.push_str(&word(next() % vocabulary));
        }
        text.push('\n');
    }
    text
}

fn word_count() {
    let lines = env_or("LINES", 1_000_000);
    let dir = test_dir("bench-e2e-wordcount");
    std::fs::write(dir.join("in.txt"), wordy_text(lines, 8, 100_000)).unwrap();
    let job = write_job(
        &dir,
        &format!(
            r#"
name = "wordcount"
[source]
type = "file"
path = "in.txt"
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
config = {{ min-length = 3 }}
[[operator]]
name = "count"
plugin = "{COUNT}"
key_by = "key"
config = {{ emit = "final" }}
[sink]
type = "file"
path = "counts.tsv"
format = "key-value"
[checkpoint]
interval_ms = 1000
"#
        ),
    );
    let native = || {
        let text = std::fs::read_to_string(dir.join("in.txt")).unwrap();
        let counts = expected_word_counts(&text, 3);
        let mut out = String::new();
        for (word, n) in &counts {
            writeln!(out, "{word}\t{n}").unwrap();
        }
        std::fs::write(dir.join("native.tsv"), out).unwrap();
    };
    let (_, report) = sluice_report(&dir, &job, "counts.tsv");
    let runs = runs(3);
    let wasm = median_time(runs, || {
        sluice(&dir, &job, "counts.tsv");
    });
    let plain = median_time(runs, native);
    // Same totals.
    let got = std::fs::read_to_string(dir.join("counts.tsv")).unwrap();
    let want = std::fs::read_to_string(dir.join("native.tsv")).unwrap();
    let sorted = |s: &str| {
        let mut v: Vec<&str> = s.lines().collect();
        v.sort_unstable();
        v.join("\n")
    };
    assert_eq!(sorted(&got), sorted(&want), "word counts differ");
    println!("word count, {lines} lines, median of {runs}");
    println!(
        "  sluice {:>7.2} s ({:>9.0} lines/s)   native {:>7.2} s   ratio {:.2}",
        wasm.as_secs_f64(),
        lines as f64 / wasm.as_secs_f64(),
        plain.as_secs_f64(),
        wasm.as_secs_f64() / plain.as_secs_f64()
    );
    // The share of the `count` task's busy time spent inside `count`'s calls (the rest is
    // the runtime's: reading its input, the keyed exchange, applying state, the sink).
    let task = report
        .tasks
        .iter()
        .find(|t| t.operators.iter().any(|o| o.operator == "count"))
        .expect("a task runs count");
    let count = task
        .operators
        .iter()
        .find(|o| o.operator == "count")
        .unwrap();
    println!(
        "  count task busy {:.2} s, inside count's calls {:.2} s ({:.0}%)",
        task.busy.as_secs_f64(),
        count.busy.as_secs_f64(),
        100.0 * count.busy.as_secs_f64() / task.busy.as_secs_f64()
    );
}

fn events() {
    const BOUND: i64 = 2000;
    let n = env_or("EVENTS", 1_000_000);
    let dir = test_dir("bench-e2e-events");
    let events = mixed_events(n, 1000, 1, BOUND, 0, 5);
    let text: String = events.iter().map(|e| e.line() + "\n").collect();
    std::fs::write(dir.join("events.csv"), text).unwrap();
    let job = |batch: usize| {
        write_job(
            &dir,
            &format!(
                r#"
name = "events"
[source]
type = "file"
path = "events.csv"
timestamp = {{ field = 0 }}
out_of_orderness_ms = {BOUND}
[[operator]]
name = "window"
plugin = "{WINDOW}"
key_by = {{ field = 1 }}
config = {{ kind = "tumbling", size-ms = 10000, aggregate = "sum" }}
[sink]
type = "file"
path = "out.tsv"
format = "key-value"
[runtime]
batch_size = {batch}
"#
            ),
        )
    };
    let runs = runs(3);
    let model = || {
        expected(
            &events,
            BOUND,
            Kind::Tumbling { size: 10_000 },
            Aggregate::Sum,
            0,
        )
    };
    let plain = median_time(runs, || {
        std::hint::black_box(model());
    });
    let want = model();
    println!("events, {n} events over 1000 keys, 10 s tumbling sums, median of {runs}");
    println!(
        "  native model (record by record)   {:>7.2} s ({:>9.0} events/s)",
        plain.as_secs_f64(),
        n as f64 / plain.as_secs_f64()
    );
    let mut times = BTreeMap::new();
    for batch in [1024, 16, 1] {
        let path = job(batch);
        let (_, report) = sluice_report(&dir, &path, "out.tsv");
        let t = median_time(runs, || {
            sluice(&dir, &path, "out.tsv");
        });
        times.insert(batch, t);
        // Watermarks travel inside batches: every batch size gives the model's windows.
        let got = std::fs::read_to_string(dir.join("out.tsv")).unwrap();
        let mut got: Vec<&str> = got.lines().collect();
        got.sort_unstable();
        assert_eq!(got, want.lines, "batch {batch} differs from the model");
        println!(
            "  sluice, batch {batch:>4}               {:>7.2} s ({:>9.0} events/s)   ratio to native {:.2}   to batch 1024 {:.2}",
            t.as_secs_f64(),
            n as f64 / t.as_secs_f64(),
            t.as_secs_f64() / plain.as_secs_f64(),
            t.as_secs_f64() / times[&1024].as_secs_f64()
        );
        // Which task bounds the job: the one busy (not waiting for input or for room
        // downstream) nearly all the time.
        for task in &report.tasks {
            println!(
                "    {:<28} busy {:>5.2} s, idle {:>5.2} s, backpressured {:>5.2} s",
                task.task,
                task.busy.as_secs_f64(),
                task.idle.as_secs_f64(),
                task.backpressured.as_secs_f64()
            );
        }
    }
}

/// The time and key of an event line `ts,key,value`.
fn time_and_key(line: &str) -> (i64, &str) {
    let mut fields = line.split(',');
    let ts = fields.next().unwrap().parse().unwrap();
    (ts, fields.next().unwrap())
}

/// The interval join as one plain program: both files read, the right stream indexed by
/// key and time, the pairs written (`key\tLEFT|RIGHT`).
fn native_join(dir: &Path, lower: i64, upper: i64) {
    let left = std::fs::read_to_string(dir.join("left.csv")).unwrap();
    let right = std::fs::read_to_string(dir.join("right.csv")).unwrap();
    let mut by_key: std::collections::HashMap<&str, Vec<(i64, &str)>> = Default::default();
    for line in right.lines() {
        let (ts, key) = time_and_key(line);
        by_key.entry(key).or_default().push((ts, line));
    }
    for list in by_key.values_mut() {
        list.sort_by_key(|&(ts, _)| ts);
    }
    let mut out = String::new();
    for line in left.lines() {
        let (ts, key) = time_and_key(line);
        let Some(list) = by_key.get(key) else {
            continue;
        };
        let from = list.partition_point(|&(t, _)| t < ts + lower);
        for &(t, r) in &list[from..] {
            if t > ts + upper {
                break;
            }
            let _ = writeln!(out, "{key}\t{line}|{r}");
        }
    }
    std::fs::write(dir.join("native.tsv"), out).unwrap();
}

fn join() {
    const BOUND: i64 = 1000;
    let n = env_or("JOIN_EVENTS", 500_000);
    let dir = test_dir("bench-e2e-join");
    for (file, seed) in [("left.csv", 3), ("right.csv", 4)] {
        let events = mixed_events(n, 200, 2, BOUND, 0, seed);
        let text: String = events.iter().map(|e| e.line() + "\n").collect();
        std::fs::write(dir.join(file), text).unwrap();
    }
    let job = |parallelism: u32| {
        write_job(
            &dir,
            &format!(
                r#"
name = "join"
[[source]]
name = "left"
type = "file"
path = "left.csv"
timestamp = {{ field = 0 }}
out_of_orderness_ms = {BOUND}
[[source]]
name = "right"
type = "file"
path = "right.csv"
timestamp = {{ field = 0 }}
out_of_orderness_ms = {BOUND}
[[operator]]
name = "join"
plugin = "{JOIN}"
inputs = ["left", "right"]
key_by = {{ field = 1 }}
parallelism = {parallelism}
config = {{ lower_ms = -250, upper_ms = 250 }}
[sink]
type = "file"
path = "out.tsv"
format = "key-value"
[checkpoint]
interval_ms = 1000
"#
            ),
        )
    };
    let runs = runs(3);
    let plain = median_time(runs, || native_join(&dir, -250, 250));
    let want = std::fs::read_to_string(dir.join("native.tsv")).unwrap();
    let mut want: Vec<&str> = want.lines().collect();
    want.sort_unstable();
    let records = 2 * n;
    println!(
        "join, 2 x {n} events over 200 keys within ±250 ms ({} pairs), median of {runs}",
        want.len()
    );
    println!(
        "  native program                    {:>7.2} s ({:>9.0} records/s)",
        plain.as_secs_f64(),
        records as f64 / plain.as_secs_f64()
    );
    for parallelism in [1, 2] {
        let path = job(parallelism);
        sluice(&dir, &path, "out.tsv");
        let got = std::fs::read_to_string(dir.join("out.tsv")).unwrap();
        let mut got: Vec<&str> = got.lines().collect();
        got.sort_unstable();
        assert!(
            got == want,
            "parallelism {parallelism}: the join differs from the native one"
        );
        let t = median_time(runs, || {
            sluice(&dir, &path, "out.tsv");
        });
        println!(
            "  sluice, parallelism {parallelism}             {:>7.2} s ({:>9.0} records/s)   ratio to native {:.2}",
            t.as_secs_f64(),
            records as f64 / t.as_secs_f64(),
            t.as_secs_f64() / plain.as_secs_f64()
        );
    }
}

fn main() {
    let all = std::env::args().skip(1).all(|a| a.starts_with('-'));
    let only = |name: &str| all || std::env::args().any(|a| a == name);
    if only("wordcount") {
        word_count();
    }
    if only("events") {
        events();
    }
    if only("join") {
        join();
    }
}
