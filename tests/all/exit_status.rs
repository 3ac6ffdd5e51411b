//! `sluice` exits with a status that says what went wrong (the table of docs/cli.md and
//! `sluice --help`), so that a script or a service manager can act on it.

use sluice_tests::plugins::{COUNT, TEST_MISBEHAVE};
use sluice_tests::{test_dir, write_job};

use crate::cli::{outcome, sluice};

/// Runs `sluice args` and checks its exit status, and that stderr says `says`.
fn exits(args: &[&str], status: i32, says: &str) {
    let (code, stdout, stderr) = outcome(&sluice(args));
    assert_eq!(
        code,
        Some(status),
        "sluice {}: {stdout}{stderr}",
        args.join(" ")
    );
    assert!(stderr.contains(says), "sluice {}: {stderr}", args.join(" "));
}

#[test]
fn a_job_file_that_does_not_parse_exits_65() {
    let dir = test_dir("exit-bad-file");
    let job = write_job(&dir, "name = \"broken\"\n[source\ntype = \"generator\"\n");
    let job = job.to_str().unwrap();
    exits(&["validate", job], 65, "job.toml");
    exits(&["run", job], 65, "job.toml");
    // A host file too, and a plugin that is no component.
    let host = dir.join("host.toml");
    std::fs::write(&host, "[tenant.a]\nmemory_mb = \"lots\"\n").unwrap();
    let good = write_job(
        &dir,
        &format!(
            "name = \"ok\"\n[source]\ntype = \"generator\"\nrecords = 1\n[[operator]]\n\
             name = \"count\"\nplugin = \"{COUNT}\"\nkey_by = \"value\"\n[sink]\ntype = \"stdout\"\n"
        ),
    );
    exits(
        &[
            "validate",
            good.to_str().unwrap(),
            "--host-config",
            host.to_str().unwrap(),
        ],
        65,
        "host.toml",
    );
    exits(&["inspect", host.to_str().unwrap()], 65, "host.toml");
}

#[test]
fn wrong_arguments_exit_2() {
    exits(&["run", "--no-such-option"], 2, "--no-such-option");
    exits(&["run"], 2, "no job to run");
}

/// A fresh start of a job that ran before is refused, and nothing changes.
#[test]
fn a_refused_start_exits_75() {
    let dir = test_dir("exit-refused");
    let job = write_job(
        &dir,
        &format!(
            r#"
name = "again"
[source]
type = "generator"
records = 100
[[operator]]
name = "count"
plugin = "{COUNT}"
key_by = "value"
[sink]
type = "file"
path = "out.tsv"
"#
        ),
    );
    let job = job.to_str().unwrap();
    let (code, _, stderr) = outcome(&sluice(&["run", "--quiet", job]));
    assert_eq!(code, Some(0), "{stderr}");
    let before = std::fs::read(dir.join("out.tsv")).unwrap();
    exits(&["run", "--quiet", job], 75, "has run before");
    assert_eq!(std::fs::read(dir.join("out.tsv")).unwrap(), before);
    exits(
        &["run", "--quiet", job, "--from-checkpoint", "latest"],
        75,
        "needs checkpointing",
    );
}

#[test]
fn nothing_answering_exits_69() {
    exits(
        &["list", "--server", "http://127.0.0.1:9", "--token", "t"],
        69,
        "http://127.0.0.1:9/v1/jobs",
    );
    let dir = test_dir("exit-unreachable");
    exits(
        &["savepoint", dir.to_str().unwrap()],
        69,
        "no running job answers",
    );
}

/// An operator that fails in every attempt: the job fails once its restarts are spent.
#[test]
fn a_job_that_fails_past_its_restarts_exits_70() {
    let dir = test_dir("exit-job-failed");
    let job = write_job(
        &dir,
        &format!(
            r#"
name = "doomed"
[source]
type = "generator"
records = 100
[[operator]]
name = "misbehave"
plugin = "{TEST_MISBEHAVE}"
config = {{ behavior = "error-in-process" }}
[sink]
type = "file"
path = "out.tsv"
[restart]
strategy = "fixed-delay"
attempts = 2
delay_ms = 10
"#
        ),
    );
    exits(
        &["run", "--quiet", job.to_str().unwrap()],
        70,
        "job 'doomed' failed after 2 restarts",
    );
}
