//! Checkpoints end to end: kill and restore without losing or duplicating output,
//! stop-with-savepoint and resume (also at another parallelism), notifications.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Stdio};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::unbounded;
use sluice::job::{JobControl, JobOutcome, RestorePoint};
use sluice_tests::plugins::{COUNT, TEST_MISBEHAVE, TEST_RECORDER, TOKENIZE};
use sluice_tests::{
    TestJob, final_counts, final_counts_any_order, has_complete_checkpoint, run_job, sluice_run,
    test_dir, throttled_wordcount, write_job,
};

pub(crate) fn spawn_sluice(job: &Path, args: &[&str]) -> Child {
    sluice_run(env!("CARGO_BIN_EXE_sluice-test-cli"), job, None)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning sluice")
}

/// Runs `sluice run JOB` and SIGKILLs it once `dir/checkpoints` holds a complete
/// checkpoint (failing the test when the job ends before, or none comes in a minute).
pub(crate) fn kill_after_a_checkpoint(dir: &Path, job: &Path) {
    let mut child = spawn_sluice(job, &[]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !has_complete_checkpoint(&dir.join("checkpoints")) {
        assert!(Instant::now() < deadline, "no checkpoint within a minute");
        assert!(
            child.try_wait().unwrap().is_none(),
            "the job ended before its first checkpoint"
        );
        thread::sleep(Duration::from_millis(10));
    }
    child.kill().unwrap();
    child.wait().unwrap();
}

/// A small deterministic generator of kill delays (seeded from the clock and printed, so
/// a failure can be reproduced).
pub(crate) struct Delays(pub(crate) u64);

impl Delays {
    pub(crate) fn next_ms(&mut self, min: u64, max: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        min + (self.0 >> 33) % (max - min)
    }
}

/// Runs the job, SIGKILLing it `kills` times at random moments and restarting it from the
/// latest checkpoint each time, until it completes. Returns the committed output, how
/// many running processes were killed and how many runs restored a checkpoint.
pub(crate) fn run_with_kills(
    dir: &Path,
    job: &Path,
    kills: usize,
    delays: &mut Delays,
) -> (String, usize, usize) {
    let (mut outputs, killed, restored) =
        run_with_kills_writing(dir, job, kills, delays, &["out/counts.tsv"]);
    (outputs.remove(0), killed, restored)
}

/// [`run_with_kills`] for a job writing the files `outputs` (relative to `dir`): returns
/// each one's committed content, in order.
pub(crate) fn run_with_kills_writing(
    dir: &Path,
    job: &Path,
    kills: usize,
    delays: &mut Delays,
    outputs: &[&str],
) -> (Vec<String>, usize, usize) {
    let read = |file: &str| std::fs::read_to_string(dir.join(file)).unwrap_or_default();
    let (mut killed, mut restored) = (0, 0);
    let mut seen = Vec::new();
    for round in 0..=kills {
        let restore: &[&str] = if has_complete_checkpoint(&dir.join("checkpoints")) {
            restored += 1;
            &["--from-checkpoint", "latest"]
        } else {
            &[]
        };
        let mut child = spawn_sluice(job, restore);
        if round == kills {
            let out = child.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "final run failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            break;
        }
        let delay = delays.next_ms(250, 900);
        let deadline = Instant::now() + Duration::from_millis(delay);
        while Instant::now() < deadline && child.try_wait().unwrap().is_none() {
            thread::sleep(Duration::from_millis(10));
        }
        if let Some(status) = child.try_wait().unwrap() {
            // It finished before the kill: the output is final.
            assert!(status.success(), "a run failed");
            break;
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        killed += 1;
        // What was committed when the process died: it must never be taken back.
        seen.push(outputs.iter().map(|f| read(f)).collect::<Vec<_>>());
    }
    let finals: Vec<String> = outputs.iter().map(|f| read(f)).collect();
    for (i, committed) in seen.iter().enumerate() {
        for ((file, output), committed) in outputs.iter().zip(&finals).zip(committed) {
            assert!(
                output.starts_with(committed.as_str()),
                "{file}: output committed before kill {} ({} bytes) was taken back",
                i + 1,
                committed.len()
            );
        }
    }
    (finals, killed, restored)
}

pub(crate) fn sorted_lines(s: &str) -> Vec<&str> {
    let mut v: Vec<&str> = s.lines().collect();
    v.sort_unstable();
    v
}

fn kill_test(count_parallelism: u32) {
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    eprintln!("kill test seed {seed}");
    let mut delays = Delays(seed);
    let toml = throttled_wordcount(count_parallelism, 40_000, 10_000.0);

    let reference_dir = test_dir("kill-reference");
    let reference_job = write_job(&reference_dir, &toml);
    run_job(&reference_job).unwrap();
    let reference = std::fs::read_to_string(reference_dir.join("out/counts.tsv")).unwrap();
    assert_eq!(reference.lines().count(), 40_000 * 6);

    let dir = test_dir("kill");
    let job = write_job(&dir, &toml);
    let (output, killed, restored) = run_with_kills(&dir, &job, 4, &mut delays);
    eprintln!("killed {killed} running processes, restored {restored} times");
    assert!(
        killed >= 3,
        "only {killed} runs were still going when killed (seed {seed})"
    );
    assert!(
        restored >= 2,
        "only {restored} runs restored a checkpoint (seed {seed})"
    );
    // Every word's counts are 1..n exactly once, in order ...
    let counts = if count_parallelism == 1 {
        final_counts(&output)
    } else {
        final_counts_any_order(&output)
    };
    assert_eq!(
        counts.unwrap(),
        final_counts(&reference).unwrap_or_else(|_| final_counts_any_order(&reference).unwrap())
    );
    // ... and the committed output is the failure-free run's, line for line.
    if count_parallelism == 1 {
        assert!(
            output == reference,
            "output differs from the failure-free run (seed {seed})"
        );
    } else {
        assert!(
            sorted_lines(&output) == sorted_lines(&reference),
            "output differs (seed {seed})"
        );
    }
}

#[test]
fn killed_and_restored_runs_commit_exactly_the_failure_free_output() {
    kill_test(1);
}

#[test]
fn killed_and_restored_runs_commit_exactly_the_failure_free_output_in_parallel() {
    kill_test(3);
}

#[test]
fn stop_with_savepoint_then_resume_at_another_parallelism() {
    let dir = test_dir("savepoint");
    let job = write_job(&dir, &throttled_wordcount(2, 20_000, 8_000.0));
    let first = TestJob::load(&job).unwrap();
    let control = first.control.clone();
    let stopper = thread::spawn(move || {
        thread::sleep(Duration::from_millis(800));
        let (reply, answer) = unbounded();
        control
            .send(JobControl::StopWithSavepoint {
                drain: false,
                reply,
            })
            .unwrap();
        answer.recv().unwrap()
    });
    let report = first.run(RestorePoint::Fresh).unwrap();
    let savepoint = stopper.join().unwrap().unwrap();
    assert_eq!(
        report.outcome,
        JobOutcome::Stopped {
            savepoint: savepoint.clone()
        },
        "failures: {:?}",
        report.failures
    );
    assert_eq!(report.restarts, 0, "the stop went through a restart");
    assert!(
        savepoint
            .file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("savepoint-")
    );
    let partial = std::fs::read_to_string(dir.join("out/counts.tsv")).unwrap();
    let partial_lines = partial.lines().count();
    assert!(
        partial_lines > 0 && partial_lines < 20_000 * 6,
        "{partial_lines} lines before the stop"
    );

    // Resume from the savepoint with the counting operator at parallelism 3.
    std::fs::write(&job, throttled_wordcount(3, 20_000, 1e9)).unwrap();
    let second = TestJob::load(&job).unwrap();
    let report = second.run(RestorePoint::Path(savepoint)).unwrap();
    assert_eq!(report.outcome, JobOutcome::Finished);
    let output = std::fs::read_to_string(dir.join("out/counts.tsv")).unwrap();
    assert!(
        output.starts_with(&partial),
        "committed output was rewritten"
    );

    let reference_dir = test_dir("savepoint-reference");
    let reference_job = write_job(&reference_dir, &throttled_wordcount(1, 20_000, 1e9));
    run_job(&reference_job).unwrap();
    let reference = std::fs::read_to_string(reference_dir.join("out/counts.tsv")).unwrap();
    assert_eq!(
        final_counts_any_order(&output).unwrap(),
        final_counts(&reference).unwrap()
    );
    assert_eq!(sorted_lines(&output), sorted_lines(&reference));
}

#[test]
fn every_operator_hears_of_each_completed_checkpoint_exactly_once() {
    let dir = test_dir("notify");
    let job = write_job(
        &dir,
        &format!(
            r#"
name = "notify"
[source]
type = "generator"
records = 3000
rate = 3000.0
parallelism = 2
[[operator]]
name = "recorder"
plugin = "{TEST_RECORDER}"
parallelism = 2
[sink]
type = "file"
path = "out.txt"
format = "key-value"
[checkpoint]
interval_ms = 100
"#
        ),
    );
    let report = run_job(&job).unwrap();
    let completed: BTreeSet<u64> = report.checkpoints.completed.iter().map(|c| c.id).collect();
    assert!(completed.len() >= 3, "only {completed:?} completed");
    let out = std::fs::read_to_string(dir.join("out-0.txt").with_file_name("out.txt"))
        .unwrap_or_default();
    let lists: Vec<&str> = out
        .lines()
        .filter_map(|l| l.strip_prefix("calls\t"))
        .collect();
    assert_eq!(lists.len(), 2, "one list per recorder subtask: {out}");
    for list in lists {
        let notified: Vec<u64> = list
            .split(',')
            .filter_map(|c| {
                c.strip_prefix("notify-complete(")?
                    .strip_suffix(')')?
                    .parse()
                    .ok()
            })
            .collect();
        let snapshots: BTreeSet<u64> = list
            .split(',')
            .filter_map(|c| c.strip_prefix("snapshot(")?.strip_suffix(')')?.parse().ok())
            .collect();
        assert!(!notified.is_empty(), "{list}");
        // Strictly increasing: no notification twice, none out of order.
        assert!(notified.windows(2).all(|w| w[0] < w[1]), "{list}");
        for id in &notified {
            assert!(
                completed.contains(id),
                "notified of {id}, which did not complete: {list}"
            );
            assert!(
                snapshots.contains(id),
                "notified of {id} without taking part: {list}"
            );
        }
        // Every checkpoint completed before the last notification was notified.
        let last = *notified.last().unwrap();
        for id in completed.range(..=last) {
            assert!(
                notified.contains(id),
                "checkpoint {id} completed but was not notified: {list}"
            );
        }
    }
}

#[test]
fn a_failed_job_restarts_from_its_latest_checkpoint_and_finishes_exactly_once() {
    let dir = test_dir("restart");
    let text = sluice_tests::sample_text(21, 60_000);
    std::fs::write(dir.join("in.txt"), &text).unwrap();
    // The operator panics after 150,000 words (about 30,000 lines), only in the first
    // attempt, once a checkpoint taken after its first record has completed.
    let job = write_job(
        &dir,
        &format!(
            r#"
name = "restart"
[source]
type = "file"
path = "in.txt"
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
config = {{ min-length = 2 }}
[[operator]]
name = "flaky"
plugin = "{TEST_MISBEHAVE}"
config = {{ behavior = "panic-in-process", after = 150000, attempts = "0", after-checkpoint = true }}
[[operator]]
name = "count"
plugin = "{COUNT}"
key_by = "key"
[sink]
type = "file"
path = "out.tsv"
format = "key-value"
[checkpoint]
interval_ms = 10
[restart]
strategy = "fixed-delay"
attempts = 2
delay_ms = 50
[runtime]
batch_size = 100
"#
        ),
    );
    let report = run_job(&job).unwrap();
    assert_eq!(report.outcome, JobOutcome::Finished);
    assert_eq!(report.restarts, 1);
    // The second attempt resumed from a checkpoint: it read only part of the file.
    let read = report.tasks[0].records_in;
    assert!(
        read > 0 && read < 60_000,
        "the restarted attempt read {read} lines"
    );
    assert!(
        report.failures[0].contains("operator 'flaky' (subtask 1/1) of job 'restart'")
            && report.failures[0].contains("deliberate panic in process"),
        "{:?}",
        report.failures
    );
    let output = std::fs::read_to_string(dir.join("out.tsv")).unwrap();
    assert_eq!(
        final_counts(&output).unwrap(),
        sluice_tests::expected_word_counts(&text, 2)
    );
    // What the sink committed over both attempts is the output, line for line; the last
    // attempt's sink took in only what came after the checkpoint it resumed from.
    let committed = report.checkpoints.records_committed();
    assert_eq!(committed, Some(output.lines().count() as u64));
    let written: u64 = report
        .tasks
        .iter()
        .flat_map(|t| &t.operators)
        .filter(|o| o.is_sink)
        .map(|o| o.records_in)
        .sum();
    assert!(
        written > 0 && written < committed.unwrap(),
        "{written} written in the last attempt, {committed:?} committed"
    );
}

#[test]
fn restarts_stop_when_the_strategy_allows_no_more() {
    let dir = test_dir("restart-exhausted");
    std::fs::write(dir.join("in.txt"), "a b c\n".repeat(100)).unwrap();
    let job = write_job(
        &dir,
        &format!(
            r#"
name = "doomed"
[source]
type = "file"
path = "in.txt"
[[operator]]
name = "flaky"
plugin = "{TEST_MISBEHAVE}"
config = {{ behavior = "error-in-process", after = 10 }}
[sink]
type = "file"
path = "out.txt"
[checkpoint]
interval_ms = 1000
[restart]
strategy = "exponential"
attempts = 2
delay_ms = 10
"#
        ),
    );
    let err = format!("{:#}", run_job(&job).unwrap_err());
    assert!(
        err.starts_with("job 'doomed' failed after 2 restarts"),
        "{err}"
    );
    assert!(err.contains("deliberate error in process"), "{err}");
}

#[test]
fn sigterm_stops_the_command_with_a_savepoint_that_a_later_run_resumes_from() {
    let dir = test_dir("sigterm");
    let job = write_job(&dir, &throttled_wordcount(2, 20_000, 8_000.0));
    let child = spawn_sluice(&job, &[]);
    thread::sleep(Duration::from_millis(800));
    // SAFETY: sends a signal to our own child process, which is still running.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let savepoint = stderr
        .lines()
        .find_map(|l| l.strip_prefix("sluice: savepoint written to "))
        .unwrap_or_else(|| panic!("no savepoint announced: {stderr}"))
        .to_string();
    let partial = std::fs::read_to_string(dir.join("out/counts.tsv")).unwrap();
    assert!(partial.lines().count() < 20_000 * 6);
    let resumed = spawn_sluice(&job, &["--from-checkpoint", &savepoint])
        .wait_with_output()
        .unwrap();
    assert!(
        resumed.status.success(),
        "{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
    let output = std::fs::read_to_string(dir.join("out/counts.tsv")).unwrap();
    assert!(output.starts_with(&partial));
    let totals: u64 = final_counts_any_order(&output).unwrap().values().sum();
    assert_eq!(totals, 20_000 * 6);
}
