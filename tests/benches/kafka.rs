//! The Kafka connector's cost, end to end: the word-count chain (`tokenize → count`,
//! every running count emitted, checkpoints every second) from a topic and to a topic,
//! against the same chain from a file to a file, and exactly-once against at-least-once,
//! as ratios of records/s in the same run; the exactly-once job with checkpoints every
//! 100 ms against every second; and the exactly-once job again over TLS with SCRAM (the
//! broker's `SASL_SSL` listener) against plaintext. And the floor the broker and
//! librdkafka's per-message API set on this machine, in the same run: a plain consumer
//! reading the input topic, and a plain idempotent producer (the sinks' settings)
//! writing as many records as the job writes, each alone.
//!
//! Uses the broker in `SLUICE_KAFKA`, or starts one with `scripts/kafka/broker.sh` (and
//! stops it after). `LINES` sets the input (default 100,000 lines of 8 words).
//!
//! `cargo bench -p sluice-tests --bench kafka`

use std::path::{Path, PathBuf};
use std::time::Duration;

use sluice_tests::bench::{median_time, runs};
use sluice_tests::kafka::{BenchBroker, create_topic, produce, unique_topic};
use sluice_tests::plugins::{COUNT, TOKENIZE};
use sluice_tests::{run_job, sample_text, test_dir, write_job};

fn job(dir: &Path, name: &str, source: &str, sink: &str) -> PathBuf {
    job_every(dir, name, source, sink, 1000)
}

/// [`job`] with a checkpoint every `interval_ms`.
fn job_every(dir: &Path, name: &str, source: &str, sink: &str, interval_ms: u64) -> PathBuf {
    let path = dir.join(format!("{name}.toml"));
    let toml = format!(
        r#"
name = "{name}"
{source}
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
[[operator]]
name = "count"
plugin = "{COUNT}"
key_by = "key"
{sink}
[checkpoint]
interval_ms = {interval_ms}
dir = "checkpoints-{name}"
"#
    );
    std::fs::write(&path, toml).unwrap();
    path
}

fn time(runs: usize, dir: &Path, job: &Path) -> Duration {
    median_time(runs, || {
        let _ = std::fs::remove_dir_all(dir.join("out"));
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            if entry
                .file_name()
                .to_string_lossy()
                .starts_with("checkpoints-")
            {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
        run_job(job).expect("the job runs");
    })
}

/// How long a plain consumer (no job) takes to read `records` records of `topic`, from
/// the start.
fn consume_floor(broker: &str, topic: &str, records: usize) -> Duration {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", broker)
        .set("group.id", unique_topic("bench-floor"))
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("fetch.queue.backoff.ms", "20")
        .create()
        .unwrap();
    let start = std::time::Instant::now();
    consumer.subscribe(&[topic]).unwrap();
    let mut read = 0;
    let mut bytes = 0;
    while read < records {
        if let Some(message) = consumer.poll(Duration::from_millis(100)) {
            bytes += rdkafka::Message::payload(&message.unwrap()).map_or(0, <[u8]>::len);
            read += 1;
        }
    }
    std::hint::black_box(bytes);
    start.elapsed()
}

/// How long a plain idempotent producer with the sinks' settings takes to write each of
/// `records` (key, value) to `topic` and flush.
fn produce_floor(broker: &str, topic: &str, records: &[(String, String)]) -> Duration {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let producer: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", broker)
        .set("partitioner", "murmur2_random")
        .set("enable.idempotence", "true")
        .set("delivery.report.only.error", "true")
        .set("linger.ms", "50")
        .create()
        .unwrap();
    let start = std::time::Instant::now();
    for (key, value) in records {
        let mut record = BaseRecord::to(topic)
            .key(key.as_str())
            .payload(value.as_str());
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((_, back)) => {
                    record = back;
                    producer.poll(Duration::from_millis(1));
                }
            }
        }
    }
    producer.flush(Duration::from_secs(60)).unwrap();
    start.elapsed()
}

