//! Operator chains: the operators of one task, called one after the other on the task
//! thread, and where their output goes.
//!
//! Records move through a chain batch by batch: operator *i*'s output batch is operator
//! *i + 1*'s input, handed over as the same flat buffer without re-encoding. After every
//! call the chain applies the call's effects to the operator's host-managed state, counts
//! its records, and turns a failure into an [`OperatorFailure`] naming operator and call.

mod operator;
#[cfg(test)]
mod tests;

pub use operator::{
    Call, CallError, CallOutput, Firing, InputInfo, OpenInfo, Operator, OperatorFailure,
    OperatorIdentity, OperatorState, ProcessOutput, TrapKind,
};

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use sluice_codec::{BatchReader, BatchWriter, TimeDomain};

use crate::checkpoint::OperatorSnapshot;
use crate::metrics::{OperatorMetrics, TaskMetrics, add_duration};
use crate::network::{Barrier, BatchWatermark, RecordWriter, StreamElement, push_batch_watermark};
use crate::timers::{millis_at, now_millis};

/// How many times in a row one watermark or processing-time tick may call an operator's
/// `on-timers` because the previous call registered timers that were already due. Flink
/// fires such timers in the same advance too; beyond this many rounds the operator is
/// looping (each round firing what the one before registered) and the task fails.
pub const MAX_TIMER_ROUNDS: usize = 1000;

/// The most timers one `on-timers` call is given: a window over a million keys fires its
/// million timers in calls of this many, so no call's input or output outgrows the
/// instance's memory or its output limit.
pub const TIMERS_PER_CALL: usize = 4096;

/// The counter of records sent to side outputs that nothing reads.
pub const SIDE_OUTPUT_DROPPED: &str = "side-output-dropped";

/// What a call sent on: its main output's records and the watermarks among them.
struct Emitted {
    records: Vec<u8>,
    count: usize,
    watermarks: Vec<BatchWatermark>,
}

/// The records of one output of a call, with the call's watermarks placed among them.
struct OutputPart {
    records: BatchWriter,
    watermarks: Vec<BatchWatermark>,
}

impl Emitted {
    /// Takes out the records sent to side outputs (checking that each was declared),
    /// keeping the main output's, and returns them by side output number (records without
    /// their `output`, as a reader gets them). Every part gets all the call's watermarks,
    /// each at the point of its records where it arrived.
    fn split_side_outputs(&mut self, declared: usize) -> Result<Vec<(u32, Emitted)>, String> {
        let mut parts: Vec<OutputPart> = (0..=declared)
            .map(|_| OutputPart {
                records: BatchWriter::new(),
                watermarks: Vec::new(),
            })
            .collect();
        let mut next = self.watermarks.iter().peekable();
        let place = |parts: &mut Vec<OutputPart>, watermark: i64| {
            for p in parts.iter_mut() {
                push_batch_watermark(&mut p.watermarks, p.records.len() as u32, watermark);
            }
        };
        for (n, record) in BatchReader::new(&self.records).enumerate() {
            let record = record.map_err(|e| format!("returned {e}"))?;
            while let Some(w) = next.next_if(|w| w.before as usize == n) {
                place(&mut parts, w.watermark);
            }
            let Some(part) = parts.get_mut(record.output as usize) else {
                return Err(format!(
                    "emitted a record to side output {} but declared {declared}",
                    record.output
                ));
            };
            part.records.push_record(sluice_codec::RecordRef {
                output: 0,
                ..record
            });
        }
        for w in next {
            place(&mut parts, w.watermark);
        }
        let mut parts = parts.into_iter().map(|p| Emitted {
            count: p.records.len(),
            records: p.records.into_bytes(),
            watermarks: p.watermarks,
        });
        *self = parts.next().expect("the main output is part 0");
        Ok((1..).zip(parts).filter(|(_, p)| p.count > 0).collect())
    }
}

/// Drops the watermarks not above `seen` or below one before them, and keeps one per
/// position (the last): what a receiver can use.
fn normalize_watermarks(watermarks: &mut Vec<BatchWatermark>, seen: i64) {
    if watermarks.is_empty() {
        return;
    }
    let mut floor = seen;
    let mut kept = Vec::with_capacity(watermarks.len());
    for w in watermarks.drain(..) {
        if w.watermark > floor {
            floor = w.watermark;
            push_batch_watermark(&mut kept, w.before, w.watermark);
        }
    }
    *watermarks = kept;
}

