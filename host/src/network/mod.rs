//! Data exchange between tasks: stream elements, bounded channels, partitioners, the
//! buffered writer on the sending side, the input gate on the receiving side, and barrier
//! alignment.
//!
//! Every pair of (upstream subtask, downstream subtask) connected by an edge has its own
//! bounded channel of [`StreamElement`]s. A full channel blocks the sender: that is the
//! backpressure that keeps memory bounded (at most `channel_capacity` buffers of about
//! `buffer_bytes` each per channel).

mod alignment;
mod gate;
mod partitioner;
mod writer;

pub use alignment::{AlignAction, BarrierAligner, CheckpointingMode};
pub use gate::{GateEvent, InputGate, UpstreamFailed};
pub use partitioner::{KeySelector, Partitioner, field_of, hash_target};
pub use writer::{DownstreamGone, NetworkSettings, RecordWriter};

use crossbeam_channel::{Receiver, Sender, bounded};

/// What a checkpoint barrier asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointKind {
    /// A periodic checkpoint.
    Checkpoint,
    /// A savepoint; `stop` makes the job finish once it completes (stop-with-savepoint),
    /// `drain` first advances event time to the end.
    Savepoint {
        /// Finish the job after the savepoint.
        stop: bool,
        /// Advance event time to the end before taking it.
        drain: bool,
    },
}

/// A checkpoint barrier, flowing in-band with the records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Barrier {
    /// Checkpoint id, increasing.
    pub id: u64,
    /// When the coordinator triggered it (ms since the epoch).
    pub timestamp: i64,
    /// Checkpoint or savepoint.
    pub kind: CheckpointKind,
}

/// Whether a stream currently carries records (and so holds back event time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamStatus {
    /// Records may come; the stream's watermark counts.
    Active,
    /// Nothing comes for now; downstream tasks leave this stream out of their watermark
    /// until it is active again.
    Idle,
}

/// Event time advanced to `watermark` before record number `before` of a batch (the
/// number of records: after the last). A batch's watermarks have ascending positions and
/// increasing values; an operator judges each record against the watermark before it, so
/// event time is exact at any batch size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchWatermark {
    /// The record it comes before.
    pub before: u32,
    /// The watermark.
    pub watermark: i64,
}

/// Appends `watermark` at position `before` of `list`, replacing one already at that
/// position (the later watermark of one point holds there).
pub fn push_batch_watermark(list: &mut Vec<BatchWatermark>, before: u32, watermark: i64) {
    match list.last_mut() {
        Some(last) if last.before == before => last.watermark = last.watermark.max(watermark),
        _ => list.push(BatchWatermark { before, watermark }),
    }
}

/// One element of a data stream between two tasks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamElement {
    /// A batch of records in the flat batch encoding.
    Records {
        /// The encoded records.
        bytes: Vec<u8>,
        /// How many records `bytes` holds.
        count: u32,
        /// Watermarks among the records (positions below `count`).
        watermarks: Vec<BatchWatermark>,
    },
    /// Event time has advanced to this point on this channel.
    Watermark(i64),
    /// Checkpoint barrier.
    Barrier(Barrier),
    /// The sender declined checkpoint `id`: do not wait for its barrier on this channel.
    CancelMarker(u64),
    /// The sender became idle or active again.
    Status(StreamStatus),
    /// The sender's input ended and its operators finished: no more records or
    /// watermarks come, but barriers still do until its final checkpoint completes.
    EndOfData,
    /// The sender will send nothing more on this channel.
    EndOfPartition,
}

/// A channel between two subtasks.
pub fn channel(capacity: usize) -> (Sender<StreamElement>, Receiver<StreamElement>) {
    bounded(capacity.max(1))
}
