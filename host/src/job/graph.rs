//! The validated job: vertices, edges with their partitioners, and the chains that become
//! tasks.

use std::collections::BTreeSet;
use std::fmt::Display;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Result, anyhow, bail};

use super::file::{
    CheckpointSpec, JobFile, RestartSpec, RuntimeSpec, SinkKind, SinkSpec, SourceKind, SourceSpec,
};
use super::restart::RestartStrategy;
use crate::checkpoint::CheckpointSettings;
use crate::connectors::kafka::{
    self, Delivery, KafkaSinkConfig, KafkaSourceConfig, StartFrom, Topics,
};
use crate::connectors::{EventTime, LineFormat};
use crate::network::{CheckpointingMode, KeySelector, NetworkSettings, Partitioner};
use crate::state::key_groups::DEFAULT_MAX_PARALLELISM;
use crate::task::TaskSettings;

/// The allowed range of every knob of a job file, checked when a job is validated: by
/// `sluice run`, `sluice validate`, and a server at submission and at every start alike. A
/// value outside its range is refused with the job file, the table, the field, the value
/// and the range named — never clamped silently, so what runs is what the file says.
///
/// Each bound is a judgment call: wide enough for a serious deployment on one host, narrow
/// enough that no value makes the host allocate without bound, run out of threads, or
/// overflow its arithmetic. (Unbounded, `channel_capacity = 1000000000` allocated ~40 GB
/// and aborted the process, taking every other job of it down; 30,000 source subtasks
/// exhausted its threads.)
pub mod limits {
    use std::ops::RangeInclusive;

    /// A day in milliseconds: the longest interval, timeout, pause or delay a job file may
    /// ask for. A longer wait is a mistake (and far-future instants overflow).
    pub const DAY_MS: u64 = 86_400_000;

    /// Subtasks of one source, operator or sink. Every subtask is a thread (an operator's
    /// subtask also a Wasm instance): 1024 is more cores than one host has.
    pub const PARALLELISM: RangeInclusive<u32> = 1..=1024;
    /// Key groups (`max_parallelism`): the most a keyed operator can ever be rescaled to.
    /// 32,768 is Flink's bound too.
    pub const MAX_PARALLELISM: RangeInclusive<u32> = 1..=32_768;
    /// Subtasks (threads) of a whole job: four vertices at the largest parallelism. A
    /// server also charges them against the tenant's `max_subtasks`.
    pub const JOB_SUBTASKS: u32 = 4096;

    /// Records a source reads per batch (default 1024): beyond 65,536 a batch amortizes
    /// nothing more, and only delays checkpoint barriers and grows buffers.
    pub const BATCH_SIZE: RangeInclusive<usize> = 1..=65_536;
    /// Bytes after which a channel buffer is sent (default 32 KiB, as Flink's network
    /// buffers): 4 MiB is 128 times that.
    pub const BUFFER_BYTES: RangeInclusive<usize> = 1..=4 << 20;
    /// Milliseconds a partly filled buffer waits (default 100): a minute is a batch job's
    /// latency already.
    pub const BUFFER_TIMEOUT_MS: RangeInclusive<u64> = 0..=60_000;
    /// Buffers a channel holds before its sender blocks (default 8; Flink gives a channel
    /// 2 and a task 8 more to share). The slots are allocated up front.
    pub const CHANNEL_CAPACITY: RangeInclusive<usize> = 1..=1024;

    /// The most bytes one channel may hold: its `channel_capacity` slots and the buffer
    /// its sender fills, of [`slot bytes`](super::ChannelMemory::slot_bytes) each. 64 MiB
    /// is over 200 times what the defaults need (9 × 32 KiB).
    pub const CHANNEL_BYTES: u64 = 64 << 20;
    /// Channels of a job: a 256 × 256 keyed or rebalanced exchange. Every channel has its
    /// slots allocated up front and is polled by its receiver.
    pub const JOB_CHANNELS: u64 = 65_536;
    /// The most bytes all the channels of a job may hold: 2 GiB. At the defaults a
    /// 64 × 64 keyed exchange can hold 1.2 GB (4096 channels × 9 × 32 KiB); a wider one
    /// needs a smaller `channel_capacity` or `buffer_bytes`. (Flink's network memory of a
    /// whole TaskManager is at most 1 GB by default.)
    pub const JOB_CHANNEL_BYTES: u64 = 2 << 30;
    /// What a slot holds besides its bytes (the element and its vector), counted with them.
    pub const SLOT_OVERHEAD: u64 = 64;

    /// Generator records in total: a trillion is a day at ten million a second, and keeps
    /// the event time of the last record (records × `step_ms`) within 64 bits.
    pub const RECORDS: RangeInclusive<u64> = 0..=1_000_000_000_000;
    /// Generator words per line (default 8): a line of 1024 words is about 11 KiB.
    pub const WORDS_PER_RECORD: RangeInclusive<usize> = 0..=1024;
    /// Generator distinct words or keys (default 1000): a billion; the generator
    /// multiplies two numbers below it, which must fit 64 bits.
    pub const VOCABULARY: RangeInclusive<u64> = 1..=1_000_000_000;
    /// Generator event time between records (default 10 ms): at most an hour.
    pub const STEP_MS: RangeInclusive<i64> = 0..=3_600_000;
    /// Generator lateness of a record (default 0): at most a day.
    pub const JITTER_MS: RangeInclusive<i64> = 0..=DAY_MS as i64;
    /// Generator records per second per subtask: one per thousand seconds to a billion
    /// (beyond any generator's speed).
    pub const RATE: RangeInclusive<f64> = 0.001..=1e9;
    /// Bounded out-of-orderness of event time: at most a week.
    pub const OUT_OF_ORDERNESS_MS: RangeInclusive<u64> = 0..=7 * DAY_MS;
    /// Silence before a source declares itself idle: at most a day.
    pub const IDLE_TIMEOUT_MS: RangeInclusive<u64> = 0..=DAY_MS;
    /// How often a Kafka source looks for new partitions (default 10 s): from 100 ms to
    /// a day (each look asks the broker for the topics' metadata).
    pub const DISCOVERY_MS: RangeInclusive<u64> = 100..=DAY_MS;
    /// Records a Kafka sink subtask holds for checkpoints not yet complete, in MiB
    /// (default 256): at most 64 GiB.
    pub const MAX_PENDING_MB: RangeInclusive<u64> = 1..=65_536;

    /// Milliseconds between checkpoints, when not 0 (savepoints only): from 10 ms (more
    /// often only piles barriers up) to a day.
    pub const CHECKPOINT_INTERVAL_MS: RangeInclusive<u64> = 10..=DAY_MS;
    /// Checkpoint timeout (default 10 minutes) and least pause between checkpoints
    /// (default 0): at most a day.
    pub const CHECKPOINT_WAIT_MS: RangeInclusive<u64> = 0..=DAY_MS;
    /// Checkpoints in flight (default 1): each holds its snapshots until complete.
    pub const MAX_CONCURRENT: RangeInclusive<usize> = 1..=16;
    /// Complete checkpoints kept on disk (default 3).
    pub const RETAIN: RangeInclusive<usize> = 1..=100;

    /// Restarts after failures: a million restarts is weeks of crash looping; a job meant
    /// to restart forever says a million. (Every restart keeps its failure in the report.)
    pub const RESTART_ATTEMPTS: RangeInclusive<u32> = 0..=1_000_000;
    /// Delay before a restart, and the longest delay of `exponential`: at most a day.
    pub const RESTART_DELAY_MS: RangeInclusive<u64> = 0..=DAY_MS;
    /// Growth of `exponential` delays (default 2).
    pub const RESTART_MULTIPLIER: RangeInclusive<f64> = 1.0..=10.0;

