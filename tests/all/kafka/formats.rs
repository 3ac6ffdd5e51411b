//! Record formats against the broker and a real schema registry (Apicurio's Confluent
//! API, started by `scripts/test.sh`): Avro read through the registry into JSON, an old
//! schema's records resolved to the job's, bad records skipped and counted or failing
//! the job with their offset, and JSON written back as Avro in Confluent's wire format;
//! schema references, key formats, event time from a field, and a server job's registry
//! grant (Protobuf: `protobuf.rs`). Values are made and checked with `apache-avro`,
//! `prost` and plain HTTP, not Sluice's own code.

use std::time::Duration;

use apache_avro::Schema;
use apache_avro::types::Value;
use sluice::server::model::JobState;
use sluice_tests::kafka::{
    broker, create_topic, produce_keyed_values, produce_values, read_committed,
    read_committed_values, schema_registry, unique_topic,
};
use sluice_tests::plugins::FILTER;
use sluice_tests::{run_job, test_dir, write_job};

use crate::server::{ServerProcess, error_of, host_config, wait_for};

const V1: &str = r#"{"type":"record","name":"Click","fields":[{"name":"user","type":"string"},{"name":"n","type":"int"}]}"#;
const V2: &str = r#"{"type":"record","name":"Click","fields":[{"name":"user","type":"string"},{"name":"n","type":"int"},{"name":"country","type":"string","default":"nl"}]}"#;

/// Registers Avro `schema` under `subject`; its id.
fn register(registry: &str, subject: &str, schema: &str) -> u32 {
    register_kind(registry, subject, "AVRO", schema)
}

/// Registers `schema` of kind `kind` (`AVRO`, `PROTOBUF`) under `subject`; its id. (A
/// registry just started can answer a first registration with 500 while another runs:
/// asked again then.)
pub(super) fn register_kind(registry: &str, subject: &str, kind: &str, schema: &str) -> u32 {
    register_referring(registry, subject, kind, schema, serde_json::json!([]))
}

/// Registers `schema` naming `references` (`[{name, subject, version}]`); its id.
fn register_referring(
    registry: &str,
    subject: &str,
    kind: &str,
    schema: &str,
    references: serde_json::Value,
) -> u32 {
    let body =
        serde_json::json!({ "schema": schema, "schemaType": kind, "references": references })
            .to_string();
    for attempt in 0.. {
        let sent = ureq::post(&format!("{registry}/subjects/{subject}/versions"))
            .header("Content-Type", "application/vnd.schemaregistry.v1+json")
            .send(body.as_str());
        match sent {
            Ok(mut answer) => {
                let answer: serde_json::Value =
                    serde_json::from_str(&answer.body_mut().read_to_string().unwrap()).unwrap();
                return answer["id"].as_u64().expect("an id") as u32;
            }
            Err(ureq::Error::StatusCode(500..)) if attempt < 5 => {
                std::thread::sleep(Duration::from_millis(100 << attempt));
            }
            Err(e) => panic!("registering a schema: {e}"),
        }
    }
    unreachable!()
}

/// The schema with id `id`, from the registry.
fn schema_of(registry: &str, id: u32) -> Schema {
    Schema::parse_str(registered(registry, id)["schema"].as_str().unwrap()).unwrap()
}

/// The registry's answer for schema `id`.
pub(super) fn registered(registry: &str, id: u32) -> serde_json::Value {
    let mut answer = ureq::get(&format!("{registry}/schemas/ids/{id}"))
        .call()
        .expect("reading a schema");
    serde_json::from_str(&answer.body_mut().read_to_string().unwrap()).unwrap()
}

/// A value in Confluent's wire format: 0, the id big-endian, the datum.
fn framed(id: u32, schema: &Schema, fields: Vec<(&str, Value)>) -> Vec<u8> {
    let record = Value::Record(
        fields
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
    );
    let mut out = vec![0];
    out.extend_from_slice(&id.to_be_bytes());
    let writer = apache_avro::writer::datum::GenericDatumWriter::builder(schema)
        .build()
        .unwrap();
    out.extend(writer.write_value_to_vec(record).unwrap());
    out
}

