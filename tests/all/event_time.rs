//! Event time end to end: watermarks from out-of-order sources, windows checked against an
//! independent model, late records counted, idle sources, a word count by final timer, and
//! windows that survive SIGKILL and restore.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::checkpoints::{Delays, run_with_kills, sorted_lines};
use sluice::job::JobReport;
use sluice_tests::plugins::{COUNT, FILTER, TOKENIZE, WINDOW};
use sluice_tests::windows::{Aggregate, Event, Expected, Kind, expected, mixed_events};
use sluice_tests::{expected_word_counts, run_job, sample_text, test_dir, write_job};

const BOUND: i64 = 1000;

fn write_events(dir: &Path, events: &[Event]) {
    let text: String = events.iter().map(|e| e.line() + "\n").collect();
    std::fs::write(dir.join("events.csv"), text).unwrap();
}

pub(crate) fn window_config(kind: Kind, aggregate: Aggregate, lateness: i64) -> String {
    let kind = match kind {
        Kind::Tumbling { size } => format!(r#"kind = "tumbling", size-ms = {size}"#),
        Kind::Sliding { size, slide } => {
            format!(r#"kind = "sliding", size-ms = {size}, slide-ms = {slide}"#)
        }
        Kind::Session { gap } => format!(r#"kind = "session", gap-ms = {gap}"#),
    };
    let aggregate = match aggregate {
        Aggregate::Count => "count",
        Aggregate::Sum => "sum",
        Aggregate::Min => "min",
        Aggregate::Max => "max",
    };
    format!(r#"{kind}, aggregate = "{aggregate}", allowed-lateness-ms = {lateness}"#)
}

fn window_job(config: &str, parallelism: u32, batch_size: usize) -> String {
    window_job_with(config, parallelism, batch_size, WINDOW, false)
}

/// The window job with the `window` plugin at `plugin`, and with `filter_first` a filter
/// that passes everything chained to the source before it (so the watermarks inside
/// batches go through an operator of the source's task before the exchange).
pub fn window_job_with(
    config: &str,
    parallelism: u32,
    batch_size: usize,
    plugin: &str,
    filter_first: bool,
) -> String {
    let filter = if filter_first {
        format!("[[operator]]\nname = \"pass\"\nplugin = \"{FILTER}\"\n")
    } else {
        String::new()
    };
    format!(
        r#"
name = "windows"
[source]
type = "file"
path = "events.csv"
timestamp = {{ field = 0 }}
out_of_orderness_ms = {BOUND}
{filter}[[operator]]
name = "window"
plugin = "{plugin}"
parallelism = {parallelism}
key_by = {{ field = 1 }}
config = {{ {config} }}
[sink]
type = "file"
path = "out.tsv"
format = "key-value"
[runtime]
batch_size = {batch_size}
"#
    )
}

/// Records the `window` operator dropped as late, over its subtasks.
pub(crate) fn dropped(report: &JobReport) -> u64 {
    counter(report, "late-records-dropped")
}

/// The `window` operator's counter `name`, summed over its subtasks.
fn counter(report: &JobReport, name: &str) -> u64 {
    report
        .tasks
        .iter()
        .flat_map(|t| &t.operators)
        .filter(|o| o.operator == "window")
        .map(|o| o.counters.get(name).copied().unwrap_or(0))
        .sum()
}

/// Runs the window job over `events` and compares with the model.
fn check(
    name: &str,
    events: &[Event],
    kind: Kind,
    aggregate: Aggregate,
    lateness: i64,
    parallelism: u32,
    batch_size: usize,
) -> Expected {
    let config = window_config(kind, aggregate, lateness);
    check_job(
        name,
        events,
        &window_job(&config, parallelism, batch_size),
        (kind, aggregate, lateness),
    )
}

/// Runs `job` (a window job) over `events` and compares with the model of the window.
pub fn check_job(
    name: &str,
    events: &[Event],
    job: &str,
    (kind, aggregate, lateness): (Kind, Aggregate, i64),
) -> Expected {
    let dir = test_dir(name);
    write_events(&dir, events);
    let report = run_job(&write_job(&dir, job)).unwrap();
    let output = std::fs::read_to_string(dir.join("out.tsv")).unwrap();
    let want = expected(events, BOUND, kind, aggregate, lateness);
    assert_eq!(
        sorted_lines(&output),
        want.lines,
        "{name}: window results differ from the model"
    );
    assert_eq!(
        dropped(&report),
        want.dropped,
        "{name}: late records dropped"
    );
    // Sent to the side output `late`, which nothing reads in these jobs.
    if !job.contains(sluice_tests::COMPAT_DIR) {
        assert_eq!(
            counter(&report, "side-output-dropped"),
            want.dropped,
            "{name}: late records sent to the side output"
        );
    }
    want
}

#[test]
fn tumbling_windows_with_out_of_order_and_late_records_match_the_model() {
    // In order, out of order within the bound, and every 37th far beyond it.
    let events = mixed_events(3000, 5, 50, BOUND, 37, 7);
    let want = check(
        "tumbling",
        &events,
        Kind::Tumbling { size: 10_000 },
        Aggregate::Sum,
        0,
        1,
        16,
    );
    assert!(
        want.dropped > 20,
        "the input has too few late records: {}",
        want.dropped
    );
    assert!(want.lines.len() > 50);
}

#[test]
fn one_record_per_batch_judges_each_record_against_the_records_before_it() {
    let events = mixed_events(600, 3, 50, BOUND, 11, 3);
    let want = check(
        "per-record",
        &events,
        Kind::Tumbling { size: 2_000 },
        Aggregate::Count,
        0,
        1,
        1,
    );
    assert!(want.dropped > 0);
}

#[test]
fn every_batch_size_gives_the_windows_of_records_one_by_one() {
    // Watermarks travel inside batches, so a batch of 1,024 judges each record against
    // the watermark of the records before it, as batches of one do (and Flink does).
    let events = mixed_events(3000, 8, 50, BOUND, 19, 21);
    let kinds = [
        (Kind::Tumbling { size: 5_000 }, 0),
        (
            Kind::Sliding {
                size: 6_000,
                slide: 2_000,
            },
            2_000,
        ),
        (Kind::Session { gap: 1_500 }, 1_000),
    ];
    let mut dropped = 0;
    for (k, (kind, lateness)) in kinds.into_iter().enumerate() {
        let config = window_config(kind, Aggregate::Sum, lateness);
        for parallelism in [1, 4] {
            for batch in [1, 1024] {
                for filter_first in [false, true] {
                    let name = format!("batches-{k}-{parallelism}-{batch}-{filter_first}");
                    let job = window_job_with(&config, parallelism, batch, WINDOW, filter_first);
                    let want = check_job(&name, &events, &job, (kind, Aggregate::Sum, lateness));
                    assert!(want.lines.len() > 50, "{name}");
                    dropped += want.dropped;
                }
            }
        }
    }
    assert!(dropped > 50, "too few late records: {dropped}");
}

#[test]
fn parallelism_1_and_4_give_the_same_windows() {
    let events = mixed_events(2000, 20, 50, BOUND, 29, 11);
    let one = check(
        "tumbling-p1",
        &events,
        Kind::Tumbling { size: 5_000 },
        Aggregate::Max,
        0,
        1,
        64,
    );
    let four = check(
        "tumbling-p4",
        &events,
        Kind::Tumbling { size: 5_000 },
        Aggregate::Max,
        0,
        4,
        64,
    );
    assert_eq!(one, four);
}

#[test]
fn sliding_windows_with_allowed_lateness_fire_again_for_late_records() {
    let events = mixed_events(2000, 4, 50, BOUND, 23, 5);
    let want = check(
        "sliding",
        &events,
        Kind::Sliding {
            size: 6_000,
            slide: 2_000,
        },
        Aggregate::Count,
        3_000,
        2,
        32,
    );
    // Late records within the allowed lateness update windows that already fired.
    let mut windows: Vec<&str> = want
        .lines
        .iter()
        .map(|l| l.rsplit_once(',').unwrap().0)
        .collect();
    let fired = windows.len();
    windows.dedup();
    assert!(fired > windows.len(), "no window fired twice");
}

#[test]
fn session_windows_merge_and_match_the_model() {
    // Bursts per key with gaps, some bridged by out-of-order records.
    let events = mixed_events(1500, 6, 400, BOUND, 31, 13);
    let want = check(
        "session",
        &events,
        Kind::Session { gap: 1_500 },
        Aggregate::Min,
        0,
        2,
        16,
    );
    assert!(!want.lines.is_empty());
}

#[test]
fn word_count_by_final_timer_emits_each_word_once_with_its_total() {
    let dir = test_dir("final-count");
    let text = sample_text(17, 3000);
    std::fs::write(dir.join("in.txt"), &text).unwrap();
    let job = write_job(
        &dir,
        &format!(
            r#"
name = "final"
[source]
type = "file"
path = "in.txt"
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
[[operator]]
name = "count"
plugin = "{COUNT}"
parallelism = 3
key_by = "key"
config = {{ emit = "final" }}
[sink]
type = "file"
path = "out.tsv"
format = "key-value"
"#
        ),
    );
    run_job(&job).unwrap();
    let output = std::fs::read_to_string(dir.join("out.tsv")).unwrap();
    let mut got = std::collections::BTreeMap::new();
    for line in output.lines() {
        let (word, count) = line.split_once('\t').unwrap();
        let previous = got.insert(word.to_string(), count.parse::<u64>().unwrap());
        assert!(previous.is_none(), "{word} emitted twice");
    }
    assert_eq!(got, expected_word_counts(&text, 1));
}

fn idle_job(idle_timeout: bool) -> String {
    let idle = if idle_timeout {
        "idle_timeout_ms = 300"
    } else {
        ""
    };
    format!(
        r#"
name = "idle"
[[source]]
name = "fast"
type = "file"
path = "events.csv"
timestamp = {{ field = 0 }}
[[source]]
name = "slow"
type = "generator"
shape = "events"
records = 2
keys = 1
step_ms = 10
rate = 0.5
timestamp = {{ field = 0 }}
{idle}
[[operator]]
name = "window"
plugin = "{WINDOW}"
key_by = {{ field = 1 }}
config = {{ kind = "tumbling", size-ms = 10000, aggregate = "count" }}
[sink]
type = "file"
path = "out.tsv"
format = "key-value"
"#
    )
}

#[test]
fn an_idle_source_does_not_hold_back_event_time() {
    // The fast source's events end at 60 s; the slow one sends one event at time 0, and
    // its second (event time 10 ms) two seconds later.
    let events: Vec<Event> = (0..600)
        .map(|i| Event {
            ts: i * 100,
            key: "fast".into(),
            value: 1.0,
        })
        .collect();
    for idle in [false, true] {
        let dir = test_dir("idle");
        write_events(&dir, &events);
        let report = run_job(&write_job(&dir, &idle_job(idle))).unwrap();
        let output = std::fs::read_to_string(dir.join("out.tsv")).unwrap();
        let slow_window = output
            .lines()
            .find(|l| l.starts_with("k0\t0,10000,"))
            .unwrap_or_else(|| panic!("no window of the slow source: {output}"));
        if idle {
            // Declared idle, the slow source was not waited for: event time reached the
            // end with the fast source, and its second event came too late.
            assert_eq!(slow_window, "k0\t0,10000,1");
            assert_eq!(dropped(&report), 1);
        } else {
            assert_eq!(slow_window, "k0\t0,10000,2");
            assert_eq!(dropped(&report), 0);
        }
    }
}

#[test]
fn windows_survive_sigkill_and_restore() {
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    eprintln!("windowed kill test seed {seed}");
    let toml = format!(
        r#"
name = "windowed"
[source]
type = "generator"
shape = "events"
records = 30000
keys = 40
step_ms = 10
jitter_ms = 1000
rate = 10000.0
timestamp = {{ field = 0 }}
out_of_orderness_ms = 250
[[operator]]
name = "window"
plugin = "{WINDOW}"
parallelism = 2
key_by = {{ field = 1 }}
config = {{ kind = "tumbling", size-ms = 500, aggregate = "sum", allowed-lateness-ms = 100 }}
[sink]
type = "file"
path = "out/counts.tsv"
format = "key-value"
[checkpoint]
interval_ms = 100
dir = "checkpoints"
[runtime]
batch_size = 10
"#
    );
    let reference_dir = test_dir("windowed-reference");
    let reference_report = run_job(&write_job(&reference_dir, &toml)).unwrap();
    let reference = std::fs::read_to_string(reference_dir.join("out/counts.tsv")).unwrap();
    assert!(
        dropped(&reference_report) > 0,
        "no late records in the input"
    );

    let dir = test_dir("windowed-kill");
    let job = write_job(&dir, &toml);
    let (output, killed, _) = run_with_kills(&dir, &job, 4, &mut Delays(seed));
    assert!(
        killed >= 3,
        "only {killed} kills hit a running job (seed {seed})"
    );
    assert_eq!(
        sorted_lines(&output),
        sorted_lines(&reference),
        "window results differ from the failure-free run (seed {seed})"
    );
}
