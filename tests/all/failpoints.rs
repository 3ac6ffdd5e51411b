//! Fault injection at every step of the checkpoint protocol: a `sluice run` process is
//! made to crash (abort) or fail (an error it recovers from by a restart) exactly there,
//! restarted from its latest checkpoint when it crashed, and its committed output is
//! checked against counts computed independently from the input: nothing lost, nothing
//! repeated.

use std::fs;
use std::path::Path;
use std::process::{Output, Stdio};
use std::thread;
use std::time::Duration;

use sluice_tests::plugins::{COUNT, TEST_MISBEHAVE, TOKENIZE};
use sluice_tests::{
    expected_word_counts, final_counts, has_complete_checkpoint, sample_text, sluice_run, test_dir,
    write_job,
};

/// A word count over 600 lines, slowed to about a line per millisecond so that
/// checkpoints (every 20 ms) come while it runs.
fn job(dir: &Path) -> (std::path::PathBuf, String) {
    job_in(dir, "heap")
}

/// [`job`] with its keyed state in `backend`.
fn job_in(dir: &Path, backend: &str) -> (std::path::PathBuf, String) {
    let text = sample_text(11, 600);
    fs::write(dir.join("input.txt"), &text).unwrap();
    let job = write_job(
        dir,
        &format!(
            r#"
name = "faults"
[source]
type = "file"
path = "input.txt"
[[operator]]
name = "slow"
plugin = "{TEST_MISBEHAVE}"
config = {{ behavior = "slow-process", delay-ms = 1 }}
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
[[operator]]
name = "count"
plugin = "{COUNT}"
parallelism = 2
key_by = "key"
[sink]
type = "file"
path = "out/counts.tsv"
format = "key-value"
parallelism = 2
[checkpoint]
interval_ms = 20
dir = "checkpoints"
[restart]
strategy = "fixed-delay"
attempts = 5
delay_ms = 10
[runtime]
batch_size = 20
buffer_timeout_ms = 5
[state]
backend = "{backend}"
memory_mb = 8
"#
        ),
    );
    (job, text)
}

/// `sluice run JOB ARGS` with `FAILPOINTS` set to `failpoints` (when given), its stderr
/// collected.
pub(crate) fn run(job: &Path, args: &[&str], failpoints: Option<&str>) -> Output {
    let mut command = sluice_run(env!("CARGO_BIN_EXE_sluice-test-cli"), job, None);
    command
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(f) = failpoints {
        command.env("FAILPOINTS", f);
    }
    command.output().expect("running sluice")
}

fn has_checkpoint(dir: &Path) -> bool {
    has_complete_checkpoint(&dir.join("checkpoints"))
}

