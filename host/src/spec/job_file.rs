//! The job file: what a user writes (TOML). Unknown fields are errors, every value is
//! typed (see `values`), and every number has an allowed range that validation checks
//! (`limits`: the ranges below). Durations (`*_ms`) also take a string with units under
//! the name without `_ms` (`interval = "10s"`), sizes (`*_mb`, `*_bytes`) likewise
//! (`max_pending = "64MiB"`).
//!
//! A source's or sink's fields are one table whatever its `type`: a field that does not
//! apply to the type is refused by validation with that said (`` `topics` does not apply
//! to a file source ``), which tells a user more than a list of the fields allowed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use schemars::JsonSchema;
use serde::Deserialize;

use super::values::{
    AvroCodecName, ByteSize, CheckpointMode, ConfigValue, DeliveryName, GeneratorShapeName,
    InputEntry, KeyBy, MiBSize, Millis, OnBadRecordName, OutOfRangeName, Partition,
    RecordFormatName, RestartStrategyName, SchemaSpec, SinkFormatName, SinkPartitioner, StartSpec,
    Timestamp, TopicsSpec,
};

/// A job file.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct JobFile {
    /// Job name.
    pub name: String,
    /// Tenant the job runs for; its limits apply to every operator.
    #[serde(default = "default_tenant")]
    pub tenant: String,
    /// Number of key groups (the most parallelism keyed state can be spread over; default
    /// 128, at most 32,768).
    pub max_parallelism: Option<u32>,
    /// Where records come from: `[source]`, or several `[[source]]`.
    #[serde(deserialize_with = "one_or_many")]
    #[schemars(schema_with = "one_or_many_schema::<SourceSpec>")]
    pub source: Vec<SourceSpec>,
    /// The operators, in order.
    #[serde(default, rename = "operator")]
    pub operators: Vec<OperatorSpec>,
    /// Where records go: `[sink]`, or several `[[sink]]`.
    #[serde(deserialize_with = "one_or_many")]
    #[schemars(schema_with = "one_or_many_schema::<SinkSpec>")]
    pub sink: Vec<SinkSpec>,
    /// Checkpointing; absent means no checkpoints.
    pub checkpoint: Option<CheckpointSpec>,
    /// Where keyed state is kept.
    pub state: Option<StateSpec>,
    /// What to do when the job fails.
    pub restart: Option<RestartSpec>,
    /// Batching and buffering.
    #[serde(default)]
    pub runtime: RuntimeSpec,
    /// Running on several hosts that share the job through Kafka (`sluice run
    /// --cluster`).
    pub cluster: Option<ClusterSpec>,
}

/// `[cluster]`: how the hosts of a job spread over several machines meet and where they
/// keep checkpoints.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClusterSpec {
    /// The Kafka brokers the hosts meet at (`--cluster` overrides it).
    pub bootstrap: Option<String>,
    /// Where every host reads and writes the units' checkpoints: a directory, or
    /// `file://`, `s3://`, `gs://` or `az://` (the last three in builds with the
    /// `s3`, `gcs` or `azure` feature).
    pub checkpoints: Option<String>,
    /// Partitions of each exchange topic: the key groups, so the units, of each stage
    /// after the first (default 8).
    pub exchange_partitions: Option<u32>,
    /// How long a silent host keeps its units (Kafka's `session.timeout.ms`, default
    /// 10,000).
    #[serde(alias = "session_timeout")]
    pub session_timeout_ms: Option<Millis>,
    /// Where this host keeps its units' local checkpoints (default: next to the job
    /// file, `NAME.cluster-work`).
    pub work_dir: Option<PathBuf>,
    /// Further librdkafka properties of the hosts' clients (SASL, TLS).
    pub properties: Option<BTreeMap<String, String>>,
}

fn default_tenant() -> String {
    "default".into()
}

fn one() -> u32 {
    1
}

