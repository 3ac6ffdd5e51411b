//! Deployment of one attempt of a job: wiring the channels between subtasks, building
//! every task with its input, chain and restored state, starting the checkpoint
//! coordinator and the task threads.

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::thread;

use anyhow::{Context, Result, anyhow, bail};
use crossbeam_channel::{Receiver, Sender, unbounded};
use parking_lot::Mutex;

use super::coordinator::{CheckpointStats, Coordinator, CoordinatorSetup};
use super::graph::{GeneratorShape, JobGraph, SourceInput, SourceVertex, Vertex};
use super::run::RunOptions;
use super::runner::Job;
use super::start::RunStart;
use super::supervisor::RunningAttempt;
use crate::chain::{
    ChainOutput, ChainedOperator, OpenInfo, Operator, OperatorChain, OperatorIdentity,
    OperatorState, OutputEdge, undeclared_side_output,
};
use crate::checkpoint::assign_operator_state;
use crate::checkpoint::{AsyncPool, CheckpointLink, LoadedCheckpoint, TaskId};
use crate::connectors::avro_file::AvroFileSource;
use crate::connectors::formats::{self, Format};
use crate::connectors::kafka::{self, Delivery, KafkaSink, KafkaSource};
use crate::connectors::{
    FileSink, FileSource, Generated, GeneratorSource, Source, StdinSource, StdoutSink,
};
use crate::metrics::{OperatorMetrics, TaskMetrics, TaskMetricsHandle};
use crate::network::{InputGate, Partitioner, RecordWriter, channel};
use crate::spec::SinkKind;
use crate::state::key_groups::key_groups_of_subtask;
use crate::state::lsm::LsmConfig;
use crate::state::{Account, BackendKind, InstanceLimits, KeyedState, TenantUsage};
use crate::task::{
    SourceReader, StreamTask, TaskContext, TaskHandle, TaskInput, merge_source_checkpoints,
    panic_to_error,
};
use crate::wasm::{Plugin, SandboxLimits};

