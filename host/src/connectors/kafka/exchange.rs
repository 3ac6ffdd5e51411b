//! The exchange protocol: how the stages of a job spread over several hosts talk through
//! Kafka topics. A sink writes an exchange topic's records by key group and, with them,
//! its watermark (and idleness) as records of their own; a source reading the topic takes
//! the smallest watermark over its producers as its event time.

use anyhow::{Result, anyhow};
use rdkafka::message::{BorrowedMessage, Message};
use sluice_codec::{BatchReader, BatchWriter, RecordRef};

use super::source::KafkaSource;

/// The header that marks a record of an exchange topic as a watermark, not data: its
/// value is the producer's number (decimal), the record's value its watermark (8 bytes,
/// big-endian). Each producer writes its watermark to every partition it feeds; a reader
/// takes the smallest over all producers, and `i64::MAX` from every one ends its input.
pub const EXCHANGE_WATERMARK: &str = "sluice-watermark";

/// Beside [`EXCHANGE_WATERMARK`] (any value): the producer is idle (its input carries no
/// records, as Flink's `WatermarkStatus.IDLE`), so readers leave it out of the smallest
/// watermark until its next watermark record without it.
pub const EXCHANGE_IDLE: &str = "sluice-idle";

/// The header that marks a record of an exchange topic as a batch of data records: its
/// value is their flat encoding (`sluice_codec::BatchWriter`: each record's key, value,
/// timestamp and headers), all of the partition the message is in. One Kafka record per
/// batch, not per data record: librdkafka's work per record (queueing it, its
/// acknowledgement, freeing it) was most of an exchange's cost. Watermark records stay
/// records of their own, after the batches they follow.
pub const EXCHANGE_BATCH: &str = "sluice-batch";

/// The most bytes of records a sink puts in one [`EXCHANGE_BATCH`] record (a single
/// larger record goes alone), well under Kafka's default limit of a record (1 MB).
pub const EXCHANGE_BATCH_BYTES: usize = 256 << 10;

/// How a sink writes an exchange topic: each record to the partition of its key's key
/// group (one partition per key group), and its watermark to every partition (see
/// [`EXCHANGE_WATERMARK`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ExchangeOutput {
    /// The key the next stage is keyed by; `None`: records go round-robin.
    pub key: Option<crate::network::KeySelector>,
    /// The exchange topic's partitions: the next stage's key groups.
    pub partitions: u32,
    /// This producer's number among those that write the topic.
    pub producer: u32,
}

/// The producer, watermark and idleness of an exchange topic's watermark record; `None`
/// for a record of data.
pub(super) fn watermark_record(message: &impl Message) -> Result<Option<(u32, i64, bool)>> {
    use rdkafka::message::Headers as _;
    let Some(headers) = message.headers() else {
        return Ok(None);
    };
    let Some(producer) = headers.iter().find(|h| h.key == EXCHANGE_WATERMARK) else {
        return Ok(None);
    };
    let producer = std::str::from_utf8(producer.value.unwrap_or_default())
        .ok()
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| {
            anyhow!(
                "a watermark record at offset {} names no producer",
                message.offset()
            )
        })?;
    let watermark = <[u8; 8]>::try_from(message.payload().unwrap_or_default()).map_err(|_| {
        anyhow!(
            "a watermark record at offset {} is not 8 bytes",
            message.offset()
        )
    })?;
    let idle = headers.iter().any(|h| h.key == EXCHANGE_IDLE);
    Ok(Some((producer, i64::from_be_bytes(watermark), idle)))
}

/// Whether `message` is a batch of an exchange topic's data records ([`EXCHANGE_BATCH`]).
pub(super) fn is_exchange_batch(message: &BorrowedMessage<'_>) -> bool {
    use rdkafka::message::Headers as _;
    message
        .headers()
        .is_some_and(|h| h.iter().any(|h| h.key == EXCHANGE_BATCH))
}

/// The data records of an exchange topic's batch ([`EXCHANGE_BATCH`]) read from
/// `partition`, into `out`: each as it was written, of that partition (a reader's event
/// time is its producers' watermarks, not its records'). Returns how many records and
/// bytes.
pub(super) fn take_batch(
    message: &BorrowedMessage<'_>,
    partition: i32,
    out: &mut BatchWriter,
) -> Result<(u64, usize)> {
    let (mut records, mut bytes) = (0, 0);
    for record in BatchReader::new(message.payload().unwrap_or_default()) {
        let record = record?;
        records += 1;
        bytes += record.value.len() + record.key.map_or(0, <[u8]>::len);
        out.push_record(RecordRef {
            partition: Some(partition as u32),
            ..record
        });
    }
    Ok((records, bytes))
}