    /// Bytes of a generated word with its separator, at most: a word of a vocabulary of
    /// at most a billion has at most 10 letters.
    pub(super) const WORD_BYTES: u64 = 11;
    /// Bytes of a generated event line (`timestamp,kKEY,value`), at most.
    pub(super) const EVENT_BYTES: u64 = 40;
    /// Bytes a record takes in a batch besides its value (flags, timestamp, lengths).
    pub(super) const RECORD_OVERHEAD: u64 = 17;
}

/// `value`, if it lies in `range`; else an error naming the field, the value and the range.
fn in_range<T: PartialOrd + Display>(
    field: &str,
    value: T,
    range: &RangeInclusive<T>,
) -> Result<T> {
    if !range.contains(&value) {
        bail!(
            "`{field}` = {value} is out of range: it must be between {} and {}",
            range.start(),
            range.end()
        );
    }
    Ok(value)
}

/// The value of an optional field (checked against `range`), or `default`.
fn knob<T: PartialOrd + Display>(
    field: &str,
    value: Option<T>,
    default: T,
    range: &RangeInclusive<T>,
) -> Result<T> {
    value.map_or(Ok(default), |v| in_range(field, v, range))
}

/// How much the channels of a job can hold: the bound that validation keeps below
/// [`limits::CHANNEL_BYTES`] per channel and [`limits::JOB_CHANNEL_BYTES`] per job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelMemory {
    /// Channels between the job's tasks.
    pub channels: u64,
    /// Bytes one slot of a channel can hold: a buffer (`buffer_bytes`), or a whole
    /// source batch when that is larger (a batch larger than a buffer is sent as it is),
    /// plus [`limits::SLOT_OVERHEAD`].
    pub slot_bytes: u64,
    /// Bytes one channel can hold: (`channel_capacity` + 1) × `slot_bytes`, for the
    /// slots of its queue and the buffer its sender fills.
    pub channel_bytes: u64,
    /// Bytes all channels can hold: `channels` × `channel_bytes`.
    pub total_bytes: u64,
}

/// What a generator source generates.
#[derive(Debug, Clone, PartialEq)]
pub enum GeneratorShape {
    /// Lines of pseudo-words.
    Words {
        /// Words per line.
        words_per_record: usize,
        /// Distinct words.
        vocabulary: u64,
    },
    /// Lines `timestamp,key,value`.
    Events {
        /// Distinct keys.
        keys: u64,
        /// Event time between consecutive records.
        step_ms: i64,
        /// Up to this much earlier than in order.
        jitter_ms: i64,
    },
}

/// Where a source's records come from.
#[derive(Debug, Clone, PartialEq)]
pub enum SourceInput {
    /// A text file (resolved path).
    File(PathBuf),
    /// Generated records.
    Generator {
        /// Records in total.
        records: u64,
        /// What to generate.
        shape: GeneratorShape,
        /// Seed.
        seed: u64,
        /// Records per second per subtask.
        rate: Option<f64>,
    },
    /// Standard input.
    Stdin,
    /// Kafka topics.
    Kafka(KafkaSourceConfig),
}

/// A source of the job.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceVertex {
    /// Name, unique in the job.
    pub name: String,
    /// Stable id of its checkpointed positions (the name unless set).
    pub id: String,
    /// Where its records come from.
    pub input: SourceInput,
    /// Parallelism.
    pub parallelism: u32,
    /// Event time, if the records carry it.
    pub event_time: Option<EventTime>,
    /// Silence after which the source declares itself idle.
    pub idle_timeout: Option<Duration>,
}

/// A Wasm operator of the job.
#[derive(Debug, Clone)]
pub struct OperatorVertex {
    /// Name.
    pub name: String,
    /// Stable id of its checkpointed state (the name unless set).
    pub id: String,
    /// The component file (resolved).
    pub plugin: PathBuf,
    /// Config as strings.
    pub config: Vec<(String, String)>,
    /// Parallelism.
    pub parallelism: u32,
    /// How its input is keyed, if it is.
    pub key_by: Option<KeySelector>,
    /// Over several hosts: a new stage begins here (see [`crate::job::OperatorSpec`]).
    pub repartition: bool,
}

/// A sink of the job.
#[derive(Debug, Clone)]
pub struct SinkVertex {
    /// Name, unique in the job.
    pub name: String,
    /// Stable id of its checkpointed state (the name unless set).
    pub id: String,
    /// File or stdout.
    pub kind: SinkKind,
    /// Output file (resolved), for file sinks.
    pub path: Option<PathBuf>,
    /// Line format.
    pub format: LineFormat,
    /// Parallelism.
    pub parallelism: u32,
    /// Kafka sinks: where and how.
    pub kafka: Option<KafkaSinkConfig>,
}

/// One vertex of the job.
#[derive(Debug, Clone)]
pub enum Vertex {
    /// A source.
    Source(SourceVertex),
    /// A Wasm operator.
    Operator(OperatorVertex),
    /// The sink.
    Sink(SinkVertex),
}

impl Vertex {
    /// Name used in task names, metrics and checkpoints.
    pub fn name(&self) -> &str {
        match self {
            Vertex::Source(s) => &s.name,
            Vertex::Operator(o) => &o.name,
            Vertex::Sink(s) => &s.name,
        }
    }

    /// What validation errors call it: `source 'a'`, `operator 'b'`, `sink 'c'`.
    pub fn describe(&self) -> String {
        let kind = match self {
            Vertex::Source(_) => "source",
            Vertex::Operator(_) => "operator",
            Vertex::Sink(_) => "sink",
        };
        format!("{kind} '{}'", self.name())
    }

    /// Stable id under which checkpoints keep the vertex's state (Flink's `uid`).
    pub fn id(&self) -> &str {
        match self {
            Vertex::Source(s) => &s.id,
            Vertex::Operator(o) => &o.id,
            Vertex::Sink(s) => &s.id,
        }
    }

    /// Parallelism.
    pub fn parallelism(&self) -> u32 {
        match self {
            Vertex::Source(s) => s.parallelism,
            Vertex::Operator(o) => o.parallelism,
            Vertex::Sink(s) => s.parallelism,
        }
    }
}

/// An edge of the job: records of vertex `from` (its main output, or the side output
/// it declared as `side`) go to input number `input` of vertex `to`, spread over its
/// subtasks by `partitioner`.
#[derive(Debug, Clone, PartialEq)]
pub struct Edge {
    /// The vertex the records come from.
    pub from: usize,
    /// The side output they come from; `None` for the main output.
    pub side: Option<String>,
    /// The vertex they go to.
    pub to: usize,
    /// Which of its inputs (several edges of one input are a union).
    pub input: u32,
    /// How records are spread over its subtasks.
    pub partitioner: Partitioner,
}

impl Edge {
    /// `window.side:late`, or the vertex name for a main output.
    pub fn source_name(&self, graph: &JobGraph) -> String {
        let from = graph.vertices[self.from].name();
        match &self.side {
            Some(side) => format!("{from}.side:{side}"),
            None => from.to_string(),
        }
    }
}

/// An edge into a chain from another chain's tail.
#[derive(Debug, Clone, PartialEq)]
pub struct ChainInput {
    /// The chain whose tail sends the records.
    pub from: usize,
    /// The side output of the tail they come from; `None` for its main output.
    pub side: Option<String>,
    /// Which input of the chain's head they reach.
    pub input: u32,
    /// How they are spread over this chain's subtasks.
    pub partitioner: Partitioner,
}

/// Vertices run together in one task.
#[derive(Debug, Clone)]
pub struct ChainSpec {
    /// Indices into [`JobGraph::vertices`], head first.
    pub vertices: Vec<usize>,
    /// Parallelism of all of them.
    pub parallelism: u32,
    /// The edges this chain reads (empty for a source chain).
    pub inputs: Vec<ChainInput>,
}

