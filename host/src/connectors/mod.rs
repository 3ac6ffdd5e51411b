//! Native sources and sinks.
//!
//! Sources and sinks sit behind two small interfaces so that the task loop never
//! special-cases one: a [`Source`] is polled for batches and reports a position that goes
//! into checkpoints; a sink is an [`Operator`](crate::chain::Operator) at the tail of a
//! chain that writes what it receives, pre-commits in `snapshot` and commits in
//! `notify-complete` (two-phase commit).

pub mod avro_file;
mod event_time;
pub mod file_sink;
pub mod formats;
pub mod kafka;
mod sources;
mod stdout_sink;

pub use event_time::{EventTime, WatermarkGenerator};
pub use file_sink::FileSink;
pub use sources::{
    FileSource, Generated, GeneratorSource, StdinSource, generated_event, generated_line,
};
pub use stdout_sink::StdoutSink;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use crossbeam_channel::Receiver;
use sluice_codec::BatchWriter;

/// What a poll of a source found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceStatus {
    /// Records were read and more may follow right away.
    More,
    /// Nothing now; poll again at `retry_at`, or when [`Source::waker`] has a message.
    Idle {
        /// When to poll again (`None`: only when woken).
        retry_at: Option<Instant>,
    },
    /// The source is exhausted.
    End,
}

/// A replayable source of records.
pub trait Source: Send {
    /// Appends at most `max` records to `out`.
    fn poll(&mut self, out: &mut BatchWriter, max: usize) -> Result<SourceStatus>;
    /// Where the source stands, to resume exactly after the last record polled.
    fn position(&self) -> Vec<u8>;
    /// Continues from a position returned by [`Source::position`].
    fn seek(&mut self, position: &[u8]) -> Result<()>;
    /// A receiver that gets a message when an idle source may have data (for sources
    /// fed by another thread).
    fn waker(&self) -> Option<&Receiver<()>> {
        None
    }
    /// Whether the source stamps its records with event time by `spec` itself, keeping
    /// a watermark per split (a Kafka source, per partition); otherwise the task stamps
    /// them and keeps one watermark over all of them.
    fn stamps_event_time(&mut self, _spec: &EventTime) -> bool {
        false
    }
    /// The watermark of a source that stamps event time itself: the smallest over its
    /// splits, `None` while a split that is not idle has no record yet. `bound` is the
    /// out-of-orderness, `idle_after` the silence after which a split no longer holds
    /// the watermark back.
    fn watermark(&self, _bound: i64, _idle_after: Option<Duration>) -> Option<i64> {
        None
    }
    /// Whether [`Source::watermark`] may move on when a poll read no record (an exchange
    /// topic's reader: its producers' watermark records are not records).
    fn watermark_without_records(&self) -> bool {
        false
    }
    /// True while the source has nothing it could read (a Kafka source subtask that owns
    /// no partition): it is idle at once, not after the idle timeout, so that it does
    /// not hold back event time downstream.
    fn has_nothing_to_read(&self) -> bool {
        false
    }
    /// False while the source knows it has input it has not read yet (a Kafka partition
    /// just assigned, or behind its end): silence then is not idleness — declared idle,
    /// the source would let event time pass records still to come, and drop them as late.
    fn read_to_end(&self) -> bool {
        true
    }
    /// True while everything upstream of the source is idle (an exchange topic's reader
    /// whose producers all said so): it is idle too, and active again when one is not.
    fn upstream_idle(&self) -> bool {
        false
    }
    /// The position just taken went into checkpoint `checkpoint_id`.
    fn checkpointed(&mut self, _checkpoint_id: u64) {}

    /// Gives the source where to report what it knows beyond the records it reads (its
    /// counters, each partition's lag); called once, before the first poll.
    fn attach_metrics(&mut self, _metrics: Arc<crate::metrics::OperatorMetrics>) {}
    /// Checkpoint `checkpoint_id` completed (for sources that tell their upstream, as a
    /// Kafka source commits its offsets to the consumer group).
    fn notify_complete(&mut self, _checkpoint_id: u64) {}
}

/// How a sink writes a record as a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LineFormat {
    /// The value.
    #[default]
    Value,
    /// The key, a tab, the value.
    KeyValue,
    /// The value, checked to be JSON on one line (JSON lines).
    Json,
}

impl LineFormat {
    /// Appends `record` as one line to `out`; `Err`: why its value cannot be written.
    pub fn write(
        self,
        record: &sluice_codec::RecordRef<'_>,
        out: &mut Vec<u8>,
    ) -> Result<(), String> {
        match self {
            LineFormat::Value => {}
            LineFormat::KeyValue => {
                out.extend_from_slice(record.key.unwrap_or_default());
                out.push(b'\t');
            }
            LineFormat::Json => {
                let why = match formats::check_json(record.value) {
                    Err(why) => Some(why),
                    Ok(()) if record.value.contains(&b'\n') => {
                        Some("JSON over several lines (a JSON lines file takes one a line)".into())
                    }
                    Ok(()) => None,
                };
                if let Some(why) = why {
                    let value = formats::quoted(record.value);
                    return Err(format!("the value {value} is {why}"));
                }
            }
        }
        out.extend_from_slice(record.value);
        out.push(b'\n');
        Ok(())
    }
}
