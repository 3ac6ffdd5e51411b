//! The two jobs a user compares with Flink, end to end through the whole runtime (file
//! source, Wasm operators, keyed exchange, host state, checkpoints, file sink), each run as
//! `sluice run` in a process of its own against the same work done by a careful native Rust
//! program (one thread, buffered reads, bytes, hash maps) over the same input file, in
//! alternation, wall and CPU time:
//!
//! * word count: `LINES` lines (default 1 M) of 8 words from a vocabulary of `VOCABULARY`
//!   words (default 100,000), words of at least 3 characters counted per word, each total
//!   once at the end, checkpoints every second;
//! * events: `EVENTS` out-of-order events (default 1 M), summed per key in 10 s tumbling
//!   windows with a watermark 2 s behind the largest timestamp, at batch sizes 1, 16 and
//!   1024. Batch 1 must not stall (it once waited for the buffer timeout), so its rate is
//!   printed as a ratio of batch 1024's too;
//! * join: two streams of `JOIN_EVENTS` out-of-order events each (default 500,000) over
//!   200 keys, interval-joined by key within ±250 ms (the `join` plugin, two inputs
//!   aligned at every checkpoint, checkpoints every second), at parallelism 1 and 2; the
//!   native program reads both files, indexes the right stream by key and time, and
//!   writes the same pairs.
//!
//! Every output is checked equal to the native program's and to the tests' reference
//! models, whose times are printed too: they were written for clarity, and a baseline that
//! slow hides the gap. Inputs are written before timing; the compile cache is warm (one
//! untimed run first). Medians of `SLUICE_BENCH_RUNS` (default 5).
//!
//! `cargo bench -p sluice-tests --bench end_to_end [wordcount|events|join]`

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use sluice::job::JobReport;
use sluice_tests::bench::{
    Usage, median_time, paired_usage, runs, usage_of_command, usage_on_this_thread,
};
use sluice_tests::plugins::{COUNT, JOIN, TOKENIZE, WINDOW};
use sluice_tests::windows::{Aggregate, Kind, expected, mixed_events};
use sluice_tests::{expected_word_counts, run_job, sluice_run, test_dir, write_job};

const BIN: &str = env!("CARGO_BIN_EXE_sluice-test-cli");

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

/// The word count as a careful programmer writes it natively, on one thread: the file read
/// through a 1 MiB buffer, bytes lowercased and split on anything but `[a-z0-9]`, tokens of
/// at least `min` bytes counted in a `HashMap`, the totals written at the end. (Bytes, not
/// characters: the generated input is ASCII.)
fn careful_word_count(input: &Path, output: &Path, min: usize) {
    fn count(counts: &mut HashMap<Vec<u8>, u64>, word: &[u8], min: usize) {
        if word.len() < min {
            return;
        }
        match counts.get_mut(word) {
            Some(n) => *n += 1,
            None => {
                counts.insert(word.to_vec(), 1);
            }
        }
    }
    let mut reader = BufReader::with_capacity(1 << 20, File::open(input).unwrap());
    let mut counts = HashMap::new();
    let mut word = Vec::with_capacity(64);
    loop {
        let buffer = reader.fill_buf().unwrap();
        if buffer.is_empty() {
            break;
        }
        for &byte in buffer {
            let byte = byte.to_ascii_lowercase();
            if byte.is_ascii_alphanumeric() {
                word.push(byte);
            } else {
                count(&mut counts, &word, min);
                word.clear();
            }
        }
        let read = buffer.len();
        reader.consume(read);
    }
    count(&mut counts, &word, min);
    let mut out = BufWriter::with_capacity(1 << 20, File::create(output).unwrap());
    for (word, n) in &counts {
        out.write_all(word).unwrap();
        writeln!(out, "\t{n}").unwrap();
    }
    out.flush().unwrap();
}

/// The lines of the file at `path`, sorted.
fn sorted_lines(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    lines.sort_unstable();
    lines
}