impl KafkaSource {
    /// An exchange topic's reader: the largest watermark reached, or the combined one of
    /// its producers (see `exchange_combined`), whichever is larger.
    pub(super) fn exchange_watermark(&self, producers: u32) -> Option<i64> {
        self.exchange_reached.max(self.exchange_combined(producers))
    }

    /// The smallest watermark over the producers not idle, once every one has written
    /// one. While every producer is idle, the largest any of them reached, as Flink's
    /// `StatusWatermarkValve` moves on when its last active channel goes idle: no
    /// producer holds event time back any more. (A producer's last watermark often comes
    /// in one record with its idleness, and producers checkpoint in step; without this,
    /// last watermarks read before the record of a producer that never had one would
    /// never count, and event time would stand at the start for good.)
    fn exchange_combined(&self, producers: u32) -> Option<i64> {
        let known = self.producer_watermarks.range(..producers);
        if known.clone().count() < producers as usize {
            return None;
        }
        let active = known
            .clone()
            .filter(|(p, _)| !self.idle_producers.contains(p))
            .map(|(_, w)| *w)
            .min();
        active.or_else(|| known.map(|(_, w)| *w).filter(|w| *w != i64::MIN).max())
    }

    /// An exchange topic's reader takes a producer's watermark record. As an input gate
    /// takes a channel's watermark before the idleness that follows it, the watermark
    /// counts with the producer as active as it was, and only then its idleness: a
    /// producer that writes its last watermark and its idleness in one record (they
    /// reached its sink within one checkpoint interval) still moves event time to it.
    pub(super) fn take_producer_watermark(
        &mut self,
        producers: u32,
        producer: u32,
        watermark: i64,
        idle: bool,
    ) {
        let w = self
            .producer_watermarks
            .entry(producer)
            .or_insert(watermark);
        *w = (*w).max(watermark);
        self.exchange_reached = self.exchange_watermark(producers);
        if idle {
            self.idle_producers.insert(producer);
        } else {
            self.idle_producers.remove(&producer);
        }
        self.exchange_reached = self.exchange_watermark(producers);
    }

