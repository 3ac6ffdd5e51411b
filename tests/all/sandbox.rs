//! Hostile operators under tenant limits: each misbehaviour ends in a clear error naming
//! tenant, job, operator, subtask and call, the job restarts (or fails) as its strategy
//! says, no output is lost or duplicated, and the host — this test process — lives on.

use std::path::{Path, PathBuf};

use sluice::job::{JobOutcome, JobReport, RestorePoint};
use sluice::tenant::HostConfig;
use sluice_tests::plugins::{COUNT, TEST_MISBEHAVE, TOKENIZE};
use sluice_tests::{
    TestJob, acme_host, expected_word_counts, final_counts, sample_text, test_dir, write_job,
};

/// `file -> tokenize -> misbehave(config) -> count -> file`, with checkpoints and one
/// restart allowed; the misbehaviour happens only in the first attempt.
fn counting_job(dir: &Path, misbehave: &str) -> (PathBuf, String) {
    let text = sample_text(41, 40_000);
    std::fs::write(dir.join("in.txt"), &text).unwrap();
    let job = write_job(
        dir,
        &format!(
            r#"
name = "hostile"
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
config = {{ {misbehave}, attempts = "0" }}
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
attempts = 1
delay_ms = 10
[runtime]
batch_size = 200
"#
        ),
    );
    (job, text)
}

/// Runs the counting job and checks the restart and the exactly-once output; returns
/// the failure that caused the restart.
fn fails_once_then_recovers(name: &str, misbehave: &str, limits: &str) -> String {
    let dir = test_dir(name);
    let host = acme_host(&dir, limits);
    let (job, text) = counting_job(&dir, misbehave);
    let report = TestJob::load_with(&job, &host)
        .unwrap()
        .run(RestorePoint::Fresh)
        .unwrap();
    assert_eq!(report.outcome, JobOutcome::Finished);
    assert_eq!(report.restarts, 1, "{:?}", report.failures);
    let output = std::fs::read_to_string(dir.join("out.tsv")).unwrap();
    assert_eq!(
        final_counts(&output).unwrap(),
        expected_word_counts(&text, 1)
    );
    let failure = report.failures[0].clone();
    assert!(
        failure.contains("operator 'suspect' (subtask 1/1) of job 'hostile' (tenant 'acme')"),
        "{failure}"
    );
    failure
}

#[test]
fn an_infinite_loop_is_cut_at_the_call_deadline() {
    let failure = fails_once_then_recovers(
        "hostile-loop",
        r#"behavior = "loop-in-process", after = 5000"#,
        "call_deadline_ms = 300",
    );
    assert!(
        failure.contains("failed in `process`: trapped (deadline): interrupted after exceeding the call deadline of 300ms"),
        "{failure}"
    );
}

#[test]
fn a_memory_bomb_hits_the_memory_limit() {
    let failure = fails_once_then_recovers(
        "hostile-memory",
        r#"behavior = "memory-bomb", after = 5000"#,
        "memory_mb = 32",
    );
    assert!(
        failure.contains("failed in `process`: trapped (memory): memory limit exceeded"),
        "{failure}"
    );
    assert!(failure.contains("(limit 32.0 MiB)"), "{failure}");
}

#[test]
fn runaway_recursion_fails_its_own_call_with_an_explanation() {
    let failure = fails_once_then_recovers(
        "hostile-stack",
        r#"behavior = "stack-overflow", after = 5000"#,
        "",
    );
    // A Rust operator's stack lives in its linear memory: overflowing it is an access
    // out of bounds, which the error explains.
    assert!(
        failure
            .contains("failed in `process`: trapped (memory-access): out of bounds memory access"),
        "{failure}"
    );
    assert!(failure.contains("when the stack overflows"), "{failure}");
}

