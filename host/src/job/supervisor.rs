//! Supervision of one running attempt: waits for its tasks, cancels them all on the
//! first failure, and carries out control requests (stop with a savepoint, cancel).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender, select, unbounded};

use super::monitor::JobMonitor;
use super::run::{JobControl, JobOutcome};
use crate::chain::{CallError, OperatorFailure};
use crate::checkpoint::{AsyncPool, CoordinatorMessage, TaskId};
use crate::metrics::TaskMetricsHandle;
use crate::network::{DownstreamGone, UpstreamFailed};
use crate::task::{TaskHandle, TaskOutcome};

/// How an attempt ended.
pub(super) enum AttemptEnd {
    /// Without failure.
    Outcome(JobOutcome),
    /// A task failed (its error, the cause).
    Failed(anyhow::Error),
}

/// Tasks of one attempt, running.
pub(super) struct RunningAttempt {
    pub(super) handles: Vec<TaskHandle>,
    pub(super) metrics: Vec<TaskMetricsHandle>,
    pub(super) done: Receiver<(TaskId, anyhow::Result<TaskOutcome>)>,
    pub(super) coordinator_tx: Sender<CoordinatorMessage>,
    pub(super) coordinator: Option<thread::JoinHandle<()>>,
    pub(super) threads: Vec<thread::JoinHandle<()>>,
    /// The writers of the attempt's asynchronous checkpoint parts: dropped (which waits
    /// for them) once its tasks ended, before the next attempt starts.
    pub(super) writers: Arc<AsyncPool>,
}

impl RunningAttempt {
    /// Waits for every task, cancelling all on the first failure; handles control
    /// requests meanwhile.
    pub(super) fn supervise(
        self,
        control: &Receiver<JobControl>,
        monitor: &JobMonitor,
    ) -> AttemptEnd {
        *monitor.tasks.lock() = self.metrics.clone();
        monitor.interrupted.lock().clear();
        monitor.running.store(true, Ordering::Relaxed);
        let mut remaining = self.handles.len();
        let mut first_error: Option<anyhow::Error> = None;
        let mut cancelled = false;
        let mut savepoint: Option<PathBuf> = None;
        let (stop_tx, stop_rx) = unbounded::<Result<PathBuf, String>>();
        let mut stop_reply: Option<Sender<Result<PathBuf, String>>> = None;
        let cancel_all = |handles: &[TaskHandle]| handles.iter().for_each(TaskHandle::cancel);
        // Whoever controls the job may go away; then no request can come.
        let mut control = control.clone();
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
                            monitor.interrupted.lock().extend(interrupted);
                        }
                        Err(e) => match &first_error {
                            None if !cancelled => {
                                *monitor.last_failure_at.lock() = Some(Instant::now());
                                tracing::info!("{e:#}");
                                first_error = Some(e);
                                cancel_all(&self.handles);
                            }
                            // A task downstream of the failed one may report first; the
                            // failed task's own error is the cause.
                            Some(first) if explains_better(&e, first) => {
                                tracing::info!("{e:#}");
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
                    Ok(JobControl::Savepoint { reply }) => {
                        if self.coordinator.is_none() {
                            let _ = reply.send(Err("a savepoint needs a [checkpoint] table in the job file".into()));
                        } else {
                            let _ = self.coordinator_tx.send(CoordinatorMessage::TriggerSavepoint {
                                stop: false,
                                drain: false,
                                reply,
                            });
                        }
                    }
                    Err(_) => control = crossbeam_channel::never(),
                },
                recv(stop_rx) -> msg => {
                    if let Ok(result) = msg {
                        stop_taken(result, &mut savepoint, &mut stop_reply);
                    }
                }
            }
        }
        monitor.running.store(false, Ordering::Relaxed);
        // A savepoint reply may still wait: the tasks of a stop-with-savepoint end as soon
        // as they are notified, which can be before the loop above saw the reply.
        if let Ok(result) = stop_rx.try_recv() {
            stop_taken(result, &mut savepoint, &mut stop_reply);
        }
        let _ = self.coordinator_tx.send(CoordinatorMessage::Shutdown);
        if let Some(c) = self.coordinator {
            let _ = c.join();
        }
        for t in self.threads {
            let _ = t.join();
        }
        drop(self.writers);
        // Whoever stopped the job hears that it stopped once its tasks ended: their sinks
        // have then committed what the savepoint holds.
        if let Some(reply) = stop_reply {
            let _ = reply.send(match (&first_error, &savepoint) {
                (None, Some(path)) => Ok(path.clone()),
                (Some(e), _) => Err(format!(
                    "the job failed before it stopped with its savepoint: {e:#}"
                )),
                (None, None) => Err("the job ended before its savepoint completed".into()),
            });
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

/// The coordinator's answer to a stop-with-savepoint: a savepoint taken is answered
/// when the job has stopped, a failure at once.
fn stop_taken(
    result: Result<PathBuf, String>,
    savepoint: &mut Option<PathBuf>,
    reply: &mut Option<Sender<Result<PathBuf, String>>>,
) {
    match result {
        Ok(path) => *savepoint = Some(path),
        Err(e) => {
            if let Some(reply) = reply.take() {
                let _ = reply.send(Err(e));
            }
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
        Some(CallError::Unrecoverable(_)) => "unrecoverable",
        Some(CallError::Limit(_)) => "limit",
        None => "host",
    }
}

/// True when a task failed only because a task it talks to did: one feeding it, or one
/// it feeds.
fn is_upstream_failure(e: &anyhow::Error) -> bool {
    e.chain()
        .any(|c| c.is::<UpstreamFailed>() || c.is::<DownstreamGone>())
}

/// Whether task failure `new` explains an attempt's failure better than `first`, the
/// one reported first: a task's own failure does, over one that only says its upstream
/// failed.
fn explains_better(new: &anyhow::Error, first: &anyhow::Error) -> bool {
    is_upstream_failure(first) && !is_upstream_failure(new)
}

/// True for failures a restart cannot fix (an operator rejected its configuration).
pub(super) fn is_permanent(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<OperatorFailure>()
            .is_some_and(|f| f.error.is_permanent())
            || c.downcast_ref::<CallError>()
                .is_some_and(CallError::is_permanent)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tasks_own_failure_explains_more_than_its_downstreams() {
        let upstream = || {
            anyhow::Error::from(UpstreamFailed { channel: 0 }).context("task count -> sink (1/1)")
        };
        let cause = || anyhow::anyhow!("operator 'suspect': snapshot: the call deadline passed");
        assert!(explains_better(&cause(), &upstream()));
        assert!(!explains_better(&upstream(), &cause()));
        assert!(!explains_better(&upstream(), &upstream()));
        assert!(!explains_better(&cause(), &cause()));
    }
}