    /// An exchange topic's reader: every producer ended its output (`i64::MAX`).
    pub(super) fn exchange_ended(&self, producers: u32) -> bool {
        let mut known = self.producer_watermarks.range(..producers);
        known.clone().count() == producers as usize && known.all(|(_, w)| *w == i64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;
    use crate::connectors::Source;
    use crate::connectors::kafka::KafkaSourceConfig;
    use crate::connectors::kafka::source::Position;
    use crate::connectors::kafka::test_support::config;

    #[test]
    fn an_exchange_reader_leaves_idle_producers_out_of_event_time() {
        let config = KafkaSourceConfig {
            format: Box::new(crate::connectors::formats::FormatConfig::bytes()),
            exchange_producers: Some(3),
            ..config(false)
        };
        let mut s = KafkaSource::new(config.clone(), 0, 1).unwrap();
        s.producer_watermarks = BTreeMap::from([(0, 5_000), (1, 900)]);
        // Producer 2 has said nothing yet: no watermark, and not idle upstream.
        assert_eq!(s.watermark(0, None), None);
        assert!(!s.upstream_idle());
        // Producer 2 is idle without ever having had a watermark: the others decide.
        s.producer_watermarks.insert(2, i64::MIN);
        s.idle_producers.insert(2);
        assert_eq!(s.watermark(0, None), Some(900));
        s.idle_producers.insert(1);
        assert_eq!(s.watermark(0, None), Some(5_000));
        assert!(!s.upstream_idle());
        // Every producer idle: the reader is idle too, and event time moves to the
        // largest watermark they reached.
        s.idle_producers.insert(0);
        assert_eq!(s.watermark(0, None), Some(5_000));
        assert!(s.upstream_idle());
        // The input ends only when every producer ended, idle or not.
        s.producer_watermarks = BTreeMap::from([(0, i64::MAX), (1, i64::MAX), (2, i64::MIN)]);
        s.idle_producers = BTreeSet::from([2]);
        assert_eq!(s.watermark(0, None), Some(i64::MAX));
        assert!(!s.exchange_ended(3));
        s.producer_watermarks.insert(2, i64::MAX);
        assert!(s.exchange_ended(3));
        // Both survive a checkpoint; a position from before idleness still restores.
        let mut b = KafkaSource::new(config.clone(), 0, 1).unwrap();
        b.seek(&s.position()).unwrap();
        assert_eq!(
            (b.producer_watermarks.clone(), b.idle_producers.clone()),
            (s.producer_watermarks.clone(), s.idle_producers.clone())
        );
        let old = postcard::to_allocvec(&(
            Position {
                offsets: Vec::new(),
                stops: Vec::new(),
                max_timestamps: Vec::new(),
            },
            vec![(0u32, 7i64)],
        ))
        .unwrap();
        let mut c = KafkaSource::new(config, 0, 1).unwrap();
        c.seek(&old).unwrap();
        assert_eq!(c.producer_watermarks, BTreeMap::from([(0, 7)]));
        assert!(c.idle_producers.is_empty());
    }

    #[test]
    fn last_watermarks_count_whatever_order_idle_producers_are_read_in() {
        let config = KafkaSourceConfig {
            format: Box::new(crate::connectors::formats::FormatConfig::bytes()),
            exchange_producers: Some(3),
            ..config(false)
        };
        // Producers 0 and 1 each write their last watermark with their idleness, and
        // producer 2, which never had a record, its idleness: every order in which a
        // reader may take the three ends at the larger last watermark.
        let records = [(0, 4_000), (1, 3_000), (2, i64::MIN)];
        for order in [
            [0, 1, 2],
            [0, 2, 1],
            [1, 0, 2],
            [1, 2, 0],
            [2, 0, 1],
            [2, 1, 0],
        ] {
            let mut s = KafkaSource::new(config.clone(), 0, 1).unwrap();
            for i in order {
                let (producer, watermark) = records[i];
                s.take_producer_watermark(3, producer, watermark, true);
            }
            assert_eq!(s.watermark(0, None), Some(4_000), "{order:?}");
            assert!(s.upstream_idle(), "{order:?}");
        }
    }

    #[test]
    fn a_producers_last_watermark_counts_though_its_idleness_comes_with_it() {
        let config = KafkaSourceConfig {
            format: Box::new(crate::connectors::formats::FormatConfig::bytes()),
            exchange_producers: Some(3),
            ..config(false)
        };
        let mut s = KafkaSource::new(config.clone(), 0, 1).unwrap();
        // Producer 2 never had a record; 0 and 1 move on.
        s.take_producer_watermark(3, 2, i64::MIN, true);
        s.take_producer_watermark(3, 0, 4_000, false);
        assert_eq!(s.watermark(0, None), None);
        s.take_producer_watermark(3, 1, 2_000, false);
        assert_eq!(s.watermark(0, None), Some(2_000));
        // Producer 0 writes its last watermark with its idleness: it counted first.
        s.take_producer_watermark(3, 0, 6_000, true);
        assert_eq!(s.watermark(0, None), Some(2_000));
        s.take_producer_watermark(3, 1, 3_000, false);
        assert_eq!(s.watermark(0, None), Some(3_000));
        // The last active producer does the same: event time reaches its last watermark,
        // as an input gate taking them in that order would, then, every producer idle,
        // the largest they reached.
        s.take_producer_watermark(3, 1, 5_000, true);
        assert_eq!(s.watermark(0, None), Some(6_000));
        assert!(s.upstream_idle());
        // It survives a checkpoint.
        let mut b = KafkaSource::new(config.clone(), 0, 1).unwrap();
        b.seek(&s.position()).unwrap();
        assert_eq!(b.watermark(0, None), Some(6_000));
        // A producer active again holds event time back only from then on: it never
        // moves back.
        s.take_producer_watermark(3, 1, 5_500, false);
        assert_eq!(s.watermark(0, None), Some(6_000));
        s.take_producer_watermark(3, 0, 7_000, false);
        assert_eq!(s.watermark(0, None), Some(6_000));
        s.take_producer_watermark(3, 1, 6_500, false);
        assert_eq!(s.watermark(0, None), Some(6_500));
        // A position from before the reached watermark was kept still restores.
        let old = postcard::to_allocvec(&(
            Position {
                offsets: Vec::new(),
                stops: Vec::new(),
                max_timestamps: Vec::new(),
            },
            vec![(0u32, 7i64), (1, 9), (2, 8)],
            vec![2u32],
        ))
        .unwrap();
        let mut c = KafkaSource::new(config, 0, 1).unwrap();
        c.seek(&old).unwrap();
        assert_eq!(c.watermark(0, None), Some(7));
        assert_eq!(c.idle_producers, BTreeSet::from([2]));
    }
}
