//! Plugins built for WIT 0.1.0 and 0.2.0 (`tests/fixtures/wit-0.1.0/`, `wit-0.2.0/`) run
//! unchanged beside those of 0.3.0, with the same results.

use sluice::job::JobOutcome;
use sluice_tests::plugins::{COUNT, TOKENIZE};
use sluice_tests::windows::{Aggregate, Kind, expected_in_batches, mixed_events};
use sluice_tests::{
    compat_plugin, compat_v2_plugin, engine, expected_word_counts, final_counts, run_job,
    sample_text, test_dir, write_job,
};

use crate::event_time::{check_job, window_job_with};

fn wordcount_job(tokenize: &str, count: &str) -> String {
    format!(
        r#"
name = "wordcount"
[source]
type = "file"
path = "input.txt"
[[operator]]
name = "tokenize"
plugin = "{tokenize}"
config = {{ min-length = 2 }}
[[operator]]
name = "count"
plugin = "{count}"
parallelism = 2
key_by = "key"
[sink]
type = "file"
path = "counts.tsv"
format = "key-value"
"#
    )
}

#[test]
fn plugins_of_both_versions_load_with_their_version() {
    let old =
        sluice::wasm::Plugin::load(&engine(), compat_plugin("count").as_ref(), false).unwrap();
    assert_eq!(old.info.interface, "sluice:operator/stream-operator@0.1.0");
    assert!(
        old.info
            .imports
            .iter()
            .any(|i| i == "sluice:operator/runtime@0.1.0")
    );
    let v2 =
        sluice::wasm::Plugin::load(&engine(), compat_v2_plugin("count").as_ref(), false).unwrap();
    assert_eq!(v2.info.interface, "sluice:operator/stream-operator@0.2.0");
    let new = sluice::wasm::Plugin::load(&engine(), COUNT.as_ref(), false).unwrap();
    assert_eq!(new.info.interface, "sluice:operator/stream-operator@0.3.0");
}

#[test]
fn word_count_is_the_same_with_old_new_and_mixed_plugins() {
    let text = sample_text(5, 2000);
    let expected = expected_word_counts(&text, 2);
    let (old_tokenize, old_count) = (compat_plugin("tokenize"), compat_plugin("count"));
    let (v2_tokenize, v2_count) = (compat_v2_plugin("tokenize"), compat_v2_plugin("count"));
    for (tokenize, count) in [
        (old_tokenize.as_str(), old_count.as_str()),
        (old_tokenize.as_str(), COUNT),
        (TOKENIZE, old_count.as_str()),
        (v2_tokenize.as_str(), v2_count.as_str()),
        (v2_tokenize.as_str(), COUNT),
        (TOKENIZE, v2_count.as_str()),
        (old_tokenize.as_str(), v2_count.as_str()),
    ] {
        let dir = test_dir("compat-wordcount");
        std::fs::write(dir.join("input.txt"), &text).unwrap();
        let report = run_job(&write_job(&dir, &wordcount_job(tokenize, count))).unwrap();
        assert_eq!(report.outcome, JobOutcome::Finished);
        let output = std::fs::read_to_string(dir.join("counts.tsv")).unwrap();
        assert_eq!(
            final_counts(&output).unwrap(),
            expected,
            "{tokenize} {count}"
        );
    }
}

#[test]
fn an_old_window_gives_the_model_s_windows_record_by_record() {
    // A 0.1.0 operator gets a batch's watermarks after it: exact with batches of one
    // record, as before 0.2.0; the windows of a 0.2.0 filter chained before it too.
    let events = mixed_events(1500, 4, 50, 1000, 17, 9);
    let window = compat_plugin("window");
    let (kind, lateness) = (Kind::Tumbling { size: 4_000 }, 1_000);
    let config = format!(
        r#"kind = "tumbling", size-ms = 4000, aggregate = "sum", allowed-lateness-ms = {lateness}"#
    );
    for (parallelism, filter_first) in [(1, false), (2, true)] {
        let job = window_job_with(&config, parallelism, 1, &window, filter_first);
        let want = check_job(
            "compat-window",
            &events,
            &job,
            (kind, Aggregate::Sum, lateness),
        );
        assert!(want.dropped > 0 && !want.lines.is_empty());
    }
}

#[test]
fn an_old_window_judges_a_batch_against_the_watermark_before_it_as_before() {
    // What 0.1.0 operators always did: the watermark after each source batch of 16.
    let events = mixed_events(2000, 4, 50, 1000, 13, 4);
    let window = compat_plugin("window");
    let config =
        r#"kind = "tumbling", size-ms = 4000, aggregate = "count", allowed-lateness-ms = 0"#;
    let dir = test_dir("compat-window-batches");
    let text: String = events.iter().map(|e| e.line() + "\n").collect();
    std::fs::write(dir.join("events.csv"), text).unwrap();
    let job = window_job_with(config, 1, 16, &window, false);
    run_job(&write_job(&dir, &job)).unwrap();
    let mut got: Vec<String> = std::fs::read_to_string(dir.join("out.tsv"))
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    got.sort();
    let (kind, aggregate) = (Kind::Tumbling { size: 4_000 }, Aggregate::Count);
    let want = expected_in_batches(&events, 16, 1000, kind, aggregate, 0);
    assert_eq!(got, want.lines);
    // ... which differs from record by record here: the test tells the two apart.
    let exact = sluice_tests::windows::expected(&events, 1000, kind, aggregate, 0);
    assert_ne!(want.lines, exact.lines);
}

#[test]
fn a_0_2_0_window_gives_the_model_s_windows_at_any_batch_size() {
    // 0.2.0 operators take a batch's watermarks inside it, as 0.3.0 ones do.
    let events = mixed_events(1500, 4, 50, 1000, 17, 9);
    let window = compat_v2_plugin("window");
    let (kind, lateness) = (Kind::Tumbling { size: 4_000 }, 1_000);
    let config = format!(
        r#"kind = "tumbling", size-ms = 4000, aggregate = "sum", allowed-lateness-ms = {lateness}"#
    );
    for (parallelism, batch, filter_first) in [(1, 64, false), (2, 16, true)] {
        let job = window_job_with(&config, parallelism, batch, &window, filter_first);
        let want = check_job(
            "compat-v2-window",
            &events,
            &job,
            (kind, Aggregate::Sum, lateness),
        );
        assert!(want.dropped > 0 && !want.lines.is_empty());
    }
}
