//! Jobs as graphs: a two-input interval join and a broadcast enrichment checked against
//! independent models at parallelism 1 and 4 and across SIGKILL and restore (also at
//! another parallelism), a window's late records through its side output into a second
//! sink, and the graph mistakes validation names.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::checkpoints::{
    Delays, kill_after_a_checkpoint, run_with_kills_writing, sorted_lines, spawn_sluice,
};
use sluice::job::{JobFile, JobGraph};
use sluice_tests::graphs::{enrich, interval_join};
use sluice_tests::plugins::{COUNT, ENRICH, JOIN, TOKENIZE, WINDOW};
use sluice_tests::windows::{Aggregate, Event, Kind, expected, mixed_events};
use sluice_tests::{TestJob, run_job, test_dir, write_job};

/// Watermark bound of every file source here: above the events' jitter, so no event is
/// late (the models assume none is).
const BOUND: i64 = 1000;

fn write_events(dir: &Path, file: &str, events: &[Event]) {
    let text: String = events.iter().map(|e| e.line() + "\n").collect();
    std::fs::write(dir.join(file), text).unwrap();
}

/// Asserts that `actual` has the lines of `expected` (sorted), showing the counts and a
/// few lines each has that the other lacks when not.
pub(crate) fn assert_same_lines<S: AsRef<str>>(actual: &str, expected: &[S], what: &str) {
    let actual = sorted_lines(actual);
    let expected: Vec<&str> = expected.iter().map(AsRef::as_ref).collect();
    if actual == expected {
        return;
    }
    let (a, e): (
        std::collections::BTreeSet<&str>,
        std::collections::BTreeSet<&str>,
    ) = (
        actual.iter().copied().collect(),
        expected.iter().copied().collect(),
    );
    let extra: Vec<&&str> = a.difference(&e).take(5).collect();
    let missing: Vec<&&str> = e.difference(&a).take(5).collect();
    panic!(
        "{what}: {} lines where {} were expected; extra {extra:?}, missing {missing:?}",
        actual.len(),
        expected.len()
    );
}

fn seed() -> u64 {
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    eprintln!("seed {seed}");
    seed
}

/// A join of `left.csv` and `right.csv` at `parallelism`, in `mode`.
fn join_job(parallelism: u32, batch_size: usize, mode: &str) -> String {
    format!(
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
config = {{ lower_ms = -300, upper_ms = 500 }}
[sink]
type = "file"
path = "out.tsv"
format = "key-value"
[checkpoint]
interval_ms = 20
mode = "{mode}"
[runtime]
batch_size = {batch_size}
"#
    )
}

#[test]
fn an_interval_join_of_two_streams_matches_the_model_at_parallelism_1_and_4() {
    let left = mixed_events(1500, 40, 20, BOUND, 0, 3);
    let right = mixed_events(2500, 40, 12, BOUND, 0, 5);
    let want = interval_join(&left, &right, -300, 500);
    assert!(
        want.len() > 1000,
        "the inputs join too little: {}",
        want.len()
    );
    for (parallelism, batch_size, mode) in [
        (1, 1, "exactly-once"),
        (4, 64, "exactly-once"),
        (4, 16, "at-least-once"),
    ] {
        let dir = test_dir(&format!("join-{parallelism}-{batch_size}-{mode}"));
        write_events(&dir, "left.csv", &left);
        write_events(&dir, "right.csv", &right);
        let report = run_job(&write_job(&dir, &join_job(parallelism, batch_size, mode))).unwrap();
        let output = std::fs::read_to_string(dir.join("out.tsv")).unwrap();
        assert_same_lines(
            &output,
            &want,
            &format!("parallelism {parallelism}, batch {batch_size}, {mode}: the join"),
        );
        let late: u64 = report
            .tasks
            .iter()
            .flat_map(|t| &t.operators)
            .filter_map(|o| o.counters.get("late-records"))
            .sum();
        assert_eq!(late, 0, "no record of these inputs is late");
    }
}

