//! File sources in a format: an Avro object container file (written here with
//! `apache-avro`, not Sluice's code) read as JSON records, through a restart from a
//! checkpoint taken mid-file, and JSON lines with a bad line skipped or failing the job.

use apache_avro::types::Value;
use sluice::job::JobOutcome;
use sluice_tests::plugins::{FILTER, TEST_MISBEHAVE};
use sluice_tests::{run_job, test_dir, write_job};

/// An operator passing records on that fails once, at record `after` of the first
/// attempt, after a checkpoint taken since it saw a record has completed.
fn flaky_operator(after: u32) -> String {
    format!(
        "[[operator]]\nname = \"flaky\"\nplugin = \"{TEST_MISBEHAVE}\"\nconfig = {{ behavior = \
         \"error-in-process\", after = {after}, attempts = \"0\", after-checkpoint = true }}"
    )
}

/// Checkpoints every 10 ms, two restarts 50 ms apart, batches of 100: a job that fails
/// once resumes from a checkpoint inside its input.
const RESTARTING: &str = "[checkpoint]\ninterval_ms = 10\n[restart]\nstrategy = \"fixed-delay\"\n\
                          attempts = 2\ndelay_ms = 50\n[runtime]\nbatch_size = 100\n";

const SCHEMA: &str = r#"{"type":"record","name":"Click","fields":[{"name":"user","type":"string"},{"name":"n","type":"long"}]}"#;

/// `n` clicks in an Avro file compressed with deflate, in blocks of about 1 KiB.
fn avro_file(path: &std::path::Path, n: i64) {
    let schema = apache_avro::Schema::parse_str(SCHEMA).unwrap();
    let mut writer = apache_avro::Writer::builder()
        .schema(&schema)
        .writer(Vec::new())
        .codec(apache_avro::Codec::Deflate(Default::default()))
        .block_size(1024)
        .build()
        .unwrap();
    for i in 0..n {
        writer
            .append_value(Value::Record(vec![
                ("user".into(), Value::String(format!("u{}", i % 7))),
                ("n".into(), Value::Long(i)),
            ]))
            .unwrap();
    }
    std::fs::write(path, writer.into_inner().unwrap()).unwrap();
}

#[test]
fn an_avro_file_is_read_as_json_exactly_once_through_a_restart() {
    let dir = test_dir("avro-file");
    avro_file(&dir.join("clicks.avro"), 200_000);
    // The job's schema reads the file's: `n` kept, `user` dropped, `country` its default.
    std::fs::write(
        dir.join("job.avsc"),
        r#"{"type":"record","name":"Click","fields":[{"name":"n","type":"long"},{"name":"country","type":"string","default":"nl"}]}"#,
    )
    .unwrap();
    let job = write_job(
        &dir,
        &format!(
            r#"
name = "avro-file"
[source]
type = "file"
path = "clicks.avro"
format = "avro"
schema = "job.avsc"
{}
[sink]
type = "file"
path = "out.txt"
{RESTARTING}"#,
            flaky_operator(120000)
        ),
    );
    let report = run_job(&job).unwrap();
    assert_eq!(report.outcome, JobOutcome::Finished);
    assert_eq!(report.restarts, 1);
    // The second attempt resumed inside the file.
    let read = report.tasks[0].records_in;
    assert!(
        read > 0 && read < 200_000,
        "the restart read {read} records"
    );
    let output = std::fs::read_to_string(dir.join("out.txt")).unwrap();
    let want: String = (0..200_000)
        .map(|i| format!("{{\"n\":{i},\"country\":\"nl\"}}\n"))
        .collect();
    assert!(output == want, "the output differs from the file's records");
}