/// A source of a job: `[source]`, or one `[[source]]` table per source (read by the
/// operators that name them in `inputs`; without any, united at the first operator).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SourceSpec {
    /// `file`, `generator`, `stdin` or `kafka`.
    #[serde(rename = "type")]
    pub kind: SourceKind,
    /// Name in metrics and task names (default `source`, or `source-N` with several).
    pub name: Option<String>,
    /// Stable id under which checkpoints keep the source's positions (default: the
    /// name). Keep it when renaming the source, so a savepoint still restores it.
    pub id: Option<String>,
    /// `file`: the text file, one record per line, relative to the job file.
    pub path: Option<PathBuf>,
    /// `generator`: records in total, over all subtasks (at most 10^12).
    pub records: Option<u64>,
    /// `generator`: `words` (default: lines of pseudo-words) or `events` (lines
    /// `timestamp,key,value`).
    pub shape: Option<GeneratorShapeName>,
    /// `generator`, `words`: words per line (default 8, at most 1024).
    pub words_per_record: Option<usize>,
    /// `generator`, `words`: distinct words (default 1000, 1 to 10^9).
    pub vocabulary: Option<u64>,
    /// `generator`, `events`: distinct keys (default 1000, 1 to 10^9).
    pub keys: Option<u64>,
    /// `generator`, `events`: event time between consecutive records (default 10 ms, at
    /// most an hour).
    #[serde(alias = "step")]
    pub step_ms: Option<Millis>,
    /// `generator`, `events`: up to this much earlier than in order (default 0, at most a
    /// day).
    #[serde(alias = "jitter")]
    pub jitter_ms: Option<Millis>,
    /// `generator`: seed (default 0).
    pub seed: Option<u64>,
    /// `generator`: records per second per subtask (default: as fast as possible; 0.001 to
    /// 10^9).
    pub rate: Option<f64>,
    /// `generator` and `kafka`: parallel subtasks (default 1, at most 1024; file and stdin
    /// sources have one).
    pub parallelism: Option<u32>,
    /// `kafka`: the brokers, `host:port[,host:port...]`.
    pub bootstrap: Option<String>,
    /// `kafka`: the topic, or a list of topics, to read.
    pub topics: Option<TopicsSpec>,
    /// `kafka`: where to start in partitions a checkpoint does not name: `earliest`
    /// (default), `latest`, `committed` (the group's offsets) or `{ timestamp_ms = N }`.
    pub start: Option<StartSpec>,
    /// `kafka`: what the source does when the offset it is to read next is no longer in
    /// its partition (retention deleted the records, or the topic was made anew, while
    /// the job was stopped or behind): `fail` (default: the source fails, naming the
    /// topic, the partition, the offset and what the partition holds, and the job is not
    /// restarted), `earliest` (it goes on from the partition's first offset, skipping
    /// what was deleted) or `latest` (from its end). Kafka's `auto.offset.reset`.
    pub on_out_of_range: Option<OutOfRangeName>,
    /// `kafka`: the consumer group offsets are committed to on each completed checkpoint,
    /// for monitoring (default `sluice-JOB-SOURCE`).
    pub group: Option<String>,
    /// `kafka`: how often to look for new partitions (default 10 s, 100 ms to a day).
    #[serde(alias = "discovery")]
    pub discovery_ms: Option<Millis>,
    /// `kafka`: further librdkafka consumer properties, as strings.
    pub properties: Option<BTreeMap<String, String>>,
    /// `kafka`: read each partition only up to its end when the job first starts, then
    /// end (default false: read forever).
    pub bounded: Option<bool>,
    /// `kafka`: what the records' values are: `bytes` (default: operators get them as
    /// they are), `json` (checked to be JSON), `avro` or `protobuf` (decoded into JSON
    /// for the operators: with `schema_registry`, in Confluent's wire format; without,
    /// bare datums or messages of `schema`). `file`: `bytes` (lines), `json` (JSON
    /// lines), `avro` (an Avro object container file) or `protobuf` (length-delimited
    /// messages of `schema`).
    pub format: Option<RecordFormatName>,
    /// `kafka`, `json`, `avro` or `protobuf`: the schema registry (Confluent's REST API)
    /// the values' schema ids are looked up in.
    pub schema_registry: Option<SchemaRegistrySpec>,
    /// `avro` or `protobuf`: the schema the job reads with (a `.avsc` or `.proto` file,
    /// relative to the job file): values written with an older compatible schema are
    /// read with it. Default with a registry: the latest schema of subject `TOPIC-value`
    /// when the source starts.
    pub schema: Option<SchemaSpec>,
    /// `protobuf`: the message read (its full name, `package.Message`). Default: with a
    /// registry the one each value's message indexes name, without one the schema's
    /// first.
    pub message: Option<String>,
    /// `kafka`: what the records' keys are, as `format` says of the values (default
    /// `bytes`); with a registry their schemas are subject `TOPIC-key`'s.
    pub key_format: Option<RecordFormatName>,
    /// `kafka`, `key_format` `avro` or `protobuf`: the keys' schema (a `.avsc` or
    /// `.proto` file; default with a registry: the latest of subject `TOPIC-key`).
    pub key_schema: Option<SchemaSpec>,
    /// What the source does with a record its `format` cannot decode (not JSON, a wrong
    /// magic byte, a schema id the registry does not know, a malformed datum): `fail`
    /// (default: the job fails, naming the record) or `skip` (left out, counted in the
    /// source's `bad-records` counter).
    pub on_bad_record: Option<OnBadRecordName>,
    /// Where a record's event time (milliseconds) is: `{ field = N, separator = "," }`,
    /// or `"record"` for the timestamp a Kafka record carries.
    pub timestamp: Option<Timestamp>,
    /// Bounded out-of-orderness of event time: watermark = max timestamp − this − 1 (at
    /// most a week).
    #[serde(alias = "out_of_orderness")]
    pub out_of_orderness_ms: Option<Millis>,
    /// After this long without records the source is idle: downstream tasks leave it out
    /// of their watermark until it sends records again (at most a day).
    #[serde(alias = "idle_timeout")]
    pub idle_timeout_ms: Option<Millis>,
}

