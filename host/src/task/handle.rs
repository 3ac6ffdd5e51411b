//! Talking to a running task from other threads.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Result;

use super::StreamTask;
use crate::checkpoint::TaskId;
use crate::mailbox::{Priority, TaskMailbox};
use crate::metrics::TaskMetrics;
use crate::network::Barrier;

/// A cloneable handle to a task, usable from any thread.
#[derive(Clone)]
pub struct TaskHandle {
    name: String,
    id: TaskId,
    mailbox: TaskMailbox<StreamTask>,
    cancel: Arc<AtomicBool>,
    metrics: Arc<TaskMetrics>,
}

impl TaskHandle {
    pub(super) fn new(
        name: String,
        id: TaskId,
        mailbox: TaskMailbox<StreamTask>,
        cancel: Arc<AtomicBool>,
        metrics: Arc<TaskMetrics>,
    ) -> Self {
        TaskHandle {
            name,
            id,
            mailbox,
            cancel,
            metrics,
        }
    }

    /// The task's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The task's place in the job graph.
    pub fn id(&self) -> TaskId {
        self.id
    }

    /// The task's metrics.
    pub fn metrics(&self) -> &Arc<TaskMetrics> {
        &self.metrics
    }

    /// Mails queued right now.
    pub fn mailbox_depth(&self) -> usize {
        self.mailbox.len()
    }

    /// Stops the task promptly: ends its mailbox loop, interrupts a running Wasm call at
    /// the next epoch tick, unblocks a send to a full channel. The task skips the clean
    /// shutdown (no `finish`/`close`) but still disposes its operators.
    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::SeqCst);
        self.mailbox.all_actions_completed();
    }

    /// True once [`TaskHandle::cancel`] was called.
    pub fn is_canceled(&self) -> bool {
        self.cancel.load(Ordering::SeqCst)
    }

    /// Asks a source task to take a checkpoint: it injects `barrier` into its output.
    pub fn trigger_checkpoint(&self, barrier: Barrier) -> Result<()> {
        self.mailbox.put(
            Priority::CONTROL,
            format!("trigger checkpoint {}", barrier.id),
            Box::new(move |task: &mut StreamTask| task.trigger_checkpoint(barrier)),
        )
    }

    /// Tells the task that checkpoint `id` is complete everywhere.
    pub fn notify_complete(&self, id: u64) -> Result<()> {
        self.mailbox.put(
            Priority::MAX,
            format!("notify checkpoint {id} complete"),
            Box::new(move |task: &mut StreamTask| task.notify_checkpoint_complete(id)),
        )
    }

    /// Tells the task that checkpoint `id` was aborted.
    pub fn notify_aborted(&self, id: u64) -> Result<()> {
        self.mailbox.put(
            Priority::MAX,
            format!("notify checkpoint {id} aborted"),
            Box::new(move |task: &mut StreamTask| task.notify_checkpoint_aborted(id)),
        )
    }

    /// The handler through which other threads fail this task.
    pub fn async_exception_handler(&self) -> AsyncExceptionHandler {
        AsyncExceptionHandler {
            mailbox: self.mailbox.clone(),
        }
    }
}

/// Fails a task from another thread (a timer thread, an async checkpoint worker): the
/// reference's `handleAsyncException`. The failure reaches the task as a mail, so it takes
/// effect only while the task still accepts mails (it runs); afterwards it is logged.
#[derive(Clone)]
pub struct AsyncExceptionHandler {
    mailbox: TaskMailbox<StreamTask>,
}

impl AsyncExceptionHandler {
    /// Fails the task with `error`, described by `message`.
    pub fn handle(&self, message: &str, error: anyhow::Error) {
        let error = error.context(message.to_string());
        let text = format!("{error:#}");
        if self
            .mailbox
            .put(
                Priority::MAX,
                "asynchronous failure",
                Box::new(move |_| Err(error)),
            )
            .is_err()
        {
            tracing::debug!(
                "ignoring an asynchronous failure of a task that no longer runs: {text}"
            );
        }
    }
}