impl Job {
    pub(super) fn deploy(
        &self,
        attempt: u32,
        checkpoint: Option<Arc<LoadedCheckpoint>>,
        run: &RunStart,
        stats: Arc<Mutex<CheckpointStats>>,
        first_id: u64,
        options: &RunOptions,
    ) -> Result<RunningAttempt> {
        let graph = &self.graph;
        let chains = &graph.chains;
        let mode = graph
            .checkpoint
            .as_ref()
            .map(|c| c.mode)
            .unwrap_or_default();

        // Channels: for every edge into chain `c` (its `j`th input), one channel per pair
        // of connected subtasks (forward edges connect subtask i to subtask i only).
        // `senders[(c, j)][s]` are the channels of upstream subtask `s` on that edge,
        // indexed by downstream subtask; `receivers[c][d]` those into subtask `d` of
        // chain `c`, with the input of its head each feeds.
        let mut senders: BTreeMap<(usize, usize), Vec<Vec<Sender<_>>>> = BTreeMap::new();
        let mut receivers: Vec<Vec<Vec<(u32, Receiver<_>)>>> = chains
            .iter()
            .map(|c| vec![Vec::new(); c.parallelism as usize])
            .collect();
        for (c, chain) in chains.iter().enumerate() {
            for (j, edge) in chain.inputs.iter().enumerate() {
                let mut outboxes = vec![Vec::new(); chains[edge.from].parallelism as usize];
                for (from, outbox) in outboxes.iter_mut().enumerate() {
                    for (to, inbox) in receivers[c].iter_mut().enumerate() {
                        if edge.partitioner == Partitioner::Forward && from != to {
                            continue;
                        }
                        let (tx, rx) = channel(graph.network.channel_capacity);
                        outbox.push(tx);
                        inbox.push((edge.input, rx));
                    }
                }
                senders.insert((c, j), outboxes);
            }
        }

        let (coordinator_tx, coordinator_rx) = unbounded();
        let writers = Arc::new(AsyncPool::new(2));
        let storage = run.storage.clone();
        let link = match (&graph.checkpoint, &storage) {
            (Some(_), Some(storage)) => Some(CheckpointLink::new(
                coordinator_tx.clone(),
                storage.clone(),
                writers.clone(),
            )),
            _ => None,
        };

        let mut tasks = Vec::new();
        let mut metrics = Vec::new();
        for (c, chain) in chains.iter().enumerate() {
            for s in 0..chain.parallelism {
                let ctx = TaskContext {
                    name: format!("{} ({}/{})", chain.name(graph), s + 1, chain.parallelism),
                    id: TaskId {
                        vertex: c,
                        subtask: s,
                    },
                    cancel: Arc::new(AtomicBool::new(false)),
                    metrics: Arc::new(TaskMetrics::default()),
                };
                let source = chain.source(graph);
                let source_metrics = source.map(|_| Arc::<OperatorMetrics>::default());
                let input = match (source, &source_metrics) {
                    (Some(source), Some(metrics)) => {
                        let mut reader = make_source(source, s)?;
                        reader.attach_metrics(metrics.clone());
                        TaskInput::Source(SourceReader::new(
                            reader,
                            source.event_time.clone(),
                            source.idle_timeout,
                        ))
                    }
                    _ => TaskInput::Network(InputGate::with_inputs(
                        std::mem::take(&mut receivers[c][s as usize]),
                        mode,
                    )),
                };
                let edges: Vec<OutputEdge> = graph
                    .outputs_of(c)
                    .into_iter()
                    .map(|(d, j)| {
                        let edge = &chains[d].inputs[j];
                        let channels = std::mem::take(
                            &mut senders.get_mut(&(d, j)).expect("wired above")[s as usize],
                        );
                        OutputEdge::new(
                            edge.side.clone(),
                            RecordWriter::new(
                                channels,
                                edge.partitioner.clone(),
                                &graph.network,
                                ctx.cancel.clone(),
                                ctx.metrics.clone(),
                            ),
                        )
                    })
                    .collect();
                let output = if edges.is_empty() {
                    ChainOutput::None
                } else {
                    ChainOutput::Network(edges)
                };
                let members: Vec<usize> = chain
                    .vertices
                    .iter()
                    .copied()
                    .filter(|&v| !matches!(graph.vertices[v], Vertex::Source(_)))
                    .collect();
                let op_metrics: Vec<Arc<OperatorMetrics>> = members
                    .iter()
                    .map(|&v| {
                        Arc::new(OperatorMetrics {
                            is_sink: matches!(graph.vertices[v], Vertex::Sink(_)),
                            ..OperatorMetrics::default()
                        })
                    })
                    .collect();
                metrics.push(TaskMetricsHandle {
                    task: ctx.name.clone(),
                    is_source: source.is_some(),
                    metrics: ctx.metrics.clone(),
                    source: source
                        .zip(source_metrics)
                        .map(|(source, m)| (source.name.clone(), s, m)),
                    operators: members
                        .iter()
                        .zip(&op_metrics)
                        .map(|(&v, m)| (graph.vertices[v].name().to_string(), s, m.clone()))
                        .collect(),
                });
                // A Kafka source may resume at another parallelism: every subtask gets
                // all positions and takes the partitions it now owns.
                let rescaled_source = match (&checkpoint, source) {
                    (Some(cp), Some(source)) if matches!(source.input, SourceInput::Kafka(_)) => cp
                        .source_positions(&source.id)
                        .filter(|(p, _)| *p != chain.parallelism),
                    _ => None,
                };
                let restore_position = match (&checkpoint, source, &rescaled_source) {
                    (_, _, Some((_, parts))) => {
                        Some(merge_source_checkpoints(parts, kafka::merge_positions)?)
                    }
                    (Some(cp), Some(source), None) => {
                        cp.source_position(&source.id, s, chain.parallelism)?
                    }
                    _ => None,
                };
                let builder = ChainBuilder {
                    graph: self.graph.clone(),
                    plugins: self.plugins.clone(),
                    limits: self.tenant.limits.clone(),
                    usage: self.budget.usage(&self.tenant),
                    members,
                    subtask: s,
                    attempt,
                    checkpoint: checkpoint.clone(),
                    metrics: op_metrics,
                    allow_rewind: options.allow_rewind,
                };
                // A rescaled source's subtasks own other partitions than the ones that
                // finished: each finds out from its positions.
                let finished = rescaled_source.is_none()
                    && checkpoint
                        .as_ref()
                        .is_some_and(|c| c.is_finished(&chain_ids(graph, &chain.vertices), s));
                let mut task = StreamTask::new(
                    ctx,
                    graph.task.clone(),
                    input,
                    Box::new(move |ctx: &TaskContext| builder.build(ctx, output)),
                    link.clone(),
                    restore_position,
                );
                if finished {
                    task.set_finished_on_restore();
                }
                tasks.push(task);
            }
        }
        let handles: Vec<TaskHandle> = tasks.iter().map(StreamTask::handle).collect();

        let coordinator = match (&graph.checkpoint, storage) {
            (Some(settings), Some(storage)) => {
                let operator_parallelism = graph
                    .vertices
                    .iter()
                    .filter(|v| !matches!(v, Vertex::Source(_)))
                    .map(|v| (v.id().to_string(), v.parallelism()))
                    .collect();
                let sources_by_chain = chains
                    .iter()
                    .enumerate()
                    .filter_map(|(c, chain)| {
                        chain
                            .source(graph)
                            .map(|s| (c, (s.id.clone(), s.parallelism)))
                    })
                    .collect();
                let setup = CoordinatorSetup {
                    job: graph.name.clone(),
                    settings: settings.clone(),
                    // After a checkpoint restored from elsewhere, ids go on from its;
                    // never below an id an earlier attempt of the run triggered, whose
                    // barriers and staged output may still be about.
                    first_id: storage
                        .next_id()?
                        .max(checkpoint.as_ref().map_or(0, |c| c.metadata.id + 1))
                        .max(first_id),
                    protect: run.initial.as_ref().map(|c| c.path.clone()),
                    chain_vertices: chains
                        .iter()
                        .enumerate()
                        .map(|(c, chain)| (c, chain_ids(graph, &chain.vertices)))
                        .collect(),
                    storage,
                    max_parallelism: graph.max_parallelism,
                    sources_by_chain,
                    operator_parallelism,
                    sources: handles
                        .iter()
                        .filter(|h| chains[h.id().vertex].source(graph).is_some())
                        .cloned()
                        .collect(),
                    tasks: handles.clone(),
                    on_complete: self.on_checkpoint.clone(),
                    committed_before: match &checkpoint {
                        Some(c) => c.metadata.records_committed,
                        None => Some(0),
                    },
                };
                let coordinator = Coordinator::new(setup, coordinator_rx, stats);
                let span = tracing::Span::current();
                Some(
                    thread::Builder::new()
                        .name(format!("checkpoint coordinator {}", graph.name))
                        .spawn(move || span.in_scope(|| coordinator.run()))?,
                )
            }
            _ => None,
        };

        let (done_tx, done_rx) = unbounded();
        let mut threads = Vec::new();
        for task in tasks {
            let done = done_tx.clone();
            let id = task.handle().id();
            // The tasks' log lines carry the span of whoever runs the job (a server's
            // tenant and job id).
            let span = tracing::Span::current();
            threads.push(thread::Builder::new().name(task.name().to_string()).spawn(
                move || {
                    let _span = span.entered();
                    let result = catch_unwind(AssertUnwindSafe(|| task.run()))
                        .unwrap_or_else(|panic| Err(panic_to_error(panic)));
                    let _ = done.send((id, result));
                },
            )?);
        }
        Ok(RunningAttempt {
            handles,
            metrics,
            done: done_rx,
            coordinator_tx,
            coordinator,
            threads,
            writers,
        })
    }
}