/// Kinds of sources.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum SourceKind {
    /// A text file.
    File,
    /// Generated records.
    Generator,
    /// Standard input.
    Stdin,
    /// Kafka topics.
    Kafka,
}

/// Accepts one table or an array of tables. Each is read where it stands (not through
/// an intermediate value), so a mistake in one keeps its line and its path.
fn one_or_many<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};

    struct OneOrMany<T>(std::marker::PhantomData<T>);

    impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for OneOrMany<T> {
        type Value = Vec<T>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a table or an array of tables")
        }

        fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Vec<T>, A::Error> {
            T::deserialize(MapAccessDeserializer::new(map)).map(|t| vec![t])
        }

        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<Vec<T>, A::Error> {
            Vec::<T>::deserialize(SeqAccessDeserializer::new(seq))
        }
    }

    d.deserialize_any(OneOrMany(std::marker::PhantomData))
}

/// The schema of a field [`one_or_many`] reads: one table or an array of them.
fn one_or_many_schema<T: JsonSchema>(
    generator: &mut schemars::SchemaGenerator,
) -> schemars::Schema {
    let one = generator.subschema_for::<T>();
    let many = generator.subschema_for::<Vec<T>>();
    schemars::json_schema!({ "anyOf": [one, many] })
}

/// One operator.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OperatorSpec {
    /// Name, unique in the job.
    pub name: String,
    /// Stable id under which checkpoints keep the operator's state (default: the name).
    /// Keep it when renaming the operator, so a savepoint still restores it.
    pub id: Option<String>,
    /// The `.wasm` component, relative to the job file.
    pub plugin: PathBuf,
    /// Configuration passed to `open` as strings.
    #[serde(default)]
    pub config: BTreeMap<String, ConfigValue>,
    /// Parallel subtasks (default 1, at most 1024).
    #[serde(default = "one")]
    pub parallelism: u32,
    /// Partition the input by key: `"key"` (the record's key), `"value"`, or
    /// `{ field = N, separator = "," }`. Makes keyed state and timers available.
    pub key_by: Option<KeyBy>,
    /// How the input is spread when not keyed: `forward`, `rebalance` or `broadcast`.
    pub partition: Option<Partition>,
    /// What the operator reads, each entry one input (numbered from 0 in this order): the
    /// name of a source or operator (its main output), `NAME.side:OUTPUT` (a side output
    /// operator NAME declared), or a table `{ from = "NAME", key_by = ..., partition =
    /// ..., broadcast = true }` that partitions this input its own way. Default: the
    /// operator before it in the file; the first operator reads all sources (their union,
    /// one input).
    pub inputs: Option<Vec<InputEntry>>,
    /// Over several hosts (`sluice run --cluster`), begin a new stage here even though the
    /// input is not keyed: the records before it cross an exchange topic, spread evenly
    /// over its partitions (a keyed input always does). Changes nothing on one host.
    #[serde(default)]
    pub repartition: bool,
}