/// `sluice run` on `job` as a user starts it (a process of its own; the compile cache
/// warm), starting over each time; its wall and CPU time, and its checkpoints' median
/// synchronous part (ms; `None` without checkpoints) from its summary.
fn sluice_process(dir: &Path, job: &Path, output: &str) -> (Usage, Option<f64>) {
    let _ = std::fs::remove_file(dir.join(output));
    let _ = std::fs::remove_dir_all(dir.join("checkpoints"));
    let (usage, output) = usage_of_command(sluice_run(BIN, job, None).arg("--json"));
    let summary: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("the run's summary");
    let checkpoints = &summary["jobs"][0]["checkpoints"];
    let sync = (checkpoints["completed"].as_u64() > Some(0))
        .then(|| checkpoints["sync_ms_median"].as_f64())
        .flatten();
    (usage, sync)
}

fn print_usage(name: &str, usage: Usage, records: usize, unit: &str) {
    println!(
        "  {name:<34} {:>6.2} s wall ({:>9.0} {unit}/s), {:>6.2} s CPU",
        usage.wall.as_secs_f64(),
        records as f64 / usage.wall.as_secs_f64(),
        usage.cpu.as_secs_f64()
    );
}

fn word_count() {
    let lines = env_or("LINES", 1_000_000);
    let dir = test_dir("bench-e2e-wordcount");
    let input = dir.join("in.txt");
    let vocabulary = env_or("VOCABULARY", 100_000);
    std::fs::write(&input, wordy_text(lines, 8, vocabulary as u64)).unwrap();
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
    // The tests' reference, written for clarity (UTF-8 text, `char` by `char`, a B-tree):
    // the baseline this benchmark once had, kept to show how much a baseline decides.
    let reference = || {
        let text = std::fs::read_to_string(&input).unwrap();
        let counts = expected_word_counts(&text, 3);
        let mut out = String::new();
        for (word, n) in &counts {
            writeln!(out, "{word}\t{n}").unwrap();
        }
        std::fs::write(dir.join("reference.tsv"), out).unwrap();
    };
    let (_, report) = sluice_report(&dir, &job, "counts.tsv");
    let runs = runs(5);
    let native = dir.join("native.tsv");
    let mut syncs = vec![];
    let paired = paired_usage(
        runs,
        || usage_on_this_thread(|| careful_word_count(&input, &native, 3)),
        || {
            let (usage, sync) = sluice_process(&dir, &job, "counts.tsv");
            syncs.push(sync.expect("checkpoints completed"));
            usage
        },
    );
    syncs.sort_by(f64::total_cmp);
    let reference_time = median_time(runs, reference);
    // The same totals, all three ways.
    let got = sorted_lines(&dir.join("counts.tsv"));
    assert_eq!(
        got,
        sorted_lines(&native),
        "Sluice's counts differ from the native program's"
    );
    assert_eq!(
        got,
        sorted_lines(&dir.join("reference.tsv")),
        "the reference's counts differ"
    );
    println!(
        "word count, {lines} lines of 8 words out of {vocabulary}, medians of {runs} alternating runs"
    );
    print_usage("careful native program", paired.baseline, lines, "lines");
    print_usage("sluice run (a process)", paired.subject, lines, "lines");
    println!(
        "  sluice / native: wall {:.2}, CPU {:.2}   (tests' reference {:.2} s: sluice / reference {:.2})",
        paired.wall_ratio,
        paired.cpu_ratio,
        reference_time.as_secs_f64(),
        paired.subject.wall.as_secs_f64() / reference_time.as_secs_f64()
    );
    println!(
        "  checkpoints' synchronous part: median {:.1} ms, largest run median {:.1} ms",
        syncs[syncs.len() / 2],
        syncs[syncs.len() - 1]
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

/// The tumbling-window sums as a careful programmer writes them natively, on one thread:
/// lines `ts,key,value` read through a 1 MiB buffer and split as bytes; after each event
/// the watermark is `bound` behind the largest timestamp (as the job's source sets it);
/// an event whose window the watermark has passed is dropped as late; each window's sums
/// per key are written once, when the watermark passes its end (the rest at the end of
/// the input), as `key<TAB>start,end,sum`.
fn careful_windows(input: &Path, output: &Path, bound: i64, size: i64) {
    fn number<T: std::str::FromStr>(field: Option<&[u8]>) -> T {
        let text = std::str::from_utf8(field.expect("a field")).expect("UTF-8");
        text.parse().ok().expect("a number")
    }
    fn fire(out: &mut impl Write, start: i64, size: i64, sums: HashMap<Vec<u8>, f64>) {
        for (key, sum) in sums {
            out.write_all(&key).unwrap();
            writeln!(out, "\t{start},{},{sum}", start + size).unwrap();
        }
    }
    let mut reader = BufReader::with_capacity(1 << 20, File::open(input).unwrap());
    let mut out = BufWriter::with_capacity(1 << 20, File::create(output).unwrap());
    // Open windows by start, each with its sums per key.
    let mut windows: BTreeMap<i64, HashMap<Vec<u8>, f64>> = BTreeMap::new();
    let (mut largest, mut watermark) = (i64::MIN, i64::MIN);
    let mut line = Vec::with_capacity(64);
    while reader.read_until(b'\n', &mut line).unwrap() > 0 {
        let text = line.strip_suffix(b"\n").unwrap_or(&line);
        let mut fields = text.splitn(3, |&b| b == b',');
        let ts: i64 = number(fields.next());
        let key = fields.next().expect("a key");
        let value: f64 = number(fields.next());
        let start = ts - ts.rem_euclid(size);
        if start + size - 1 > watermark {
            let sums = windows.entry(start).or_default();
            match sums.get_mut(key) {
                Some(sum) => *sum += value,
                None => {
                    sums.insert(key.to_vec(), value);
                }
            }
        }
        largest = largest.max(ts);
        if largest - bound - 1 > watermark {
            watermark = largest - bound - 1;
            while let Some(window) = windows.first_entry() {
                if *window.key() + size - 1 > watermark {
                    break;
                }
                let start = *window.key();
                fire(&mut out, start, size, window.remove());
            }
        }
        line.clear();
    }
    for (start, sums) in windows {
        fire(&mut out, start, size, sums);
    }
    out.flush().unwrap();
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
    let runs = runs(5);
    let input = dir.join("events.csv");
    let native = dir.join("native.tsv");
    let careful = || usage_on_this_thread(|| careful_windows(&input, &native, BOUND, 10_000));
    // The tests' independent window model (events in memory, record by record, B-trees),
    // the baseline this benchmark once had.
    let model = || {
        expected(
            &events,
            BOUND,
            Kind::Tumbling { size: 10_000 },
            Aggregate::Sum,
            0,
        )
    };
    let model_time = median_time(runs, || {
        std::hint::black_box(model());
    });
    let want = model();
    careful();
    assert_eq!(
        sorted_lines(&native),
        want.lines,
        "the native program differs from the model"
    );
    println!(
        "events, {n} events over 1000 keys, 10 s tumbling sums, medians of {runs} alternating runs"
    );
    println!(
        "  tests' window model (in memory)    {:>6.2} s wall ({:>9.0} events/s)",
        model_time.as_secs_f64(),
        n as f64 / model_time.as_secs_f64()
    );
    let mut times = BTreeMap::new();
    for batch in [1024, 16, 1] {
        let path = job(batch);
        let (_, report) = sluice_report(&dir, &path, "out.tsv");
        let paired = paired_usage(runs, careful, || sluice_process(&dir, &path, "out.tsv").0);
        times.insert(batch, paired.subject.wall);
        // Watermarks travel inside batches: every batch size gives the model's windows.
        assert_eq!(
            sorted_lines(&dir.join("out.tsv")),
            want.lines,
            "batch {batch} differs from the model"
        );
        print_usage("careful native program", paired.baseline, n, "events");
        print_usage(
            &format!("sluice run, batch {batch}"),
            paired.subject,
            n,
            "events",
        );
        println!(
            "  sluice / native: wall {:.2}, CPU {:.2}   to batch 1024: {:.2}   to the model: {:.2}",
            paired.wall_ratio,
            paired.cpu_ratio,
            paired.subject.wall.as_secs_f64() / times[&1024].as_secs_f64(),
            paired.subject.wall.as_secs_f64() / model_time.as_secs_f64()
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
    let mut by_key: HashMap<&str, Vec<(i64, &str)>> = Default::default();
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
