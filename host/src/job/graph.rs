//! The validated job: vertices, edges with their partitioners, and the chains that become
//! tasks.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Result, anyhow, bail};

use super::file::{JobFile, SinkKind, SourceKind, SourceSpec};
use super::restart::RestartStrategy;
use crate::checkpoint::CheckpointSettings;
use crate::connectors::{EventTime, LineFormat};
use crate::network::{CheckpointingMode, KeySelector, NetworkSettings, Partitioner};
use crate::state::key_groups::DEFAULT_MAX_PARALLELISM;
use crate::task::TaskSettings;

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
}

/// The sink of the job.
#[derive(Debug, Clone)]
pub struct SinkVertex {
    /// Stable id of its checkpointed state (`sink` unless set).
    pub id: String,
    /// File or stdout.
    pub kind: SinkKind,
    /// Output file (resolved), for file sinks.
    pub path: Option<PathBuf>,
    /// Line format.
    pub format: LineFormat,
    /// Parallelism.
    pub parallelism: u32,
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
            Vertex::Sink(_) => "sink",
        }
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

/// Vertices run together in one task.
#[derive(Debug, Clone)]
pub struct ChainSpec {
    /// Indices into [`JobGraph::vertices`], head first.
    pub vertices: Vec<usize>,
    /// Parallelism of all of them.
    pub parallelism: u32,
    /// The chains this one reads, and how records are spread over its subtasks (empty
    /// for a source chain; several for the union of several sources).
    pub inputs: Vec<(usize, Partitioner)>,
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
    /// Sources, operators, sink, in order.
    pub vertices: Vec<Vertex>,
    /// The tasks to run.
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
}