/// A join of two throttled generators, checkpointed every 100 ms.
fn generated_join(parallelism: u32) -> String {
    let source = |name: &str, records: u64, step: u32, seed: u32| {
        format!(
            r#"
[[source]]
name = "{name}"
type = "generator"
shape = "events"
records = {records}
keys = 200
step_ms = {step}
jitter_ms = 300
seed = {seed}
rate = 5000.0
timestamp = {{ field = 0 }}
out_of_orderness_ms = 300
"#
        )
    };
    format!(
        r#"
name = "join-kill"
{}{}
[[operator]]
name = "join"
plugin = "{JOIN}"
inputs = ["clicks", "views"]
key_by = {{ field = 1 }}
parallelism = {parallelism}
config = {{ lower_ms = -500, upper_ms = 500 }}
[sink]
type = "file"
path = "out/counts.tsv"
format = "key-value"
[checkpoint]
interval_ms = 100
dir = "checkpoints"
[runtime]
batch_size = 20
"#,
        source("clicks", 8000, 10, 1),
        source("views", 12000, 7, 2)
    )
}

#[test]
fn a_join_survives_sigkill_and_restore_exactly_once() {
    let seed = seed();
    for parallelism in [1, 4] {
        let toml = generated_join(parallelism);
        let reference_dir = test_dir(&format!("join-reference-{parallelism}"));
        run_job(&write_job(&reference_dir, &toml)).unwrap();
        let reference = std::fs::read_to_string(reference_dir.join("out/counts.tsv")).unwrap();
        assert!(
            reference.lines().count() > 1000,
            "the join joined too little"
        );

        let dir = test_dir(&format!("join-kill-{parallelism}"));
        let job = write_job(&dir, &toml);
        let (outputs, killed, _) =
            run_with_kills_writing(&dir, &job, 3, &mut Delays(seed), &["out/counts.tsv"]);
        assert!(
            killed >= 2,
            "only {killed} kills hit a running job (seed {seed})"
        );
        assert_same_lines(
            &outputs[0],
            &sorted_lines(&reference),
            &format!("parallelism {parallelism}: the join after kills (seed {seed})"),
        );
    }
}

/// Events enriched with rules, both from files, the enrichment at `parallelism`.
fn enrich_job(parallelism: u32, batch_size: usize) -> String {
    format!(
        r#"
name = "enrich"
[[source]]
name = "events"
type = "file"
path = "events.csv"
timestamp = {{ field = 0 }}
out_of_orderness_ms = {BOUND}
[[source]]
name = "rules"
type = "file"
path = "rules.csv"
timestamp = {{ field = 0 }}
out_of_orderness_ms = {BOUND}
[[operator]]
name = "enrich"
plugin = "{ENRICH}"
parallelism = {parallelism}
inputs = [
  {{ from = "events", key_by = {{ field = 1 }} }},
  {{ from = "rules", broadcast = true }},
]
[sink]
type = "file"
path = "out.txt"
[checkpoint]
interval_ms = 20
[runtime]
batch_size = {batch_size}
"#
    )
}

#[test]
fn a_broadcast_enrichment_matches_the_model_at_parallelism_1_and_4() {
    let events = mixed_events(4000, 30, 10, BOUND, 0, 9);
    // Rules for the same keys, a new one every 200 ms of event time.
    let rules = mixed_events(200, 30, 200, BOUND, 0, 4);
    let want = enrich(&events, &rules);
    assert!(
        want.iter().filter(|l| !l.ends_with(",-")).count() > 3000,
        "too few events have a rule"
    );
    for (parallelism, batch_size) in [(1, 1), (4, 256)] {
        let dir = test_dir(&format!("enrich-{parallelism}-{batch_size}"));
        write_events(&dir, "events.csv", &events);
        write_events(&dir, "rules.csv", &rules);
        run_job(&write_job(&dir, &enrich_job(parallelism, batch_size))).unwrap();
        let output = std::fs::read_to_string(dir.join("out.txt")).unwrap();
        assert_same_lines(
            &output,
            &want,
            &format!("parallelism {parallelism}, batch {batch_size}: the enrichment"),
        );
    }
}

