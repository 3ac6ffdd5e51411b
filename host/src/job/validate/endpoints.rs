//! The `[source]` and `[sink]` tables: the fields of each kind, and the settings of
//! generator and Kafka sources and of Kafka sinks.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Result, anyhow, bail};

use std::collections::BTreeMap;

use crate::connectors::EventTime;
use crate::connectors::formats::{self, Format, FormatConfig, OnBadRecord, RegistryConfig};
use crate::connectors::kafka::{
    self, Delivery, KafkaSinkConfig, KafkaSourceConfig, OutOfRange, StartFrom,
    TRANSACTION_TIMEOUT_MS, Topics,
};
use crate::job::graph::{FileOutput, GeneratorShape, SourceInput, SourceVertex};
use crate::spec::job_file::SchemaRegistrySpec;
use crate::spec::limits::{self, in_range};
use crate::spec::values::{
    AvroCodecName, DeliveryName, GeneratorShapeName, Millis, OnBadRecordName, OutOfRangeName,
    RecordFormatName, SchemaSpec, SinkFormatName, SinkPartitioner, StartSpec, Timestamp,
    TopicsSpec,
};
use crate::spec::{SinkKind, SinkSpec, SourceKind, SourceSpec, secrets};

/// Checks one `[source]` table against its type.
pub(super) fn source_vertex(
    spec: &SourceSpec,
    job: &str,
    default_name: String,
    resolve: &dyn Fn(&Path) -> PathBuf,
) -> Result<SourceVertex> {
    let kind = match spec.kind {
        SourceKind::File => "file",
        SourceKind::Generator => "generator",
        SourceKind::Stdin => "stdin",
        SourceKind::Kafka => "kafka",
    };
    let not_for = |field: &str, set: bool| -> Result<()> {
        if set {
            bail!("`{field}` does not apply to a {kind} source");
        }
        Ok(())
    };
    let generator_fields = [
        ("records", spec.records.is_some()),
        ("shape", spec.shape.is_some()),
        ("words_per_record", spec.words_per_record.is_some()),
        ("vocabulary", spec.vocabulary.is_some()),
        ("keys", spec.keys.is_some()),
        ("step_ms", spec.step_ms.is_some()),
        ("jitter_ms", spec.jitter_ms.is_some()),
        ("seed", spec.seed.is_some()),
        ("rate", spec.rate.is_some()),
        ("parallelism", spec.parallelism.is_some()),
    ];
    let kafka_fields = [
        ("bootstrap", spec.bootstrap.is_some()),
        ("topics", spec.topics.is_some()),
        ("start", spec.start.is_some()),
        ("on_out_of_range", spec.on_out_of_range.is_some()),
        ("group", spec.group.is_some()),
        ("discovery_ms", spec.discovery_ms.is_some()),
        ("properties", spec.properties.is_some()),
        ("bounded", spec.bounded.is_some()),
        ("format", spec.format.is_some()),
        ("schema_registry", spec.schema_registry.is_some()),
        ("schema", spec.schema.is_some()),
        ("message", spec.message.is_some()),
        ("key_format", spec.key_format.is_some()),
        ("key_schema", spec.key_schema.is_some()),
        ("on_bad_record", spec.on_bad_record.is_some()),
    ];
    if spec.kind != SourceKind::Kafka {
        // A file's records may be in a format too.
        let file_fields = ["format", "schema", "message", "on_bad_record"];
        for (field, set) in kafka_fields {
            if !(spec.kind == SourceKind::File && file_fields.contains(&field)) {
                not_for(field, set)?;
            }
        }
        let json_values = matches!(
            spec.format,
            Some(RecordFormatName::Json | RecordFormatName::Avro | RecordFormatName::Protobuf)
        );
        if let Some(Timestamp::Named(name)) = &spec.timestamp
            && !json_values
        {
            bail!(
                "`timestamp = {{ field = {name:?} }}` names a field of JSON values: a kafka \
                 or file source with `format = \"json\"`, \"avro\" or \"protobuf\" (a field of text lines \
                 is `{{ field = N, separator = \",\" }}`)"
            );
        }
        if json_values && let Some(Timestamp::Field(_)) = &spec.timestamp {
            bail!(
                "`timestamp = {{ field = N }}` splits a line of text; with `format = {:?}` name \
                 the field (`timestamp = {{ field = \"ts\" }}`)",
                spec.format.map_or("bytes", RecordFormatName::name)
            );
        }
        if spec.timestamp == Some(Timestamp::Record) {
            bail!("`timestamp = \"record\"` needs records that carry a timestamp: a kafka source");
        }
    }
    let name = spec.name.clone().unwrap_or(default_name);
    let input = match spec.kind {
        SourceKind::Kafka => {
            for (field, set) in generator_fields {
                if field != "parallelism" {
                    not_for(field, set)?;
                }
            }
            not_for("path", spec.path.is_some())?;
            SourceInput::Kafka(kafka_source(spec, job, &name, resolve)?)
        }
        SourceKind::File | SourceKind::Stdin => {
            for (field, set) in generator_fields {
                not_for(field, set)?;
            }
            match (spec.kind, &spec.path) {
                (SourceKind::File, Some(p)) => SourceInput::File {
                    path: resolve(p),
                    format: Box::new(file_format(spec, resolve)?),
                },
                (SourceKind::File, None) => bail!("a file source needs a `path`"),
                (_, p) => {
                    not_for("path", p.is_some())?;
                    SourceInput::Stdin
                }
            }
        }
        SourceKind::Generator => {
            not_for("path", spec.path.is_some())?;
            let records = spec
                .records
                .ok_or_else(|| anyhow!("a generator source needs `records`"))?;
            in_range("records", records, &limits::RECORDS)?;
            let shape = match spec.shape {
                None | Some(GeneratorShapeName::Words) => {
                    not_for("keys", spec.keys.is_some())?;
                    not_for("step_ms", spec.step_ms.is_some())?;
                    not_for("jitter_ms", spec.jitter_ms.is_some())?;
                    GeneratorShape::Words {
                        words_per_record: limits::WORDS_PER_RECORD
                            .resolve(spec.words_per_record)?,
                        vocabulary: limits::VOCABULARY.resolve(spec.vocabulary)?,
                    }
                }
                Some(GeneratorShapeName::Events) => {
                    not_for("words_per_record", spec.words_per_record.is_some())?;
                    not_for("vocabulary", spec.vocabulary.is_some())?;
                    GeneratorShape::Events {
                        keys: limits::KEYS.resolve(spec.keys)?,
                        step_ms: limits::STEP_MS.resolve(spec.step_ms.map(signed))?,
                        jitter_ms: limits::JITTER_MS.resolve(spec.jitter_ms.map(signed))?,
                    }
                }
            };
            if let Some(rate) = spec.rate {
                in_range("rate", rate, &limits::RATE)?;
            }
            SourceInput::Generator {
                records,
                shape,
                seed: spec.seed.unwrap_or(0),
                rate: spec.rate,
            }
        }
    };
    let out_of_orderness_ms = spec.out_of_orderness_ms.map(|m| m.0);
    let idle_timeout_ms = spec.idle_timeout_ms.map(|m| m.0);
    let event_time = spec.timestamp.as_ref().map(|t| {
        let (field, separator, json_field) = match t {
            Timestamp::Record => (None, ",".to_string(), None),
            Timestamp::Field(f) => (Some(f.field), f.separator.clone(), None),
            Timestamp::Named(name) => (None, ",".to_string(), Some(name.clone())),
        };
        EventTime {
            field,
            separator,
            json_field,
            out_of_orderness_ms: out_of_orderness_ms.unwrap_or(0) as i64,
        }
    });
    if event_time.is_none() && out_of_orderness_ms.is_some() {
        bail!("`out_of_orderness_ms` needs `timestamp`");
    }
    if let Some(ms) = out_of_orderness_ms {
        in_range("out_of_orderness_ms", ms, &limits::OUT_OF_ORDERNESS_MS)?;
    }
    if let Some(ms) = idle_timeout_ms {
        in_range("idle_timeout_ms", ms, &limits::IDLE_TIMEOUT_MS)?;
    }
    Ok(SourceVertex {
        id: spec.id.clone().unwrap_or_else(|| name.clone()),
        name,
        input,
        parallelism: spec.parallelism.unwrap_or(1),
        event_time,
        idle_timeout: idle_timeout_ms.map(Duration::from_millis),
    })
}