/// Avro in (through the registry) → an operator passing everything → `sink` (a Kafka
/// sink's fields), with the source's further fields as given.
fn job(
    dir: &std::path::Path,
    input: &str,
    registry: &str,
    source: &str,
    sink: &str,
) -> std::path::PathBuf {
    let source = format!(
        "name = \"clicks\"\nformat = \"avro\"\nschema_registry = {{ url = \"{registry}\" }}\n{source}"
    );
    pass_job(dir, "formats", input, &source, sink)
}

/// Job `name`: topic `input` (bounded, with the source's further fields `source`) → an
/// operator passing everything → a Kafka sink with fields `sink`, checkpoints every
/// 200 ms, no restarts.
pub(super) fn pass_job(
    dir: &std::path::Path,
    name: &str,
    input: &str,
    source: &str,
    sink: &str,
) -> std::path::PathBuf {
    let broker = broker().unwrap();
    write_job(
        dir,
        &format!(
            r#"
name = "{name}"
[source]
type = "kafka"
bootstrap = "{broker}"
topics = "{input}"
bounded = true
{source}
[[operator]]
name = "pass"
plugin = "{FILTER}"
[sink]
type = "kafka"
bootstrap = "{broker}"
{sink}
[checkpoint]
interval_ms = 200
[restart]
strategy = "none"
"#
        ),
    )
}

#[test]
fn avro_is_read_through_the_registry_old_schemas_resolved_and_bad_records_skipped() {
    let (Some(broker), Some(registry)) = (broker(), schema_registry()) else {
        return;
    };
    let input = unique_topic("avro-clicks");
    let output = unique_topic("json-clicks");
    create_topic(&broker, &input, 1);
    create_topic(&broker, &output, 1);
    let subject = format!("{input}-value");
    let v1 = register(&registry, &subject, V1);
    let s1 = Schema::parse_str(V1).unwrap();
    let mut values = vec![
        framed(v1, &s1, vec![("user", "ann".into()), ("n", Value::Int(1))]),
        framed(
            v1,
            &s1,
            vec![("user", "bob \"b\"".into()), ("n", Value::Int(-2))],
        ),
    ];
    let v2 = register(&registry, &subject, V2);
    assert_ne!(v1, v2);
    let s2 = Schema::parse_str(V2).unwrap();
    values.push(framed(
        v2,
        &s2,
        vec![
            ("user", "cy".into()),
            ("n", Value::Int(3)),
            ("country", "be".into()),
        ],
    ));
    // Bad: not in the wire format; an id the registry does not know; a datum cut short.
    values.push(b"{\"user\":\"json\"}".to_vec());
    values.push(framed(
        987_654,
        &s1,
        vec![("user", "x".into()), ("n", Value::Int(0))],
    ));
    let mut cut = framed(
        v2,
        &s2,
        vec![
            ("user", "dee".into()),
            ("n", Value::Int(4)),
            ("country", "de".into()),
        ],
    );
    cut.truncate(cut.len() - 3);
    values.push(cut);
    values.push(framed(
        v1,
        &s1,
        vec![("user", "eve".into()), ("n", Value::Int(5))],
    ));
    produce_values(&broker, &input, &values);

    let dir = test_dir("kafka-avro-in");
    let path = job(
        &dir,
        &input,
        &registry,
        "on_bad_record = \"skip\"",
        &format!("topic = \"{output}\"\nformat = \"json\""),
    );
    let report = run_job(&path).unwrap();
    let written: Vec<String> = read_committed_values(&broker, &output)
        .into_iter()
        .map(|v| String::from_utf8(v).unwrap())
        .collect();
    // Read with the subject's latest schema (v2): v1's records get its default.
    assert_eq!(
        written,
        [
            r#"{"user":"ann","n":1,"country":"nl"}"#,
            r#"{"user":"bob \"b\"","n":-2,"country":"nl"}"#,
            r#"{"user":"cy","n":3,"country":"be"}"#,
            r#"{"user":"eve","n":5,"country":"nl"}"#,
        ]
    );
    let source = report
        .tasks
        .iter()
        .find_map(|t| t.source.as_ref())
        .expect("a source report");
    assert_eq!(source.counters.get("bad-records"), Some(&3), "{source:?}");

    // The same input with `on_bad_record = "fail"`: the job fails at the first bad
    // record, naming it and why.
    let dir = test_dir("kafka-avro-in-fail");
    let path = job(
        &dir,
        &input,
        &registry,
        "on_bad_record = \"fail\"",
        &format!("topic = \"{}\"\nformat = \"json\"", unique_topic("unused")),
    );
    let e = format!("{:#}", run_job(&path).expect_err("the job should fail"));
    assert!(
        e.contains(&format!("Kafka record {input}/0 at offset 3"))
            && e.contains("not the schema registry's magic byte"),
        "{e}"
    );
}

