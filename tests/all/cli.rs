//! The `sluice` command as a user runs it.

use std::path::Path;
use std::process::{Command, Output};

use sluice_tests::plugins::{COUNT, TOKENIZE};
use sluice_tests::{sample_text, scratch_root, test_dir, write_job};

/// Runs `sluice` with `args` and a compile cache in `cache`.
pub fn sluice_with_cache(args: &[&str], cache: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice-test-cli"))
        .args(args)
        .env("SLUICE_CACHE_DIR", cache)
        .env_remove("SLUICE_LOG")
        .output()
        .expect("running sluice")
}

/// Runs `sluice` with `args` and the shared compile cache.
pub fn sluice(args: &[&str]) -> Output {
    sluice_with_cache(args, &scratch_root().join("cache"))
}

/// `(exit code, stdout, stderr)`.
pub fn outcome(o: &Output) -> (Option<i32>, String, String) {
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn run_prints_a_summary_and_where_the_output_went() {
    let dir = test_dir("cli-run");
    std::fs::write(dir.join("in.txt"), sample_text(3, 200)).unwrap();
    let job = write_job(
        &dir,
        &format!(
            r#"
name = "cli"
[source]
type = "file"
path = "in.txt"
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
[[operator]]
name = "count"
plugin = "{COUNT}"
key_by = "key"
[sink]
type = "file"
path = "out/counts.tsv"
format = "key-value"
"#
        ),
    );
    let (code, _, stderr) = outcome(&sluice(&["run", job.to_str().unwrap()]));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("job 'cli' finished"), "{stderr}");
    assert!(stderr.contains("output written to"), "{stderr}");
    assert!(stderr.contains("counts.tsv"), "{stderr}");
    assert!(stderr.contains("tokenize (1)"), "{stderr}");
    assert!(dir.join("out/counts.tsv").exists());
}

#[test]
fn validate_describes_tasks_and_plugins() {
    let dir = test_dir("cli-validate");
    let job = write_job(
        &dir,
        &format!(
            r#"
name = "v"
[source]
type = "generator"
records = 10
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
[[operator]]
name = "count"
plugin = "{COUNT}"
parallelism = 3
key_by = "key"
[sink]
type = "stdout"
"#
        ),
    );
    let (code, stdout, stderr) = outcome(&sluice(&["validate", job.to_str().unwrap()]));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains("job 'v' (tenant 'default') is valid"),
        "{stdout}"
    );
    assert!(stdout.contains("task 0: source -> tokenize x1"), "{stdout}");
    assert!(
        stdout.contains("task 1: count x3 <- hash from task 0"),
        "{stdout}"
    );
    assert!(
        stdout.contains("task 2: sink x1 <- rebalance from task 1"),
        "{stdout}"
    );
    assert!(
        stdout.contains("sluice:operator/stream-operator@0.1.0"),
        "{stdout}"
    );
}

#[test]
fn inspect_shows_the_interface_and_the_second_load_uses_the_cache() {
    let cache = test_dir("cli-cache");
    let (code, stdout, stderr) = outcome(&sluice_with_cache(&["inspect", COUNT], &cache));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains("exports:   sluice:operator/stream-operator@0.1.0"),
        "{stdout}"
    );
    assert!(stdout.contains("process-watermark"), "{stdout}");
    assert!(
        stdout.contains("imports:") && stdout.contains("sluice:operator/runtime@0.1.0"),
        "{stdout}"
    );
    assert!(stdout.contains("compiled:  Compiled"), "{stdout}");
    let (_, stdout, _) = outcome(&sluice_with_cache(&["inspect", COUNT], &cache));
    assert!(
        stdout.contains("compiled:  Disk"),
        "second run compiled again: {stdout}"
    );
}

#[test]
fn stdout_sink_writes_records_to_stdout() {
    let dir = test_dir("cli-stdout");
    std::fs::write(dir.join("in.txt"), "b a\nb\nb\n").unwrap();
    let job = write_job(
        &dir,
        &format!(
            r#"
name = "s"
[source]
type = "file"
path = "in.txt"
[[operator]]
name = "count"
plugin = "{COUNT}"
key_by = "value"
[sink]
type = "stdout"
format = "key-value"
"#
        ),
    );
    let (code, stdout, stderr) = outcome(&sluice(&["run", "--quiet", job.to_str().unwrap()]));
    assert_eq!(code, Some(0), "{stderr}");
    let mut lines: Vec<&str> = stdout.lines().collect();
    lines.sort();
    assert_eq!(lines, ["b\t1", "b\t2", "b a\t1"]);
}
