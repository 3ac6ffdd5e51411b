//! Running a job on this machine: tasks as threads connected by bounded channels, a
//! checkpoint coordinator, and restarts from the latest checkpoint after a failure.

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use crossbeam_channel::{Receiver, Sender, select, unbounded};

use super::graph::{JobGraph, Vertex};
use crate::chain::{
    CallError, ChainOutput, ChainedOperator, OpenInfo, Operator, OperatorChain, OperatorFailure,
    OperatorIdentity, OperatorState,
};
use crate::checkpoint::{
    AsyncPool, CheckpointLink, CheckpointStats, CheckpointStorage, Coordinator, CoordinatorMessage,
    CoordinatorSetup, LoadedCheckpoint, TaskId,
};
use crate::connectors::{
    FileSink, FileSource, Generated, GeneratorSource, Source, StdinSource, StdoutSink,
};
use crate::job::file::{JobFile, SinkKind};
use crate::job::graph::{GeneratorShape, SourceInput, SourceVertex};
use crate::metrics::{OperatorMetrics, TaskMetrics, TaskMetricsHandle, TaskReport};
use crate::network::{InputGate, Partitioner, RecordWriter, UpstreamFailed, channel};
use crate::state::KeyedStateBackend;
use crate::state::key_groups::key_groups_of_subtask;
use crate::task::{
    SourceReader, StreamTask, TaskContext, TaskHandle, TaskInput, TaskOutcome, panic_to_error,
};
use crate::tenant::{HostConfig, InstanceBudget, TenantConfig};
use crate::wasm::{Plugin, SandboxLimits, WasmEngine};

/// Where a job starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestorePoint {
    /// From scratch.
    Fresh,
    /// From the newest complete checkpoint or savepoint in the job's checkpoint directory.
    Latest,
    /// From this checkpoint or savepoint folder.
    Path(PathBuf),
}

/// Requests to a running job.
#[derive(Debug)]
pub enum JobControl {
    /// Take a savepoint, then finish; `drain` first advances event time to the end.
    StopWithSavepoint {
        /// Fire all event-time timers first.
        drain: bool,
        /// Gets the savepoint folder, or why it failed.
        reply: Sender<Result<PathBuf, String>>,
    },
    /// Stop now, without a savepoint.
    Cancel,
}

/// How a job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobOutcome {
    /// The input ended and everything was committed.
    Finished,
    /// Stopped with a savepoint.
    Stopped {
        /// The savepoint folder.
        savepoint: PathBuf,
    },
    /// Cancelled.
    Cancelled,
}

/// What a finished job reports.
#[derive(Debug, Clone)]
pub struct JobReport {
    /// How it ended.
    pub outcome: JobOutcome,
    /// Restarts after failures.
    pub restarts: u32,
    /// Wall time of the whole run.
    pub duration: Duration,
    /// Task metrics of the last attempt.
    pub tasks: Vec<TaskReport>,
    /// Checkpoints of the last attempt.
    pub checkpoints: CheckpointStats,
    /// The failures that caused restarts.
    pub failures: Vec<String>,
    /// Operator calls that a cancellation interrupted.
    pub interrupted: Vec<String>,
    /// Failures of attempts by kind (`panic`, `deadline`, `memory`, `error`, ...).
    pub failures_by_kind: BTreeMap<String, u64>,
}

/// A live view of a running job, for progress lines and status endpoints.
#[derive(Default)]
pub struct JobMonitor {
    tasks: Mutex<Vec<TaskMetricsHandle>>,
    checkpoints: Mutex<Arc<Mutex<CheckpointStats>>>,
    attempt: AtomicU32,
    running: AtomicBool,
    interrupted: Mutex<Vec<String>>,
    failures_by_kind: Mutex<BTreeMap<String, u64>>,
    last_failure_at: Mutex<Option<Instant>>,
    last_failure: Mutex<Option<String>>,
}

impl JobMonitor {
    /// Metrics of the current attempt's tasks.
    pub fn tasks(&self) -> Vec<TaskReport> {
        lock(&self.tasks)
            .iter()
            .map(TaskMetricsHandle::report)
            .collect()
    }

    /// Records read by the sources and written into the sink in the current attempt.
    pub fn records_read_written(&self) -> (u64, u64) {
        let tasks = self.tasks();
        let read = tasks
            .iter()
            .filter(|t| t.is_source)
            .map(|t| t.records_in)
            .sum();
        let written = tasks
            .iter()
            .flat_map(|t| &t.operators)
            .filter(|o| o.operator == "sink")
            .map(|o| o.records_in)
            .sum();
        (read, written)
    }

