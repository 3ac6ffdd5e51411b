//! What a user sees for each kind of mistake in a job file: the whole message, so a
//! change to parsing or validation that makes one worse shows here.

use std::path::Path;

use crate::job::JobGraph;
use crate::spec::JobFile;

const OP: &str = "[[operator]]\nname = \"t\"\nplugin = \"t.wasm\"\n";
const SINK: &str = "[sink]\ntype = \"stdout\"\n";
const GEN: &str = "[source]\ntype = \"generator\"\nrecords = 10\n";
const KAFKA: &str = "[source]\ntype = \"kafka\"\nbootstrap = \"b:9\"\ntopics = \"t\"\n";

/// The error a job file gives, parsed and validated as `/jobs/job.toml`.
fn error_of(text: &str) -> String {
    let path = Path::new("/jobs/job.toml");
    match JobFile::parse(text, path).and_then(|f| JobGraph::from_file(&f, path)) {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => format!("{e:#}"),
    }
}

/// Cases: (a job file, the message it gives).
fn cases() -> Vec<(String, &'static str)> {
    let job = |body: &str| format!("name = \"x\"\n{body}");
    vec![
        (
            job(&format!("colour = \"blue\"\n{GEN}{OP}{SINK}")),
            "/jobs/job.toml: in `colour`: TOML parse error at line 2, column 1\n  |\n2 | colour = \"blue\"\n  | ^^^^^^\nunknown field `colour`, expected one of `name`, `tenant`, `max_parallelism`, `source`, `operator`, `sink`, `checkpoint`, `state`, `restart`, `runtime`, `cluster`\n",
        ),
        (
            job(&format!(
                "{GEN}[[operator]]\nname = \"t\"\nplugin = \"t.wasm\"\nparallelism = \"two\"\n{SINK}"
            )),
            "/jobs/job.toml: in `operator[0].parallelism`: TOML parse error at line 8, column 15\n  |\n8 | parallelism = \"two\"\n  |               ^^^^^\ninvalid type: string \"two\", expected u32\n",
        ),
        (
            job(&format!("{GEN}{SINK}")),
            "/jobs/job.toml: the job has no `[[operator]]`; at least one is needed",
        ),
        (
            job(&format!("{GEN}[[operator]]\nname = \"t\"\n{SINK}")),
            "/jobs/job.toml: in `operator[0]`: TOML parse error at line 5, column 1\n  |\n5 | [[operator]]\n  | ^^^^^^^^^^^^\nmissing field `plugin`\n",
        ),
        (
            job(&format!(
                "[source]\ntype = \"kafka\"\ntopics = \"t\"\n{OP}{SINK}"
            )),
            "/jobs/job.toml: source #1: a kafka source needs `bootstrap` (the brokers, host:port)",
        ),
        (
            job(&format!("{KAFKA}start = \"oldest\"\n{OP}{SINK}")),
            "/jobs/job.toml: in `source.start`: TOML parse error at line 6, column 9\n  |\n6 | start = \"oldest\"\n  |         ^^^^^^^^\n`start` = \"oldest\": expected \"earliest\", \"latest\", \"committed\" or { timestamp_ms = N }\n",
        ),
        (
            job(&format!(
                "{KAFKA}start = {{ timestamp_ms = -1 }}\n{OP}{SINK}"
            )),
            "/jobs/job.toml: in `source.start`: TOML parse error at line 6, column 9\n  |\n6 | start = { timestamp_ms = -1 }\n  |         ^^^^^^^^^^^^^^^^^^^^^\n`start` = { timestamp_ms = N } needs milliseconds since the epoch (0 or more)\n",
        ),
        (
            job(&format!(
                "[source]\ntype = \"kafka\"\nbootstrap = \"b:9\"\ntopics = {{ pattern = \"a(\" }}\n{OP}{SINK}"
            )),
            "/jobs/job.toml: source #1: topic pattern \"a(\" is not a regular expression: regex parse error:\n    ^(?:a()$\n     ^\nerror: unclosed group",
        ),
        (
            job(&format!(
                "[source]\ntype = \"kafka\"\nbootstrap = \"b:9\"\ntopics = 3\n{OP}{SINK}"
            )),
            "/jobs/job.toml: in `source.topics`: TOML parse error at line 5, column 10\n  |\n5 | topics = 3\n  |          ^\n`topics` must be a topic name, a list of them or { pattern = \"REGEX\" }, not 3\n",
        ),
        (
            job(&format!(
                "[source]\ntype = \"file\"\npath = \"in.txt\"\ntopics = \"t\"\n{OP}{SINK}"
            )),
            "/jobs/job.toml: source #1: `topics` does not apply to a file source",
        ),
        (
            job(&format!(
                "[source]\ntype = \"file\"\npath = \"in.txt\"\ntimestamp = \"record\"\n{OP}{SINK}"
            )),
            "/jobs/job.toml: source #1: `timestamp = \"record\"` needs records that carry a timestamp: a kafka source",
        ),
        (
            job(&format!(
                "[source]\ntype = \"file\"\npath = \"in.txt\"\ntimestamp = {{ field = -1 }}\n{OP}{SINK}"
            )),
            "/jobs/job.toml: in `source.timestamp`: TOML parse error at line 5, column 13\n  |\n5 | timestamp = { field = -1 }\n  |             ^^^^^^^^^^^^^^\n`timestamp` must be { field = N, separator = \",\" } (the field holding the event time in milliseconds), { field = \"NAME\" } (a field of JSON or Avro values) or \"record\" (the timestamp a Kafka record carries)\n",
        ),
        (
            job(&format!("[source]\ntype = \"pipe\"\n{OP}{SINK}")),
            "/jobs/job.toml: in `source.type`: TOML parse error at line 3, column 8\n  |\n3 | type = \"pipe\"\n  |        ^^^^^^\nunknown variant `pipe`, expected one of `file`, `generator`, `stdin`, `kafka`\n",
        ),
        (
            job(&format!("{GEN}shape = \"circles\"\n{OP}{SINK}")),
            "/jobs/job.toml: in `source.shape`: TOML parse error at line 5, column 9\n  |\n5 | shape = \"circles\"\n  |         ^^^^^^^^^\n`shape` must be \"words\" or \"events\", not \"circles\"\n",
        ),
        (
            job(&format!("{GEN}rate = 0.0\n{OP}{SINK}")),
            "/jobs/job.toml: source #1: `rate` = 0 is out of range: it must be between 0.001 and 1000000000",
        ),
        (
            job(&format!("{GEN}{OP}key_by = \"name\"\n{SINK}")),
            "/jobs/job.toml: in `operator[0].key_by`: TOML parse error at line 8, column 10\n  |\n8 | key_by = \"name\"\n  |          ^^^^^^\n`key_by` must be \"key\", \"value\" or { field = N, separator = \",\" }, not \"name\"\n",
        ),
        (
            job(&format!(
                "{GEN}{OP}key_by = {{ field = 1, sep = \",\" }}\n{SINK}"
            )),
            "/jobs/job.toml: in `operator[0].key_by`: TOML parse error at line 8, column 10\n  |\n8 | key_by = { field = 1, sep = \",\" }\n  |          ^^^^^^^^^^^^^^^^^^^^^^^^\nunknown field `sep` (expected `field` and `separator`)\n",
        ),
        (
            job(&format!("{GEN}{OP}partition = \"random\"\n{SINK}")),
            "/jobs/job.toml: in `operator[0].partition`: TOML parse error at line 8, column 13\n  |\n8 | partition = \"random\"\n  |             ^^^^^^^^\n`partition` must be \"forward\", \"rebalance\" or \"broadcast\", not \"random\"\n",
        ),
        (
            job(&format!("{GEN}{OP}inputs = [3]\n{SINK}")),
            "/jobs/job.toml: in `operator[0].inputs[0]`: TOML parse error at line 8, column 10\n  |\n8 | inputs = [3]\n  |          ^^^\nan `inputs` entry must be a name or { from = \"NAME\", ... }, not 3\n",
        ),
        (
            job(&format!(
                "{GEN}{OP}inputs = [{{ from = \"source\", colour = 1 }}]\n{SINK}"
            )),
            "/jobs/job.toml: in `operator[0].inputs[0]`: TOML parse error at line 8, column 10\n  |\n8 | inputs = [{ from = \"source\", colour = 1 }]\n  |          ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\ninput 'source': unknown field `colour` (expected `from`, `key_by`, `partition` or `broadcast`)\n",
        ),
        (
            job(&format!("{GEN}{OP}inputs = [\"nowhere\"]\n{SINK}")),
            "/jobs/job.toml: operator 't': input 'nowhere' names no source or operator (there are: source, t)",
        ),
        (
            job(&format!("{GEN}{OP}config = {{ a = [1] }}\n{SINK}")),
            "/jobs/job.toml: in `operator[0].config.a`: TOML parse error at line 8, column 16\n  |\n8 | config = { a = [1] }\n  |                ^^^\na config value must be a string, number or boolean\n",
        ),
        (
            job(&format!(
                "{GEN}{OP}[sink]\ntype = \"file\"\npath = \"o\"\nformat = \"csv\"\n"
            )),
            "/jobs/job.toml: in `sink.format`: TOML parse error at line 11, column 10\n   |\n11 | format = \"csv\"\n   |          ^^^^^\n`format` must be \"value\", \"key-value\", \"bytes\", \"json\", \"avro\" or \"protobuf\", not \"csv\"\n",
        ),
        (
            job(&format!(
                "{KAFKA}{OP}[sink]\ntype = \"kafka\"\nbootstrap = \"b:9\"\ntopic = \"o\"\npartitioner = \"hash\"\n"
            )),
            "/jobs/job.toml: in `sink.partitioner`: TOML parse error at line 13, column 15\n   |\n13 | partitioner = \"hash\"\n   |               ^^^^^^\n`partitioner` must be \"key\" or \"record\", not \"hash\"\n",
        ),
        (
            job(&format!(
                "{KAFKA}{OP}[sink]\ntype = \"kafka\"\nbootstrap = \"b:9\"\ntopic = \"o\"\ndelivery = \"twice\"\n"
            )),
            "/jobs/job.toml: in `sink.delivery`: TOML parse error at line 13, column 12\n   |\n13 | delivery = \"twice\"\n   |            ^^^^^^^\n`delivery` must be \"exactly-once\" or \"at-least-once\", not \"twice\"\n",
        ),
        (
            job(&format!(
                "{KAFKA}{OP}[sink]\ntype = \"kafka\"\nbootstrap = \"b:9\"\ntopic = \"o\"\ndelivery = \"exactly-once\"\n"
            )),
            "/jobs/job.toml: sink 'sink': `delivery = \"exactly-once\"` needs `[checkpoint]`: records are written when the checkpoint that covers them completes",
        ),
        (
            job(&format!(
                "{KAFKA}{OP}[sink]\ntype = \"stdout\"\ntopic = \"o\"\n"
            )),
            "/jobs/job.toml: sink 'sink': `topic` does not apply to a stdout sink",
        ),
        (
            job(&format!("{GEN}{OP}{SINK}[checkpoint]\ninterval_ms = 1\n")),
            "/jobs/job.toml: [checkpoint]: `interval_ms` = 1 is out of range: it must be between 10 and 86400000 (or 0: savepoints only)",
        ),
        (
            job(&format!(
                "{GEN}{OP}{SINK}[checkpoint]\ninterval_ms = 100\nmode = \"sometimes\"\n"
            )),
            "/jobs/job.toml: in `checkpoint.mode`: TOML parse error at line 12, column 8\n   |\n12 | mode = \"sometimes\"\n   |        ^^^^^^^^^^^\n`mode` must be \"exactly-once\" or \"at-least-once\", not \"sometimes\"\n",
        ),
        (
            job(&format!(
                "{GEN}{OP}{SINK}[checkpoint]\ninterval_ms = 100\nretain = 0\n"
            )),
            "/jobs/job.toml: [checkpoint]: `retain` = 0 is out of range: it must be between 1 and 100",
        ),
        (
            job(&format!(
                "{GEN}{OP}{SINK}[restart]\nstrategy = \"sometimes\"\n"
            )),
            "/jobs/job.toml: in `restart.strategy`: TOML parse error at line 11, column 12\n   |\n11 | strategy = \"sometimes\"\n   |            ^^^^^^^^^^^\n`strategy` must be \"none\", \"fixed-delay\" or \"exponential\", not \"sometimes\"\n",
        ),
        (
            job(&format!(
                "{GEN}{OP}{SINK}[restart]\nstrategy = \"exponential\"\nmultiplier = 0.5\n"
            )),
            "/jobs/job.toml: [restart]: `multiplier` = 0.5 is out of range: it must be between 1 and 10",
        ),
        (
            job(&format!("{GEN}{OP}{SINK}[runtime]\nbatch_size = 0\n")),
            "/jobs/job.toml: [runtime]: `batch_size` = 0 is out of range: it must be between 1 and 65536",
        ),
        (
            job(&format!(
                "{GEN}{OP}{SINK}[runtime]\nbuffer_timeout_ms = -5\n"
            )),
            "/jobs/job.toml: in `runtime.buffer_timeout_ms`: TOML parse error at line 11, column 21\n   |\n11 | buffer_timeout_ms = -5\n   |                     ^^\ninvalid value: integer `-5`, expected u64\n",
        ),
        (
            job(&format!("max_parallelism = 0\n{GEN}{OP}{SINK}")),
            "/jobs/job.toml: `max_parallelism` = 0 is out of range: it must be between 1 and 32768",
        ),
        (
            job(&format!(
                "[source]\ntype = \"stdin\"\n{OP}{SINK}[checkpoint]\ninterval_ms = 100\n"
            )),
            "/jobs/job.toml: checkpointing needs replayable sources; `stdin` cannot be replayed",
        ),
        (
            format!("name = \"x\\nINFO forged\"\n{GEN}{OP}{SINK}"),
            "/jobs/job.toml: the name \"x\\nINFO forged\" holds '\\n' (U+000A), a control, line separator or text direction character: names are printed in logs and on terminals",
        ),
        (
            job(&format!(
                "{GEN}[[operator]]\nname = \"t\\u202Eexe.txt\"\nplugin = \"t.wasm\"\n{SINK}"
            )),
            "/jobs/job.toml: the name \"t\\u{202e}exe.txt\" holds '\\u{202e}' (U+202E), a control, line separator or text direction character: names are printed in logs and on terminals",
        ),
        (
            job(&format!("{GEN}{OP}{SINK}[state]\nbackend = \"lsm\"\n")),
            "/jobs/job.toml: in `state.backend`: TOML parse error at line 11, column 11\n   |\n11 | backend = \"lsm\"\n   |           ^^^^^\nunknown variant `lsm`, expected `heap` or `rocksdb`\n",
        ),
        (
            job(&format!(
                "{GEN}{OP}{SINK}[state]\nbackend = \"rocksdb\"\nmemory_mb = 4\n"
            )),
            "/jobs/job.toml: [state]: `memory_mb` = 4 is out of range: it must be between 8 and 65536",
        ),
    ]
}