#[test]
fn json_is_written_as_avro_in_the_registrys_wire_format() {
    let (Some(broker), Some(registry)) = (broker(), schema_registry()) else {
        return;
    };
    let input = unique_topic("avro-in");
    let output = unique_topic("avro-out");
    create_topic(&broker, &input, 1);
    create_topic(&broker, &output, 1);
    let v1 = register(&registry, &format!("{input}-value"), V1);
    let s1 = Schema::parse_str(V1).unwrap();
    let values: Vec<Vec<u8>> = (0..50)
        .map(|i| {
            framed(
                v1,
                &s1,
                vec![("user", format!("u{i}").into()), ("n", Value::Int(i))],
            )
        })
        .collect();
    produce_values(&broker, &input, &values);
    let dir = test_dir("kafka-avro-out");
    std::fs::write(dir.join("out.avsc"), V2).unwrap();
    let path = job(
        &dir,
        &input,
        &registry,
        "on_bad_record = \"fail\"",
        &format!(
            "topic = \"{output}\"\nformat = \"avro\"\nschema = \"out.avsc\"\nschema_registry = {{ url = \"{registry}\" }}"
        ),
    );
    run_job(&path).unwrap();
    let written = read_committed_values(&broker, &output);
    assert_eq!(written.len(), 50);
    for (i, value) in written.iter().enumerate() {
        assert_eq!(value[0], 0, "the magic byte");
        let id = u32::from_be_bytes(value[1..5].try_into().unwrap());
        let schema = schema_of(&registry, id);
        let read = apache_avro::reader::datum::GenericDatumReader::builder(&schema)
            .build()
            .unwrap()
            .read_value(&mut &value[5..])
            .unwrap();
        assert_eq!(
            read,
            Value::Record(vec![
                ("user".into(), Value::String(format!("u{i}"))),
                ("n".into(), Value::Int(i as i32)),
                ("country".into(), Value::String("nl".into())),
            ])
        );
    }
}

