//! Operator chains: the operators of one task, called one after the other on the task
//! thread, and where their output goes.
//!
//! Records move through a chain batch by batch: operator *i*'s output batch is operator
//! *i + 1*'s input, handed over as the same flat buffer without re-encoding. After every
//! call the chain applies the call's effects to the operator's host-managed state, counts
//! its records, and turns a failure into an [`OperatorFailure`] naming operator and call.

mod operator;

pub use operator::{
    Call, CallError, CallOutput, OpenInfo, Operator, OperatorFailure, OperatorIdentity,
    OperatorState, TrapKind,
};

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use anyhow::{Result, bail};
use sluice_codec::{BatchReader, TimeDomain};

use crate::checkpoint::OperatorSnapshot;
use crate::metrics::{OperatorMetrics, TaskMetrics, add_duration};
use crate::network::{Barrier, RecordWriter, StreamElement};
use crate::timers::{millis_at, now_millis};

/// How many times in a row one watermark or processing-time tick may call an operator's
/// `on-timers` because the previous call registered timers that were already due. Flink
/// fires such timers in the same advance too; beyond this many rounds the operator is
/// looping (each round firing what the one before registered) and the task fails.
pub const MAX_TIMER_ROUNDS: usize = 1000;

/// One operator of a chain with what the chain keeps about it.
pub struct ChainedOperator {
    /// The instance.
    pub operator: Box<dyn Operator>,
    /// The id its state has in checkpoints.
    pub state_id: String,
    /// What it is opened with.
    pub open_info: OpenInfo,
    /// Its metrics.
    pub metrics: Arc<OperatorMetrics>,
}

/// Where the records leaving the last operator of a chain go.
pub enum ChainOutput {
    /// To the next task, through the network.
    Network(RecordWriter),
    /// Nowhere: the last operator is a sink.
    None,
}

/// The operators of one task, head first, and the task's output.
pub struct OperatorChain {
    operators: Vec<ChainedOperator>,
    output: ChainOutput,
    task_metrics: Arc<TaskMetrics>,
    /// The last watermark passed through the chain.
    watermark: i64,
}

impl OperatorChain {
    /// A chain of `operators` (head first) writing to `output`.
    pub fn new(
        mut operators: Vec<ChainedOperator>,
        output: ChainOutput,
        task_metrics: Arc<TaskMetrics>,
    ) -> Self {
        // Restored operators continue from their checkpointed watermark.
        let watermark = operators
            .iter_mut()
            .map(|l| l.operator.state().watermark)
            .max()
            .unwrap_or(i64::MIN);
        OperatorChain {
            operators,
            output,
            task_metrics,
            watermark,
        }
    }

    /// Number of operators.
    pub fn len(&self) -> usize {
        self.operators.len()
    }

    /// True for a chain without operators.
    pub fn is_empty(&self) -> bool {
        self.operators.is_empty()
    }

    /// The operators, head first.
    pub fn operators(&self) -> &[ChainedOperator] {
        &self.operators
    }

    /// The operators, head first, for changes (tests, restores).
    pub fn operators_mut(&mut self) -> &mut [ChainedOperator] {
        &mut self.operators
    }

    /// Calls operator `i` and handles the result: effects applied, records counted.
    fn call(
        &mut self,
        i: usize,
        call: Call,
        f: impl FnOnce(&mut dyn Operator) -> Result<CallOutput, CallError>,
    ) -> Result<(Vec<u8>, usize)> {
        let link = &mut self.operators[i];
        let start = Instant::now();
        let result = f(&mut *link.operator);
        let end = Instant::now();
        add_duration(&link.metrics.busy_ns, end - start);
        link.metrics
            .memory_bytes
            .store(link.operator.memory_bytes(), Relaxed);
        link.metrics
            .log_lines_dropped
            .store(link.operator.log_lines_dropped(), Relaxed);
        let fail = |error: CallError, op: &dyn Operator| OperatorFailure {
            identity: op.identity().clone(),
            call,
            error,
        };
        let output = result.map_err(|e| fail(e, &*link.operator))?;
        let now = millis_at(end);
        let writes = if output.effects.is_empty() {
            0
        } else {
            link.operator
                .state()
                .apply_effects(&output.effects, now)
                .map_err(|e| fail(e, &*link.operator))?
        };
        link.operator
            .state()
            .settle(now, writes)
            .map_err(|e| fail(e, &*link.operator))?;
        let count = BatchReader::count(&output.records).map_err(|e| {
            fail(
                CallError::Contract(format!("returned {e}")),
                &*link.operator,
            )
        })?;
        if call == Call::Open && count > 0 {
            return Err(fail(
                CallError::Contract("emitted records from `open`, which may not emit".into()),
                &*link.operator,
            )
            .into());
        }
        link.metrics.records_out.fetch_add(count as u64, Relaxed);
        Ok((output.records, count))
    }

