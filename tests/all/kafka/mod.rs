//! Kafka sources and sinks against a real Apache Kafka broker (`scripts/test.sh` starts
//! one; see `sluice_tests::kafka::broker`): offsets in checkpoints, start positions,
//! exactly-once output across SIGKILLs, checked against counts computed here.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sluice::server::model::{JobDetail, JobState};
use sluice_tests::kafka::{
    Read, add_partitions, broker, committed_offsets, create_topic, produce, produce_to,
    produce_with_headers, read_committed, unique_topic,
};
use sluice_tests::plugins::{COUNT, FILTER, TEST_MISBEHAVE, TOKENIZE, UPPERCASE};
use sluice_tests::{
    expected_word_counts, final_counts_any_order, has_complete_checkpoint, read_sink_output,
    run_job, sample_text, sluice_run, test_dir, write_job,
};

use crate::checkpoints::{Delays, spawn_sluice};
use crate::server::{ServerProcess, error_of, host_config, wait_for};

mod committer;
mod crashes;
mod event_time;
mod formats;
mod protobuf;
mod restores;
mod secure;
mod sink;

/// Runs `job` as `sluice run` processes, SIGKILLing `kills` of them at random moments
/// (150–600 ms in; the last kill after a checkpoint if none was taken yet) and resuming
/// each from the latest checkpoint, until a run ends. At least one run must have been
/// killed, and one resumed from a checkpoint.
fn run_killed(dir: &Path, job: &Path, kills: usize) {
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    eprintln!("kill seed {seed}");
    let mut delays = Delays(seed);
    let (mut killed, mut resumed) = (0, 0);
    for round in 0..=kills {
        let resume: &[&str] = if has_complete_checkpoint(&dir.join("checkpoints")) {
            resumed += 1;
            &["--from-checkpoint", "latest"]
        } else {
            &[]
        };
        let mut child = spawn_sluice(job, resume);
        if round < kills {
            if round + 1 == kills && resumed == 0 {
                // Under load every earlier kill may have come before the first
                // checkpoint: the last one waits for one, so a run resumes from it.
                let wait = Instant::now() + Duration::from_secs(60);
                while !has_complete_checkpoint(&dir.join("checkpoints"))
                    && Instant::now() < wait
                    && child.try_wait().unwrap().is_none()
                {
                    thread::sleep(Duration::from_millis(5));
                }
            }
            let deadline = Instant::now() + Duration::from_millis(delays.next_ms(150, 600));
            while Instant::now() < deadline && child.try_wait().unwrap().is_none() {
                thread::sleep(Duration::from_millis(10));
            }
            if child.try_wait().unwrap().is_none() {
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
                killed += 1;
                continue;
            }
        }
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "the last run failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        break;
    }
    eprintln!("killed {killed} runs, {resumed} resumed from a checkpoint");
    assert!(
        killed > 0,
        "no run was killed: the job ended too soon to test recovery"
    );
    assert!(
        resumed > 0,
        "no run resumed from a checkpoint: every kill came before the first one"
    );
}