/// The ids of `vertices`, head first: how checkpoints name a task.
fn chain_ids(graph: &JobGraph, vertices: &[usize]) -> Vec<String> {
    vertices
        .iter()
        .map(|&v| graph.vertices[v].id().to_string())
        .collect()
}

fn make_source(source: &SourceVertex, subtask: u32) -> Result<Box<dyn Source>> {
    Ok(match &source.input {
        SourceInput::File { path, format } => match format.format {
            Format::Avro => Box::new(AvroFileSource::open(
                path,
                format
                    .schema
                    .as_ref()
                    .map(formats::avro::with_references)
                    .transpose()?
                    .as_deref(),
            )?),
            _ => Box::new(FileSource::open(path)?.with_format(format)?),
        },
        SourceInput::Generator {
            records,
            shape,
            seed,
            rate,
        } => {
            let generated = match *shape {
                GeneratorShape::Words {
                    words_per_record,
                    vocabulary,
                } => Generated::Words {
                    words: words_per_record,
                    vocabulary,
                },
                GeneratorShape::Events {
                    keys,
                    step_ms,
                    jitter_ms,
                } => Generated::Events {
                    keys,
                    step_ms,
                    jitter_ms,
                },
            };
            Box::new(GeneratorSource::new(
                *records,
                subtask,
                source.parallelism,
                *seed,
                generated,
                *rate,
            ))
        }
        SourceInput::Stdin => Box::new(StdinSource::start()),
        SourceInput::Kafka(config) => Box::new(KafkaSource::new(
            config.clone(),
            subtask,
            source.parallelism,
        )?),
    })
}