#[test]
fn panics_name_the_call_they_happened_in() {
    for (call, after) in [
        ("open", ""),
        ("process", ", after = 5000"),
        ("snapshot", ""),
        ("close", ""),
    ] {
        let failure = fails_once_then_recovers(
            &format!("hostile-panic-{call}"),
            &format!(r#"behavior = "panic-in-{call}"{after}"#),
            "",
        );
        assert!(
            failure.contains(&format!(
                "failed in `{call}`: panicked: test-misbehave: deliberate panic in {call}"
            )),
            "{failure}"
        );
    }
}

#[test]
fn a_slow_snapshot_is_cut_at_the_call_deadline() {
    let failure = fails_once_then_recovers(
        "hostile-slow-snapshot",
        r#"behavior = "slow-snapshot", delay-ms = 10000"#,
        "call_deadline_ms = 500",
    );
    assert!(
        failure.contains("failed in `snapshot`: trapped (deadline)"),
        "{failure}"
    );
}

#[test]
fn a_flood_of_output_breaks_the_contract_at_the_output_limit() {
    let failure = fails_once_then_recovers(
        "hostile-flood",
        r#"behavior = "emit-flood", after = 5000, flood-bytes = 16777216"#,
        "max_output_mb = 4",
    );
    assert!(
        failure.contains("failed in `process`: broke the operator contract: returned"),
        "{failure}"
    );
    assert!(failure.contains("the limit is 4194304"), "{failure}");
}

/// `file -> misbehave -> file` without checkpoints: reports what the operator could reach.
fn reach(
    name: &str,
    behavior: &str,
    limits: &str,
    setup: impl FnOnce(&Path),
) -> (String, JobReport) {
    let dir = test_dir(name);
    setup(&dir);
    let host = acme_host(&dir, limits);
    std::fs::write(dir.join("in.txt"), "a\nb\nc\n").unwrap();
    let job = write_job(
        &dir,
        &format!(
            r#"
name = "reach"
tenant = "acme"
[source]
type = "file"
path = "in.txt"
[[operator]]
name = "suspect"
plugin = "{TEST_MISBEHAVE}"
config = {{ behavior = "{behavior}" }}
[sink]
type = "file"
path = "out.txt"
"#
        ),
    );
    let report = TestJob::load_with(&job, &host)
        .unwrap()
        .run(RestorePoint::Fresh)
        .unwrap();
    let output = std::fs::read_to_string(dir.join("out.txt")).unwrap();
    // The records themselves pass through untouched.
    assert!(output.ends_with("a\nb\nc\n"), "{output}");
    (output.lines().next().unwrap().to_string(), report)
}

#[test]
fn files_sockets_and_the_environment_are_out_of_reach() {
    let (file, _) = reach("reach-file", "read-file", "", |_| {});
    assert!(file.starts_with("read-file: Err("), "{file}");
    let (socket, _) = reach("reach-socket", "open-socket", "", |_| {});
    assert!(socket.starts_with("open-socket: Err("), "{socket}");
    // Only what the host sets for the SDK: the instance's memory limit.
    let (env, _) = reach("reach-env", "read-env", "", |_| {});
    assert_eq!(env, r#"read-env: ["SLUICE_MEMORY_BYTES"]"#);
}

#[test]
fn a_granted_directory_is_readable_and_nothing_else_is() {
    let (file, _) = reach(
        "reach-granted",
        "read-file",
        r#"dirs = [{ host = "granted", guest = "/etc", read_only = true }]"#,
        |dir| {
            std::fs::create_dir_all(dir.join("granted")).unwrap();
            std::fs::write(dir.join("granted/passwd"), "twelve bytes").unwrap();
        },
    );
    assert_eq!(file, "read-file: Ok(12 bytes)");
}

#[test]
fn log_and_print_floods_are_rate_limited() {
    for behavior in ["log-flood", "print-flood"] {
        let (_, report) = reach(
            &format!("reach-{behavior}"),
            behavior,
            "log_lines_per_second = 50",
            |_| {},
        );
        let op = report.tasks[0]
            .operators
            .iter()
            .find(|o| o.operator == "suspect")
            .unwrap();
        // 100,000 lines (twice that for print-flood); at most 50 per second pass.
        assert!(op.log_lines_dropped >= 99_000, "{behavior}: {op:?}");
    }
}

#[test]
fn exhausted_restarts_fail_the_job_with_the_cause() {
    let dir = test_dir("hostile-always");
    let host = acme_host(&dir, "call_deadline_ms = 200");
    let (job, _) = counting_job(&dir, r#"behavior = "loop-in-process", after = 100"#);
    // Misbehave in every attempt: the job fails after its one restart.
    let text = std::fs::read_to_string(&job)
        .unwrap()
        .replace(r#", attempts = "0""#, "");
    std::fs::write(&job, text).unwrap();
    let test_job = TestJob::load_with(&job, &host).unwrap();
    let started = std::time::Instant::now();
    assert_eq!(test_job.monitor.last_failure_at(), None);
    let err = format!("{:#}", test_job.run(RestorePoint::Fresh).unwrap_err());
    let failed_at = test_job
        .monitor
        .last_failure_at()
        .expect("failures recorded");
    // The second attempt's failure, after the 200 ms deadline of each attempt.
    assert!(
        failed_at - started >= std::time::Duration::from_millis(400),
        "{failed_at:?}"
    );
    assert!(
        err.starts_with("job 'hostile' failed after 1 restarts"),
        "{err}"
    );
    assert!(err.contains("trapped (deadline)"), "{err}");
    assert_eq!(test_job.monitor.failures_by_kind()["deadline"], 2);
}

/// A job of tenant `a` that misbehaves in every attempt and keeps restarting.
fn hostile_tenant_job(dir: &Path, behavior: &str) -> PathBuf {
    let path = dir.join("hostile.toml");
    std::fs::write(
        &path,
        format!(
            r#"
name = "hostile"
tenant = "a"
[source]
type = "generator"
records = 100000000
rate = 1000.0
[[operator]]
name = "suspect"
plugin = "{TEST_MISBEHAVE}"
config = {{ behavior = "{behavior}", after = 10 }}
[sink]
type = "file"
path = "hostile-out.txt"
[restart]
strategy = "exponential"
attempts = 1000
delay_ms = 20
max_delay_ms = 100
"#
        ),
    )
    .unwrap();
    path
}

fn isolation(name: &str, behavior: &str, expected_kind: &str) {
    let dir = test_dir(name);
    std::fs::write(
        dir.join("host.toml"),
        "[tenant.a]\ncall_deadline_ms = 100\nmemory_mb = 32\n[tenant.b]\n",
    )
    .unwrap();
    let host = HostConfig::load(&dir.join("host.toml")).unwrap();
    let hostile = TestJob::load_with(&hostile_tenant_job(&dir, behavior), &host).unwrap();
    let hostile_control = hostile.control.clone();
    let hostile_monitor = hostile.monitor.clone();
    let hostile_run = std::thread::spawn(move || hostile.run(RestorePoint::Fresh));

    // Tenant b's word count, while tenant a misbehaves over and over.
    let (job, text) = counting_job(&dir, r#"behavior = "none""#);
    let b = std::fs::read_to_string(&job)
        .unwrap()
        .replace(r#"tenant = "acme""#, r#"tenant = "b""#);
    std::fs::write(&job, b).unwrap();
    while hostile_monitor.failures_by_kind().is_empty() {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let report = TestJob::load_with(&job, &host)
        .unwrap()
        .run(RestorePoint::Fresh)
        .unwrap();
    assert_eq!(report.outcome, JobOutcome::Finished);
    assert_eq!(report.restarts, 0);
    let output = std::fs::read_to_string(dir.join("out.tsv")).unwrap();
    assert_eq!(
        final_counts(&output).unwrap(),
        expected_word_counts(&text, 1)
    );

    hostile_control
        .send(sluice::job::JobControl::Cancel)
        .unwrap();
    let hostile_report = hostile_run.join().unwrap().unwrap();
    assert_eq!(hostile_report.outcome, JobOutcome::Cancelled);
    let failures = hostile_monitor.failures_by_kind();
    assert!(failures[expected_kind] >= 1, "{failures:?}");
}

#[test]
fn a_tenant_looping_forever_does_not_stop_another_tenants_job() {
    isolation("isolation-loop", "loop-in-process", "deadline");
}

#[test]
fn a_tenant_eating_memory_does_not_stop_another_tenants_job() {
    isolation("isolation-memory", "memory-bomb", "memory");
}