#[test]
fn each_mistake_in_a_job_file_gets_its_message() {
    let mut wrong = Vec::new();
    for (text, expected) in cases() {
        let got = error_of(&text);
        if got != expected {
            wrong.push(format!(
                "{text}\n  gives: {got:?}\n  expected: {expected:?}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
}

#[test]
fn durations_and_sizes_take_units() {
    let text = format!(
        "name = \"x\"\n{KAFKA}idle_timeout = \"2s\"\n{OP}[sink]\ntype = \"kafka\"\n\
         bootstrap = \"b:9\"\ntopic = \"o\"\nmax_pending = \"1GiB\"\n\
         [checkpoint]\ninterval = \"1m 30s\"\n[runtime]\nbuffer = \"64KiB\"\n"
    );
    let path = Path::new("/jobs/job.toml");
    let graph = JobGraph::from_file(&JobFile::parse(&text, path).unwrap(), path).unwrap();
    let checkpoint = graph.checkpoint.as_ref().unwrap();
    assert_eq!(checkpoint.interval, std::time::Duration::from_secs(90));
    assert_eq!(graph.network.buffer_bytes, 64 << 10);
    let sink = graph.vertices.iter().find_map(|v| match v {
        crate::job::Vertex::Sink(s) => s.kafka.as_ref(),
        _ => None,
    });
    assert_eq!(sink.unwrap().max_pending_bytes, 1 << 30);
    let source = graph.vertices.iter().find_map(|v| match v {
        crate::job::Vertex::Source(s) => Some(s),
        _ => None,
    });
    assert_eq!(
        source.unwrap().idle_timeout,
        Some(std::time::Duration::from_secs(2))
    );
    // Both names of one knob are one field written twice.
    let twice =
        format!("name = \"x\"\n{GEN}{OP}{SINK}[checkpoint]\ninterval = \"1s\"\ninterval_ms = 10\n");
    assert!(
        error_of(&twice).contains("duplicate field"),
        "{}",
        error_of(&twice)
    );
}