/// Schema references. An Avro subject whose schema names a type another subject's schema
/// defines is read through the registry, the reference resolved. A Protobuf sink whose
/// schema imports a file beside it registers that file under its import path and its own
/// schema with a reference to it, as Confluent's serializer does; a job reading that
/// topic through the registry alone resolves the import.
#[test]
fn schemas_that_refer_to_other_subjects_are_read_and_written() {
    let (Some(broker), Some(registry)) = (broker(), schema_registry()) else {
        return;
    };
    // Avro: users whose home is an address, its type in a subject of its own.
    let users = unique_topic("avro-users");
    let users_json = unique_topic("json-users");
    create_topic(&broker, &users, 1);
    create_topic(&broker, &users_json, 1);
    let address = r#"{"type":"record","name":"Address","namespace":"com.acme","fields":[{"name":"city","type":"string"}]}"#;
    let user = r#"{"type":"record","name":"User","namespace":"com.acme","fields":[{"name":"name","type":"string"},{"name":"home","type":"Address"}]}"#;
    let address_subject = format!("{users}-address");
    register(&registry, &address_subject, address);
    let id = register_referring(
        &registry,
        &format!("{users}-value"),
        "AVRO",
        user,
        serde_json::json!([{ "name": "com.acme.Address", "subject": address_subject, "version": 1 }]),
    );
    // What a serializer writes: the datum of the user with the address in it.
    let whole =
        Schema::parse_str(&user.replace(r#""type":"Address""#, &format!(r#""type":{address}"#)))
            .unwrap();
    let values: Vec<Vec<u8>> = (0..3)
        .map(|i| {
            let home = Value::Record(vec![("city".into(), Value::String(format!("c{i}")))]);
            framed(
                id,
                &whole,
                vec![("name", format!("n{i}").into()), ("home", home)],
            )
        })
        .collect();
    produce_values(&broker, &users, &values);
    let dir = test_dir("kafka-references");
    let path = job(
        &dir,
        &users,
        &registry,
        "",
        &format!("topic = \"{users_json}\"\nformat = \"json\""),
    );
    run_job(&path).unwrap();
    let written: Vec<String> = read_committed_values(&broker, &users_json)
        .into_iter()
        .map(|v| String::from_utf8(v).unwrap())
        .collect();
    assert_eq!(
        written,
        (0..3)
            .map(|i| format!(r#"{{"name":"n{i}","home":{{"city":"c{i}"}}}}"#))
            .collect::<Vec<_>>()
    );

    // Protobuf: orders written by a sink whose schema imports `FOLDER/address.proto`.
    let input = unique_topic("json-orders");
    let orders = unique_topic("proto-orders");
    let back = unique_topic("json-orders-back");
    for topic in [&input, &orders, &back] {
        create_topic(&broker, topic, 1);
    }
    let folder = unique_topic("common");
    std::fs::create_dir_all(dir.join(&folder)).unwrap();
    let imported = "syntax = \"proto3\";\npackage common;\nmessage Address { string city = 1; }\n";
    std::fs::write(dir.join(&folder).join("address.proto"), imported).unwrap();
    std::fs::write(
        dir.join("order.proto"),
        format!(
            "syntax = \"proto3\";\npackage shop;\nimport \"{folder}/address.proto\";\n\
             message Order {{ string id = 1; common.Address ship = 2; }}\n"
        ),
    )
    .unwrap();
    let values: Vec<Vec<u8>> = (0..4)
        .map(|i| format!(r#"{{"id":"o{i}","ship":{{"city":"c{i}"}}}}"#).into_bytes())
        .collect();
    produce_values(&broker, &input, &values);
    let with_registry = format!("schema_registry = {{ url = \"{registry}\" }}");
    let write = pass_job(
        &dir,
        "proto-refs-out",
        &input,
        "format = \"json\"",
        &format!(
            "topic = \"{orders}\"\nformat = \"protobuf\"\nschema = \"order.proto\"\n\
             {with_registry}"
        ),
    );
    run_job(&write).unwrap();
    // The import, registered under its path; the schema, with a reference to it.
    let written = read_committed_values(&broker, &orders);
    assert_eq!(written.len(), 4);
    let id = u32::from_be_bytes(written[0][1..5].try_into().unwrap());
    let schema = registered(&registry, id);
    assert_eq!(
        schema["references"],
        serde_json::json!([{ "name": format!("{folder}/address.proto"), "subject": format!("{folder}/address.proto"), "version": 1 }]),
        "{schema}"
    );
    let mut answer = ureq::get(&format!(
        "{registry}/subjects/{folder}%2Faddress.proto/versions/1"
    ))
    .call()
    .expect("the import's subject");
    let answer: serde_json::Value =
        serde_json::from_str(&answer.body_mut().read_to_string().unwrap()).unwrap();
    assert_eq!(answer["schema"], imported);
    // Read back through the registry alone (no schema file): the import resolved.
    let read = pass_job(
        &dir,
        "proto-refs-in",
        &orders,
        &format!("format = \"protobuf\"\n{with_registry}"),
        &format!("topic = \"{back}\"\nformat = \"json\""),
    );
    run_job(&read).unwrap();
    let back: Vec<Vec<u8>> = read_committed_values(&broker, &back);
    assert_eq!(back, values);
}

/// Keys in a format of their own (`key_format`): Avro keys through the registry (subject
/// `TOPIC-key`) read as JSON beside Avro values, a key the registry does not know a bad
/// record; written back as Avro keys with the sink's `key_schema`, registered under the
/// output's `TOPIC-key`, and the values as JSON.
#[test]
fn keys_have_a_format_of_their_own() {
    let (Some(broker), Some(registry)) = (broker(), schema_registry()) else {
        return;
    };
    const KEY: &str =
        r#"{"type":"record","name":"UserKey","fields":[{"name":"id","type":"long"}]}"#;
    let input = unique_topic("avro-keyed");
    let output = unique_topic("avro-keys-out");
    create_topic(&broker, &input, 1);
    create_topic(&broker, &output, 1);
    let key_id = register(&registry, &format!("{input}-key"), KEY);
    let value_id = register(&registry, &format!("{input}-value"), V1);
    let key_schema = Schema::parse_str(KEY).unwrap();
    let s1 = Schema::parse_str(V1).unwrap();
    let record = |key_id: u32, id: i64, user: &str| {
        (
            Some(framed(key_id, &key_schema, vec![("id", Value::Long(id))])),
            framed(
                value_id,
                &s1,
                vec![("user", user.into()), ("n", Value::Int(1))],
            ),
        )
    };
    produce_keyed_values(
        &broker,
        &input,
        &[
            record(key_id, 7, "ann"),
            record(987_653, 8, "bad key"),
            // A record without a key keeps none.
            (None, record(key_id, 9, "no key").1),
            record(key_id, -3, "cy"),
        ],
    );
    let dir = test_dir("kafka-avro-keys");
    std::fs::write(dir.join("key.avsc"), KEY).unwrap();
    let path = job(
        &dir,
        &input,
        &registry,
        "on_bad_record = \"skip\"\nkey_format = \"avro\"",
        &format!(
            "topic = \"{output}\"\nformat = \"json\"\nkey_format = \"avro\"\nkey_schema = \"key.avsc\"\n\
             schema_registry = {{ url = \"{registry}\" }}"
        ),
    );
    let report = run_job(&path).unwrap();
    let source = report
        .tasks
        .iter()
        .find_map(|t| t.source.as_ref())
        .expect("a source report");
    assert_eq!(source.counters.get("bad-records"), Some(&1), "{source:?}");
    let written = read_committed(&broker, &output);
    let values: Vec<&str> = written.iter().map(|r| r.value.as_str()).collect();
    assert_eq!(
        values,
        [
            r#"{"user":"ann","n":1}"#,
            r#"{"user":"no key","n":1}"#,
            r#"{"user":"cy","n":1}"#
        ]
    );
    // The keys: Avro again, framed with the id the output's key subject has.
    let keys: Vec<Option<Value>> = written
        .iter()
        .map(|r| {
            r.raw_key.as_ref().map(|key| {
                assert_eq!(key[0], 0, "the magic byte");
                let id = u32::from_be_bytes(key[1..5].try_into().unwrap());
                let schema = schema_of(&registry, id);
                apache_avro::reader::datum::GenericDatumReader::builder(&schema)
                    .build()
                    .unwrap()
                    .read_value(&mut &key[5..])
                    .unwrap()
            })
        })
        .collect();
    let key = |id| Some(Value::Record(vec![("id".into(), Value::Long(id))]));
    assert_eq!(keys, [key(7), None, key(-3)]);
}

/// `timestamp = { field = "at" }` takes event time from a field of the decoded values:
/// the sink writes it as each record's Kafka timestamp.
#[test]
fn event_time_comes_from_a_field_of_avro_values() {
    let (Some(broker), Some(registry)) = (broker(), schema_registry()) else {
        return;
    };
    const SCHEMA: &str = r#"{"type":"record","name":"Tick","fields":[{"name":"sym","type":"string"},{"name":"at","type":{"type":"long","logicalType":"timestamp-millis"}}]}"#;
    let input = unique_topic("avro-ticks");
    let output = unique_topic("json-ticks");
    create_topic(&broker, &input, 1);
    create_topic(&broker, &output, 1);
    let id = register(&registry, &format!("{input}-value"), SCHEMA);
    let schema = Schema::parse_str(SCHEMA).unwrap();
    let times = [1_700_000_000_000_i64, 1_700_000_000_500, 1_699_999_999_000];
    let values: Vec<Vec<u8>> = times
        .iter()
        .map(|&at| {
            framed(
                id,
                &schema,
                vec![("sym", "ab".into()), ("at", Value::TimestampMillis(at))],
            )
        })
        .collect();
    produce_values(&broker, &input, &values);
    let dir = test_dir("kafka-avro-event-time");
    let path = write_job(
        &dir,
        &format!(
            r#"
name = "ticks"
[source]
type = "kafka"
bootstrap = "{broker}"
topics = "{input}"
bounded = true
format = "avro"
schema_registry = {{ url = "{registry}" }}
timestamp = {{ field = "at" }}
out_of_orderness_ms = 1000
[[operator]]
name = "pass"
plugin = "{FILTER}"
[sink]
type = "kafka"
bootstrap = "{broker}"
topic = "{output}"
format = "json"
[checkpoint]
interval_ms = 200
"#
        ),
    );
    run_job(&path).unwrap();
    let written = read_committed(&broker, &output);
    let got: Vec<(Option<i64>, String)> = written
        .into_iter()
        .map(|r| (r.timestamp, r.value))
        .collect();
    let want: Vec<(Option<i64>, String)> = times
        .iter()
        .map(|&at| (Some(at), format!(r#"{{"sym":"ab","at":{at}}}"#)))
        .collect();
    assert_eq!(got, want);
}

/// A server job reaches only the schema registry of its tenant's Kafka grant, with the
/// grant's credentials, and names no schema file (the server would read its own disk):
/// anything else is refused with the reason; within the grant, Avro is read through it.
#[test]
fn a_server_job_reaches_only_its_grants_schema_registry() {
    let (Some(broker), Some(registry)) = (broker(), schema_registry()) else {
        return;
    };
    let input = unique_topic("a.in-avro");
    let output = unique_topic("a.out-json");
    create_topic(&broker, &input, 1);
    create_topic(&broker, &output, 1);
    let id = register(&registry, &format!("{input}-value"), V1);
    let s1 = Schema::parse_str(V1).unwrap();
    let values: Vec<Vec<u8>> = (0..5)
        .map(|i| framed(id, &s1, vec![("user", "u".into()), ("n", Value::Int(i))]))
        .collect();
    produce_values(&broker, &input, &values);
    let grant = |registry_line: &str| {
        format!(
            "[tenant.a.kafka]\nbootstrap = \"{broker}\"\nread = [\"a\\\\.in-.*\"]\n\
             write = [\"a\\\\.out-.*\"]\n{registry_line}\n"
        )
    };
    let job_text = |registry_fields: &str| {
        format!(
            r#"
name = "registry-on-a-server"
[source]
type = "kafka"
name = "clicks"
topics = "{input}"
bounded = true
format = "avro"
schema_registry = {{ {registry_fields} }}
[[operator]]
name = "pass"
plugin = "{FILTER}"
[sink]
type = "kafka"
topic = "{output}"
format = "json"
[checkpoint]
interval_ms = 100
"#
        )
    };
    let granted = format!("url = \"{registry}\"");

    // A grant without a registry: none may be named.
    let dir = test_dir("formats-server-no-registry");
    let server = ServerProcess::start(&host_config(&dir, &grant("")));
    let a = server.client(Some("token-a"));
    let job = write_job(&dir, &job_text(&granted));
    let e = error_of(a.submit(&job));
    assert!(
        e.contains("403") && e.contains("the grant names no schema registry"),
        "{e}"
    );
    drop(server);

    let dir = test_dir("formats-server-registry");
    let server = ServerProcess::start(&host_config(
        &dir,
        &grant(&format!("schema_registry = {{ {granted} }}")),
    ));
    let a = server.client(Some("token-a"));
    for (fields, reason) in [
        (
            "url = \"http://169.254.169.254/latest\"".to_string(),
            "schema registry \"http://169.254.169.254/latest\" is not the granted",
        ),
        (
            format!("{granted}, username = \"u\", password = \"${{file:/etc/passwd}}\""),
            "may not carry a username or password in a server job",
        ),
    ] {
        let job = write_job(&dir, &job_text(&fields));
        let e = error_of(a.submit(&job));
        assert!(e.contains("403") && e.contains(reason), "{e}");
    }
    // Nor a schema file, which the server would read from its own disk (sent as it is,
    // not by `sluice submit`, which writes schema files in).
    let filter = a.upload_plugin(std::path::Path::new(FILTER)).unwrap();
    let text = job_text(&granted)
        .replace("bounded = true", "bounded = true\nschema = \"/etc/passwd\"")
        .replace(FILTER, &format!("sha256:{}", filter.sha256));
    let (status, refused) = a
        .request("POST", "/v1/jobs", Some(text.as_bytes()))
        .unwrap();
    let refused = String::from_utf8_lossy(&refused);
    assert!(
        status == 403 && refused.contains("source clicks: a schema file"),
        "{status} {refused}"
    );
    // Within the grant: read through the registry, written as JSON, with the job's own
    // schema, which `sluice submit` writes into the job file it sends.
    std::fs::write(dir.join("clicks.avsc"), V1).unwrap();
    let text =
        job_text(&granted).replace("bounded = true", "bounded = true\nschema = \"clicks.avsc\"");
    let job = write_job(&dir, &text);
    let id = a.submit(&job).unwrap().id;
    let shown = a.status(&id).unwrap().job_file.unwrap_or_default();
    assert!(shown.contains("schema = { text = "), "{shown}");
    wait_for("the job to finish", Duration::from_secs(120), || {
        let s = a.status(&id).unwrap();
        assert_ne!(s.job.state, JobState::Failed, "{s:?}");
        s.job.state == JobState::Finished
    });
    let written: Vec<String> = read_committed_values(&broker, &output)
        .into_iter()
        .map(|v| String::from_utf8(v).unwrap())
        .collect();
    let want: Vec<String> = (0..5)
        .map(|i| format!(r#"{{"user":"u","n":{i}}}"#))
        .collect();
    assert_eq!(written, want);

    // A Protobuf sink whose schema imports a file: a server job registers no subject but
    // its topic's (an import's subject is its path, anyone's), so the import must be in
    // the registry already.
    let proto_out = unique_topic("a.out-proto");
    create_topic(&broker, &proto_out, 1);
    let folder = unique_topic("common");
    let import = format!("{folder}/address.proto");
    std::fs::create_dir_all(dir.join(&folder)).unwrap();
    let imported = "syntax = \"proto3\";\npackage common;\nmessage Address { string city = 1; }\n";
    std::fs::write(dir.join(&import), imported).unwrap();
    std::fs::write(
        dir.join("click.proto"),
        format!(
            "syntax = \"proto3\";\npackage shop;\nimport \"{import}\";\n\
             message Click {{ string user = 1; int32 n = 2; common.Address at = 3; }}\n"
        ),
    )
    .unwrap();
    let text = job_text(&granted).replace(
        &format!("topic = \"{output}\"\nformat = \"json\""),
        &format!(
            "topic = \"{proto_out}\"\nformat = \"protobuf\"\nschema = \"click.proto\"\n\
             schema_registry = {{ {granted} }}"
        ),
    );
    assert!(text.contains("click.proto"), "{text}");
    let job = write_job(
        &dir,
        &text.replace("registry-on-a-server", "proto-on-a-server"),
    );
    let id = a.submit(&job).unwrap().id;
    wait_for("the job to fail", Duration::from_secs(120), || {
        let s = a.status(&id).unwrap();
        assert_ne!(s.job.state, JobState::Finished, "{s:?}");
        s.last_failure
            .as_deref()
            .is_some_and(|why| why.contains("a server job registers no subject but its topics'"))
    });
    a.cancel(&id).unwrap();
    register_kind(&registry, &import.replace('/', "%2F"), "PROTOBUF", imported);
    let job = write_job(
        &dir,
        &text.replace("registry-on-a-server", "proto-on-a-server-again"),
    );
    let id = a.submit(&job).unwrap().id;
    wait_for("the job to finish", Duration::from_secs(120), || {
        let s = a.status(&id).unwrap();
        assert_ne!(s.job.state, JobState::Failed, "{s:?}");
        s.job.state == JobState::Finished
    });
    let written = read_committed_values(&broker, &proto_out);
    assert_eq!(written.len(), 5);
    let schema = registered(
        &registry,
        u32::from_be_bytes(written[0][1..5].try_into().unwrap()),
    );
    assert_eq!(
        schema["references"][0]["subject"],
        import.as_str(),
        "{schema}"
    );
}
