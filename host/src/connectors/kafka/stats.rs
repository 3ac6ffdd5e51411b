//! librdkafka's statistics of a source's partitions: where each starts and ends, hence
//! how far behind the source is (its lag) and whether it has read a partition to its
//! end (for idleness).

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rdkafka::Offset;
use rdkafka::consumer::Consumer;
use serde::Deserialize;

use super::source::KafkaSource;

/// How long after its assignment a partition whose end no fetch has told (no leader, a
/// broker out of reach, a topic deleted) may still hold back idleness: after it, it
/// counts as read to its end, and its silence alone makes it idle.
pub(super) const END_UNKNOWN_GRACE: Duration = Duration::from_secs(10);

/// What librdkafka's statistics (every `statistics.interval.ms`, served by the
/// consumer's poll) say of the partitions a source reads: where each starts and ends now.
#[derive(Default)]
pub struct SourceStats {
    /// `(topic, partition)` → its bounds.
    pub(super) ends: Mutex<BTreeMap<(String, i32), Bounds>>,
    /// New statistics since the source last looked.
    pub(super) fresh: AtomicBool,
    /// What the consumer reported that no request returned.
    pub(super) errors: super::client_errors::ClientErrors,
}

/// Where a partition's log starts, and the end a `read_committed` consumer reads to (the
/// last stable offset).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Bounds {
    pub(super) start: i64,
    pub(super) end: i64,
}

#[derive(Deserialize)]
struct Statistics {
    #[serde(default)]
    topics: BTreeMap<String, TopicStatistics>,
}

#[derive(Deserialize)]
struct TopicStatistics {
    #[serde(default)]
    partitions: BTreeMap<String, PartitionStatistics>,
}

#[derive(Deserialize)]
struct PartitionStatistics {
    #[serde(default = "unknown_offset")]
    lo_offset: i64,
    #[serde(default = "unknown_offset")]
    ls_offset: i64,
    #[serde(default = "unknown_offset")]
    hi_offset: i64,
}

fn unknown_offset() -> i64 {
    -1
}

impl SourceStats {
    /// Each partition's bounds as last told.
    pub(super) fn bounds(&self) -> parking_lot::MutexGuard<'_, BTreeMap<(String, i32), Bounds>> {
        self.ends.lock()
    }
}

impl rdkafka::ClientContext for SourceStats {
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        self.errors.record(&error, reason);
    }

    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, facility: &str, message: &str) {
        self.errors.log(level, facility, message);
    }

    fn stats_raw(&self, json: &[u8]) {
        let stats: Statistics = match serde_json::from_slice(json) {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!("Kafka source: unreadable statistics: {e}");
                return;
            }
        };
        let mut ends = self.bounds();
        for (topic, t) in stats.topics {
            for (partition, p) in t.partitions {
                // (Partition -1 holds records not yet assigned a partition.)
                let Ok(partition) = partition.parse::<i32>() else {
                    continue;
                };
                let end = if p.ls_offset >= 0 {
                    p.ls_offset
                } else {
                    p.hi_offset
                };
                if partition >= 0 && end >= 0 {
                    let start = p.lo_offset.clamp(0, end);
                    ends.insert((topic.clone(), partition), Bounds { start, end });
                }
            }
        }
        self.fresh.store(true, Ordering::Relaxed);
    }
}

impl rdkafka::consumer::ConsumerContext for SourceStats {}

impl KafkaSource {
    /// Where the source stands in each of its partitions: its next offset, or the
    /// consumer's position where that is further (past transaction markers and aborted
    /// records, which never reach `next`).
    fn positions(&self) -> BTreeMap<(String, i32), i64> {
        let mut at = self.next.clone();
        if let Ok(positions) = self.consumer.position() {
            for e in positions.elements() {
                if let (Offset::Offset(o), Some(next)) = (
                    e.offset(),
                    at.get_mut(&(e.topic().to_string(), e.partition())),
                ) {
                    *next = (*next).max(o);
                }
            }
        }
        at
    }

    /// Whether `partition` is read to its end as librdkafka's statistics last said it (at
    /// most `statistics.interval.ms` old; a position before the log's start, whose records
    /// retention deleted, counts from the start). A partition whose end no fetch has told
    /// yet is not — for [`END_UNKNOWN_GRACE`] after it was assigned, then it is, as if
    /// ends were not known (a partition without a leader, a broker out of reach).
    pub(super) fn partition_read_to_end(&self, partition: &(String, i32)) -> bool {
        match self.read_to_end.get(partition) {
            Some(read) => *read,
            None => self
                .assigned_at
                .get(partition)
                .is_none_or(|t| t.elapsed() >= END_UNKNOWN_GRACE),
        }
    }

    /// Takes in new statistics, if any came: which partitions are read to their end, and
    /// each one's lag (records between where the source stands and the end).
    pub(super) fn take_statistics(&mut self) {
        if !self.consumer.context().fresh.swap(false, Ordering::Relaxed) {
            return;
        }
        let at = self.positions();
        let ends = self.consumer.context().bounds();
        self.read_to_end = at
            .iter()
            .filter_map(|(p, at)| {
                let b = ends.get(p)?;
                Some((p.clone(), (*at).max(b.start) >= b.end))
            })
            .collect();
        if let Some(metrics) = &self.metrics {
            let lag = at
                .iter()
                .filter_map(|(p, next)| {
                    let bounds = ends.get(p)?;
                    let behind = bounds.end - (*next).max(bounds.start);
                    Some((format!("{}/{}", p.0, p.1), behind.max(0) as u64))
                })
                .collect();
            *metrics.lag.lock() = lag;
        }
    }

    /// Adds what a poll read to the source's counters.
    pub(super) fn report(&self, records: u64, bytes: usize, bad_records: u64) {
        let Some(metrics) = &self.metrics else { return };
        if records > 0 || bad_records > 0 {
            let mut counters = metrics.counters.lock();
            for (name, delta) in [
                ("kafka-records-in", records),
                ("kafka-bytes-in", bytes as u64),
                ("bad-records", bad_records),
            ] {
                if delta > 0 || name != "bad-records" {
                    *counters.entry(name.to_string()).or_default() += delta;
                }
            }
        }
    }
}
