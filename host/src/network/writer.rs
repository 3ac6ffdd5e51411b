//! The sending side of a task: partitions records into per-channel buffers and sends
//! full buffers, watermarks and barriers.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;
use crossbeam_channel::{SendTimeoutError, Sender, TrySendError};
use sluice_codec::{BatchReader, BatchWriter};

use super::partitioner::hash_target;
use super::{Barrier, BatchWatermark, Partitioner, StreamElement, push_batch_watermark};
use crate::metrics::{TaskMetrics, add_duration};
use crate::spec::limits;

/// Buffering and channel sizes of a job's data exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkSettings {
    /// A channel buffer is sent once it holds this many bytes.
    pub buffer_bytes: usize,
    /// Buffers a channel holds before the sender blocks (backpressure).
    pub channel_capacity: usize,
    /// A partly filled buffer is sent at the latest after this long; zero sends every
    /// batch at once.
    pub buffer_timeout: Duration,
}

impl Default for NetworkSettings {
    fn default() -> Self {
        NetworkSettings {
            buffer_bytes: limits::BUFFER_BYTES.default,
            channel_capacity: limits::CHANNEL_CAPACITY.default,
            buffer_timeout: Duration::from_millis(limits::BUFFER_TIMEOUT_MS.default),
        }
    }
}

/// Writes one task's output to the channels of the next task's subtasks.
pub struct RecordWriter {
    channels: Vec<Sender<StreamElement>>,
    buffers: Vec<BatchWriter>,
    /// Each buffer's watermarks among its records; one after the last record of a sent
    /// buffer waits here for the next records (or goes alone before a control element).
    watermarks: Vec<Vec<BatchWatermark>>,
    partitioner: Partitioner,
    buffer_bytes: usize,
    next: usize,
    cancel: Arc<AtomicBool>,
    metrics: Arc<TaskMetrics>,
}

impl RecordWriter {
    /// A writer to `channels` (indexed by downstream subtask; a forward edge has one).
    pub fn new(
        channels: Vec<Sender<StreamElement>>,
        partitioner: Partitioner,
        settings: &NetworkSettings,
        cancel: Arc<AtomicBool>,
        metrics: Arc<TaskMetrics>,
    ) -> Self {
        let buffers = channels.iter().map(|_| BatchWriter::new()).collect();
        let watermarks = channels.iter().map(|_| Vec::new()).collect();
        RecordWriter {
            channels,
            buffers,
            watermarks,
            partitioner,
            buffer_bytes: settings.buffer_bytes,
            next: 0,
            cancel,
            metrics,
        }
    }

    /// Partitions a batch of `count` records into the channel buffers, sending the
    /// buffers that filled up. Each of the batch's watermarks goes to every channel, at
    /// the point of its records the watermark arrived.
    pub fn emit(
        &mut self,
        batch: &[u8],
        count: usize,
        watermarks: &[BatchWatermark],
    ) -> Result<()> {
        let n = self.channels.len();
        if let Partitioner::Forward | Partitioner::Broadcast = self.partitioner
            && watermarks.is_empty()
            && batch.len() < self.buffer_bytes
        {
            let targets = if n == 1 || matches!(self.partitioner, Partitioner::Forward) {
                0..1
            } else {
                0..n
            };
            for i in targets {
                self.buffers[i].extend_encoded(batch, count);
                self.send_if_full(i)?;
            }
            return Ok(());
        }
        let mut next = watermarks.iter().peekable();
        let mut reader = BatchReader::new(batch);
        let mut r = 0u32;
        while let Some(item) = reader.next_with_bytes() {
            let (record, bytes) = item.map_err(|e| anyhow::anyhow!("an emitted batch: {e}"))?;
            while let Some(w) = next.next_if(|w| w.before <= r) {
                self.watermark_everywhere(w.watermark);
            }
            match &self.partitioner {
                Partitioner::Forward => self.append(0, bytes)?,
                Partitioner::Broadcast => {
                    for i in 0..n {
                        self.append(i, bytes)?;
                    }
                }
                Partitioner::Rebalance => {
                    let i = self.next;
                    self.next = (self.next + 1) % n;
                    self.append(i, bytes)?;
                }
                Partitioner::Hash {
                    key,
                    max_parallelism,
                } => {
                    let k = key.key(&record)?;
                    let i = hash_target(k, n as u32, *max_parallelism);
                    if record.key == Some(k) {
                        self.append(i, bytes)?;
                    } else {
                        self.buffers[i].push_record(sluice_codec::RecordRef {
                            key: Some(k),
                            ..record
                        });
                        self.send_if_full(i)?;
                    }
                }
            }
            r += 1;
        }
        for w in next {
            self.watermark_everywhere(w.watermark);
        }
        Ok(())
    }

