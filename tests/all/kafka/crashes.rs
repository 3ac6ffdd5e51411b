//! Kafka to Kafka through crashes: at the exactly-once sink's commit points, resumed at
//! another parallelism (with the rescale hand-over cut part way), and a transaction that
//! fails before its commit.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;

use sluice_tests::kafka::{broker, create_topic, read_committed, unique_topic};
use sluice_tests::plugins::{COUNT, TEST_MISBEHAVE, TOKENIZE};
use sluice_tests::{
    expected_word_counts, has_complete_checkpoint, read_sink_output, sample_text, sluice_run,
    test_dir, write_job,
};

use super::{
    as_count_lines, assert_counts, kill_after_a_checkpoint_and_resume, topic_of_lines,
    word_count_from_topic, word_count_to_topic,
};
use crate::failpoints::run;

/// A word count from a topic to a topic, source, operators and sink at parallelism 4,
/// with checkpoints every 20 ms and `count` slowed so they come while it runs.
pub(super) fn topic_to_topic(
    dir: &Path,
    broker: &str,
    input: &str,
    output: &str,
) -> std::path::PathBuf {
    write_job(
        dir,
        &format!(
            r#"
name = "topic-to-topic"
[source]
type = "kafka"
bootstrap = "{broker}"
topics = "{input}"
bounded = true
parallelism = 4
[[operator]]
name = "slow"
plugin = "{TEST_MISBEHAVE}"
config = {{ behavior = "slow-process", delay-ms = 1 }}
parallelism = 4
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
parallelism = 4
[[operator]]
name = "count"
plugin = "{COUNT}"
key_by = "key"
parallelism = 4
[sink]
type = "kafka"
bootstrap = "{broker}"
topic = "{output}"
transactional_id_prefix = "{output}"
parallelism = 4
[checkpoint]
interval_ms = 20
dir = "checkpoints"
[runtime]
batch_size = 20
buffer_timeout_ms = 5
"#
        ),
    )
}

/// Crashes the word count from topic to topic at `point` (on its `skip + 1`-th pass),
/// resumes it from the latest checkpoint, and checks the committed output topic.
fn crash_topic_to_topic_at(point: &str, skip: u32) {
    crash_and_resume_at(point, skip, None);
}

/// [`crash_topic_to_topic_at`], resuming with the sink (and `count`) at `parallelism`
/// when given.
pub(super) fn crash_and_resume_at(point: &str, skip: u32, parallelism: Option<u32>) {
    crash_resume_and_hand_over(point, skip, parallelism, false);
}

