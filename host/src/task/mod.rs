//! The stream task: one thread that owns a chain of operators and runs it the way Flink's
//! `StreamTask` does.
//!
//! # Lifecycle
//!
//! [`StreamTask::run`] follows the reference order exactly:
//!
//! 1. build the chain (instantiate every operator on this thread) and restore state
//!    (the source's position; operators get their state when they are created);
//! 2. open the operators, tail to head;
//! 3. run the mailbox loop: input batches, interleaved with mails (timers, checkpoints,
//!    notifications, cancellation);
//! 4. at the end of input, `finish` the operators head to tail; with checkpointing, tell
//!    downstream tasks that no more data comes (end of data) and go on taking part in
//!    checkpoints until one taken after the finish — the *final checkpoint* — is complete
//!    (Flink's FLIP-147), so two-phase-commit sinks commit everything through a
//!    checkpoint and nothing is written outside one;
//! 5. close them head to tail, quiesce the timer service, stop accepting mails, run the
//!    mails still queued, wait (bounded) for a timer callback in flight;
//! 6. flush and end the outputs, dispose the operators tail to head.
//!
//! On any failure the task still disposes every operator (logging their errors) and
//! releases its outputs, and it reports the **first** error. A cancelled task skips the
//! clean shutdown (no `finish`, no `close`), as in the reference.

mod checkpointing;
mod handle;
mod input;
#[cfg(test)]
mod tests;

pub use handle::{AsyncExceptionHandler, TaskHandle};
pub use input::{SourceReader, TaskInput, merge_source_checkpoints};

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use sluice_codec::BatchWriter;

use crate::chain::OperatorChain;
use crate::checkpoint::{CheckpointLink, TaskId};
use crate::mailbox::{ActionResult, MailboxProcessor, Priority, TaskMailbox};
use crate::metrics::{TaskMetrics, add_duration};
use crate::spec::limits;
use crate::timers::{ProcessingTimeService, TimerHandle, now_millis};

/// Builds a task's operator chain; runs on the task thread.
pub type ChainFactory = Box<dyn FnOnce(&TaskContext) -> Result<OperatorChain> + Send>;

/// Settings of a task.
#[derive(Debug, Clone)]
pub struct TaskSettings {
    /// Records a source reads per batch.
    pub batch_size: usize,
    /// Buffered output is sent at the latest after this long (zero: after every batch).
    pub buffer_timeout: Duration,
    /// How long shutdown waits for a processing-time timer callback in flight.
    pub timer_shutdown_timeout: Duration,
}

impl Default for TaskSettings {
    fn default() -> Self {
        TaskSettings {
            batch_size: limits::BATCH_SIZE.default,
            buffer_timeout: Duration::from_millis(limits::BUFFER_TIMEOUT_MS.default),
            timer_shutdown_timeout: Duration::from_secs(5),
        }
    }
}

/// What a task's chain factory may use.
#[derive(Clone)]
pub struct TaskContext {
    /// Display name, e.g. `tokenize -> count (2/4)`.
    pub name: String,
    /// Position in the job graph.
    pub id: TaskId,
    /// Set when the task is cancelled; Wasm stores watch it to interrupt running calls.
    pub cancel: Arc<AtomicBool>,
    /// The task's metrics.
    pub metrics: Arc<TaskMetrics>,
}

/// Why a task ended without error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskOutcome {
    /// The input ended and the task shut down cleanly.
    Finished,
    /// It was cancelled; `interrupted` describes the operator call cancellation cut
    /// short, if it cut one short.
    Cancelled {
        /// The interrupted call, as a failure message.
        interrupted: Option<String>,
    },
}

/// The error a cancelled task ends with (the task did not fail; it was told to stop).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cancelled;

impl std::fmt::Display for Cancelled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("task was cancelled")
    }
}

impl std::error::Error for Cancelled {}