    /// Puts a watermark after what every channel's buffer holds.
    fn watermark_everywhere(&mut self, watermark: i64) {
        for (buffer, list) in self.buffers.iter().zip(&mut self.watermarks) {
            push_batch_watermark(list, buffer.len() as u32, watermark);
        }
    }

    /// Appends one encoded record to channel `i`'s buffer.
    fn append(&mut self, i: usize, record: &[u8]) -> Result<()> {
        self.buffers[i].extend_encoded(record, 1);
        self.send_if_full(i)
    }

    fn send_if_full(&mut self, i: usize) -> Result<()> {
        if self.buffers[i].byte_len() >= self.buffer_bytes {
            self.send_buffer(i)?;
        }
        Ok(())
    }

    /// Sends every non-empty buffer.
    pub fn flush(&mut self) -> Result<()> {
        for i in 0..self.channels.len() {
            self.send_buffer(i)?;
        }
        Ok(())
    }

    /// True when some buffer holds records not sent yet.
    pub fn has_buffered(&self) -> bool {
        self.buffers.iter().any(|b| !b.is_empty())
    }

    /// Flushes, then sends `element` on every channel. A watermark still waiting for
    /// records goes first, alone (or not at all when `element` is a later watermark).
    pub fn broadcast(&mut self, element: StreamElement) -> Result<()> {
        self.flush()?;
        for i in 0..self.channels.len() {
            if let Some(w) = self.watermarks[i].pop() {
                debug_assert!(self.watermarks[i].is_empty());
                if !matches!(element, StreamElement::Watermark(_)) {
                    self.send(i, StreamElement::Watermark(w.watermark))?;
                }
            }
            self.send(i, element.clone())?;
        }
        Ok(())
    }

    /// Flushes and sends a watermark on every channel.
    pub fn emit_watermark(&mut self, watermark: i64) -> Result<()> {
        self.broadcast(StreamElement::Watermark(watermark))
    }

    /// Flushes and tells every channel that this task became idle or active.
    pub fn emit_status(&mut self, status: super::StreamStatus) -> Result<()> {
        self.broadcast(StreamElement::Status(status))
    }

    /// Flushes and sends a barrier on every channel.
    pub fn broadcast_barrier(&mut self, barrier: Barrier) -> Result<()> {
        self.broadcast(StreamElement::Barrier(barrier))
    }

    /// Flushes and tells every channel that no more data comes (barriers still do).
    pub fn end_data(&mut self) -> Result<()> {
        self.broadcast(StreamElement::EndOfData)
    }

    /// Flushes and tells every channel that the task is done.
    pub fn finish(&mut self) -> Result<()> {
        self.broadcast(StreamElement::EndOfPartition)
    }

    /// True when some channel is full: emitting now would block.
    pub fn is_backpressured(&self) -> bool {
        self.channels.iter().any(Sender::is_full)
    }

    /// The channels, for waiting until they have room again.
    pub fn channels(&self) -> &[Sender<StreamElement>] {
        &self.channels
    }

    fn send_buffer(&mut self, i: usize) -> Result<()> {
        if self.buffers[i].is_empty() {
            return Ok(());
        }
        let count = self.buffers[i].len() as u32;
        let bytes = self.buffers[i].take();
        let mut watermarks = std::mem::take(&mut self.watermarks[i]);
        if let Some(last) = watermarks.last()
            && last.before == count
        {
            // After the last record: it waits for the next ones.
            self.watermarks[i].push(BatchWatermark {
                before: 0,
                watermark: last.watermark,
            });
            watermarks.pop();
        }
        self.metrics
            .records_out
            .fetch_add(u64::from(count), Ordering::Relaxed);
        self.send(
            i,
            StreamElement::Records {
                bytes,
                count,
                watermarks,
            },
        )
    }