pub(super) fn sink_kind_name(kind: SinkKind) -> &'static str {
    match kind {
        SinkKind::File => "file",
        SinkKind::Stdout => "stdout",
        SinkKind::Kafka => "kafka",
    }
}

/// What a sink needs to know of the job's checkpoints.
pub(super) struct Checkpoints<'a> {
    /// Their folder.
    pub(super) dir: &'a Path,
    /// How long one may take before it is aborted.
    pub(super) timeout_ms: u64,
}

/// What a file sink writes other than lines: with `format = "avro"` an Avro object
/// container file (its `schema`, required, and `codec`), with `"protobuf"` length-delimited
/// messages (its `schema`, required, and `message`). `None` for every other sink, which
/// may not set `codec`.
pub(super) fn file_sink_format(
    sink: &SinkSpec,
    resolve: &dyn Fn(&Path) -> PathBuf,
) -> Result<Option<FileOutput>> {
    let format = match (sink.kind, sink.format) {
        (SinkKind::File, Some(SinkFormatName::Avro)) => Format::Avro,
        (SinkKind::File, Some(SinkFormatName::Protobuf)) => Format::Protobuf,
        _ => Format::Bytes,
    };
    if format != Format::Avro && sink.codec.is_some() {
        bail!(
            "`codec` applies to a file sink with `format = \"avro\"` only (the \
             compression of its Avro blocks)"
        );
    }
    let Some(schema) = sink.schema.as_ref() else {
        return match format {
            Format::Avro => bail!(
                "`format = \"avro\"` needs `schema`: the .avsc file of the records the sink \
                 writes (operators emit each as JSON)"
            ),
            Format::Protobuf => bail!(
                "`format = \"protobuf\"` needs `schema`: the .proto file of the messages the \
                 sink writes (operators emit each as JSON; `message` names the one written, \
                 default the file's first)"
            ),
            _ => Ok(None),
        };
    };
    if format == Format::Bytes {
        return Ok(None);
    }
    let message = sink.message.as_deref();
    let schema = format_config(format, None, Some(schema), message, None, resolve)?
        .schema
        .expect("an Avro or Protobuf format has its schema");
    Ok(Some(match format {
        Format::Avro => FileOutput::Avro {
            schema: formats::avro::with_references(&schema)?,
            codec: sink.codec.unwrap_or(AvroCodecName::Null),
        },
        _ => FileOutput::Protobuf {
            schema,
            message: message.map(str::to_string),
        },
    }))
}