    /// Checkpoints of the current attempt.
    pub fn checkpoints(&self) -> CheckpointStats {
        lock(&lock(&self.checkpoints)).clone()
    }

    /// Current attempt (0 before any restart).
    pub fn attempt(&self) -> u32 {
        self.attempt.load(Ordering::Relaxed)
    }

    /// True while tasks run.
    pub fn is_running(&self) -> bool {
        self.running.load(Ordering::Relaxed)
    }

    /// Failures of attempts so far, by kind.
    pub fn failures_by_kind(&self) -> BTreeMap<String, u64> {
        lock(&self.failures_by_kind).clone()
    }

    /// When the supervisor last learned that a task failed (the start of a recovery).
    pub fn last_failure_at(&self) -> Option<Instant> {
        *lock(&self.last_failure_at)
    }

    /// The error that ended the last failed attempt.
    pub fn last_failure(&self) -> Option<String> {
        lock(&self.last_failure).clone()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A loaded, validated job with its plugins compiled for its tenant.
pub struct Job {
    graph: Arc<JobGraph>,
    plugins: Arc<BTreeMap<String, Plugin>>,
    tenant: TenantConfig,
    budget: InstanceBudget,
}

enum AttemptEnd {
    Outcome(JobOutcome),
    Failed(anyhow::Error),
}

impl Job {
    /// Reads, validates and compiles the job at `path`, under the default host
    /// configuration.
    pub fn load(path: &Path, engine: Arc<WasmEngine>) -> Result<Job> {
        Self::load_with(path, &engine, &HostConfig::default())
    }

    /// Reads, validates and compiles the job at `path` under `host`'s configuration of
    /// its tenant.
    pub fn load_with(path: &Path, engine: &WasmEngine, host: &HostConfig) -> Result<Job> {
        let file = JobFile::load(path)?;
        let graph = JobGraph::from_file(&file, path)?;
        Self::from_graph(graph, engine, host)
    }

    /// Loads the plugins of a validated graph.
    pub fn from_graph(graph: JobGraph, engine: &WasmEngine, host: &HostConfig) -> Result<Job> {
        let tenant = host
            .tenant(&graph.tenant)
            .with_context(|| format!("job '{}'", graph.name))?;
        let fuel = tenant.limits.fuel_per_call.is_some();
        let mut plugins = BTreeMap::new();
        for op in graph.operators() {
            let plugin = engine
                .load_plugin_for(&op.plugin, fuel)
                .with_context(|| format!("job '{}': operator '{}'", graph.name, op.name))?;
            plugins.insert(op.name.clone(), plugin);
        }
        Ok(Job {
            graph: Arc::new(graph),
            plugins: Arc::new(plugins),
            tenant,
            budget: InstanceBudget::default(),
        })
    }

    /// Replaces the sandbox limits of every operator instance (the tenant's by default).
    /// A fuel budget needs plugins loaded for fuel metering.
    pub fn with_limits(mut self, limits: SandboxLimits) -> Self {
        self.tenant.limits = limits;
        self
    }

    /// Counts this job's operator instances against a budget shared with other jobs of
    /// the host.
    pub fn with_budget(mut self, budget: InstanceBudget) -> Self {
        self.budget = budget;
        self
    }

    /// The tenant the job runs for.
    pub fn tenant(&self) -> &TenantConfig {
        &self.tenant
    }

    /// Number of Wasm operator instances the job runs.
    pub fn instances(&self) -> u32 {
        self.graph.operators().map(|o| o.parallelism).sum()
    }

    /// The validated graph.
    pub fn graph(&self) -> &JobGraph {
        &self.graph
    }

    /// The compiled plugins, by operator name.
    pub fn plugins(&self) -> &BTreeMap<String, Plugin> {
        &self.plugins
    }

    /// Runs the job to its end, restarting after failures as its strategy allows.
    pub fn run(
        &self,
        restore: RestorePoint,
        control: &Receiver<JobControl>,
        monitor: &JobMonitor,
    ) -> Result<JobReport> {
        let graph = &self.graph;
        let _instances = self
            .budget
            .reserve(&self.tenant, self.instances(), &graph.name)?;
        let storage = graph
            .checkpoint
            .as_ref()
            .map(|c| CheckpointStorage::new(&c.dir).map(Arc::new))
            .transpose()?;
        let started = Instant::now();
        let mut failures = Vec::new();
        let initial = match &restore {
            RestorePoint::Fresh => None,
            RestorePoint::Latest => {
                let storage = storage.as_ref().ok_or_else(|| {
                    anyhow!("--from-checkpoint needs checkpointing: add a [checkpoint] table to the job file")
                })?;
                let latest = storage.find_latest()?;
                if latest.is_none() {
                    bail!(
                        "no complete checkpoint to restore from in {}",
                        storage.dir().display()
                    );
                }
                latest
            }
            RestorePoint::Path(p) => Some(crate::checkpoint::load(p)?),
        };
        let mut checkpoint = initial.clone();
        for attempt in 0u32.. {
            monitor.attempt.store(attempt, Ordering::Relaxed);
            if let Some(c) = &checkpoint {
                self.check_restorable(c)?;
                tracing::info!(
                    "job '{}': restoring from {} {} ({})",
                    graph.name,
                    if c.metadata.kind == crate::checkpoint::SnapshotKind::Savepoint {
                        "savepoint"
                    } else {
                        "checkpoint"
                    },
                    c.metadata.id,
                    c.path.display()
                );
            }
            let stats = Arc::new(Mutex::new(CheckpointStats::default()));
            *lock(&monitor.checkpoints) = stats.clone();
            let end = self.run_attempt(
                attempt,
                checkpoint.clone().map(Arc::new),
                storage.clone(),
                control,
                monitor,
                stats.clone(),
            );
            let report = |outcome, failures: &Vec<String>| JobReport {
                outcome,
                restarts: attempt,
                duration: started.elapsed(),
                tasks: monitor.tasks(),
                checkpoints: lock(&stats).clone(),
                failures: failures.clone(),
                interrupted: lock(&monitor.interrupted).clone(),
                failures_by_kind: monitor.failures_by_kind(),
            };
            let error = match end {
                AttemptEnd::Outcome(outcome) => return Ok(report(outcome, &failures)),
                AttemptEnd::Failed(e) => e,
            };
            *lock(&monitor.failures_by_kind)
                .entry(failure_kind(&error).to_string())
                .or_default() += 1;
            *lock(&monitor.last_failure) = Some(format!("{error:#}"));
            let restart = attempt + 1;
            let delay = if is_permanent(&error) {
                None
            } else {
                graph.restart.delay_before(restart)
            };
            let Some(delay) = delay else {
                let context = if attempt == 0 {
                    format!("job '{}' failed", graph.name)
                } else {
                    format!("job '{}' failed after {attempt} restarts", graph.name)
                };
                return Err(error.context(context));
            };
            tracing::warn!(
                "job '{}' failed (attempt {}): {error:#}; restarting in {delay:?}",
                graph.name,
                attempt + 1
            );
            failures.push(format!("{error:#}"));
            if let Ok(JobControl::Cancel) = control.recv_timeout(delay) {
                return Ok(report(JobOutcome::Cancelled, &failures));
            }
            // Restart from the newest checkpoint, or where the job started.
            checkpoint = match &storage {
                Some(s) => s.find_latest()?.or_else(|| initial.clone()),
                None => None,
            };
        }
        unreachable!("the restart loop returns")
    }

    /// Refuses checkpoints that do not fit this job.
    fn check_restorable(&self, c: &LoadedCheckpoint) -> Result<()> {
        let graph = &self.graph;
        let known: Vec<&str> = graph
            .vertices
            .iter()
            .filter(|v| !matches!(v, Vertex::Source(_)))
            .map(Vertex::name)
            .collect();
        for op in &c.metadata.operators {
            if !known.contains(&op.name.as_str()) {
                bail!(
                    "{} has state for operator '{}', which job '{}' does not have (operators: {})",
                    c.path.display(),
                    op.name,
                    graph.name,
                    known.join(", ")
                );
            }
        }
        if c.metadata.max_parallelism != graph.max_parallelism {
            bail!(
                "{} was taken with max_parallelism {}, but the job has {}; key groups cannot be remapped",
                c.path.display(),
                c.metadata.max_parallelism,
                graph.max_parallelism
            );
        }
        Ok(())
    }

    fn run_attempt(
        &self,
        attempt: u32,
        checkpoint: Option<Arc<LoadedCheckpoint>>,
        storage: Option<Arc<CheckpointStorage>>,
        control: &Receiver<JobControl>,
        monitor: &JobMonitor,
        stats: Arc<Mutex<CheckpointStats>>,
    ) -> AttemptEnd {
        match self.start_attempt(attempt, checkpoint, storage, stats) {
            Ok(running) => running.supervise(control, monitor),
            Err(e) => AttemptEnd::Failed(e),
        }
    }

    fn start_attempt(
        &self,
        attempt: u32,
        checkpoint: Option<Arc<LoadedCheckpoint>>,
        storage: Option<Arc<CheckpointStorage>>,
        stats: Arc<Mutex<CheckpointStats>>,
    ) -> Result<RunningAttempt> {
        let graph = &self.graph;
        let chains = &graph.chains;
        let mode = graph
            .checkpoint
            .as_ref()
            .map(|c| c.mode)
            .unwrap_or_default();

        // Channels: for every edge into chain `c`, one channel per pair of connected
        // subtasks (forward edges connect subtask i to subtask i only). `senders[u][s]`
        // are the channels of subtask `s` of chain `u` (every chain has at most one
        // downstream chain); `receivers[c][d]` those into subtask `d` of chain `c`.
        let mut senders: Vec<Vec<Vec<Sender<_>>>> = chains
            .iter()
            .map(|c| vec![Vec::new(); c.parallelism as usize])
            .collect();
        let mut receivers: Vec<Vec<Vec<Receiver<_>>>> = chains
            .iter()
            .map(|c| vec![Vec::new(); c.parallelism as usize])
            .collect();
        for (c, chain) in chains.iter().enumerate() {
            for (u, partitioner) in &chain.inputs {
                for (from, outbox) in senders[*u].iter_mut().enumerate() {
                    for (to, inbox) in receivers[c].iter_mut().enumerate() {
                        if *partitioner == Partitioner::Forward && from != to {
                            continue;
                        }
                        let (tx, rx) = channel(graph.network.channel_capacity);
                        outbox.push(tx);
                        inbox.push(rx);
                    }
                }
            }
        }

        let (coordinator_tx, coordinator_rx) = unbounded();
        let link = match (&graph.checkpoint, &storage) {
            (Some(_), Some(storage)) => Some(CheckpointLink::new(
                coordinator_tx.clone(),
                storage.clone(),
                Arc::new(AsyncPool::new(2)),
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
                let input = match source {
                    Some(source) => TaskInput::Source(SourceReader::new(
                        make_source(source, s)?,
                        source.event_time.clone(),
                        source.idle_timeout,
                    )),
                    None => TaskInput::Network(InputGate::new(
                        std::mem::take(&mut receivers[c][s as usize]),
                        mode,
                    )),
                };
                let output = match graph.downstream_of(c) {
                    Some((_, partitioner)) => ChainOutput::Network(RecordWriter::new(
                        std::mem::take(&mut senders[c][s as usize]),
                        partitioner.clone(),
                        &graph.network,
                        ctx.cancel.clone(),
                        ctx.metrics.clone(),
                    )),
                    None => ChainOutput::None,
                };
                let members: Vec<usize> = chain
                    .vertices
                    .iter()
                    .copied()
                    .filter(|&v| !matches!(graph.vertices[v], Vertex::Source(_)))
                    .collect();
                let op_metrics: Vec<Arc<OperatorMetrics>> =
                    members.iter().map(|_| Arc::default()).collect();
                metrics.push(TaskMetricsHandle {
                    task: ctx.name.clone(),
                    is_source: source.is_some(),
                    metrics: ctx.metrics.clone(),
                    operators: members
                        .iter()
                        .zip(&op_metrics)
                        .map(|(&v, m)| (graph.vertices[v].name().to_string(), s, m.clone()))
                        .collect(),
                });
                let restore_position = match (&checkpoint, source) {
                    (Some(cp), Some(source)) => {
                        cp.source_position(&source.name, s, chain.parallelism)?
                    }
                    _ => None,
                };
                let builder = ChainBuilder {
                    graph: self.graph.clone(),
                    plugins: self.plugins.clone(),
                    limits: self.tenant.limits.clone(),
                    members,
                    subtask: s,
                    attempt,
                    checkpoint: checkpoint.clone(),
                    metrics: op_metrics,
                };
                let task = StreamTask::new(
                    ctx,
                    graph.task.clone(),
                    input,
                    Box::new(move |ctx: &TaskContext| builder.build(ctx, output)),
                    link.clone(),
                    restore_position,
                );
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
                    .map(|v| (v.name().to_string(), v.parallelism()))
                    .collect();
                let sources_by_chain = chains
                    .iter()
                    .enumerate()
                    .filter_map(|(c, chain)| {
                        chain
                            .source(graph)
                            .map(|s| (c, (s.name.clone(), s.parallelism)))
                    })
                    .collect();
                let setup = CoordinatorSetup {
                    job: graph.name.clone(),
                    settings: settings.clone(),
                    first_id: storage.next_id()?,
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
        })
    }
}

/// Tasks of one attempt, running.
struct RunningAttempt {
    handles: Vec<TaskHandle>,
    metrics: Vec<TaskMetricsHandle>,
    done: Receiver<(TaskId, Result<TaskOutcome>)>,
    coordinator_tx: Sender<CoordinatorMessage>,
    coordinator: Option<thread::JoinHandle<()>>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl RunningAttempt {
    /// Waits for every task, cancelling all on the first failure; handles control
    /// requests meanwhile.
    fn supervise(self, control: &Receiver<JobControl>, monitor: &JobMonitor) -> AttemptEnd {
        *lock(&monitor.tasks) = self.metrics.clone();
        lock(&monitor.interrupted).clear();
        monitor.running.store(true, Ordering::Relaxed);
        let mut remaining = self.handles.len();
        let mut first_error: Option<anyhow::Error> = None;
        let mut cancelled = false;
        let mut savepoint: Option<PathBuf> = None;
        let (stop_tx, stop_rx) = unbounded::<Result<PathBuf, String>>();
        let mut stop_reply: Option<Sender<Result<PathBuf, String>>> = None;
        let cancel_all = |handles: &[TaskHandle]| handles.iter().for_each(TaskHandle::cancel);
        while remaining > 0 {
            select! {
                recv(self.done) -> msg => {
                    let Ok((id, result)) = msg else { break };
                    remaining -= 1;
                    match result {
                        Ok(TaskOutcome::Finished) => {
                            let _ = self.coordinator_tx.send(CoordinatorMessage::TaskFinished(id));
                        }
                        Ok(TaskOutcome::Cancelled { interrupted }) => {
                            lock(&monitor.interrupted).extend(interrupted);
                        }
                        Err(e) => match &first_error {
                            None if !cancelled => {
                                *lock(&monitor.last_failure_at) = Some(Instant::now());
                                tracing::error!("{e:#}");
                                first_error = Some(e);
                                cancel_all(&self.handles);
                            }
                            // A task downstream of the failed one may report first; the
                            // failed task's own error is the cause.
                            Some(first) if explains_better(&e, first) => {
                                tracing::error!("{e:#}");
                                first_error = Some(e);
                            }
                            _ => tracing::debug!("secondary task failure: {e:#}"),
                        },
                    }
                }
                recv(control) -> msg => match msg {
                    Ok(JobControl::Cancel) => {
                        cancelled = true;
                        cancel_all(&self.handles);
                    }
                    Ok(JobControl::StopWithSavepoint { drain, reply }) => {
                        if self.coordinator.is_none() {
                            let _ = reply.send(Err("stop-with-savepoint needs a [checkpoint] table in the job file".into()));
                        } else {
                            stop_reply = Some(reply);
                            let _ = self.coordinator_tx.send(CoordinatorMessage::TriggerSavepoint {
                                stop: true,
                                drain,
                                reply: stop_tx.clone(),
                            });
                        }
                    }
                    Err(_) => {}
                },
                recv(stop_rx) -> msg => {
                    if let Ok(result) = msg {
                        if let Ok(path) = &result {
                            savepoint = Some(path.clone());
                        }
                        if let Some(reply) = stop_reply.take() {
                            let _ = reply.send(result);
                        }
                    }
                }
            }
        }
        monitor.running.store(false, Ordering::Relaxed);
        // A savepoint reply may still wait: the tasks of a stop-with-savepoint end as soon
        // as they are notified, which can be before the loop above saw the reply.
        if let Ok(result) = stop_rx.try_recv() {
            if let Ok(path) = &result {
                savepoint = Some(path.clone());
            }
            if let Some(reply) = stop_reply.take() {
                let _ = reply.send(result);
            }
        }
        let _ = self.coordinator_tx.send(CoordinatorMessage::Shutdown);
        if let Some(c) = self.coordinator {
            let _ = c.join();
        }
        for t in self.threads {
            let _ = t.join();
        }
        match (first_error, cancelled, savepoint) {
            (Some(e), _, _) => AttemptEnd::Failed(e),
            (None, true, _) => AttemptEnd::Outcome(JobOutcome::Cancelled),
            (None, false, Some(savepoint)) => {
                AttemptEnd::Outcome(JobOutcome::Stopped { savepoint })
            }
            (None, false, None) => AttemptEnd::Outcome(JobOutcome::Finished),
        }
    }
}

/// What kind of failure ended an attempt, for metrics.
pub fn failure_kind(e: &anyhow::Error) -> &'static str {
    let failure = e.chain().find_map(|c| c.downcast_ref::<OperatorFailure>());
    match failure.map(|f| &f.error) {
        Some(CallError::Trap { kind, .. }) => kind.as_str(),
        Some(CallError::InvalidConfig(_)) => "invalid-config",
        Some(CallError::Failed(_)) => "error",
        Some(CallError::Contract(_)) => "contract",
        None => "host",
    }
}

/// True when a task failed only because a task feeding it did.
fn is_upstream_failure(e: &anyhow::Error) -> bool {
    e.chain().any(|c| c.is::<UpstreamFailed>())
}

/// Whether task failure `new` explains an attempt's failure better than `first`, the
/// one reported first: a task's own failure does, over one that only says its upstream
/// failed.
fn explains_better(new: &anyhow::Error, first: &anyhow::Error) -> bool {
    is_upstream_failure(first) && !is_upstream_failure(new)
}

/// True for failures a restart cannot fix (an operator rejected its configuration).
fn is_permanent(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<OperatorFailure>()
            .is_some_and(|f| f.error.is_permanent())
            || c.downcast_ref::<CallError>()
                .is_some_and(CallError::is_permanent)
    })
}

fn make_source(source: &SourceVertex, subtask: u32) -> Result<Box<dyn Source>> {
    Ok(match &source.input {
        SourceInput::File(path) => Box::new(FileSource::open(path)?),
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
    })
}

/// Builds one task's operators on the task thread.
struct ChainBuilder {
    graph: Arc<JobGraph>,
    plugins: Arc<BTreeMap<String, Plugin>>,
    limits: SandboxLimits,
    /// Vertex indices of the chain's operators (the source excluded).
    members: Vec<usize>,
    subtask: u32,
    attempt: u32,
    checkpoint: Option<Arc<LoadedCheckpoint>>,
    metrics: Vec<Arc<OperatorMetrics>>,
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
            let restore = match &self.checkpoint {
                Some(c) => c
                    .operator_restore(&name, self.subtask, parallelism, keyed)
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
            };
            let operator: Box<dyn Operator> = match &graph.vertices[v] {
                Vertex::Operator(o) => {
                    let mut backend = keyed.then(|| {
                        KeyedStateBackend::new(
                            graph.max_parallelism,
                            key_groups_of_subtask(self.subtask, parallelism, graph.max_parallelism),
                        )
                    });
                    let mut state = OperatorState::new(None);
                    state.counters = metrics.counters.clone();
                    if let Some(r) = restore {
                        state.watermark = r.watermark;
                        if let Some(b) = backend.as_mut() {
                            for snapshot in &r.keyed {
                                b.restore(snapshot)
                                    .map_err(|e| anyhow!("restoring {identity}: {e}"))?;
                            }
                        }
                        state.timers = r.timers;
                        open_info.restored_state = r.state;
                    }
                    state.keyed = backend;
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
                    match sink.kind {
                        SinkKind::File => Box::new(FileSink::new(
                            identity,
                            sink.path.as_deref().expect("file sinks have a path"),
                            sink.format,
                            graph.checkpoint.is_some(),
                        )),
                        SinkKind::Stdout => Box::new(StdoutSink::new(identity, sink.format)),
                    }
                }
                Vertex::Source(_) => {
                    unreachable!("the source is the task's input, not a chain member")
                }
            };
            operators.push(ChainedOperator {
                operator,
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
    fn a_tasks_own_failure_explains_more_than_its_downstreams() {
        let upstream = || {
            anyhow::Error::from(UpstreamFailed { channel: 0 }).context("task count -> sink (1/1)")
        };
        let cause = || anyhow!("operator 'suspect': snapshot: the call deadline passed");
        assert!(explains_better(&cause(), &upstream()));
        assert!(!explains_better(&upstream(), &cause()));
        assert!(!explains_better(&upstream(), &upstream()));
        assert!(!explains_better(&cause(), &cause()));
    }
}
