//! Restores that meet what Kafka already holds: a pattern source whose topic is missing
//! from the first metadata read after a restore, and offsets that retention deleted.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use sluice_tests::kafka::{broker, create_topic, delete_records, produce, unique_topic};
use sluice_tests::plugins::UPPERCASE;
use sluice_tests::{sluice_run, test_dir, write_job};

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The lines of `path` (none while it does not exist).
fn lines_of(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Starts `sluice run JOB ARGS` with `failpoints`.
fn spawn(job: &Path, args: &[&str], failpoints: Option<&str>) -> Child {
    let mut command = sluice_run(env!("CARGO_BIN_EXE_sluice-test-cli"), job, None);
    command
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(f) = failpoints {
        command.env("FAILPOINTS", f);
    }
    command.spawn().expect("spawning sluice")
}

/// Waits until `path` has at least `n` lines, while `child` runs.
fn wait_for_lines(path: &Path, n: usize, child: &mut Child) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while lines_of(path).len() < n {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the job ended with {} of {n} lines",
            lines_of(path).len()
        );
        assert!(
            Instant::now() < deadline,
            "{} of {n} lines after a minute",
            lines_of(path).len()
        );
        thread::sleep(Duration::from_millis(20));
    }
}

/// Stops `child` with a savepoint (SIGTERM) and checks that it succeeded.
fn stop(child: Child) {
    // SAFETY: sends a signal to our own child process, which is still running.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
}

/// `values` upper-cased and sorted, as an `uppercase` job writes them.
fn upper_sorted(values: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut v: Vec<String> = values.into_iter().map(|v| v.to_uppercase()).collect();
    v.sort();
    v
}

/// Writes `records` values `NAME-i` for `i` in `range` to `topic`.
fn produce_numbered(broker: &str, topic: &str, name: &str, range: std::ops::Range<u32>) {
    let values: Vec<String> = range.map(|i| format!("{name}-{i}")).collect();
    let records: Vec<_> = values.iter().map(|v| (None, v.as_str(), None)).collect();
    produce(broker, topic, &records);
}

/// A Kafka source of `topics` (a TOML value) with `more` settings → `uppercase` → the
/// file `out.txt`, checkpointing every 50 ms.
fn topics_to_file(dir: &Path, broker: &str, topics: &str, more: &str) -> PathBuf {
    write_job(
        dir,
        &format!(
            r#"
name = "restored-source"
[source]
type = "kafka"
bootstrap = "{broker}"
topics = {topics}
discovery_ms = 100
{more}
[[operator]]
name = "upper"
plugin = "{UPPERCASE}"
[sink]
type = "file"
path = "out.txt"
[checkpoint]
interval_ms = 50
dir = "checkpoints"
"#
        ),
    )
}

/// A pattern source restored from a savepoint whose first metadata read reports one of
/// its topics with an error (a failpoint) keeps that topic's restored offsets until a
/// later read finds it: the topic is read on from where it was, not again from its
/// start.
#[test]
fn a_pattern_source_keeps_the_offsets_of_a_topic_missing_from_its_first_metadata_read() {
    let Some(broker) = broker() else { return };
    let prefix = unique_topic("flaky");
    let (x, y) = (format!("{prefix}.x"), format!("{prefix}.y"));
    for topic in [&x, &y] {
        create_topic(&broker, topic, 1);
        produce_numbered(&broker, topic, topic, 0..50);
    }
    let dir = test_dir("kafka-pattern-restore");
    let pattern = format!(
        "{{ pattern = \"{}\\\\..*\" }}",
        prefix.replace('.', "\\\\.")
    );
    let job = topics_to_file(&dir, &broker, &pattern, "");
    let out = dir.join("out.txt");
    let mut first = spawn(&job, &[], None);
    wait_for_lines(&out, 100, &mut first);
    stop(first);

    for topic in [&x, &y] {
        produce_numbered(&broker, topic, topic, 50..60);
    }
    let failpoint = format!("kafka-source::topic-metadata=1*return({y})");
    let mut second = spawn(&job, &["--from-checkpoint", "latest"], Some(&failpoint));
    wait_for_lines(&out, 120, &mut second);
    // Time for discovery (every 100 ms) to find the topic again and for checkpoints to
    // commit what it read.
    thread::sleep(Duration::from_millis(1_500));
    stop(second);
    let expected = [&x, &y]
        .into_iter()
        .flat_map(|t| (0..60).map(move |i| format!("{t}-{i}")));
    let got = upper_sorted(lines_of(&out));
    let mut repeated = got.clone();
    repeated.dedup();
    assert_eq!(
        got.len(),
        repeated.len(),
        "{} lines repeated",
        got.len() - repeated.len()
    );
    assert_eq!(got, upper_sorted(expected));
}

/// A restored offset that retention deleted fails the source by default, naming the
/// topic, the partition, the offset and the range the partition holds, and the job is
/// not restarted; `on_out_of_range = "earliest"` reads on from the log's start instead.
#[test]
fn a_restored_offset_no_longer_in_the_log_fails_the_source_unless_told_where_to_go() {
    let Some(broker) = broker() else { return };
    let topic = unique_topic("retention");
    create_topic(&broker, &topic, 1);
    produce_numbered(&broker, &topic, "r", 0..50);
    let dir = test_dir("kafka-out-of-range");
    let restart = "[restart]\nstrategy = \"fixed-delay\"\nattempts = 3\ndelay_ms = 10";
    let job = topics_to_file(&dir, &broker, &format!("\"{topic}\""), "");
    let with_restarts = std::fs::read_to_string(&job).unwrap() + restart;
    std::fs::write(&job, &with_restarts).unwrap();
    let out = dir.join("out.txt");
    let mut first = spawn(&job, &[], None);
    wait_for_lines(&out, 50, &mut first);
    stop(first);

    produce_numbered(&broker, &topic, "r", 50..100);
    delete_records(&broker, &topic, 0, 80);
    let mut second = spawn(&job, &["--from-checkpoint", "latest"], None);
    let deadline = Instant::now() + Duration::from_secs(30);
    while second.try_wait().unwrap().is_none() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(20));
    }
    if second.try_wait().unwrap().is_none() {
        let _ = second.kill();
        let out = second.wait_with_output().unwrap();
        panic!(
            "the job went on past a deleted offset (read {} lines): {}",
            lines_of(&dir.join("out.txt")).len(),
            stderr(&out)
        );
    }
    let failed = second.wait_with_output().unwrap();
    let err = stderr(&failed);
    assert!(!failed.status.success(), "{err}");
    for needed in [
        format!("{topic}/0"),
        "offset 50".to_string(),
        "80".to_string(),
        "100".to_string(),
        "on_out_of_range".to_string(),
    ] {
        assert!(err.contains(&needed), "{needed:?} not in: {err}");
    }
    assert!(!err.contains("failed (attempt 1)"), "restarted: {err}");
    assert_eq!(lines_of(&out).len(), 50);

    std::fs::write(
        &job,
        with_restarts.replace(
            "discovery_ms = 100",
            "discovery_ms = 100\non_out_of_range = \"earliest\"",
        ),
    )
    .unwrap();
    let mut third = spawn(&job, &["--from-checkpoint", "latest"], None);
    wait_for_lines(&out, 70, &mut third);
    stop(third);
    let expected = (0..50).chain(80..100).map(|i| format!("r-{i}"));
    assert_eq!(upper_sorted(lines_of(&out)), upper_sorted(expected));
}
