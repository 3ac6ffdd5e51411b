//! Running a job on this machine: where a run starts, and the restart loop that owns
//! the lineage of checkpoints the run may restore from. Deployment of an attempt is in
//! `deploy`, its supervision in `supervisor`.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use crossbeam_channel::Receiver;
use parking_lot::Mutex;

use super::coordinator::{CheckpointHook, CheckpointStats};
use super::graph::JobGraph;
use super::monitor::JobMonitor;
use super::ownership::{RunLocks, lock_run};
use super::run::{JobControl, JobFailed, JobOutcome, RunOptions};
use super::start::{check_start, prepare_run};
use super::supervisor::{AttemptEnd, failure_kind, is_permanent};
use crate::checkpoint::SnapshotKind;
use crate::metrics::TaskReport;
use crate::tenant::{HostConfig, InstanceBudget, TenantConfig};
use crate::wasm::{Plugin, SandboxLimits, WasmEngine};

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

/// A loaded, validated job with its plugins compiled for its tenant.
pub struct Job {
    pub(super) graph: Arc<JobGraph>,
    pub(super) plugins: Arc<BTreeMap<String, Plugin>>,
    pub(super) tenant: TenantConfig,
    pub(super) budget: InstanceBudget,
    pub(super) on_checkpoint: Option<CheckpointHook>,
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
        Self::from_graph(load_graph(path)?, engine, host)
    }

    /// Loads the plugins of a validated graph.
    pub fn from_graph(graph: JobGraph, engine: &WasmEngine, host: &HostConfig) -> Result<Job> {
        let tenant = host
            .tenant(&graph.tenant)
            .with_context(|| format!("job '{}'", graph.name))?;
        let fuel = tenant.limits.fuel_per_call.is_some();
        let mut plugins = BTreeMap::new();
        for op in graph.operators() {
            let plugin = Plugin::load(engine, &op.plugin, fuel)
                .with_context(|| format!("job '{}': operator '{}'", graph.name, op.name))?;
            plugins.insert(op.name.clone(), plugin);
        }
        Ok(Job {
            graph: Arc::new(graph),
            plugins: Arc::new(plugins),
            tenant,
            budget: InstanceBudget::default(),
            on_checkpoint: None,
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

    /// Runs `hook` on every completed checkpoint, before the tasks are notified of it.
    pub fn with_checkpoint_hook(mut self, hook: CheckpointHook) -> Self {
        self.on_checkpoint = Some(hook);
        self
    }

    /// The tenant the job runs for.
    pub fn tenant(&self) -> &TenantConfig {
        &self.tenant
    }

    /// Number of Wasm operator instances the job runs.
    pub fn instances(&self) -> u32 {
        self.graph.instances()
    }

    /// The validated graph.
    pub fn graph(&self) -> &JobGraph {
        &self.graph
    }

    /// The compiled plugins, by operator name.
    pub fn plugins(&self) -> &BTreeMap<String, Plugin> {
        &self.plugins
    }

    /// Checks, changing nothing, that a run with `options` may start: what [`Job::run`]
    /// would refuse before running (output of an earlier run, a checkpoint that does not
    /// fit the job, a rewind of committed output).
    pub fn check_start(&self, options: &RunOptions) -> Result<()> {
        check_start(&self.graph, options)
    }

    /// Runs the job to its end, restarting after failures as its strategy allows. Every
    /// restart restores the newest checkpoint of this run, or the point it started from.
    pub fn run(
        &self,
        options: impl Into<RunOptions>,
        control: &Receiver<JobControl>,
        monitor: &JobMonitor,
    ) -> Result<JobReport> {
        self.run_locked(self.lock()?, options, control, monitor)
    }

    /// Takes what a run of the job owns while it lasts (its checkpoint folder, its file
    /// sinks' output), or says which other process holds it ([`InUse`](super::InUse)).
    pub fn lock(&self) -> Result<RunLocks> {
        lock_run(&self.graph)
    }

    /// [`Job::run`] with the locks already taken by [`Job::lock`] (for a caller that
    /// starts something that belongs to the run only once it owns the job).
    pub fn run_locked(
        &self,
        locks: RunLocks,
        options: impl Into<RunOptions>,
        control: &Receiver<JobControl>,
        monitor: &JobMonitor,
    ) -> Result<JobReport> {
        let options = options.into();
        let graph = &self.graph;
        let _instances = self
            .budget
            .reserve(&self.tenant, self.instances(), &graph.name)?;
        let started = Instant::now();
        let run = prepare_run(graph, &options, locks)?;
        let mut failures = Vec::new();
        let mut checkpoint = run.initial.clone();
        // Checkpoint ids never repeat within a run, also across its attempts, and stay
        // above those its Kafka sinks committed before it.
        let mut next_id = run.first_id;
        for attempt in 0u32.. {
            monitor.attempt.store(attempt, Ordering::Relaxed);
            if let Some(c) = &checkpoint {
                tracing::info!(
                    "job '{}': restoring from {} {} ({})",
                    graph.name,
                    if c.metadata.kind == SnapshotKind::Savepoint {
                        "savepoint"
                    } else {
                        "checkpoint"
                    },
                    c.metadata.id,
                    c.path.display()
                );
            }
            let stats = Arc::new(Mutex::new(CheckpointStats::default()));
            *monitor.checkpoints.lock() = stats.clone();
            let end = match self.deploy(
                attempt,
                checkpoint.clone().map(Arc::new),
                &run,
                stats.clone(),
                next_id,
                &options,
            ) {
                Ok(running) => running.supervise(control, monitor),
                Err(e) => AttemptEnd::Failed(e),
            };
            let report = |outcome, failures: &Vec<String>| JobReport {
                outcome,
                restarts: attempt,
                duration: started.elapsed(),
                tasks: monitor.tasks(),
                checkpoints: stats.lock().clone(),
                failures: failures.clone(),
                interrupted: monitor.interrupted.lock().clone(),
                failures_by_kind: monitor.failures_by_kind(),
            };
            let error = match end {
                AttemptEnd::Outcome(outcome) => return Ok(report(outcome, &failures)),
                AttemptEnd::Failed(e) => e,
            };
            next_id = next_id.max(stats.lock().next_id);
            *monitor
                .failures_by_kind
                .lock()
                .entry(failure_kind(&error).to_string())
                .or_default() += 1;
            *monitor.last_failure.lock() = Some(format!("{error:#}"));
            monitor.record_failure(attempt, failure_kind(&error), &format!("{error:#}"));
            let restart = attempt + 1;
            let delay = if is_permanent(&error) {
                None
            } else {
                graph.restart.delay_before(restart)
            };
            let Some(delay) = delay else {
                return Err(JobFailed {
                    job: graph.name.clone(),
                    restarts: attempt,
                    cause: error,
                }
                .into());
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
            checkpoint = match (&run.storage, &run.lineage) {
                (Some(storage), Some(lineage)) => storage
                    .latest_in(lineage)
                    .with_context(|| format!("job '{}': finding where to restart", graph.name))?,
                _ => run.initial.clone(),
            };
        }
        unreachable!("the restart loop returns")
    }
}
/// Reads a job file's graph, for commands that need no plugins.
pub fn load_graph(path: &Path) -> Result<JobGraph> {
    let file = crate::spec::JobFile::load(path)?;
    JobGraph::from_file(&file, path)
}
