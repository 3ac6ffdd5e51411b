//! Time outside Wasm code: guests see no clock that moves, and a guest that waits in a
//! host call (a sleep, a poll) is still cut at its call deadline and by cancellation,
//! in every call. Also fuel budgets, which bound every call including instantiation.

use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use sluice::job::{JobControl, JobOutcome, RestorePoint};
use sluice_tests::plugins::{COUNT, TEST_MISBEHAVE, TEST_SLEEPER, TOKENIZE};
use sluice_tests::{
    TestJob, acme_host, expected_word_counts, file_wordcount, final_counts, sample_text, test_dir,
    write_job,
};

/// `file -> tokenize -> sleeper(config) -> file`, keyed at the sleeper, with checkpoints
/// and one restart. Returns the job and the number of words in its input.
fn sleeper_job(dir: &Path, config: &str) -> (PathBuf, usize) {
    let text = sample_text(5, 200);
    std::fs::write(dir.join("in.txt"), &text).unwrap();
    let words = expected_word_counts(&text, 1).values().sum::<u64>() as usize;
    let job = write_job(
        dir,
        &format!(
            r#"
name = "sleepy"
tenant = "acme"
[source]
type = "file"
path = "in.txt"
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
[[operator]]
name = "sleeper"
plugin = "{TEST_SLEEPER}"
key_by = "key"
config = {{ {config} }}
[sink]
type = "file"
path = "out.txt"
[checkpoint]
interval_ms = 20
[restart]
strategy = "fixed-delay"
attempts = 1
delay_ms = 10
"#
        ),
    );
    (job, words)
}

/// The words in the committed output, without the sleeper's clock reports.
fn words_out(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join("out.txt"))
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("clock: "))
        .count()
}

#[test]
fn guests_see_no_clock_that_moves() {
    let dir = test_dir("guest-clock");
    let (job, words) = sleeper_job(&dir, "");
    let report = TestJob::load(&job)
        .unwrap()
        .run(RestorePoint::Fresh)
        .unwrap();
    assert_eq!(report.outcome, JobOutcome::Finished);
    let output = std::fs::read_to_string(dir.join("out.txt")).unwrap();
    // The wall clock reads the epoch; the monotonic clock does not move within a call.
    assert!(output.contains("clock: wall=0 mono=0\n"), "{output}");
    assert_eq!(words_out(&dir), words);
}

