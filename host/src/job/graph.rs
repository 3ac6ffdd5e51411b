//! The validated job: vertices, edges with their partitioners, and the chains that become
//! tasks.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Result, bail};

use super::file::{JobFile, SinkKind, SourceSpec};
use super::restart::RestartStrategy;
use crate::checkpoint::CheckpointSettings;
use crate::connectors::LineFormat;
use crate::network::{CheckpointingMode, KeySelector, NetworkSettings, Partitioner};
use crate::state::key_groups::DEFAULT_MAX_PARALLELISM;
use crate::task::TaskSettings;

/// A Wasm operator of the job.
#[derive(Debug, Clone)]
pub struct OperatorVertex {
    /// Name.
    pub name: String,
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
    /// File or stdout.
    pub kind: SinkKind,
    /// Output file (resolved), for file sinks.
    pub path: Option<PathBuf>,
    /// Line format.
    pub format: LineFormat,
    /// Parallelism.
    pub parallelism: u32,
}

/// One vertex of the job's pipeline.
#[derive(Debug, Clone)]
pub enum Vertex {
    /// The source.
    Source(SourceSpec),
    /// A Wasm operator.
    Operator(OperatorVertex),
    /// The sink.
    Sink(SinkVertex),
}

impl Vertex {
    /// Name used in task names, metrics and checkpoints.
    pub fn name(&self) -> &str {
        match self {
            Vertex::Source(SourceSpec::File { .. }) => "file source",
            Vertex::Source(SourceSpec::Generator { .. }) => "generator",
            Vertex::Source(SourceSpec::Stdin) => "stdin",
            Vertex::Operator(o) => &o.name,
            Vertex::Sink(_) => "sink",
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
    /// How records reach this chain from the previous one (`None` for the source chain).
    pub input: Option<Partitioner>,
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
    /// Source, operators, sink, in order.
    pub vertices: Vec<Vertex>,
    /// Parallelism of each vertex.
    pub parallelism: Vec<u32>,
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
        let resolve = |p: &Path| {
            if p.is_absolute() {
                p.to_path_buf()
            } else {
                base.join(p)
            }
        };
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

        let source_parallelism = match &file.source {
            SourceSpec::Generator { parallelism, .. } => *parallelism,
            _ => 1,
        };
        check_parallelism("source", source_parallelism)?;
        let source = match &file.source {
            SourceSpec::File { path } => SourceSpec::File {
                path: resolve(path),
            },
            other => other.clone(),
        };

        let mut vertices = vec![Vertex::Source(source)];
        let mut parallelism = vec![source_parallelism];
        let mut inputs: Vec<Option<(Option<KeySelector>, Option<String>)>> = vec![None];
        let mut names = BTreeSet::new();
        if file.operators.is_empty() {
            bail!("{job}: the job has no `[[operator]]`; at least one is needed");
        }
        for (i, op) in file.operators.iter().enumerate() {
            let what = format!("operator #{} '{}'", i + 1, op.name);
            if op.name.trim().is_empty() {
                bail!("{job}: operator #{}: `name` must not be empty", i + 1);
            }
            if ["source", "sink"].contains(&op.name.as_str()) {
                bail!("{job}: {what}: the names `source` and `sink` are reserved");
            }
            if !names.insert(op.name.clone()) {
                bail!("{job}: {what}: another operator has the same name; names must be unique");
            }
            check_parallelism(&what, op.parallelism)?;
            let key_by = op
                .key_by
                .as_ref()
                .map(|v| parse_key_by(v).map_err(|e| anyhow::anyhow!("{job}: {what}: {e}")))
                .transpose()?;
            let config = op
                .config
                .iter()
                .map(|(k, v)| {
                    config_string(v).map(|s| (k.clone(), s)).ok_or_else(|| {
                        anyhow::anyhow!(
                            "{job}: {what}: config value `{k}` must be a string, number or boolean"
                        )
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            inputs.push(Some((key_by.clone(), op.partition.clone())));
            parallelism.push(op.parallelism);
            vertices.push(Vertex::Operator(OperatorVertex {
                name: op.name.clone(),
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
        inputs.push(Some((None, sink.partition.clone())));
        parallelism.push(sink.parallelism);
        vertices.push(Vertex::Sink(SinkVertex {
            kind: sink.kind,
            path: sink_path,
            format,
            parallelism: sink.parallelism,
        }));

        // Edges and chains: a forward edge between equal parallelism chains; anything else
        // crosses a channel.
        let mut chains: Vec<ChainSpec> = vec![ChainSpec {
            vertices: vec![0],
            parallelism: source_parallelism,
            input: None,
        }];
        for v in 1..vertices.len() {
            let (key_by, partition) = inputs[v]
                .clone()
                .expect("every vertex but the source has an input");
            let (up, down) = (parallelism[v - 1], parallelism[v]);
            let what = format!(
                "{} '{}'",
                if v + 1 == vertices.len() {
                    "sink"
                } else {
                    "operator"
                },
                vertices[v].name()
            );
            let partitioner = match (key_by, partition.as_deref()) {
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
            };
            if partitioner == Partitioner::Forward {
                chains
                    .last_mut()
                    .expect("the source chain")
                    .vertices
                    .push(v);
            } else {
                chains.push(ChainSpec {
                    vertices: vec![v],
                    parallelism: down,
                    input: Some(partitioner),
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
        if checkpoint.is_some() && matches!(file.source, SourceSpec::Stdin) {
            bail!("{job}: checkpointing needs a replayable source; `stdin` cannot be replayed");
        }
        let restart = RestartStrategy::from_spec(file.restart.as_ref(), checkpoint.is_some())
            .map_err(|e| anyhow::anyhow!("{job}: restart: {e}"))?;

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
            parallelism,
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

    /// The sink.
    pub fn sink(&self) -> &SinkVertex {
        match self.vertices.last() {
            Some(Vertex::Sink(s)) => s,
            _ => unreachable!("a job graph ends in its sink"),
        }
    }

    /// The source.
    pub fn source(&self) -> &SourceSpec {
        match &self.vertices[0] {
            Vertex::Source(s) => s,
            _ => unreachable!("a job graph starts with its source"),
        }
    }
}

fn parse_key_by(v: &toml::Value) -> Result<KeySelector> {
    match v {
        toml::Value::String(s) if s == "key" => Ok(KeySelector::RecordKey),
        toml::Value::String(s) if s == "value" => Ok(KeySelector::Value),
        toml::Value::Table(t) => {
            for k in t.keys() {
                if k != "field" && k != "separator" {
                    bail!("`key_by` table: unknown field `{k}` (expected `field` and `separator`)");
                }
            }
            let index = match t.get("field") {
                Some(toml::Value::Integer(i)) if *i >= 0 => *i as usize,
                _ => bail!("`key_by` table needs `field`, a field index (0 or more)"),
            };
            let separator = match t.get("separator") {
                None => ",".to_string(),
                Some(toml::Value::String(s)) if !s.is_empty() => s.clone(),
                Some(_) => bail!("`key_by.separator` must be a non-empty string"),
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