/// The `kafka` fields of the `[sink]` table (`None` for other sinks, which may not set
/// them); `checkpoints`: the job's checkpoints, if it checkpoints.
pub(super) fn kafka_sink(
    sink: &SinkSpec,
    job: &str,
    id: &str,
    checkpoints: Option<Checkpoints<'_>>,
    resolve: &dyn Fn(&Path) -> PathBuf,
) -> Result<Option<KafkaSinkConfig>> {
    let fields = [
        ("bootstrap", sink.bootstrap.is_some()),
        ("topic", sink.topic.is_some()),
        ("delivery", sink.delivery.is_some()),
        (
            "transactional_id_prefix",
            sink.transactional_id_prefix.is_some(),
        ),
        ("max_pending_mb", sink.max_pending_mb.is_some()),
        ("partitioner", sink.partitioner.is_some()),
        ("properties", sink.properties.is_some()),
        ("schema_registry", sink.schema_registry.is_some()),
        ("schema", sink.schema.is_some()),
        ("message", sink.message.is_some()),
        ("key_format", sink.key_format.is_some()),
        ("key_schema", sink.key_schema.is_some()),
    ];
    if sink.kind != SinkKind::Kafka {
        // (An Avro or Protobuf file sink's `schema` and `message` are read by
        // `file_sink_format`.)
        let encoded_file = sink.kind == SinkKind::File
            && matches!(
                sink.format,
                Some(SinkFormatName::Avro | SinkFormatName::Protobuf)
            );
        if let Some((field, _)) = fields
            .iter()
            .find(|(field, set)| *set && !(encoded_file && matches!(*field, "schema" | "message")))
        {
            bail!(
                "`{field}` does not apply to a {} sink",
                sink_kind_name(sink.kind)
            );
        }
        return Ok(None);
    }
    let format = match sink.format {
        None | Some(SinkFormatName::Bytes) => Format::Bytes,
        Some(SinkFormatName::Json) => Format::Json,
        Some(SinkFormatName::Avro) => Format::Avro,
        Some(SinkFormatName::Protobuf) => Format::Protobuf,
        Some(other @ (SinkFormatName::Value | SinkFormatName::KeyValue)) => bail!(
            "a kafka sink's `format` is \"bytes\", \"json\", \"avro\" or \"protobuf\", not \
             {:?} (records keep their key and value)",
            other.name()
        ),
    };
    let mut format = format_config(
        format,
        sink.schema_registry.as_ref(),
        sink.schema.as_ref(),
        sink.message.as_deref(),
        None,
        resolve,
    )?;
    format.key = key_format(
        sink.key_format,
        sink.schema_registry.as_ref(),
        sink.key_schema.as_ref(),
        None,
        resolve,
    )?;
    let bootstrap = sink
        .bootstrap
        .clone()
        .filter(|b| !b.trim().is_empty())
        .ok_or_else(|| anyhow!("a kafka sink needs `bootstrap` (the brokers, host:port)"))?;
    let topic = sink
        .topic
        .clone()
        .filter(|t| !t.is_empty())
        .ok_or_else(|| anyhow!("a kafka sink needs `topic`"))?;
    let delivery = match sink.delivery {
        None if checkpoints.is_some() => Delivery::ExactlyOnce,
        None | Some(DeliveryName::AtLeastOnce) => Delivery::AtLeastOnce,
        Some(DeliveryName::ExactlyOnce) if checkpoints.is_some() => Delivery::ExactlyOnce,
        Some(DeliveryName::ExactlyOnce) => bail!(
            "`delivery = \"exactly-once\"` needs `[checkpoint]`: records are written when \
             the checkpoint that covers them completes"
        ),
    };
    let properties = secrets::resolved(&sink.properties.clone().unwrap_or_default(), resolve)?;
    if let (Delivery::ExactlyOnce, Some(checkpoints)) = (delivery, &checkpoints) {
        // A checkpoint's transaction is open from its barrier until it completes.
        let transaction_ms = properties
            .get("transaction.timeout.ms")
            .map(String::as_str)
            .unwrap_or(TRANSACTION_TIMEOUT_MS);
        let transaction_ms: u64 = transaction_ms.parse().map_err(|_| {
            anyhow!(
                "`transaction.timeout.ms` in `properties` is {transaction_ms:?}, not milliseconds"
            )
        })?;
        if transaction_ms <= checkpoints.timeout_ms {
            bail!(
                "its transactions time out after {transaction_ms} ms (`transaction.timeout.ms`), \
                 not later than a checkpoint may take ({} ms, `[checkpoint] timeout_ms`): a \
                 checkpoint's transaction stays open until the checkpoint completes, so the \
                 brokers would abort it; raise `transaction.timeout.ms` in the sink's \
                 `properties` (up to the brokers' `transaction.max.timeout.ms`, 15 minutes by \
                 default) or lower `[checkpoint] timeout_ms`",
                checkpoints.timeout_ms
            );
        }
    }
    let max_pending_mb = limits::MAX_PENDING_MB.resolve(sink.max_pending_mb.map(|m| m.units()))?;
    let by_record_partition = sink.partitioner == Some(SinkPartitioner::Record);
    Ok(Some(KafkaSinkConfig {
        by_record_partition,
        bootstrap,
        topic,
        delivery,
        transactional_id_prefix: match (&sink.transactional_id_prefix, &checkpoints) {
            (Some(prefix), _) => prefix.clone(),
            (None, Some(c)) => default_transactional_id_prefix(job, id, c.dir),
            // (Unused: without checkpoints the sink has no transactions.)
            (None, None) => format!("sluice-{job}-{id}"),
        },
        default_prefix: sink.transactional_id_prefix.is_none(),
        max_pending_bytes: max_pending_mb << 20,
        properties,
        format,
        exchange: None,
        marker_note: None,
        expect_marker: None,
    }))
}

