//! A live view of a running job, shared with progress lines and status endpoints.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::coordinator::CheckpointStats;
use crate::cluster::HostView;
use crate::metrics::{TaskMetricsHandle, TaskReport};

/// A live view of a running job, for progress lines and status endpoints.
#[derive(Default)]
pub struct JobMonitor {
    pub(super) tasks: Mutex<Vec<TaskMetricsHandle>>,
    pub(super) checkpoints: Mutex<Arc<Mutex<CheckpointStats>>>,
    pub(super) attempt: AtomicU32,
    pub(super) running: AtomicBool,
    pub(super) interrupted: Mutex<Vec<String>>,
    pub(super) failures_by_kind: Mutex<BTreeMap<String, u64>>,
    pub(super) last_failure_at: Mutex<Option<Instant>>,
    pub(super) last_failure: Mutex<Option<String>>,
    /// The job's last failures, oldest first (at most [`FAILURE_HISTORY`]).
    failures: Mutex<VecDeque<FailureRecord>>,
    /// The tasks' metrics as another process reported them last (a job in a worker
    /// process, [`JobMonitor::apply`]).
    reported_tasks: Mutex<Option<Vec<TaskReport>>>,
    /// What this host of a job over several hosts does ([`crate::cluster`]), while it
    /// runs one.
    cluster: Mutex<Option<Arc<Mutex<HostView>>>>,
    /// The monitors of the units that host runs (or ran to their end), whose tasks are
    /// this job's here.
    units: Mutex<Option<UnitMonitors>>,
}

/// The monitors of the units a cluster host runs or ran to their end, by unit.
pub type UnitMonitors = Arc<Mutex<BTreeMap<u32, Arc<JobMonitor>>>>;

/// How many failures a job's exception history keeps (the newest).
pub const FAILURE_HISTORY: usize = 20;

/// A failure of one of a job's attempts, for its exception history.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FailureRecord {
    /// When it was learned, in milliseconds since the Unix epoch.
    pub at_ms: i64,
    /// The attempt it ended (0 for the first run).
    pub attempt: u32,
    /// Its kind (`error`, `panic`, `deadline`, `memory`, `worker`, …).
    pub kind: String,
    /// The error, with the task, operator and call it names.
    pub error: String,
}

/// A point-in-time copy of a [`JobMonitor`], as a worker process reports the monitor of a
/// job it runs to the server, whose own monitor of the job mirrors it.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct MonitorSnapshot {
    /// Metrics of the current attempt's tasks.
    pub tasks: Vec<TaskReport>,
    /// Checkpoints of the current attempt; `None` when unchanged since the last snapshot.
    pub checkpoints: Option<CheckpointStats>,
    /// Current attempt.
    pub attempt: u32,
    /// True while tasks run.
    pub running: bool,
    /// Failures of attempts so far, by kind.
    pub failures_by_kind: BTreeMap<String, u64>,
    /// How long ago the last failure was learned.
    pub last_failure_ago: Option<Duration>,
    /// The error that ended the last failed attempt.
    pub last_failure: Option<String>,
    /// What the host of a job over several hosts does.
    #[serde(default)]
    pub cluster: Option<Box<HostView>>,
    /// The job's last failures, oldest first.
    #[serde(default)]
    pub failures: Vec<FailureRecord>,
}

impl JobMonitor {
    /// Metrics of the current attempt's tasks.
    pub fn tasks(&self) -> Vec<TaskReport> {
        if let Some(reported) = &*self.reported_tasks.lock() {
            return reported.clone();
        }
        let mut tasks: Vec<TaskReport> = self
            .tasks
            .lock()
            .iter()
            .map(TaskMetricsHandle::report)
            .collect();
        // A host of a job over several hosts: the tasks of its units, each named with
        // its unit and this host.
        let units = self.units.lock().clone();
        if let Some(units) = units {
            let host = self.cluster_view().map(|v| v.client_id);
            let monitors: Vec<(u32, Arc<JobMonitor>)> =
                units.lock().iter().map(|(u, m)| (*u, m.clone())).collect();
            for (unit, monitor) in monitors {
                tasks.extend(monitor.tasks().into_iter().map(|t| TaskReport {
                    unit: Some(unit),
                    host: host.clone(),
                    ..t
                }));
            }
        }
        tasks
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
            .filter(|o| o.is_sink)
            .map(|o| o.records_in)
            .sum();
        (read, written)
    }

    /// Checkpoints of the current attempt.
    pub fn checkpoints(&self) -> CheckpointStats {
        self.checkpoints.lock().lock().clone()
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
        self.failures_by_kind.lock().clone()
    }