impl ChainSpec {
    /// `tokenize -> count`.
    pub fn name(&self, graph: &JobGraph) -> String {
        self.vertices
            .iter()
            .map(|&v| graph.vertices[v].name())
            .collect::<Vec<_>>()
            .join(" -> ")
    }

    /// The source this chain reads, if it is a source chain.
    pub fn source<'g>(&self, graph: &'g JobGraph) -> Option<&'g SourceVertex> {
        match &graph.vertices[self.vertices[0]] {
            Vertex::Source(s) => Some(s),
            _ => None,
        }
    }
}

/// A validated job.
#[derive(Debug, Clone)]
pub struct JobGraph {
    /// Job name.
    pub name: String,
    /// Tenant.
    pub tenant: String,
    /// Number of key groups.
    pub max_parallelism: u32,
    /// Sources, operators, sinks, each in the order of the job file.
    pub vertices: Vec<Vertex>,
    /// Where records flow between vertices.
    pub edges: Vec<Edge>,
    /// The tasks to run, each after the tasks it reads.
    pub chains: Vec<ChainSpec>,
    /// Checkpointing, if enabled.
    pub checkpoint: Option<CheckpointSettings>,
    /// Restart strategy.
    pub restart: RestartStrategy,
    /// Data exchange settings.
    pub network: NetworkSettings,
    /// Task settings.
    pub task: TaskSettings,
    /// The job file's directory (relative paths resolve against it).
    pub base_dir: PathBuf,
    /// `[cluster]`, as the job file gives it.
    pub cluster: Option<super::file::ClusterSpec>,
}

impl JobGraph {
    /// Recomputes the chains after vertices or edges changed (a unit of a job spread
    /// over several hosts runs part of its graph).
    pub(crate) fn rechain(&mut self) -> Result<()> {
        let order = topological_order(&self.vertices, &self.edges)?;
        self.chains = chain(&self.vertices, &self.edges, &order);
        Ok(())
    }

    /// The inputs of vertex `v`, as its `open` is told, by input number: what each
    /// reads (`a + b` for a union) and whether it is broadcast.
    pub fn inputs_of(&self, v: usize) -> Vec<crate::chain::InputInfo> {
        let mut inputs: Vec<crate::chain::InputInfo> = Vec::new();
        for e in self.edges.iter().filter(|e| e.to == v) {
            let i = e.input as usize;
            if inputs.len() <= i {
                inputs.resize_with(i + 1, || crate::chain::InputInfo {
                    name: String::new(),
                    broadcast: false,
                });
            }
            let info = &mut inputs[i];
            if !info.name.is_empty() {
                info.name.push_str(" + ");
            }
            info.name.push_str(&e.source_name(self));
            info.broadcast = e.partitioner == Partitioner::Broadcast;
        }
        inputs
    }

    /// True when the own state of vertex `v` (what `snapshot` returns) is broadcast
    /// state, the same on every subtask, which restores at any parallelism: it has a
    /// broadcast input, and its other inputs (if any) are keyed — per-subtask data then
    /// lives in keyed state. (An unkeyed operator reading a broadcast input beside a
    /// rebalanced one may keep per-subtask data in its own state: that cannot be copied.)
    pub fn has_broadcast_state(&self, v: usize) -> bool {
        let mut inputs = self.edges.iter().filter(|e| e.to == v);
        inputs
            .clone()
            .any(|e| e.partitioner == Partitioner::Broadcast)
            && inputs.all(|e| {
                matches!(
                    e.partitioner,
                    Partitioner::Broadcast | Partitioner::Hash { .. }
                )
            })
    }

    /// The side outputs of vertex `v` that some edge reads.
    pub fn read_side_outputs(&self, v: usize) -> Vec<&str> {
        let mut sides: Vec<&str> = self
            .edges
            .iter()
            .filter(|e| e.from == v)
            .filter_map(|e| e.side.as_deref())
            .collect();
        sides.sort_unstable();
        sides.dedup();
        sides
    }