/// Resumes (or starts) the job until it finishes, without failpoints.
fn finish(dir: &Path, job: &Path) {
    let args: &[&str] = if has_checkpoint(dir) {
        &["--from-checkpoint", "latest"]
    } else {
        &[]
    };
    let out = run(job, args, None);
    assert!(
        out.status.success(),
        "the run after the fault failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn check_output(dir: &Path, text: &str) {
    let mut output = String::new();
    for subtask in 0..2 {
        output +=
            &fs::read_to_string(dir.join(format!("out/counts-{subtask}.tsv"))).unwrap_or_default();
    }
    assert_eq!(
        final_counts(&output).unwrap(),
        expected_word_counts(text, 1),
        "committed output differs from the input's counts"
    );
}

/// Crashes the process at the `skip + 1`-th pass through `point`, then resumes.
fn crash_at(point: &str, skip: u32) {
    crash_at_in(point, skip, "heap");
}

/// [`crash_at`] with keyed state in `backend`; returns the job's folder.
fn crash_at_in(point: &str, skip: u32, backend: &str) -> std::path::PathBuf {
    let dir = test_dir(&format!("crash-{}", point.replace("::", "-")));
    let (job, text) = job_in(&dir, backend);
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
    finish(&dir, &job);
    check_output(&dir, &text);
    dir
}

/// Makes `point` fail once with an error: the job restarts by itself and finishes, and
/// the restarted attempt triggers none of the checkpoint ids the failed one did (a
/// checkpoint of the failed attempt may still be written or staged when it ends).
fn fail_at(point: &str, skip: u32) {
    fail_at_in(point, skip, "heap");
}

/// [`fail_at`] with keyed state in `backend`.
fn fail_at_in(point: &str, skip: u32, backend: &str) {
    let dir = test_dir(&format!("error-{}", point.replace("::", "-")));
    let (job, text) = job_in(&dir, backend);
    let mut command = sluice_run(env!("CARGO_BIN_EXE_sluice-test-cli"), &job, None);
    let out = command
        .env("SLUICE_LOG", "warn,sluice::job::coordinator=debug")
        .env(
            "FAILPOINTS",
            format!("{point}={skip}*off->1*return(injected)->off"),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .expect("running sluice");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the job did not recover from an error at {point}: {stderr}"
    );
    let triggered: Vec<u64> = stderr
        .lines()
        .filter(|l| l.contains("triggering "))
        .filter_map(|l| l.rsplit(' ').next()?.trim().parse().ok())
        .collect();
    assert!(
        stderr.contains("injected") && triggered.len() > 1,
        "no restart, or no checkpoints: {stderr}"
    );
    assert!(
        triggered.windows(2).all(|w| w[0] < w[1]),
        "checkpoint ids triggered again after the restart: {triggered:?}"
    );
    check_output(&dir, &text);
}

#[test]
fn a_crash_after_an_operator_snapshot() {
    crash_at("task::after-operator-snapshot", 3);
}

#[test]
fn an_error_after_an_operator_snapshot() {
    fail_at("task::after-operator-snapshot", 3);
}

#[test]
fn a_crash_after_the_sink_pre_committed() {
    crash_at("sink::after-pre-commit", 2);
}

#[test]
fn an_error_after_the_sink_pre_committed() {
    fail_at("sink::after-pre-commit", 2);
}

#[test]
fn a_crash_after_the_metadata_before_any_task_heard_of_it() {
    crash_at("checkpoint::after-metadata", 2);
}

#[test]
fn a_crash_inside_the_sink_commit() {
    crash_at("sink::commit", 3);
}

#[test]
fn an_error_inside_the_sink_commit() {
    fail_at("sink::commit", 3);
}

#[test]
fn a_crash_in_the_final_checkpoint() {
    crash_at("checkpoint::final", 0);
}

#[test]
fn an_error_in_the_final_checkpoint() {
    fail_at("checkpoint::final", 0);
}

#[test]
fn a_crash_while_rocksdb_state_files_are_copied() {
    crash_at_in("checkpoint::upload-state-file", 4, "rocksdb");
}

#[test]
fn an_error_while_rocksdb_state_files_are_copied() {
    fail_at_in("checkpoint::upload-state-file", 4, "rocksdb");
}

#[test]
fn a_crash_before_rocksdb_state_files_are_linked() {
    crash_at_in("checkpoint::before-state-link", 4, "rocksdb");
}

#[test]
fn an_error_before_rocksdb_state_files_are_linked() {
    fail_at_in("checkpoint::before-state-link", 4, "rocksdb");
}

#[test]
fn a_crash_after_a_rocksdb_checkpoints_metadata() {
    crash_at_in("checkpoint::after-metadata", 3, "rocksdb");
}

#[test]
fn a_crash_before_released_shared_files_are_deleted_leaves_none_behind() {
    let dir = crash_at_in("checkpoint::release-shared-files", 3, "rocksdb");
    // The files the deleted checkpoints named were left by the crash; the next run
    // deleted them: what remains is what the complete checkpoints name.
    let checkpoints = dir.join("checkpoints");
    let mut named = std::collections::BTreeSet::new();
    for folder in fs::read_dir(&checkpoints).unwrap() {
        let metadata = folder.unwrap().path().join("_metadata");
        let Ok(bytes) = fs::read(&metadata) else {
            continue;
        };
        let metadata: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        for o in metadata["operators"].as_array().unwrap() {
            for s in o["subtasks"].as_array().unwrap() {
                for pair in s["shared"].as_array().cloned().unwrap_or_default() {
                    named.insert(pair[0].as_str().unwrap().to_string());
                }
            }
        }
    }
    let present: std::collections::BTreeSet<String> = fs::read_dir(checkpoints.join("shared"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!named.is_empty());
    assert_eq!(present, named);
}

#[test]
fn a_crash_during_restore() {
    let dir = test_dir("crash-restore");
    let (job, text) = job(&dir);
    let out = run(
        &job,
        &[],
        Some("checkpoint::after-metadata=3*off->return(abort)"),
    );
    assert!(!out.status.success());
    assert!(has_checkpoint(&dir));
    let out = run(
        &job,
        &["--from-checkpoint", "latest"],
        Some("restore::after-sink-recovery=return(abort)"),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("failpoint restore::after-sink-recovery"),
        "{stderr}"
    );
    finish(&dir, &job);
    check_output(&dir, &text);
}

#[test]
fn a_crash_during_stop_with_savepoint() {
    let dir = test_dir("crash-stop");
    let (job, text) = job(&dir);
    let child = sluice_run(env!("CARGO_BIN_EXE_sluice-test-cli"), &job, None)
        .env("FAILPOINTS", "savepoint::synchronous-loop=return(abort)")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    thread::sleep(Duration::from_millis(300));
    // SAFETY: sends a signal to our own child process.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("failpoint savepoint::synchronous-loop"),
        "{stderr}"
    );
    finish(&dir, &job);
    check_output(&dir, &text);
}

/// A full disk at `point`, twice from its `skip + 1`-th pass: the step fails with the
/// cause (a checkpoint is aborted, or a task fails and restarts), and the job finishes
/// by itself with the exact output.
fn disk_full_at(point: &str, skip: u32) {
    let dir = test_dir(&format!("enospc-{}", point.replace("::", "-")));
    let (job, text) = job(&dir);
    let out = run(
        &job,
        &[],
        Some(&format!("{point}={skip}*off->2*return(enospc)->off")),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the job did not get over a full disk at {point}: {stderr}"
    );
    assert!(
        stderr.contains("No space left on device"),
        "the cause is not named: {stderr}"
    );
    check_output(&dir, &text);
}

#[test]
fn a_full_disk_while_writing_a_state_file() {
    disk_full_at("checkpoint::write-state", 4);
}

#[test]
fn a_full_disk_while_writing_checkpoint_metadata() {
    disk_full_at("checkpoint::write-metadata", 2);
}

#[test]
fn a_full_disk_while_the_sink_writes() {
    disk_full_at("sink::write", 10);
}

#[test]
fn a_full_disk_while_the_sink_commits() {
    disk_full_at("sink::append", 2);
}

/// A disk that stays full: the job fails past its restarts, naming the cause, with what
/// it committed intact; once there is room again, a resume finishes it exactly.
#[test]
fn a_disk_that_stays_full_fails_the_job_by_its_cause_and_loses_nothing() {
    let dir = test_dir("enospc-stays");
    let (job, text) = job(&dir);
    let out = run(&job, &[], Some("sink::append=2*off->return(enospc)"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(70), "{stderr}");
    assert!(stderr.contains("No space left on device"), "{stderr}");
    let mut committed = String::new();
    for subtask in 0..2 {
        committed +=
            &fs::read_to_string(dir.join(format!("out/counts-{subtask}.tsv"))).unwrap_or_default();
    }
    // Running counts 1, 2, … n per word: nothing committed twice, nothing skipped.
    final_counts(&committed).expect("the committed output is consistent");
    finish(&dir, &job);
    check_output(&dir, &text);
}