/// Checks that watermarks an operator passed on have ascending positions within its
/// `count` records and increasing values.
fn check_watermark_positions(watermarks: &[BatchWatermark], count: usize) -> Result<(), String> {
    for pair in watermarks.windows(2) {
        if pair[1].before < pair[0].before || pair[1].watermark <= pair[0].watermark {
            return Err(format!(
                "returned watermarks out of order: {} before record {}, then {} before record {}",
                pair[0].watermark, pair[0].before, pair[1].watermark, pair[1].before
            ));
        }
    }
    match watermarks.last() {
        Some(w) if w.before as usize > count => Err(format!(
            "returned a watermark before record {} of {count}",
            w.before
        )),
        _ => Ok(()),
    }
}

/// The byte length of the first `n` records of `records`.
fn skip_records(records: &[u8], n: usize) -> Result<usize> {
    let mut reader = BatchReader::new(records);
    let mut len = 0;
    for _ in 0..n {
        match reader.next_with_bytes() {
            Some(item) => len += item?.1.len(),
            None => bail!("a batch has fewer than {n} records"),
        }
    }
    Ok(len)
}

/// What is wrong when a job reads side output `side` of an operator that declared only
/// `declared`.
pub fn undeclared_side_output(side: &str, declared: &[String]) -> String {
    let declared = if declared.is_empty() {
        "none".to_string()
    } else {
        let names: Vec<String> = declared.iter().map(|d| format!("'{d}'")).collect();
        names.join(", ")
    };
    format!("the job reads its side output '{side}', but it declared {declared} in `open`")
}

/// A failure to read or write operator `link`'s timers (its state database's, say a full
/// disk): a failure to restart from, not the operator's.
fn timer_failure(link: &ChainedOperator, e: crate::state::StateError) -> anyhow::Error {
    anyhow::anyhow!("{}: its timers: {e}", link.operator.identity())
}

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

/// One edge out of a chain's tail: its main output or one of its side outputs, to the
/// subtasks of one reading task.
pub struct OutputEdge {
    /// The side output it carries, by name; `None` for the main output.
    side: Option<String>,
    /// Its number, once the tail declared it in `open` (0: the main output).
    output: u32,
    writer: RecordWriter,
}

impl OutputEdge {
    /// An edge carrying the tail's main output (`side` = `None`) or its side output `side`.
    pub fn new(side: Option<String>, writer: RecordWriter) -> Self {
        OutputEdge {
            side,
            output: 0,
            writer,
        }
    }

    /// Its channels.
    pub fn writer(&self) -> &RecordWriter {
        &self.writer
    }
}

/// Where the records leaving the last operator of a chain go.
pub enum ChainOutput {
    /// To the tasks that read it, through the network: one edge per reader.
    Network(Vec<OutputEdge>),
    /// Nowhere: the last operator is a sink.
    None,
}

impl ChainOutput {
    /// The main output to one reading task.
    pub fn single(writer: RecordWriter) -> Self {
        ChainOutput::Network(vec![OutputEdge::new(None, writer)])
    }

    fn edges(&mut self) -> &mut [OutputEdge] {
        match self {
            ChainOutput::Network(edges) => edges,
            ChainOutput::None => &mut [],
        }
    }

    /// Runs `f` on every edge's writer.
    fn each(&mut self, mut f: impl FnMut(&mut RecordWriter) -> Result<()>) -> Result<()> {
        for edge in self.edges() {
            f(&mut edge.writer)?;
        }
        Ok(())
    }
}

/// The operators of one task, head first, and the task's output.
pub struct OperatorChain {
    operators: Vec<ChainedOperator>,
    output: ChainOutput,
    task_metrics: Arc<TaskMetrics>,
    /// The last watermark given to the chain.
    watermark: i64,
    /// The last watermark sent to the output.
    forwarded: i64,
    /// The input of the head the batch being processed came from.
    input: u32,
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
            // Nothing was sent in this attempt: the readers' channels start over at the
            // minimum, so even the watermark the operators were restored at goes out.
            forwarded: i64::MIN,
            input: 0,
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

