//! The Kafka sink's settings against the broker and the job: a transaction timeout the
//! broker does not allow, a cancellation while the producer's queue is full, the
//! transactional ids a sink takes when the job file names none, and the records it holds
//! for checkpoints, charged to its tenant.

use std::path::Path;
use std::thread;
use std::time::Duration;

use crossbeam_channel::unbounded;
use sluice::job::{JobControl, JobFailed, JobOutcome, RestorePoint, load_graph};
use sluice_tests::kafka::{
    broker, committed_offsets, create_topic, end_offsets, read_committed, read_committed_from,
    unique_topic,
};
use sluice_tests::plugins::TOKENIZE;
use sluice_tests::{TestJob, acme_host, run_job, sample_text, test_dir, write_job};

use super::{as_count_lines, assert_counts, word_count_to_topic};

/// `in.txt` → `tokenize` → a Kafka sink of `topic` at `bootstrap` with `more` (its
/// further fields and the tables after it).
fn lines_to_topic(dir: &Path, bootstrap: &str, topic: &str, more: &str) -> std::path::PathBuf {
    std::fs::write(dir.join("in.txt"), sample_text(51, 200)).unwrap();
    write_job(
        dir,
        &format!(
            r#"
name = "sink-settings"
[source]
type = "file"
path = "in.txt"
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
[sink]
type = "kafka"
bootstrap = "{bootstrap}"
topic = "{topic}"
{more}
"#
        ),
    )
}

/// A sink whose `transaction.timeout.ms` is above what the broker allows
/// (`transaction.max.timeout.ms`, 15 minutes by default) fails the job at its start,
/// naming both values and the broker's setting, and is not restarted: no restart can fix
/// it.
#[test]
fn a_transaction_timeout_above_the_brokers_maximum_fails_the_job_at_its_start() {
    let Some(broker) = broker() else { return };
    let topic = unique_topic("long-transactions");
    create_topic(&broker, &topic, 1);
    let dir = test_dir("kafka-transaction-timeout");
    let job = lines_to_topic(
        &dir,
        &broker,
        &topic,
        "properties = { \"transaction.timeout.ms\" = \"1000000\" }\n\
         [checkpoint]\ninterval_ms = 50\ndir = \"checkpoints\"\n\
         [restart]\nstrategy = \"fixed-delay\"\nattempts = 3\ndelay_ms = 10",
    );
    let error = run_job(&job).expect_err("the job fails");
    let message = format!("{error:#}");
    for needed in [
        "transaction.timeout.ms",
        "1000000",
        "transaction.max.timeout.ms",
        "900000",
    ] {
        assert!(message.contains(needed), "{needed:?} not in: {message}");
    }
    let failed = error.downcast_ref::<JobFailed>().expect("a failed job");
    assert_eq!(failed.restarts, 0, "{message}");
    assert!(read_committed(&broker, &topic).is_empty());
}

/// A sink waiting for room in a full producer queue (a broker that never answers, a
/// queue of one record) stops waiting when its job is cancelled, instead of until the
/// records time out (`message.timeout.ms`, 5 minutes by default).
#[test]
fn a_sink_waiting_on_a_full_producer_queue_is_cancelled_at_once() {
    let dir = test_dir("kafka-full-queue");
    let job = lines_to_topic(
        &dir,
        "127.0.0.1:1",
        "nowhere",
        "properties = { \"queue.buffering.max.messages\" = \"1\" }",
    );
    let test_job = TestJob::load(&job).unwrap();
    let control = test_job.control.clone();
    let monitor = test_job.monitor.clone();
    let (done, finished) = unbounded();
    thread::spawn(move || done.send(test_job.run(RestorePoint::Fresh).map(|r| r.outcome)));
    // Deployed, then long enough for the source to send the sink more than its queue
    // holds.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while monitor.tasks().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the job never started"
        );
        thread::sleep(Duration::from_millis(20));
    }
    thread::sleep(Duration::from_millis(1_500));
    control.send(JobControl::Cancel).unwrap();
    let outcome = finished
        .recv_timeout(Duration::from_secs(20))
        .expect("the job did not end within 20 s of its cancellation")
        .expect("the job ends without error");
    assert_eq!(outcome, JobOutcome::Cancelled);
}
/// The default transactional id prefix of a sink (`transactional_id_prefix` unset).
fn default_prefix(job: &Path) -> String {
    let graph = load_graph(job).unwrap();
    let sink = graph.sinks().next().unwrap();
    sink.kafka.as_ref().unwrap().transactional_id_prefix.clone()
}

/// Two jobs of one name, each in its own folder, do not share transactional ids (which
/// would fence each other's producers and mix their markers): the default prefix names
/// the job and the sink and a hash of the job's checkpoint folder.
#[test]
fn default_transactional_ids_differ_between_jobs_of_one_name() {
    let (a, b) = (test_dir("kafka-prefix-a"), test_dir("kafka-prefix-b"));
    let checkpoint = "[checkpoint]\ninterval_ms = 100\ndir = \"checkpoints\"";
    let job_a = lines_to_topic(&a, "127.0.0.1:1", "t", checkpoint);
    let job_b = lines_to_topic(&b, "127.0.0.1:1", "t", checkpoint);
    let prefix = default_prefix(&job_a);
    assert!(prefix.starts_with("sluice-sink-settings-sink-"), "{prefix}");
    assert_eq!(default_prefix(&job_a), prefix, "the same every time");
    assert_ne!(default_prefix(&job_b), prefix);
    // An explicit prefix stays as written.
    let explicit = lines_to_topic(
        &b,
        "127.0.0.1:1",
        "t",
        &format!("transactional_id_prefix = \"mine\"\n{checkpoint}"),
    );
    assert_eq!(default_prefix(&explicit), "mine");
}

