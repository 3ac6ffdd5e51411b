//! Validation: building a [`JobGraph`] from a job file, checking every table, name,
//! input and knob (see [`limits`]) on the way.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Result, anyhow, bail};

use self::endpoints::{kafka_sink, sink_kind_name, source_vertex};
use super::chaining::{chain, topological_order};
use super::coordinator::CheckpointSettings;
use super::graph::{
    Edge, JobGraph, OperatorVertex, SinkVertex, SourceInput, StateSettings, Vertex,
};
use super::restart::RestartStrategy;
use crate::connectors::LineFormat;
use crate::connectors::kafka::Delivery;
use crate::network::{CheckpointingMode, KeySelector, NetworkSettings, Partitioner};
use crate::spec::limits::{self, in_range};
use crate::spec::values::{CheckpointMode, InputEntry, KeyBy, Partition, SinkFormatName};
use crate::spec::{CheckpointSpec, JobFile, RuntimeSpec, SinkKind};
use crate::task::TaskSettings;

mod endpoints;
pub(crate) use endpoints::registry_config;
#[cfg(test)]
mod tests;

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
        let max_parallelism = limits::MAX_PARALLELISM
            .resolve(file.max_parallelism)
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
            let key_by = op.key_by.as_ref().map(key_selector);
            let config = op
                .config
                .iter()
                .map(|(k, v)| (k.clone(), v.0.clone()))
                .collect();
            let inputs = match &op.inputs {
                Some(list) => parse_inputs(list).map_err(|e| anyhow!("{job}: {what}: {e}"))?,
                // The first operator reads the union of the sources no other operator
                // names, the others the operator before them.
                None if i == 0 => {
                    let named = |source: &str| {
                        let entries = file.operators.iter().filter_map(|o| o.inputs.as_ref());
                        entries.flatten().any(|entry| entry.from == source)
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
                partition: op.partition,
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
        let checkpoint_dir = file.checkpoint.as_ref().map(|c| {
            c.dir
                .as_deref()
                .map(resolve)
                .unwrap_or_else(|| base.join("checkpoints").join(&file.name))
        });
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
            let format = match (sink.kind, sink.format) {
                (_, None) | (SinkKind::File | SinkKind::Stdout, Some(SinkFormatName::Value)) => {
                    LineFormat::Value
                }
                (SinkKind::File | SinkKind::Stdout, Some(SinkFormatName::KeyValue)) => {
                    LineFormat::KeyValue
                }
                (SinkKind::File | SinkKind::Stdout, Some(SinkFormatName::Json)) => LineFormat::Json,
                // (Avro and Protobuf files are written as `file_format` below says.)
                (SinkKind::File, Some(SinkFormatName::Avro | SinkFormatName::Protobuf)) => {
                    LineFormat::Value
                }
                (SinkKind::File, Some(other)) => bail!(
                    "{job}: {what}: a `file` sink writes `format = \"value\"`, \"key-value\", \
                     \"json\" (JSON lines), \"avro\" (an Avro object container file) or \
                     \"protobuf\" (length-delimited messages), not {:?}",
                    other.name()
                ),
                (SinkKind::Stdout, Some(other)) => bail!(
                    "{job}: {what}: a `stdout` sink writes `format = \"value\"`, \"key-value\" \
                     or \"json\" (JSON lines), not {:?} (Avro and Protobuf values are a file's \
                     or a kafka sink's)",
                    other.name()
                ),
                (SinkKind::Kafka, Some(_)) => LineFormat::Value,
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
            let checkpoints = checkpoint_dir.as_deref().map(|dir| endpoints::Checkpoints {
                dir,
                timeout_ms: file
                    .checkpoint
                    .as_ref()
                    .and_then(|c| c.timeout_ms)
                    .map_or(limits::CHECKPOINT_TIMEOUT_MS.default, |m| m.0),
            });
            let file_format = endpoints::file_sink_format(sink, &resolve)
                .map_err(|e| anyhow!("{job}: {what}: {e:#}"))?;
            let kafka = kafka_sink(sink, &file.name, &id, checkpoints, &resolve)
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
                partition: sink.partition,
            });
            vertices.push(Vertex::Sink(SinkVertex {
                name,
                id,
                kind: sink.kind,
                path: sink_path,
                format,
                file_format,
                parallelism: sink.parallelism,
                kafka,
            }));
        }
        // Names go into log lines, metrics and terminals as they are written.
        for name in std::iter::once(&file.name).chain(&names) {
            if let Some(c) = name.chars().find(|c| crate::guest_text::is_unprintable(*c)) {
                bail!(
                    "{job}: the name {name:?} holds {:?} (U+{:04X}), a control, line separator \
                     or text direction character: names are printed in logs and on terminals",
                    c,
                    u32::from(c)
                );
            }
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
                let mode = match c.mode {
                    None | Some(CheckpointMode::ExactlyOnce) => CheckpointingMode::ExactlyOnce,
                    Some(CheckpointMode::AtLeastOnce) => CheckpointingMode::AtLeastOnce,
                };
                let dir = checkpoint_dir.clone().expect("the job checkpoints");
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
        let restart = RestartStrategy::from_spec(file.restart.as_ref(), checkpoint.is_some())
            .map_err(|e| anyhow!("{job}: [restart]: {e}"))?;

        let (network, batch_size) =
            runtime_settings(&file.runtime).map_err(|e| anyhow!("{job}: [runtime]: {e}"))?;
        let task = TaskSettings {
            batch_size,
            buffer_timeout: network.buffer_timeout,
            ..TaskSettings::default()
        };
        let state = state_settings(file.state.as_ref(), resolve)
            .map_err(|e| anyhow!("{job}: [state]: {e}"))?;
        let graph = JobGraph {
            name: file.name.clone(),
            tenant: file.tenant.clone(),
            max_parallelism,
            vertices,
            edges,
            chains,
            checkpoint,
            state,
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
}

/// The `[state]` settings, each within its range (see [`limits`]).
fn state_settings(
    spec: Option<&crate::spec::StateSpec>,
    resolve: impl Fn(&Path) -> PathBuf,
) -> Result<StateSettings> {
    let Some(spec) = spec else {
        return Ok(StateSettings::default());
    };
    Ok(StateSettings {
        backend: spec.backend,
        memory_bytes: limits::STATE_MEMORY_MB.resolve(spec.memory_mb)? << 20,
        dir: spec.dir.as_deref().map(resolve),
    })
}

/// The `[checkpoint]` settings, each within its range (see [`limits`]).
fn checkpoint_settings(
    c: &CheckpointSpec,
    mode: CheckpointingMode,
    dir: PathBuf,
) -> Result<CheckpointSettings> {
    let interval = c.interval_ms.0;
    if interval != 0 {
        in_range("interval_ms", interval, &limits::CHECKPOINT_INTERVAL_MS)
            .map_err(|e| anyhow!("{e} (or 0: savepoints only)"))?;
    }
    let ms = Duration::from_millis;
    Ok(CheckpointSettings {
        interval: ms(interval),
        timeout: ms(limits::CHECKPOINT_TIMEOUT_MS.resolve(c.timeout_ms.map(|m| m.0))?),
        min_pause: ms(limits::MIN_PAUSE_MS.resolve(c.min_pause_ms.map(|m| m.0))?),
        max_concurrent: limits::MAX_CONCURRENT.resolve(c.max_concurrent)?,
        retain: limits::RETAIN.resolve(c.retain)?,
        mode,
        dir,
        phase: None,
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
    partition: Option<Partition>,
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
    partition: Option<Partition>,
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

/// Numbers an `inputs` list in order; a name may be read once.
fn parse_inputs(list: &[InputEntry]) -> Result<Vec<InputSpec>> {
    if list.is_empty() {
        bail!("`inputs` is empty; name at least one source or operator");
    }
    let mut inputs: Vec<InputSpec> = Vec::with_capacity(list.len());
    for (n, entry) in list.iter().enumerate() {
        if inputs
            .iter()
            .any(|i| i.from == entry.from && i.side == entry.side)
        {
            bail!("`inputs` names '{}' twice", entry.written());
        }
        inputs.push(InputSpec {
            from: entry.from.clone(),
            side: entry.side.clone(),
            input: n as u32,
            key_by: entry.key_by.as_ref().map(key_selector),
            partition: entry.partition,
            broadcast: entry.broadcast,
        });
    }
    Ok(inputs)
}

/// How records reach a vertex of parallelism `down` from one of parallelism `up`.
fn partitioner(
    key_by: Option<KeySelector>,
    partition: Option<Partition>,
    up: u32,
    down: u32,
    max_parallelism: u32,
) -> Result<Partitioner> {
    Ok(match (key_by, partition) {
        (Some(_), Some(p)) => {
            bail!(
                "`key_by` already partitions by key; remove `partition = {:?}`",
                p.name()
            )
        }
        (Some(key), None) => Partitioner::Hash {
            key,
            max_parallelism,
        },
        (None, Some(Partition::Forward)) if up != down => bail!(
            "`partition = \"forward\"` needs equal parallelism, but the input has {up} and this has {down}"
        ),
        (None, Some(Partition::Forward)) => Partitioner::Forward,
        (None, Some(Partition::Rebalance)) => Partitioner::Rebalance,
        (None, Some(Partition::Broadcast)) => Partitioner::Broadcast,
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
                    spec.partition,
                    up,
                    down,
                    max_parallelism,
                )
            } else {
                partitioner(own_key.clone(), *own_partition, up, down, max_parallelism)
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

/// The `[runtime]` settings, each within its range (see [`limits`]): the exchange's, and
/// the batch size of sources.
fn runtime_settings(rt: &RuntimeSpec) -> Result<(NetworkSettings, usize)> {
    let network = NetworkSettings {
        buffer_bytes: limits::BUFFER_BYTES.resolve(
            rt.buffer_bytes
                .map(|b| usize::try_from(b.units()).unwrap_or(usize::MAX)),
        )?,
        channel_capacity: limits::CHANNEL_CAPACITY.resolve(rt.channel_capacity)?,
        buffer_timeout: Duration::from_millis(
            limits::BUFFER_TIMEOUT_MS.resolve(rt.buffer_timeout_ms.map(|m| m.0))?,
        ),
    };
    let batch_size = limits::BATCH_SIZE.resolve(rt.batch_size)?;
    Ok((network, batch_size))
}

/// The runtime's key selector for what a job file's `key_by` says.
fn key_selector(key_by: &KeyBy) -> KeySelector {
    match key_by {
        KeyBy::Key => KeySelector::RecordKey,
        KeyBy::Value => KeySelector::Value,
        KeyBy::Field(f) => KeySelector::Field {
            index: f.field,
            separator: f.separator.clone(),
        },
    }
}
