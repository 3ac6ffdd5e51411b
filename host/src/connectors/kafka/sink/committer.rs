//! An exactly-once sink subtask's committer: a thread that writes the sink's records
//! into Kafka transactions, so the task thread neither sends them nor waits for a
//! commit.
//!
//! Records go into the open transaction as they come (`records`), and the transaction
//! commits once the checkpoint whose barrier ended them (`barrier`) is complete
//! (`complete`), with the checkpoint's marker — as Flink's Kafka sink writes. A producer
//! has one transaction open at a time, so the records that come after a barrier wait in
//! the committer until the transaction before it has committed (then they go into the
//! next one, and those that follow with them). Intervals whose checkpoints completed
//! while an earlier one's transaction was open join that transaction, which then commits
//! with the newest marker. When a checkpoint whose records are in the open transaction
//! is aborted, the transaction is aborted too and its records are sent again into the
//! next one, so no transaction stays open much longer than a checkpoint interval and
//! the time one takes.
//!
//! The task thread keeps every checkpoint's records in its checkpointed state until the
//! committer reports them committed ([`Committer::committed`]): a restore writes again
//! what the marker says did not commit, as before. (A unit of a job over several hosts
//! waits for each completed checkpoint's commit, though: its marker names where a new
//! owner restores, which must stay among the checkpoints its store keeps.)

use std::collections::VecDeque;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use parking_lot::{Condvar, Mutex};
use rdkafka::consumer::ConsumerGroupMetadata;

use super::super::producer::Producer;
use super::writer::Writer;
use crate::chain::CallError;

/// How often an idle committer serves its producer's delivery reports.
const POLL: Duration = Duration::from_millis(100);

/// What the task thread tells the committer, in the order it happens.
enum Order {
    /// Records that came since the last barrier (a batch).
    Records(Vec<u8>),
    /// The barrier of checkpoint `.0` passed the sink: the records since the last one
    /// are its.
    Barrier(u64),
    /// The job completed checkpoint `.0`.
    Complete(u64),
    /// The job aborted checkpoint `.0`.
    Aborted(u64),
}

/// What the committer reports back.
#[derive(Default)]
struct Progress {
    /// The newest checkpoint whose records are committed.
    committed: Option<u64>,
    /// Why the committer stopped, if it failed.
    failed: Option<String>,
    /// The committer's thread has ended.
    ended: bool,
}

#[derive(Default)]
struct Shared {
    progress: Mutex<Progress>,
    changed: Condvar,
}

