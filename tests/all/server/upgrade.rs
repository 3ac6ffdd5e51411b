//! A stopped server job started again as a changed job file: an upgrade from its
//! savepoint (settings and parallelism changed), from the client and the command line.

use std::process::Command;
use std::time::Duration;

use sluice::server::model::JobState;
use sluice_tests::{test_dir, throttled_wordcount, write_job};

use super::{ServerProcess, error_of, failure_free_output, host_config, state, wait_for};

#[test]
fn a_stopped_job_starts_again_as_a_changed_job_file_from_its_savepoint() {
    let dir = test_dir("server-upgrade");
    let server = ServerProcess::start(&host_config(&dir, ""));
    let a = server.client(Some("token-a"));
    let text = throttled_wordcount(1, 3000, 1500.0);
    let id = a.submit(&write_job(&dir, &text)).unwrap().id;
    wait_for("records and a checkpoint", Duration::from_secs(30), || {
        let s = a.status(&id).unwrap();
        s.records_read > 0 && s.checkpoints.completed > 0
    });
    let stopped = a.stop(&id, false).unwrap();
    assert_eq!(stopped.state, JobState::Stopped, "{stopped:?}");
    let savepoint = a.status(&id).unwrap().savepoint.unwrap();

    // A changed file that is not valid is refused, named by its own path and line; the
    // job keeps the file it ran by.
    let bad_path = dir.join("upgrade-bad.toml");
    std::fs::write(
        &bad_path,
        text.replace("parallelism = 1", "parallelism = \"two\""),
    )
    .unwrap();
    let e = error_of(a.start_as(&id, Some(&savepoint), &bad_path));
    assert!(
        e.contains(&bad_path.display().to_string()) && e.contains("line") && e.contains("400"),
        "{e}"
    );
    assert_eq!(state(&a, &id), JobState::Stopped);
    assert!(
        a.status(&id)
            .unwrap()
            .job_file
            .unwrap()
            .contains("parallelism = 1")
    );

    // One the savepoint does not fit is refused the same way: a file sink's state
    // cannot be spread over more subtasks.
    let wider_sink = dir.join("upgrade-sink.toml");
    let wider = text.replace(
        "format = \"key-value\"",
        "format = \"key-value\"\nparallelism = 2",
    );
    std::fs::write(&wider_sink, wider).unwrap();
    let e = error_of(a.start_as(&id, Some(&savepoint), &wider_sink));
    assert!(
        e.contains("409") && e.contains("operator 'sink' has operator state"),
        "{e}"
    );
    assert_eq!(state(&a, &id), JobState::Stopped);

    // The command line: the count at parallelism 2 (rescaled from the savepoint), the
    // source no longer throttled.
    let upgraded = dir.join("upgrade.toml");
    std::fs::write(
        &upgraded,
        text.replace("parallelism = 1", "parallelism = 2")
            .replace("\nrate = ", "\n# rate = "),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sluice-test-cli"))
        .args(["start", &id, "--savepoint", &savepoint, "--job"])
        .arg(&upgraded)
        .args(["--server", &server.url, "--token", "token-a"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    wait_for("the job to finish", Duration::from_secs(60), || {
        state(&a, &id) == JobState::Finished
    });
    // Exactly the output of a run that never stopped (in other files from the
    // rescale on: compared line by line, in order of the lines).
    let sorted = |text: &str| {
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        lines.sort();
        lines
    };
    let output = sorted(&String::from_utf8(a.output(&id, None).unwrap()).unwrap());
    let expected = sorted(&failure_free_output(&text));
    assert!(
        output == expected,
        "{} lines of output, {} expected",
        output.len(),
        expected.len()
    );
    let detail = a.status(&id).unwrap();
    assert!(
        detail
            .job_file
            .as_deref()
            .unwrap()
            .contains("parallelism = 2"),
        "{detail:?}"
    );
    assert_eq!(
        detail
            .tasks
            .iter()
            .filter(|t| t.task.starts_with("count"))
            .count(),
        2,
        "{:?}",
        detail.tasks
    );
    assert_eq!(detail.output, ["output/counts.tsv"], "{detail:?}");
}