#[test]
fn a_guest_sleeping_in_any_call_is_cut_at_its_deadline_and_the_job_recovers() {
    for call in [
        "open",
        "process",
        "snapshot",
        "on-timers",
        "finish",
        "close",
        "dispose",
    ] {
        let dir = test_dir(&format!("guest-sleep-{call}"));
        let host = acme_host(&dir, "call_deadline_ms = 200");
        let (job, words) = sleeper_job(&dir, &format!(r#"sleep-in = "{call}", attempts = "0""#));
        let started = Instant::now();
        let report = TestJob::load_with(&job, &host)
            .unwrap()
            .run(RestorePoint::Fresh)
            .unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{call}: the sleep was not cut"
        );
        assert_eq!(report.outcome, JobOutcome::Finished, "{call}: {report:?}");
        let failure = report.failures.first().map(String::as_str).unwrap_or("");
        assert!(
            failure.contains(&format!("failed in `{call}`: trapped (deadline)")),
            "{call}: {failure}"
        );
        assert!(
            failure.contains("operator 'sleeper' (subtask 1/1) of job 'sleepy' (tenant 'acme')"),
            "{failure}"
        );
        assert_eq!(words_out(&dir), words, "{call}: output lost or doubled");
    }
}

#[test]
fn cancelling_a_job_whose_guest_sleeps_without_a_deadline_ends_it_at_once() {
    let dir = test_dir("guest-sleep-cancel");
    let host = acme_host(&dir, "call_deadline_ms = 0");
    let (job, _) = sleeper_job(&dir, r#"sleep-in = "process""#);
    let job = TestJob::load_with(&job, &host).unwrap();
    let control = job.control.clone();
    let monitor = job.monitor.clone();
    let runner = thread::spawn(move || job.run(RestorePoint::Fresh));
    // Wait until records flow into the sleeper, which then sleeps in `process`.
    while monitor.records_read_written().0 == 0 {
        thread::sleep(Duration::from_millis(5));
    }
    thread::sleep(Duration::from_millis(50));
    let cancelled = Instant::now();
    control.send(JobControl::Cancel).unwrap();
    let report = runner.join().unwrap().unwrap();
    assert_eq!(report.outcome, JobOutcome::Cancelled);
    assert!(
        cancelled.elapsed() < Duration::from_secs(5),
        "cancel took {:?}",
        cancelled.elapsed()
    );
}

/// The word count with a fuel budget for its tenant: ample fuel runs it to the end;
/// little fuel cuts a looping operator's call with a fuel trap.
#[test]
fn fuel_budgets_bound_every_call_and_leave_honest_ones_alone() {
    let dir = test_dir("fuel");
    let text = sample_text(9, 2_000);
    std::fs::write(dir.join("in.txt"), &text).unwrap();
    let job_text = |behavior: &str| {
        format!(
            r#"
name = "fueled"
tenant = "acme"
[source]
type = "file"
path = "in.txt"
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
[[operator]]
name = "suspect"
plugin = "{TEST_MISBEHAVE}"
config = {{ behavior = "{behavior}", after = 100, attempts = "0" }}
[[operator]]
name = "count"
plugin = "{COUNT}"
key_by = "key"
[sink]
type = "file"
path = "out.tsv"
format = "key-value"
[checkpoint]
interval_ms = 20
[restart]
strategy = "fixed-delay"
attempts = 1
delay_ms = 10
"#
        )
    };
    let host = acme_host(&dir, "fuel_per_call = 50000000\ncall_deadline_ms = 0");
    let honest = write_job(&dir, &job_text("none"));
    let report = TestJob::load_with(&honest, &host)
        .unwrap()
        .run(RestorePoint::Fresh)
        .unwrap();
    assert_eq!(
        report.outcome,
        JobOutcome::Finished,
        "{:?}",
        report.failures
    );
    assert_eq!(report.restarts, 0, "{:?}", report.failures);

    let dir = test_dir("fuel-loop");
    std::fs::write(dir.join("in.txt"), &text).unwrap();
    let looping = write_job(&dir, &job_text("loop-in-process"));
    let report = TestJob::load_with(&looping, &host)
        .unwrap()
        .run(RestorePoint::Fresh)
        .unwrap();
    assert_eq!(
        report.outcome,
        JobOutcome::Finished,
        "{:?}",
        report.failures
    );
    assert!(
        report.failures[0].contains("failed in `process`: trapped (fuel)"),
        "{:?}",
        report.failures
    );
    let output = std::fs::read_to_string(dir.join("out.tsv")).unwrap();
    assert_eq!(
        final_counts(&output).unwrap(),
        expected_word_counts(&text, 1)
    );
}

/// A guest that sleeps uses no CPU, so it must not hold its tenant's share of the cores:
/// with more sleeping calls than cores, another tenant's job still runs to its end.
#[test]
fn sleeping_guests_hold_no_core_from_another_tenant() {
    let dir = test_dir("guest-sleep-share");
    let host = acme_host(&dir, "call_deadline_ms = 0");
    let (sleepy, _) = sleeper_job(&dir, r#"sleep-in = "process""#);
    let text = std::fs::read_to_string(&sleepy)
        .unwrap()
        .replace("key_by = \"key\"", "key_by = \"key\"\nparallelism = 4");
    std::fs::write(&sleepy, text).unwrap();
    let sleepy = TestJob::load_with(&sleepy, &host).unwrap();
    let (control, monitor) = (sleepy.control.clone(), sleepy.monitor.clone());
    let runner = thread::spawn(move || sleepy.run(RestorePoint::Fresh));
    while monitor.records_read_written().0 == 0 {
        thread::sleep(Duration::from_millis(5));
    }
    thread::sleep(Duration::from_millis(100));

    let quiet_dir = test_dir("guest-sleep-share-quiet");
    let words = sample_text(3, 2_000);
    std::fs::write(quiet_dir.join("in.txt"), &words).unwrap();
    let quiet = write_job(&quiet_dir, &file_wordcount("quiet", "quiet", 1));
    let report = TestJob::load_with(&quiet, &host)
        .unwrap()
        .run(RestorePoint::Fresh)
        .unwrap();
    assert_eq!(report.outcome, JobOutcome::Finished);
    let output = std::fs::read_to_string(quiet_dir.join("counts.tsv")).unwrap();
    assert_eq!(
        final_counts(&output).unwrap(),
        expected_word_counts(&words, 1)
    );
    control.send(JobControl::Cancel).unwrap();
    assert_eq!(
        runner.join().unwrap().unwrap().outcome,
        JobOutcome::Cancelled
    );
}