    /// Calls operator `i` and handles the result: effects applied, records counted and
    /// checked, those sent to side outputs taken out — sent to their readers when `i` is
    /// the tail, else dropped and counted, as Flink drops an unread side output (only a
    /// task's tail has side outputs that are read).
    fn call(
        &mut self,
        i: usize,
        call: Call,
        f: impl FnOnce(&mut dyn Operator) -> Result<ProcessOutput, CallError>,
    ) -> Result<Emitted> {
        let link = &mut self.operators[i];
        let start = Instant::now();
        link.metrics.enter(call, start);
        let result = f(&mut *link.operator);
        link.metrics.leave();
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
        let ProcessOutput {
            output, watermarks, ..
        } = result.map_err(|e| fail(e, &*link.operator))?;
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
        let declared = link.operator.state().outputs.len();
        let contract = |m: String| fail(CallError::Contract(m), &*link.operator);
        let scan =
            BatchReader::scan(&output.records).map_err(|e| contract(format!("returned {e}")))?;
        if scan.count > 0 {
            match call {
                Call::Open => {
                    return Err(
                        contract("emitted records from `open`, which may not emit".into()).into(),
                    );
                }
                // The final checkpoint committed the job's output before `close`: what
                // it emitted would reach no sink's commit, so it would be lost.
                Call::Close => {
                    return Err(contract(format!(
                        "emitted {} record(s) from `close`, which may not emit: the job's \
                         output was committed before it; emit buffered records in `finish`",
                        scan.count
                    ))
                    .into());
                }
                _ => {}
            }
        }
        check_watermark_positions(&watermarks, scan.count).map_err(&contract)?;
        let mut emitted = Emitted {
            records: output.records,
            count: scan.count,
            watermarks,
        };
        let all = emitted.count;
        let sides = if scan.side_outputs {
            emitted.split_side_outputs(declared).map_err(&contract)?
        } else {
            Vec::new()
        };
        link.metrics.records_out.fetch_add(all as u64, Relaxed);
        // Side outputs are read only from a chain's tail (a side output read by anyone
        // ends a chain); the records of those nothing reads are dropped and counted, as
        // Flink drops an unread side output.
        let tail = i + 1 == self.operators.len();
        let mut dropped = 0;
        for (output, mut part) in sides {
            let mut read = false;
            if tail {
                normalize_watermarks(&mut part.watermarks, self.forwarded);
                for edge in self.output.edges() {
                    if edge.side.is_some() && edge.output == output {
                        edge.writer
                            .emit(&part.records, part.count, &part.watermarks)?;
                        read = true;
                    }
                }
            }
            if !read {
                dropped += part.count;
            }
        }
        if dropped > 0 {
            let state = self.operators[i].operator.state();
            let mut counters = state.counters.lock();
            *counters.entry(SIDE_OUTPUT_DROPPED.into()).or_default() += dropped as u64;
        }
        Ok(emitted)
    }

    /// Numbers the side outputs the tail's readers name, as the tail declared them in
    /// `open`; a side output it did not declare is a mistake of the job file.
    fn resolve_side_outputs(&mut self) -> Result<()> {
        let Some(tail) = self.operators.last_mut() else {
            return Ok(());
        };
        let declared = tail.operator.state().outputs.clone();
        let identity = tail.operator.identity().clone();
        for edge in self.output.edges() {
            let Some(side) = &edge.side else { continue };
            match declared.iter().position(|d| d == side) {
                Some(n) => edge.output = n as u32 + 1,
                None => {
                    return Err(OperatorFailure {
                        identity,
                        call: Call::Open,
                        error: CallError::InvalidConfig(undeclared_side_output(side, &declared)),
                    }
                    .into());
                }
            }
        }
        Ok(())
    }

    /// Opens every operator, tail to head (so an operator's successors are ready before
    /// it can emit anything).
    pub fn open_all(&mut self) -> Result<()> {
        for i in (0..self.operators.len()).rev() {
            let info = self.operators[i].open_info.clone();
            self.call(i, Call::Open, |op| op.open(&info).map(Into::into))?;
        }
        self.resolve_side_outputs()
    }

