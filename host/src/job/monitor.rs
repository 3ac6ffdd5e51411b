//! A live view of a running job, shared with progress lines and status endpoints.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Instant;

use parking_lot::Mutex;

use super::coordinator::CheckpointStats;
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
}

impl JobMonitor {
    /// Metrics of the current attempt's tasks.
    pub fn tasks(&self) -> Vec<TaskReport> {
        self.tasks
            .lock()
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
}