/// The default transactional id prefix of sink `id` of job `job` checkpointing into
/// `dir`: `sluice-JOB-SINK-HASH`, where HASH is 16 hex digits of the SHA-256 of the
/// folder's canonical path. Job names are not unique (two copies of a job in two folders
/// are common), and two jobs with one prefix fence each other's producers and read each
/// other's markers as their own; a checkpoint folder belongs to one job at a time (a run
/// holds its lock). A restored sink keeps the prefix of its checkpoint, though (see
/// [`KafkaSinkConfig::default_prefix`]).
fn default_transactional_id_prefix(job: &str, id: &str, dir: &Path) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(canonical(dir).as_os_str().as_encoded_bytes());
    let hash: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("sluice-{job}-{id}-{hash}")
}

/// `path` made absolute and canonical as far as it exists (a checkpoint folder is made
/// when the job first runs): its nearest existing ancestor canonical, the rest joined
/// as written.
fn canonical(path: &Path) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut existing = absolute.as_path();
    let mut rest = Vec::new();
    loop {
        if let Ok(real) = existing.canonicalize() {
            return rest.iter().rev().fold(real, |p, c| p.join(c));
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                existing = parent;
            }
            _ => return absolute,
        }
    }
}

/// The `kafka` fields of a `[source]` table.
fn kafka_source(
    spec: &SourceSpec,
    job: &str,
    name: &str,
    resolve: &dyn Fn(&Path) -> PathBuf,
) -> Result<KafkaSourceConfig> {
    let bootstrap = spec
        .bootstrap
        .clone()
        .filter(|b| !b.trim().is_empty())
        .ok_or_else(|| anyhow!("a kafka source needs `bootstrap` (the brokers, host:port)"))?;
    let topics = match &spec.topics {
        Some(TopicsSpec::Names(names)) => Topics::Names(names.clone()),
        Some(TopicsSpec::Pattern(p)) => {
            kafka::topic_pattern(p)?;
            Topics::Pattern(p.clone())
        }
        None => bail!("a kafka source needs `topics`"),
    };
    let start = match spec.start {
        None | Some(StartSpec::Earliest) => StartFrom::Earliest,
        Some(StartSpec::Latest) => StartFrom::Latest,
        Some(StartSpec::Committed) => StartFrom::Committed,
        Some(StartSpec::Timestamp(ms)) => StartFrom::Timestamp(ms),
    };
    let on_out_of_range = match spec.on_out_of_range {
        None | Some(OutOfRangeName::Fail) => OutOfRange::Fail,
        Some(OutOfRangeName::Earliest) => OutOfRange::Earliest,
        Some(OutOfRangeName::Latest) => OutOfRange::Latest,
    };
    let properties = secrets::resolved(&spec.properties.clone().unwrap_or_default(), resolve)?;
    if properties.contains_key("auto.offset.reset") {
        bail!(
            "`properties` may not set \"auto.offset.reset\": `on_out_of_range` says what the \
             source does when an offset is no longer in the log"
        );
    }
    let format = match spec.format {
        None | Some(RecordFormatName::Bytes) => Format::Bytes,
        Some(RecordFormatName::Json) => Format::Json,
        Some(RecordFormatName::Avro) => Format::Avro,
        Some(RecordFormatName::Protobuf) => Format::Protobuf,
    };
    let mut format = format_config(
        format,
        spec.schema_registry.as_ref(),
        spec.schema.as_ref(),
        spec.message.as_deref(),
        spec.on_bad_record.clone(),
        resolve,
    )?;
    format.key = key_format(
        spec.key_format,
        spec.schema_registry.as_ref(),
        spec.key_schema.as_ref(),
        spec.on_bad_record.clone(),
        resolve,
    )?;
    if let OnBadRecord::DeadLetter(topic) = &format.on_bad_record {
        if topic.len() > 249 || !topic.chars().all(crate::cluster::plan::is_topic_char) {
            bail!(
                "`on_bad_record = {{ dead_letter = {topic:?} }}`: not a Kafka topic name \
                 (letters, digits, '.', '_' and '-', at most 249)"
            );
        }
        let read = match &topics {
            Topics::Names(names) => names.contains(topic),
            Topics::Pattern(pattern) => kafka::topic_pattern(pattern)?.is_match(topic),
        };
        if read {
            bail!(
                "`on_bad_record = {{ dead_letter = {topic:?} }}`: the source reads that topic \
                 itself, and would read its bad records again"
            );
        }
    }
    if format.format == Format::Bytes
        && let Some(Timestamp::Named(name)) = &spec.timestamp
    {
        bail!(
            "`timestamp = {{ field = {name:?} }}` names a field of JSON values: it needs \
             `format = \"json\"` or \"avro\" (a field of text lines is `{{ field = N, \
             separator = \",\" }}`)"
        );
    }
    if format.format != Format::Bytes
        && let Some(Timestamp::Field(_)) = &spec.timestamp
    {
        bail!(
            "`timestamp = {{ field = N }}` splits the value as text; with `format = {:?}` name \
             the field (`timestamp = {{ field = \"ts\" }}`) or take the record's timestamp \
             (`timestamp = \"record\"`)",
            spec.format.map_or("bytes", RecordFormatName::name)
        );
    }
    let discovery_ms = limits::DISCOVERY_MS.resolve(spec.discovery_ms.map(|m| m.0))?;
    Ok(KafkaSourceConfig {
        bootstrap,
        topics,
        allowed: None,
        start,
        on_out_of_range,
        group: spec
            .group
            .clone()
            .unwrap_or_else(|| format!("sluice-{job}-{name}")),
        discovery: Duration::from_millis(discovery_ms),
        properties,
        bounded: spec.bounded.unwrap_or(false),
        split: None,
        exchange_producers: None,
        format: Box::new(format),
    })
}