/// A stream task. Create it with [`StreamTask::new`], hand out [`StreamTask::handle`]s,
/// then [`StreamTask::run`] it on its own thread.
pub struct StreamTask {
    ctx: TaskContext,
    settings: TaskSettings,
    input: TaskInput,
    chain_factory: Option<ChainFactory>,
    chain: Option<OperatorChain>,
    mailbox: TaskMailbox<StreamTask>,
    timer_service: ProcessingTimeService,
    /// The physical timer for the earliest operator processing-time timer.
    scheduled_timer: Option<(i64, TimerHandle)>,
    flush_timer: Option<TimerHandle>,
    /// Whether the mailbox loop runs; mails that touch operators check it.
    running: bool,
    /// When an idle source wants to be polled again.
    wake_at: Option<Instant>,
    /// The last action stopped because an output channel was full: wait for room, not
    /// for input (which may be there, or, for a source, never signalled).
    blocked_on_output: bool,
    batch: BatchWriter,
    checkpoints: Option<CheckpointLink>,
    /// Source position to resume from.
    restore_position: Option<Vec<u8>>,
    /// A stop-with-savepoint in progress: the savepoint id and whether it drains.
    sync_savepoint: Option<(u64, bool)>,
    /// A stop-with-savepoint completed: end the input now (sources).
    stop_requested: bool,
    /// A stop-with-savepoint completed: the task ends with its input, without a final
    /// checkpoint (the savepoint is the last one).
    stopping: bool,
    /// ... without draining: the end of input skips `finish`.
    stopped_without_drain: bool,
    /// The input ended and the operators finished (or were restored finished).
    finished: bool,
    /// Restored from a checkpoint taken after this task had finished: its operators are
    /// opened (a sink still commits what that checkpoint holds) but not finished again.
    finished_on_restore: bool,
    /// The first checkpoint taken while finished; when it completes the task ends.
    final_checkpoint: Option<u64>,
    /// The final checkpoint completed, or the task was finished when a stop completed.
    done: bool,
    /// Asynchronous checkpoint parts started by this task and maybe still running.
    async_checkpoints: Vec<crate::checkpoint::AsyncPartHandle>,
}

impl StreamTask {
    /// A task named `ctx.name` reading `input`, whose chain `chain` builds.
    pub fn new(
        ctx: TaskContext,
        settings: TaskSettings,
        input: TaskInput,
        chain: ChainFactory,
        checkpoints: Option<CheckpointLink>,
        restore_position: Option<Vec<u8>>,
    ) -> Self {
        let timer_service = ProcessingTimeService::new(&ctx.name);
        StreamTask {
            mailbox: TaskMailbox::new(ctx.name.clone()),
            ctx,
            settings,
            input,
            chain_factory: Some(chain),
            chain: None,
            timer_service,
            scheduled_timer: None,
            flush_timer: None,
            running: false,
            wake_at: None,
            blocked_on_output: false,
            batch: BatchWriter::new(),
            checkpoints,
            restore_position,
            sync_savepoint: None,
            stop_requested: false,
            stopping: false,
            stopped_without_drain: false,
            finished: false,
            finished_on_restore: false,
            final_checkpoint: None,
            done: false,
            async_checkpoints: Vec::new(),
        }
    }

    /// Marks the task as restored from a checkpoint taken after it had finished.
    pub fn set_finished_on_restore(&mut self) {
        self.finished_on_restore = true;
    }

    /// A handle for other threads: cancel, trigger checkpoints, notify, fail.
    pub fn handle(&self) -> TaskHandle {
        TaskHandle::new(
            self.ctx.name.clone(),
            self.ctx.id,
            self.mailbox.clone(),
            self.ctx.cancel.clone(),
            self.ctx.metrics.clone(),
        )
    }

    /// The task's name.
    pub fn name(&self) -> &str {
        &self.ctx.name
    }

    fn is_canceled(&self) -> bool {
        self.ctx.cancel.load(Ordering::SeqCst)
    }

    fn chain(&mut self) -> &mut OperatorChain {
        self.chain
            .as_mut()
            .expect("the chain exists while the task runs")
    }

