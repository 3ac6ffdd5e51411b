//! Operators written in Python and JavaScript (`plugins-python/`, `plugins-js/`, built
//! with their SDKs into components): in jobs, against independent computations and the
//! Rust plugins; a Rust `count`'s checkpoint restored by the Python and JavaScript
//! `count`s and the other way round; an exception reaching the job's error with its
//! traceback or stack; the first compile of a large component announced.

use crate::checkpoints::{kill_after_a_checkpoint, sorted_lines, spawn_sluice};
use crate::cli::{outcome, sluice_with_cache};
use crate::graphs::assert_same_lines;
use sluice_tests::plugins::{COUNT, TOKENIZE, WINDOW};
use sluice_tests::windows::{Event, mixed_events};
use sluice_tests::{
    Language, expected_word_counts, final_counts, run_job, sample_text, test_dir,
    throttled_wordcount, write_job,
};

#[test]
fn upper_filter_and_count_give_what_an_independent_count_gives() {
    for language in Language::ALL {
        guest_wordcount(language);
    }
}

fn guest_wordcount(language: Language) {
    let (Some(upper), Some(filter), Some(count)) = (
        language.plugin("upper"),
        language.plugin("filter"),
        language.plugin("count"),
    ) else {
        return;
    };
    let dir = test_dir(&format!("{}-wordcount", language.name()));
    let text = sample_text(11, 400);
    std::fs::write(dir.join("input.txt"), &text).unwrap();
    // Upper-cased lines, the words of at least 3 characters, counted by a Python count
    // at parallelism 2 with checkpoints.
    let job = format!(
        r#"
name = "guest-wordcount"
[source]
type = "file"
path = "input.txt"
[[operator]]
name = "upper"
plugin = "{upper}"
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
config = {{ min-length = 3 }}
[[operator]]
name = "keep"
plugin = "{filter}"
config = {{ min-length = 3 }}
[[operator]]
name = "count"
plugin = "{count}"
key_by = "key"
parallelism = 2
[sink]
type = "file"
path = "out.tsv"
format = "key-value"
[checkpoint]
interval_ms = 50
"#
    );
    run_job(&write_job(&dir, &job)).unwrap();
    let output = std::fs::read_to_string(dir.join("out.tsv")).unwrap();
    let counts = sluice_tests::final_counts_any_order(&output).unwrap();
    // Upper-casing is Unicode's (ß becomes SS, as in Rust's `to_uppercase`); tokenize
    // then lowercases.
    assert_eq!(
        counts,
        expected_word_counts(&text.to_uppercase(), 3),
        "{language:?}"
    );
}

