//! What record formats cost, end to end: the same records from a topic through an
//! operator that passes them on (`filter` with no condition) to a topic, exactly once,
//! checkpoints every second — as bytes (the values are JSON text, moved as they are),
//! as `format = "json"` (checked on the way in and out), and as Avro and as Protobuf in
//! Confluent's wire format through a schema registry (decoded into JSON by the source,
//! encoded back by the sink). Rounds alternate the jobs; the ratios are medians of each
//! round's.
//!
//! Uses the broker in `SLUICE_KAFKA` and the registry in `SLUICE_SCHEMA_REGISTRY`, or
//! starts them (`scripts/kafka/broker.sh`, `scripts/registry/registry.sh`). `RECORDS`
//! sets the input (default 300,000).
//!
//! `cargo bench -p sluice-tests --bench formats`

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use apache_avro::Schema;
use apache_avro::types::Value;
use sluice_tests::bench::runs;
use sluice_tests::kafka::{
    BenchBroker, BenchRegistry, create_topic, produce_values, read_committed_values, unique_topic,
};
use sluice_tests::plugins::FILTER;
use sluice_tests::{run_job, sample_text, test_dir, write_job};

const SCHEMA: &str = r#"{"type":"record","name":"Event","fields":[
    {"name":"user","type":"string"},
    {"name":"n","type":"long"},
    {"name":"amount","type":"double"},
    {"name":"country","type":["null","string"],"default":null},
    {"name":"line","type":"string"}]}"#;

const PROTO: &str = "syntax = \"proto3\";\npackage bench;\nmessage Event {\n  string user = 1;\n  int64 n = 2;\n  double amount = 3;\n  optional string country = 4;\n  string line = 5;\n}\n";

/// The Protobuf message of [`PROTO`], made independently of the host's codec.
#[derive(Clone, PartialEq, prost::Message)]
struct Event {
    #[prost(string, tag = "1")]
    user: String,
    #[prost(int64, tag = "2")]
    n: i64,
    #[prost(double, tag = "3")]
    amount: f64,
    #[prost(string, optional, tag = "4")]
    country: Option<String>,
    #[prost(string, tag = "5")]
    line: String,
}

/// A job reading `input` and writing `output`, both with `format` (the source's and
/// sink's further fields).
fn job(dir: &Path, name: &str, broker: &str, input: &str, output: &str, format: &str) -> PathBuf {
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(
        &path,
        format!(
            r#"
name = "{name}"
[source]
type = "kafka"
bootstrap = "{broker}"
topics = "{input}"
bounded = true
{format}
[[operator]]
name = "pass"
plugin = "{FILTER}"
[sink]
type = "kafka"
bootstrap = "{broker}"
topic = "{output}"
transactional_id_prefix = "{output}"
{sink_format}
[checkpoint]
interval_ms = 1000
dir = "checkpoints-{name}"
"#,
            sink_format = format.replace("on_bad_record = \"fail\"\n", "")
        ),
    )
    .unwrap();
    path
}