/// The sink of a job.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SinkSpec {
    /// `file`, `stdout` or `kafka`.
    #[serde(rename = "type")]
    pub kind: SinkKind,
    /// Name, unique in the job (default `sink`, or `sink-N` with several).
    pub name: Option<String>,
    /// Stable id under which checkpoints keep the sink's state (default: the name).
    pub id: Option<String>,
    /// What the sink writes, as an operator's `inputs` (default: the last operator).
    pub inputs: Option<Vec<InputEntry>>,
    /// Output file for `file` sinks, relative to the job file.
    pub path: Option<PathBuf>,
    /// `file` and `stdout`: `value` (default), `key-value` (key, tab, value) or `json`
    /// (values checked to be JSON, one a line); `file` also `avro` (an Avro object
    /// container file of `schema`) or `protobuf` (length-delimited messages of
    /// `schema`), encoded from the JSON operators emit. `kafka`:
    /// `bytes` (default: values as operators emit them), `json` (checked to be JSON),
    /// `avro` or `protobuf` (encoded from the JSON operators emit, with `schema` or the
    /// registry's).
    pub format: Option<SinkFormatName>,
    /// `kafka`, `avro` or `protobuf`: the schema registry (Confluent's REST API) the
    /// sink's schema is registered in, under subject `TOPIC-value`; values are written in
    /// its wire format.
    pub schema_registry: Option<SchemaRegistrySpec>,
    /// `kafka`, `avro` or `protobuf`: the schema written (a `.avsc` or `.proto` file,
    /// relative to the job file). Default with a registry: the latest of subject
    /// `TOPIC-value`. `file`, `avro` or `protobuf`: the `.avsc` or `.proto` file of what
    /// it writes (required).
    pub schema: Option<SchemaSpec>,
    /// `kafka` and `file`, `protobuf`: the message written (its full name,
    /// `package.Message`; default: the schema's first).
    pub message: Option<String>,
    /// `file`, `avro`: how the container file's blocks are compressed: `null` (default),
    /// `deflate` or `snappy`.
    pub codec: Option<AvroCodecName>,
    /// `kafka`: what the keys written are, as `format` says of the values (default
    /// `bytes`); with a registry their schema is registered under `TOPIC-key`.
    pub key_format: Option<RecordFormatName>,
    /// `kafka`, `key_format` `avro` or `protobuf`: the keys' schema (a `.avsc` or
    /// `.proto` file; default with a registry: the latest of subject `TOPIC-key`).
    pub key_schema: Option<SchemaSpec>,
    /// Parallel subtasks (default 1, at most 1024; a file sink then writes one file per
    /// subtask).
    #[serde(default = "one")]
    pub parallelism: u32,
    /// How the input is spread: `forward`, `rebalance` or `broadcast`.
    pub partition: Option<Partition>,
    /// `kafka`: the brokers, `host:port[,host:port...]`.
    pub bootstrap: Option<String>,
    /// `kafka`: the topic written.
    pub topic: Option<String>,
    /// `kafka`: `exactly-once` (the default with checkpoints: each checkpoint's records
    /// in one transaction once it completes) or `at-least-once` (the default without).
    pub delivery: Option<DeliveryName>,
    /// `kafka`, exactly once: prefix of the transactional ids; subtask N uses
    /// `PREFIX-N`. Unique per job writing to a cluster. Default `sluice-JOB-SINK-HASH`,
    /// HASH from the checkpoint folder's path, so that jobs of one name in two folders
    /// differ; a restored job keeps the default its checkpoint was written with.
    pub transactional_id_prefix: Option<String>,
    /// `kafka`, exactly once: most MiB of records a subtask holds for checkpoints not
    /// yet complete (default 256, 1 to 65536).
    #[serde(alias = "max_pending")]
    pub max_pending_mb: Option<MiBSize>,
    /// `kafka`: which partition a record goes to: `key` (the default: the murmur2 hash
    /// of its key, as Kafka's Java clients; keyless records spread) or `record` (the
    /// partition it was read from, for topic-to-topic jobs that keep partitioning).
    pub partitioner: Option<SinkPartitioner>,
    /// `kafka`: further librdkafka producer properties, as strings.
    pub properties: Option<BTreeMap<String, String>>,
}