    /// Passes a batch of `count` records of the head's input `input`, with the
    /// watermarks that arrived among them, to the head and on through the chain.
    pub fn process(
        &mut self,
        input: u32,
        records: Vec<u8>,
        count: usize,
        watermarks: Vec<BatchWatermark>,
    ) -> Result<()> {
        self.input = input;
        if let Some(last) = watermarks.last()
            && last.watermark > self.watermark
        {
            self.watermark = last.watermark;
            self.task_metrics.watermark.store(last.watermark, Relaxed);
        }
        self.push(0, records, count, watermarks)
    }

    /// Passes records (and their watermarks) into the chain at operator `i`, or to the
    /// output when `i` is past the tail.
    fn push(
        &mut self,
        i: usize,
        records: Vec<u8>,
        count: usize,
        mut watermarks: Vec<BatchWatermark>,
    ) -> Result<()> {
        // What the receiver has seen already is dropped (a guest may pass on anything
        // up to what it was given), and one watermark per position kept.
        let seen = match self.operators.get_mut(i) {
            Some(link) => link.operator.state().watermark,
            None => self.forwarded,
        };
        normalize_watermarks(&mut watermarks, seen);
        if count == 0 {
            // No records to place them among: they advance event time as a watermark
            // between batches does.
            if let Some(last) = watermarks.last() {
                self.advance_from(i, last.watermark)?;
            }
            return Ok(());
        }
        if i == self.operators.len() {
            return self.emit(records, count, watermarks);
        }
        let m = &self.operators[i].metrics;
        m.records_in.fetch_add(count as u64, Relaxed);
        m.batches.fetch_add(1, Relaxed);
        let last = watermarks.last().map(|w| w.watermark);
        if !self.operators[i].operator.takes_batch_watermarks() {
            let out = self.call(i, Call::Process, |op| op.process(&records).map(Into::into))?;
            self.push(i + 1, out.records, out.count, out.watermarks)?;
        } else if watermarks.is_empty() {
            let (out, _) = self.call_segment(i, &records, &[])?;
            self.push(i + 1, out.records, out.count, out.watermarks)?;
        } else {
            self.process_with_watermarks(i, &records, count, &watermarks)?;
        }
        match last {
            // A 0.1.0 (or native) operator sees a batch's watermarks after it.
            Some(w) if !self.operators[i].operator.takes_batch_watermarks() => {
                self.advance_from(i, w)
            }
            // What the operator did not pass on among its records reaches the operators
            // after it and the output now, as a watermark between batches would.
            Some(w) => self.advance_from(i + 1, w),
            None => Ok(()),
        }
    }

    /// Operator `i` handles a batch with watermarks among its records. Before a watermark
    /// that makes one of its event-time timers due, the batch is cut: the records before
    /// it, then the timers, then the rest — so timers fire at the point of the stream
    /// where they are due, as with batches of one record. The operator itself stops
    /// (`stopped_at`) at a watermark that makes due a timer it registered in the same call.
    fn process_with_watermarks(
        &mut self,
        i: usize,
        records: &[u8],
        count: usize,
        watermarks: &[BatchWatermark],
    ) -> Result<()> {
        // `first` record and `k`th watermark not given yet; `offset`: the record's byte.
        let (mut first, mut k, mut offset) = (0usize, 0usize, 0usize);
        while first < count || k < watermarks.len() {
            let mut op_watermark = self.operators[i].operator.state().watermark;
            // The first later watermark that makes a known timer due cuts the batch.
            let mut cut = self
                .due_watermark(i, &watermarks[k..], op_watermark)
                .map(|j| k + j);
            if let Some(j) = cut
                && watermarks[j].before as usize == first
            {
                // Due right here: the timers fire before the rest is given (with this
                // watermark first, so the operator sees it too).
                let w = watermarks[j].watermark;
                self.operators[i].operator.state().watermark = w;
                self.fire_timers(i, TimeDomain::EventTime, w)?;
                op_watermark = w;
                cut = self
                    .due_watermark(i, &watermarks[j + 1..], op_watermark)
                    .map(|n| j + 1 + n);
            }
            let (end, wm_end) = match cut {
                Some(j) => (watermarks[j].before as usize, j),
                None => (count, watermarks.len()),
            };
            let end_offset = if end == count {
                records.len()
            } else {
                offset + skip_records(&records[offset..], end - first)?
            };
            let given: Vec<BatchWatermark> = watermarks[k..wm_end]
                .iter()
                .map(|w| BatchWatermark {
                    before: w.before - first as u32,
                    watermark: w.watermark,
                })
                .collect();
            let segment = &records[offset..end_offset];
            let (out, stopped) = self.call_segment(i, segment, &given)?;
            // What the operator handled: everything, or up to the watermark it stopped at.
            let (handled_records, handled_wms) = match stopped {
                None => (end - first, given.len()),
                Some(s) => (given[s].before as usize, s),
            };
            if let Some(w) = given[..handled_wms].last()
                && w.watermark > op_watermark
            {
                self.operators[i].operator.state().watermark = w.watermark;
            }
            offset += if handled_records == end - first {
                segment.len()
            } else {
                skip_records(segment, handled_records)?
            };
            first += handled_records;
            k += handled_wms;
            self.push(i + 1, out.records, out.count, out.watermarks)?;
        }
        Ok(())
    }