/// The handle the sink's task thread holds.
pub(super) struct Committer {
    /// The sink's writer: its task's cancellation flag ends a wait.
    writer: Arc<Writer>,
    orders: Option<Sender<Order>>,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Committer {
    /// Starts the committer of a sink subtask writing with `producer` (transactions
    /// initialised), marking checkpoints of run `run` in the marker group `group`.
    pub(super) fn start(
        writer: Arc<Writer>,
        producer: Arc<Producer>,
        group: ConsumerGroupMetadata,
        run: u64,
    ) -> std::io::Result<Committer> {
        let (orders, inbox) = crossbeam_channel::unbounded();
        let shared = Arc::new(Shared::default());
        let thread = std::thread::Builder::new()
            .name(format!("kafka-commit-{}", writer.config.topic))
            .spawn({
                let shared = shared.clone();
                let line_writer = writer.clone();
                move || {
                    let mut line = Line {
                        writer: line_writer,
                        producer,
                        group,
                        run,
                        intervals: VecDeque::new(),
                        in_transaction: 0,
                        sent: (0, 0),
                        completed: 0,
                    };
                    let result = line.serve(&inbox, &shared);
                    line.abort_open();
                    let mut progress = shared.progress.lock();
                    if let Err(e) = result {
                        progress.failed = Some(e.to_string());
                    }
                    progress.ended = true;
                    shared.changed.notify_all();
                }
            })?;
        Ok(Committer {
            writer,
            orders: Some(orders),
            shared,
            thread: Some(thread),
        })
    }

    fn order(&self, order: Order) -> Result<(), CallError> {
        self.committed()?;
        match &self.orders {
            Some(orders) if orders.send(order).is_ok() => Ok(()),
            _ => Err(self.stopped()),
        }
    }

    /// Hands over records (a batch) that came since the last barrier.
    pub(super) fn records(&self, batch: Vec<u8>) -> Result<(), CallError> {
        self.order(Order::Records(batch))
    }

    /// The barrier of checkpoint `id` passed the sink: the records since the last one
    /// are its.
    pub(super) fn barrier(&self, id: u64) -> Result<(), CallError> {
        self.order(Order::Barrier(id))
    }

    /// Checkpoint `id` is complete: its records, and those of every earlier one, commit.
    pub(super) fn complete(&self, id: u64) -> Result<(), CallError> {
        self.order(Order::Complete(id))
    }

    /// Checkpoint `id` was aborted.
    pub(super) fn aborted(&self, id: u64) -> Result<(), CallError> {
        self.order(Order::Aborted(id))
    }

    /// The newest checkpoint whose records are committed; the committer's error if it
    /// failed.
    pub(super) fn committed(&self) -> Result<Option<u64>, CallError> {
        let progress = self.shared.progress.lock();
        match &progress.failed {
            Some(e) => Err(CallError::Failed(e.clone())),
            None => Ok(progress.committed),
        }
    }

    fn stopped(&self) -> CallError {
        CallError::Failed("the Kafka sink's committer has stopped".into())
    }

    /// Waits until checkpoint `id`'s records are committed, the committer fails, or the
    /// sink's task is cancelled (checked every 100 ms).
    pub(super) fn wait_for(&self, id: u64) -> Result<(), CallError> {
        let mut progress = self.shared.progress.lock();
        loop {
            if let Some(e) = &progress.failed {
                return Err(CallError::Failed(e.clone()));
            }
            if progress.committed.is_some_and(|c| c >= id) {
                return Ok(());
            }
            if progress.ended {
                return Err(self.stopped());
            }
            if self.writer.cancelled() {
                return Err(CallError::Failed(format!(
                    "gave up waiting for checkpoint {id}'s transaction to commit"
                )));
            }
            self.shared.changed.wait_for(&mut progress, POLL);
        }
    }

    /// Stops the committer once it has done what it was given (a transaction open ahead
    /// of its checkpoint's completion is aborted) and waits for its thread.
    pub(super) fn stop(mut self) -> Result<(), CallError> {
        self.orders = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        self.committed().map(drop)
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        // Without `stop` (the task failed or was cancelled), the thread ends by itself
        // once its current step is done: nobody waits for it.
        self.orders = None;
    }
}

/// The records between two barriers: those of one checkpoint, or (without a
/// checkpoint yet) those since the last barrier.
struct Interval {
    checkpoint: Option<u64>,
    batches: Vec<Vec<u8>>,
    /// How many of `batches` are in the open transaction.
    sent: usize,
}

/// The committer's side.
struct Line {
    writer: Arc<Writer>,
    producer: Arc<Producer>,
    group: ConsumerGroupMetadata,
    run: u64,
    /// Records not yet committed, oldest first; only the last may have no checkpoint.
    intervals: VecDeque<Interval>,
    /// How many of the first `intervals` the open transaction holds (0: none is open).
    in_transaction: usize,
    /// Records and bytes sent in the open transaction.
    sent: (usize, usize),
    /// The newest checkpoint the job completed.
    completed: u64,
}

impl Line {
    fn serve(&mut self, inbox: &Receiver<Order>, shared: &Shared) -> Result<(), CallError> {
        loop {
            match inbox.recv_timeout(POLL) {
                Ok(Order::Records(batch)) => match self.intervals.back_mut() {
                    Some(open) if open.checkpoint.is_none() => open.batches.push(batch),
                    _ => self.intervals.push_back(Interval {
                        checkpoint: None,
                        batches: vec![batch],
                        sent: 0,
                    }),
                },
                Ok(Order::Barrier(id)) => match self.intervals.back_mut() {
                    Some(open) if open.checkpoint.is_none() => open.checkpoint = Some(id),
                    _ => self.intervals.push_back(Interval {
                        checkpoint: Some(id),
                        batches: Vec::new(),
                        sent: 0,
                    }),
                },
                Ok(Order::Complete(id)) => self.completed = self.completed.max(id),
                Ok(Order::Aborted(id)) => {
                    let mut held = self.intervals.iter().take(self.in_transaction);
                    if held.any(|i| i.checkpoint == Some(id)) {
                        self.abort_open();
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    self.producer.poll(Duration::ZERO);
                    self.writer.check_deliveries(&self.producer)?;
                }
                Err(RecvTimeoutError::Disconnected) => return Ok(()),
            }
            self.advance(shared)?;
        }
    }

    /// Sends what may go into the open transaction (opening one for the oldest interval
    /// when none is), and commits it once its newest checkpoint is complete.
    fn advance(&mut self, shared: &Shared) -> Result<(), CallError> {
        loop {
            if self.writer.cancelled() {
                return Err(CallError::Failed("the sink's task was cancelled".into()));
            }
            if self.in_transaction == 0 {
                let Some(first) = self.intervals.front() else {
                    return Ok(());
                };
                if first.checkpoint.is_none() && first.batches.is_empty() {
                    return Ok(());
                }
                self.writer.begin(
                    &self.producer,
                    first.checkpoint.unwrap_or(self.completed + 1),
                )?;
                self.in_transaction = 1;
            }
            // Intervals whose checkpoints are complete join the transaction.
            while self.intervals[self.in_transaction - 1].checkpoint.is_some()
                && self
                    .intervals
                    .get(self.in_transaction)
                    .and_then(|i| i.checkpoint)
                    .is_some_and(|c| c <= self.completed)
            {
                self.in_transaction += 1;
            }
            self.send_held()?;
            let last = self.intervals[self.in_transaction - 1].checkpoint;
            let Some(last) = last.filter(|c| *c <= self.completed) else {
                if self.completed > 0 {
                    crate::failpoint!("kafka-sink::sent-ahead");
                }
                return Ok(());
            };
            if let Err(e) = self
                .writer
                .commit(&self.producer, &self.group, self.run, last)
            {
                self.abort_open();
                return Err(e);
            }
            let (records, bytes) = std::mem::take(&mut self.sent);
            self.writer.count(records, bytes, 1, 0);
            self.intervals.drain(..self.in_transaction);
            self.in_transaction = 0;
            self.writer.check_deliveries(&self.producer)?;
            shared.progress.lock().committed = Some(last);
            shared.changed.notify_all();
        }
    }

    /// Sends the batches of the intervals in the open transaction not yet sent.
    fn send_held(&mut self) -> Result<(), CallError> {
        let next = self.completed + 1;
        let (writer, producer) = (&self.writer, &self.producer);
        let sent = self
            .intervals
            .iter_mut()
            .take(self.in_transaction)
            .try_for_each(|interval| {
                let checkpoint = interval.checkpoint.unwrap_or(next);
                while let Some(batch) = interval.batches.get(interval.sent) {
                    let (count, bytes) = writer.send_batch(producer, checkpoint, batch)?;
                    interval.sent += 1;
                    self.sent.0 += count;
                    self.sent.1 += bytes;
                }
                Ok(())
            });
        if sent.is_err() {
            self.abort_open();
        }
        sent
    }

    /// Aborts the open transaction, if any; its records wait again for the next one.
    fn abort_open(&mut self) {
        if self.in_transaction == 0 {
            return;
        }
        let first = self.intervals[0].checkpoint.unwrap_or(self.completed + 1);
        self.writer.abort(&self.producer, first);
        self.sent = (0, 0);
        for interval in self.intervals.iter_mut().take(self.in_transaction) {
            interval.sent = 0;
        }
        self.in_transaction = 0;
    }
}
