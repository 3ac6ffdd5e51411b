//! Bad input gets a clear error that names the file, operator and call, a non-zero exit,
//! no panic of the host, and no partial output presented as complete.

use std::path::Path;

use crate::cli::{outcome, sluice};
use sluice_tests::plugins::{TEST_MISBEHAVE, TEST_NOT_OPERATOR, TEST_WRONG_VERSION, TOKENIZE};
use sluice_tests::{test_dir, write_job};

/// A job reading one line and running `plugin` with `config`, writing `out.txt`.
fn job_with(dir: &Path, plugin: &str, config: &str) -> String {
    std::fs::write(dir.join("in.txt"), "one line\nanother line\n").unwrap();
    let job = write_job(
        dir,
        &format!(
            r#"
name = "bad"
[source]
type = "file"
path = "in.txt"
[[operator]]
name = "suspect"
plugin = "{plugin}"
config = {{ {config} }}
[sink]
type = "file"
path = "out.txt"
"#
        ),
    );
    job.to_str().unwrap().to_string()
}

/// Runs `sluice run` and checks the common expectations of a bad job or plugin file;
/// returns stderr.
fn fails(job: &str) -> String {
    fails_with(job, 65)
}

/// Runs `sluice run` and checks the common expectations of a job that fails with exit
/// status `status`; returns stderr.
fn fails_with(job: &str, status: i32) -> String {
    let (code, _, stderr) = outcome(&sluice(&["run", job]));
    assert_eq!(
        code,
        Some(status),
        "expected failure, got {code:?}: {stderr}"
    );
    assert!(
        stderr.starts_with("error: ") || stderr.contains("\nerror: "),
        "{stderr}"
    );
    assert!(!stderr.contains("thread '"), "the host panicked: {stderr}");
    stderr
}

#[test]
fn missing_plugin_file() {
    let dir = test_dir("bad-missing");
    let stderr = fails(&job_with(&dir, "nowhere/plugin.wasm", ""));
    assert!(stderr.contains("operator 'suspect'"), "{stderr}");
    assert!(stderr.contains("cannot read plugin file"), "{stderr}");
    assert!(stderr.contains("nowhere/plugin.wasm"), "{stderr}");
    assert!(stderr.contains("No such file"), "{stderr}");
}

#[test]
fn file_that_is_not_wasm() {
    let dir = test_dir("bad-notwasm");
    std::fs::write(dir.join("text.wasm"), "just some text").unwrap();
    let stderr = fails(&job_with(&dir, "text.wasm", ""));
    assert!(
        stderr.contains("text.wasm is not a WebAssembly file"),
        "{stderr}"
    );
}

#[test]
fn core_module_instead_of_a_component() {
    let dir = test_dir("bad-core");
    // The smallest valid core module: magic and version 1, no sections.
    std::fs::write(dir.join("core.wasm"), b"\0asm\x01\0\0\0").unwrap();
    let stderr = fails(&job_with(&dir, "core.wasm", ""));
    assert!(
        stderr.contains("core.wasm is a core WebAssembly module, not a component"),
        "{stderr}"
    );
    assert!(stderr.contains("wasm32-wasip2"), "{stderr}");
}

#[test]
fn component_of_another_wit_version() {
    let dir = test_dir("bad-version");
    let stderr = fails(&job_with(&dir, TEST_WRONG_VERSION, ""));
    assert!(
        stderr.contains("test_wrong_version.wasm cannot be used as an operator"),
        "{stderr}"
    );
    assert!(
        stderr.contains("built for sluice:operator@0.9.0"),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "supports sluice:operator@0.3.0, sluice:operator@0.2.0 and sluice:operator@0.1.0"
        ),
        "{stderr}"
    );
}

#[test]
fn component_of_another_world() {
    let dir = test_dir("bad-world");
    let stderr = fails(&job_with(&dir, TEST_NOT_OPERATOR, ""));
    assert!(stderr.contains("is not a Sluice operator"), "{stderr}");
    assert!(stderr.contains("it exports: wasi:cli/run"), "{stderr}");
}