    /// The index in `watermarks` of the first one past `current` that makes an event-time
    /// timer of operator `i` due.
    fn due_watermark(
        &mut self,
        i: usize,
        watermarks: &[BatchWatermark],
        current: i64,
    ) -> Option<usize> {
        let next = self.next_timer(i, TimeDomain::EventTime).ok()??;
        watermarks
            .iter()
            .position(|w| w.watermark > current && w.watermark >= next)
    }

    /// Calls `process` of operator `i` (which takes watermarks) with a segment of a batch;
    /// checks where it stopped and that it passed on no watermark it was not given.
    fn call_segment(
        &mut self,
        i: usize,
        records: &[u8],
        given: &[BatchWatermark],
    ) -> Result<(Emitted, Option<usize>)> {
        let mut stopped = None;
        let input = if i == 0 { self.input } else { 0 };
        let out = self.call(i, Call::Process, |op| {
            let p = op.process_batch(input, records, given)?;
            if let Some(s) = p.stopped_at {
                let s = s as usize;
                if s >= given.len() || (s == 0 && given[0].before == 0) {
                    return Err(CallError::Contract(format!(
                        "stopped at watermark {s} of the {} it was given without handling \
                         anything before it",
                        given.len()
                    )));
                }
                stopped = Some(s);
            }
            let handled = stopped.map_or(given, |s| &given[..s]);
            let highest = handled.last().map_or(i64::MIN, |w| w.watermark);
            if let Some(w) = p.watermarks.iter().find(|w| w.watermark > highest) {
                return Err(CallError::Contract(format!(
                    "passed on watermark {} beyond those it handled",
                    w.watermark
                )));
            }
            Ok(p)
        })?;
        Ok((out, stopped))
    }

    /// Sends what leaves the tail. (Its watermarks go into the channel buffers; the
    /// batch's last one also goes alone after the batch, see `push`, so that a channel
    /// whose buffer holds it back waiting for records still gets it.)
    fn emit(
        &mut self,
        records: Vec<u8>,
        count: usize,
        watermarks: Vec<BatchWatermark>,
    ) -> Result<()> {
        let mut read = false;
        for edge in self.output.edges() {
            if edge.side.is_none() {
                edge.writer.emit(&records, count, &watermarks)?;
                read = true;
            }
        }
        if !read {
            bail!(
                "the last operator of the chain emitted {count} records, but nothing \
                 reads its output (a job must end in a sink)"
            );
        }
        Ok(())
    }

    /// Advances event time to `watermark`: for each operator head to tail, fires its
    /// due event-time timers and calls `process-watermark`, passing what they emit down
    /// the chain; then forwards the watermark to the output.
    pub fn advance_watermark(&mut self, watermark: i64) -> Result<()> {
        if watermark > self.watermark {
            self.watermark = watermark;
            self.task_metrics.watermark.store(watermark, Relaxed);
        }
        self.advance_from(0, watermark)
    }