    /// When the supervisor last learned that a task failed (the start of a recovery).
    pub fn last_failure_at(&self) -> Option<Instant> {
        *self.last_failure_at.lock()
    }

    /// The error that ended the last failed attempt.
    pub fn last_failure(&self) -> Option<String> {
        self.last_failure.lock().clone()
    }

    /// A copy to report; its checkpoints only when `checkpoints_since` (the
    /// [`CheckpointStats`] `next_id`, completed and aborted counts and acknowledgements
    /// of checkpoints in flight last reported) changed, which it updates.
    pub fn snapshot(&self, checkpoints_since: &mut (u64, usize, usize, u32)) -> MonitorSnapshot {
        let stats = self.checkpoints();
        let acks = stats.in_progress.iter().map(|c| c.acknowledged).sum();
        let now = (
            stats.next_id,
            stats.completed.len(),
            stats.aborted.len(),
            acks,
        );
        let checkpoints = (now != *checkpoints_since).then_some(stats);
        *checkpoints_since = now;
        MonitorSnapshot {
            tasks: self.tasks(),
            checkpoints,
            attempt: self.attempt(),
            running: self.is_running(),
            failures_by_kind: self.failures_by_kind(),
            last_failure_ago: self.last_failure_at().map(|at| at.elapsed()),
            last_failure: self.last_failure(),
            cluster: self.cluster_view().map(Box::new),
            failures: self.failure_history(),
        }
    }

    /// Follows `view`, the host of a job over several hosts this monitor's run is, and
    /// the monitors of the units it runs.
    pub fn follow_cluster(&self, view: Arc<Mutex<HostView>>, units: UnitMonitors) {
        *self.cluster.lock() = Some(view);
        *self.units.lock() = Some(units);
    }

    /// What the host of a job over several hosts does, if the run is one.
    pub fn cluster_view(&self) -> Option<HostView> {
        self.cluster.lock().as_ref().map(|view| view.lock().clone())
    }

    /// The job's last failures, oldest first.
    pub fn failure_history(&self) -> Vec<FailureRecord> {
        self.failures.lock().iter().cloned().collect()
    }

    /// Adds a failure to the exception history (the oldest leave past
    /// [`FAILURE_HISTORY`]).
    pub fn record_failure(&self, attempt: u32, kind: &str, error: &str) {
        let at_ms = crate::timers::now_millis();
        let mut failures = self.failures.lock();
        failures.push_back(FailureRecord {
            at_ms,
            attempt,
            kind: kind.to_string(),
            error: error.to_string(),
        });
        while failures.len() > FAILURE_HISTORY {
            failures.pop_front();
        }
    }

    /// Starts the exception history with `failures` (of the job's earlier runs).
    pub fn keep_failures(&self, failures: Vec<FailureRecord>) {
        let mut kept: VecDeque<FailureRecord> = failures.into();
        while kept.len() > FAILURE_HISTORY {
            kept.pop_front();
        }
        *self.failures.lock() = kept;
    }

    /// Counts a failure the job's own restarts did not see (its worker process died) as
    /// one more attempt, and starts the next attempt's report empty; returns the attempt
    /// it is now at.
    pub fn failed_outside(&self, kind: &str, why: &str) -> u32 {
        *self
            .failures_by_kind
            .lock()
            .entry(kind.to_string())
            .or_default() += 1;
        *self.last_failure.lock() = Some(why.to_string());
        *self.last_failure_at.lock() = Some(Instant::now());
        self.record_failure(self.attempt(), kind, why);
        *self.reported_tasks.lock() = Some(Vec::new());
        *self.checkpoints.lock() = Arc::default();
        self.running.store(false, Ordering::Relaxed);
        self.attempt.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Makes this monitor show what `snapshot` reports (a job another process runs).
    pub fn apply(&self, snapshot: MonitorSnapshot) {
        *self.reported_tasks.lock() = Some(snapshot.tasks);
        if let Some(stats) = snapshot.checkpoints {
            *self.checkpoints.lock() = Arc::new(Mutex::new(stats));
        }
        self.attempt.store(snapshot.attempt, Ordering::Relaxed);
        self.running.store(snapshot.running, Ordering::Relaxed);
        *self.failures_by_kind.lock() = snapshot.failures_by_kind;
        *self.last_failure_at.lock() = snapshot
            .last_failure_ago
            .and_then(|ago| Instant::now().checked_sub(ago));
        *self.last_failure.lock() = snapshot.last_failure;
        self.keep_failures(snapshot.failures);
        if let Some(view) = snapshot.cluster {
            *self.cluster.lock() = Some(Arc::new(Mutex::new(*view)));
        }
    }
}