#[test]
fn json_lines_are_checked_and_a_bad_line_skipped_or_named() {
    let dir = test_dir("json-lines");
    std::fs::write(
        dir.join("in.jsonl"),
        "{\"user\":\"a\",\"ts\":1000}\n\n  \n{\"user\":\"b\",\"ts\":2000}\n{\"user\":\n{\"user\":\"c\",\"ts\":3000,\"tags\":[1, 2]}\n",
    )
    .unwrap();
    let job = |on_bad: &str| {
        format!(
            r#"
name = "json-lines"
[source]
type = "file"
path = "in.jsonl"
format = "json"
on_bad_record = "{on_bad}"
timestamp = {{ field = "ts" }}
[[operator]]
name = "pass"
plugin = "{FILTER}"
[sink]
type = "file"
path = "out.txt"
format = "json"
"#
        )
    };
    let path = write_job(&dir, &job("skip"));
    let report = run_job(&path).unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.join("out.txt")).unwrap(),
        "{\"user\":\"a\",\"ts\":1000}\n{\"user\":\"b\",\"ts\":2000}\n{\"user\":\"c\",\"ts\":3000,\"tags\":[1, 2]}\n"
    );
    let source = report
        .tasks
        .iter()
        .find_map(|t| t.source.as_ref())
        .expect("a source report");
    assert_eq!(source.counters.get("bad-records"), Some(&1), "{source:?}");

    let failing = test_dir("json-lines-fail");
    std::fs::copy(dir.join("in.jsonl"), failing.join("in.jsonl")).unwrap();
    let path = write_job(&failing, &job("fail"));
    let e = format!(
        "{:#}",
        run_job(&path).expect_err("a bad line fails the job")
    );
    assert!(e.contains("in.jsonl: the line at byte 50: not JSON"), "{e}");

    // A JSON lines sink takes JSON only, one value a line.
    let lines = test_dir("json-lines-sink");
    std::fs::write(lines.join("in.txt"), "{\"a\":1}\nplain text\n").unwrap();
    let path = write_job(
        &lines,
        &format!(
            "name = \"j\"\n[source]\ntype = \"file\"\npath = \"in.txt\"\n[[operator]]\n\
             name = \"pass\"\nplugin = \"{FILTER}\"\n[sink]\ntype = \"file\"\n\
             path = \"out.txt\"\nformat = \"json\"\n"
        ),
    );
    let e = format!("{:#}", run_job(&path).expect_err("text is not JSON"));
    assert!(
        e.contains("out.txt: the value \"plain text\" is not JSON"),
        "{e}"
    );
}

/// The clicks of an Avro file written back as one by a file sink with `format = "avro"`,
/// through a failure after a checkpoint (the sink's parts are committed per checkpoint):
/// `apache-avro` reads every record of the output exactly once, in order, and a value
/// that does not fit the sink's schema fails the job naming the file and the value.
#[test]
fn a_file_sink_writes_an_avro_file_exactly_once_through_a_restart() {
    let dir = test_dir("avro-file-sink");
    avro_file(&dir.join("clicks.avro"), 100_000);
    // The sink's schema: what the source's JSON holds, fields in another order.
    let out_schema = r#"{"type":"record","name":"Out","fields":[{"name":"n","type":"long"},{"name":"user","type":"string"}]}"#;
    std::fs::write(dir.join("out.avsc"), out_schema).unwrap();
    let job = |name: &str, after: u32, schema: &str, codec: &str| {
        write_job(
            &dir,
            &format!(
                r#"
name = "{name}"
[source]
type = "file"
path = "clicks.avro"
format = "avro"
{}
[sink]
type = "file"
path = "{name}.avro"
format = "avro"
schema = "{schema}"
codec = "{codec}"
{RESTARTING}"#,
                flaky_operator(after)
            ),
        )
    };
    for codec in ["null", "deflate"] {
        let name = format!("out-{codec}");
        let report = run_job(&job(&name, 60_000, "out.avsc", codec)).unwrap();
        assert_eq!(report.outcome, JobOutcome::Finished);
        assert_eq!(report.restarts, 1);
        let file = std::fs::File::open(dir.join(format!("{name}.avro"))).unwrap();
        let reader = apache_avro::Reader::new(std::io::BufReader::new(file)).unwrap();
        assert_eq!(
            reader.writer_schema(),
            &apache_avro::Schema::parse_str(out_schema).unwrap()
        );
        let mut n = 0i64;
        for value in reader {
            let expected = Value::Record(vec![
                ("n".into(), Value::Long(n)),
                ("user".into(), Value::String(format!("u{}", n % 7))),
            ]);
            assert_eq!(value.unwrap(), expected, "{codec}: record {n}");
            n += 1;
        }
        assert_eq!(n, 100_000, "{codec}");
    }

    // A schema the values do not fit: the job fails, naming the file and the value.
    std::fs::write(
        dir.join("strict.avsc"),
        r#"{"type":"record","name":"Out","fields":[{"name":"n","type":"string"}]}"#,
    )
    .unwrap();
    let why = format!(
        "{:#}",
        run_job(&job("strict", 1_000_000, "strict.avsc", "snappy")).unwrap_err()
    );
    assert!(
        why.contains("strict.avro")
            && why.contains("does not fit the sink's Avro schema")
            && why.contains("n is the number 0, not a string"),
        "{why}"
    );
}

#[derive(Clone, PartialEq, prost::Message)]
struct Click {
    #[prost(string, tag = "1")]
    user: String,
    #[prost(int64, tag = "2")]
    n: i64,
}