/// The `format`, `schema`, `message` and `on_bad_record` of a file source: lines as
/// they are (`bytes`), JSON lines, an Avro object container file (its schema in it;
/// `schema` the job's to read it with), or length-delimited Protobuf messages.
fn file_format(spec: &SourceSpec, resolve: &dyn Fn(&Path) -> PathBuf) -> Result<FormatConfig> {
    let format = match spec.format {
        None | Some(RecordFormatName::Bytes) => Format::Bytes,
        Some(RecordFormatName::Json) => Format::Json,
        Some(RecordFormatName::Avro) => Format::Avro,
        Some(RecordFormatName::Protobuf) => Format::Protobuf,
    };
    if format != Format::Protobuf && spec.message.is_some() {
        bail!("`message` (a Protobuf message) needs `format = \"protobuf\"`");
    }
    if format == Format::Protobuf && spec.schema.is_none() {
        bail!(
            "a file of Protobuf messages needs `schema`: the .proto file of its messages \
             (`message` names the one read; default the file's first)"
        );
    }
    match &spec.on_bad_record {
        Some(OnBadRecordName::DeadLetter(_)) => bail!(
            "`on_bad_record = {{ dead_letter = … }}` writes to a Kafka topic of a kafka \
             source's cluster; a file source takes \"fail\" or \"skip\""
        ),
        Some(_) if format == Format::Avro => bail!(
            "`on_bad_record` does not apply to an Avro file: a damaged block fails the job \
             (the file cannot be read past it)"
        ),
        _ => {}
    }
    if format == Format::Avro && spec.schema.is_none() {
        // The file's own schema reads it.
        return Ok(FormatConfig {
            format,
            ..FormatConfig::bytes()
        });
    }
    format_config(
        format,
        None,
        spec.schema.as_ref(),
        spec.message.as_deref(),
        spec.on_bad_record.clone(),
        resolve,
    )
}

