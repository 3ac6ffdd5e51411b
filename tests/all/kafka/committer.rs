//! The exactly-once sink's committer thread: records sent into a transaction ahead of
//! their checkpoint's completion, killed there; and a checkpoint that fails with its
//! records in the open transaction.

use std::process::Stdio;

use sluice_tests::kafka::{broker, create_topic, read_committed, unique_topic};
use sluice_tests::{sluice_run, test_dir};

use super::crashes::{crash_and_resume_at, topic_to_topic};
use super::{as_count_lines, assert_counts, topic_of_lines};

/// Killed with a checkpoint's records sent into the open transaction before the
/// checkpoint completed: the restarted subtask's `init_transactions` aborts it, and the
/// records come again from the sources (the checkpoint restored is older) — resumed at
/// the same parallelism and at another: every count exactly once.
#[test]
fn a_crash_with_records_sent_ahead_of_their_checkpoint() {
    crash_and_resume_at("kafka-sink::sent-ahead", 3, None);
    crash_and_resume_at("kafka-sink::sent-ahead", 5, Some(2));
}

/// Checkpoints that fail (a full disk while tasks write their state: twice, and twice
/// again a little later) with their records already in the sink's open transaction: the
/// transaction is aborted and the records go into the next one, which commits with the
/// next checkpoint that completes. The job finishes by itself with every count exactly
/// once.
#[test]
fn a_failed_checkpoint_aborts_the_transaction_its_records_were_sent_in() {
    let Some(broker) = broker() else { return };
    let (input, text) = topic_of_lines(&broker, "in", 4, 24, 1_200);
    let output = unique_topic("out");
    create_topic(&broker, &output, 4);
    let dir = test_dir("kafka-aborted-checkpoint");
    let job = topic_to_topic(&dir, &broker, &input, &output);
    let out = sluice_run(env!("CARGO_BIN_EXE_sluice-test-cli"), &job, None)
        .arg("--json")
        .env(
            "FAILPOINTS",
            "checkpoint::write-state=40*off->2*return(enospc)->20*off->2*return(enospc)->off",
        )
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a summary");
    let run = &summary["jobs"][0];
    assert!(
        run["checkpoints"]["aborted"].as_u64() > Some(0),
        "no checkpoint failed: {run:#}"
    );
    let aborted: u64 = run["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["operators"].as_array().unwrap())
        .filter(|op| op["operator"] == "sink")
        .filter_map(|op| op["counters"]["kafka-transactions-aborted"].as_u64())
        .sum();
    assert!(aborted > 0, "no transaction aborted: {run:#}");
    assert_counts(&as_count_lines(&read_committed(&broker, &output)), &text);
}