fn main() {
    let records: usize = std::env::var("RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300_000);
    let broker = BenchBroker::get();
    let registry = BenchRegistry::get();
    let b = &broker.address;
    let dir = test_dir("bench-formats");
    write_job(&dir, "name = \"unused\"");
    std::fs::write(dir.join("event.avsc"), SCHEMA).unwrap();
    std::fs::write(dir.join("event.proto"), PROTO).unwrap();

    let text = sample_text(11, records);
    let events: Vec<serde_json::Value> = text
        .lines()
        .enumerate()
        .map(|(i, line)| {
            serde_json::json!({
                "user": format!("user-{}", i % 1000),
                "n": i,
                "amount": i as f64 * 0.25,
                "country": if i % 3 == 0 { serde_json::Value::Null } else { "nl".into() },
                "line": line,
            })
        })
        .collect();
    let json_in = unique_topic("bench-json");
    create_topic(b, &json_in, 1);
    let json_values: Vec<Vec<u8>> = events
        .iter()
        .map(|e| serde_json::to_vec(e).unwrap())
        .collect();
    produce_values(b, &json_in, &json_values);
    let bytes: usize = json_values.iter().map(Vec::len).sum();

    let avro_in = unique_topic("bench-avro");
    create_topic(b, &avro_in, 1);
    let id =
        sluice::connectors::formats::Registry::new(sluice::connectors::formats::RegistryConfig {
            url: registry.url.clone(),
            basic_auth: None,
        })
        .register(&format!("{avro_in}-value"), "AVRO", SCHEMA, &[])
        .expect("registering the schema");
    let schema = Schema::parse_str(SCHEMA).unwrap();
    let writer = apache_avro::writer::datum::GenericDatumWriter::builder(&schema)
        .build()
        .unwrap();
    let avro_values: Vec<Vec<u8>> = events
        .iter()
        .map(|e| {
            let value = Value::Record(vec![
                (
                    "user".into(),
                    Value::String(e["user"].as_str().unwrap().into()),
                ),
                ("n".into(), Value::Long(e["n"].as_i64().unwrap())),
                (
                    "amount".into(),
                    Value::Double(e["amount"].as_f64().unwrap()),
                ),
                (
                    "country".into(),
                    match e["country"].as_str() {
                        None => Value::Union(0, Box::new(Value::Null)),
                        Some(c) => Value::Union(1, Box::new(Value::String(c.into()))),
                    },
                ),
                (
                    "line".into(),
                    Value::String(e["line"].as_str().unwrap().into()),
                ),
            ]);
            let mut framed = vec![0];
            framed.extend_from_slice(&id.to_be_bytes());
            framed.extend(writer.write_value_to_vec(value).unwrap());
            framed
        })
        .collect();
    let avro_bytes: usize = avro_values.iter().map(Vec::len).sum();
    produce_values(b, &avro_in, &avro_values);

    let proto_in = unique_topic("bench-proto");
    create_topic(b, &proto_in, 1);
    let proto_id =
        sluice::connectors::formats::Registry::new(sluice::connectors::formats::RegistryConfig {
            url: registry.url.clone(),
            basic_auth: None,
        })
        .register(&format!("{proto_in}-value"), "PROTOBUF", PROTO, &[])
        .expect("registering the .proto schema");
    let proto_events: Vec<Event> = events
        .iter()
        .map(|e| Event {
            user: e["user"].as_str().unwrap().into(),
            n: e["n"].as_i64().unwrap(),
            amount: e["amount"].as_f64().unwrap(),
            country: e["country"].as_str().map(str::to_string),
            line: e["line"].as_str().unwrap().into(),
        })
        .collect();
    let proto_values: Vec<Vec<u8>> = proto_events
        .iter()
        .map(|e| {
            // The header, then message indexes [0] (the file's first message).
            let mut framed = vec![0];
            framed.extend_from_slice(&proto_id.to_be_bytes());
            framed.push(0);
            framed.extend(prost::Message::encode_to_vec(e));
            framed
        })
        .collect();
    let proto_bytes: usize = proto_values.iter().map(Vec::len).sum();
    produce_values(b, &proto_in, &proto_values);

    let registry_line = format!("schema_registry = {{ url = \"{}\" }}", registry.url);
    let cases = [
        ("bytes", json_in.clone(), String::new()),
        ("json", json_in.clone(), "format = \"json\"\n".to_string()),
        (
            "avro",
            avro_in.clone(),
            format!(
                "format = \"avro\"\non_bad_record = \"fail\"\n{registry_line}\nschema = \"event.avsc\"\n"
            ),
        ),
        (
            "proto",
            proto_in.clone(),
            format!(
                "format = \"protobuf\"\non_bad_record = \"fail\"\n{registry_line}\nschema = \"event.proto\"\n"
            ),
        ),
    ];
    let runs = runs(5);
    let mut times: Vec<Vec<Duration>> = vec![Vec::new(); cases.len()];
    let mut outputs: Vec<String> = Vec::new();
    for round in 0..=runs {
        for (i, (name, input, format)) in cases.iter().enumerate() {
            let output = unique_topic(&format!("bench-{name}-out"));
            create_topic(b, &output, 1);
            let path = job(&dir, name, b, input, &output, format);
            let _ = std::fs::remove_dir_all(dir.join(format!("checkpoints-{name}")));
            let start = Instant::now();
            run_job(&path).expect("the job runs");
            // (The first round warms the caches and is not counted.)
            if round > 0 {
                times[i].push(start.elapsed());
            }
            if round == runs {
                outputs.push(output);
            }
        }
    }
    // Every job wrote every record; the Avro job's output is the input's schema and data.
    for (output, (name, _, _)) in outputs.iter().zip(&cases) {
        let written = read_committed_values(b, output);
        assert_eq!(written.len(), records, "{name}: records written");
        if *name == "json" || *name == "bytes" {
            assert_eq!(written, json_values, "{name}: the values");
        }
        if *name == "avro" {
            let datums: Vec<&[u8]> = written.iter().map(|v| &v[5..]).collect();
            let input: Vec<&[u8]> = avro_values.iter().map(|v| &v[5..]).collect();
            assert_eq!(datums, input, "avro: the datums");
        }
        if *name == "proto" {
            let read: Vec<Event> = written
                .iter()
                .map(|v| {
                    assert_eq!(v[5], 0, "proto: message indexes [0]");
                    <Event as prost::Message>::decode(&v[6..]).unwrap()
                })
                .collect();
            assert!(read == proto_events, "proto: the messages");
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let secs: Vec<Vec<f64>> = times
        .iter()
        .map(|t| t.iter().map(Duration::as_secs_f64).collect())
        .collect();
    println!(
        "formats: {records} records topic -> pass -> topic, exactly once, checkpoints every \
         second; JSON values {:.0} bytes each, Avro {:.0}, Protobuf {:.0}; median of {runs} \
         alternating rounds",
        bytes as f64 / records as f64,
        avro_bytes as f64 / records as f64,
        proto_bytes as f64 / records as f64
    );
    for (i, (name, _, _)) in cases.iter().enumerate() {
        let ratio = median(
            secs[i]
                .iter()
                .zip(&secs[0])
                .map(|(t, base)| base / t)
                .collect(),
        );
        println!(
            "  {name:<6} {:>6.2} s {:>10.0} records/s   {ratio:.2} of bytes' records/s",
            median(secs[i].clone()),
            records as f64 / median(secs[i].clone())
        );
    }
}