    /// Runs the task to its end on the calling thread.
    pub fn run(mut self) -> Result<TaskOutcome> {
        let mut disposed = false;
        let result = self.invoke(&mut disposed);
        // A task that failed on its own may be cancelled while it cleans up (its failure
        // made the job cancel every task); its error is still the cause, not a
        // consequence of the cancellation.
        let cancelled_first = self.is_canceled();
        let result = self.cleanup(result, disposed);
        match result {
            Ok(()) => Ok(TaskOutcome::Finished),
            Err(e) if e.downcast_ref::<Cancelled>().is_some() => {
                Ok(TaskOutcome::Cancelled { interrupted: None })
            }
            // Once cancelled, errors are consequences of the cancellation (an interrupted
            // call, a downstream task that is gone), as in the reference.
            Err(e) if cancelled_first => {
                let interrupted = e
                    .chain()
                    .filter_map(|c| c.downcast_ref::<crate::chain::OperatorFailure>())
                    .find(|f| {
                        matches!(
                            f.error,
                            crate::chain::CallError::Trap {
                                kind: crate::chain::TrapKind::Cancelled,
                                ..
                            }
                        )
                    })
                    .map(ToString::to_string);
                match &interrupted {
                    Some(note) => tracing::warn!("{}: cancelled; {note}", self.ctx.name),
                    None => tracing::debug!("{}: error after cancellation: {e:#}", self.ctx.name),
                }
                Ok(TaskOutcome::Cancelled { interrupted })
            }
            Err(e) => Err(e.context(format!("task {} failed", self.ctx.name))),
        }
    }

    fn invoke(&mut self, disposed: &mut bool) -> Result<()> {
        // -------- initialize --------
        let factory = self.chain_factory.take().expect("run is called once");
        self.chain = Some(factory(&self.ctx)?);
        if self.is_canceled() {
            return Err(Cancelled.into());
        }
        if let (TaskInput::Source(reader), Some(position)) =
            (&mut self.input, self.restore_position.take())
        {
            reader
                .restore(&position)
                .context("restoring the source position")?;
        }
        self.chain().open_all()?;
        if self.is_canceled() {
            return Err(Cancelled.into());
        }

        // -------- run --------
        self.running = true;
        self.schedule_flush_timer();
        self.reschedule_processing_timer()?;
        let processor = MailboxProcessor::new(self.mailbox.clone());
        let metrics = self.ctx.metrics.clone();
        processor.run(
            self,
            |task| {
                // Time blocked on full outputs inside the action is backpressure, not work.
                let start = Instant::now();
                let blocked_before = metrics.backpressured_ns.load(Ordering::Relaxed);
                let result = task.default_action();
                let blocked = metrics.backpressured_ns.load(Ordering::Relaxed) - blocked_before;
                let busy = start
                    .elapsed()
                    .saturating_sub(Duration::from_nanos(blocked));
                add_duration(&metrics.busy_ns, busy);
                result
            },
            |task, doorbell| {
                let m = &task.ctx.metrics;
                m.mailbox_depth
                    .store(task.mailbox.len() as u64, Ordering::Relaxed);
                m.mails.store(task.mailbox.taken(), Ordering::Relaxed);
                task.wait_for_input(doorbell)
            },
        )?;
        if self.is_canceled() {
            return Err(Cancelled.into());
        }

        // -------- clean shutdown --------
        self.chain().close_all()?;
        self.timer_service.quiesce();
        self.mailbox.quiesce();
        self.running = false;
        let executor = self.mailbox.executor(Priority::DEFAULT);
        while executor.try_yield(self)? {}
        if !self
            .timer_service
            .await_pending_after_quiesce(self.settings.timer_shutdown_timeout)
        {
            tracing::warn!(
                "{}: a timer callback was still running after {:?}; shutting down anyway",
                self.ctx.name,
                self.settings.timer_shutdown_timeout
            );
        }
        let ended = self
            .chain()
            .flush_outputs()
            .and_then(|()| self.chain().finish_outputs());
        self.owed_downstream(ended)?;
        self.chain().dispose_all()?;
        *disposed = true;
        Ok(())
    }

    /// After its final checkpoint completed a task owes its downstream tasks nothing:
    /// they ended their data before that checkpoint's barrier and end themselves once it
    /// completes, maybe before this task's end of partition reaches them. A channel they
    /// closed is then no error; before, it is.
    fn owed_downstream(&self, sent: Result<()>) -> Result<()> {
        match sent {
            Err(e) if self.done && e.is::<crate::network::DownstreamGone>() => Ok(()),
            sent => sent,
        }
    }

