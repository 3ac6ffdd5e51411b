//! Latency, exactly once: the time from an event's write into the source topic to its
//! result's commit in the sink topic, as a reader with `isolation.level = read_committed`
//! sees it, at p50 and p99.
//!
//! The job is the word count (`tokenize → count`, every running count out) from a topic of
//! 4 partitions to a topic, each event a line of one word; a running count keeps its
//! event's timestamp, which the producer here sets to the moment it sends the event, so a
//! result's latency is the time it is read minus its Kafka timestamp. Rows: the job on one
//! host; over several hosts (`--cluster`, one host process) with one exchange hop
//! (`tokenize | count`) and with two (`tokenize | count | uppercase`, each keyed stage a hop);
//! at checkpoint intervals of 1 s, 200 ms and 100 ms. A result becomes visible when the
//! checkpoint after it completes and its transaction commits, so on one host a result waits
//! about half an interval plus the checkpoint's completion; every hop adds the same again
//! (the next stage reads only committed exchange records). "per hop" is the cluster job's
//! p50 minus the one-host job's, divided by its hops.
//!
//! Events come at `EVENTS_PER_SECOND` (default 2,000) for `SECONDS_PER_ROW` (default 10),
//! after the job's first result (start-up is not measured). Every event's result is
//! checked to arrive exactly once.
//!
//! `INTERVALS_MS` (default `1000,200,100`) sets the checkpoint intervals.
//!
//! Uses the broker in `SLUICE_KAFKA`, or starts one.
//!
//! `cargo bench -p sluice-tests --bench latency`

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::ClientConfig;
use rdkafka::Message;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use sluice_tests::bench::env_or;
use sluice_tests::cluster::spawn_run;
use sluice_tests::kafka::{BenchBroker, create_topic, unique_topic};
use sluice_tests::plugins::{COUNT, TOKENIZE, UPPERCASE};
use sluice_tests::test_dir;

/// The word count from `input` to `output`: with `hops` exchange hops over several hosts,
/// or on one host when `hops` is `None`.
fn job(
    dir: &Path,
    broker: &str,
    input: &str,
    output: &str,
    interval_ms: u64,
    hops: Option<u32>,
) -> PathBuf {
    let name = unique_topic("bench-latency");
    let upper = if hops == Some(2) {
        format!("[[operator]]\nname = \"upper\"\nplugin = \"{UPPERCASE}\"\nkey_by = \"key\"\n")
    } else {
        String::new()
    };
    let cluster = if hops.is_some() {
        format!(
            "[cluster]\ncheckpoints = \"store-{name}\"\nexchange_partitions = 4\n\
             work_dir = \"work-{name}\"\n"
        )
    } else {
        String::new()
    };
    let toml = format!(
        r#"
name = "{name}"
[source]
type = "kafka"
bootstrap = "{broker}"
topics = "{input}"
start = "earliest"
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
[[operator]]
name = "count"
plugin = "{COUNT}"
key_by = "key"
{upper}
[sink]
type = "kafka"
bootstrap = "{broker}"
topic = "{output}"
[checkpoint]
interval_ms = {interval_ms}
dir = "checkpoints-{name}"
{cluster}
"#
    );
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, toml).unwrap();
    path
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Reads `topic` as committed, from its start, until `expected` results of measured events
/// have come (or `stop` is set; `expected` is `usize::MAX` until the producer is done):
/// each one's latency in milliseconds. Sets `warm` at the first result of any kind.
fn read_latencies(
    broker: &str,
    topic: &str,
    warm: &AtomicBool,
    expected: &AtomicUsize,
    stop: &AtomicBool,
) -> Vec<i64> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", broker)
        .set("group.id", unique_topic("bench-latency-reader"))
        .set("isolation.level", "read_committed")
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "5")
        .create()
        .unwrap();
    consumer.subscribe(&[topic]).unwrap();
    let mut latencies = Vec::new();
    let mut seen = BTreeSet::new();
    while !stop.load(Ordering::Relaxed) {
        let Some(message) = consumer.poll(Duration::from_millis(20)) else {
            if latencies.len() >= expected.load(Ordering::Relaxed) {
                break;
            }
            continue;
        };
        let message = message.expect("reading the output");
        let read = now_ms();
        warm.store(true, Ordering::Relaxed);
        let key = message.key().unwrap_or_default();
        if key.starts_with(b"ev") {
            let event = std::str::from_utf8(&key[2..]).unwrap().to_string();
            let count = message.payload().unwrap_or_default().to_vec();
            assert!(
                seen.insert((event, count)),
                "a result came twice: {:?}",
                String::from_utf8_lossy(key)
            );
            let sent = message.timestamp().to_millis().expect("a timestamp");
            latencies.push(read - sent);
        }
        if latencies.len() >= expected.load(Ordering::Relaxed) {
            break;
        }
    }
    latencies
}

