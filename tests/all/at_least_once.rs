//! At-least-once checkpoints under skew: a task whose input channels deliver barriers
//! far apart, with several checkpoints in flight.

use std::collections::BTreeMap;

use sluice::connectors::generated_line;
use sluice::job::JobOutcome;
use sluice_tests::plugins::{COUNT, TEST_MISBEHAVE};
use sluice_tests::{final_counts, run_job, test_dir, write_job};

const BULK_RECORDS: u64 = 400;
const TRICKLE_RECORDS: u64 = 80;
const VOCABULARY: u64 = 50;

/// Counts of the one-word records a generator with `seed` produces, over all its subtasks.
fn count_generated(seed: u64, records: u64, counts: &mut BTreeMap<String, u64>) {
    let mut word = String::new();
    for index in 0..records {
        generated_line(seed, index, 1, VOCABULARY, &mut word);
        *counts.entry(word.clone()).or_insert(0) += 1;
    }
}

#[test]
fn lagging_inputs_with_concurrent_checkpoints_finish_with_the_exact_output() {
    // The slow operator unites an unthrottled source, whose channel stays full so that its
    // barriers queue behind tens of milliseconds of records, with a throttled source at
    // parallelism 2, whose barriers get through at once: three input channels, two
    // checkpoints in flight, barriers a checkpoint or more apart.
    let dir = test_dir("at-least-once");
    let job = write_job(
        &dir,
        &format!(
            r#"
name = "at-least-once"
[[source]]
name = "bulk"
type = "generator"
records = {BULK_RECORDS}
words_per_record = 1
vocabulary = {VOCABULARY}
seed = 1
[[source]]
name = "trickle"
type = "generator"
records = {TRICKLE_RECORDS}
words_per_record = 1
vocabulary = {VOCABULARY}
seed = 2
rate = 100.0
parallelism = 2
[[operator]]
name = "slow"
plugin = "{TEST_MISBEHAVE}"
config = {{ behavior = "slow-process", delay-ms = 1 }}
[[operator]]
name = "count"
plugin = "{COUNT}"
key_by = "value"
[sink]
type = "file"
path = "out/counts.tsv"
format = "key-value"
[checkpoint]
interval_ms = 10
mode = "at-least-once"
max_concurrent = 2
[restart]
strategy = "none"
[runtime]                   # small batches and buffers: sources see checkpoint mails
buffer_bytes = 64           # between batches, and a full channel holds tens of records
channel_capacity = 4
buffer_timeout_ms = 10
batch_size = 10
"#
        ),
    );
    let report = run_job(&job).unwrap();
    assert_eq!(report.outcome, JobOutcome::Finished);
    assert_eq!(report.restarts, 0, "failures: {:?}", report.failures);
    let completed = report.checkpoints.completed.len();
    assert!(
        completed >= 3,
        "only {completed} checkpoints completed; aborted: {:?}",
        report.checkpoints.aborted
    );

    // Without a failure, at least once is exactly once: every word counted 1, 2, ..., n.
    let mut expected = BTreeMap::new();
    count_generated(1, BULK_RECORDS, &mut expected);
    count_generated(2, TRICKLE_RECORDS, &mut expected);
    let output = std::fs::read_to_string(dir.join("out/counts.tsv")).unwrap();
    assert_eq!(final_counts(&output).unwrap(), expected);
}