    /// The `finally` of the lifecycle: always runs; never replaces the first error.
    fn cleanup(&mut self, result: Result<()>, disposed: bool) -> Result<()> {
        self.running = false;
        // Asynchronous parts still running are discarded: they will not acknowledge.
        if result.is_err() {
            for pending in self.async_checkpoints.drain(..) {
                pending.discard();
            }
        }
        if !self
            .timer_service
            .shutdown(self.settings.timer_shutdown_timeout)
        {
            tracing::warn!(
                "{}: timer service did not shut down within {:?}",
                self.ctx.name,
                self.settings.timer_shutdown_timeout
            );
        }
        if let Some(chain) = self.chain.as_mut().filter(|_| !disposed)
            && let Err(e) = chain.dispose_all()
        {
            if result.is_err() {
                tracing::error!("{}: while disposing after a failure: {e:#}", self.ctx.name);
            } else {
                return Err(e);
            }
        }
        self.ctx
            .metrics
            .mails
            .store(self.mailbox.taken(), Ordering::Relaxed);
        for letter in self.mailbox.close() {
            tracing::debug!(
                "{}: dropped mail '{}' at shutdown",
                self.ctx.name,
                letter.description
            );
        }
        // Releasing the outputs: dropping the chain drops the channel senders, which
        // downstream tasks see as a disconnect if no end of partition was sent.
        self.chain = None;
        result
    }

    /// One unit of work: one input batch, watermark, barrier or end of input.
    fn default_action(&mut self) -> Result<ActionResult> {
        if self.done {
            return Ok(ActionResult::Done);
        }
        if self.chain().is_backpressured() {
            self.blocked_on_output = true;
            return Ok(ActionResult::Suspend);
        }
        if self.stop_requested || (self.finished_on_restore && !self.finished && self.is_source()) {
            return self.end_of_input();
        }
        let result = match &mut self.input {
            // A finished source waits for its final checkpoint: only mails come.
            TaskInput::Source(_) if self.finished => ActionResult::Suspend,
            // Inputs that all ended before a final checkpoint reached this task (their
            // tasks ended without one): no barrier can come any more.
            TaskInput::Network(gate)
                if self.finished && self.final_checkpoint.is_none() && gate.is_ended() =>
            {
                ActionResult::Done
            }
            TaskInput::Source(_) => self.poll_source()?,
            TaskInput::Network(_) => self.poll_network()?,
        };
        if self.settings.buffer_timeout.is_zero() || result != ActionResult::Continue {
            // Idle or done: send what is buffered instead of waiting for the timeout.
            self.chain().flush_outputs()?;
        }
        self.reschedule_processing_timer()?;
        Ok(result)
    }