/// Runs `job`, sends `warm-up` lines until its first result, then `rate` events per second
/// for `seconds`: the latencies of their results, sorted.
fn measure(broker: &str, dir: &Path, hops: Option<u32>, interval_ms: u64) -> Vec<i64> {
    let rate = env_or("EVENTS_PER_SECOND", 2_000);
    let seconds = env_or("SECONDS_PER_ROW", 10);
    let input = unique_topic("bench-latency-in");
    let output = unique_topic("bench-latency-out");
    create_topic(broker, &input, 4);
    create_topic(broker, &output, 4);
    let job = job(dir, broker, &input, &output, interval_ms, hops);
    let log = dir.join(format!(
        "{}.log",
        job.file_stem().unwrap().to_string_lossy()
    ));
    let mut child = spawn_run(
        env!("CARGO_BIN_EXE_sluice-test-cli"),
        &job,
        hops.map(|_| broker),
        &log,
    );

    let warm = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let expected = Arc::new(AtomicUsize::new(usize::MAX));
    let reader = {
        let (broker, output) = (broker.to_string(), output.clone());
        let (warm, stop, expected) = (warm.clone(), stop.clone(), expected.clone());
        thread::spawn(move || read_latencies(&broker, &output, &warm, &expected, &stop))
    };
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", broker)
        .set("linger.ms", "0")
        .create()
        .unwrap();
    let send = |line: &str, partition: i32| {
        let mut record = BaseRecord::<(), str>::to(&input)
            .payload(line)
            .partition(partition)
            .timestamp(now_ms());
        while let Err((e, r)) = producer.send(record) {
            assert!(
                format!("{e}").contains("Queue full"),
                "producing an event: {e}"
            );
            producer.poll(Duration::from_millis(1));
            record = r;
        }
        producer.poll(Duration::ZERO);
    };
    let deadline = Instant::now() + Duration::from_secs(180);
    while !warm.load(Ordering::Relaxed) {
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "the job ended ({status}) before its first result: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        assert!(Instant::now() < deadline, "no result in 3 minutes");
        for p in 0..4 {
            send("warm", p);
        }
        producer.flush(Duration::from_secs(10)).unwrap();
        thread::sleep(Duration::from_millis(100));
    }
    let events = (rate * seconds) as usize;
    let start = Instant::now();
    for n in 0..events {
        let due = start + Duration::from_secs_f64(n as f64 / rate as f64);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            thread::sleep(wait);
        }
        // Distinct words, so every event's result (word, count) is one of a kind.
        send(&format!("ev{:05}", n % 10_000), (n % 4) as i32);
    }
    producer.flush(Duration::from_secs(10)).unwrap();
    expected.store(events, Ordering::Relaxed);
    let waiting = Instant::now();
    let watchdog = {
        let stop = stop.clone();
        thread::spawn(move || {
            while waiting.elapsed() < Duration::from_secs(60) && !stop.load(Ordering::Relaxed) {
                thread::sleep(Duration::from_millis(100));
            }
            stop.store(true, Ordering::Relaxed);
        })
    };
    let mut latencies = reader.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    watchdog.join().unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        latencies.len(),
        events,
        "results of measured events (log: {})",
        log.display()
    );
    latencies.sort_unstable();
    latencies
}

fn percentile(sorted: &[i64], p: usize) -> i64 {
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

fn main() {
    let broker = BenchBroker::get();
    let b = &broker.address;
    let dir = test_dir("bench-latency");
    println!(
        "latency, exactly once: event written into the source topic -> its result committed \
         in the sink topic (word count, {} events/s, {} s a row)",
        env_or("EVENTS_PER_SECOND", 2_000),
        env_or("SECONDS_PER_ROW", 10)
    );
    println!(
        "  {:<40} {:>7} {:>7} {:>7} {:>7} {:>12}",
        "", "min ms", "p10 ms", "p50 ms", "p99 ms", "p50 per hop"
    );
    let intervals: Vec<u64> = std::env::var("INTERVALS_MS")
        .unwrap_or_else(|_| "1000,200,100".into())
        .split(',')
        .map(|i| {
            i.trim()
                .parse()
                .expect("INTERVALS_MS: milliseconds, comma-separated")
        })
        .collect();
    for interval_ms in intervals {
        let mut one_host_p50 = 0;
        for (what, hops) in [
            ("one host", None),
            ("--cluster, 1 hop", Some(1)),
            ("--cluster, 2 hops", Some(2)),
        ] {
            let latencies = measure(b, &dir, hops, interval_ms);
            let (p50, p99) = (percentile(&latencies, 50), percentile(&latencies, 99));
            let per_hop = match hops {
                None => {
                    one_host_p50 = p50;
                    String::new()
                }
                Some(h) => format!("{} ms", (p50 - one_host_p50) / i64::from(h)),
            };
            println!(
                "  {:<40} {:>7} {:>7} {p50:>7} {p99:>7} {per_hop:>12}",
                format!("checkpoints {interval_ms} ms, {what}"),
                latencies[0],
                percentile(&latencies, 10),
            );
        }
    }
}