impl JobGraph {
    /// Validates `file` (read from `path`) into a graph.
    pub fn from_file(file: &JobFile, path: &Path) -> Result<JobGraph> {
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        // An absolute path replaces the base.
        let resolve = |p: &Path| base.join(p);
        let job = path.display();
        if file.name.trim().is_empty() {
            bail!("{job}: `name` must not be empty");
        }
        let max_parallelism = file.max_parallelism.unwrap_or(DEFAULT_MAX_PARALLELISM);
        if !(1..=32768).contains(&max_parallelism) {
            bail!("{job}: `max_parallelism` must be between 1 and 32768, not {max_parallelism}");
        }
        let check_parallelism = |what: &str, p: u32| -> Result<()> {
            if p == 0 {
                bail!("{job}: {what}: `parallelism` must be at least 1");
            }
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
            let source = source_vertex(spec, default_name, &resolve)
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

        let mut inputs: Vec<(Option<KeySelector>, Option<String>)> = Vec::new();
        if file.operators.is_empty() {
            bail!("{job}: the job has no `[[operator]]`; at least one is needed");
        }
        for (i, op) in file.operators.iter().enumerate() {
            let what = format!("operator #{} '{}'", i + 1, op.name);
            if op.name.trim().is_empty() {
                bail!("{job}: operator #{}: `name` must not be empty", i + 1);
            }
            if op.name == "sink" {
                bail!("{job}: {what}: the name `sink` is reserved");
            }
            if !names.insert(op.name.clone()) {
                bail!(
                    "{job}: {what}: another operator or source has the same name; names must be unique"
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
            inputs.push((key_by.clone(), op.partition.clone()));
            vertices.push(Vertex::Operator(OperatorVertex {
                name: op.name.clone(),
                id: op.id.clone().unwrap_or_else(|| op.name.clone()),
                plugin: resolve(&op.plugin),
                config,
                parallelism: op.parallelism,
                key_by,
            }));
        }

        let sink = &file.sink;
        check_parallelism("sink", sink.parallelism)?;
        let format = match sink.format.as_deref() {
            None | Some("value") => LineFormat::Value,
            Some("key-value") => LineFormat::KeyValue,
            Some(other) => {
                bail!("{job}: sink: `format` must be \"value\" or \"key-value\", not {other:?}")
            }
        };
        let sink_path = match (sink.kind, &sink.path) {
            (SinkKind::File, Some(p)) => Some(resolve(p)),
            (SinkKind::File, None) => bail!("{job}: sink: a `file` sink needs a `path`"),
            (SinkKind::Stdout, Some(_)) => bail!("{job}: sink: a `stdout` sink takes no `path`"),
            (SinkKind::Stdout, None) => None,
        };
        inputs.push((None, sink.partition.clone()));
        vertices.push(Vertex::Sink(SinkVertex {
            id: sink.id.clone().unwrap_or_else(|| "sink".into()),
            kind: sink.kind,
            path: sink_path,
            format,
            parallelism: sink.parallelism,
        }));

        let mut ids = BTreeSet::new();
        for v in &vertices {
            let id = v.id();
            if id.trim().is_empty() {
                bail!("{job}: '{}': `id` must not be empty", v.name());
            }
            if !ids.insert(id) {
                bail!(
                    "{job}: two vertices have the id '{id}'; ids (default: the names) must be unique, \
                     since checkpoints keep state by id"
                );
            }
        }

        // Chains: vertices joined by forward edges run in one task; every other edge
        // crosses channels. Several sources each run alone and meet (a union) at the
        // first operator.
        let edge = |v: usize, up: u32| -> Result<Partitioner> {
            let (key_by, partition) = inputs[v - sources].clone();
            let down = vertices[v].parallelism();
            let what = match &vertices[v] {
                Vertex::Sink(_) => "sink".to_string(),
                other => format!("operator '{}'", other.name()),
            };
            Ok(match (key_by, partition.as_deref()) {
                (Some(_), Some(p)) => bail!(
                    "{job}: {what}: `key_by` already partitions by key; remove `partition = {p:?}`"
                ),
                (Some(key), None) => Partitioner::Hash {
                    key,
                    max_parallelism,
                },
                (None, Some("forward")) if up != down => bail!(
                    "{job}: {what}: `partition = \"forward\"` needs equal parallelism, but the input has {up} and this has {down}"
                ),
                (None, Some("forward")) => Partitioner::Forward,
                (None, Some("rebalance")) => Partitioner::Rebalance,
                (None, Some("broadcast")) => Partitioner::Broadcast,
                (None, Some("hash")) => bail!("{job}: {what}: use `key_by` to partition by key"),
                (None, Some(other)) => bail!(
                    "{job}: {what}: `partition` must be \"forward\", \"rebalance\" or \"broadcast\", not {other:?}"
                ),
                (None, None) if up == down => Partitioner::Forward,
                (None, None) => Partitioner::Rebalance,
            })
        };
        let mut chains: Vec<ChainSpec> = (0..sources)
            .map(|s| ChainSpec {
                vertices: vec![s],
                parallelism: vertices[s].parallelism(),
                inputs: Vec::new(),
            })
            .collect();
        let mut first = sources;
        if sources > 1 {
            let union = (0..sources)
                .map(|s| Ok((s, edge(sources, vertices[s].parallelism())?)))
                .collect::<Result<Vec<_>>>()?;
            chains.push(ChainSpec {
                vertices: vec![sources],
                parallelism: vertices[sources].parallelism(),
                inputs: union,
            });
            first += 1;
        }
        for v in first..vertices.len() {
            let up = vertices[v - 1].parallelism();
            let partitioner = edge(v, up)?;
            if partitioner == Partitioner::Forward {
                chains.last_mut().expect("a chain exists").vertices.push(v);
            } else {
                let upstream = chains.len() - 1;
                chains.push(ChainSpec {
                    vertices: vec![v],
                    parallelism: vertices[v].parallelism(),
                    inputs: vec![(upstream, partitioner)],
                });
            }
        }

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
                Ok(CheckpointSettings {
                    interval: Duration::from_millis(c.interval_ms),
                    timeout: Duration::from_millis(c.timeout_ms.unwrap_or(600_000)),
                    min_pause: Duration::from_millis(c.min_pause_ms.unwrap_or(0)),
                    max_concurrent: c.max_concurrent.unwrap_or(1).max(1),
                    retain: c.retain.unwrap_or(3).max(1),
                    mode,
                    dir,
                })
            })
            .transpose()?;
        if checkpoint.is_some()
            && vertices
                .iter()
                .any(|v| matches!(v, Vertex::Source(s) if s.input == SourceInput::Stdin))
        {
            bail!("{job}: checkpointing needs replayable sources; `stdin` cannot be replayed");
        }
        let restart = RestartStrategy::from_spec(file.restart.as_ref(), checkpoint.is_some())
            .map_err(|e| anyhow!("{job}: restart: {e}"))?;

        let rt = &file.runtime;
        let network = NetworkSettings {
            buffer_bytes: rt.buffer_bytes.unwrap_or(32 << 10).max(1),
            channel_capacity: rt.channel_capacity.unwrap_or(8).max(1),
            buffer_timeout: Duration::from_millis(rt.buffer_timeout_ms.unwrap_or(100)),
        };
        let task = TaskSettings {
            batch_size: rt.batch_size.unwrap_or(1024).max(1),
            buffer_timeout: network.buffer_timeout,
            ..TaskSettings::default()
        };
        Ok(JobGraph {
            name: file.name.clone(),
            tenant: file.tenant.clone(),
            max_parallelism,
            vertices,
            chains,
            checkpoint,
            restart,
            network,
            task,
            base_dir: base,
        })
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

    /// The sink.
    pub fn sink(&self) -> &SinkVertex {
        match self.vertices.last() {
            Some(Vertex::Sink(s)) => s,
            _ => unreachable!("a job graph ends in its sink"),
        }
    }

    /// The chain that reads chain `c`'s output, if any.
    pub fn downstream_of(&self, c: usize) -> Option<(usize, &Partitioner)> {
        self.chains.iter().enumerate().find_map(|(d, chain)| {
            chain
                .inputs
                .iter()
                .find(|(u, _)| *u == c)
                .map(|(_, p)| (d, p))
        })
    }
}

/// Checks one `[source]` table against its type.
fn source_vertex(
    spec: &SourceSpec,
    default_name: String,
    resolve: &dyn Fn(&Path) -> PathBuf,
) -> Result<SourceVertex> {
    let kind = match spec.kind {
        SourceKind::File => "file",
        SourceKind::Generator => "generator",
        SourceKind::Stdin => "stdin",
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
    let input = match spec.kind {
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
            let shape = match spec.shape.as_deref() {
                None | Some("words") => {
                    not_for("keys", spec.keys.is_some())?;
                    not_for("step_ms", spec.step_ms.is_some())?;
                    not_for("jitter_ms", spec.jitter_ms.is_some())?;
                    GeneratorShape::Words {
                        words_per_record: spec.words_per_record.unwrap_or(8),
                        vocabulary: spec.vocabulary.unwrap_or(1000).max(1),
                    }
                }
                Some("events") => {
                    not_for("words_per_record", spec.words_per_record.is_some())?;
                    not_for("vocabulary", spec.vocabulary.is_some())?;
                    GeneratorShape::Events {
                        keys: spec.keys.unwrap_or(1000).max(1),
                        step_ms: spec.step_ms.unwrap_or(10),
                        jitter_ms: spec.jitter_ms.unwrap_or(0).max(0),
                    }
                }
                Some(other) => bail!("`shape` must be \"words\" or \"events\", not {other:?}"),
            };
            if let Some(rate) = spec.rate
                && (rate.is_nan() || rate <= 0.0)
            {
                bail!("`rate` must be positive, not {rate}");
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
        .map(|v| match parse_key_by(v) {
            Ok(KeySelector::Field { index, separator }) => Ok(EventTime {
                field: index,
                separator,
                out_of_orderness_ms: spec.out_of_orderness_ms.unwrap_or(0) as i64,
            }),
            _ => Err(anyhow!(
                "`timestamp` must be {{ field = N, separator = \",\" }}: the field holding the event time in milliseconds"
            )),
        })
        .transpose()?;
    if event_time.is_none() && spec.out_of_orderness_ms.is_some() {
        bail!("`out_of_orderness_ms` needs `timestamp`");
    }
    let name = spec.name.clone().unwrap_or(default_name);
    Ok(SourceVertex {
        id: spec.id.clone().unwrap_or_else(|| name.clone()),
        name,
        input,
        parallelism: spec.parallelism.unwrap_or(1),
        event_time,
        idle_timeout: spec.idle_timeout_ms.map(Duration::from_millis),
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
