//! Where a task's input comes from, and waiting for it.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use crossbeam_channel::{Receiver, Select};
use serde::{Deserialize, Serialize};

use crate::connectors::{EventTime, Source, WatermarkGenerator};
use crate::network::{InputGate, RecordWriter};

/// A task reads either a source or the channels from upstream tasks.
pub enum TaskInput {
    /// A source of the job.
    Source(SourceReader),
    /// Channels from the subtasks of upstream operators.
    Network(InputGate),
}

/// A source with what the task adds to it: event time, watermarks, idleness.
pub struct SourceReader {
    /// The source.
    pub source: Box<dyn Source>,
    /// Where records carry event time, if they do.
    pub event_time: Option<EventTime>,
    /// Silence after which the source declares itself idle.
    pub idle_timeout: Option<Duration>,
    /// The watermark generator (checkpointed with the source's position).
    pub watermarks: WatermarkGenerator,
    /// When the source last produced records.
    pub last_record: Instant,
    /// Whether it declared itself idle.
    pub idle: bool,
    /// Whether it is idle because everything upstream of it is ([`Source::upstream_idle`]).
    ///
    /// [`Source::upstream_idle`]: crate::connectors::Source::upstream_idle
    pub idle_upstream: bool,
    /// The last watermark sent (inside a batch or after one).
    pub emitted: i64,
    /// The source stamps its records with event time itself and keeps a watermark per
    /// split (a Kafka source, per partition); `watermarks` is then unused.
    pub source_stamps: bool,
}

/// What a checkpoint keeps of a source subtask.
#[derive(Debug, Serialize, Deserialize)]
struct SourceCheckpoint {
    position: Vec<u8>,
    watermarks: WatermarkGenerator,
}

/// Merges the checkpointed positions of several subtasks of a source into one, for a
/// source that can resume at another parallelism: `merge` merges the sources' own
/// positions; of the watermark generators the one that saw the least is kept, so no
/// record becomes late that was not.
pub fn merge_source_checkpoints(
    parts: &[Vec<u8>],
    merge: impl Fn(&[Vec<u8>]) -> Result<Vec<u8>>,
) -> Result<Vec<u8>> {
    let parts: Vec<SourceCheckpoint> = parts
        .iter()
        .map(|p| postcard::from_bytes(p).context("decoding a source's checkpointed position"))
        .collect::<Result<_>>()?;
    let positions: Vec<Vec<u8>> = parts.iter().map(|p| p.position.clone()).collect();
    let watermarks = WatermarkGenerator {
        max_timestamp: parts
            .iter()
            .filter_map(|p| p.watermarks.max_timestamp)
            .min(),
    };
    Ok(postcard::to_allocvec(&SourceCheckpoint {
        position: merge(&positions)?,
        watermarks,
    })?)
}

impl SourceReader {
    /// A source with event time and idleness as configured.
    pub fn new(
        mut source: Box<dyn Source>,
        event_time: Option<EventTime>,
        idle_timeout: Option<Duration>,
    ) -> Self {
        let source_stamps = event_time
            .as_ref()
            .is_some_and(|spec| source.stamps_event_time(spec));
        SourceReader {
            source_stamps,
            source,
            event_time,
            idle_timeout,
            watermarks: WatermarkGenerator::default(),
            last_record: Instant::now(),
            idle: false,
            idle_upstream: false,
            emitted: i64::MIN,
        }
    }

    /// A source without event time or idleness.
    pub fn plain(source: Box<dyn Source>) -> Self {
        Self::new(source, None, None)
    }

    /// The bytes a checkpoint keeps: the position and the watermark generator.
    pub fn checkpoint(&self) -> Vec<u8> {
        postcard::to_allocvec(&SourceCheckpoint {
            position: self.source.position(),
            watermarks: self.watermarks.clone(),
        })
        .expect("encoding a source checkpoint cannot fail")
    }

    /// Continues from bytes [`SourceReader::checkpoint`] returned.
    pub fn restore(&mut self, bytes: &[u8]) -> Result<()> {
        let c: SourceCheckpoint =
            postcard::from_bytes(bytes).context("decoding the source's checkpointed position")?;
        self.source.seek(&c.position)?;
        self.watermarks = c.watermarks;
        Ok(())
    }

    /// When an idle source must be looked at again: its retry time, or the moment it
    /// becomes idle (only its retry time while it has input not read: it is not idle
    /// then however long it has been silent, and must not be polled in a busy loop).
    pub fn wake_at(&self, retry_at: Option<Instant>) -> Option<Instant> {
        let idle_at = (!self.idle)
            .then(|| self.idle_timeout.map(|t| self.last_record + t))
            .flatten()
            .filter(|at| *at > Instant::now() || self.source.read_to_end());
        match (retry_at, idle_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// Blocks until the mailbox doorbell rings, the source's waker fires, or `deadline`.
pub(super) fn wait_for_source(
    doorbell: &Receiver<()>,
    waker: Option<&Receiver<()>>,
    deadline: Option<Instant>,
) {
    let mut sel = Select::new();
    sel.recv(doorbell);
    if let Some(w) = waker {
        sel.recv(w);
    }
    match deadline {
        Some(d) => {
            let _ = sel.ready_deadline(d);
        }
        None => {
            sel.ready();
        }
    }
}

/// Blocks until a full output channel has room again or the doorbell rings. Returns at
/// once when no channel is full any more: the receiver may have taken from it since the
/// caller looked, and waiting for the doorbell alone would stall the task until its next
/// mail (the buffer timeout's flush, if any).
pub(super) fn wait_for_output<'w>(
    doorbell: &Receiver<()>,
    writers: impl Iterator<Item = &'w RecordWriter>,
) {
    let mut sel = Select::new();
    sel.recv(doorbell);
    let mut full = 0;
    for ch in writers.flat_map(RecordWriter::channels) {
        if ch.is_full() {
            sel.send(ch);
            full += 1;
        }
    }
    if full > 0 {
        sel.ready();
    }
}