/// The keys' format of a Kafka source or sink (`key_format`, `key_schema`, with the
/// values' registry and `on_bad_record`); `None`: bytes.
fn key_format(
    format: Option<RecordFormatName>,
    registry: Option<&SchemaRegistrySpec>,
    schema: Option<&SchemaSpec>,
    on_bad_record: Option<OnBadRecordName>,
    resolve: &dyn Fn(&Path) -> PathBuf,
) -> Result<Option<Box<FormatConfig>>> {
    let format = match format {
        None | Some(RecordFormatName::Bytes) => {
            if schema.is_some() {
                bail!("`key_schema` needs `key_format = \"avro\"` or \"protobuf\"");
            }
            return Ok(None);
        }
        Some(RecordFormatName::Json) => Format::Json,
        Some(RecordFormatName::Avro) => Format::Avro,
        Some(RecordFormatName::Protobuf) => Format::Protobuf,
    };
    if registry.is_none() && schema.is_none() && format != Format::Json {
        bail!(
            "`key_format = {:?}` needs `schema_registry` (keys in Confluent's wire format) or \
             `key_schema` (the schema of bare keys)",
            FormatConfig {
                format,
                ..FormatConfig::bytes()
            }
            .name()
        );
    }
    // JSON keys are plain JSON, checked, whatever the values are (a registry frames
    // Avro and Protobuf keys; JSON keys are mostly written without one).
    let registry = registry.filter(|_| format != Format::Json);
    let config = format_config(format, registry, schema, None, on_bad_record, resolve)
        .map_err(|e| anyhow!("the keys (`key_format`, `key_schema`): {e:#}"))?;
    Ok(Some(Box::new(FormatConfig {
        part: formats::Part::Key,
        ..config
    })))
}

