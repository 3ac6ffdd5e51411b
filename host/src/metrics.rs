//! Metrics of tasks and operators: atomics written by the task thread, read by anyone
//! (the progress line, the end-of-run report, a metrics endpoint).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::LazyLock;
use std::sync::atomic::{AtomicI64, AtomicU8, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use crate::chain::Call;

use parking_lot::Mutex;

/// Counters of one operator instance.
#[derive(Debug, Default)]
pub struct OperatorMetrics {
    /// Records passed to `process`.
    pub records_in: AtomicU64,
    /// Records the operator emitted.
    pub records_out: AtomicU64,
    /// `process` calls.
    pub batches: AtomicU64,
    /// Time spent inside calls of this operator, in nanoseconds.
    pub busy_ns: AtomicU64,
    /// Counters the operator keeps (`add-counter` effects), by name.
    pub counters: Arc<Mutex<BTreeMap<String, u64>>>,
    /// Largest linear memory of the instance, in bytes.
    pub memory_bytes: AtomicU64,
    /// Memory the host holds for its keyed state, as of its last checkpoint.
    pub state_memory_bytes: AtomicU64,
    /// Disk its keyed state takes (RocksDB's files), as of its last checkpoint.
    pub state_disk_bytes: AtomicU64,
    /// Guest log lines dropped by the tenant's log rate.
    pub log_lines_dropped: AtomicU64,
    /// Sources of partitioned logs: records behind the end of each partition read
    /// (`topic/partition`), as last known.
    pub lag: Mutex<BTreeMap<String, u64>>,
    /// True for a sink: what it takes in, the job has written.
    pub is_sink: bool,
    /// When the call the operator is in began, in nanoseconds after [`EPOCH`] plus one;
    /// 0 between calls.
    pub call_since: AtomicU64,
    /// Which call that is ([`Call`] as a number).
    pub call: AtomicU8,
}

/// What the times of calls in progress count from: a day before it is first needed, so
/// that the start of any call is after it (where the clock goes back that far).
static EPOCH: LazyLock<Instant> = LazyLock::new(|| {
    let now = Instant::now();
    now.checked_sub(Duration::from_secs(86_400)).unwrap_or(now)
});

/// The call an operator is in, and for how long so far.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct InCall {
    /// The call's name in the WIT (`process`, `snapshot`, …).
    pub call: String,
    /// How long it has run.
    pub running: Duration,
}

/// Counters of one task (one thread running a chain).
#[derive(Debug)]
pub struct TaskMetrics {
    /// Records that entered the task (from its source or input channels).
    pub records_in: AtomicU64,
    /// Records the task sent to its outputs (channels or sink).
    pub records_out: AtomicU64,
    /// Time processing input and mails, in nanoseconds.
    pub busy_ns: AtomicU64,
    /// Time waiting for input or mail, in nanoseconds.
    pub idle_ns: AtomicU64,
    /// Time blocked on full output channels, in nanoseconds.
    pub backpressured_ns: AtomicU64,
    /// Mails queued the last time the task looked.
    pub mailbox_depth: AtomicU64,
    /// Mails run.
    pub mails: AtomicU64,
    /// The task's current input watermark (`i64::MIN` before the first).
    pub watermark: AtomicI64,
}

impl Default for TaskMetrics {
    fn default() -> Self {
        TaskMetrics {
            records_in: AtomicU64::new(0),
            records_out: AtomicU64::new(0),
            busy_ns: AtomicU64::new(0),
            idle_ns: AtomicU64::new(0),
            backpressured_ns: AtomicU64::new(0),
            mailbox_depth: AtomicU64::new(0),
            mails: AtomicU64::new(0),
            watermark: AtomicI64::new(i64::MIN),
        }
    }
}

/// Adds a duration to a nanosecond counter.
pub fn add_duration(counter: &AtomicU64, d: Duration) {
    counter.fetch_add(d.as_nanos() as u64, Relaxed);
}

/// A point-in-time copy of an operator's metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OperatorReport {
    /// Operator name.
    pub operator: String,
    /// Subtask index.
    pub subtask: u32,
    /// Records in.
    pub records_in: u64,
    /// Records out.
    pub records_out: u64,
    /// `process` calls.
    pub batches: u64,
    /// Time inside calls.
    pub busy: Duration,
    /// The operator's own counters.
    pub counters: BTreeMap<String, u64>,
    /// Largest linear memory, in bytes.
    pub memory_bytes: u64,
    /// Memory the host holds for its keyed state, as of its last checkpoint.
    #[serde(default)]
    pub state_memory_bytes: u64,
    /// Disk its keyed state takes, as of its last checkpoint.
    #[serde(default)]
    pub state_disk_bytes: u64,
    /// Guest log lines dropped by the log rate.
    pub log_lines_dropped: u64,
    /// Records behind the end of each partition a source reads.
    pub lag: BTreeMap<String, u64>,
    /// True for a sink.
    pub is_sink: bool,
    /// The call it is in when copied, and for how long so far.
    #[serde(default)]
    pub in_call: Option<InCall>,
}

