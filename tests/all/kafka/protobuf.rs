//! Protobuf against the broker and a real schema registry (Apicurio's Confluent API,
//! started by `scripts/test.sh`): values read through the registry into JSON, an old
//! schema's messages resolved to the job's, bad records sent to a dead-letter topic, and
//! JSON written back as Protobuf in Confluent's wire format. Values are made and checked
//! with `prost` and plain HTTP, not Sluice's own code.

use sluice_tests::kafka::{
    broker, create_topic, produce_values, read_committed, read_committed_values, schema_registry,
    unique_topic,
};
use sluice_tests::{run_job, test_dir};

use super::formats::{pass_job, register_kind, registered};

const P1: &str = "syntax = \"proto3\";\npackage shop;\nmessage Order {\n  string id = 1;\n  int64 cents = 2;\n}\n";
const P2: &str = "syntax = \"proto3\";\npackage shop;\nmessage Order {\n  string id = 1;\n  int64 cents = 2;\n  string country = 3;\n}\nmessage Refund {\n  string id = 1;\n}\n";

#[derive(Clone, PartialEq, prost::Message)]
struct OrderV1 {
    #[prost(string, tag = "1")]
    id: String,
    #[prost(int64, tag = "2")]
    cents: i64,
}

#[derive(Clone, PartialEq, prost::Message)]
struct OrderV2 {
    #[prost(string, tag = "1")]
    id: String,
    #[prost(int64, tag = "2")]
    cents: i64,
    #[prost(string, tag = "3")]
    country: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct Refund {
    #[prost(string, tag = "1")]
    id: String,
}

/// A Protobuf value in Confluent's wire format: 0, the id big-endian, the message
/// indexes as the serializer writes them, the message.
fn proto_framed(id: u32, indexes: &[u8], message: &impl prost::Message) -> Vec<u8> {
    let mut out = vec![0];
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(indexes);
    out.extend(message.encode_to_vec());
    out
}

#[test]
fn protobuf_is_read_through_the_registry_and_bad_records_go_to_a_dead_letter_topic() {
    let (Some(broker), Some(registry)) = (broker(), schema_registry()) else {
        return;
    };
    let input = unique_topic("proto-orders");
    let output = unique_topic("json-orders");
    let dead = unique_topic("proto-dead");
    for topic in [&input, &output, &dead] {
        create_topic(&broker, topic, 1);
    }
    let subject = format!("{input}-value");
    let v1 = register_kind(&registry, &subject, "PROTOBUF", P1);
    let v2 = register_kind(&registry, &subject, "PROTOBUF", P2);
    assert_ne!(v1, v2);
    let order = |id: &str, cents| OrderV1 {
        id: id.into(),
        cents,
    };
    let mut malformed = proto_framed(v2, &[0], &order("cut", 1));
    malformed.truncate(malformed.len() - 3);
    let bad = [
        b"{\"id\":\"json\"}".to_vec(),
        proto_framed(987_654, &[0], &order("x", 0)),
        malformed,
    ];
    let mut values = vec![
        proto_framed(v1, &[0], &order("o1", 100)),
        proto_framed(
            v2,
            &[0],
            &OrderV2 {
                id: "o2".into(),
                cents: 250,
                country: "be".into(),
            },
        ),
        // The second message of v2: message indexes [1] (a count and an index, zigzag).
        proto_framed(v2, &[2, 2], &Refund { id: "r1".into() }),
    ];
    values.extend(bad.iter().cloned());
    values.push(proto_framed(v1, &[0], &order("o3", 9_007_199_254_740_993)));
    produce_values(&broker, &input, &values);

    let dir = test_dir("kafka-proto-in");
    let path = pass_job(
        &dir,
        "proto",
        &input,
        &format!(
            "format = \"protobuf\"\nschema_registry = {{ url = \"{registry}\" }}\n\
             on_bad_record = {{ dead_letter = \"{dead}\" }}"
        ),
        &format!("topic = \"{output}\"\nformat = \"json\""),
    );
    let report = run_job(&path).unwrap();
    let written: Vec<String> = read_committed_values(&broker, &output)
        .into_iter()
        .map(|v| String::from_utf8(v).unwrap())
        .collect();
    // Read with the subject's latest schema: v1's orders get v2's country (its default),
    // every field present; the refund is read as the message its indexes name.
    assert_eq!(
        written,
        [
            r#"{"id":"o1","cents":100,"country":""}"#,
            r#"{"id":"o2","cents":250,"country":"be"}"#,
            r#"{"id":"r1"}"#,
            r#"{"id":"o3","cents":9007199254740993,"country":""}"#,
        ]
    );
    let source = report
        .tasks
        .iter()
        .find_map(|t| t.source.as_ref())
        .expect("a source report");
    assert_eq!(source.counters.get("bad-records"), Some(&3), "{source:?}");
    // The bad records, as they were read, with where they came from and why.
    let letters = read_committed(&broker, &dead);
    assert_eq!(letters.len(), 3, "{letters:?}");
    for (i, (letter, value)) in letters.iter().zip(&bad).enumerate() {
        assert_eq!(&letter.raw_value, value);
        let header = |name: &str| {
            letter
                .headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| panic!("no header {name}: {letter:?}"))
        };
        assert_eq!(header("sluice.dead-letter.topic"), input);
        assert_eq!(header("sluice.dead-letter.partition"), "0");
        assert_eq!(header("sluice.dead-letter.offset"), (3 + i).to_string());
        let why = header("sluice.dead-letter.reason");
        let expected = [
            "not the schema registry's magic byte",
            "schema id 987654 is not in the schema registry",
            "not a Protobuf message shop.Order",
        ][i];
        assert!(why.contains(expected), "{why}");
    }
}

#[test]
fn json_is_written_as_protobuf_in_the_registrys_wire_format() {
    let (Some(broker), Some(registry)) = (broker(), schema_registry()) else {
        return;
    };
    let input = unique_topic("json-refunds");
    let output = unique_topic("proto-refunds");
    create_topic(&broker, &input, 1);
    create_topic(&broker, &output, 1);
    let values: Vec<Vec<u8>> = (0..20)
        .map(|i| format!(r#"{{"id":"r{i}"}}"#).into_bytes())
        .collect();
    produce_values(&broker, &input, &values);
    let dir = test_dir("kafka-proto-out");
    std::fs::write(dir.join("shop.proto"), P2).unwrap();
    let path = pass_job(
        &dir,
        "proto-out",
        &input,
        "format = \"json\"",
        &format!(
            "topic = \"{output}\"\nformat = \"protobuf\"\nschema = \"shop.proto\"\n\
             message = \"shop.Refund\"\nschema_registry = {{ url = \"{registry}\" }}"
        ),
    );
    run_job(&path).unwrap();
    let written = read_committed_values(&broker, &output);
    assert_eq!(written.len(), 20);
    for (i, value) in written.iter().enumerate() {
        assert_eq!(value[0], 0, "the magic byte");
        let id = u32::from_be_bytes(value[1..5].try_into().unwrap());
        let schema = registered(&registry, id);
        assert_eq!(schema["schemaType"], "PROTOBUF", "{schema}");
        // Message indexes [1]: shop.Refund, the file's second message.
        assert_eq!(value[5..7], [2, 2]);
        let refund = <Refund as prost::Message>::decode(&value[7..]).unwrap();
        assert_eq!(refund.id, format!("r{i}"));
    }
}