    /// Advances event time to `watermark` from operator `from` on (each operator that is
    /// not there yet), then at the output.
    fn advance_from(&mut self, from: usize, watermark: i64) -> Result<()> {
        for i in from..self.operators.len() {
            if watermark <= self.operators[i].operator.state().watermark {
                continue;
            }
            self.operators[i].operator.state().watermark = watermark;
            self.fire_timers(i, TimeDomain::EventTime, watermark)?;
            let out = self.call(i, Call::ProcessWatermark, |op| {
                op.process_watermark(watermark).map(Into::into)
            })?;
            self.push(i + 1, out.records, out.count, out.watermarks)?;
        }
        if watermark > self.forwarded && matches!(self.output, ChainOutput::Network(_)) {
            self.forwarded = watermark;
            self.output.each(|w| w.emit_watermark(watermark))?;
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

    /// Fires operator `i`'s timers of `domain` due at `time`, in calls of at most
    /// [`TIMERS_PER_CALL`], and again while firing them registered more that are due — at
    /// most [`MAX_TIMER_ROUNDS`] times, so an operator that keeps registering timers that
    /// are already due fails instead of holding the task (no checkpoint, no stop) for
    /// ever.
    fn fire_timers(&mut self, i: usize, domain: TimeDomain, time: i64) -> Result<()> {
        let state = self.operators[i].operator.state();
        state.firing = Some(Firing {
            domain,
            time,
            due_again: 0,
        });
        let fired = self.fire_due_timers(i, domain, time);
        self.operators[i].operator.state().firing = None;
        if !fired? {
            return Ok(());
        }
        let link = &mut self.operators[i];
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

    /// Fires what [`fire_timers`](Self::fire_timers) does; returns true when it stopped
    /// because the operator kept registering timers that were due at once: more rounds
    /// than [`MAX_TIMER_ROUNDS`] after the timers due at the start were all fired, or more
    /// such timers than that many full calls take. Timers that were due at the start fire
    /// however many there are.
    fn fire_due_timers(&mut self, i: usize, domain: TimeDomain, time: i64) -> Result<bool> {
        let (mut drained, mut again) = (false, 0);
        loop {
            let link = &mut self.operators[i];
            let state = link.operator.state();
            let due_again = state.firing.map_or(0, |f| f.due_again);
            let due = state.pop_due_timers(domain, time, TIMERS_PER_CALL);
            let Some((timers, count)) = due.map_err(|e| timer_failure(link, e))? else {
                return Ok(false);
            };
            if drained {
                again += 1;
            }
            if again >= MAX_TIMER_ROUNDS || due_again > (MAX_TIMER_ROUNDS * TIMERS_PER_CALL) as u64
            {
                return Ok(true);
            }
            drained |= count < TIMERS_PER_CALL;
            let out = self.call(i, Call::OnTimers, |op| {
                op.on_timers(&timers).map(Into::into)
            })?;
            self.push(i + 1, out.records, out.count, out.watermarks)?;
        }
    }

    /// The time of operator `i`'s earliest timer of `domain`.
    fn next_timer(&mut self, i: usize, domain: TimeDomain) -> Result<Option<i64>> {
        let link = &mut self.operators[i];
        let next = link.operator.state().next_timer(domain);
        next.map_err(|e| timer_failure(link, e))
    }

    /// The earliest processing-time timer of any operator.
    pub fn next_processing_timer(&mut self) -> Result<Option<i64>> {
        let mut earliest = None;
        for i in 0..self.operators.len() {
            if let Some(t) = self.next_timer(i, TimeDomain::ProcessingTime)? {
                earliest = Some(earliest.map_or(t, |e: i64| e.min(t)));
            }
        }
        Ok(earliest)
    }

    /// End of input: `finish` on every operator, head to tail, so what an operator
    /// flushes reaches the ones after it before they finish.
    pub fn finish_all(&mut self) -> Result<()> {
        for i in 0..self.operators.len() {
            let out = self.call(i, Call::Finish, |op| op.finish().map(Into::into))?;
            self.push(i + 1, out.records, out.count, out.watermarks)?;
        }
        Ok(())
    }

    /// Clean shutdown: `close` on every operator, head to tail.
    pub fn close_all(&mut self) -> Result<()> {
        for i in 0..self.operators.len() {
            let out = self.call(i, Call::Close, |op| op.close().map(Into::into))?;
            self.push(i + 1, out.records, out.count, out.watermarks)?;
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

    /// Records the chain's sink has taken in during this attempt (0 without a sink).
    pub fn sink_records_in(&self) -> u64 {
        self.operators
            .iter()
            .filter(|l| l.metrics.is_sink)
            .map(|l| l.metrics.records_in.load(Relaxed))
            .sum()
    }

    /// The synchronous part of a checkpoint: every operator's own state (its `snapshot`
    /// call), a copy of its timers and a snapshot of its keyed state (O(1) on the heap; a
    /// memtable switch in RocksDB, its files linked by the asynchronous part), head first.
    pub fn snapshot(&mut self, checkpoint_id: u64) -> Result<Vec<OperatorSnapshot>> {
        let mut snapshots = Vec::with_capacity(self.operators.len());
        let now = now_millis();
        for i in 0..self.operators.len() {
            let link = &mut self.operators[i];
            let start = Instant::now();
            link.metrics.enter(Call::Snapshot, start);
            let result = link.operator.snapshot(checkpoint_id);
            link.metrics.leave();
            add_duration(&link.metrics.busy_ns, start.elapsed());
            let state = result.map_err(|error| OperatorFailure {
                identity: link.operator.identity().clone(),
                call: Call::Snapshot,
                error,
            })?;
            let host = link.operator.state();
            let keyed = match host.keyed.as_mut() {
                Some(k) => {
                    link.metrics.state_memory_bytes.store(k.bytes(), Relaxed);
                    link.metrics.state_disk_bytes.store(k.disk_bytes(), Relaxed);
                    Some(k.snapshot(checkpoint_id, now).with_context(|| {
                        format!("{}: snapshot of its keyed state", link.operator.identity())
                    })?)
                }
                None => None,
            };
            let host = link.operator.state();
            snapshots.push(OperatorSnapshot {
                operator: link.state_id.clone(),
                state,
                keyed,
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
        self.output.each(|w| w.broadcast_barrier(barrier))
    }

    /// Tells every output channel, and the operators, that the task became idle or
    /// active.
    pub fn emit_status(&mut self, status: crate::network::StreamStatus) -> Result<()> {
        for link in &mut self.operators {
            link.operator
                .set_idle(status == crate::network::StreamStatus::Idle);
        }
        self.output.each(|w| w.emit_status(status))
    }

    /// Tells every output channel not to wait for checkpoint `id`.
    pub fn broadcast_cancel_marker(&mut self, id: u64) -> Result<()> {
        self.output
            .each(|w| w.broadcast(StreamElement::CancelMarker(id)))
    }

    /// Sends buffered records.
    pub fn flush_outputs(&mut self) -> Result<()> {
        self.output.each(RecordWriter::flush)
    }

    /// True when records are buffered and not sent yet.
    pub fn has_buffered_output(&self) -> bool {
        self.network_outputs().any(RecordWriter::has_buffered)
    }

    /// The writers of the network outputs (none for a chain ending in a sink).
    pub fn network_outputs(&self) -> impl Iterator<Item = &RecordWriter> {
        let edges: &[OutputEdge] = match &self.output {
            ChainOutput::Network(edges) => edges,
            ChainOutput::None => &[],
        };
        edges.iter().map(OutputEdge::writer)
    }

    /// True when some output channel is full: emitting now would block.
    pub fn is_backpressured(&self) -> bool {
        self.network_outputs().any(RecordWriter::is_backpressured)
    }

    /// Tells every output channel that no more data comes from this task.
    pub fn end_data(&mut self) -> Result<()> {
        self.output.each(RecordWriter::end_data)
    }

    /// Tells every output channel that this task has ended.
    pub fn finish_outputs(&mut self) -> Result<()> {
        self.output.each(RecordWriter::finish)
    }

    /// The task's metrics.
    pub fn task_metrics(&self) -> &Arc<TaskMetrics> {
        &self.task_metrics
    }
}