/// Builds one task's operators on the task thread.
struct ChainBuilder {
    graph: Arc<JobGraph>,
    plugins: Arc<BTreeMap<String, Plugin>>,
    limits: SandboxLimits,
    /// What the tenant's instances hold in this host.
    usage: Arc<TenantUsage>,
    /// Vertex indices of the chain's operators (the source excluded).
    members: Vec<usize>,
    subtask: u32,
    attempt: u32,
    checkpoint: Option<Arc<LoadedCheckpoint>>,
    metrics: Vec<Arc<OperatorMetrics>>,
    allow_rewind: bool,
}

/// A fresh state for an operator instance with keyed state `keyed` (when its input is
/// keyed), and an account within `limits`.
fn fresh_state(
    keyed: Option<KeyedState>,
    limits: &SandboxLimits,
    usage: &Arc<TenantUsage>,
) -> OperatorState {
    let mut state = OperatorState::new(keyed);
    state.account = Account::new(
        InstanceLimits {
            state_bytes: limits.max_state_bytes,
            timers: limits.max_timers,
            counters: limits.max_counters,
            string_bytes: limits.max_guest_string_bytes,
        },
        Some(usage.clone()),
    );
    state
}

/// An empty keyed state for subtask `subtask` of vertex `id`, in the backend the job
/// asks for or else its tenant's default.
fn keyed_state(
    graph: &JobGraph,
    limits: &SandboxLimits,
    id: &str,
    subtask: u32,
    parallelism: u32,
) -> Result<KeyedState> {
    let groups = key_groups_of_subtask(subtask, parallelism, graph.max_parallelism);
    let backend = match graph.state.backend {
        Some(backend) => backend,
        None => limits.state_backend,
    };
    if backend == BackendKind::Heap {
        return Ok(KeyedState::heap(graph.max_parallelism, groups));
    }
    let memory = graph.state.memory_bytes;
    if memory > limits.max_state_bytes {
        bail!(
            "the RocksDB state of each operator instance is given {} MiB (`[state] memory_mb`), \
             more than the {} MiB of state the tenant's instances may hold (`state_mb`)",
            memory >> 20,
            limits.max_state_bytes >> 20
        );
    }
    let unique = format!(
        "{}-{}",
        crate::checkpoint::state_file_name(id, subtask),
        uuid::Uuid::new_v4().simple()
    );
    let (dir, shared) = match &graph.checkpoint {
        Some(c) => {
            let storage = crate::checkpoint::CheckpointStorage::new(&c.dir)?;
            (storage.working().join(unique), Some(storage.shared()))
        }
        None => {
            let base = state_base(graph);
            std::fs::create_dir_all(&base)
                .with_context(|| format!("creating the state folder {}", base.display()))?;
            let pid = std::process::id();
            (base.join(format!("{STATE_FOLDER}{pid}-{unique}")), None)
        }
    };
    let config = LsmConfig {
        dir,
        memory_bytes: memory,
        shared,
    };
    KeyedState::lsm(config, graph.max_parallelism, groups)
}

/// The start of the name of a RocksDB instance's folder of a job without checkpoints,
/// before the id of the process that runs it.
const STATE_FOLDER: &str = "sluice-state-";

/// Where the RocksDB instances of a job without checkpoints keep their folders.
pub(super) fn state_base(graph: &JobGraph) -> std::path::PathBuf {
    graph.state.dir.clone().unwrap_or_else(std::env::temp_dir)
}

/// Deletes the folders in `base` of RocksDB instances whose process is gone (killed
/// before it could delete them): no one else reads them. Where processes cannot be
/// looked up (no `/proc`), nothing is deleted.
pub(super) fn clear_abandoned_state(base: &Path) {
    if !Path::new("/proc/self").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = (name.to_str())
            .and_then(|n| n.strip_prefix(STATE_FOLDER))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        if let Err(e) = std::fs::remove_dir_all(entry.path()) {
            tracing::warn!(
                "could not delete the abandoned state folder {}: {e}",
                entry.path().display()
            );
        }
    }
}