/// [`crash_and_resume_at`]; with `crash_in_hand_over`, the resumed run is crashed too,
/// right after the first transaction it commits (the new subtasks write the pending
/// checkpoints of the old ones as they open, one transaction each), and resumed again.
fn crash_resume_and_hand_over(
    point: &str,
    skip: u32,
    parallelism: Option<u32>,
    crash_in_hand_over: bool,
) {
    let Some(broker) = broker() else { return };
    let (input, text) = topic_of_lines(&broker, "in", 4, 24, 1_200);
    let output = unique_topic("out");
    create_topic(&broker, &output, 4);
    let dir = test_dir(&format!("kafka-crash-{}", point.replace("::", "-")));
    let job = topic_to_topic(&dir, &broker, &input, &output);
    let out = run(
        &job,
        &[],
        Some(&format!("{point}={skip}*off->return(abort)")),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains(&format!("failpoint {point}")),
        "the process did not crash at {point}: {stderr}"
    );
    assert!(has_complete_checkpoint(&dir.join("checkpoints")));
    if let Some(p) = parallelism {
        let text = std::fs::read_to_string(&job).unwrap();
        let rescaled = text
            .replace(
                &format!("transactional_id_prefix = \"{output}\"\nparallelism = 4"),
                &format!("transactional_id_prefix = \"{output}\"\nparallelism = {p}"),
            )
            .replace(
                "key_by = \"key\"\nparallelism = 4",
                &format!("key_by = \"key\"\nparallelism = {}", p + 1),
            );
        assert_ne!(rescaled, text);
        std::fs::write(&job, rescaled).unwrap();
    }
    if crash_in_hand_over {
        let out = run(
            &job,
            &["--from-checkpoint", "latest"],
            Some("kafka-sink::after-commit=return(abort)"),
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains("failpoint kafka-sink::after-commit"),
            "the resumed run did not crash in the hand-over: {stderr}"
        );
    }
    let out = sluice_run(
        env!("CARGO_BIN_EXE_sluice-test-cli"),
        &job,
        Some(&dir.join("checkpoints")),
    )
    .stderr(Stdio::piped())
    .output()
    .unwrap();
    assert!(
        out.status.success(),
        "the resumed run failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_counts(&as_count_lines(&read_committed(&broker, &output)), &text);
}

/// Killed with a checkpoint's records in an open transaction: the restarted subtask's
/// `init_transactions` aborts it, and its marker says the checkpoint is not written, so
/// it writes the records again.
#[test]
fn a_crash_before_the_kafka_transaction_commits() {
    crash_topic_to_topic_at("kafka-sink::before-commit", 3);
}

/// Killed right after a commit: the checkpoint restored still lists those records as
/// pending, and the marker committed with them says they are written.
#[test]
fn a_crash_after_the_kafka_transaction_commits() {
    crash_topic_to_topic_at("kafka-sink::after-commit", 3);
}

/// An exactly-once sink resumes at another parallelism: each new subtask takes over the
/// pending checkpoints of old ones (`old % new`), fences their producers and writes what
/// their markers do not cover — killed with a transaction open, and right after one
/// committed, from 4 sink subtasks to 2 and to 5: every count exactly once.
#[test]
fn an_exactly_once_kafka_sink_resumes_at_another_parallelism() {
    crash_and_resume_at("kafka-sink::before-commit", 3, Some(2));
    crash_and_resume_at("kafka-sink::after-commit", 3, Some(2));
    crash_and_resume_at("kafka-sink::after-commit", 2, Some(5));
}

/// Killed again part-way through the hand-over of a rescale (from 4 sink subtasks to 2
/// and to 5), after the first of the transactions in which the new subtasks write the
/// old ones' pending checkpoints: resumed once more, every count exactly once.
#[test]
fn a_crash_part_way_through_an_exactly_once_sinks_rescale_hand_over() {
    crash_resume_and_hand_over("kafka-sink::before-commit", 3, Some(2), true);
    crash_resume_and_hand_over("kafka-sink::before-commit", 2, Some(5), true);
}

/// An at-least-once sink (whose checkpoints hold no records) resumes at another
/// parallelism too: killed after a checkpoint at 2 sink subtasks, resumed at 1, every word
/// reaches its count (records since the checkpoint may come twice).
#[test]
fn an_at_least_once_kafka_sink_resumes_at_another_parallelism() {
    let Some(broker) = broker() else { return };
    let output = unique_topic("al-rescale");
    create_topic(&broker, &output, 2);
    let dir = test_dir("kafka-al-rescale");
    let text = sample_text(31, 3_000);
    let job = |parallelism: u32| {
        let more = format!(
            "delivery = \"at-least-once\"\nparallelism = {parallelism}\n\
             [checkpoint]\ninterval_ms = 20\ndir = \"checkpoints\""
        );
        word_count_to_topic(&dir, &broker, &output, &text, 1, &more)
    };
    kill_after_a_checkpoint_and_resume(&dir, job, 2, 1);
    // At least once: each word's highest running count is its total.
    let mut highest = BTreeMap::<String, u64>::new();
    for r in read_committed(&broker, &output) {
        let count: u64 = r.value.parse().unwrap();
        let e = highest.entry(r.key.unwrap_or_default()).or_default();
        *e = (*e).max(count);
    }
    assert_eq!(highest, expected_word_counts(&text, 1));
}

/// A Kafka source resumes at another parallelism: its subtasks' offsets are merged and
/// each new subtask takes the partitions it now owns. Killed at parallelism 2 after a
/// checkpoint, resumed at 3: every word counted exactly once.
#[test]
fn a_kafka_source_resumes_at_another_parallelism() {
    let Some(broker) = broker() else { return };
    let (topic, text) = topic_of_lines(&broker, "rescale", 6, 25, 4_000);
    let dir = test_dir("kafka-rescale");
    let job = |parallelism| word_count_from_topic(&dir, &broker, &topic, parallelism);
    kill_after_a_checkpoint_and_resume(&dir, job, 2, 3);
    assert_counts(&read_sink_output(&dir.join("out/counts.tsv"), 1), &text);
}

/// A transaction that fails before its commit is aborted at once (not left open to hold
/// back `read_committed` readers), counted, and its records written again after the
/// job's restart: the committed output is exact.
#[test]
fn a_failed_kafka_transaction_is_aborted_and_written_again() {
    let Some(broker) = broker() else { return };
    let (input, text) = topic_of_lines(&broker, "in", 4, 25, 600);
    let output = unique_topic("out");
    create_topic(&broker, &output, 4);
    let dir = test_dir("kafka-abort");
    let job = topic_to_topic(&dir, &broker, &input, &output);
    let out = sluice_run(env!("CARGO_BIN_EXE_sluice-test-cli"), &job, None)
        .args(["--log", "info"])
        .env(
            "FAILPOINTS",
            "kafka-sink::before-commit=3*off->1*return(broken)",
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("failpoint kafka-sink::before-commit: broken"),
        "{stderr}"
    );
    assert!(stderr.contains(": transaction aborted"), "{stderr}");
    assert_counts(&as_count_lines(&read_committed(&broker, &output)), &text);
}
