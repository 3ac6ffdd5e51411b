//! The trait a plugin implements.

use crate::{Context, OpenContext, Record, Result, Timer};

/// A stream operator. Implement `open` and `process`; every other hook does nothing by
/// default. Export the type with [`export!`](crate::export).
///
/// The host makes the calls in this order, one at a time:
///
/// ```text
/// open → (process | process_watermark | on_timer | snapshot | notify_complete
///         | notify_aborted)* → finish → close → dispose
/// ```
///
/// `finish` comes only when the input ends, `close` only on a clean shutdown, `dispose`
/// always (also after a failure, unless the instance trapped).
///
/// Returning an error fails the call: its records, state writes, timers and counters are
/// dropped, and the task fails (see [`Error`](crate::Error) for what the host does next).
/// A panic traps the whole instance.
pub trait Operator: Sized + 'static {
    /// Creates the operator: read the configuration (report a bad one with
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig)), declare keyed state and
    /// restore what [`snapshot`](Self::snapshot) saved.
    fn open(ctx: &mut OpenContext<'_>) -> Result<Self>;

    /// Processes one input record. Records of a batch arrive one by one, in order.
    fn process(&mut self, record: Record<'_>, ctx: &mut Context<'_>) -> Result<()>;

    /// The input watermark advanced to `watermark`. Event-time timers up to it have
    /// already fired; the watermark is forwarded after this returns, so records emitted
    /// here come before it.
    fn process_watermark(&mut self, watermark: i64, ctx: &mut Context<'_>) -> Result<()> {
        let _ = (watermark, ctx);
        Ok(())
    }

    /// A timer registered through the context is due. Called once per timer, in order of
    /// time; processing-time timers that are late all fire at once, each with its own
    /// registered time.
    fn on_timer(&mut self, timer: Timer<'_>, ctx: &mut Context<'_>) -> Result<()> {
        let _ = (timer, ctx);
        Ok(())
    }

    /// The synchronous part of checkpoint `checkpoint_id`: return the operator's own state
    /// (keep it small; keyed state and timers belong to the host). The bytes come back in
    /// [`OpenContext::restored_state`] on restore. The default saves nothing.
    fn snapshot(&mut self, checkpoint_id: u64) -> Result<Vec<u8>> {
        let _ = checkpoint_id;
        Ok(Vec::new())
    }

    /// Checkpoint `checkpoint_id` is complete in the whole job: the place for side effects
    /// that must happen exactly once. A later id implies the earlier ones.
    fn notify_complete(&mut self, checkpoint_id: u64) -> Result<()> {
        let _ = checkpoint_id;
        Ok(())
    }

    /// Checkpoint `checkpoint_id` was aborted somewhere in the job.
    fn notify_aborted(&mut self, checkpoint_id: u64) -> Result<()> {
        let _ = checkpoint_id;
        Ok(())
    }

    /// The input ended (and event time advanced to its end, firing every event-time
    /// timer): emit whatever is buffered.
    fn finish(&mut self, ctx: &mut Context<'_>) -> Result<()> {
        let _ = ctx;
        Ok(())
    }

    /// Clean shutdown after `finish`: release what [`dispose`](Self::dispose) would not.
    /// Must not emit: when the job checkpoints, its output was committed before `close`,
    /// so the call fails if it emits. Flush buffered records in [`finish`](Self::finish).
    fn close(&mut self, ctx: &mut Context<'_>) -> Result<()> {
        let _ = ctx;
        Ok(())
    }

    /// The last call, always made: release resources. Cannot fail.
    fn dispose(&mut self) {}
}