    /// Validates `file` (read from `path`) into a graph.
    pub fn from_file(file: &JobFile, path: &Path) -> Result<JobGraph> {
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        // An absolute path replaces the base.
        let resolve = |p: &Path| base.join(p);
        let job = path.display();
        if file.name.trim().is_empty() {
            bail!("{job}: `name` must not be empty");
        }
        let max_parallelism = knob(
            "max_parallelism",
            file.max_parallelism,
            DEFAULT_MAX_PARALLELISM,
            &limits::MAX_PARALLELISM,
        )
        .map_err(|e| anyhow!("{job}: {e}"))?;
        let check_parallelism = |what: &str, p: u32| -> Result<()> {
            in_range("parallelism", p, &limits::PARALLELISM)
                .map_err(|e| anyhow!("{job}: {what}: {e}"))?;
            if p > max_parallelism {
                bail!(
                    "{job}: {what}: `parallelism` {p} exceeds `max_parallelism` {max_parallelism}"
                );
            }
            Ok(())
        };

        if file.source.is_empty() {
            bail!("{job}: the job has no `[source]`");
        }
        let mut names = BTreeSet::new();
        let mut vertices = Vec::new();
        for (i, spec) in file.source.iter().enumerate() {
            let default_name = if file.source.len() == 1 {
                "source".to_string()
            } else {
                format!("source-{}", i + 1)
            };
            let source = source_vertex(spec, &file.name, default_name, &resolve)
                .map_err(|e| anyhow!("{job}: source #{}: {e}", i + 1))?;
            check_parallelism(&format!("source '{}'", source.name), source.parallelism)?;
            if !names.insert(source.name.clone()) {
                bail!(
                    "{job}: two sources are named '{}'; names must be unique",
                    source.name
                );
            }
            vertices.push(Vertex::Source(source));
        }
        let sources = vertices.len();

        if file.operators.is_empty() {
            bail!("{job}: the job has no `[[operator]]`; at least one is needed");
        }
        let mut reads: Vec<Reads> = Vec::new();
        for (i, op) in file.operators.iter().enumerate() {
            let what = format!("operator #{} '{}'", i + 1, op.name);
            if op.name.trim().is_empty() {
                bail!("{job}: operator #{}: `name` must not be empty", i + 1);
            }
            if !names.insert(op.name.clone()) {
                bail!(
                    "{job}: {what}: another source, operator or sink has the same name; names must be unique"
                );
            }
            check_parallelism(&what, op.parallelism)?;
            let key_by = op
                .key_by
                .as_ref()
                .map(|v| parse_key_by(v).map_err(|e| anyhow!("{job}: {what}: {e}")))
                .transpose()?;
            let config = op
                .config
                .iter()
                .map(|(k, v)| {
                    config_string(v).map(|s| (k.clone(), s)).ok_or_else(|| {
                        anyhow!(
                            "{job}: {what}: config value `{k}` must be a string, number or boolean"
                        )
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            let inputs = match &op.inputs {
                Some(list) => parse_inputs(list).map_err(|e| anyhow!("{job}: {what}: {e}"))?,
                // The first operator reads the union of the sources no other operator
                // names, the others the operator before them.
                None if i == 0 => {
                    let named = |source: &str| {
                        let entries = file.operators.iter().filter_map(|o| o.inputs.as_ref());
                        entries.flatten().any(|entry| input_names(entry, source))
                    };
                    let unnamed: Vec<InputSpec> = vertices[..sources]
                        .iter()
                        .filter(|v| !named(v.name()))
                        .map(|v| InputSpec::main(v.name(), 0))
                        .collect();
                    if unnamed.is_empty() {
                        bail!(
                            "{job}: {what} has no `inputs`, and every source is read by \
                             another operator; name what it reads"
                        );
                    }
                    unnamed
                }
                None => vec![InputSpec::main(&file.operators[i - 1].name, 0)],
            };
            reads.push(Reads {
                vertex: vertices.len(),
                inputs,
                key_by: key_by.clone(),
                partition: op.partition.clone(),
            });
            vertices.push(Vertex::Operator(OperatorVertex {
                name: op.name.clone(),
                id: op.id.clone().unwrap_or_else(|| op.name.clone()),
                plugin: resolve(&op.plugin),
                config,
                parallelism: op.parallelism,
                key_by,
                repartition: op.repartition,
            }));
        }

        if file.sink.is_empty() {
            bail!("{job}: the job has no `[sink]`");
        }
        let last_operator = &file.operators[file.operators.len() - 1].name;
        for (i, sink) in file.sink.iter().enumerate() {
            let name = match &sink.name {
                Some(name) => name.clone(),
                None if file.sink.len() == 1 => "sink".to_string(),
                None => format!("sink-{}", i + 1),
            };
            let what = format!("sink '{name}'");
            if name.trim().is_empty() {
                bail!("{job}: sink #{}: `name` must not be empty", i + 1);
            }
            if !names.insert(name.clone()) {
                bail!(
                    "{job}: {what}: another source, operator or sink has the same name; names must be unique"
                );
            }
            check_parallelism(&what, sink.parallelism)?;
            let format = match sink.format.as_deref() {
                None | Some("value") => LineFormat::Value,
                Some("key-value") => LineFormat::KeyValue,
                Some(other) => bail!(
                    "{job}: {what}: `format` must be \"value\" or \"key-value\", not {other:?}"
                ),
            };
            let sink_path = match (sink.kind, &sink.path) {
                (SinkKind::File, Some(p)) => Some(resolve(p)),
                (SinkKind::File, None) => bail!("{job}: {what}: a `file` sink needs a `path`"),
                (SinkKind::Stdout | SinkKind::Kafka, Some(_)) => {
                    bail!(
                        "{job}: {what}: a `{}` sink takes no `path`",
                        sink_kind_name(sink.kind)
                    )
                }
                (SinkKind::Stdout | SinkKind::Kafka, None) => None,
            };
            let id = sink.id.clone().unwrap_or_else(|| name.clone());
            let kafka = kafka_sink(sink, &file.name, &id, file.checkpoint.is_some())
                .map_err(|e| anyhow!("{job}: {what}: {e}"))?;
            let inputs = match &sink.inputs {
                Some(list) => parse_inputs(list).map_err(|e| anyhow!("{job}: {what}: {e}"))?,
                None => vec![InputSpec::main(last_operator, 0)],
            };
            if inputs.iter().any(|i| i.key_by.is_some()) {
                bail!("{job}: {what}: a sink's input takes no `key_by`");
            }
            reads.push(Reads {
                vertex: vertices.len(),
                inputs,
                key_by: None,
                partition: sink.partition.clone(),
            });
            vertices.push(Vertex::Sink(SinkVertex {
                name,
                id,
                kind: sink.kind,
                path: sink_path,
                format,
                parallelism: sink.parallelism,
                kafka,
            }));
        }
        check_sink_files(&vertices).map_err(|e| anyhow!("{job}: {e}"))?;
        let mut prefixes = std::collections::BTreeMap::new();
        for sink in vertices.iter().filter_map(|v| match v {
            Vertex::Sink(s) => Some(s),
            _ => None,
        }) {
            let Some(kafka) = sink
                .kafka
                .as_ref()
                .filter(|k| k.delivery == Delivery::ExactlyOnce)
            else {
                continue;
            };
            if let Some(other) = prefixes.insert(&kafka.transactional_id_prefix, &sink.name) {
                bail!(
                    "{job}: sink '{}': sink '{other}' has the same `transactional_id_prefix` \
                     {:?}; their transactions would fence each other",
                    sink.name,
                    kafka.transactional_id_prefix
                );
            }
        }

        let mut ids = BTreeSet::new();
        for v in &vertices {
            let id = v.id();
            if id.trim().is_empty() {
                bail!("{job}: {}: `id` must not be empty", v.describe());
            }
            if !ids.insert(id) {
                bail!(
                    "{job}: two vertices have the id '{id}'; ids (default: the names) must be unique, \
                     since checkpoints keep state by id"
                );
            }
        }

        let edges =
            resolve_edges(&vertices, &reads, max_parallelism).map_err(|e| anyhow!("{job}: {e}"))?;
        for (u, vertex) in vertices.iter().enumerate() {
            if !matches!(vertex, Vertex::Sink(_))
                && !edges.iter().any(|e| e.from == u && e.side.is_none())
            {
                let only_side = if edges.iter().any(|e| e.from == u) {
                    " (only side outputs of it are read)"
                } else {
                    ""
                };
                bail!(
                    "{job}: {}: nothing reads its output{only_side}; name it in the `inputs` \
                     of an operator or sink",
                    vertex.describe()
                );
            }
        }
        let order = topological_order(&vertices, &edges).map_err(|e| anyhow!("{job}: {e}"))?;
        // An operator is keyed when its inputs are (all that are not broadcast).
        for (v, vertex) in vertices.iter_mut().enumerate() {
            if let Vertex::Operator(o) = vertex {
                o.key_by = edges.iter().find_map(|e| match &e.partitioner {
                    Partitioner::Hash { key, .. } if e.to == v => Some(key.clone()),
                    _ => None,
                });
            }
        }
        let chains = chain(&vertices, &edges, &order);
        let checkpoint = file
            .checkpoint
            .as_ref()
            .map(|c| -> Result<CheckpointSettings> {
                let mode = match c.mode.as_deref() {
                    None | Some("exactly-once") => CheckpointingMode::ExactlyOnce,
                    Some("at-least-once") => CheckpointingMode::AtLeastOnce,
                    Some(other) => bail!(
                        "{job}: checkpoint: `mode` must be \"exactly-once\" or \"at-least-once\", not {other:?}"
                    ),
                };
                let dir = c
                    .dir
                    .as_deref()
                    .map(resolve)
                    .unwrap_or_else(|| base.join("checkpoints").join(&file.name));
                checkpoint_settings(c, mode, dir).map_err(|e| anyhow!("{job}: [checkpoint]: {e}"))
            })
            .transpose()?;
        if checkpoint.is_some()
            && vertices
                .iter()
                .any(|v| matches!(v, Vertex::Source(s) if s.input == SourceInput::Stdin))
        {
            bail!("{job}: checkpointing needs replayable sources; `stdin` cannot be replayed");
        }
        if let Some(spec) = &file.restart {
            check_restart(spec).map_err(|e| anyhow!("{job}: [restart]: {e}"))?;
        }
        let restart = RestartStrategy::from_spec(file.restart.as_ref(), checkpoint.is_some())
            .map_err(|e| anyhow!("{job}: restart: {e}"))?;

        let (network, batch_size) =
            runtime_settings(&file.runtime).map_err(|e| anyhow!("{job}: [runtime]: {e}"))?;
        let task = TaskSettings {
            batch_size,
            buffer_timeout: network.buffer_timeout,
            ..TaskSettings::default()
        };
        let graph = JobGraph {
            name: file.name.clone(),
            tenant: file.tenant.clone(),
            max_parallelism,
            vertices,
            edges,
            chains,
            checkpoint,
            restart,
            network,
            task,
            base_dir: base,
            cluster: file.cluster.clone(),
        };
        graph.check_size().map_err(|e| anyhow!("{job}: {e}"))?;
        Ok(graph)
    }

    /// Refuses a job whose threads or channels are more than one host should give a
    /// job (see [`limits`]).
    fn check_size(&self) -> Result<()> {
        let subtasks = self.subtasks();
        if subtasks > limits::JOB_SUBTASKS {
            bail!(
                "the job has {subtasks} subtasks (threads), more than the {} a job may have; \
                 lower the `parallelism` of its sources, operators or sink",
                limits::JOB_SUBTASKS
            );
        }
        let m = self.channel_memory();
        let knobs = "lower `channel_capacity`, `buffer_bytes` or `batch_size` in [runtime]";
        if m.channels > limits::JOB_CHANNELS {
            bail!(
                "the job has {} channels between its tasks, more than the {} a job may have; \
                 lower the parallelism on either side of its keyed or rebalanced edges",
                m.channels,
                limits::JOB_CHANNELS
            );
        }
        if m.channel_bytes > limits::CHANNEL_BYTES {
            bail!(
                "[runtime]: a channel could hold {} bytes (`channel_capacity` = {} slots and \
                 the buffer being filled, of {} bytes each: a buffer or a source batch), more \
                 than the {} allowed; {knobs}",
                m.channel_bytes,
                self.network.channel_capacity,
                m.slot_bytes,
                limits::CHANNEL_BYTES
            );
        }
        if m.total_bytes > limits::JOB_CHANNEL_BYTES {
            bail!(
                "[runtime]: the job's {} channels could hold {} bytes ({} each), more than the \
                 {} a job may hold; {knobs}, or the parallelism",
                m.channels,
                m.total_bytes,
                m.channel_bytes,
                limits::JOB_CHANNEL_BYTES
            );
        }
        Ok(())
    }

    /// Subtasks of the job: one thread each (chained vertices share their subtasks).
    pub fn subtasks(&self) -> u32 {
        self.chains.iter().map(|c| c.parallelism).sum()
    }

    /// How much the channels between the job's tasks can hold at most.
    pub fn channel_memory(&self) -> ChannelMemory {
        let channels: u64 = self
            .chains
            .iter()
            .flat_map(|c| c.inputs.iter().map(move |i| (c, i)))
            .map(|(c, i)| match i.partitioner {
                Partitioner::Forward => u64::from(c.parallelism),
                _ => u64::from(self.chains[i.from].parallelism) * u64::from(c.parallelism),
            })
            .sum();
        let batch = self.task.batch_size as u64;
        let largest_source_batch = self
            .sources()
            .map(|s| match &s.input {
                SourceInput::Generator { shape, .. } => {
                    let line = match shape {
                        GeneratorShape::Words {
                            words_per_record, ..
                        } => *words_per_record as u64 * limits::WORD_BYTES,
                        GeneratorShape::Events { .. } => limits::EVENT_BYTES,
                    };
                    batch * (line + limits::RECORD_OVERHEAD)
                }
                // The lines of a file or of stdin, and Kafka records, are data, not knobs.
                SourceInput::File(_) | SourceInput::Stdin | SourceInput::Kafka(_) => 0,
            })
            .max()
            .unwrap_or(0);
        let slot_bytes =
            (self.network.buffer_bytes as u64).max(largest_source_batch) + limits::SLOT_OVERHEAD;
        let channel_bytes = (self.network.channel_capacity as u64 + 1) * slot_bytes;
        ChannelMemory {
            channels,
            slot_bytes,
            channel_bytes,
            total_bytes: channels.saturating_mul(channel_bytes),
        }
    }

    /// The Wasm operators.
    pub fn operators(&self) -> impl Iterator<Item = &OperatorVertex> {
        self.vertices.iter().filter_map(|v| match v {
            Vertex::Operator(o) => Some(o),
            _ => None,
        })
    }

    /// The sources.
    pub fn sources(&self) -> impl Iterator<Item = &SourceVertex> {
        self.vertices.iter().filter_map(|v| match v {
            Vertex::Source(s) => Some(s),
            _ => None,
        })
    }

    /// The sinks.
    pub fn sinks(&self) -> impl Iterator<Item = &SinkVertex> {
        self.vertices.iter().filter_map(|v| match v {
            Vertex::Sink(s) => Some(s),
            _ => None,
        })
    }

    /// The edges that read chain `c`'s tail: `(reading chain, index in its inputs)`.
    pub fn outputs_of(&self, c: usize) -> Vec<(usize, usize)> {
        self.chains
            .iter()
            .enumerate()
            .flat_map(|(d, chain)| {
                chain
                    .inputs
                    .iter()
                    .enumerate()
                    .filter(move |(_, i)| i.from == c)
                    .map(move |(j, _)| (d, j))
            })
            .collect()
    }
}

/// The `[checkpoint]` settings, each within its range (see [`limits`]).
fn checkpoint_settings(
    c: &CheckpointSpec,
    mode: CheckpointingMode,
    dir: PathBuf,
) -> Result<CheckpointSettings> {
    if c.interval_ms != 0 {
        in_range(
            "interval_ms",
            c.interval_ms,
            &limits::CHECKPOINT_INTERVAL_MS,
        )
        .map_err(|e| anyhow!("{e} (or 0: savepoints only)"))?;
    }
    let ms = Duration::from_millis;
    let wait = &limits::CHECKPOINT_WAIT_MS;
    Ok(CheckpointSettings {
        interval: ms(c.interval_ms),
        timeout: ms(knob("timeout_ms", c.timeout_ms, 600_000, wait)?),
        min_pause: ms(knob("min_pause_ms", c.min_pause_ms, 0, wait)?),
        max_concurrent: knob(
            "max_concurrent",
            c.max_concurrent,
            1,
            &limits::MAX_CONCURRENT,
        )?,
        retain: knob("retain", c.retain, 3, &limits::RETAIN)?,
        mode,
        dir,
    })
}

/// Refuses file sinks that would write one file (or its staging folder), as each
/// subtask of each sink names it: `out.txt` at parallelism 2 writes `out-0.txt`, which
/// another sink may name too. Folders that exist are compared as the file system resolves
/// them; the rest as written, without `.` and `..`.
fn check_sink_files(vertices: &[Vertex]) -> Result<()> {
    let mut seen: std::collections::BTreeMap<PathBuf, (&str, PathBuf)> = Default::default();
    for v in vertices {
        let Vertex::Sink(SinkVertex {
            name,
            path: Some(path),
            parallelism,
            ..
        }) = v
        else {
            continue;
        };
        for subtask in 0..*parallelism {
            let output = crate::connectors::file_sink::output_path(path, subtask, *parallelism);
            if let Some((other, file)) = seen.get(&resolved(&output)) {
                let shown = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned());
                bail!(
                    "sink '{name}' would write {} as sink '{other}' does ({}); each file sink \
                     needs files of its own",
                    shown(&output).unwrap_or_default(),
                    shown(file).unwrap_or_default()
                );
            }
            seen.insert(resolved(&output), (name, output));
        }
    }
    Ok(())
}

/// `path` with its folder resolved by the file system when it exists, else without `.`
/// and `..` components.
fn resolved(path: &Path) -> PathBuf {
    let lexical = || {
        let mut out = PathBuf::new();
        for c in path.components() {
            match c {
                std::path::Component::CurDir => {}
                std::path::Component::ParentDir => {
                    out.pop();
                }
                other => out.push(other),
            }
        }
        out
    };
    match (path.parent().map(Path::canonicalize), path.file_name()) {
        (Some(Ok(dir)), Some(name)) => dir.join(name),
        _ => lexical(),
    }
}

/// What an operator or sink reads, as its table says.
struct Reads {
    /// The operator or sink.
    vertex: usize,
    /// Its inputs.
    inputs: Vec<InputSpec>,
    /// Its own `key_by`, for the inputs that set no `key_by`, `partition` or `broadcast`.
    key_by: Option<KeySelector>,
    /// Its own `partition`, likewise.
    partition: Option<String>,
}

/// One input of an operator or sink, as its `inputs` says.
#[derive(Debug, Clone, PartialEq)]
struct InputSpec {
    /// The source or operator read.
    from: String,
    /// Its side output read, if not its main output.
    side: Option<String>,
    /// The input number (entries of a union share one).
    input: u32,
    /// This input's own `key_by`.
    key_by: Option<KeySelector>,
    /// This input's own `partition`.
    partition: Option<String>,
    /// Every record to every subtask.
    broadcast: bool,
}

impl InputSpec {
    fn main(from: &str, input: u32) -> Self {
        InputSpec {
            from: from.to_string(),
            side: None,
            input,
            key_by: None,
            partition: None,
            broadcast: false,
        }
    }
}

/// True when an `inputs` entry (a name or a table with `from`) reads `vertex`.
fn input_names(entry: &toml::Value, vertex: &str) -> bool {
    let name = match entry {
        toml::Value::String(name) => name.as_str(),
        toml::Value::Table(t) => t.get("from").and_then(toml::Value::as_str).unwrap_or(""),
        _ => "",
    };
    name.split_once(".side:").map_or(name, |(from, _)| from) == vertex
}

/// Parses an `inputs` list: names (`op`, `op.side:late`) or tables `{ from, key_by,
/// partition, broadcast }`, numbered in order.
fn parse_inputs(list: &[toml::Value]) -> Result<Vec<InputSpec>> {
    if list.is_empty() {
        bail!("`inputs` is empty; name at least one source or operator");
    }
    let mut inputs = Vec::with_capacity(list.len());
    for (n, value) in list.iter().enumerate() {
        let input = n as u32;
        let (name, table) = match value {
            toml::Value::String(name) => (name.as_str(), None),
            toml::Value::Table(t) => match t.get("from") {
                Some(toml::Value::String(name)) => (name.as_str(), Some(t)),
                _ => bail!("`inputs` entry {n}: a table needs `from = \"NAME\"`"),
            },
            other => bail!(
                "`inputs` entry {n} must be a name or {{ from = \"NAME\", ... }}, not {other}"
            ),
        };
        let (from, side) = match name.split_once(".side:") {
            Some((from, side)) if !side.is_empty() => (from, Some(side.to_string())),
            Some(_) => bail!("`inputs` entry {name:?}: name the side output after `.side:`"),
            None => (name, None),
        };
        if from.is_empty() {
            bail!("`inputs` entry {n} names no source or operator");
        }
        let mut spec = InputSpec::main(from, input);
        spec.side = side;
        if let Some(t) = table {
            for (k, v) in t {
                match k.as_str() {
                    "from" => {}
                    "key_by" => {
                        spec.key_by =
                            Some(parse_key_by(v).map_err(|e| anyhow!("input '{name}': {e}"))?)
                    }
                    "partition" => match v {
                        toml::Value::String(p) => spec.partition = Some(p.clone()),
                        _ => bail!("input '{name}': `partition` must be a string"),
                    },
                    "broadcast" => match v {
                        toml::Value::Boolean(b) => spec.broadcast = *b,
                        _ => bail!("input '{name}': `broadcast` must be true or false"),
                    },
                    other => bail!(
                        "input '{name}': unknown field `{other}` (expected `from`, `key_by`, \
                         `partition` or `broadcast`)"
                    ),
                }
            }
        }
        if inputs
            .iter()
            .any(|i: &InputSpec| i.from == spec.from && i.side == spec.side)
        {
            bail!("`inputs` names '{name}' twice");
        }
        inputs.push(spec);
    }
    Ok(inputs)
}

/// How records reach a vertex of parallelism `down` from one of parallelism `up`.
fn partitioner(
    key_by: Option<KeySelector>,
    partition: Option<&str>,
    up: u32,
    down: u32,
    max_parallelism: u32,
) -> Result<Partitioner> {
    Ok(match (key_by, partition) {
        (Some(_), Some(p)) => {
            bail!("`key_by` already partitions by key; remove `partition = {p:?}`")
        }
        (Some(key), None) => Partitioner::Hash {
            key,
            max_parallelism,
        },
        (None, Some("forward")) if up != down => bail!(
            "`partition = \"forward\"` needs equal parallelism, but the input has {up} and this has {down}"
        ),
        (None, Some("forward")) => Partitioner::Forward,
        (None, Some("rebalance")) => Partitioner::Rebalance,
        (None, Some("broadcast")) => Partitioner::Broadcast,
        (None, Some("hash")) => bail!("use `key_by` to partition by key"),
        (None, Some(other)) => {
            bail!("`partition` must be \"forward\", \"rebalance\" or \"broadcast\", not {other:?}")
        }
        (None, None) if up == down => Partitioner::Forward,
        (None, None) => Partitioner::Rebalance,
    })
}

/// The edges of the job from what each operator and sink reads: every name known,
/// every input partitioned one way, and the inputs of one vertex all keyed or none
/// (broadcast inputs aside).
fn resolve_edges(vertices: &[Vertex], reads: &[Reads], max_parallelism: u32) -> Result<Vec<Edge>> {
    let index = |name: &str| vertices.iter().position(|v| v.name() == name);
    let mut edges = Vec::new();
    for Reads {
        vertex: to,
        inputs: specs,
        key_by: own_key,
        partition: own_partition,
    } in reads
    {
        let to = *to;
        let me = vertices[to].describe();
        let first = edges.len();
        for spec in specs {
            let name = match &spec.side {
                Some(side) => format!("{}.side:{side}", spec.from),
                None => spec.from.clone(),
            };
            let Some(from) = index(&spec.from) else {
                let known: Vec<&str> = vertices
                    .iter()
                    .filter(|v| !matches!(v, Vertex::Sink(_)))
                    .map(Vertex::name)
                    .collect();
                bail!(
                    "{me}: input '{name}' names no source or operator (there are: {})",
                    known.join(", ")
                );
            };
            match &vertices[from] {
                Vertex::Sink(_) => {
                    bail!("{me}: input '{name}' is a sink, and sinks have no output")
                }
                Vertex::Source(_) if spec.side.is_some() => {
                    bail!("{me}: input '{name}': sources have no side outputs")
                }
                _ if from == to => bail!("{me} reads its own output"),
                _ => {}
            }
            let up = vertices[from].parallelism();
            let down = vertices[to].parallelism();
            let partitioner = if spec.broadcast {
                if spec.key_by.is_some() || spec.partition.is_some() {
                    bail!("{me}: input '{name}' is broadcast; it takes no `key_by` or `partition`");
                }
                Ok(Partitioner::Broadcast)
            } else if spec.key_by.is_some() || spec.partition.is_some() {
                partitioner(
                    spec.key_by.clone(),
                    spec.partition.as_deref(),
                    up,
                    down,
                    max_parallelism,
                )
            } else {
                partitioner(
                    own_key.clone(),
                    own_partition.as_deref(),
                    up,
                    down,
                    max_parallelism,
                )
            }
            .map_err(|e| anyhow!("{me}: input '{name}': {e}"))?;
            edges.push(Edge {
                from,
                side: spec.side.clone(),
                to,
                input: spec.input,
                partitioner,
            });
        }
        // Keyed state and timers need every record keyed: a keyed input beside one that
        // is spread some other way is a mistake (a broadcast input is the exception).
        let mine = &edges[first..];
        let keyed = mine
            .iter()
            .find(|e| matches!(e.partitioner, Partitioner::Hash { .. }));
        let unkeyed = mine.iter().find(|e| {
            !matches!(
                e.partitioner,
                Partitioner::Hash { .. } | Partitioner::Broadcast
            )
        });
        if let (Some(k), Some(u)) = (keyed, unkeyed) {
            bail!(
                "{me}: input '{}' is keyed (`key_by`) but input '{}' is {}; a keyed operator \
                 needs all its inputs keyed, or broadcast",
                vertices[k.from].name(),
                vertices[u.from].name(),
                u.partitioner.name()
            );
        }
    }
    Ok(edges)
}

/// The vertices in an order where each comes after everything it reads, sources first;
/// or an error naming the vertices on a cycle.
fn topological_order(vertices: &[Vertex], edges: &[Edge]) -> Result<Vec<usize>> {
    let mut pending: Vec<usize> = vec![0; vertices.len()];
    for e in edges {
        pending[e.to] += 1;
    }
    let mut ready: std::collections::VecDeque<usize> =
        (0..vertices.len()).filter(|&v| pending[v] == 0).collect();
    let mut order = Vec::with_capacity(vertices.len());
    while let Some(v) = ready.pop_front() {
        order.push(v);
        for e in edges.iter().filter(|e| e.from == v) {
            pending[e.to] -= 1;
            if pending[e.to] == 0 {
                ready.push_back(e.to);
            }
        }
    }
    if order.len() < vertices.len() {
        // Every vertex left waits for an input from another one left: walking back
        // along such inputs must come round to a vertex seen before.
        let left = |v: usize| pending[v] > 0;
        let mut path = vec![(0..vertices.len()).find(|&v| left(v)).expect("one is left")];
        let start = loop {
            let v = *path.last().expect("not empty");
            let from = edges
                .iter()
                .find(|e| e.to == v && left(e.from))
                .expect("a vertex left waits for another")
                .from;
            if let Some(i) = path.iter().position(|&p| p == from) {
                break i;
            }
            path.push(from);
        };
        let mut cycle: Vec<String> = path[start..]
            .iter()
            .rev()
            .map(|&v| vertices[v].describe())
            .collect();
        cycle.push(cycle[0].clone());
        bail!("the job's graph has a cycle: {}", cycle.join(" -> "));
    }
    Ok(order)
}

/// The tasks: a vertex joins the chain of the vertex it reads when that is its only
/// input, a forward edge from a main output, and that vertex's only reader (Flink chains
/// the same way, and also an operator with several forward readers: here a fan-out or a
/// side output read by anyone ends a chain, so that a chain is a line and only its tail
/// has several outputs). Every other edge crosses channels between tasks.
fn chain(vertices: &[Vertex], edges: &[Edge], order: &[usize]) -> Vec<ChainSpec> {
    let mut chains: Vec<ChainSpec> = Vec::new();
    let mut chain_of = vec![usize::MAX; vertices.len()];
    for &v in order {
        let inputs: Vec<&Edge> = edges.iter().filter(|e| e.to == v).collect();
        if let [e] = inputs[..]
            && e.side.is_none()
            && e.partitioner == Partitioner::Forward
            && edges.iter().filter(|x| x.from == e.from).count() == 1
        {
            let c = chain_of[e.from];
            chains[c].vertices.push(v);
            chain_of[v] = c;
            continue;
        }
        chain_of[v] = chains.len();
        chains.push(ChainSpec {
            vertices: vec![v],
            parallelism: vertices[v].parallelism(),
            inputs: inputs
                .iter()
                .map(|e| ChainInput {
                    from: chain_of[e.from],
                    side: e.side.clone(),
                    input: e.input,
                    partitioner: e.partitioner.clone(),
                })
                .collect(),
        });
    }
    chains
}

/// Checks the numbers of a `[restart]` table against their ranges (see [`limits`]).
fn check_restart(spec: &RestartSpec) -> Result<()> {
    if let Some(n) = spec.attempts {
        in_range("attempts", n, &limits::RESTART_ATTEMPTS)?;
    }
    for (field, value) in [
        ("delay_ms", spec.delay_ms),
        ("max_delay_ms", spec.max_delay_ms),
    ] {
        if let Some(ms) = value {
            in_range(field, ms, &limits::RESTART_DELAY_MS)?;
        }
    }
    if let Some(m) = spec.multiplier {
        in_range("multiplier", m, &limits::RESTART_MULTIPLIER)?;
    }
    Ok(())
}

/// The `[runtime]` settings, each within its range (see [`limits`]): the exchange's, and
/// the batch size of sources.
fn runtime_settings(rt: &RuntimeSpec) -> Result<(NetworkSettings, usize)> {
    let network = NetworkSettings {
        buffer_bytes: knob(
            "buffer_bytes",
            rt.buffer_bytes,
            32 << 10,
            &limits::BUFFER_BYTES,
        )?,
        channel_capacity: knob(
            "channel_capacity",
            rt.channel_capacity,
            8,
            &limits::CHANNEL_CAPACITY,
        )?,
        buffer_timeout: Duration::from_millis(knob(
            "buffer_timeout_ms",
            rt.buffer_timeout_ms,
            100,
            &limits::BUFFER_TIMEOUT_MS,
        )?),
    };
    let batch_size = knob("batch_size", rt.batch_size, 1024, &limits::BATCH_SIZE)?;
    Ok((network, batch_size))
}

/// Checks one `[source]` table against its type.
fn source_vertex(
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
        ("group", spec.group.is_some()),
        ("discovery_ms", spec.discovery_ms.is_some()),
        ("properties", spec.properties.is_some()),
        ("bounded", spec.bounded.is_some()),
    ];
    if spec.kind != SourceKind::Kafka {
        for (field, set) in kafka_fields {
            not_for(field, set)?;
        }
        if matches!(&spec.timestamp, Some(toml::Value::String(s)) if s == "record") {
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
            SourceInput::Kafka(kafka_source(spec, job, &name)?)
        }
        SourceKind::File | SourceKind::Stdin => {
            for (field, set) in generator_fields {
                not_for(field, set)?;
            }
            match (spec.kind, &spec.path) {
                (SourceKind::File, Some(p)) => SourceInput::File(resolve(p)),
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
            let shape = match spec.shape.as_deref() {
                None | Some("words") => {
                    not_for("keys", spec.keys.is_some())?;
                    not_for("step_ms", spec.step_ms.is_some())?;
                    not_for("jitter_ms", spec.jitter_ms.is_some())?;
                    GeneratorShape::Words {
                        words_per_record: knob(
                            "words_per_record",
                            spec.words_per_record,
                            8,
                            &limits::WORDS_PER_RECORD,
                        )?,
                        vocabulary: knob("vocabulary", spec.vocabulary, 1000, &limits::VOCABULARY)?,
                    }
                }
                Some("events") => {
                    not_for("words_per_record", spec.words_per_record.is_some())?;
                    not_for("vocabulary", spec.vocabulary.is_some())?;
                    GeneratorShape::Events {
                        keys: knob("keys", spec.keys, 1000, &limits::VOCABULARY)?,
                        step_ms: knob("step_ms", spec.step_ms, 10, &limits::STEP_MS)?,
                        jitter_ms: knob("jitter_ms", spec.jitter_ms, 0, &limits::JITTER_MS)?,
                    }
                }
                Some(other) => bail!("`shape` must be \"words\" or \"events\", not {other:?}"),
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
    let event_time = spec
        .timestamp
        .as_ref()
        .map(|v| match (v, parse_key_by(v)) {
            (toml::Value::String(s), _) if s == "record" => Ok(EventTime {
                field: None,
                separator: ",".into(),
                out_of_orderness_ms: spec.out_of_orderness_ms.unwrap_or(0) as i64,
            }),
            (_, Ok(KeySelector::Field { index, separator })) => Ok(EventTime {
                field: Some(index),
                separator,
                out_of_orderness_ms: spec.out_of_orderness_ms.unwrap_or(0) as i64,
            }),
            _ => Err(anyhow!(
                "`timestamp` must be {{ field = N, separator = \",\" }} (the field holding the event time in milliseconds) or \"record\" (the timestamp a Kafka record carries)"
            )),
        })
        .transpose()?;
    if event_time.is_none() && spec.out_of_orderness_ms.is_some() {
        bail!("`out_of_orderness_ms` needs `timestamp`");
    }
    if let Some(ms) = spec.out_of_orderness_ms {
        in_range("out_of_orderness_ms", ms, &limits::OUT_OF_ORDERNESS_MS)?;
    }
    if let Some(ms) = spec.idle_timeout_ms {
        in_range("idle_timeout_ms", ms, &limits::IDLE_TIMEOUT_MS)?;
    }
    Ok(SourceVertex {
        id: spec.id.clone().unwrap_or_else(|| name.clone()),
        name,
        input,
        parallelism: spec.parallelism.unwrap_or(1),
        event_time,
        idle_timeout: spec.idle_timeout_ms.map(Duration::from_millis),
    })
}

fn sink_kind_name(kind: SinkKind) -> &'static str {
    match kind {
        SinkKind::File => "file",
        SinkKind::Stdout => "stdout",
        SinkKind::Kafka => "kafka",
    }
}

/// The `kafka` fields of the `[sink]` table (`None` for other sinks, which may not set
/// them).
fn kafka_sink(
    sink: &SinkSpec,
    job: &str,
    id: &str,
    checkpoints: bool,
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
    ];
    if sink.kind != SinkKind::Kafka {
        if let Some((field, _)) = fields.iter().find(|(_, set)| *set) {
            bail!(
                "`{field}` does not apply to a {} sink",
                sink_kind_name(sink.kind)
            );
        }
        return Ok(None);
    }
    if sink.format.is_some() {
        bail!("`format` does not apply to a kafka sink (records keep their key and value)");
    }
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
    let delivery = match sink.delivery.as_deref() {
        None if checkpoints => Delivery::ExactlyOnce,
        None | Some("at-least-once") => Delivery::AtLeastOnce,
        Some("exactly-once") if checkpoints => Delivery::ExactlyOnce,
        Some("exactly-once") => bail!(
            "`delivery = \"exactly-once\"` needs `[checkpoint]`: records are written when \
             the checkpoint that covers them completes"
        ),
        Some(other) => {
            bail!("`delivery` must be \"exactly-once\" or \"at-least-once\", not {other:?}")
        }
    };
    let max_pending_mb = knob(
        "max_pending_mb",
        sink.max_pending_mb,
        256,
        &limits::MAX_PENDING_MB,
    )?;
    let by_record_partition = match sink.partitioner.as_deref() {
        None | Some("key") => false,
        Some("record") => true,
        Some(other) => bail!("`partitioner` must be \"key\" or \"record\", not {other:?}"),
    };
    Ok(Some(KafkaSinkConfig {
        by_record_partition,
        bootstrap,
        topic,
        delivery,
        transactional_id_prefix: sink
            .transactional_id_prefix
            .clone()
            .unwrap_or_else(|| format!("sluice-{job}-{id}")),
        max_pending_bytes: max_pending_mb << 20,
        properties: sink.properties.clone().unwrap_or_default(),
        exchange: None,
        marker_note: None,
        expect_marker: None,
    }))
}

/// The `kafka` fields of a `[source]` table.
fn kafka_source(spec: &SourceSpec, job: &str, name: &str) -> Result<KafkaSourceConfig> {
    let bootstrap = spec
        .bootstrap
        .clone()
        .filter(|b| !b.trim().is_empty())
        .ok_or_else(|| anyhow!("a kafka source needs `bootstrap` (the brokers, host:port)"))?;
    let topics = match &spec.topics {
        Some(toml::Value::String(t)) => Topics::Names(vec![t.clone()]),
        Some(toml::Value::Array(ts)) => Topics::Names(
            ts.iter()
                .map(|t| match t {
                    toml::Value::String(t) => Ok(t.clone()),
                    other => Err(anyhow!("`topics` must be topic names, not {other}")),
                })
                .collect::<Result<_>>()?,
        ),
        Some(toml::Value::Table(t)) if t.len() == 1 && t.contains_key("pattern") => {
            match &t["pattern"] {
                toml::Value::String(p) if !p.is_empty() => {
                    kafka::topic_pattern(p)?;
                    Topics::Pattern(p.clone())
                }
                _ => bail!("`topics` = {{ pattern = \"...\" }} needs a regular expression"),
            }
        }
        Some(other) => bail!(
            "`topics` must be a topic name, a list of them or {{ pattern = \"REGEX\" }}, not {other}"
        ),
        None => bail!("a kafka source needs `topics`"),
    };
    if let Topics::Names(names) = &topics
        && (names.is_empty() || names.iter().any(|t| t.is_empty()))
    {
        bail!("`topics` must name at least one topic, and no empty one");
    }
    let start = match &spec.start {
        None => StartFrom::Earliest,
        Some(toml::Value::String(s)) => match s.as_str() {
            "earliest" => StartFrom::Earliest,
            "latest" => StartFrom::Latest,
            "committed" => StartFrom::Committed,
            other => bail!(
                "`start` = {other:?}: expected \"earliest\", \"latest\", \"committed\" or {{ timestamp_ms = N }}"
            ),
        },
        Some(toml::Value::Table(t)) if t.len() == 1 => match t.get("timestamp_ms") {
            Some(toml::Value::Integer(ms)) if *ms >= 0 => StartFrom::Timestamp(*ms),
            _ => bail!(
                "`start` = {{ timestamp_ms = N }} needs milliseconds since the epoch (0 or more)"
            ),
        },
        Some(other) => bail!(
            "`start` = {other}: expected \"earliest\", \"latest\", \"committed\" or {{ timestamp_ms = N }}"
        ),
    };
    let discovery_ms = knob(
        "discovery_ms",
        spec.discovery_ms,
        10_000,
        &limits::DISCOVERY_MS,
    )?;
    Ok(KafkaSourceConfig {
        bootstrap,
        topics,
        allowed: None,
        start,
        group: spec
            .group
            .clone()
            .unwrap_or_else(|| format!("sluice-{job}-{name}")),
        discovery: Duration::from_millis(discovery_ms),
        properties: spec.properties.clone().unwrap_or_default(),
        bounded: spec.bounded.unwrap_or(false),
        split: None,
        exchange_producers: None,
    })
}

fn parse_key_by(v: &toml::Value) -> Result<KeySelector> {
    match v {
        toml::Value::String(s) if s == "key" => Ok(KeySelector::RecordKey),
        toml::Value::String(s) if s == "value" => Ok(KeySelector::Value),
        toml::Value::Table(t) => {
            for k in t.keys() {
                if k != "field" && k != "separator" {
                    bail!("unknown field `{k}` (expected `field` and `separator`)");
                }
            }
            let index = match t.get("field") {
                Some(toml::Value::Integer(i)) if *i >= 0 => *i as usize,
                _ => bail!("`field` must be a field index (0 or more)"),
            };
            let separator = match t.get("separator") {
                None => ",".to_string(),
                Some(toml::Value::String(s)) if !s.is_empty() => s.clone(),
                Some(_) => bail!("`separator` must be a non-empty string"),
            };
            Ok(KeySelector::Field { index, separator })
        }
        other => bail!(
            "`key_by` must be \"key\", \"value\" or {{ field = N, separator = \",\" }}, not {other}"
        ),
    }
}

fn config_string(v: &toml::Value) -> Option<String> {
    match v {
        toml::Value::String(s) => Some(s.clone()),
        toml::Value::Integer(i) => Some(i.to_string()),
        toml::Value::Float(f) => Some(f.to_string()),
        toml::Value::Boolean(b) => Some(b.to_string()),
        _ => None,
    }
}