impl Job {
    /// Opens one instance of each operator with the job's configuration, as a run
    /// would, and disposes of it: what an operator refuses in `open` (a bad config key
    /// or value, keyed state on unkeyed input) is reported before anything runs.
    pub fn check_open(&self) -> Result<()> {
        let graph = &self.graph;
        let usage = self.budget.usage(&self.tenant);
        for (v, vertex) in graph.vertices.iter().enumerate() {
            let Vertex::Operator(o) = vertex else {
                continue;
            };
            let keyed = o.key_by.is_some();
            let identity = OperatorIdentity {
                tenant: graph.tenant.clone(),
                job: graph.name.clone(),
                operator: o.name.clone(),
                subtask: 0,
                parallelism: o.parallelism,
            };
            // (Opened to be checked, not run: its keyed state is on the heap.)
            let groups = key_groups_of_subtask(0, o.parallelism, graph.max_parallelism);
            let backend = keyed.then(|| KeyedState::heap(graph.max_parallelism, groups));
            let state = fresh_state(backend, &self.tenant.limits, &usage);
            let mut instance = self.plugins[&o.name].instantiate(
                identity.clone(),
                self.tenant.limits.clone(),
                state,
                Arc::new(AtomicBool::new(false)),
            )?;
            let opened = instance.open(&OpenInfo {
                job: graph.name.clone(),
                operator: o.name.clone(),
                config: o.config.clone(),
                subtask: 0,
                parallelism: o.parallelism,
                max_parallelism: graph.max_parallelism,
                keyed,
                restored_state: None,
                attempt: 0,
                inputs: graph.inputs_of(v),
            });
            let declared = instance.state().outputs.clone();
            let disposed = instance.dispose();
            opened.map_err(|e| anyhow!("{identity}: `open` with the job's config: {e}"))?;
            disposed.map_err(|e| anyhow!("{identity}: `dispose`: {e}"))?;
            for side in graph.read_side_outputs(v) {
                if !declared.iter().any(|d| d == side) {
                    bail!("{identity}: {}", undeclared_side_output(side, &declared));
                }
            }
        }
        Ok(())
    }
}

/// The checkpointed states of old subtasks, by old subtask index.
type OldStates = Vec<(u32, Vec<u8>)>;

/// When operator `id` was checkpointed at another parallelism than `parallelism`: the
/// states of the old subtasks that subtask `subtask` takes over, `(old, state)` for each
/// old subtask with `old % parallelism == subtask`.
fn adopted_states(
    checkpoint: &LoadedCheckpoint,
    id: &str,
    subtask: u32,
    parallelism: u32,
) -> Result<Option<OldStates>> {
    let Some(op) = checkpoint.operator(id) else {
        return Ok(None);
    };
    if op.parallelism == parallelism {
        return Ok(None);
    }
    let mut parts = Vec::new();
    for h in op
        .subtasks
        .iter()
        .filter(|h| h.subtask % parallelism == subtask)
    {
        parts.push((h.subtask, checkpoint.read_state(h)?.state));
    }
    Ok(Some(parts))
}

