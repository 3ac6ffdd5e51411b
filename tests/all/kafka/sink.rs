//! The Kafka sink's settings against the broker and the job: a transaction timeout the
//! broker does not allow, and a cancellation while the producer's queue is full.

use std::path::Path;
use std::thread;
use std::time::Duration;

use crossbeam_channel::unbounded;
use sluice::job::{JobControl, JobFailed, JobOutcome, RestorePoint};
use sluice_tests::kafka::{broker, create_topic, read_committed, unique_topic};
use sluice_tests::plugins::TOKENIZE;
use sluice_tests::{TestJob, run_job, sample_text, test_dir, write_job};

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