/// A point-in-time copy of a task's metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TaskReport {
    /// Task name, e.g. `tokenize -> count (2/4)`.
    pub task: String,
    /// True for the tasks that read the job's source.
    pub is_source: bool,
    /// Records in.
    pub records_in: u64,
    /// Records out.
    pub records_out: u64,
    /// Busy time.
    pub busy: Duration,
    /// Idle time.
    pub idle: Duration,
    /// Backpressured time.
    pub backpressured: Duration,
    /// Mailbox depth when last sampled.
    pub mailbox_depth: u64,
    /// Mails run.
    pub mails: u64,
    /// The task's current input watermark, once it has one.
    pub watermark: Option<i64>,
    /// The source the task reads, if it reads one: its records out are the records it
    /// read, with its counters and lag.
    pub source: Option<OperatorReport>,
    /// The task's operators, head first.
    pub operators: Vec<OperatorReport>,
    /// In a job over several hosts: the unit the task belongs to.
    #[serde(default)]
    pub unit: Option<u32>,
    /// In a job over several hosts: the host that runs it (its name in the job's group).
    #[serde(default)]
    pub host: Option<String>,
}

/// The live metrics of a task and its operators, shared with whoever reports them.
#[derive(Debug, Clone)]
pub struct TaskMetricsHandle {
    /// Task name.
    pub task: String,
    /// True for the tasks that read the job's source.
    pub is_source: bool,
    /// Task counters.
    pub metrics: Arc<TaskMetrics>,
    /// The source's name, subtask and metrics, for the tasks that read one.
    pub source: Option<(String, u32, Arc<OperatorMetrics>)>,
    /// `(operator name, subtask, counters)` per operator, head first.
    pub operators: Vec<(String, u32, Arc<OperatorMetrics>)>,
}

impl TaskMetricsHandle {
    /// Copies the current values.
    pub fn report(&self) -> TaskReport {
        let m = &self.metrics;
        TaskReport {
            task: self.task.clone(),
            is_source: self.is_source,
            records_in: m.records_in.load(Relaxed),
            records_out: m.records_out.load(Relaxed),
            busy: Duration::from_nanos(m.busy_ns.load(Relaxed)),
            idle: Duration::from_nanos(m.idle_ns.load(Relaxed)),
            backpressured: Duration::from_nanos(m.backpressured_ns.load(Relaxed)),
            mailbox_depth: m.mailbox_depth.load(Relaxed),
            mails: m.mails.load(Relaxed),
            watermark: Some(m.watermark.load(Relaxed)).filter(|w| *w != i64::MIN),
            source: self
                .source
                .as_ref()
                .map(|(name, subtask, o)| OperatorReport {
                    // What a source reads enters the task.
                    records_out: m.records_in.load(Relaxed),
                    ..o.report(name, *subtask)
                }),
            operators: self
                .operators
                .iter()
                .map(|(name, subtask, o)| o.report(name, *subtask))
                .collect(),
            unit: None,
            host: None,
        }
    }
}

impl OperatorMetrics {
    /// Marks the operator as in `call` since `start` (a relaxed store or two: it runs
    /// around every call).
    pub fn enter(&self, call: Call, start: Instant) {
        let since = start.saturating_duration_since(*EPOCH).as_nanos() as u64 + 1;
        self.call.store(call as u8, Relaxed);
        self.call_since.store(since, Relaxed);
    }

    /// Marks the operator as between calls.
    pub fn leave(&self) {
        self.call_since.store(0, Relaxed);
    }

    /// The call it is in, if any.
    pub fn in_call(&self) -> Option<InCall> {
        let since = self.call_since.load(Relaxed);
        let call = Call::from_index(self.call.load(Relaxed))?;
        (since != 0).then(|| InCall {
            call: call.as_str().to_string(),
            running: EPOCH
                .elapsed()
                .saturating_sub(Duration::from_nanos(since - 1)),
        })
    }

    /// Copies the current values.
    pub fn report(&self, operator: &str, subtask: u32) -> OperatorReport {
        OperatorReport {
            operator: operator.to_string(),
            subtask,
            records_in: self.records_in.load(Relaxed),
            records_out: self.records_out.load(Relaxed),
            batches: self.batches.load(Relaxed),
            busy: Duration::from_nanos(self.busy_ns.load(Relaxed)),
            counters: self.counters.lock().clone(),
            memory_bytes: self.memory_bytes.load(Relaxed),
            state_memory_bytes: self.state_memory_bytes.load(Relaxed),
            state_disk_bytes: self.state_disk_bytes.load(Relaxed),
            log_lines_dropped: self.log_lines_dropped.load(Relaxed),
            lag: self.lag.lock().clone(),
            is_sink: self.is_sink,
            in_call: self.in_call(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_operator_in_a_call_reports_which_and_for_how_long_and_none_between_calls() {
        let m = OperatorMetrics::default();
        assert_eq!(m.in_call(), None);
        for call in [Call::Open, Call::Process, Call::OnTimers, Call::Dispose] {
            let start = Instant::now() - Duration::from_millis(1500);
            m.enter(call, start);
            let in_call = m.report("op", 0).in_call.unwrap();
            assert_eq!(in_call.call, call.as_str());
            assert!(
                in_call.running >= Duration::from_millis(1500),
                "{in_call:?}"
            );
            m.leave();
            assert_eq!(m.report("op", 0).in_call, None);
        }
    }
}