/// A schema registry speaking Confluent's REST API (Confluent Schema Registry,
/// Apicurio Registry's `…/apis/ccompat/v7`, Redpanda, Karapace).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SchemaRegistrySpec {
    /// The registry's address, e.g. `http://registry:8081`.
    pub url: String,
    /// HTTP basic authentication: the user (may be `"${env:NAME}"` or `"${file:PATH}"`).
    pub username: Option<String>,
    /// HTTP basic authentication: the password (may be `"${env:NAME}"` or
    /// `"${file:PATH}"`, so it need not be written in the file).
    pub password: Option<String>,
}

/// Kinds of sinks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum SinkKind {
    /// A file, exactly once with checkpoints.
    File,
    /// Standard output.
    Stdout,
    /// A Kafka topic.
    Kafka,
}

/// The `[checkpoint]` table.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckpointSpec {
    /// Milliseconds between checkpoints (10 to a day); 0 takes only savepoints.
    #[serde(alias = "interval")]
    pub interval_ms: Millis,
    /// Directory, relative to the job file (default `checkpoints/<job name>`).
    pub dir: Option<PathBuf>,
    /// `exactly-once` (default) or `at-least-once`.
    pub mode: Option<CheckpointMode>,
    /// Abort a checkpoint not complete after this long (default 10 minutes, at most a day).
    #[serde(alias = "timeout")]
    pub timeout_ms: Option<Millis>,
    /// Least pause between checkpoints (default 0, at most a day).
    #[serde(alias = "min_pause")]
    pub min_pause_ms: Option<Millis>,
    /// Most checkpoints in flight (default 1, at most 16).
    pub max_concurrent: Option<usize>,
    /// Complete checkpoints to keep (default 3, at most 100).
    pub retain: Option<usize>,
}

/// The `[state]` table.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StateSpec {
    /// `heap` (in memory, for small and hot state) or `rocksdb` (on local disk, for state
    /// larger than memory, with incremental checkpoints); default: the host's
    /// `state_backend`, else `heap`.
    pub backend: Option<crate::state::BackendKind>,
    /// `rocksdb`: memory per operator instance for its block cache and write buffers,
    /// MiB (default 64, at least 8); counted against the instance's `state_mb`.
    pub memory_mb: Option<u64>,
    /// `rocksdb`, a job without checkpoints: the folder its databases are kept in while
    /// it runs (default: the system's temporary folder). A job that checkpoints keeps
    /// them in its checkpoint folder, so that checkpoints link their files, not copy
    /// them. On a server, the server chooses it (in the job's own folder).
    pub dir: Option<PathBuf>,
}

/// The `[restart]` table.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RestartSpec {
    /// `none`, `fixed-delay` or `exponential`.
    pub strategy: RestartStrategyName,
    /// Most restarts (at most a million).
    pub attempts: Option<u32>,
    /// Delay before a restart (the first one, for `exponential`; at most a day).
    #[serde(alias = "delay")]
    pub delay_ms: Option<Millis>,
    /// Longest delay for `exponential` (at most a day).
    #[serde(alias = "max_delay")]
    pub max_delay_ms: Option<Millis>,
    /// Growth factor for `exponential` (default 2, 1 to 10).
    pub multiplier: Option<f64>,
}

/// The `[runtime]` table.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RuntimeSpec {
    /// Records a source reads per batch (default 1024, at most 65,536).
    pub batch_size: Option<usize>,
    /// Bytes after which a channel buffer is sent (default 32 KiB, at most 4 MiB).
    #[serde(alias = "buffer")]
    pub buffer_bytes: Option<ByteSize>,
    /// Milliseconds after which a partly filled buffer is sent (default 100, at most a
    /// minute).
    #[serde(alias = "buffer_timeout")]
    pub buffer_timeout_ms: Option<Millis>,
    /// Buffers per channel before backpressure (default 8, at most 1024). A channel may
    /// hold at most 64 MiB ((`channel_capacity` + 1) × the larger of `buffer_bytes` and a
    /// source batch), and all the channels of a job 2 GiB.
    pub channel_capacity: Option<usize>,
}

impl JobFile {
    /// Parses `text`, naming `path` in errors.
    pub fn parse(text: &str, path: &Path) -> Result<JobFile> {
        super::from_toml(text, path)
    }

    /// Reads and parses the job file at `path`.
    pub fn load(path: &Path) -> Result<JobFile> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read job file {}", path.display()))?;
        Self::parse(&text, path)
    }
}