fn main() {
    let lines: usize = std::env::var("LINES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let broker = BenchBroker::get();
    let b = &broker.address;
    let dir = test_dir("bench-kafka");
    let text = sample_text(7, lines);
    let words = text.split_whitespace().count();
    std::fs::write(dir.join("in.txt"), &text).unwrap();
    write_job(&dir, "name = \"unused\"");
    let input = unique_topic("bench-in");
    create_topic(b, &input, 1);
    let records: Vec<(Option<&str>, &str, Option<i64>)> =
        text.lines().map(|l| (None, l, None)).collect();
    produce(b, &input, &records);

    let file_source = "[source]\ntype = \"file\"\npath = \"in.txt\"".to_string();
    let kafka_source = format!(
        "[source]\ntype = \"kafka\"\nbootstrap = \"{b}\"\ntopics = \"{input}\"\nbounded = true"
    );
    let file_sink = "[sink]\ntype = \"file\"\npath = \"out/counts.tsv\"\nformat = \"key-value\"";
    let kafka_sink = |delivery: &str| {
        let topic = unique_topic("bench-out");
        create_topic(b, &topic, 1);
        format!(
            "[sink]\ntype = \"kafka\"\nbootstrap = \"{b}\"\ntopic = \"{topic}\"\ndelivery = \"{delivery}\"\ntransactional_id_prefix = \"{topic}\""
        )
    };
    let runs = runs(3);
    let file_to_file = time(runs, &dir, &job(&dir, "file-file", &file_source, file_sink));
    let topic_to_file = time(
        runs,
        &dir,
        &job(&dir, "topic-file", &kafka_source, file_sink),
    );
    let alo_sink = kafka_sink("at-least-once");
    let topic_alo = time(
        runs,
        &dir,
        &job(&dir, "topic-alo", &kafka_source, &alo_sink),
    );
    let eos_sink = kafka_sink("exactly-once");
    let topic_eos = time(
        runs,
        &dir,
        &job(&dir, "topic-eos", &kafka_source, &eos_sink),
    );

    let eos_sink = kafka_sink("exactly-once");
    let topic_eos_100ms = time(
        runs,
        &dir,
        &job_every(&dir, "topic-eos-100ms", &kafka_source, &eos_sink, 100),
    );

    // The same exactly-once job with source and sink over TLS + SCRAM-SHA-512.
    let secure = broker.secure.as_ref().map(|sec| {
        let properties = format!(
            "properties = {{ \"security.protocol\" = \"SASL_SSL\", \"sasl.mechanism\" = \
             \"SCRAM-SHA-512\", \"sasl.username\" = \"{}\", \"sasl.password\" = \"{}\", \
             \"ssl.ca.location\" = \"{}\" }}",
            sec.user,
            sec.password,
            sec.tls.join("ca.pem").display()
        );
        let source = format!("{}\n{properties}", kafka_source.replace(b, &sec.sasl_ssl));
        let sink = format!(
            "{}\n{properties}",
            kafka_sink("exactly-once").replace(b, &sec.sasl_ssl)
        );
        time(runs, &dir, &job(&dir, "topic-eos-tls", &source, &sink))
    });

    // The floor: what the job reads, read by a plain consumer; what it writes (every
    // running count, a record per word), written by a plain producer.
    let mut counts = std::collections::HashMap::<&str, u64>::new();
    let output: Vec<(String, String)> = text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(|w| {
            let n = counts.entry(w).or_default();
            *n += 1;
            (w.to_lowercase(), n.to_string())
        })
        .collect();
    let consume = median_time(runs, || {
        consume_floor(b, &input, lines);
    });
    let floor_out = unique_topic("bench-floor-out");
    create_topic(b, &floor_out, 1);
    let produce = median_time(runs, || {
        produce_floor(b, &floor_out, &output);
    });

    let rate = |d: Duration| lines as f64 / d.as_secs_f64();
    println!(
        "word count (tokenize -> count, every running count out), {lines} lines ({words} words), \
         checkpoints every second, median of {runs}"
    );
    for (what, d) in [
        ("file -> file", file_to_file),
        ("topic -> file", topic_to_file),
        ("topic -> topic, at least once", topic_alo),
        ("topic -> topic, exactly once", topic_eos),
        ("  the same, checkpoints every 100 ms", topic_eos_100ms),
    ]
    .into_iter()
    .chain(secure.map(|d| ("  the same over TLS + SCRAM", d)))
    {
        println!(
            "  {what:<32} {:>7.2} s {:>10.0} lines/s   {:.2} of file -> file",
            d.as_secs_f64(),
            rate(d),
            rate(d) / rate(file_to_file)
        );
    }
    println!(
        "  exactly once / at least once: {:.2} of the lines/s",
        rate(topic_eos) / rate(topic_alo)
    );
    println!(
        "  exactly once, checkpoints every 100 ms / every second: {:.2} of the time",
        topic_eos_100ms.as_secs_f64() / topic_eos.as_secs_f64()
    );
    println!(
        "  floor, plain librdkafka: reading the {lines} lines {:.2} s, writing {} records \
         {:.2} s; together {:.2} of file -> file",
        consume.as_secs_f64(),
        output.len(),
        produce.as_secs_f64(),
        file_to_file.as_secs_f64() / (consume + produce).as_secs_f64()
    );
    if let Some(secure) = secure {
        println!(
            "  TLS + SCRAM / plaintext, exactly once: {:.2} of the lines/s",
            rate(secure) / rate(topic_eos)
        );
    }
}