/// The `format`, `schema_registry`, `schema`, `message` and `on_bad_record` of a Kafka
/// source or sink (a sink has no `on_bad_record`: what its operators emit must fit).
fn format_config(
    format: Format,
    registry: Option<&SchemaRegistrySpec>,
    schema: Option<&SchemaSpec>,
    message: Option<&str>,
    on_bad_record: Option<OnBadRecordName>,
    resolve: &dyn Fn(&Path) -> PathBuf,
) -> Result<FormatConfig> {
    let name = FormatConfig {
        format,
        ..FormatConfig::bytes()
    }
    .name();
    if format == Format::Bytes && registry.is_some() {
        bail!("`schema_registry` needs `format = \"avro\"`, \"protobuf\" or \"json\"");
    }
    if !matches!(format, Format::Avro | Format::Protobuf) && schema.is_some() {
        bail!(
            "`schema` (an Avro or .proto schema) needs `format = \"avro\"` or \"protobuf\", \
             not {name:?}"
        );
    }
    if format != Format::Protobuf && message.is_some() {
        bail!("`message` (a Protobuf message) needs `format = \"protobuf\"`, not {name:?}");
    }
    if format == Format::Bytes && on_bad_record.is_some() {
        bail!(
            "`on_bad_record` needs a `format` that can find a bad record (\"json\", \"avro\" \
             or \"protobuf\")"
        );
    }
    if registry.is_none() && schema.is_none() {
        match format {
            Format::Avro => bail!(
                "`format = \"avro\"` needs `schema_registry` (values in Confluent's wire \
                 format) or `schema` (the .avsc file of bare Avro values)"
            ),
            Format::Protobuf => bail!(
                "`format = \"protobuf\"` needs `schema_registry` (values in Confluent's wire \
                 format) or `schema` (the .proto file of bare messages)"
            ),
            Format::Bytes | Format::Json => {}
        }
    }
    let schema = schema
        .map(|spec| {
            // The schema, with a `.proto` file's imports, and where it is, for errors.
            let (schema, path) = match spec {
                SchemaSpec::File(path) => {
                    let path = resolve(path);
                    let text = std::fs::read_to_string(&path)
                        .map_err(|e| anyhow!("`schema`: reading {}: {e}", path.display()))?;
                    let schema = match format {
                        Format::Protobuf => {
                            let folder = path.parent().unwrap_or(Path::new("."));
                            formats::Proto::with_imports(text, folder)
                                .map(|(schema, proto)| (schema, Some(proto)))
                        }
                        _ => Ok((formats::SchemaText::plain(text), None)),
                    };
                    (schema, path.display().to_string())
                }
                SchemaSpec::Text { text, imports } => {
                    let schema = formats::SchemaText {
                        text: text.clone(),
                        references: imports.clone().into_iter().collect(),
                    };
                    (Ok((schema, None)), "the text in the job file".to_string())
                }
            };
            schema
                .and_then(|(schema, compiled)| {
                    match (format, compiled) {
                        (Format::Protobuf, Some(proto)) => drop(proto.message(message)?),
                        (Format::Protobuf, None) => {
                            formats::Proto::parse_with(&schema)?.message(message)?;
                        }
                        _ => {
                            formats::Compiled::parse(&formats::avro::with_references(&schema)?)?;
                        }
                    }
                    Ok(schema)
                })
                .map_err(|e| anyhow!("`schema`: {path}: {e:#}"))
        })
        .transpose()?;
    if let Some(message) = message
        && (message.is_empty() || message.split('.').any(|part| part.is_empty()))
    {
        bail!("`message` must be a message's full name (`package.Message`), not {message:?}");
    }
    let registry = registry.map(|r| registry_config(r, resolve)).transpose()?;
    Ok(FormatConfig {
        format,
        part: formats::Part::Value,
        key: None,
        registry,
        schema,
        message: message.map(str::to_string),
        on_bad_record: match on_bad_record {
            None | Some(OnBadRecordName::Fail) => OnBadRecord::Fail,
            Some(OnBadRecordName::Skip) => OnBadRecord::Skip,
            Some(OnBadRecordName::DeadLetter(topic)) => OnBadRecord::DeadLetter(topic),
        },
        register_imports: true,
    })
}

