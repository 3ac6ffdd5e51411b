//! The task side of checkpoints: taking the synchronous part, forwarding barriers,
//! declining, notifications, and the synchronous-savepoint loop of stop-with-savepoint.

use anyhow::{Context, Result};

use super::{StreamTask, TaskInput};
use crate::mailbox::Priority;
use crate::network::{Barrier, CheckpointKind};

impl StreamTask {
    /// A source task was asked by the coordinator to take a checkpoint (a mail).
    pub(super) fn trigger_checkpoint(&mut self, barrier: Barrier) -> Result<()> {
        if self.done {
            // Its final checkpoint is complete, so the tasks downstream may have ended:
            // nothing may be sent to them. The coordinator counts that final checkpoint
            // for this one too when the task reports that it ended.
            return Ok(());
        }
        if !self.perform_checkpoint(barrier)? {
            self.decline(barrier.id, "the task is not running");
            return Ok(());
        }
        self.after_checkpoint(barrier)
    }

    /// All inputs of a task delivered `barrier`.
    pub(super) fn trigger_checkpoint_on_barrier(&mut self, barrier: Barrier) -> Result<()> {
        if self.perform_checkpoint(barrier)? {
            self.after_checkpoint(barrier)?;
        } else {
            self.decline(barrier.id, "the task is not running");
        }
        Ok(())
    }

    /// An upstream task declined checkpoint `id`: decline it too and tell downstream
    /// tasks not to wait for it (the reference's `abortCheckpointOnBarrier`).
    pub(super) fn abort_checkpoint_on_barrier(&mut self, id: u64) -> Result<()> {
        tracing::debug!(
            "{}: aborting checkpoint {id} on a cancel marker",
            self.ctx.name
        );
        self.decline(id, "an upstream task declined it");
        self.chain().broadcast_cancel_marker(id)
    }

    /// Prepare, forward the barrier, take the synchronous part, start the asynchronous
    /// part — as one step from the point of view of records, watermarks and timers, since
    /// nothing else runs on this thread meanwhile. Returns false when the task cannot
    /// take the checkpoint (it then sent cancel markers downstream instead).
    fn perform_checkpoint(&mut self, barrier: Barrier) -> Result<bool> {
        if !self.running || self.checkpoints.is_none() {
            self.chain().broadcast_cancel_marker(barrier.id)?;
            return Ok(false);
        }
        if let CheckpointKind::Savepoint { stop: true, drain } = barrier.kind {
            self.sync_savepoint = Some((barrier.id, drain));
            if drain && !self.finished {
                // Drained, the savepoint is the task's final checkpoint (Flink's
                // FLIP-147): event time goes to its end (a source advances it; the other
                // tasks got it before this barrier) and the operators finish, so what
                // they flush goes out before the barrier and into the savepoint's commit.
                if self.is_source() {
                    self.chain().advance_watermark(i64::MAX)?;
                }
                if !self.finished_on_restore {
                    self.chain().finish_all()?;
                }
                self.finished = true;
            }
        }
        // Forward the barrier first, so downstream alignment is not delayed by our
        // snapshot. The synchronous part is timed from then, as Flink times it: a wait
        // for room in a full output channel is backpressure, not the snapshot's cost.
        self.chain().broadcast_barrier(barrier)?;
        let sync_start = std::time::Instant::now();
        let position = match &mut self.input {
            TaskInput::Source(reader) => {
                let position = reader.checkpoint();
                reader.source.checkpointed(barrier.id);
                Some(position)
            }
            TaskInput::Network(_) => None,
        };
        let operators = self.chain().snapshot(barrier.id)?;
        let sink_records = self.chain().sink_records_in();
        crate::failpoint!("task::after-operator-snapshot");
        if self.finished {
            crate::failpoint!("checkpoint::final");
            self.final_checkpoint.get_or_insert(barrier.id);
        }
        let link = self.checkpoints.as_ref().expect("checked above");
        let pending = link.start_async_part(
            barrier,
            self.ctx.id,
            sync_start.elapsed(),
            position,
            operators,
            self.finished,
            sink_records,
        );
        self.async_checkpoints.retain(|p| !p.is_done());
        self.async_checkpoints.push(pending);
        Ok(true)
    }

    /// After a stop-with-savepoint's synchronous part: process only top-priority mails
    /// until the savepoint completes or is aborted (the reference's
    /// `runSynchronousSavepointMailboxLoop`).
    /// A mail that fails here fails the task, as anywhere else; only cancellation ends
    /// the loop quietly.
    fn after_checkpoint(&mut self, barrier: Barrier) -> Result<()> {
        if self.sync_savepoint.map(|(id, _)| id) != Some(barrier.id) {
            return Ok(());
        }
        while self.sync_savepoint.is_some() {
            let Ok(letter) = self.mailbox.take(Priority::MAX) else {
                break; // cancelled
            };
            let description = letter.description.clone();
            crate::failpoint!("savepoint::synchronous-loop");
            letter.run(self).with_context(|| {
                format!("mail '{description}' failed during a stop-with-savepoint")
            })?;
        }
        // Timers due meanwhile fire now, if the task goes on.
        self.reschedule_processing_timer()?;
        Ok(())
    }

    fn decline(&self, id: u64, reason: &str) {
        if let Some(link) = &self.checkpoints {
            link.decline(id, self.ctx.id, format!("task {}: {reason}", self.ctx.name));
        }
    }

    /// Checkpoint `id` is complete in the whole job (a mail).
    pub(super) fn notify_checkpoint_complete(&mut self, id: u64) -> Result<()> {
        if self.running {
            self.chain().notify_complete(id)?;
            if let TaskInput::Source(reader) = &mut self.input {
                reader.source.notify_complete(id);
            }
            if self.final_checkpoint.is_some_and(|f| id >= f) {
                self.done = true;
            }
        } else {
            tracing::debug!(
                "{}: ignoring completion of checkpoint {id}: not running",
                self.ctx.name
            );
        }
        if let Some((savepoint, drain)) = self.sync_savepoint
            && id >= savepoint
        {
            // The stop-with-savepoint succeeded. Sources end their input now (the
            // reference's `finishTask`); every other task ends when its input does, so
            // nothing downstream goes away while records or ends are still on their way.
            self.sync_savepoint = None;
            self.stopping = true;
            self.stop_requested = matches!(self.input, TaskInput::Source(_)) && !self.finished;
            self.stopped_without_drain = !drain;
            self.done |= self.finished;
        }
        Ok(())
    }

    /// Checkpoint `id` was aborted (a mail).
    pub(super) fn notify_checkpoint_aborted(&mut self, id: u64) -> Result<()> {
        if self.running {
            self.chain().notify_aborted(id)?;
        }
        if self.final_checkpoint == Some(id) {
            self.final_checkpoint = None;
        }
        if let Some((savepoint, drain)) = self.sync_savepoint
            && savepoint == id
        {
            self.sync_savepoint = None;
            if drain {
                // Event time already went to the end for it: records from now on would
                // all be late. Fail, so the job restarts from its last checkpoint.
                anyhow::bail!(
                    "stop-with-savepoint {id} with drain was aborted after event time had \
                     advanced to the end; restarting from the last checkpoint"
                );
            }
            tracing::warn!(
                "{}: stop-with-savepoint {id} was aborted; the task keeps running",
                self.ctx.name
            );
        }
        Ok(())
    }
}