    fn poll_source(&mut self) -> Result<ActionResult> {
        use crate::connectors::SourceStatus;
        use crate::network::StreamStatus;
        let TaskInput::Source(reader) = &mut self.input else {
            unreachable!("called for source tasks only")
        };
        self.batch.clear();
        let status = reader
            .source
            .poll(&mut self.batch, self.settings.batch_size)?;
        let count = self.batch.len();
        let mut watermark = None;
        let mut watermarks = Vec::new();
        let mut became_active = false;
        let records = if count > 0 {
            // Read only by the idle timeout: no clock read per batch without one.
            if reader.idle_timeout.is_some() {
                reader.last_record = Instant::now();
            }
            became_active = std::mem::replace(&mut reader.idle, false);
            let records = match &reader.event_time {
                // Stamped by the source, with a watermark per split (a Kafka partition).
                Some(spec) if reader.source_stamps => {
                    watermark = reader
                        .source
                        .watermark(spec.out_of_orderness_ms, reader.idle_timeout);
                    self.batch.take()
                }
                Some(spec) => {
                    let stamped;
                    (stamped, watermarks) = reader.watermarks.assign(
                        spec,
                        self.batch.as_bytes(),
                        &mut reader.emitted,
                    )?;
                    watermark = reader.watermarks.watermark(spec);
                    if let Some(w) = watermark {
                        reader.emitted = reader.emitted.max(w);
                    }
                    stamped
                }
                None => self.batch.take(),
            };
            Some(records)
        } else {
            // A source whose watermark comes apart from its records (an exchange topic's
            // reader, from its producers' watermark records) moves event time without
            // any.
            if let Some(spec) = &reader.event_time
                && reader.source_stamps
                && reader.source.watermark_without_records()
            {
                watermark = reader
                    .source
                    .watermark(spec.out_of_orderness_ms, reader.idle_timeout);
            }
            None
        };
        // Idle because everything upstream is (an exchange topic's producers): active
        // again as soon as one of them is, records or not.
        let upstream_idle = reader.source.upstream_idle();
        if count == 0 && reader.idle && reader.idle_upstream && !upstream_idle {
            reader.idle = false;
            became_active = true;
        }
        let became_idle = count == 0
            && !reader.idle
            && (reader.source.has_nothing_to_read()
                || upstream_idle
                || (reader
                    .idle_timeout
                    .is_some_and(|t| reader.last_record.elapsed() >= t)
                    && reader.source.read_to_end()));
        if became_idle {
            reader.idle = true;
        }
        reader.idle_upstream = reader.idle && upstream_idle;
        let wake_at = match status {
            SourceStatus::Idle { retry_at } => reader.wake_at(retry_at),
            _ => None,
        };
        if became_active {
            self.chain().emit_status(StreamStatus::Active)?;
        }
        if let Some(records) = records {
            self.ctx
                .metrics
                .records_in
                .fetch_add(count as u64, Ordering::Relaxed);
            // The watermark after the batch goes with it (after its last record), so
            // the operators pass it on with what they emit.
            if let Some(w) = watermark
                && watermarks.last().is_none_or(|last| last.watermark < w)
            {
                watermarks.push(crate::network::BatchWatermark {
                    before: count as u32,
                    watermark: w,
                });
            }
            self.chain().process(0, records, count, watermarks)?;
        }
        if let Some(w) = watermark {
            self.chain().advance_watermark(w)?;
        }
        if became_idle {
            self.chain().emit_status(StreamStatus::Idle)?;
        }
        Ok(match status {
            SourceStatus::More => ActionResult::Continue,
            SourceStatus::Idle { .. } => {
                self.wake_at = wake_at;
                if count > 0 {
                    ActionResult::Continue
                } else {
                    ActionResult::Suspend
                }
            }
            SourceStatus::End => self.end_of_input()?,
        })
    }

    fn poll_network(&mut self) -> Result<ActionResult> {
        use crate::network::GateEvent;
        let TaskInput::Network(gate) = &mut self.input else {
            unreachable!("called for network tasks only")
        };
        let Some(event) = gate.poll()? else {
            return Ok(ActionResult::Suspend);
        };
        match event {
            GateEvent::Records {
                input,
                bytes,
                count,
                watermarks,
            } => {
                self.ctx
                    .metrics
                    .records_in
                    .fetch_add(u64::from(count), Ordering::Relaxed);
                self.chain()
                    .process(input, bytes, count as usize, watermarks)?;
            }
            GateEvent::Watermark(w) => self.chain().advance_watermark(w)?,
            GateEvent::Checkpoint(barrier) => self.trigger_checkpoint_on_barrier(barrier)?,
            GateEvent::AbortCheckpoint(id) => self.abort_checkpoint_on_barrier(id)?,
            GateEvent::Status(status) => self.chain().emit_status(status)?,
            GateEvent::EndOfInput => return self.end_of_input(),
        }
        Ok(ActionResult::Continue)
    }

    /// The input ended: end of event time (for sources), then `finish` head to tail.
    /// After a stop-with-savepoint without drain, operators are not finished: the job
    /// will resume from the savepoint, and finishing would emit results twice; nor are
    /// operators restored finished. Then, with checkpointing and unless a stop ends the
    /// task, the task waits for its final checkpoint.
    fn end_of_input(&mut self) -> Result<ActionResult> {
        if self.finished {
            return Ok(ActionResult::Suspend);
        }
        if !self.stopped_without_drain {
            // A source restored finished had reached the end of event time before the
            // checkpoint: it says so again, or the tasks reading it would wait for its
            // watermark for ever (their channels start over at the minimum). Its
            // operators, restored at the maximum, fire nothing again.
            if self.is_source() {
                self.chain().advance_watermark(i64::MAX)?;
            }
            if !self.finished_on_restore {
                self.chain().finish_all()?;
            }
        }
        self.finished = true;
        let Some(link) = self.checkpoints.clone().filter(|_| !self.stopping) else {
            return Ok(ActionResult::Done);
        };
        self.chain().end_data()?;
        self.chain().flush_outputs()?;
        link.input_ended(self.ctx.id);
        Ok(ActionResult::Suspend)
    }

