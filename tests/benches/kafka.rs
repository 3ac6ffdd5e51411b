//! The Kafka connector's cost, end to end: the word-count chain (`tokenize → count`,
//! every running count emitted, checkpoints every second) from a topic and to a topic,
//! against the same chain from a file to a file, and exactly-once against at-least-once,
//! as ratios of records/s in the same run; the exactly-once job with checkpoints every
//! 100 ms against every second; and the exactly-once job again over TLS with SCRAM (the
//! broker's `SASL_SSL` listener) against plaintext.
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
    if let Some(secure) = secure {
        println!(
            "  TLS + SCRAM / plaintext, exactly once: {:.2} of the lines/s",
            rate(secure) / rate(topic_eos)
        );
    }
}
