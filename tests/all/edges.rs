//! Exactly-once at the edges: paths that random kills rarely reach. Each test is named
//! after the promise it keeps, and fails without the code that keeps it.

use std::collections::BTreeMap;
use std::fs;
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::unbounded;
use sluice::connectors::generated_line;
use sluice::job::{JobControl, JobOutcome, RestorePoint};
use sluice_tests::plugins::{TEST_MISBEHAVE, TEST_RECORDER};
use sluice_tests::{
    TestJob, expected_word_counts, final_counts, has_complete_checkpoint, test_dir,
    throttled_wordcount, write_job,
};

use crate::checkpoints::spawn_sluice;
use crate::cli::{outcome, sluice};

/// The counts of `throttled_wordcount`'s generator over `records` lines.
fn throttled_counts(records: u64) -> BTreeMap<String, u64> {
    let mut text = String::new();
    let mut line = String::new();
    for index in 0..records {
        generated_line(5, index, 6, 300, &mut line);
        text.push_str(&line);
        text.push('\n');
    }
    expected_word_counts(&text, 1)
}

#[test]
fn a_second_run_of_a_running_job_is_refused_and_the_first_ends_as_if_alone() {
    let dir = test_dir("edges-two-runs");
    let records = 3000;
    let job = write_job(&dir, &throttled_wordcount(2, records, 1500.0));
    let mut first = spawn_sluice(&job, &[]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !has_complete_checkpoint(&dir.join("checkpoints")) {
        assert!(Instant::now() < deadline, "no checkpoint within a minute");
        assert!(
            first.try_wait().unwrap().is_none(),
            "the first run ended before its first checkpoint"
        );
        thread::sleep(Duration::from_millis(10));
    }
    let second = sluice(&[
        "run",
        "--quiet",
        job.to_str().unwrap(),
        "--from-checkpoint",
        "latest",
    ]);
    let (code, _, stderr) = outcome(&second);
    assert_eq!(code, Some(75), "a refused start: {stderr}");
    assert!(stderr.contains("is in use by another run"), "{stderr}");
    assert!(
        stderr.contains(&format!("pid {}", first.id())),
        "the holder's pid is named: {stderr}"
    );
    // Only then did the first run go on: it must end as a run alone would.
    assert!(
        first.try_wait().unwrap().is_none(),
        "the first run ended before the second was refused: the test proves nothing"
    );
    let status = first.wait().unwrap();
    assert!(status.success(), "the first run failed");
    let output = fs::read_to_string(dir.join("out/counts.tsv")).unwrap();
    assert_eq!(final_counts(&output).unwrap(), throttled_counts(records));
}

/// `close` runs after the final checkpoint committed the output, so what it emitted
/// reached no commit: it is an error naming the operator and the call, and the output
/// committed before it stays.
#[test]
fn records_emitted_in_close_fail_the_job_by_name_and_lose_nothing_committed() {
    let dir = test_dir("edges-close");
    fs::write(dir.join("in.txt"), "a b\nc\n").unwrap();
    let job = write_job(
        &dir,
        &format!(
            r#"
name = "close"
[source]
type = "file"
path = "in.txt"
[[operator]]
name = "suspect"
plugin = "{TEST_MISBEHAVE}"
config = {{ behavior = "emit-in-close" }}
[sink]
type = "file"
path = "out.txt"
[checkpoint]
interval_ms = 50
[restart]
strategy = "none"
"#
        ),
    );
    let (code, _, stderr) = outcome(&sluice(&["run", "--quiet", job.to_str().unwrap()]));
    assert_ne!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains("operator 'suspect' (subtask 1/1) of job 'close'"),
        "{stderr}"
    );
    assert!(stderr.contains("failed in `close`"), "{stderr}");
    // The SDK refuses it first; the host would too (the chain's own tests).
    assert!(
        stderr.contains("from `close`, which may not emit"),
        "{stderr}"
    );
    assert_eq!(fs::read_to_string(dir.join("out.txt")).unwrap(), "a b\nc\n");
}

/// Drained, a stop-with-savepoint finishes the operators before the savepoint, so what
/// `finish` flushes is committed with it (after it, no sink would commit anything).
#[test]
fn a_drained_stop_commits_what_finish_flushes() {
    let dir = test_dir("edges-drain");
    let job = write_job(
        &dir,
        &format!(
            r#"
name = "drain"
[source]
type = "generator"
records = 100000000
rate = 2000.0
[[operator]]
name = "recorder"
plugin = "{TEST_RECORDER}"
[sink]
type = "file"
path = "out.txt"
format = "key-value"
[checkpoint]
interval_ms = 100
dir = "checkpoints"
"#
        ),
    );
    let test_job = TestJob::load(&job).unwrap();
    let control = test_job.control.clone();
    let checkpoints = dir.join("checkpoints");
    let stopper = thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !has_complete_checkpoint(&checkpoints) {
            if Instant::now() > deadline {
                control.send(JobControl::Cancel).unwrap();
                panic!("no checkpoint within a minute");
            }
            thread::sleep(Duration::from_millis(10));
        }
        let (reply, answer) = unbounded();
        control
            .send(JobControl::StopWithSavepoint { drain: true, reply })
            .unwrap();
        answer.recv().unwrap()
    });
    let report = test_job.run(RestorePoint::Fresh).unwrap();
    stopper.join().unwrap().expect("the savepoint succeeds");
    assert!(
        matches!(report.outcome, JobOutcome::Stopped { .. }),
        "{:?}",
        report.outcome
    );
    let out = fs::read_to_string(dir.join("out.txt")).unwrap();
    let calls: Vec<&str> = out
        .lines()
        .filter_map(|l| l.strip_prefix("calls\t"))
        .collect();
    assert_eq!(
        calls.len(),
        1,
        "finish's record was committed once: {out:.400}"
    );
    assert!(calls[0].contains(",finish"), "{}", calls[0]);
    assert!(
        calls[0].contains(&format!("watermark({})", i64::MAX)),
        "event time reached its end before finish: {}",
        calls[0]
    );
}