#[test]
fn open_returns_an_error() {
    let dir = test_dir("bad-open");
    // It fails while running: not the file's fault.
    let stderr = fails_with(
        &job_with(&dir, TEST_MISBEHAVE, r#"behavior = "error-in-open""#),
        70,
    );
    assert!(
        stderr.contains(
            "operator 'suspect' (subtask 1/1) of job 'bad' (tenant 'default') failed in `open`: \
             operator error: test-misbehave: deliberate error in open"
        ),
        "{stderr}"
    );
    assert!(!dir.join("out.txt").exists(), "partial output left behind");
}

#[test]
fn invalid_config_is_reported_as_such() {
    let dir = test_dir("bad-config");
    let stderr = fails(&job_with(&dir, TOKENIZE, r#"min-length = "many""#));
    assert!(stderr.contains("operator 'suspect'"), "{stderr}");
    assert!(
        stderr.contains("failed in `open`: invalid configuration"),
        "{stderr}"
    );
    assert!(stderr.contains("min-length"), "{stderr}");
}

#[test]
fn panic_in_process_names_the_call_and_quotes_the_panic() {
    let dir = test_dir("bad-panic");
    let stderr = fails_with(
        &job_with(
            &dir,
            TEST_MISBEHAVE,
            r#"behavior = "panic-in-process", after = 1"#,
        ),
        70,
    );
    assert!(
        stderr.contains(
            "operator 'suspect' (subtask 1/1) of job 'bad' (tenant 'default') failed in `process`"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("panicked: test-misbehave: deliberate panic in process"),
        "{stderr}"
    );
    // The first record went through before the panic, but nothing is presented as output.
    assert!(!dir.join("out.txt").exists(), "partial output left behind");
}

/// A `.proto` file with `text`, written for a job to name; its path.
fn proto_file(name: &str, text: &str) -> std::path::PathBuf {
    let path = test_dir(&format!("proto-{name}")).join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn malformed(name: &str, toml: &str, expected: &[&str]) {
    let dir = test_dir(name);
    let job = write_job(&dir, toml);
    let stderr = fails(job.to_str().unwrap());
    assert!(
        stderr.contains("job.toml"),
        "the job file is not named: {stderr}"
    );
    for e in expected {
        assert!(stderr.contains(e), "{e:?} not in: {stderr}");
    }
}

const GOOD_SINK: &str = "[sink]\ntype = \"stdout\"\n";

#[test]
fn job_file_syntax_error() {
    malformed(
        "bad-syntax",
        "name = \"x\"\n[source\ntype = \"stdin\"\n",
        &["TOML parse error", "line 2"],
    );
}

#[test]
fn job_file_unknown_field() {
    malformed(
        "bad-field",
        &format!(
            "name = \"x\"\ncolour = \"blue\"\n[source]\ntype = \"stdin\"\n[[operator]]\nname = \"t\"\nplugin = \"{TOKENIZE}\"\n{GOOD_SINK}"
        ),
        &["unknown field `colour`"],
    );
}

#[test]
fn job_file_wrong_type() {
    malformed(
        "bad-type",
        &format!(
            "name = \"x\"\n[source]\ntype = \"stdin\"\n[[operator]]\nname = \"t\"\nplugin = \"{TOKENIZE}\"\nparallelism = \"two\"\n{GOOD_SINK}"
        ),
        &["invalid type: string \"two\", expected u32", "parallelism"],
    );
}

#[test]
fn job_file_without_operators() {
    malformed(
        "bad-no-operator",
        &format!("name = \"x\"\n[source]\ntype = \"stdin\"\n{GOOD_SINK}"),
        &["has no `[[operator]]`"],
    );
}

#[test]
fn job_file_operator_without_plugin() {
    malformed(
        "bad-no-plugin",
        &format!(
            "name = \"x\"\n[source]\ntype = \"stdin\"\n[[operator]]\nname = \"t\"\n{GOOD_SINK}"
        ),
        &["missing field `plugin`"],
    );
}

#[test]
fn job_file_that_does_not_exist() {
    let (code, _, stderr) = outcome(&sluice(&["run", "/nonexistent/job.toml"]));
    assert_eq!(code, Some(65), "{stderr}");
    assert!(
        stderr.contains("cannot read job file /nonexistent/job.toml"),
        "{stderr}"
    );
}

#[test]
fn kafka_job_file_mistakes_are_named() {
    let op = format!("[[operator]]\nname = \"t\"\nplugin = \"{TOKENIZE}\"\n");
    let kafka = "[source]\ntype = \"kafka\"\nbootstrap = \"127.0.0.1:9\"\ntopics = \"t\"\n";
    for (name, toml, expected) in [
        (
            "kafka-no-bootstrap",
            format!("name = \"x\"\n[source]\ntype = \"kafka\"\ntopics = \"t\"\n{op}{GOOD_SINK}"),
            "a kafka source needs `bootstrap`",
        ),
        (
            "kafka-no-topics",
            format!(
                "name = \"x\"\n[source]\ntype = \"kafka\"\nbootstrap = \"b:9\"\n{op}{GOOD_SINK}"
            ),
            "a kafka source needs `topics`",
        ),
        (
            "kafka-bad-pattern",
            format!(
                "name = \"x\"\n[source]\ntype = \"kafka\"\nbootstrap = \"b:9\"\n\
                 topics = {{ pattern = \"orders(\" }}\n{op}{GOOD_SINK}"
            ),
            "topic pattern \"orders(\" is not a regular expression",
        ),
        (
            "kafka-bad-start",
            format!("name = \"x\"\n{kafka}start = \"oldest\"\n{op}{GOOD_SINK}"),
            "`start` = \"oldest\": expected \"earliest\", \"latest\", \"committed\"",
        ),
        (
            "kafka-field-on-file",
            format!(
                "name = \"x\"\n[source]\ntype = \"file\"\npath = \"in.txt\"\ntopics = \"t\"\n{op}{GOOD_SINK}"
            ),
            "`topics` does not apply to a file source",
        ),
        (
            "kafka-record-time-on-file",
            format!(
                "name = \"x\"\n[source]\ntype = \"file\"\npath = \"in.txt\"\ntimestamp = \"record\"\n{op}{GOOD_SINK}"
            ),
            "`timestamp = \"record\"` needs records that carry a timestamp",
        ),
        (
            "kafka-exactly-once-without-checkpoints",
            format!(
                "name = \"x\"\n{kafka}{op}[sink]\ntype = \"kafka\"\nbootstrap = \"b:9\"\ntopic = \"out\"\ndelivery = \"exactly-once\"\n"
            ),
            "`delivery = \"exactly-once\"` needs `[checkpoint]`",
        ),
        (
            "kafka-sink-no-topic",
            format!("name = \"x\"\n{kafka}{op}[sink]\ntype = \"kafka\"\nbootstrap = \"b:9\"\n"),
            "a kafka sink needs `topic`",
        ),
        (
            "kafka-sink-bad-partitioner",
            format!(
                "name = \"x\"\n{kafka}{op}[sink]\ntype = \"kafka\"\nbootstrap = \"b:9\"\ntopic = \"out\"\npartitioner = \"hash\"\n"
            ),
            "`partitioner` must be \"key\" or \"record\", not \"hash\"",
        ),
        (
            "kafka-sink-partitioner-on-file",
            format!(
                "name = \"x\"\n{kafka}{op}[sink]\ntype = \"file\"\npath = \"o\"\npartitioner = \"record\"\n"
            ),
            "`partitioner` does not apply to a file sink",
        ),
        (
            "kafka-sink-field-on-stdout",
            format!("name = \"x\"\n{kafka}{op}[sink]\ntype = \"stdout\"\ntopic = \"out\"\n"),
            "`topic` does not apply to a stdout sink",
        ),
        (
            "kafka-avro-without-schema",
            format!("name = \"x\"\n{kafka}format = \"avro\"\n{op}{GOOD_SINK}"),
            "`format = \"avro\"` needs `schema_registry` (values in Confluent's wire format) or `schema`",
        ),
        (
            "kafka-protobuf-without-schema",
            format!("name = \"x\"\n{kafka}format = \"protobuf\"\n{op}{GOOD_SINK}"),
            "`format = \"protobuf\"` needs `schema_registry` (values in Confluent's wire format) or `schema` (the .proto file",
        ),
        (
            "kafka-proto-schema-not-proto",
            format!(
                "name = \"x\"\n{kafka}format = \"protobuf\"\nschema = \"{}\"\n{op}{GOOD_SINK}",
                proto_file("bad.proto", "message {").display()
            ),
            "not a .proto schema protox can compile",
        ),
        (
            "kafka-proto-message-missing",
            format!(
                "name = \"x\"\n{kafka}format = \"protobuf\"\nschema = \"{}\"\nmessage = \"p.Nope\"\n{op}{GOOD_SINK}",
                proto_file("p.proto", "syntax = \"proto3\"; package p; message A {}").display()
            ),
            "the .proto schema has no message \"p.Nope\" (it has [\"p.A\"])",
        ),
        (
            "kafka-schema-text-misspelt",
            format!(
                "name = \"x\"\n{kafka}format = \"avro\"\nschema = {{ txt = \"{{}}\" }}\n{op}{GOOD_SINK}"
            ),
            "a schema is the path of its file (a string) or { text = \"…\", imports = { \"PATH\" = \"…\" } }: it takes no `txt`",
        ),
        (
            "kafka-proto-schema-text-import-missing",
            format!(
                "name = \"x\"\n{kafka}format = \"protobuf\"\nschema = {{ text = 'syntax = \"proto3\"; import \"a.proto\"; message M {{}}' }}\n{op}{GOOD_SINK}"
            ),
            "`schema`: the text in the job file: not a .proto schema protox can compile: import 'a.proto' not found",
        ),
        (
            "kafka-key-avro-without-schema",
            format!("name = \"x\"\n{kafka}key_format = \"avro\"\n{op}{GOOD_SINK}"),
            "`key_format = \"avro\"` needs `schema_registry` (keys in Confluent's wire format) or `key_schema`",
        ),
        (
            "kafka-key-schema-without-format",
            format!("name = \"x\"\n{kafka}key_schema = \"k.avsc\"\n{op}{GOOD_SINK}"),
            "`key_schema` needs `key_format = \"avro\"` or \"protobuf\"",
        ),
        (
            "key-format-on-file-source",
            format!(
                "name = \"x\"\n[source]\ntype = \"file\"\npath = \"in.txt\"\nkey_format = \"json\"\n{op}{GOOD_SINK}"
            ),
            "`key_format` does not apply to a file source",
        ),
        (
            "kafka-message-without-protobuf",
            format!("name = \"x\"\n{kafka}format = \"json\"\nmessage = \"p.A\"\n{op}{GOOD_SINK}"),
            "`message` (a Protobuf message) needs `format = \"protobuf\"`, not \"json\"",
        ),
        (
            "kafka-schema-file-missing",
            format!(
                "name = \"x\"\n{kafka}format = \"avro\"\nschema = \"nope.avsc\"\n{op}{GOOD_SINK}"
            ),
            "`schema`: reading ",
        ),
        (
            "kafka-registry-not-http",
            format!(
                "name = \"x\"\n{kafka}format = \"json\"\nschema_registry = {{ url = \"registry:8081\" }}\n{op}{GOOD_SINK}"
            ),
            "`schema_registry.url` must be an http:// or https:// address",
        ),
        (
            "kafka-registry-password-without-user",
            format!(
                "name = \"x\"\n{kafka}format = \"json\"\nschema_registry = {{ url = \"http://r\", password = \"p\" }}\n{op}{GOOD_SINK}"
            ),
            "`schema_registry` needs both `username` and `password`",
        ),
        (
            "kafka-dead-letter-read-by-the-source",
            format!(
                "name = \"x\"\n{kafka}format = \"json\"\non_bad_record = {{ dead_letter = \"t\" }}\n{op}{GOOD_SINK}"
            ),
            "`on_bad_record = { dead_letter = \"t\" }`: the source reads that topic itself",
        ),
        (
            "kafka-dead-letter-bad-name",
            format!(
                "name = \"x\"\n{kafka}format = \"json\"\non_bad_record = {{ dead_letter = \"bad letters\" }}\n{op}{GOOD_SINK}"
            ),
            "not a Kafka topic name",
        ),
        (
            "kafka-dead-letter-not-a-topic",
            format!(
                "name = \"x\"\n{kafka}format = \"json\"\non_bad_record = {{ dead_letter = 3 }}\n{op}{GOOD_SINK}"
            ),
            "`on_bad_record = { dead_letter = … }` names a topic (a string), not 3",
        ),
        (
            "kafka-bad-record-on-bytes",
            format!("name = \"x\"\n{kafka}on_bad_record = \"skip\"\n{op}{GOOD_SINK}"),
            "`on_bad_record` needs a `format` that can find a bad record",
        ),
        (
            "kafka-registry-on-file-source",
            format!(
                "name = \"x\"\n[source]\ntype = \"file\"\npath = \"in.txt\"\nformat = \"json\"\nschema_registry = {{ url = \"http://r\" }}\n{op}{GOOD_SINK}"
            ),
            "`schema_registry` does not apply to a file source",
        ),
        (
            "protobuf-file-source",
            format!(
                "name = \"x\"\n[source]\ntype = \"file\"\npath = \"in.txt\"\nformat = \"protobuf\"\n{op}{GOOD_SINK}"
            ),
            "a file of Protobuf messages needs `schema`: the .proto file of its messages",
        ),
        (
            "protobuf-file-sink",
            format!(
                "name = \"x\"\n[source]\ntype = \"file\"\npath = \"in.txt\"\n{op}[sink]\ntype = \"file\"\npath = \"o.pb\"\nformat = \"protobuf\"\n"
            ),
            "`format = \"protobuf\"` needs `schema`: the .proto file of the messages the sink writes",
        ),
        (
            "message-on-a-json-file-source",
            format!(
                "name = \"x\"\n[source]\ntype = \"file\"\npath = \"in.txt\"\nformat = \"json\"\nmessage = \"a.B\"\n{op}{GOOD_SINK}"
            ),
            "`message` (a Protobuf message) needs `format = \"protobuf\"`",
        ),
        (
            "avro-file-source-bad-record",
            format!(
                "name = \"x\"\n[source]\ntype = \"file\"\npath = \"in.avro\"\nformat = \"avro\"\non_bad_record = \"skip\"\n{op}{GOOD_SINK}"
            ),
            "`on_bad_record` does not apply to an Avro file",
        ),
        (
            "dead-letter-file-source",
            format!(
                "name = \"x\"\n[source]\ntype = \"file\"\npath = \"in.txt\"\nformat = \"json\"\non_bad_record = {{ dead_letter = \"d\" }}\n{op}{GOOD_SINK}"
            ),
            "a file source takes \"fail\" or \"skip\"",
        ),
        (
            "kafka-sink-line-format",
            format!(
                "name = \"x\"\n{kafka}{op}[sink]\ntype = \"kafka\"\nbootstrap = \"b:9\"\ntopic = \"out\"\nformat = \"key-value\"\n"
            ),
            "a kafka sink's `format` is \"bytes\", \"json\", \"avro\" or \"protobuf\", not \"key-value\"",
        ),
        (
            "kafka-named-timestamp-on-bytes",
            format!("name = \"x\"\n{kafka}timestamp = {{ field = \"ts\" }}\n{op}{GOOD_SINK}"),
            "`timestamp = { field = \"ts\" }` names a field of JSON values: it needs `format = \"json\"`",
        ),
        (
            "named-timestamp-on-file",
            format!(
                "name = \"x\"\n[source]\ntype = \"file\"\npath = \"in.txt\"\ntimestamp = {{ field = \"ts\" }}\n{op}{GOOD_SINK}"
            ),
            "`timestamp = { field = \"ts\" }` names a field of JSON values: a kafka or file source with `format = \"json\"`",
        ),
        (
            "file-sink-avro-without-schema",
            format!(
                "name = \"x\"\n{kafka}{op}[sink]\ntype = \"file\"\npath = \"o\"\nformat = \"avro\"\n"
            ),
            "`format = \"avro\"` needs `schema`: the .avsc file of the records the sink writes",
        ),
        (
            "file-sink-avro-bad-schema",
            format!(
                "name = \"x\"\n{kafka}{op}[sink]\ntype = \"file\"\npath = \"o\"\nformat = \"avro\"\nschema = \"nope.avsc\"\n"
            ),
            "`schema`: reading",
        ),
        (
            "file-sink-bytes",
            format!(
                "name = \"x\"\n{kafka}{op}[sink]\ntype = \"file\"\npath = \"o\"\nformat = \"bytes\"\n"
            ),
            "a `file` sink writes `format = \"value\"`, \"key-value\", \"json\" (JSON lines), \"avro\" (an Avro object container file) or \"protobuf\" (length-delimited messages), not \"bytes\"",
        ),
        (
            "stdout-sink-avro",
            format!("name = \"x\"\n{kafka}{op}[sink]\ntype = \"stdout\"\nformat = \"avro\"\n"),
            "a `stdout` sink writes `format = \"value\"`, \"key-value\" or \"json\" (JSON lines), not \"avro\"",
        ),
        (
            "file-sink-codec-without-avro",
            format!(
                "name = \"x\"\n{kafka}{op}[sink]\ntype = \"file\"\npath = \"o\"\ncodec = \"deflate\"\n"
            ),
            "`codec` applies to a file sink with `format = \"avro\"` only",
        ),
        (
            "file-sink-avro-codec-zstd",
            format!(
                "name = \"x\"\n{kafka}{op}[sink]\ntype = \"file\"\npath = \"o\"\nformat = \"avro\"\nschema = \"o.avsc\"\ncodec = \"zstd\"\n"
            ),
            "zstd is not offered: `codec = \"deflate\"` or `\"snappy\"`",
        ),
    ] {
        malformed(name, &toml, &[expected]);
    }
}