    /// Opens every operator, tail to head (so an operator's successors are ready before
    /// it can emit anything).
    pub fn open_all(&mut self) -> Result<()> {
        for i in (0..self.operators.len()).rev() {
            let info = self.operators[i].open_info.clone();
            self.call(i, Call::Open, |op| op.open(&info))?;
        }
        Ok(())
    }

    /// Passes a batch of `count` records to the head and on through the chain.
    pub fn process(&mut self, records: Vec<u8>, count: usize) -> Result<()> {
        self.push(0, records, count)
    }

    /// Passes records into the chain at operator `from` (or to the output when `from`
    /// is past the tail).
    fn push(&mut self, from: usize, mut records: Vec<u8>, mut count: usize) -> Result<()> {
        for i in from..self.operators.len() {
            if count == 0 {
                return Ok(());
            }
            let m = &self.operators[i].metrics;
            m.records_in.fetch_add(count as u64, Relaxed);
            m.batches.fetch_add(1, Relaxed);
            (records, count) = self.call(i, Call::Process, |op| op.process(&records))?;
        }
        if count > 0 {
            match &mut self.output {
                ChainOutput::Network(w) => w.emit(&records, count)?,
                ChainOutput::None => bail!(
                    "the last operator of the chain emitted {count} records, but nothing \
                     follows it (a job must end in a sink)"
                ),
            }
        }
        Ok(())
    }

    /// Advances event time to `watermark`: for each operator head to tail, fires its
    /// due event-time timers and calls `process-watermark`, passing what they emit down
    /// the chain; then forwards the watermark to the output.
    pub fn advance_watermark(&mut self, watermark: i64) -> Result<()> {
        if watermark <= self.watermark {
            return Ok(());
        }
        self.watermark = watermark;
        self.task_metrics.watermark.store(watermark, Relaxed);
        for i in 0..self.operators.len() {
            self.operators[i].operator.state().watermark = watermark;
            self.fire_timers(i, TimeDomain::EventTime, watermark)?;
            let (records, count) = self.call(i, Call::ProcessWatermark, |op| {
                op.process_watermark(watermark)
            })?;
            self.push(i + 1, records, count)?;
        }
        if let ChainOutput::Network(w) = &mut self.output {
            w.emit_watermark(watermark)?;
        }
        Ok(())
    }

    /// Fires the processing-time timers due at `now` in every operator, head to tail.
    pub fn fire_processing_timers(&mut self, now: i64) -> Result<()> {
        for i in 0..self.operators.len() {
            self.fire_timers(i, TimeDomain::ProcessingTime, now)?;
        }
        Ok(())
    }

    /// Fires operator `i`'s timers of `domain` due at `time`, again while firing them
    /// registered more that are due — at most [`MAX_TIMER_ROUNDS`] times, so an operator
    /// that keeps registering timers that are already due fails instead of holding the
    /// task (no checkpoint, no stop) for ever.
    fn fire_timers(&mut self, i: usize, domain: TimeDomain, time: i64) -> Result<()> {
        for _ in 0..MAX_TIMER_ROUNDS {
            let Some(timers) = self.operators[i]
                .operator
                .state()
                .timers
                .pop_due(domain, time)
            else {
                return Ok(());
            };
            let (records, count) = self.call(i, Call::OnTimers, |op| op.on_timers(&timers))?;
            self.push(i + 1, records, count)?;
        }
        let link = &mut self.operators[i];
        if link
            .operator
            .state()
            .timers
            .next(domain)
            .is_none_or(|t| t > time)
        {
            return Ok(());
        }
        let domain = match domain {
            TimeDomain::EventTime => "event-time",
            TimeDomain::ProcessingTime => "processing-time",
        };
        Err(OperatorFailure {
            identity: link.operator.identity().clone(),
            call: Call::OnTimers,
            error: CallError::Limit(format!(
                "{MAX_TIMER_ROUNDS} rounds of `on-timers` at {domain} {time} each registered \
                 {domain} timers that were already due: a timer registered for a time not \
                 later than the one firing fires again at once; register the next one for a \
                 later time"
            )),
        }
        .into())
    }

    /// The earliest processing-time timer of any operator.
    pub fn next_processing_timer(&mut self) -> Option<i64> {
        self.operators
            .iter_mut()
            .filter_map(|l| l.operator.state().timers.next(TimeDomain::ProcessingTime))
            .min()
    }

    /// End of input: `finish` on every operator, head to tail, so what an operator
    /// flushes reaches the ones after it before they finish.
    pub fn finish_all(&mut self) -> Result<()> {
        for i in 0..self.operators.len() {
            let (records, count) = self.call(i, Call::Finish, |op| op.finish())?;
            self.push(i + 1, records, count)?;
        }
        Ok(())
    }

    /// Clean shutdown: `close` on every operator, head to tail.
    pub fn close_all(&mut self) -> Result<()> {
        for i in 0..self.operators.len() {
            let (records, count) = self.call(i, Call::Close, |op| op.close())?;
            self.push(i + 1, records, count)?;
        }
        Ok(())
    }