/// Runs the throttled word count with `first` as its count plugin, kills it after a
/// checkpoint, and resumes it with `second`: the counts go on from the checkpoint.
fn swap_count_plugin(name: &str, first: &str, second: &str) {
    let reference_dir = test_dir(&format!("{name}-reference"));
    run_job(&write_job(
        &reference_dir,
        &throttled_wordcount(2, 6000, 3000.0),
    ))
    .unwrap();
    let reference = std::fs::read_to_string(reference_dir.join("out/counts.tsv")).unwrap();

    let dir = test_dir(name);
    let toml = throttled_wordcount(2, 6000, 3000.0);
    let job = write_job(&dir, &toml.replace(COUNT, first));
    kill_after_a_checkpoint(&dir, &job);
    let job = write_job(&dir, &toml.replace(COUNT, second));
    let out = spawn_sluice(&job, &["--from-checkpoint", "latest"])
        .wait_with_output()
        .unwrap();
    assert!(
        out.status.success(),
        "resuming with the other count failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let output = std::fs::read_to_string(dir.join("out/counts.tsv")).unwrap();
    // Every word's counts go up by one from line to line, across the swap: the second
    // plugin read the first one's counts (a fresh count would start again at 1).
    assert_eq!(
        final_counts(&output).unwrap(),
        final_counts(&reference).unwrap(),
        "{name}"
    );
}

#[test]
fn batch_counts_and_filters_give_the_per_record_results_through_a_restore() {
    for language in Language::ALL {
        batch_count_and_filter(language);
    }
}

fn batch_count_and_filter(language: Language) {
    let (Some(count), Some(filter)) = (
        language.plugin("count_batch"),
        language.plugin("filter_batch"),
    ) else {
        return;
    };
    let name = language.name();
    // Running counts, as the Rust `count` gives them, killed after a checkpoint and
    // resumed: records cross in columns (`sluice:operator@0.3.0`), state is read and
    // written a batch at a time.
    swap_count_plugin(&format!("{name}-batch-count"), &count, &count);
    // The words with a "t" of an upper-cased text, kept by the batch filter: what the
    // per-record Rust filter keeps.
    let text = sample_text(13, 300);
    let job = |plugin: &str| {
        format!(
            r#"
name = "batch-filter"
[source]
type = "file"
path = "input.txt"
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
[[operator]]
name = "keep"
plugin = "{plugin}"
config = {{ contains = "t" }}
[sink]
type = "file"
path = "out.txt"
"#
        )
    };
    let output = |plugin: &str| {
        let dir = test_dir(&format!("{name}-batch-filter"));
        std::fs::write(dir.join("input.txt"), &text).unwrap();
        run_job(&write_job(&dir, &job(plugin))).unwrap();
        std::fs::read_to_string(dir.join("out.txt")).unwrap()
    };
    let (got, want) = (output(&filter), output(sluice_tests::plugins::FILTER));
    assert!(!want.is_empty());
    assert!(want.lines().all(|w| w.contains('t')), "{want}");
    assert_eq!(sorted_lines(&got), sorted_lines(&want));
}

#[test]
fn python_and_javascript_counts_restore_a_rust_counts_checkpoint_and_the_other_way_round() {
    let (Some(python), Some(js)) = (
        Language::Python.plugin("count"),
        Language::JavaScript.plugin("count"),
    ) else {
        return;
    };
    swap_count_plugin("rust-to-python-count", COUNT, &python);
    swap_count_plugin("python-to-js-count", &python, &js);
    swap_count_plugin("js-to-rust-count", &js, COUNT);
}

#[test]
fn tumbling_windows_give_the_rust_windows_and_send_late_records_aside() {
    let (Some(python), Some(js)) = (
        Language::Python.plugin("tumbling"),
        Language::JavaScript.plugin("tumbling"),
    ) else {
        return;
    };
    let events = mixed_events(3000, 8, 50, 1000, 37, 7);
    let run = |name: &str, plugin: &str, config: &str| {
        let dir = test_dir(name);
        let text: String = events.iter().map(|e| Event::line(e) + "\n").collect();
        std::fs::write(dir.join("events.csv"), text).unwrap();
        let job = format!(
            r#"
name = "{name}"
[source]
type = "file"
path = "events.csv"
timestamp = {{ field = 0 }}
out_of_orderness_ms = 1000
[[operator]]
name = "window"
plugin = "{plugin}"
parallelism = 2
key_by = {{ field = 1 }}
config = {{ {config} }}
[[sink]]
name = "sums"
type = "file"
path = "out.tsv"
format = "key-value"
[[sink]]
name = "late"
inputs = ["window.side:late"]
type = "file"
path = "late.tsv"
format = "key-value"
[runtime]
batch_size = 64
"#
        );
        run_job(&write_job(&dir, &job)).unwrap();
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap();
        (read("out.tsv"), read("late.tsv"))
    };
    let (rust_sums, rust_late) = run(
        "rust-tumbling",
        WINDOW,
        r#"kind = "tumbling", size-ms = 500, aggregate = "sum""#,
    );
    assert!(sorted_lines(&rust_sums).len() > 100);
    assert!(!rust_late.is_empty(), "the input has late records");
    for (name, plugin) in [("python-tumbling", python), ("js-tumbling", js)] {
        let (sums, late) = run(name, &plugin, "size-ms = 500");
        assert_same_lines(&sums, &sorted_lines(&rust_sums), &format!("{name}: sums"));
        assert_same_lines(&late, &sorted_lines(&rust_late), &format!("{name}: late"));
    }
}

#[test]
fn an_exception_reaches_the_jobs_error_with_its_traceback_or_stack() {
    for language in Language::ALL {
        guest_exception(language);
    }
}

fn guest_exception(language: Language) {
    let Some(tumbling) = language.plugin("tumbling") else {
        return;
    };
    let dir = test_dir(&format!("{}-traceback", language.name()));
    std::fs::write(dir.join("events.csv"), "1,k,1\n").unwrap();
    // No `timestamp` on the source: the operator raises.
    let job = format!(
        r#"
name = "traceback"
[source]
type = "file"
path = "events.csv"
[[operator]]
name = "window"
plugin = "{tumbling}"
key_by = {{ field = 1 }}
[sink]
type = "stdout"
"#
    );
    let error = format!("{:#}", run_job(&write_job(&dir, &job)).unwrap_err());
    let (raised, trace) = match language {
        Language::Python => (
            "raised ValueError: the record has no event time",
            "Traceback (most recent call last)",
        ),
        Language::JavaScript => ("threw Error: the record has no event time", "process@"),
    };
    assert!(
        error.contains("window") && error.contains(raised) && error.contains(trace),
        "{language:?}: {error}"
    );
    // A configuration it refuses: the job fails at once, naming the key.
    let bad = job
        .replace(
            "key_by = { field = 1 }",
            "key_by = { field = 1 }\nconfig = { size = 5 }",
        )
        .replace("[source]\n", "[source]\ntimestamp = { field = 0 }\n");
    let error = format!("{:#}", run_job(&write_job(&dir, &bad)).unwrap_err());
    assert!(
        error.contains("unknown config key `size`"),
        "{language:?}: {error}"
    );
}

#[test]
fn the_first_compile_of_a_large_component_says_so_and_the_next_load_does_not() {
    let Some(upper) = Language::Python.plugin("upper") else {
        return;
    };
    let dir = test_dir("python-compile-notice");
    let cache = dir.join("cache");
    let (code, _, first) = outcome(&sluice_with_cache(&["inspect", &upper], &cache));
    assert_eq!(code, Some(0), "{first}");
    assert!(
        first.contains("for the first time; later runs load it from the cache")
            && first.contains("compiled ")
            && first.contains("upper.wasm"),
        "{first}"
    );
    let (code, _, second) = outcome(&sluice_with_cache(&["inspect", &upper], &cache));
    assert_eq!(code, Some(0), "{second}");
    assert!(!second.contains("compiling"), "{second}");
}