/// Throttled events enriched with generated rules, checkpointed every 100 ms.
fn generated_enrich(parallelism: u32) -> String {
    format!(
        r#"
name = "enrich-rescale"
[[source]]
name = "events"
type = "generator"
shape = "events"
records = 20000
keys = 50
step_ms = 10
jitter_ms = 200
seed = 1
rate = 5000.0
timestamp = {{ field = 0 }}
out_of_orderness_ms = 200
[[source]]
name = "rules"
type = "generator"
shape = "events"
records = 100
keys = 50
step_ms = 1000
seed = 7
timestamp = {{ field = 0 }}
[[operator]]
name = "enrich"
plugin = "{ENRICH}"
parallelism = {parallelism}
inputs = [
  {{ from = "events", key_by = {{ field = 1 }} }},
  {{ from = "rules", broadcast = true }},
]
[sink]
type = "file"
path = "out/enriched.txt"
[checkpoint]
interval_ms = 100
dir = "checkpoints"
[runtime]
batch_size = 20
"#
    )
}

#[test]
fn broadcast_state_restores_at_another_parallelism() {
    let reference_dir = test_dir("enrich-rescale-reference");
    run_job(&write_job(&reference_dir, &generated_enrich(2))).unwrap();
    let reference = std::fs::read_to_string(reference_dir.join("out/enriched.txt")).unwrap();
    assert_eq!(reference.lines().count(), 20000);

    // Killed at parallelism 2 after a checkpoint (the rules, read at once, are in its
    // broadcast state: the finished rules source does not send them again), resumed at 3.
    let dir = test_dir("enrich-rescale");
    let job = write_job(&dir, &generated_enrich(2));
    kill_after_a_checkpoint(&dir, &job);
    let job = write_job(&dir, &generated_enrich(3));
    let out = spawn_sluice(&job, &["--from-checkpoint", "latest"])
        .wait_with_output()
        .unwrap();
    assert!(
        out.status.success(),
        "resuming at parallelism 3 failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let output = std::fs::read_to_string(dir.join("out/enriched.txt")).unwrap();
    assert_same_lines(
        &output,
        &sorted_lines(&reference),
        "the enrichment resumed at parallelism 3",
    );
}

/// The window job with its late records read by a second sink.
fn window_with_late_sink(source: &str, checkpoint: &str) -> String {
    format!(
        r#"
name = "late"
{source}
[[operator]]
name = "window"
plugin = "{WINDOW}"
parallelism = 2
key_by = {{ field = 1 }}
config = {{ kind = "tumbling", size-ms = 500, aggregate = "sum", allowed-lateness-ms = 100 }}
[[sink]]
name = "sums"
type = "file"
path = "out/counts.tsv"
format = "key-value"
[[sink]]
name = "late"
inputs = ["window.side:late"]
type = "file"
path = "out/late.tsv"
format = "key-value"
{checkpoint}
[runtime]
batch_size = 10
"#
    )
}

#[test]
fn late_records_reach_a_second_sink_through_the_side_output() {
    let events = mixed_events(3000, 5, 50, BOUND, 37, 7);
    let dir = test_dir("late-side-output");
    write_events(&dir, "events.csv", &events);
    let source = format!(
        "[source]\ntype = \"file\"\npath = \"events.csv\"\ntimestamp = {{ field = 0 }}\nout_of_orderness_ms = {BOUND}"
    );
    let report = run_job(&write_job(&dir, &window_with_late_sink(&source, ""))).unwrap();
    let want = expected(
        &events,
        BOUND,
        Kind::Tumbling { size: 500 },
        Aggregate::Sum,
        100,
    );
    let sums = std::fs::read_to_string(dir.join("out/counts.tsv")).unwrap();
    assert_same_lines(&sums, &want.lines, "window results");
    let late = std::fs::read_to_string(dir.join("out/late.tsv")).unwrap();
    assert_eq!(late.lines().count() as u64, want.dropped, "late records");
    assert!(want.dropped > 20, "too few late records: {}", want.dropped);
    let lines: std::collections::BTreeSet<String> = events.iter().map(Event::line).collect();
    for line in late.lines() {
        let (key, value) = line.split_once('\t').unwrap();
        assert!(
            lines.contains(value) && value.split(',').nth(1) == Some(key),
            "{line:?} is no input event of its key"
        );
    }
    let dropped: u64 = report
        .tasks
        .iter()
        .flat_map(|t| &t.operators)
        .filter_map(|o| o.counters.get(sluice::chain::SIDE_OUTPUT_DROPPED))
        .sum();
    assert_eq!(dropped, 0, "the side output is read: nothing is dropped");
}

#[test]
fn two_sinks_survive_sigkill_and_restore_exactly_once() {
    let seed = seed();
    let source = r#"[source]
type = "generator"
shape = "events"
records = 30000
keys = 40
step_ms = 10
jitter_ms = 1000
rate = 10000.0
timestamp = { field = 0 }
out_of_orderness_ms = 250"#;
    let checkpoint = "[checkpoint]\ninterval_ms = 100\ndir = \"checkpoints\"";
    let toml = window_with_late_sink(source, checkpoint);
    let files = ["out/counts.tsv", "out/late.tsv"];
    let reference_dir = test_dir("two-sinks-reference");
    run_job(&write_job(&reference_dir, &toml)).unwrap();
    let dir = test_dir("two-sinks-kill");
    let job = write_job(&dir, &toml);
    let (outputs, killed, _) = run_with_kills_writing(&dir, &job, 4, &mut Delays(seed), &files);
    assert!(
        killed >= 3,
        "only {killed} kills hit a running job (seed {seed})"
    );
    for (file, output) in files.iter().zip(&outputs) {
        let reference = std::fs::read_to_string(reference_dir.join(file)).unwrap();
        assert!(!reference.is_empty(), "{file} is empty");
        assert_same_lines(
            output,
            &sorted_lines(&reference),
            &format!("{file} after kills (seed {seed})"),
        );
    }
}

/// The error validating `toml` (written into a fresh directory) gives.
fn graph_error(name: &str, toml: &str) -> String {
    let dir = test_dir(name);
    let path = write_job(&dir, toml);
    let file = JobFile::load(&path).unwrap();
    format!("{:#}", JobGraph::from_file(&file, &path).unwrap_err())
}

const TWO_SOURCES: &str = r#"
name = "g"
[[source]]
name = "a"
type = "generator"
records = 10
[[source]]
name = "b"
type = "generator"
records = 10
"#;

#[test]
fn validation_names_cycles_unknown_inputs_unread_outputs_and_key_mismatches() {
    let op = |name: &str, inputs: &str, extra: &str| {
        format!(
            "[[operator]]\nname = \"{name}\"\nplugin = \"{TOKENIZE}\"\ninputs = {inputs}\n{extra}\n"
        )
    };
    let sink = "[sink]\ntype = \"stdout\"\ninputs = [\"y\"]\n";
    let cases = [
        (
            "cycle",
            format!(
                "{TWO_SOURCES}{}{}{}{sink}",
                op("x", r#"["a", "z"]"#, ""),
                op("z", r#"["x", "b"]"#, ""),
                op("y", r#"["z"]"#, "")
            ),
            "cycle: operator 'z' -> operator 'x' -> operator 'z'",
        ),
        (
            "unknown",
            format!("{TWO_SOURCES}{}{sink}", op("y", r#"["a", "nope"]"#, "")),
            "operator 'y': input 'nope' names no source or operator (there are: a, b, y)",
        ),
        (
            "unread",
            format!("{TWO_SOURCES}{}{sink}", op("y", r#"["a"]"#, "")),
            "source 'b': nothing reads its output",
        ),
        (
            "mismatch",
            format!(
                "{TWO_SOURCES}{}{sink}",
                op("y", r#"[{ from = "a", key_by = "value" }, "b"]"#, "")
            ),
            "operator 'y': input 'a' is keyed (`key_by`) but input 'b' is forward",
        ),
        (
            "side-of-source",
            format!("{TWO_SOURCES}{}{sink}", op("y", r#"["a", "b.side:x"]"#, "")),
            "input 'b.side:x': sources have no side outputs",
        ),
        (
            "sink-input",
            format!(
                "{TWO_SOURCES}{}{sink}[[operator]]\nname = \"w\"\nplugin = \"{TOKENIZE}\"\ninputs = [\"sink\"]\n",
                op("y", r#"["a", "b"]"#, "")
            ),
            "input 'sink' is a sink, and sinks have no output",
        ),
        (
            "broadcast-keyed",
            format!(
                "{TWO_SOURCES}{}{sink}",
                op(
                    "y",
                    r#"["a", { from = "b", broadcast = true, key_by = "value" }]"#,
                    ""
                )
            ),
            "input 'b' is broadcast; it takes no `key_by` or `partition`",
        ),
    ];
    for (name, toml, want) in cases {
        let error = graph_error(&format!("graph-{name}"), &toml);
        assert!(error.contains(want), "{name}: {error}");
    }
    // Two sinks writing one file: as written, through `..`, or as one subtask's file.
    let sinks = |one: &str, two: &str| {
        format!(
            "{TWO_SOURCES}{}[[sink]]\nname = \"s1\"\ntype = \"file\"\n{one}\n[[sink]]\nname = \"s2\"\ntype = \"file\"\n{two}\n",
            op("y", r#"["a", "b"]"#, "")
        )
    };
    for (name, one, two, want) in [
        (
            "same",
            "path = \"o.txt\"",
            "path = \"o.txt\"",
            "o.txt as sink 's1' does (o.txt)",
        ),
        (
            "dots",
            "path = \"o.txt\"",
            "path = \"x/../o.txt\"",
            "o.txt as sink 's1' does",
        ),
        (
            "subtask",
            "path = \"o.txt\"\nparallelism = 2",
            "path = \"o-1.txt\"",
            "o-1.txt as sink 's1' does (o-1.txt)",
        ),
    ] {
        let error = graph_error(&format!("graph-sink-{name}"), &sinks(one, two));
        assert!(
            error.contains(&format!("sink 's2' would write {want}")),
            "{name}: {error}"
        );
    }
    // Two exactly-once Kafka sinks with one transactional id prefix.
    let kafka_sink = |name: &str| {
        format!(
            "[[sink]]\nname = \"{name}\"\ntype = \"kafka\"\nbootstrap = \"127.0.0.1:9\"\n\
             topic = \"t\"\ntransactional_id_prefix = \"p\"\n"
        )
    };
    let two_kafka = format!(
        "{TWO_SOURCES}{}{}{}[checkpoint]\ninterval_ms = 100\n",
        op("y", r#"["a", "b"]"#, ""),
        kafka_sink("k1"),
        kafka_sink("k2")
    );
    let error = graph_error("graph-sink-prefix", &two_kafka);
    assert!(
        error.contains("sink 'k2': sink 'k1' has the same `transactional_id_prefix`"),
        "{error}"
    );
    // A first operator without `inputs` reads the sources nobody names.
    let first = format!(
        "{TWO_SOURCES}[[operator]]\nname = \"x\"\nplugin = \"{TOKENIZE}\"\n{}{sink}",
        op("y", r#"["x", "b"]"#, "")
    );
    let dir = test_dir("graph-first-default");
    let path = write_job(&dir, &first);
    let graph = JobGraph::from_file(&JobFile::load(&path).unwrap(), &path).unwrap();
    let x_reads: Vec<&str> = graph
        .edges
        .iter()
        .filter(|e| graph.vertices[e.to].name() == "x")
        .map(|e| graph.vertices[e.from].name())
        .collect();
    assert_eq!(x_reads, ["a"], "`b` is named by y: x reads only `a`");

    // Own state is broadcast state (copied on rescale) beside keyed inputs only.
    let broadcast_beside = |other: &str| {
        let toml = format!(
            "{TWO_SOURCES}{}{sink}",
            op(
                "y",
                &format!(r#"[{other}, {{ from = "b", broadcast = true }}]"#),
                ""
            )
        );
        let dir = test_dir("graph-broadcast-state");
        let path = write_job(&dir, &toml);
        let graph = JobGraph::from_file(&JobFile::load(&path).unwrap(), &path).unwrap();
        let y = graph.vertices.iter().position(|v| v.name() == "y").unwrap();
        graph.has_broadcast_state(y)
    };
    assert!(broadcast_beside(r#"{ from = "a", key_by = "value" }"#));
    assert!(!broadcast_beside(
        r#"{ from = "a", partition = "rebalance" }"#
    ));
}

#[test]
fn a_straight_list_is_still_a_chain_and_a_fan_out_ends_one() {
    let dir = test_dir("graph-chains");
    let straight = format!(
        r#"
name = "g"
[source]
type = "generator"
records = 10
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
[[operator]]
name = "count"
plugin = "{COUNT}"
key_by = "key"
[sink]
type = "stdout"
"#
    );
    let path = write_job(&dir, &straight);
    let graph = JobGraph::from_file(&JobFile::load(&path).unwrap(), &path).unwrap();
    let names: Vec<String> = graph.chains.iter().map(|c| c.name(&graph)).collect();
    assert_eq!(names, ["source -> tokenize", "count -> sink"]);

    // `tokenize` read by two sinks: its task ends with it, each sink a task of its own.
    let fan_out = format!(
        r#"
name = "g"
[source]
type = "generator"
records = 10
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
[[sink]]
name = "one"
type = "stdout"
[[sink]]
name = "two"
type = "stdout"
"#
    );
    let path = write_job(&dir, &fan_out);
    let graph = JobGraph::from_file(&JobFile::load(&path).unwrap(), &path).unwrap();
    let names: Vec<String> = graph.chains.iter().map(|c| c.name(&graph)).collect();
    assert_eq!(names, ["source -> tokenize", "one", "two"]);
}

#[test]
fn reading_a_side_output_the_operator_never_declares_is_refused_before_running() {
    let dir = test_dir("graph-undeclared-side");
    std::fs::write(dir.join("events.csv"), "1,k,1\n").unwrap();
    let toml = format!(
        r#"
name = "g"
[source]
type = "file"
path = "events.csv"
timestamp = {{ field = 0 }}
[[operator]]
name = "window"
plugin = "{WINDOW}"
key_by = {{ field = 1 }}
config = {{ kind = "tumbling", size-ms = 10 }}
[[sink]]
name = "main"
type = "stdout"
[[sink]]
name = "typo"
inputs = ["window.side:lat"]
type = "stdout"
"#
    );
    let job = TestJob::load(&write_job(&dir, &toml)).unwrap();
    let error = format!("{:#}", job.job.check_open().unwrap_err());
    assert!(
        error.contains("window") && error.contains("side output 'lat', but it declared 'late'"),
        "{error}"
    );
    // And a run fails with the same words, at once (a configuration error is not retried).
    let error = format!("{:#}", run_job(&write_job(&dir, &toml)).unwrap_err());
    assert!(error.contains("side output 'lat'"), "{error}");
}
