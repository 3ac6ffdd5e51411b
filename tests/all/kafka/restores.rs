//! Restores that meet what Kafka already holds: a checkpoint older than an exactly-once
//! sink's last commit (refused, or rewound when asked), a run forked into another
//! checkpoint folder and crashed before its first commit, a pattern source whose topic
//! is missing from the first metadata read after a restore, and offsets that retention
//! deleted.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::unbounded;
use sluice::job::{JobControl, JobOutcome, RestorePoint};
use sluice_tests::kafka::{
    Read, broker, committed_offsets, create_topic, delete_records, end_offsets, produce,
    read_committed, read_committed_from, unique_topic,
};
use sluice_tests::plugins::UPPERCASE;
use sluice_tests::{
    TestJob, expected_word_counts, has_complete_checkpoint, sample_text, sluice_run, test_dir,
    write_job,
};

use super::word_count_to_topic;
use crate::failpoints::run as sluice;

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The running counts of each word in `records` (written as `count` writes them).
fn counts_by_word(records: &[Read]) -> BTreeMap<String, Vec<u64>> {
    let mut by_word: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for r in records {
        by_word
            .entry(r.key.clone().unwrap_or_default())
            .or_default()
            .push(r.value.parse().expect("a count"));
    }
    by_word
}

/// Checks that `records`, written by a run that restored counts `before`, hold every
/// later running count of the words of `text` once: nothing lost, nothing repeated.
fn assert_counts_after(records: &[Read], before: &BTreeMap<String, Vec<u64>>, text: &str) {
    let mut want = BTreeMap::new();
    for (word, total) in expected_word_counts(text, 1) {
        let from = before
            .get(&word)
            .and_then(|c| c.iter().max())
            .copied()
            .unwrap_or(0);
        if from < total {
            want.insert(word, (from + 1..=total).collect::<Vec<u64>>());
        }
    }
    let mut got = counts_by_word(records);
    for counts in got.values_mut() {
        counts.sort_unstable();
    }
    // Per word, the first and last count and how many (the whole lists are long).
    let differ: Vec<String> = want
        .keys()
        .chain(got.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .filter(|w| got.get(*w) != want.get(*w))
        .map(|w| {
            let span = |c: Option<&Vec<u64>>| {
                c.map_or("none".to_string(), |c| {
                    format!("{:?}..={:?} ({})", c.first(), c.last(), c.len())
                })
            };
            format!(
                "{w}: {} written, {} due",
                span(got.get(w)),
                span(want.get(w))
            )
        })
        .collect();
    assert!(differ.is_empty(), "{}", differ.join("\n"));
}

/// A word count of `in.txt` (a line a millisecond) to `topic`, exactly once with the
/// transactional ids `PREFIX-0` (`prefix` is the topic), checkpointing every 30 ms into
/// `checkpoints` and keeping them all.
fn counts_to_topic(dir: &Path, broker: &str, topic: &str, text: &str) -> PathBuf {
    let more = format!(
        "transactional_id_prefix = \"{topic}\"\n[checkpoint]\ninterval_ms = 30\n\
         dir = \"checkpoints\"\nretain = 100\n[runtime]\nbatch_size = 20"
    );
    word_count_to_topic(dir, broker, topic, text, 1, &more)
}

/// A job that ran on past a savepoint.
struct RanOn {
    job: PathBuf,
    text: String,
    savepoint: PathBuf,
    savepoint_id: u64,
    /// The running counts committed when the savepoint was taken.
    at_savepoint: BTreeMap<String, Vec<u64>>,
    /// Where the topic's partitions ended when the job had finished.
    ends: BTreeMap<i32, i64>,
    /// The checkpoint the sink's marker named then.
    marker: u64,
}

/// Runs [`counts_to_topic`], stops it with a savepoint part way, then resumes it from
/// the savepoint to its end: the sink's marker names a checkpoint past the savepoint.
fn run_on_past_a_savepoint(dir: &Path, broker: &str, topic: &str) -> RanOn {
    let text = sample_text(41, 1_500);
    let job = counts_to_topic(dir, broker, topic, &text);
    let first = TestJob::load(&job).unwrap();
    let (reply, answer) = unbounded();
    let control = first.control.clone();
    let stopper = thread::spawn(move || {
        thread::sleep(Duration::from_millis(700));
        control
            .send(JobControl::StopWithSavepoint {
                drain: false,
                reply,
            })
            .unwrap();
        answer.recv().unwrap()
    });
    let report = first.run(RestorePoint::Fresh).unwrap();
    let savepoint = stopper.join().unwrap().expect("the savepoint succeeds");
    assert!(
        matches!(report.outcome, JobOutcome::Stopped { .. }),
        "{:?}",
        report.outcome
    );
    let at_savepoint = counts_by_word(&read_committed(broker, topic));
    let second = TestJob::load(&job).unwrap();
    let report = second.run(RestorePoint::Path(savepoint.clone())).unwrap();
    assert_eq!(report.outcome, JobOutcome::Finished);
    let savepoint_id = checkpoint_id(&savepoint);
    let marker = committed_offsets(broker, &format!("{topic}-0"), topic)[&0] as u64;
    assert!(
        marker > savepoint_id,
        "the marker names checkpoint {marker}, not one after savepoint {savepoint_id}"
    );
    RanOn {
        job,
        text,
        savepoint,
        savepoint_id,
        at_savepoint,
        ends: end_offsets(broker, topic),
        marker,
    }
}

/// The id in a checkpoint or savepoint folder's name (`chk-0000000012`).
fn checkpoint_id(folder: &Path) -> u64 {
    let name = folder.file_name().unwrap().to_string_lossy();
    name.rsplit('-').next().unwrap().parse().unwrap()
}

/// A restore of a checkpoint older than the checkpoint an exactly-once Kafka sink last
/// committed would write the records after it again: refused (status 75, naming the
/// sink, the topic and both checkpoints), whether the older checkpoint is named or
/// `latest` falls back to it past corrupt newer ones. With `--allow-rewind` the run goes
/// on from it: what was committed stays, and the records after it are written again.
#[test]
fn restoring_a_checkpoint_older_than_a_kafka_sinks_last_commit_is_refused_unless_rewinding() {
    let Some(broker) = broker() else { return };
    let topic = unique_topic("rewind");
    create_topic(&broker, &topic, 2);
    let dir = test_dir("kafka-rewind");
    let ran = run_on_past_a_savepoint(&dir, &broker, &topic);
    let savepoint = ran.savepoint.to_str().unwrap();

    let refused = sluice(&ran.job, &["--from-checkpoint", savepoint], None);
    let err = stderr(&refused);
    assert_eq!(refused.status.code(), Some(75), "{err}");
    for needed in [
        "sink 'sink'".to_string(),
        format!("{topic:?}"),
        format!("checkpoint {}", ran.marker),
        format!("checkpoint {}", ran.savepoint_id),
        "--allow-rewind".to_string(),
    ] {
        assert!(err.contains(&needed), "{needed:?} not in: {err}");
    }
    assert_eq!(end_offsets(&broker, &topic), ran.ends, "nothing is written");

    // The checkpoints from the one the marker names on are corrupt: `latest` falls back
    // to an older one, which is refused too.
    for entry in std::fs::read_dir(dir.join("checkpoints")).unwrap() {
        let folder = entry.unwrap().path();
        if folder.is_dir() && checkpoint_id(&folder) >= ran.marker {
            for file in std::fs::read_dir(&folder).unwrap() {
                let file = file.unwrap().path();
                if file.extension().is_some_and(|e| e == "state") {
                    std::fs::write(&file, b"corrupt").unwrap();
                }
            }
        }
    }
    let refused = sluice(&ran.job, &["--from-checkpoint", "latest"], None);
    let err = stderr(&refused);
    assert_eq!(refused.status.code(), Some(75), "{err}");
    assert!(err.contains(&format!("checkpoint {}", ran.marker)), "{err}");

    let rewound = sluice(
        &ran.job,
        &["--from-checkpoint", savepoint, "--allow-rewind"],
        None,
    );
    assert!(rewound.status.success(), "{}", stderr(&rewound));
    assert_counts_after(
        &read_committed_from(&broker, &topic, &ran.ends),
        &ran.at_savepoint,
        &ran.text,
    );
}

/// A run forked from a savepoint into another checkpoint folder, its sink writing with
/// the same transactional ids, SIGKILLed (aborted) after its first checkpoint and before
/// that checkpoint's transaction commits, then resumed from its own checkpoint: its
/// checkpoint ids go on above every checkpoint the sink's marker named, so its records
/// are written, not taken for committed ones.
#[test]
fn a_fork_into_another_checkpoint_folder_crashed_before_its_first_commit_loses_nothing() {
    let Some(broker) = broker() else { return };
    let topic = unique_topic("fork");
    create_topic(&broker, &topic, 2);
    let dir = test_dir("kafka-fork");
    let ran = run_on_past_a_savepoint(&dir, &broker, &topic);
    let fork = dir.join("fork.toml");
    let text = std::fs::read_to_string(&ran.job).unwrap();
    std::fs::write(
        &fork,
        text.replace("dir = \"checkpoints\"", "dir = \"fork-checkpoints\""),
    )
    .unwrap();

    let crashed = sluice(
        &fork,
        &[
            "--from-checkpoint",
            ran.savepoint.to_str().unwrap(),
            "--allow-rewind",
        ],
        Some("kafka-sink::before-commit=return(abort)"),
    );
    let err = stderr(&crashed);
    assert!(
        !crashed.status.success() && err.contains("failpoint kafka-sink::before-commit"),
        "the fork did not crash before its first commit: {err}"
    );
    assert!(has_complete_checkpoint(&dir.join("fork-checkpoints")));

    let resumed = sluice(&fork, &["--from-checkpoint", "latest"], None);
    assert!(resumed.status.success(), "{}", stderr(&resumed));
    assert_counts_after(
        &read_committed_from(&broker, &topic, &ran.ends),
        &ran.at_savepoint,
        &ran.text,
    );
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