/// A `schema_registry` table of a job file (or of a tenant's Kafka grant), its
/// credentials resolved.
pub(crate) fn registry_config(
    spec: &SchemaRegistrySpec,
    resolve: &dyn Fn(&Path) -> PathBuf,
) -> Result<RegistryConfig> {
    let url = spec.url.trim().trim_end_matches('/').to_string();
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        bail!("`schema_registry.url` must be an http:// or https:// address, not {url:?}");
    }
    let mut auth = BTreeMap::new();
    if let Some(user) = &spec.username {
        auth.insert("username".to_string(), user.clone());
    }
    if let Some(password) = &spec.password {
        auth.insert("password".to_string(), password.clone());
    }
    let auth =
        secrets::resolved(&auth, resolve).map_err(|e| anyhow!("`schema_registry`: {e:#}"))?;
    let basic_auth = match (auth.get("username"), auth.get("password")) {
        (Some(user), Some(password)) => Some((user.clone(), password.clone())),
        (None, None) => None,
        _ => bail!("`schema_registry` needs both `username` and `password`, or neither"),
    };
    Ok(RegistryConfig { url, basic_auth })
}

/// A duration as the generator's signed event-time arithmetic takes it (past `i64::MAX`
/// milliseconds, which no range allows, the largest).
fn signed(ms: Millis) -> i64 {
    i64::try_from(ms.0).unwrap_or(i64::MAX)
}