/// What the sink writes: the same fields in another order, one with another tag.
#[derive(Clone, PartialEq, prost::Message)]
struct Out {
    #[prost(int64, tag = "7")]
    n: i64,
    #[prost(string, tag = "1")]
    user: String,
}

/// A file of length-delimited Protobuf messages (written here with `prost`'s
/// `encode_length_delimited`, as Java's `writeDelimitedTo` does) read as JSON and written
/// back as one by a file sink with another message, through a failure after a checkpoint:
/// `prost` reads every message of the output exactly once, in order. A damaged file
/// fails the job naming the file and the byte, and a malformed message is a bad record
/// `on_bad_record = "skip"` leaves out.
#[test]
fn protobuf_files_are_read_and_written_as_length_delimited_messages_exactly_once() {
    let dir = test_dir("protobuf-files");
    std::fs::create_dir_all(dir.join("shop")).unwrap();
    std::fs::write(
        dir.join("shop/click.proto"),
        "syntax = \"proto3\";\npackage shop;\nmessage Click { string user = 1; int64 n = 2; }\n",
    )
    .unwrap();
    // The sink's schema imports the file beside it.
    std::fs::write(
        dir.join("out.proto"),
        "syntax = \"proto3\";\npackage out;\nimport \"shop/click.proto\";\n\
         message Out { int64 n = 7; string user = 1; }\nmessage Unused { shop.Click c = 1; }\n",
    )
    .unwrap();
    let clicks = |n: i64| -> Vec<u8> {
        let mut bytes = Vec::new();
        for i in 0..n {
            let click = Click {
                user: format!("u{}", i % 7),
                n: i,
            };
            prost::Message::encode_length_delimited(&click, &mut bytes).unwrap();
        }
        bytes
    };
    std::fs::write(dir.join("clicks.in.pb"), clicks(100_000)).unwrap();
    let job = |name: &str, input: &str, extra: &str| {
        write_job(
            &dir,
            &format!(
                r#"
name = "{name}"
[source]
type = "file"
path = "{input}"
format = "protobuf"
schema = "shop/click.proto"
{extra}
{}
[sink]
type = "file"
path = "{name}.pb"
format = "protobuf"
schema = "out.proto"
message = "out.Out"
{RESTARTING}"#,
                flaky_operator(60000)
            ),
        )
    };
    let report = run_job(&job("out", "clicks.in.pb", "")).unwrap();
    assert_eq!(report.outcome, JobOutcome::Finished);
    assert_eq!(report.restarts, 1);
    let written = std::fs::read(dir.join("out.pb")).unwrap();
    let mut rest = &written[..];
    let mut n = 0;
    while !rest.is_empty() {
        let out: Out = prost::Message::decode_length_delimited(&mut rest).unwrap();
        assert_eq!(
            out,
            Out {
                n,
                user: format!("u{}", n % 7)
            }
        );
        n += 1;
    }
    assert_eq!(n, 100_000);

    // A message cut short at the end of the file: the job fails, naming the byte.
    let mut cut = clicks(10);
    let at = cut.len();
    cut.extend_from_slice(&[20, 10, 2]);
    std::fs::write(dir.join("cut.in.pb"), &cut).unwrap();
    let why = format!("{:#}", run_job(&job("cut", "cut.in.pb", "")).unwrap_err());
    assert!(
        why.contains("cut.in.pb: the message at byte")
            && why.contains(&format!("byte {at}"))
            && why.contains("the file ends inside it (20 bytes long)"),
        "{why}"
    );
    // A malformed message (a field of wire type 7): skipped and counted with `skip`.
    let mut bad = clicks(3);
    bad.extend_from_slice(&[2, 0x0f, 0x00]);
    bad.extend(clicks(2));
    std::fs::write(dir.join("bad.in.pb"), &bad).unwrap();
    let report = run_job(&job("bad", "bad.in.pb", "on_bad_record = \"skip\"")).unwrap();
    let source = report
        .tasks
        .iter()
        .find_map(|t| t.source.as_ref())
        .expect("a source report");
    assert_eq!(source.counters.get("bad-records"), Some(&1), "{source:?}");
    let written = std::fs::read(dir.join("bad.pb")).unwrap();
    let mut rest = &written[..];
    let mut users = Vec::new();
    while !rest.is_empty() {
        let out: Out = prost::Message::decode_length_delimited(&mut rest).unwrap();
        users.push(out.user);
    }
    assert_eq!(users, ["u0", "u1", "u2", "u0", "u1"]);
}
