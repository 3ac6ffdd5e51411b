//! The validated job: vertices, edges with their partitioners, and the chains that become
//! tasks.

use crate::connectors::formats::FormatConfig;
use std::path::PathBuf;
use std::time::Duration;

use super::coordinator::CheckpointSettings;
use super::restart::RestartStrategy;
use crate::connectors::kafka::{KafkaSinkConfig, KafkaSourceConfig};
use crate::connectors::{EventTime, LineFormat};
use crate::network::{KeySelector, NetworkSettings, Partitioner};
use crate::spec::SinkKind;
use crate::spec::limits;
use crate::task::TaskSettings;

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
    /// A file (resolved path): lines, JSON lines or an Avro container file, as its
    /// `format` says.
    File {
        path: PathBuf,
        format: Box<FormatConfig>,
    },
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
    /// File sinks with `format = "avro"` or `"protobuf"`: what they write instead of
    /// lines.
    pub file_format: Option<FileOutput>,
    /// Parallelism.
    pub parallelism: u32,
    /// Kafka sinks: where and how.
    pub kafka: Option<KafkaSinkConfig>,
}

/// What a file sink writes instead of lines.
#[derive(Debug, Clone)]
pub enum FileOutput {
    /// An Avro object container file (`format = "avro"`).
    Avro {
        /// Its schema (the .avsc text).
        schema: String,
        /// How its blocks are compressed.
        codec: crate::spec::values::AvroCodecName,
    },
    /// Length-delimited Protobuf messages (`format = "protobuf"`).
    Protobuf {
        /// The `.proto` schema, with its imports.
        schema: crate::connectors::formats::SchemaText,
        /// The message written (default: the schema's first).
        message: Option<String>,
    },
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
    /// Where keyed state is kept.
    pub state: StateSettings,
    /// Restart strategy.
    pub restart: RestartStrategy,
    /// Data exchange settings.
    pub network: NetworkSettings,
    /// Task settings.
    pub task: TaskSettings,
    /// The job file's directory (relative paths resolve against it).
    pub base_dir: PathBuf,
    /// `[cluster]`, as the job file gives it.
    pub cluster: Option<crate::spec::ClusterSpec>,
}

/// Where a job keeps its keyed state (`[state]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateSettings {
    /// The backend the job asks for; `None`: the tenant's (host's) default.
    pub backend: Option<crate::state::BackendKind>,
    /// Memory of each RocksDB instance, bytes.
    pub memory_bytes: u64,
    /// Where RocksDB instances of a job without checkpoints keep their databases;
    /// `None`: the system's temporary folder.
    pub dir: Option<PathBuf>,
}

impl Default for StateSettings {
    fn default() -> Self {
        StateSettings {
            backend: None,
            memory_bytes: limits::STATE_MEMORY_MB.default << 20,
            dir: None,
        }
    }
}

impl JobGraph {
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

    /// Subtasks of the job: one thread each (chained vertices share their subtasks).
    pub fn subtasks(&self) -> u32 {
        self.chains.iter().map(|c| c.parallelism).sum()
    }

    /// Wasm operator instances of the job: one per operator subtask.
    pub fn instances(&self) -> u32 {
        self.operators().map(|o| o.parallelism).sum()
    }

    /// Task slots the job takes, as Flink counts them: its highest parallelism (a slot
    /// holds one subtask of every task).
    pub fn slots(&self) -> u32 {
        self.chains.iter().map(|c| c.parallelism).max().unwrap_or(0)
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
                SourceInput::File { .. } | SourceInput::Stdin | SourceInput::Kafka(_) => 0,
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