/// Runs the job `job(from)` writes until a checkpoint completes, SIGKILLs it, and runs
/// `job(to)` (the job at another parallelism) from that checkpoint to its end.
fn kill_after_a_checkpoint_and_resume(
    dir: &Path,
    job: impl Fn(u32) -> std::path::PathBuf,
    from: u32,
    to: u32,
) {
    let mut child = spawn_sluice(&job(from), &[]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !has_complete_checkpoint(&dir.join("checkpoints")) {
        assert!(Instant::now() < deadline, "no checkpoint completed");
        assert!(
            child.try_wait().unwrap().is_none(),
            "the job ended before it could be killed"
        );
        thread::sleep(Duration::from_millis(5));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let out = spawn_sluice(&job(to), &["--from-checkpoint", "latest"])
        .wait_with_output()
        .unwrap();
    assert!(
        out.status.success(),
        "the resumed run failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Checks `word<TAB>count` lines of running counts against the counts of `text`.
pub(crate) fn assert_counts(lines: &str, text: &str) {
    let counts = final_counts_any_order(lines).expect("running counts without gaps or repeats");
    assert_eq!(counts, expected_word_counts(text, 1));
}

/// `in.txt` (written from `text`) → an operator waiting `slow_ms` per line (none with
/// 0) → `tokenize` → `count` → a Kafka sink of `topic`, with `more` (sink and checkpoint
/// settings) appended.
fn word_count_to_topic(
    dir: &Path,
    broker: &str,
    topic: &str,
    text: &str,
    slow_ms: u32,
    more: &str,
) -> std::path::PathBuf {
    std::fs::write(dir.join("in.txt"), text).unwrap();
    let slow = if slow_ms == 0 {
        String::new()
    } else {
        format!(
            "[[operator]]\nname = \"slow\"\nplugin = \"{TEST_MISBEHAVE}\"\n\
             config = {{ behavior = \"slow-process\", delay-ms = {slow_ms} }}"
        )
    };
    write_job(
        dir,
        &format!(
            r#"
name = "kafka-out"
[source]
type = "file"
path = "in.txt"
{slow}
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
[[operator]]
name = "count"
plugin = "{COUNT}"
key_by = "key"
parallelism = 2
[sink]
type = "kafka"
bootstrap = "{broker}"
topic = "{topic}"
{more}
"#
        ),
    )
}

/// `word<TAB>count` lines of the records `count` wrote (key: the word, value: its
/// running count).
pub(crate) fn as_count_lines(records: &[Read]) -> String {
    records
        .iter()
        .map(|r| format!("{}\t{}\n", r.key.as_deref().unwrap_or(""), r.value))
        .collect()
}

/// `lines` of sample text written to a new topic of `partitions` partitions; returns
/// the topic and the text.
pub(crate) fn topic_of_lines(
    broker: &str,
    name: &str,
    partitions: i32,
    seed: u64,
    lines: usize,
) -> (String, String) {
    let topic = unique_topic(name);
    create_topic(broker, &topic, partitions);
    let text = sample_text(seed, lines);
    let records: Vec<(Option<&str>, &str, Option<i64>)> =
        text.lines().map(|l| (None, l, None)).collect();
    produce(broker, &topic, &records);
    (topic, text)
}

/// A bounded Kafka source of `topic` at `parallelism` → an operator waiting a
/// millisecond per line (so that the job runs long enough to be killed while it works,
/// however fast the source) → `tokenize` → `count` (2 subtasks) → `out/counts.tsv`,
/// checkpointing every 50 ms.
fn word_count_from_topic(
    dir: &Path,
    broker: &str,
    topic: &str,
    parallelism: u32,
) -> std::path::PathBuf {
    write_job(
        dir,
        &format!(
            r#"
name = "kafka-words"
[source]
type = "kafka"
bootstrap = "{broker}"
topics = "{topic}"
parallelism = {parallelism}
bounded = true
[[operator]]
name = "slow"
plugin = "{TEST_MISBEHAVE}"
config = {{ behavior = "slow-process", delay-ms = 1 }}
parallelism = {parallelism}
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
parallelism = {parallelism}
[[operator]]
name = "count"
plugin = "{COUNT}"
key_by = "key"
parallelism = 2
[sink]
type = "file"
path = "out/counts.tsv"
format = "key-value"
[checkpoint]
interval_ms = 50
dir = "checkpoints"
[runtime]
batch_size = 50
"#
        ),
    )
}

/// Lines of text, written to a topic of 4 partitions, read by a word count with a
/// Kafka source of 2 subtasks (offsets in the checkpoint) and a file sink, SIGKILLed
/// three times: every word counted exactly once, as computed here.
#[test]
fn a_kafka_source_resumes_from_its_checkpointed_offsets_exactly_once() {
    let Some(broker) = broker() else { return };
    let (topic, text) = topic_of_lines(&broker, "lines", 4, 21, 4_000);
    let dir = test_dir("kafka-source-kills");
    let job = word_count_from_topic(&dir, &broker, &topic, 2);
    run_killed(&dir, &job, 3);
    assert_counts(&read_sink_output(&dir.join("out/counts.tsv"), 1), &text);
}

/// The word count's running counts written to a Kafka topic exactly once: SIGKILLed
/// three times, the committed records hold every count of every word once.
#[test]
fn a_kafka_sink_writes_each_record_exactly_once_across_kills() {
    let Some(broker) = broker() else { return };
    let topic = unique_topic("counts");
    create_topic(&broker, &topic, 3);
    let dir = test_dir("kafka-sink-kills");
    let text = sample_text(22, 3_000);
    let more = format!(
        "transactional_id_prefix = \"{topic}\"\nparallelism = 2\n[checkpoint]\ninterval_ms = 100\n\
         dir = \"checkpoints\"\n[runtime]\nbatch_size = 50"
    );
    let job = word_count_to_topic(&dir, &broker, &topic, &text, 1, &more);
    run_killed(&dir, &job, 3);
    assert_counts(&as_count_lines(&read_committed(&broker, &topic)), &text);
}

/// Without checkpoints the sink delivers at least once; a run without failures
/// delivers every record once, keyed as written.
#[test]
fn an_at_least_once_kafka_sink_delivers_every_record() {
    let Some(broker) = broker() else { return };
    let topic = unique_topic("plain");
    create_topic(&broker, &topic, 2);
    let dir = test_dir("kafka-sink-plain");
    let text = sample_text(23, 500);
    let job = word_count_to_topic(&dir, &broker, &topic, &text, 0, "");
    let report = run_job(&job).expect("the job runs");
    let records = read_committed(&broker, &topic);
    assert_counts(&as_count_lines(&records), &text);
    // What the sink counted is what the topic holds.
    let bytes: usize = records
        .iter()
        .map(|r| r.value.len() + r.key.as_ref().map_or(0, String::len))
        .sum();
    assert_eq!(
        sink_counters(&report),
        BTreeMap::from([
            ("kafka-bytes-out".to_string(), bytes as u64),
            ("kafka-records-out".to_string(), records.len() as u64),
        ])
    );
}

/// The counters of the job's sink subtasks, summed.
fn sink_counters(report: &sluice::job::JobReport) -> BTreeMap<String, u64> {
    let mut sum = BTreeMap::new();
    for op in report.tasks.iter().flat_map(|t| &t.operators) {
        if op.operator == "sink" {
            for (name, n) in &op.counters {
                *sum.entry(name.clone()).or_default() += n;
            }
        }
    }
    sum
}

/// Where a source starts: at a timestamp, at the end, or at the offsets its group
/// committed when an earlier run's checkpoints completed.
#[test]
fn kafka_sources_start_at_a_timestamp_the_end_or_the_committed_offsets() {
    let Some(broker) = broker() else { return };
    let topic = unique_topic("starts");
    create_topic(&broker, &topic, 2);
    produce(
        &broker,
        &topic,
        &[
            (Some("a"), "one", Some(1_000)),
            (Some("b"), "two", Some(2_000)),
            (Some("c"), "three", Some(3_000)),
        ],
    );
    let dir = test_dir("kafka-starts");
    let group = unique_topic("group");
    // Runs from `start` in consumer group `group`.
    let run = |start: &str, name: &str, group: &str| -> Vec<String> {
        let job = write_job(
            &dir,
            &format!(
                r#"
name = "{name}"
[source]
type = "kafka"
bootstrap = "{broker}"
topics = ["{topic}"]
start = {start}
group = "{group}"
bounded = true
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
[sink]
type = "file"
path = "{name}.txt"
[checkpoint]
interval_ms = 50
dir = "checkpoints-{name}"
"#
            ),
        );
        run_job(&job).expect("the job runs");
        let mut lines: Vec<String> = std::fs::read_to_string(dir.join(format!("{name}.txt")))
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect();
        lines.sort();
        lines
    };
    let other = unique_topic("other");
    assert_eq!(
        run("{ timestamp_ms = 2000 }", "from-2000", &other),
        ["three", "two"]
    );
    assert_eq!(run("\"latest\"", "latest", &other), Vec::<String>::new());
    // A group without offsets starts from the beginning; the final checkpoint commits
    // them, so the next run from `committed` reads only what came since.
    assert_eq!(
        run("\"committed\"", "committed-1", &group),
        ["one", "three", "two"]
    );
    produce(&broker, &topic, &[(Some("d"), "four", Some(4_000))]);
    assert_eq!(run("\"committed\"", "committed-2", &group), ["four"]);
}

/// A topic that does not exist, or a broker that does not answer, ends the job with an
/// error naming the topic and the brokers (after the restart strategy's attempts).
#[test]
fn a_missing_topic_or_an_unreachable_broker_is_named() {
    let Some(broker) = broker() else { return };
    let dir = test_dir("kafka-unreachable");
    for (bootstrap, topic, expected) in [
        (
            broker.as_str(),
            "no-such-topic",
            "Kafka topic \"no-such-topic\"",
        ),
        ("127.0.0.1:1", "anything", "from 127.0.0.1:1"),
    ] {
        let job = write_job(
            &dir,
            &format!(
                r#"
name = "unreachable"
[source]
type = "kafka"
bootstrap = "{bootstrap}"
topics = "{topic}"
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
[sink]
type = "stdout"
"#
            ),
        );
        let err = format!("{:#}", run_job(&job).expect_err("the job fails"));
        assert!(err.contains(expected), "{expected:?} not in: {err}");
        assert!(err.contains(topic), "{err}");
    }
    // The job restarts by its strategy before it fails for good (the CLI exits 1).
    let job = std::fs::read_to_string(dir.join("job.toml"))
        .unwrap()
        .replace(
            "[sink]",
            "[restart]\nstrategy = \"fixed-delay\"\nattempts = 2\ndelay_ms = 10\n[sink]",
        );
    let job = write_job(
        &dir,
        &job.replace("127.0.0.1:1", &broker)
            .replace("\"anything\"", "\"no-such-topic\""),
    );
    let out = sluice_run(env!("CARGO_BIN_EXE_sluice-test-cli"), &job, None)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Failed past its restarts.
    assert_eq!(out.status.code(), Some(70), "{stderr}");
    for attempt in ["attempt 1", "attempt 2"] {
        assert!(
            stderr.contains(&format!("failed ({attempt}): ")),
            "{attempt}: {stderr}"
        );
    }
    assert!(stderr.contains("Kafka topic \"no-such-topic\""), "{stderr}");
}

/// An unbounded source finds partitions added while it runs and reads them from their
/// beginning; SIGTERM then stops the job with a savepoint.
#[test]
fn a_kafka_source_picks_up_new_partitions() {
    let Some(broker) = broker() else { return };
    let topic = unique_topic("growing");
    create_topic(&broker, &topic, 1);
    produce_to(&broker, &topic, Some(0), &[(None, "first", None)]);
    let dir = test_dir("kafka-new-partitions");
    let job = write_job(
        &dir,
        &format!(
            r#"
name = "kafka-growing"
[source]
type = "kafka"
bootstrap = "{broker}"
topics = "{topic}"
discovery_ms = 100
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
[sink]
type = "file"
path = "out.txt"
[checkpoint]
interval_ms = 50
dir = "checkpoints"
"#
        ),
    );
    let child = spawn_sluice(&job, &[]);
    let output = || std::fs::read_to_string(dir.join("out.txt")).unwrap_or_default();
    let wait_for = |word: &str| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !output().lines().any(|l| l == word) {
            assert!(
                Instant::now() < deadline,
                "{word:?} never arrived: {:?}",
                output()
            );
            thread::sleep(Duration::from_millis(20));
        }
    };
    wait_for("first");
    add_partitions(&broker, &topic, 2);
    produce_to(&broker, &topic, Some(1), &[(None, "second", None)]);
    wait_for("second");
    // SAFETY: sends a signal to our own child process, which is still running.
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lines: Vec<String> = output().lines().map(str::to_string).collect();
    lines.sort();
    assert_eq!(lines, ["first", "second"]);
}

/// Records keep their headers and partition from a Kafka source through operators to a
/// Kafka sink: an operator filters on a header, another changes the value, and the sink
/// with `partitioner = "record"` writes each record to the partition it was read from,
/// with its headers, exactly once.
#[test]
fn headers_and_partitions_go_from_topic_to_topic() {
    let Some(broker) = broker() else { return };
    let (input, output) = (unique_topic("headers-in"), unique_topic("headers-out"));
    create_topic(&broker, &input, 3);
    create_topic(&broker, &output, 3);
    let mut sent = Vec::new();
    for partition in 0..3 {
        let records: Vec<(String, &str)> = (0..40)
            .map(|i| {
                let kind = if i % 3 == 0 { "view" } else { "click" };
                (format!("p{partition}-{i}"), kind)
            })
            .collect();
        let with_headers: Vec<_> = records
            .iter()
            .map(|(v, kind)| {
                let headers: &[(&str, &str)] = if *kind == "view" {
                    &[("type", "view")]
                } else {
                    &[("type", "click"), ("trace", "t1")]
                };
                (None, v.as_str(), None, headers)
            })
            .collect();
        produce_with_headers(&broker, &input, Some(partition), &with_headers);
        sent.extend(
            records
                .into_iter()
                .filter(|(_, kind)| *kind == "click")
                .map(|(v, _)| (partition, v.to_uppercase())),
        );
    }
    let dir = test_dir("kafka-headers");
    let job = write_job(
        &dir,
        &format!(
            r#"
name = "headers"
[source]
type = "kafka"
bootstrap = "{broker}"
topics = "{input}"
bounded = true
[[operator]]
name = "clicks"
plugin = "{FILTER}"
config = {{ field = "header:type", one-of = "click" }}
[[operator]]
name = "upper"
plugin = "{UPPERCASE}"
[sink]
type = "kafka"
bootstrap = "{broker}"
topic = "{output}"
partitioner = "record"
[checkpoint]
interval_ms = 50
dir = "checkpoints"
"#
        ),
    );
    run_job(&job).expect("the job runs");
    let read = read_committed(&broker, &output);
    let mut got: Vec<(i32, String)> = read
        .iter()
        .map(|r| (r.partition, r.value.clone()))
        .collect();
    got.sort();
    sent.sort();
    assert_eq!(got, sent);
    for r in &read {
        assert_eq!(
            r.headers,
            [
                ("type".to_owned(), "click".to_owned()),
                ("trace".into(), "t1".into())
            ],
            "{r:?}"
        );
    }
}

/// A sink writing records to the partition they were read from refuses records that were
/// not read from a partition, naming the sink and the setting.
#[test]
fn a_record_without_a_source_partition_fails_a_sink_partitioning_by_record() {
    let Some(broker) = broker() else { return };
    let output = unique_topic("no-partition");
    create_topic(&broker, &output, 2);
    let dir = test_dir("kafka-no-partition");
    std::fs::write(dir.join("in.txt"), "a\nb\n").unwrap();
    let job = write_job(
        &dir,
        &format!(
            r#"
name = "no-partition"
[source]
type = "file"
path = "in.txt"
[[operator]]
name = "upper"
plugin = "{UPPERCASE}"
[sink]
type = "kafka"
bootstrap = "{broker}"
topic = "{output}"
partitioner = "record"
[restart]
strategy = "none"
"#
        ),
    );
    let err = format!("{:#}", run_job(&job).unwrap_err());
    assert!(err.contains("without a source partition"), "{err}");
    assert!(err.contains("partitioner = \"record\""), "{err}");
    assert!(read_committed(&broker, &output).is_empty());
    // From a topic of more partitions than the sink's: refused as the records come, so
    // no checkpoint holds a record that could never be written.
    let input = unique_topic("three-partitions");
    create_topic(&broker, &input, 3);
    for p in 0..3 {
        produce_to(&broker, &input, Some(p), &[(None, "x", None)]);
    }
    let job = write_job(
        &dir,
        &format!(
            r#"
name = "too-few-partitions"
[source]
type = "kafka"
bootstrap = "{broker}"
topics = "{input}"
bounded = true
[[operator]]
name = "upper"
plugin = "{UPPERCASE}"
[sink]
type = "kafka"
bootstrap = "{broker}"
topic = "{output}"
partitioner = "record"
[checkpoint]
interval_ms = 50
dir = "checkpoints"
[restart]
strategy = "none"
"#
        ),
    );
    let err = format!("{:#}", run_job(&job).unwrap_err());
    assert!(
        err.contains("a record of partition 2, but the topic has 2"),
        "{err}"
    );
    assert!(read_committed(&broker, &output).is_empty());
}

/// A bounded source reading a topic written with transactions (by the exactly-once sink)
/// reaches its end: the commit markers at the end of its partitions are never delivered,
/// and the source counts them as read.
#[test]
fn a_bounded_source_ends_on_a_topic_written_with_transactions() {
    let Some(broker) = broker() else { return };
    let topic = unique_topic("transactional");
    create_topic(&broker, &topic, 2);
    let dir = test_dir("kafka-bounded-transactional");
    let text = sample_text(26, 300);
    let more = "[checkpoint]\ninterval_ms = 20\ndir = \"checkpoints\"";
    let written = word_count_to_topic(&dir, &broker, &topic, &text, 0, more);
    let report = run_job(&written).expect("the writing job runs");
    let counters = sink_counters(&report);
    assert_eq!(
        counters["kafka-records-out"],
        expected_word_counts(&text, 1).values().sum::<u64>()
    );
    assert!(
        counters["kafka-transactions-committed"] >= 1,
        "{counters:?}"
    );
    let reader = test_dir("kafka-bounded-transactional-reader");
    let job = write_job(
        &reader,
        &format!(
            r#"
name = "reader"
[source]
type = "kafka"
bootstrap = "{broker}"
topics = "{topic}"
bounded = true
[[operator]]
name = "upper"
plugin = "{UPPERCASE}"
[sink]
type = "file"
path = "counts.tsv"
format = "key-value"
"#
        ),
    );
    let (done, finished) = crossbeam_channel::bounded(1);
    thread::spawn(move || done.send(run_job(&job).map(|_| ())));
    finished
        .recv_timeout(Duration::from_secs(60))
        .expect("the bounded source never ended")
        .expect("the reading job runs");
    let output = std::fs::read_to_string(reader.join("counts.tsv")).unwrap();
    assert_counts(&output, &text);
}

/// A server job reads and writes Kafka only within its tenant's grant: topics, brokers
/// and client properties outside it are refused at submission with the reason, a tenant
/// without a grant may not use Kafka at all, and a job within it runs exactly once from
/// topic to topic, its group under the tenant's id prefix.
#[test]
fn a_server_job_uses_kafka_only_within_its_tenants_grant() {
    let Some(broker) = broker() else { return };
    let dir = test_dir("kafka-grant");
    let grant = format!(
        "[tenant.a.kafka]\nbootstrap = \"{broker}\"\nread = [\"a\\\\.in-.*\"]\n\
         write = [\"a\\\\.out-.*\"]\nproperties = {{ \"client.id\" = \"tenant-a\" }}\n"
    );
    let server = ServerProcess::start(&host_config(&dir, &grant));
    let a = server.client(Some("token-a"));
    let b = server.client(Some("token-b"));
    let (input, text) = topic_of_lines(&broker, "a.in", 2, 17, 300);
    let output = unique_topic("a.out");
    create_topic(&broker, &output, 2);
    let written = std::cell::Cell::new(0);
    let job = |source: &str, sink: &str| {
        // Each in a file of its own, beside the plugins.
        written.set(written.get() + 1);
        let path = dir.join(format!("job-{}.toml", written.get()));
        std::fs::write(
            &path,
            format!(
                r#"
name = "granted"
[source]
type = "kafka"
bounded = true
{source}
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
[[operator]]
name = "count"
plugin = "{COUNT}"
key_by = "key"
[sink]
type = "kafka"
{sink}
[checkpoint]
interval_ms = 100
[runtime]
batch_size = 10
"#
            ),
        )
        .unwrap();
        path
    };
    let good_source = format!("topics = \"{input}\"");
    let good_sink = format!("topic = \"{output}\"");
    let refusals = [
        (
            job("topics = \"b.secret\"", &good_sink),
            "source 'source': topic \"b.secret\" may not be read",
        ),
        (
            job(&good_source, "topic = \"elsewhere\""),
            "sink 'sink': topic \"elsewhere\" may not be written",
        ),
        (
            job(
                &format!(
                    "{good_source}\nformat = \"json\"\non_bad_record = {{ dead_letter = \"b.dead\" }}"
                ),
                &good_sink,
            ),
            "source 'source': dead-letter topic \"b.dead\" may not be written",
        ),
        (
            job(
                &format!("{good_source}\nbootstrap = \"127.0.0.1:1\""),
                &good_sink,
            ),
            "broker \"127.0.0.1:1\" is not one of",
        ),
        (
            job(
                &format!(
                    "{good_source}\nproperties = {{ \"sasl.kerberos.kinit.cmd\" = \"touch /tmp/x\" }}"
                ),
                &good_sink,
            ),
            "property \"sasl.kerberos.kinit.cmd\" is not one a server job may set",
        ),
    ];
    for (path, reason) in refusals {
        let e = error_of(a.submit(&path));
        assert!(e.contains("403"), "{e}");
        assert!(e.contains(reason), "{e}");
        assert!(e.contains("outside tenant 'a''s Kafka grant"), "{e}");
    }
    let e = error_of(b.submit(&job(&good_source, &good_sink)));
    assert!(
        e.contains("403") && e.contains("tenant 'b' has no Kafka grant"),
        "{e}"
    );
    assert_eq!(a.list().unwrap().jobs, []);

    // Within the grant: the brokers come from it, and the output is exact. Slowed down
    // (5 ms a line) so that its consumer lag shows while it runs.
    let slow_source = format!(
        "{good_source}\nproperties = {{ \"statistics.interval.ms\" = \"100\" }}\n\
         [[operator]]\nname = \"slow\"\nplugin = \"{TEST_MISBEHAVE}\"\n\
         config = {{ behavior = \"slow-process\", delay-ms = 5 }}"
    );
    let submitted = a.submit(&job(&slow_source, &good_sink)).unwrap();
    let id = submitted.id.clone();
    let source_of = |status: &JobDetail| status.tasks.first().and_then(|t| t.source.clone());
    wait_for("the source's lag", Duration::from_secs(60), || {
        let s = a.status(&id).unwrap();
        assert_ne!(
            s.job.state,
            JobState::Finished,
            "no lag seen while it ran: {s:?}"
        );
        source_of(&s).is_some_and(|source| source.lag.values().any(|&lag| lag > 0))
    });
    let metrics = String::from_utf8(a.request("GET", "/metrics", None).unwrap().1).unwrap();
    assert!(
        metrics.contains("sluice_source_lag_records{")
            // (Of a partition of the input: which ones the statistics cover yet varies.)
            && metrics.contains(&format!("partition=\"{input}/")),
        "{metrics}"
    );
    wait_for("the job to finish", Duration::from_secs(120), || {
        let s = a.status(&id).unwrap();
        assert_ne!(s.job.state, JobState::Failed, "{s:?}");
        s.job.state == JobState::Finished
    });
    assert_counts(&as_count_lines(&read_committed(&broker, &output)), &text);
    let status = a.status(&id).unwrap();
    let source = source_of(&status).unwrap_or_else(|| panic!("no source: {status:?}"));
    assert_eq!(
        source.counters.get("kafka-records-in"),
        Some(&300),
        "{source:?}"
    );
    // Read to its end: nothing is left unread.
    assert!(
        !source.lag.is_empty() && source.lag.values().all(|&lag| lag == 0),
        "{source:?}"
    );
    assert_eq!(
        source.counters.get("kafka-bytes-in").copied(),
        Some(text.lines().map(str::len).sum::<usize>() as u64),
        "{source:?}"
    );
    let sink = status
        .tasks
        .iter()
        .flat_map(|t| &t.operators)
        .find(|op| op.operator == "sink")
        .cloned()
        .unwrap();
    assert!(
        sink.counters.get("kafka-transactions-committed") > Some(&0),
        "{sink:?}"
    );
    let metrics = String::from_utf8(a.request("GET", "/metrics", None).unwrap().1).unwrap();
    assert!(
        metrics.contains("counter=\"kafka-records-in\"} 300"),
        "{metrics}"
    );
    // Its tasks' input ended: they have no event time, and no lag behind the clock.
    assert!(
        !metrics.contains("sluice_task_watermark_lag_seconds{")
            && !metrics.contains("} 9223372036854775807"),
        "{metrics}"
    );
    // Offsets were committed to the group under the tenant's prefix.
    let committed = committed_offsets(&broker, "a.sluice-granted-source", &input);
    assert_eq!(committed.len(), 2, "{committed:?}");
}

/// A source of `topics = { pattern = ... }` reads every topic whose whole name matches,
/// and no other.
#[test]
fn a_kafka_source_reads_the_topics_a_pattern_matches() {
    let Some(broker) = broker() else { return };
    let prefix = unique_topic("pattern");
    let mut text = String::new();
    for (name, seed) in [("x", 31), ("y", 32)] {
        let topic = format!("{prefix}.{name}");
        create_topic(&broker, &topic, 2);
        let lines = sample_text(seed, 200);
        let records: Vec<(Option<&str>, &str, Option<i64>)> =
            lines.lines().map(|l| (None, l, None)).collect();
        produce(&broker, &topic, &records);
        text.push_str(&lines);
    }
    // Matches only in part: not read.
    let other = format!("{prefix}.x-not");
    create_topic(&broker, &other, 1);
    produce(&broker, &other, &[(None, "unwanted words here", None)]);
    let dir = test_dir("kafka-pattern");
    let job = word_count_from_topic(&dir, &broker, "PLACEHOLDER", 2);
    let pattern = format!("{}\\\\.(x|y)", prefix.replace('.', "\\\\."));
    let job_text = std::fs::read_to_string(&job)
        .unwrap()
        .replace("\"PLACEHOLDER\"", &format!("{{ pattern = \"{pattern}\" }}"));
    std::fs::write(&job, job_text).unwrap();
    run_job(&job).unwrap();
    assert_counts(&read_sink_output(&dir.join("out/counts.tsv"), 1), &text);
}