    /// Sends on channel `i`, blocking while it is full (counted as backpressure) but
    /// giving up when the task is cancelled.
    fn send(&self, i: usize, element: StreamElement) -> Result<()> {
        let element = match self.channels[i].try_send(element) {
            Ok(()) => return Ok(()),
            Err(TrySendError::Disconnected(_)) => return Err(DownstreamGone { channel: i }.into()),
            Err(TrySendError::Full(e)) => e,
        };
        let start = Instant::now();
        let mut element = element;
        let result = loop {
            if self.cancel.load(Ordering::Relaxed) {
                break Err(anyhow::anyhow!(
                    "cancelled while waiting for downstream subtask {i}"
                ));
            }
            match self.channels[i].send_timeout(element, Duration::from_millis(50)) {
                Ok(()) => break Ok(()),
                Err(SendTimeoutError::Timeout(e)) => element = e,
                Err(SendTimeoutError::Disconnected(_)) => {
                    break Err(DownstreamGone { channel: i }.into());
                }
            }
        };
        add_duration(&self.metrics.backpressured_ns, start.elapsed());
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::network::{KeySelector, channel};

    fn batch(records: &[(&str, &str)]) -> (Vec<u8>, usize) {
        let mut w = BatchWriter::new();
        for (k, v) in records {
            w.push(Some(k.as_bytes()), v.as_bytes(), None);
        }
        let n = w.len();
        (w.into_bytes(), n)
    }

    fn received(rx: &crossbeam_channel::Receiver<StreamElement>) -> Vec<String> {
        rx.try_iter()
            .flat_map(|e| match e {
                StreamElement::Records { bytes, .. } => BatchReader::new(&bytes)
                    .map(|r| String::from_utf8(r.unwrap().value.to_vec()).unwrap())
                    .collect::<Vec<_>>(),
                other => vec![format!("{other:?}")],
            })
            .collect()
    }

    fn writer(
        n: usize,
        p: Partitioner,
    ) -> (
        RecordWriter,
        Vec<crossbeam_channel::Receiver<StreamElement>>,
    ) {
        let (txs, rxs): (Vec<_>, Vec<_>) = (0..n).map(|_| channel(16)).unzip();
        let w = RecordWriter::new(
            txs,
            p,
            &NetworkSettings::default(),
            Arc::new(AtomicBool::new(false)),
            Arc::new(TaskMetrics::default()),
        );
        (w, rxs)
    }

    #[test]
    fn hash_sends_each_key_to_one_subtask_and_rebalance_round_robins() {
        let (mut w, rxs) = writer(
            3,
            Partitioner::Hash {
                key: KeySelector::RecordKey,
                max_parallelism: 128,
            },
        );
        let (b, n) = batch(&[
            ("a", "a1"),
            ("b", "b1"),
            ("a", "a2"),
            ("c", "c1"),
            ("b", "b2"),
        ]);
        w.emit(&b, n, &[]).unwrap();
        w.flush().unwrap();
        let per_channel: Vec<Vec<String>> = rxs.iter().map(received).collect();
        for key in ["a", "b", "c"] {
            let holders: Vec<usize> = (0..3)
                .filter(|&i| per_channel[i].iter().any(|v| v.starts_with(key)))
                .collect();
            assert_eq!(holders.len(), 1, "{key} in {per_channel:?}");
            assert_eq!(holders[0], hash_target(key.as_bytes(), 3, 128));
        }
        // Order per key is kept.
        let a: Vec<_> = per_channel
            .concat()
            .into_iter()
            .filter(|v| v.starts_with('a'))
            .collect();
        assert_eq!(a, ["a1", "a2"]);

        let (mut w, rxs) = writer(2, Partitioner::Rebalance);
        w.emit(&b, n, &[]).unwrap();
        w.flush().unwrap();
        assert_eq!(received(&rxs[0]), ["a1", "a2", "b2"]);
        assert_eq!(received(&rxs[1]), ["b1", "c1"]);
    }

    #[test]
    fn a_batch_larger_than_a_buffer_goes_in_buffer_sized_pieces() {
        let (tx, rx) = channel(64);
        let settings = NetworkSettings {
            buffer_bytes: 100,
            ..NetworkSettings::default()
        };
        let mut w = RecordWriter::new(
            vec![tx],
            Partitioner::Broadcast,
            &settings,
            Arc::new(AtomicBool::new(false)),
            Arc::new(TaskMetrics::default()),
        );
        let values: Vec<String> = (0..200).map(|i| format!("value {i:03}")).collect();
        let records: Vec<(&str, &str)> = values.iter().map(|v| ("k", v.as_str())).collect();
        let (b, n) = batch(&records);
        assert!(b.len() > 2000);
        w.emit(&b, n, &[]).unwrap();
        w.flush().unwrap();
        let elements: Vec<StreamElement> = rx.try_iter().collect();
        assert!(elements.len() > 10, "{} pieces", elements.len());
        for e in &elements {
            let StreamElement::Records { bytes, .. } = e else {
                panic!("{e:?}")
            };
            // A piece is sent once it reaches a buffer: at most a buffer and a record.
            assert!(bytes.len() < 100 + 20, "{} bytes", bytes.len());
        }
        let got: Vec<String> = elements
            .iter()
            .flat_map(|e| match e {
                StreamElement::Records { bytes, .. } => BatchReader::new(bytes)
                    .map(|r| String::from_utf8(r.unwrap().value.to_vec()).unwrap())
                    .collect::<Vec<_>>(),
                _ => Vec::new(),
            })
            .collect();
        assert_eq!(got, values);
    }

    #[test]
    fn broadcast_copies_and_control_elements_follow_buffered_records() {
        let (mut w, rxs) = writer(2, Partitioner::Broadcast);
        let (b, n) = batch(&[("k", "v")]);
        w.emit(&b, n, &[]).unwrap();
        assert!(w.has_buffered());
        w.emit_watermark(42).unwrap();
        assert!(!w.has_buffered());
        for rx in &rxs {
            assert_eq!(received(rx), ["v", "Watermark(42)"]);
        }
    }

    /// What channel `rx` received, with each batch's watermarks: `v`, `W5@1` (watermark
    /// 5 before the batch's record 1) or another element.
    fn received_with_watermarks(rx: &crossbeam_channel::Receiver<StreamElement>) -> Vec<String> {
        let mut out = Vec::new();
        for e in rx.try_iter() {
            match e {
                StreamElement::Records {
                    bytes, watermarks, ..
                } => {
                    out.extend(
                        watermarks
                            .iter()
                            .map(|w| format!("W{}@{}", w.watermark, w.before)),
                    );
                    out.extend(
                        BatchReader::new(&bytes)
                            .map(|r| String::from_utf8(r.unwrap().value.to_vec()).unwrap()),
                    );
                }
                other => out.push(format!("{other:?}")),
            }
        }
        out
    }

    #[test]
    fn watermarks_inside_a_batch_reach_every_channel_where_they_arrived() {
        let (mut w, rxs) = writer(
            2,
            Partitioner::Hash {
                key: KeySelector::RecordKey,
                max_parallelism: 128,
            },
        );
        // Key `a` and key `b` (some key of the other channel) go to different channels.
        let other = ["b", "c", "d", "e", "f", "g"]
            .into_iter()
            .find(|k| hash_target(k.as_bytes(), 2, 128) != hash_target(b"a", 2, 128))
            .unwrap();
        let (b, n) = batch(&[("a", "a1"), (other, "b1"), ("a", "a2"), ("a", "a3")]);
        let at = |before, watermark| BatchWatermark { before, watermark };
        w.emit(&b, n, &[at(1, 10), at(2, 20), at(3, 30)]).unwrap();
        w.flush().unwrap();
        let got: Vec<Vec<String>> = rxs.iter().map(received_with_watermarks).collect();
        let (ch_a, ch_b) = if got[0].contains(&"a1".to_owned()) {
            (&got[0], &got[1])
        } else {
            (&got[1], &got[0])
        };
        // `a`'s channel: 10 and 20 collapse (no record of it between), 30 before a3.
        assert_eq!(*ch_a, ["W20@1", "W30@2", "a1", "a2", "a3"]);
        // `b`'s channel: 10 before b1; 20 and 30 after its last record wait for more.
        assert_eq!(*ch_b, ["W10@0", "b1"]);
        // ... and go alone before the next control element.
        w.broadcast_barrier(Barrier {
            id: 1,
            timestamp: 0,
            kind: super::super::CheckpointKind::Checkpoint,
        })
        .unwrap();
        let got: Vec<Vec<String>> = rxs.iter().map(received_with_watermarks).collect();
        let b_after = if got[0].len() == 2 { &got[0] } else { &got[1] };
        assert_eq!(b_after[0], "Watermark(30)");
        // A later watermark between batches makes a waiting one unnecessary.
        let (b, n) = batch(&[(other, "b2")]);
        w.emit(&b, n, &[at(1, 40)]).unwrap();
        w.flush().unwrap();
        w.emit_watermark(50).unwrap();
        let got: Vec<Vec<String>> = rxs.iter().map(received_with_watermarks).collect();
        assert!(
            got.iter()
                .all(|ch| !ch.contains(&"Watermark(40)".to_owned())),
            "{got:?}"
        );
        assert!(
            got.iter().all(|ch| ch.last().unwrap() == "Watermark(50)"),
            "{got:?}"
        );
    }

    #[test]
    fn a_full_channel_blocks_until_cancelled() {
        let (tx, _rx) = channel(1);
        let cancel = Arc::new(AtomicBool::new(false));
        let metrics = Arc::new(TaskMetrics::default());
        let mut w = RecordWriter::new(
            vec![tx],
            Partitioner::Forward,
            &NetworkSettings::default(),
            cancel.clone(),
            metrics.clone(),
        );
        w.emit_watermark(1).unwrap();
        let canceller = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            cancel.store(true, Ordering::Relaxed);
        });
        let err = w.emit_watermark(2).unwrap_err();
        assert!(err.to_string().contains("cancelled"));
        canceller.join().unwrap();
        assert!(metrics.backpressured_ns.load(Ordering::Relaxed) >= 50_000_000);
    }
}

/// An output channel's receiver is gone: the subtask it fed ended or failed. A
/// consequence of another task's end, never the cause of a job's failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DownstreamGone {
    /// The output channel.
    pub channel: usize,
}

impl std::fmt::Display for DownstreamGone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "downstream subtask {} is gone", self.channel)
    }
}

impl std::error::Error for DownstreamGone {}