    fn is_source(&self) -> bool {
        matches!(self.input, TaskInput::Source(_))
    }

    /// Blocks until input, a mail, or (for an idle source) its retry time.
    fn wait_for_input(&mut self, doorbell: &crossbeam_channel::Receiver<()>) -> Result<()> {
        let start = Instant::now();
        // Not whether the output is full now: the receiver may have made room since the
        // action looked, and the source would then wait for a mail that may not come.
        let backpressured = std::mem::take(&mut self.blocked_on_output);
        let deadline = self.wake_at.take();
        if backpressured {
            let chain = self.chain.as_ref().expect("backpressured implies a chain");
            input::wait_for_output(doorbell, chain.network_outputs());
            add_duration(&self.ctx.metrics.backpressured_ns, start.elapsed());
            return Ok(());
        }
        match &self.input {
            TaskInput::Network(gate) => gate.wait(doorbell, deadline),
            TaskInput::Source(reader) => {
                input::wait_for_source(doorbell, reader.source.waker(), deadline)
            }
        }
        add_duration(&self.ctx.metrics.idle_ns, start.elapsed());
        Ok(())
    }

    /// Keeps one physical timer armed for the earliest operator processing-time timer.
    fn reschedule_processing_timer(&mut self) -> Result<()> {
        let next = match self.chain.as_mut() {
            Some(chain) => chain.next_processing_timer()?,
            None => None,
        };
        let Some(next) = next else {
            return Ok(());
        };
        if self
            .scheduled_timer
            .as_ref()
            .is_some_and(|(at, _)| *at <= next)
        {
            return Ok(());
        }
        if let Some((_, old)) = self.scheduled_timer.take() {
            old.cancel();
        }
        let mailbox = self.mailbox.clone();
        let handle = self.timer_service.register_timer(next, move |at| {
            let _ = mailbox.put(
                Priority::MAX,
                "fire processing-time timers",
                Box::new(move |task: &mut StreamTask| task.on_processing_time(at)),
            );
        });
        self.scheduled_timer = Some((next, handle));
        Ok(())
    }

    fn on_processing_time(&mut self, at: i64) -> Result<()> {
        if self.scheduled_timer.as_ref().is_some_and(|(t, _)| *t == at) {
            self.scheduled_timer = None;
        }
        // Processing time does not advance for finished operators, nor inside the
        // synchronous savepoint of a stop (the timer fires after it, if the task goes on),
        // nor once that savepoint completed: the task stops, and a job resumed from the
        // savepoint fires the timer (a timer mail that comes late must not either).
        if !self.running || self.finished || self.stopping || self.sync_savepoint.is_some() {
            return Ok(());
        }
        let now = now_millis().max(at);
        self.chain().fire_processing_timers(now)?;
        self.reschedule_processing_timer()?;
        Ok(())
    }

    /// Periodically sends partly filled output buffers (the buffer timeout). Reschedules
    /// relative to when it ran, so a stalled task does not get a burst of flushes.
    fn schedule_flush_timer(&mut self) {
        let timeout = self.settings.buffer_timeout;
        if timeout.is_zero()
            || self
                .chain
                .as_ref()
                .is_none_or(|c| c.network_outputs().next().is_none())
        {
            return;
        }
        let mailbox = self.mailbox.clone();
        let at = now_millis() + timeout.as_millis() as i64;
        self.flush_timer = Some(self.timer_service.register_timer(at, move |_| {
            let _ = mailbox.put(
                Priority::CONTROL,
                "flush output buffers",
                Box::new(|task: &mut StreamTask| {
                    if task.running {
                        task.chain().flush_outputs()?;
                        task.schedule_flush_timer();
                    }
                    Ok(())
                }),
            );
        }));
    }
}

impl std::fmt::Debug for StreamTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamTask")
            .field("name", &self.ctx.name)
            .field("running", &self.running)
            .finish()
    }
}

/// Turns a panic payload into an error (a task thread must never take the host down).
pub fn panic_to_error(payload: Box<dyn std::any::Any + Send>) -> anyhow::Error {
    let message = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into());
    anyhow!("internal error: the task thread panicked: {message}")
}