/// A job restored from a checkpoint of another folder (a copy of the job file beside
/// the original, restoring the original's savepoint) goes on with the transactional ids
/// its checkpoint was written with, not those its own folder would give: it fences the
/// producers it takes over and moves their markers, and writes every count once.
#[test]
fn a_restored_sink_keeps_the_transactional_ids_of_its_checkpoint() {
    let Some(broker) = broker() else { return };
    let topic = unique_topic("kept-ids");
    create_topic(&broker, &topic, 2);
    let dir = test_dir("kafka-kept-ids");
    let text = sample_text(52, 1_500);
    let more = "[checkpoint]\ninterval_ms = 30\ndir = \"checkpoints\"\n[runtime]\nbatch_size = 20";
    let job = word_count_to_topic(&dir, &broker, &topic, &text, 1, more);
    let original = TestJob::load(&job).unwrap();
    let (reply, answer) = unbounded();
    let control = original.control.clone();
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
    original.run(RestorePoint::Fresh).unwrap();
    let savepoint = stopper.join().unwrap().expect("the savepoint succeeds");
    let ends = end_offsets(&broker, &topic);
    let before = as_count_lines(&read_committed(&broker, &topic));

    let copy = dir.join("copy.toml");
    std::fs::write(
        &copy,
        std::fs::read_to_string(&job)
            .unwrap()
            .replace("dir = \"checkpoints\"", "dir = \"copy-checkpoints\""),
    )
    .unwrap();
    let (original_ids, copy_ids) = (default_prefix(&job), default_prefix(&copy));
    assert_ne!(original_ids, copy_ids);
    TestJob::load(&copy)
        .unwrap()
        .run(RestorePoint::Path(savepoint))
        .unwrap();
    let marker = |prefix: &str| committed_offsets(&broker, &format!("{prefix}-0"), &topic);
    assert!(marker(&copy_ids).is_empty(), "{:?}", marker(&copy_ids));
    assert!(!marker(&original_ids).is_empty());
    let after = as_count_lines(&read_committed_from(&broker, &topic, &ends));
    assert_counts(&(before + &after), &text);
}

/// What an exactly-once sink holds for checkpoints not yet complete is host memory its
/// tenant's job makes the host hold: charged as keyed state, past `tenant_state_mb` the
/// job fails, naming the sink and the limit, and nothing reaches the topic.
#[test]
fn records_a_kafka_sink_holds_for_checkpoints_count_against_its_tenants_state() {
    let Some(broker) = broker() else { return };
    let topic = unique_topic("held");
    create_topic(&broker, &topic, 1);
    let dir = test_dir("kafka-sink-held");
    let host = acme_host(&dir, "tenant_state_mb = 1");
    let job = write_job(
        &dir,
        &format!(
            r#"
name = "held"
tenant = "acme"
[source]
type = "generator"
records = 200000
words_per_record = 6
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
[sink]
type = "kafka"
bootstrap = "{broker}"
topic = "{topic}"
[checkpoint]
interval_ms = 3600000
dir = "checkpoints"
[restart]
strategy = "none"
"#
        ),
    );
    let err = TestJob::load_with(&job, &host)
        .unwrap()
        .run(RestorePoint::Fresh)
        .expect_err("the sink holds more than the tenant may");
    let err = format!("{err:#}");
    assert!(
        err.contains(&format!(
            "Kafka sink, topic {topic:?}: the records waiting for checkpoints count as the \
             tenant's state: keyed state limit exceeded: tenant 'acme' holds"
        )) && err.contains("(limit 1.0 MiB, `tenant_state_mb`)"),
        "{err}"
    );
    assert!(read_committed(&broker, &topic).is_empty());
}

/// An exactly-once sink whose transactions would time out before a checkpoint may
/// (`transaction.timeout.ms` not above `[checkpoint] timeout_ms`) is refused when the
/// job is loaded, naming both: a checkpoint's transaction is open until it completes.
#[test]
fn a_transaction_timeout_below_the_checkpoint_timeout_is_refused() {
    let dir = test_dir("kafka-transaction-below-checkpoint");
    let job = lines_to_topic(
        &dir,
        "127.0.0.1:9",
        "t",
        "properties = { \"transaction.timeout.ms\" = \"60000\" }\n\
         [checkpoint]\ninterval_ms = 50\ntimeout_ms = 60000\ndir = \"checkpoints\"",
    );
    let Err(error) = TestJob::load(&job) else {
        panic!("a transaction timeout not above the checkpoint timeout was accepted");
    };
    let message = format!("{error:#}");
    for needed in [
        "transaction.timeout.ms",
        "60000 ms",
        "[checkpoint] timeout_ms",
    ] {
        assert!(message.contains(needed), "{needed:?} not in: {message}");
    }
    let job = lines_to_topic(
        &dir,
        "127.0.0.1:9",
        "t",
        "properties = { \"transaction.timeout.ms\" = \"60001\" }\n\
         [checkpoint]\ninterval_ms = 50\ntimeout_ms = 60000\ndir = \"checkpoints\"",
    );
    TestJob::load(&job).expect("a transaction timeout above the checkpoint timeout");
}