    /// `dispose` on every operator, tail to head, even when some fail. Returns the first
    /// failure; the others are logged.
    pub fn dispose_all(&mut self) -> Result<()> {
        let mut first = None;
        for link in self.operators.iter_mut().rev() {
            if let Err(error) = link.operator.dispose() {
                let failure = OperatorFailure {
                    identity: link.operator.identity().clone(),
                    call: Call::Dispose,
                    error,
                };
                if first.is_none() {
                    first = Some(failure);
                } else {
                    tracing::error!("{failure}");
                }
            }
        }
        match first {
            Some(f) => Err(f.into()),
            None => Ok(()),
        }
    }

    /// The synchronous part of a checkpoint: every operator's own state (its `snapshot`
    /// call) and an O(1) copy of its keyed state and timers, head first.
    pub fn snapshot(&mut self, checkpoint_id: u64) -> Result<Vec<OperatorSnapshot>> {
        let mut snapshots = Vec::with_capacity(self.operators.len());
        let now = now_millis();
        for i in 0..self.operators.len() {
            let link = &mut self.operators[i];
            let start = Instant::now();
            let result = link.operator.snapshot(checkpoint_id);
            add_duration(&link.metrics.busy_ns, start.elapsed());
            let state = result.map_err(|error| OperatorFailure {
                identity: link.operator.identity().clone(),
                call: Call::Snapshot,
                error,
            })?;
            let host = link.operator.state();
            snapshots.push(OperatorSnapshot {
                operator: link.state_id.clone(),
                state,
                keyed: host.keyed.as_ref().map(|k| k.snapshot(now)),
                timers: host.timers.clone(),
                watermark: host.watermark,
            });
        }
        Ok(snapshots)
    }

    /// Checkpoint `checkpoint_id` completed: tells every operator, tail to head (so a
    /// sink commits before the operators feeding it hear of it).
    pub fn notify_complete(&mut self, checkpoint_id: u64) -> Result<()> {
        for link in self.operators.iter_mut().rev() {
            link.operator
                .notify_complete(checkpoint_id)
                .map_err(|error| OperatorFailure {
                    identity: link.operator.identity().clone(),
                    call: Call::NotifyComplete,
                    error,
                })?;
        }
        Ok(())
    }

    /// Checkpoint `checkpoint_id` was aborted: tells every operator.
    pub fn notify_aborted(&mut self, checkpoint_id: u64) -> Result<()> {
        for link in self.operators.iter_mut().rev() {
            link.operator
                .notify_aborted(checkpoint_id)
                .map_err(|error| OperatorFailure {
                    identity: link.operator.identity().clone(),
                    call: Call::NotifyAborted,
                    error,
                })?;
        }
        Ok(())
    }

    /// Sends a barrier (after all buffered records) to every output channel.
    pub fn broadcast_barrier(&mut self, barrier: Barrier) -> Result<()> {
        if let ChainOutput::Network(w) = &mut self.output {
            w.broadcast_barrier(barrier)?;
        }
        Ok(())
    }

    /// Tells every output channel that the task became idle or active.
    pub fn emit_status(&mut self, status: crate::network::StreamStatus) -> Result<()> {
        if let ChainOutput::Network(w) = &mut self.output {
            w.emit_status(status)?;
        }
        Ok(())
    }

    /// Tells every output channel not to wait for checkpoint `id`.
    pub fn broadcast_cancel_marker(&mut self, id: u64) -> Result<()> {
        if let ChainOutput::Network(w) = &mut self.output {
            w.broadcast(StreamElement::CancelMarker(id))?;
        }
        Ok(())
    }

    /// Sends buffered records.
    pub fn flush_outputs(&mut self) -> Result<()> {
        if let ChainOutput::Network(w) = &mut self.output {
            w.flush()?;
        }
        Ok(())
    }

    /// True when records are buffered and not sent yet.
    pub fn has_buffered_output(&self) -> bool {
        matches!(&self.output, ChainOutput::Network(w) if w.has_buffered())
    }

    /// The network output, if the chain has one.
    pub fn network_output(&self) -> Option<&RecordWriter> {
        match &self.output {
            ChainOutput::Network(w) => Some(w),
            ChainOutput::None => None,
        }
    }

    /// Tells every output channel that no more data comes from this task.
    pub fn end_data(&mut self) -> Result<()> {
        if let ChainOutput::Network(w) = &mut self.output {
            w.end_data()?;
        }
        Ok(())
    }

    /// Tells every output channel that this task has ended.
    pub fn finish_outputs(&mut self) -> Result<()> {
        if let ChainOutput::Network(w) = &mut self.output {
            w.finish()?;
        }
        Ok(())
    }

    /// The task's metrics.
    pub fn task_metrics(&self) -> &Arc<TaskMetrics> {
        &self.task_metrics
    }
}