impl ChainBuilder {
    fn build(self, ctx: &TaskContext, output: ChainOutput) -> Result<OperatorChain> {
        let graph = &self.graph;
        let mut operators = Vec::new();
        for (&v, metrics) in self.members.iter().zip(&self.metrics) {
            let parallelism = graph.vertices[v].parallelism();
            let name = graph.vertices[v].name().to_string();
            let identity = OperatorIdentity {
                tenant: graph.tenant.clone(),
                job: graph.name.clone(),
                operator: name.clone(),
                subtask: self.subtask,
                parallelism,
            };
            let keyed = matches!(&graph.vertices[v], Vertex::Operator(o) if o.key_by.is_some());
            let id = graph.vertices[v].id();
            // An exactly-once Kafka sink at another parallelism takes over old subtasks'
            // pending checkpoints whole (`old % new == this`); other state is assigned
            // (an at-least-once sink has none).
            let kafka_sink = matches!(
                &graph.vertices[v],
                Vertex::Sink(s) if s.kafka.as_ref().is_some_and(|k| k.delivery == Delivery::ExactlyOnce)
            );
            let adopted = match (&self.checkpoint, kafka_sink) {
                (Some(c), true) => adopted_states(c, id, self.subtask, parallelism)
                    .with_context(|| format!("restoring {identity}"))?,
                _ => None,
            };
            let restore = match &self.checkpoint {
                Some(_) if adopted.is_some() => None,
                Some(c) => assign_operator_state(
                    c,
                    id,
                    self.subtask,
                    parallelism,
                    keyed,
                    graph.has_broadcast_state(v),
                )
                .with_context(|| format!("restoring {identity}"))?,
                None => None,
            };
            let mut open_info = OpenInfo {
                job: graph.name.clone(),
                operator: name.clone(),
                config: Vec::new(),
                subtask: self.subtask,
                parallelism,
                max_parallelism: graph.max_parallelism,
                keyed,
                restored_state: None,
                attempt: self.attempt,
                inputs: graph.inputs_of(v),
            };
            let operator: Box<dyn Operator> = match &graph.vertices[v] {
                Vertex::Operator(o) => {
                    let keyed_state = keyed
                        .then(|| keyed_state(graph, &self.limits, id, self.subtask, parallelism))
                        .transpose()
                        .with_context(|| format!("opening the keyed state of {identity}"))?;
                    let mut state = fresh_state(keyed_state, &self.limits, &self.usage);
                    state.share_counters(metrics.counters.clone());
                    if let Some(r) = restore {
                        state.watermark = r.watermark;
                        state.timers = match state.keyed.as_mut() {
                            Some(b) => b
                                .restore(&r.keyed, r.timers)
                                .with_context(|| format!("restoring {identity}"))?,
                            None => r.timers,
                        };
                        open_info.restored_state = r.state;
                    }
                    // What it restored counts against its limits from the start.
                    state
                        .settle(crate::timers::now_millis(), 0)
                        .map_err(|e| anyhow!("restoring {identity}: {e}"))?;
                    open_info.config = o.config.clone();
                    let plugin = &self.plugins[&o.name];
                    Box::new(plugin.instantiate(
                        identity,
                        self.limits.clone(),
                        state,
                        ctx.cancel.clone(),
                    )?)
                }
                Vertex::Sink(sink) => {
                    open_info.restored_state = restore.and_then(|r| r.state);
                    let mut sink: Box<dyn Operator> = match sink.kind {
                        SinkKind::File => {
                            let file = FileSink::new(
                                identity,
                                sink.path.as_deref().expect("file sinks have a path"),
                                sink.format,
                                graph.checkpoint.is_some(),
                                self.allow_rewind,
                            );
                            Box::new(match &sink.file_format {
                                Some(output) => file.with_output(output)?,
                                None => file,
                            })
                        }
                        SinkKind::Stdout => Box::new(StdoutSink::new(identity, sink.format)),
                        SinkKind::Kafka => Box::new(
                            KafkaSink::adopting(
                                identity,
                                sink.kafka.clone().expect("kafka sinks have their config"),
                                self.subtask,
                                adopted.unwrap_or_default(),
                            )
                            .with_cancel(ctx.cancel.clone()),
                        ),
                    };
                    // Sinks that count what they write show it with the operators' counters.
                    sink.state().counters = metrics.counters.clone();
                    // What a sink holds for checkpoints (a Kafka sink's records) is the
                    // tenant's, as keyed state is; its own bound is the sink's setting.
                    sink.state().account =
                        Account::new(InstanceLimits::default(), Some(self.usage.clone()));
                    sink
                }
                Vertex::Source(_) => {
                    unreachable!("the source is the task's input, not a chain member")
                }
            };
            operators.push(ChainedOperator {
                operator,
                state_id: id.to_string(),
                open_info,
                metrics: metrics.clone(),
            });
        }
        Ok(OperatorChain::new(operators, output, ctx.metrics.clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_state_folders_of_processes_that_are_gone_are_deleted() {
        let base = tempfile::tempdir().unwrap();
        let mine = format!("{STATE_FOLDER}{}-count-0-abc", std::process::id());
        // Process ids stay below 2^22 on Linux.
        let gone = format!("{STATE_FOLDER}{}-count-0-def", u32::MAX);
        for name in [&mine, &gone, "sluice-state-notes", "unrelated"] {
            std::fs::create_dir_all(base.path().join(name).join("db")).unwrap();
        }
        clear_abandoned_state(base.path());
        let mut left: Vec<String> = std::fs::read_dir(base.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, [mine.as_str(), "sluice-state-notes", "unrelated"]);
    }
}
