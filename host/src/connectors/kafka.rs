//! Kafka: a source that reads topics with its offsets in the checkpoint, and a sink that
//! writes a topic, against a real broker through librdkafka (`rdkafka`).
//!
//! The source works as Flink's `KafkaSource` does:
//! - partitions are **assigned**, not subscribed: each source subtask reads the
//!   partitions Flink's `KafkaSourceEnumerator.getSplitOwner` gives it
//!   ([`owner_of`]), so the assignment is a function of the topic, the partition and
//!   the parallelism, never of a group rebalance;
//! - the **offsets live in the checkpoint** (the source's position) and are restored
//!   from it; they are committed to the consumer group on notify-complete, for
//!   monitoring only (nothing reads them back unless a job starts from `committed`);
//! - it reads with `isolation.level = read_committed`, so aborted transactions of
//!   upstream producers never enter the job;
//! - partitions that appear later are found every `discovery` interval and read from
//!   their beginning.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::Producer as _;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};
use sluice_codec::BatchWriter;

use super::event_time::{EventTime, timestamp_of};
use super::{Source, SourceStatus};
use crate::chain::{CallError, CallOutput, OpenInfo, Operator, OperatorIdentity, OperatorState};
use crate::metrics::OperatorMetrics;

/// How long a metadata or offset request to the broker may take before the source fails
/// (its job restarts by its restart strategy and tries again).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Positions kept for checkpoints not yet complete (the most checkpoints in flight).
const MAX_PENDING_COMMITS: usize = 16;

/// How soon an idle source polls again: librdkafka fetches in the background, so a poll
/// only takes what already arrived.
const IDLE_POLL: Duration = Duration::from_millis(5);

/// How long after its assignment a partition whose end no fetch has told (no leader, a
/// broker out of reach, a topic deleted) may still hold back idleness: after it, it
/// counts as read to its end, and its silence alone makes it idle.
const END_UNKNOWN_GRACE: Duration = Duration::from_secs(10);

/// Where a source starts reading partitions that its checkpoint does not name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartFrom {
    /// The first offset still in the log.
    Earliest,
    /// After the last record, when the job starts.
    Latest,
    /// The consumer group's committed offsets (the earliest where it has none).
    Committed,
    /// The first record with a timestamp at or after this (milliseconds since the epoch).
    Timestamp(i64),
}

/// The topics a source reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Topics {
    /// These topics; each must exist.
    Names(Vec<String>),
    /// Every topic whose whole name matches this regular expression (Kafka's internal
    /// topics, `__…`, excepted), found again at each discovery.
    Pattern(String),
}

impl std::fmt::Display for Topics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Topics::Names(names) => write!(f, "{names:?}"),
            Topics::Pattern(p) => write!(f, "topics matching {p:?}"),
        }
    }
}

/// A regular expression that matches a whole topic name.
pub fn topic_pattern(pattern: &str) -> Result<regex::Regex> {
    regex::Regex::new(&format!("^(?:{pattern})$"))
        .map_err(|e| anyhow!("topic pattern {pattern:?} is not a regular expression: {e}"))
}

/// The configuration of a Kafka source, as the job file gives it.
#[derive(Debug, Clone, PartialEq)]
pub struct KafkaSourceConfig {
    /// `host:port,...` of the brokers.
    pub bootstrap: String,
    /// Topics to read.
    pub topics: Topics,
    /// Patterns every topic read must also match, whole (a tenant's Kafka grant on a
    /// server; an empty list allows no topic); `None`: any topic.
    pub allowed: Option<Vec<String>>,
    /// Where to start in partitions the checkpoint does not name.
    pub start: StartFrom,
    /// Consumer group offsets are committed to (and read from, with `Committed`).
    pub group: String,
    /// How often to look for new partitions.
    pub discovery: Duration,
    /// Further librdkafka consumer properties.
    pub properties: BTreeMap<String, String>,
    /// Read only up to the end of each partition as it is when the job first starts
    /// (Flink's bounded mode), then end; otherwise read forever.
    pub bounded: bool,
    /// Read this partition only, whatever the subtask: a unit of a job spread over
    /// several hosts runs one source partition.
    pub split: Option<(String, i32)>,
    /// Read an exchange topic that this many producers write (see
    /// [`EXCHANGE_WATERMARK`]): their watermark records set event time and end the input.
    pub exchange_producers: Option<u32>,
}

/// The header that marks a record of an exchange topic as a watermark, not data: its
/// value is the producer's number (decimal), the record's value its watermark (8 bytes,
/// big-endian). Each producer writes its watermark to every partition it feeds; a reader
/// takes the smallest over all producers, and `i64::MAX` from every one ends its input.
pub const EXCHANGE_WATERMARK: &str = "sluice-watermark";

/// Beside [`EXCHANGE_WATERMARK`] (any value): the producer is idle (its input carries no
/// records, as Flink's `WatermarkStatus.IDLE`), so readers leave it out of the smallest
/// watermark until its next watermark record without it.
pub const EXCHANGE_IDLE: &str = "sluice-idle";

/// Flink's `KafkaSourceEnumerator.getSplitOwner`: the source subtask (of `readers`) that
/// reads `partition` of `topic`. Partitions of one topic go round-robin from a start
/// that depends on the topic's name, so several topics spread evenly too.
pub fn owner_of(topic: &str, partition: i32, readers: u32) -> u32 {
    let start = (java_string_hash(topic).wrapping_mul(31) & 0x7FFF_FFFF) % readers as i32;
    ((start + partition) % readers as i32) as u32
}

/// Java's `String.hashCode`: over the UTF-16 code units, `h = 31 h + c`, wrapping.
fn java_string_hash(s: &str) -> i32 {
    s.encode_utf16()
        .fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(i32::from(c)))
}

/// The checkpointed position of a source subtask: the next offset of each partition it
/// reads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Position {
    offsets: Vec<(String, i32, i64)>,
    /// Bounded sources: the offset each partition ends at.
    stops: Vec<(String, i32, i64)>,
    /// The largest record timestamp read from each partition.
    max_timestamps: Vec<(String, i32, i64)>,
}

/// Merges the positions of several source subtasks into one that names every partition
/// they read: a source resuming at another parallelism takes from it the partitions it
/// now owns.
pub fn merge_positions(parts: &[Vec<u8>]) -> Result<Vec<u8>> {
    // A partition appears in one part only (each subtask keeps its own); should one
    // appear twice, the furthest offset and timestamp win.
    let mut offsets = BTreeMap::new();
    let mut stops = BTreeMap::new();
    let mut max_timestamps = BTreeMap::new();
    let merge = |into: &mut BTreeMap<(String, i32), i64>, from: Vec<(String, i32, i64)>| {
        for (t, p, v) in from {
            let e = into.entry((t, p)).or_insert(v);
            *e = (*e).max(v);
        }
    };
    for part in parts {
        let p: Position = postcard::from_bytes(part).context("decoding a Kafka source position")?;
        merge(&mut offsets, p.offsets);
        merge(&mut stops, p.stops);
        merge(&mut max_timestamps, p.max_timestamps);
    }
    let list =
        |m: BTreeMap<(String, i32), i64>| m.into_iter().map(|((t, p), v)| (t, p, v)).collect();
    Ok(postcard::to_allocvec(&Position {
        offsets: list(offsets),
        stops: list(stops),
        max_timestamps: list(max_timestamps),
    })?)
}

/// A Kafka source subtask.
pub struct KafkaSource {
    config: KafkaSourceConfig,
    /// `Topics::Pattern`, compiled.
    pattern: Option<regex::Regex>,
    /// `allowed`, compiled.
    allowed: Option<Vec<regex::Regex>>,
    consumer: BaseConsumer<SourceStats>,
    /// Where event time comes from: the records' timestamps, or a field of their values
    /// (see `stamps_event_time`); none without event time.
    event_time: Option<EventTime>,
    /// Where the source reports its counters and lag (see `attach_metrics`).
    metrics: Option<Arc<OperatorMetrics>>,
    subtask: u32,
    parallelism: u32,
    /// The partitions this subtask reads, with the next offset of each.
    next: BTreeMap<(String, i32), i64>,
    /// Whether the partitions were assigned (on the first poll, after a restore).
    started: bool,
    /// Offsets restored from a checkpoint, for the first assignment.
    restored: Option<BTreeMap<(String, i32), i64>>,
    /// Bounded sources: where each partition ends (fixed when it is first assigned).
    stops: BTreeMap<(String, i32), i64>,
    /// Per partition: the largest record timestamp read (checkpointed), and when its last
    /// record came (for idleness).
    max_timestamps: BTreeMap<(String, i32), i64>,
    last_record: BTreeMap<(String, i32), Instant>,
    /// When each partition was assigned (since a restore).
    assigned_at: BTreeMap<(String, i32), Instant>,
    /// As of the last statistics: for each partition whose end they told, whether the
    /// source has read to it.
    read_to_end: BTreeMap<(String, i32), bool>,
    last_discovery: Instant,
    /// Positions taken for checkpoints, until they complete (then committed) or a later
    /// one completes.
    pending: BTreeMap<u64, Vec<(String, i32, i64)>>,
    /// An exchange topic's reader: the newest watermark of each producer, and those that
    /// said they are idle (both checkpointed).
    producer_watermarks: BTreeMap<u32, i64>,
    idle_producers: BTreeSet<u32>,
    /// An exchange topic's reader: the largest watermark its producers' records allowed,
    /// taken record by record as an input gate takes its channels' events (checkpointed).
    exchange_reached: Option<i64>,
}

impl KafkaSource {
    /// A source subtask `subtask` of `parallelism`. Connects lazily: the broker is first
    /// asked on the first poll.
    pub fn new(config: KafkaSourceConfig, subtask: u32, parallelism: u32) -> Result<Self> {
        let mut client = ClientConfig::new();
        client
            .set("bootstrap.servers", &config.bootstrap)
            .set("group.id", &config.group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("isolation.level", "read_committed")
            .set("auto.offset.reset", "earliest")
            .set("enable.partition.eof", "false")
            // librdkafka waits this long before fetching again once its local queue
            // reached `queued.min.messages`; its default (1 s) let a source that reads
            // faster than that idle most of the time: 145 k lines/s from a topic against
            // 740 k from a file in the benchmark, 5 times more with 20 ms.
            .set("fetch.queue.backoff.ms", "20")
            // Where each partition ends, for its lag and idleness (`SourceStats`).
            .set("statistics.interval.ms", "1000");
        for (k, v) in &config.properties {
            client.set(k, v);
        }
        if client.get("statistics.interval.ms") == Some("0") {
            // (Without them no partition would ever be known read to its end.)
            client.set("statistics.interval.ms", "1000");
        }
        let consumer = client
            .create_with_context(SourceStats::default())
            .with_context(|| format!("creating a Kafka consumer for {}", config.bootstrap))?;
        let pattern = match &config.topics {
            Topics::Pattern(p) => Some(topic_pattern(p)?),
            Topics::Names(_) => None,
        };
        let allowed = config
            .allowed
            .as_ref()
            .map(|patterns| {
                patterns
                    .iter()
                    .map(|p| topic_pattern(p))
                    .collect::<Result<_>>()
            })
            .transpose()?;
        Ok(KafkaSource {
            config,
            event_time: None,
            metrics: None,
            pattern,
            allowed,
            consumer,
            subtask,
            parallelism,
            next: BTreeMap::new(),
            started: false,
            restored: None,
            stops: BTreeMap::new(),
            max_timestamps: BTreeMap::new(),
            last_record: BTreeMap::new(),
            assigned_at: BTreeMap::new(),
            read_to_end: BTreeMap::new(),
            last_discovery: Instant::now(),
            pending: BTreeMap::new(),
            producer_watermarks: BTreeMap::new(),
            idle_producers: BTreeSet::new(),
            exchange_reached: None,
        })
    }

    /// The partitions of the configured topics this subtask owns.
    fn owned_partitions(&self) -> Result<Vec<(String, i32)>> {
        let metadata = match &self.config.topics {
            Topics::Names(names) => {
                let mut all = Vec::with_capacity(names.len());
                for topic in names {
                    let metadata = self
                        .consumer
                        .fetch_metadata(Some(topic), REQUEST_TIMEOUT)
                        .with_context(|| {
                            format!("reading the partitions of Kafka topic {topic:?}")
                        })?;
                    let Some(t) = metadata.topics().iter().find(|t| t.name() == topic) else {
                        bail!("Kafka topic {topic:?} does not exist");
                    };
                    if let Some(e) = t.error() {
                        bail!(
                            "Kafka topic {topic:?}: {}",
                            KafkaError::MetadataFetch(e.into())
                        );
                    }
                    all.push(metadata);
                }
                all
            }
            Topics::Pattern(_) => vec![
                self.consumer
                    .fetch_metadata(None, REQUEST_TIMEOUT)
                    .context("reading the topics of the Kafka cluster")?,
            ],
        };
        let mut owned = Vec::new();
        for metadata in &metadata {
            for t in metadata.topics() {
                let topic = t.name();
                let wanted = match (&self.config.topics, &self.pattern) {
                    (Topics::Names(names), _) => names.iter().any(|n| n == topic),
                    (_, Some(pattern)) => {
                        !topic.starts_with("__") && t.error().is_none() && pattern.is_match(topic)
                    }
                    (Topics::Pattern(_), None) => false,
                };
                if !wanted {
                    continue;
                }
                if let Some(allowed) = &self.allowed
                    && !allowed.iter().any(|a| a.is_match(topic))
                {
                    // A pattern reads what the grant allows of what it matches; a topic
                    // named outright was checked at submission and is refused here too.
                    if self.pattern.is_some() {
                        continue;
                    }
                    bail!("Kafka topic {topic:?} is outside the tenant's Kafka grant (read)");
                }
                for p in t.partitions() {
                    let mine = match &self.config.split {
                        Some((t, only)) => t == topic && *only == p.id(),
                        None => owner_of(topic, p.id(), self.parallelism) == self.subtask,
                    };
                    if mine {
                        owned.push((topic.to_string(), p.id()));
                    }
                }
            }
        }
        Ok(owned)
    }

    /// Resolves where each of `partitions` starts, by `start`, to a concrete offset (so
    /// a checkpoint taken before a partition's first record still names where it was).
    fn start_offsets(
        &self,
        partitions: &[(String, i32)],
        start: StartFrom,
    ) -> Result<Vec<((String, i32), i64)>> {
        if partitions.is_empty() {
            // (librdkafka refuses offset requests for no partition.)
            return Ok(Vec::new());
        }
        let watermarks = |topic: &str, partition: i32| {
            self.consumer
                .fetch_watermarks(topic, partition, REQUEST_TIMEOUT)
                .with_context(|| format!("reading the offsets of {topic}/{partition}"))
        };
        let mut out = Vec::with_capacity(partitions.len());
        match start {
            StartFrom::Earliest | StartFrom::Latest => {
                for (topic, partition) in partitions {
                    let (low, high) = watermarks(topic, *partition)?;
                    let offset = if start == StartFrom::Earliest {
                        low
                    } else {
                        high
                    };
                    out.push(((topic.clone(), *partition), offset));
                }
            }
            StartFrom::Committed | StartFrom::Timestamp(_) => {
                let mut tpl = TopicPartitionList::new();
                for (topic, partition) in partitions {
                    let offset = match start {
                        StartFrom::Timestamp(ts) => Offset::Offset(ts),
                        _ => Offset::Invalid,
                    };
                    tpl.add_partition_offset(topic, *partition, offset)?;
                }
                let answered = match start {
                    StartFrom::Timestamp(_) => {
                        self.consumer.offsets_for_times(tpl, REQUEST_TIMEOUT)
                    }
                    _ => self.consumer.committed_offsets(tpl, REQUEST_TIMEOUT),
                }
                .with_context(|| format!("reading the start offsets of {partitions:?}"))?;
                for e in answered.elements() {
                    let (topic, partition) = (e.topic().to_string(), e.partition());
                    let (low, high) = watermarks(&topic, partition)?;
                    let offset = match e.offset() {
                        Offset::Offset(o) => o.clamp(low, high),
                        // No record at or after the timestamp: from the end.
                        Offset::End if matches!(start, StartFrom::Timestamp(_)) => high,
                        // No committed offset: from the beginning.
                        _ => low,
                    };
                    out.push(((topic, partition), offset));
                }
            }
        }
        Ok(out)
    }

    /// Assigns this subtask's partitions: restored ones at their checkpointed offsets,
    /// others by `start` (on a fresh start) or from the beginning (found later).
    fn assign(&mut self) -> Result<()> {
        let owned = self.owned_partitions()?;
        let restored = self.restored.take();
        let new: Vec<(String, i32)> = owned
            .iter()
            .filter(|p| !self.next.contains_key(*p))
            .filter(|p| !restored.as_ref().is_some_and(|r| r.contains_key(*p)))
            .cloned()
            .collect();
        if self.started && new.is_empty() {
            // Nothing new: assigning again would throw away what librdkafka fetched.
            self.last_discovery = Instant::now();
            return Ok(());
        }
        // What a restored position says of partitions another subtask owns now is theirs
        // (after a rescale every subtask gets every partition's).
        self.stops.retain(|p, _| owned.contains(p));
        self.max_timestamps.retain(|p, _| owned.contains(p));
        if let Some(restored) = &restored {
            for (p, offset) in restored {
                if owned.contains(p) {
                    self.next.insert(p.clone(), *offset);
                }
            }
        }
        let start = if self.started || restored.is_some() {
            StartFrom::Earliest
        } else {
            self.config.start
        };
        for (p, offset) in self.start_offsets(&new, start)? {
            self.next.insert(p, offset);
        }
        if self.config.bounded {
            for (topic, partition) in self.next.keys() {
                if !self.stops.contains_key(&(topic.clone(), *partition)) {
                    let (_, high) = self
                        .consumer
                        .fetch_watermarks(topic, *partition, REQUEST_TIMEOUT)
                        .with_context(|| format!("reading the end of {topic}/{partition}"))?;
                    self.stops.insert((topic.clone(), *partition), high);
                }
            }
        }
        let mut tpl = TopicPartitionList::new();
        for ((topic, partition), offset) in &self.next {
            tpl.add_partition_offset(topic, *partition, Offset::Offset(*offset))?;
        }
        self.consumer
            .assign(&tpl)
            .context("assigning Kafka partitions")?;
        for p in self.next.keys() {
            self.assigned_at
                .entry(p.clone())
                .or_insert_with(Instant::now);
        }
        self.started = true;
        self.last_discovery = Instant::now();
        Ok(())
    }
}

impl KafkaSource {
    /// An exchange topic's reader: the largest watermark reached, or the smallest over
    /// its producers not idle now, once every one has written one (while all are idle,
    /// event time stands where it is).
    fn exchange_watermark(&self, producers: u32) -> Option<i64> {
        self.exchange_reached.max(self.exchange_combined(producers))
    }

    /// The smallest watermark over the producers not idle, once every one has written
    /// one.
    fn exchange_combined(&self, producers: u32) -> Option<i64> {
        let known = self.producer_watermarks.range(..producers);
        if known.clone().count() < producers as usize {
            return None;
        }
        known
            .filter(|(p, _)| !self.idle_producers.contains(p))
            .map(|(_, w)| *w)
            .min()
    }

    /// An exchange topic's reader takes a producer's watermark record. As an input gate
    /// takes a channel's watermark before the idleness that follows it, the watermark
    /// counts with the producer as active as it was, and only then its idleness: a
    /// producer that writes its last watermark and its idleness in one record (they
    /// reached its sink within one checkpoint interval) still moves event time to it.
    fn take_producer_watermark(
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
    fn exchange_ended(&self, producers: u32) -> bool {
        let mut known = self.producer_watermarks.range(..producers);
        known.clone().count() == producers as usize && known.all(|(_, w)| *w == i64::MAX)
    }

    /// Moves each partition's next offset up to the consumer's position where that is
    /// further: past what is never delivered — a transaction's commit or abort marker,
    /// aborted records — which a bounded source must count as read to reach its end.
    fn skip_to_positions(&mut self) -> Result<()> {
        let positions = self
            .consumer
            .position()
            .context("reading Kafka positions")?;
        for e in positions.elements() {
            if let (Offset::Offset(position), Some(next)) = (
                e.offset(),
                self.next.get_mut(&(e.topic().to_string(), e.partition())),
            ) && position > *next
            {
                *next = position;
            }
        }
        // Records retention deleted before a partition's next offset are never delivered
        // either (the consumer resets to the log's start; its position moves only with a
        // record).
        let ends = self.consumer.context().bounds();
        for (p, next) in &mut self.next {
            if let Some(bounds) = ends.get(p) {
                *next = (*next).max(bounds.start);
            }
        }
        Ok(())
    }
}

/// What librdkafka's statistics (every `statistics.interval.ms`, served by the
/// consumer's poll) say of the partitions a source reads: where each starts and ends now.
#[derive(Default)]
pub struct SourceStats {
    /// `(topic, partition)` → its bounds.
    ends: Mutex<BTreeMap<(String, i32), Bounds>>,
    /// New statistics since the source last looked.
    fresh: AtomicBool,
}

/// Where a partition's log starts, and the end a `read_committed` consumer reads to (the
/// last stable offset).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Bounds {
    start: i64,
    end: i64,
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
    fn bounds(&self) -> std::sync::MutexGuard<'_, BTreeMap<(String, i32), Bounds>> {
        self.ends.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl rdkafka::ClientContext for SourceStats {
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
    fn partition_read_to_end(&self, partition: &(String, i32)) -> bool {
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
    fn take_statistics(&mut self) {
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
            *metrics.lag.lock().unwrap_or_else(|e| e.into_inner()) = lag;
        }
    }

    /// Adds what a poll read to the source's counters.
    fn report(&self, records: u64, bytes: usize) {
        let Some(metrics) = &self.metrics else { return };
        if records > 0 {
            let mut counters = metrics.counters.lock().unwrap_or_else(|e| e.into_inner());
            for (name, delta) in [
                ("kafka-records-in", records),
                ("kafka-bytes-in", bytes as u64),
            ] {
                *counters.entry(name.to_string()).or_default() += delta;
            }
        }
    }
}

impl Source for KafkaSource {
    fn stamps_event_time(&mut self, spec: &EventTime) -> bool {
        self.event_time = Some(spec.clone());
        true
    }

    fn attach_metrics(&mut self, metrics: Arc<OperatorMetrics>) {
        self.metrics = Some(metrics);
    }

    fn poll(&mut self, out: &mut BatchWriter, max: usize) -> Result<SourceStatus> {
        // A bounded source reads the partitions it found at its start only.
        if !self.started
            || (!self.config.bounded && self.last_discovery.elapsed() >= self.config.discovery)
        {
            self.assign().with_context(|| {
                format!(
                    "Kafka source reading {} from {}",
                    self.config.topics, self.config.bootstrap
                )
            })?;
        }
        if self.config.bounded
            && self
                .next
                .iter()
                .all(|(p, next)| self.stops.get(p).is_some_and(|stop| next >= stop))
        {
            return Ok(SourceStatus::End);
        }
        // Every producer of the exchange ended its output: so does this input.
        if let Some(producers) = self.config.exchange_producers
            && self.exchange_ended(producers)
        {
            return Ok(SourceStatus::End);
        }
        let (mut records, mut bytes) = (0, 0);
        for _ in 0..max {
            let Some(message) = self.consumer.poll(Duration::ZERO) else {
                break;
            };
            let message = match message {
                Ok(m) => m,
                Err(e) => {
                    // librdkafka reports broker and network trouble here and recovers
                    // on its own; a fatal error ends the consumer for good.
                    if let KafkaError::MessageConsumptionFatal(_) = e {
                        return Err(anyhow!(e).context("reading from Kafka"));
                    }
                    // An offset no longer in the log, with `auto.offset.reset = error`
                    // (exchange topics): records would be skipped.
                    if let KafkaError::MessageConsumption(
                        rdkafka::types::RDKafkaErrorCode::AutoOffsetReset,
                    ) = e
                    {
                        return Err(anyhow!(e).context(
                            "reading from Kafka: the offset to resume at is no longer in the log",
                        ));
                    }
                    tracing::warn!("Kafka source: {e}");
                    continue;
                }
            };
            let key = (message.topic().to_string(), message.partition());
            if self
                .stops
                .get(&key)
                .is_some_and(|stop| message.offset() >= *stop)
            {
                // Past the end of a bounded source (records written after it started).
                continue;
            }
            match self.next.get_mut(&key) {
                Some(next) => *next = message.offset() + 1,
                // A record of a partition no longer assigned (after a reassignment).
                None => continue,
            }
            if let Some(producers) = self.config.exchange_producers
                && let Some((producer, watermark, idle)) = watermark_record(&message)
                    .with_context(|| format!("exchange topic {}/{}", key.0, key.1))?
            {
                self.take_producer_watermark(producers, producer, watermark, idle);
                continue;
            }
            let timestamp = match self.event_time.as_ref().and_then(|e| Some((e, e.field?))) {
                Some((spec, field)) => Some(
                    timestamp_of(spec, field, message.payload().unwrap_or_default()).with_context(
                        || {
                            format!(
                                "Kafka record {}/{} at offset {}",
                                key.0,
                                key.1,
                                message.offset()
                            )
                        },
                    )?,
                ),
                None => match (message.timestamp().to_millis(), &self.event_time) {
                    (None, Some(_)) => bail!(
                        "Kafka record {}/{} at offset {} has no timestamp \
                         (`timestamp = \"record\"`)",
                        key.0,
                        key.1,
                        message.offset()
                    ),
                    (ts, _) => ts,
                },
            };
            if let Some(ts) = timestamp {
                let max = self.max_timestamps.entry(key.clone()).or_insert(ts);
                *max = (*max).max(ts);
            }
            self.last_record.insert(key, Instant::now());
            records += 1;
            bytes += message.payload_len() + message.key().map_or(0, <[u8]>::len);
            let headers = message.headers().map(|h| {
                use rdkafka::message::Headers as _;
                sluice_codec::encode_headers(
                    h.iter()
                        .map(|h| (h.key.as_bytes(), h.value.unwrap_or_default())),
                )
            });
            out.push_record(sluice_codec::RecordRef {
                key: message.key(),
                value: message.payload().unwrap_or_default(),
                timestamp,
                headers: headers
                    .as_deref()
                    .map(sluice_codec::Headers::decode)
                    .transpose()?,
                partition: Some(message.partition() as u32),
                output: 0,
            });
        }
        self.report(records, bytes);
        self.take_statistics();
        if out.is_empty() {
            if self.config.bounded {
                self.skip_to_positions()?;
            }
            return Ok(SourceStatus::Idle {
                retry_at: Some(Instant::now() + IDLE_POLL),
            });
        }
        Ok(SourceStatus::More)
    }

    fn position(&self) -> Vec<u8> {
        let list = |m: &BTreeMap<(String, i32), i64>| {
            m.iter().map(|((t, p), o)| (t.clone(), *p, *o)).collect()
        };
        // Restored but not polled yet (a checkpoint may come first): the restored
        // offsets are still where it stands.
        let mut offsets = self.next.clone();
        for (p, o) in self.restored.iter().flatten() {
            offsets.entry(p.clone()).or_insert(*o);
        }
        let position = Position {
            offsets: list(&offsets),
            stops: list(&self.stops),
            max_timestamps: list(&self.max_timestamps),
        };
        if self.config.exchange_producers.is_some() {
            let watermarks: Vec<(u32, i64)> = self
                .producer_watermarks
                .iter()
                .map(|(p, w)| (*p, *w))
                .collect();
            let idle: Vec<u32> = self.idle_producers.iter().copied().collect();
            return postcard::to_allocvec(&(position, watermarks, idle, self.exchange_reached))
                .expect("a position always encodes");
        }
        postcard::to_allocvec(&position).expect("a position always encodes")
    }

    fn seek(&mut self, position: &[u8]) -> Result<()> {
        let position: Position = if self.config.exchange_producers.is_some() {
            // (Positions taken before producers could be idle end after the watermarks,
            // those taken before the reached watermark was kept after the idle ones.)
            type Reader = (Position, Vec<(u32, i64)>, Vec<u32>, Option<i64>);
            let (position, watermarks, idle, reached): Reader = postcard::from_bytes(position)
                .or_else(|_| {
                    postcard::from_bytes::<(Position, Vec<(u32, i64)>, Vec<u32>)>(position)
                        .map(|(p, w, i)| (p, w, i, None))
                })
                .or_else(|_| {
                    postcard::from_bytes::<(Position, Vec<(u32, i64)>)>(position)
                        .map(|(p, w)| (p, w, Vec::new(), None))
                })
                .context("decoding the position of an exchange topic's reader")?;
            self.producer_watermarks = watermarks.into_iter().collect();
            self.idle_producers = idle.into_iter().collect();
            self.exchange_reached = reached;
            position
        } else {
            postcard::from_bytes(position).context("decoding a Kafka source position")?
        };
        let map = |l: Vec<(String, i32, i64)>| l.into_iter().map(|(t, p, o)| ((t, p), o)).collect();
        self.restored = Some(map(position.offsets));
        self.stops = map(position.stops);
        self.max_timestamps = map(position.max_timestamps);
        self.last_record.clear();
        self.assigned_at.clear();
        self.read_to_end.clear();
        self.next.clear();
        self.started = false;
        Ok(())
    }

    /// Flink's per-split watermarks: each partition's `max timestamp − bound − 1`, the
    /// source's the smallest over its partitions, leaving out those idle: silent for
    /// `idle_after` and read to their end (a partition never read holds it back until
    /// then; one with records not fetched yet, however long, so that they are not late).
    /// A finished partition of a bounded source no longer counts.
    fn watermark(&self, bound: i64, idle_after: Option<Duration>) -> Option<i64> {
        if let Some(producers) = self.config.exchange_producers {
            return self.exchange_watermark(producers);
        }
        let mut min: Option<i64> = None;
        let mut waiting = false;
        for (partition, next) in &self.next {
            if self.stops.get(partition).is_some_and(|stop| next >= stop) {
                continue;
            }
            // (Every partition read is assigned: a missing time is never silent.)
            let silent_for = self
                .last_record
                .get(partition)
                .or_else(|| self.assigned_at.get(partition))
                .map_or(Duration::ZERO, Instant::elapsed);
            if idle_after.is_some_and(|t| silent_for >= t) && self.partition_read_to_end(partition)
            {
                continue;
            }
            match self.max_timestamps.get(partition) {
                Some(max) => {
                    let w = max.saturating_sub(bound).saturating_sub(1);
                    min = Some(min.map_or(w, |m| m.min(w)));
                }
                None => waiting = true,
            }
        }
        if waiting {
            return None;
        }
        // Every partition finished or idle: no watermark moves on (as in Flink, an idle
        // source does not advance event time; the task marks it idle downstream).
        min
    }

    fn has_nothing_to_read(&self) -> bool {
        self.started && self.next.is_empty()
    }

    fn watermark_without_records(&self) -> bool {
        self.config.exchange_producers.is_some()
    }

    fn read_to_end(&self) -> bool {
        // (An exchange topic's reader is idle when its producers say so, not by silence.)
        self.config.exchange_producers.is_some()
            || self.started
                && self.next.iter().all(|(p, next)| {
                    self.partition_read_to_end(p)
                        || self.stops.get(p).is_some_and(|stop| next >= stop)
                })
    }

    fn upstream_idle(&self) -> bool {
        self.config.exchange_producers.is_some_and(|producers| {
            let mut known = self.producer_watermarks.range(..producers);
            known.clone().count() == producers as usize
                && known.all(|(p, _)| self.idle_producers.contains(p))
        })
    }

    fn checkpointed(&mut self, checkpoint_id: u64) {
        let offsets = self
            .next
            .iter()
            .map(|((t, p), o)| (t.clone(), *p, *o))
            .collect();
        self.pending.insert(checkpoint_id, offsets);
        // Checkpoints that never complete (aborted) are forgotten, oldest first: at most
        // as many stay as can be in flight.
        while self.pending.len() > MAX_PENDING_COMMITS {
            self.pending.pop_first();
        }
    }

    fn notify_complete(&mut self, checkpoint_id: u64) {
        let Some(offsets) = self.pending.remove(&checkpoint_id) else {
            return;
        };
        self.pending.retain(|&id, _| id > checkpoint_id);
        let mut tpl = TopicPartitionList::new();
        for (topic, partition, offset) in &offsets {
            if tpl
                .add_partition_offset(topic, *partition, Offset::Offset(*offset))
                .is_err()
            {
                return;
            }
        }
        // The checkpoint holds the offsets that count; the group's serve monitoring and a
        // later job's `start = "committed"`. Not waited for: a synchronous commit waits
        // for the group coordinator without end, and the task could not even be
        // cancelled meanwhile (closing the consumer sends what is still queued).
        if let Err(e) = self.consumer.commit(&tpl, CommitMode::Async) {
            tracing::warn!("committing Kafka offsets of checkpoint {checkpoint_id}: {e}");
        }
    }
}

/// The producer, watermark and idleness of an exchange topic's watermark record; `None`
/// for a record of data.
fn watermark_record(message: &impl Message) -> Result<Option<(u32, i64, bool)>> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_are_owned_as_flink_assigns_them() {
        // Values of Java's `String.hashCode` and of Flink's rule, computed with Java.
        assert_eq!(java_string_hash("events"), -1291329255);
        assert_eq!(java_string_hash("orders"), -1008770331);
        assert_eq!(java_string_hash("événements"), -1479837150);
        assert_eq!(owner_of("events", 0, 4), 3);
        assert_eq!(owner_of("événements", 0, 4), 2);
        // Every partition has one owner, and owners go round-robin.
        for readers in 1..=5 {
            let owners: Vec<u32> = (0..10).map(|p| owner_of("events", p, readers)).collect();
            for w in owners.windows(2) {
                assert_eq!(w[1], (w[0] + 1) % readers);
            }
        }
    }

    /// A source of topic `t` on a broker that is never asked (the source connects on its
    /// first poll).
    fn config(bounded: bool) -> KafkaSourceConfig {
        KafkaSourceConfig {
            bootstrap: "127.0.0.1:1".into(),
            topics: Topics::Names(vec!["t".into()]),
            allowed: None,
            start: StartFrom::Earliest,
            group: "g".into(),
            discovery: Duration::from_secs(1),
            properties: BTreeMap::new(),
            bounded,
            split: None,
            exchange_producers: None,
        }
    }

    #[test]
    fn the_watermark_is_the_smallest_of_the_partitions_not_idle_or_finished() {
        let config = config(false);
        let mut s = KafkaSource::new(config, 0, 1).unwrap();
        let p = |i: i32| ("t".to_string(), i);
        for i in 0..3 {
            s.next.insert(p(i), 0);
            s.assigned_at.insert(p(i), Instant::now());
        }
        s.started = true;
        s.max_timestamps.insert(p(0), 5_000);
        s.max_timestamps.insert(p(1), 900);
        s.last_record.insert(p(0), Instant::now());
        s.last_record.insert(p(1), Instant::now());
        // Partition 2 has no record yet and is not idle: no watermark.
        assert_eq!(s.watermark(100, None), None);
        // Silent since its assignment for longer than the idle time, but with records
        // not read yet (its end unknown, then beyond where the source stands): not idle.
        s.assigned_at
            .insert(p(2), Instant::now() - Duration::from_secs(6));
        assert_eq!(s.watermark(100, Some(Duration::from_secs(5))), None);
        assert!(!s.read_to_end());
        let ends = |s: &mut KafkaSource, e: &[(i32, i64, i64)]| {
            *s.consumer.context().ends.lock().unwrap() = e
                .iter()
                .map(|&(i, start, end)| (p(i), Bounds { start, end }))
                .collect();
            s.consumer.context().fresh.store(true, Ordering::Relaxed);
            s.take_statistics();
        };
        ends(&mut s, &[(0, 0, 0), (1, 0, 0), (2, 0, 7)]);
        assert_eq!(s.watermark(100, Some(Duration::from_secs(5))), None);
        // Read to its end and silent: left out, the smallest of the others, 900 − 100 − 1.
        ends(&mut s, &[(0, 0, 0), (1, 0, 0), (2, 0, 0)]);
        assert!(s.read_to_end());
        assert_eq!(s.watermark(100, Some(Duration::from_secs(5))), Some(799));
        // Records retention deleted before the position count as read.
        ends(&mut s, &[(0, 0, 0), (1, 0, 0), (2, 7, 7)]);
        assert!(s.read_to_end());
        // An end still unknown long after the assignment no longer holds idleness back.
        ends(&mut s, &[(0, 0, 0), (1, 0, 0)]);
        assert!(!s.read_to_end());
        s.assigned_at
            .insert(p(2), Instant::now() - END_UNKNOWN_GRACE);
        assert!(s.read_to_end());
        assert_eq!(s.watermark(100, Some(Duration::from_secs(5))), Some(799));
        // Every partition idle: event time stands still.
        assert_eq!(s.watermark(100, Some(Duration::ZERO)), None);
        s.max_timestamps.insert(p(2), 3_000);
        s.last_record.insert(p(2), Instant::now());
        assert_eq!(s.watermark(100, None), Some(799));
        // A bounded source's finished partition no longer holds it back.
        s.stops.insert(p(1), 0);
        assert_eq!(s.watermark(100, None), Some(2_899));
    }

    #[test]
    fn an_exchange_reader_leaves_idle_producers_out_of_event_time() {
        let config = KafkaSourceConfig {
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
        // Every producer idle: event time stands still, and the reader is idle too.
        s.idle_producers.insert(0);
        assert_eq!(s.watermark(0, None), None);
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
    fn a_producers_last_watermark_counts_though_its_idleness_comes_with_it() {
        let config = KafkaSourceConfig {
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
        // The last active producer does the same: event time reaches the smaller of the
        // two last watermarks, as an input gate taking them in that order would, and
        // stands there while every producer is idle.
        s.take_producer_watermark(3, 1, 5_000, true);
        assert_eq!(s.watermark(0, None), Some(5_000));
        assert!(s.upstream_idle());
        // It survives a checkpoint.
        let mut b = KafkaSource::new(config.clone(), 0, 1).unwrap();
        b.seek(&s.position()).unwrap();
        assert_eq!(b.watermark(0, None), Some(5_000));
        // A producer active again holds event time back only from then on: it never
        // moves back.
        s.take_producer_watermark(3, 0, 6_000, false);
        assert_eq!(s.watermark(0, None), Some(6_000));
        s.take_producer_watermark(3, 1, 5_500, false);
        assert_eq!(s.watermark(0, None), Some(6_000));
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

    #[test]
    fn positions_round_trip() {
        let config = config(true);
        let mut a = KafkaSource::new(config.clone(), 0, 1).unwrap();
        a.next.insert(("t".into(), 0), 42);
        a.next.insert(("t".into(), 3), 7);
        a.stops.insert(("t".into(), 0), 50);
        let mut b = KafkaSource::new(config, 0, 1).unwrap();
        b.seek(&a.position()).unwrap();
        assert_eq!(
            b.restored,
            Some(BTreeMap::from([
                (("t".into(), 0), 42),
                (("t".into(), 3), 7)
            ]))
        );
        assert_eq!(b.stops, a.stops);
        // A checkpoint before the first poll after a restore keeps the restored offsets
        // (not none, which would read the partitions again from their start).
        assert_eq!(b.position(), a.position());
        // Two subtasks' positions merged: a source of another parallelism finds both.
        let mut c = KafkaSource::new(a.config.clone(), 1, 2).unwrap();
        c.next.insert(("t".into(), 1), 9);
        let merged = merge_positions(&[a.position(), c.position()]).unwrap();
        b.seek(&merged).unwrap();
        assert_eq!(
            b.restored,
            Some(BTreeMap::from([
                (("t".into(), 0), 42),
                (("t".into(), 1), 9),
                (("t".into(), 3), 7)
            ]))
        );
        assert!(b.seek(b"\xff\xff\xff").is_err());
    }
}

/// How a Kafka sink delivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Records are sent as they come; a checkpoint waits until every record sent before
    /// it is acknowledged. After a failure, records since the last checkpoint are sent
    /// again.
    AtLeastOnce,
    /// Records of each checkpoint interval are written in one Kafka transaction once the
    /// checkpoint is complete; consumers reading `read_committed` see each record once.
    ExactlyOnce,
}

/// The configuration of a Kafka sink, as the job file gives it.
#[derive(Debug, Clone, PartialEq)]
pub struct KafkaSinkConfig {
    /// `host:port,...` of the brokers.
    pub bootstrap: String,
    /// The topic written.
    pub topic: String,
    /// At least or exactly once.
    pub delivery: Delivery,
    /// Prefix of the transactional ids (exactly once): subtask N uses `PREFIX-N`, so a
    /// restarted subtask fences the one it replaces.
    pub transactional_id_prefix: String,
    /// Most bytes of records one subtask holds for checkpoints not yet complete (exactly
    /// once).
    pub max_pending_bytes: u64,
    /// Write each record to the partition it was read from (`partitioner = "record"`),
    /// not by its key.
    pub by_record_partition: bool,
    /// Further librdkafka producer properties.
    pub properties: BTreeMap<String, String>,
    /// Write an exchange topic between two stages of a job spread over several hosts
    /// (exactly once only).
    pub exchange: Option<ExchangeOutput>,
    /// What the marker of each committed checkpoint also says (a unit of a job over
    /// several hosts: where its checkpoints are). With a note, every checkpoint commits a
    /// transaction, records or not, so the marker always names the newest, and the
    /// records of every pending checkpoint up to a completed one go in its one
    /// transaction, so the marker never names a checkpoint that did not complete.
    pub marker_note: Option<String>,
    /// When set, `open` (after fencing every earlier producer) checks that the marker is
    /// still this one — its metadata's note and checkpoint, or no marker at all — and
    /// fails otherwise: a unit of a job over several hosts restored what that marker
    /// named, and someone else has committed since.
    pub expect_marker: Option<Option<(String, u64)>>,
}

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

/// The first delivery failure of a producer, reported by librdkafka on a poll.
#[derive(Default)]
struct DeliveryReport {
    failed: Mutex<Option<String>>,
}

impl rdkafka::ClientContext for DeliveryReport {}

impl rdkafka::producer::ProducerContext for DeliveryReport {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &rdkafka::message::DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = result {
            let mut failed = self.failed.lock().unwrap_or_else(|e| e.into_inner());
            failed.get_or_insert_with(|| e.to_string());
        }
    }
}

type Producer = rdkafka::producer::BaseProducer<DeliveryReport>;

/// The checkpointed state of an exactly-once sink subtask: the records of checkpoints
/// taken but not known to be committed, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct SinkState {
    /// Which run of the job these checkpoints belong to (fixed at its fresh start), so a
    /// marker that an earlier run left in the group is not taken for this one's.
    run: u64,
    pending: Vec<(u64, Vec<u8>)>,
}

/// An identity for a fresh run of a sink: the time and the process, hashed.
pub(crate) fn new_run_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    h.finish()
}

/// The metadata a marker commits with a checkpoint's id: the run, then `;` and the
/// sink's note if it has one.
fn marker_metadata(run: u64, note: Option<&str>) -> String {
    match note {
        Some(note) => format!("sluice-run={run:016x};{note}"),
        None => format!("sluice-run={run:016x}"),
    }
}

/// The checkpoint id and the metadata that the marker group of `consumer` last committed
/// for `topic`, if any.
pub fn read_marker(
    consumer: &BaseConsumer,
    topic: &str,
    timeout: Duration,
) -> Result<Option<(u64, String)>, KafkaError> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, 0);
    let committed = consumer.committed_offsets(tpl, timeout)?;
    Ok(committed.elements().first().and_then(|e| match e.offset() {
        Offset::Offset(o) if o >= 0 => Some((o as u64, e.metadata().to_string())),
        _ => None,
    }))
}

/// A marker as messages name it.
fn describe_marker(marker: Option<&(String, u64)>) -> String {
    match marker {
        Some((note, id)) => format!("checkpoint {id} ({note})"),
        None => "none".into(),
    }
}

/// The run and the note of a marker's metadata.
pub fn parse_marker_metadata(metadata: &str) -> Option<(u64, Option<&str>)> {
    let rest = metadata.strip_prefix("sluice-run=")?;
    let (run, note) = match rest.split_once(';') {
        Some((run, note)) => (run, Some(note)),
        None => (rest, None),
    };
    Some((u64::from_str_radix(run, 16).ok()?, note))
}

/// A Kafka sink subtask: the last operator of its chain.
///
/// Exactly once is a write-ahead log, because librdkafka cannot resume a transaction
/// another producer opened (a restarted subtask's `init_transactions` aborts it): the
/// records of a checkpoint interval are kept, go into the checkpoint, and are written
/// in one transaction when the checkpoint is complete. The transaction also commits
/// the checkpoint's id as the offset of the subtask's marker group (`PREFIX-N`), so
/// after a failure the restored subtask knows which of its pending checkpoints already
/// reached Kafka and writes only the others.
pub struct KafkaSink {
    identity: OperatorIdentity,
    state: OperatorState,
    config: KafkaSinkConfig,
    subtask: u32,
    producer: Option<Producer>,
    /// Exactly once: a client of the subtask's marker group (made at open).
    marker: Option<BaseConsumer>,
    /// Exactly once: the records since the last checkpoint, as a batch.
    interval: BatchWriter,
    sink: SinkState,
    pending_bytes: u64,
    /// Restored at another parallelism: the checkpointed states of the old subtasks this
    /// one takes over (`old % new == this`), by old subtask.
    adopted: Vec<(u32, Vec<u8>)>,
    /// With `partitioner = "record"`: the topic's partitions when the sink opened.
    partitions: Option<u32>,
    /// An exchange sink: the partition the last record without a key went to.
    next_partition: usize,
    /// An exchange sink: the newest watermark, and the newest written; whether its input
    /// is idle, and whether it was when it last wrote its watermark.
    watermark: i64,
    written_watermark: i64,
    idle: bool,
    written_idle: bool,
}

/// How long a flush or a transaction step may take before the sink fails (its job
/// restarts from the last checkpoint).
const PRODUCE_TIMEOUT: Duration = Duration::from_secs(60);

impl KafkaSink {
    /// Subtask `subtask` of a Kafka sink; `adopted`: see [`KafkaSink::adopting`].
    pub fn new(identity: OperatorIdentity, config: KafkaSinkConfig, subtask: u32) -> Self {
        Self::adopting(identity, config, subtask, Vec::new())
    }

    /// Subtask `subtask` of a Kafka sink restored at another parallelism, taking over
    /// the checkpointed states of old subtasks (`(old subtask, state)`): at `open` it
    /// fences their producers and writes what their markers say did not reach Kafka.
    pub fn adopting(
        identity: OperatorIdentity,
        config: KafkaSinkConfig,
        subtask: u32,
        adopted: Vec<(u32, Vec<u8>)>,
    ) -> Self {
        KafkaSink {
            identity,
            state: OperatorState::new(None),
            config,
            subtask,
            producer: None,
            marker: None,
            interval: BatchWriter::new(),
            sink: SinkState::default(),
            pending_bytes: 0,
            adopted,
            partitions: None,
            next_partition: 0,
            watermark: i64::MIN,
            written_watermark: i64::MIN,
            idle: false,
            written_idle: false,
        }
    }

    fn transactional_id(&self) -> String {
        self.transactional_id_of(self.subtask)
    }

    /// The transactional id of subtask `subtask` of this sink (its marker group too).
    fn transactional_id_of(&self, subtask: u32) -> String {
        format!("{}-{}", self.config.transactional_id_prefix, subtask)
    }

    fn err(&self, what: &str, e: impl std::fmt::Display) -> CallError {
        CallError::Failed(format!(
            "Kafka sink, topic {:?} at {}: {what}: {e}",
            self.config.topic, self.config.bootstrap
        ))
    }

    fn producer(&self) -> Result<&Producer, CallError> {
        self.producer
            .as_ref()
            .ok_or_else(|| CallError::Failed("Kafka sink used before open".into()))
    }

    /// Sends one record (key, value, timestamp and headers), waiting while librdkafka's
    /// queue is full.
    fn send(
        producer: &Producer,
        config: &KafkaSinkConfig,
        record: &sluice_codec::RecordRef<'_>,
    ) -> Result<(), String> {
        let by_record = config.by_record_partition || config.exchange.is_some();
        let partition = match (by_record, record.partition) {
            (false, _) => None,
            (true, Some(p)) => Some(i32::try_from(p).unwrap_or(i32::MAX)),
            (true, None) => {
                return Err(
                    "a record without a source partition: this sink writes each record to \
                     the partition it was read from (`partitioner = \"record\"`), so its \
                     records must come from a Kafka source"
                        .to_owned(),
                );
            }
        };
        let headers = record.headers.map(|h| {
            let mut owned = rdkafka::message::OwnedHeaders::new_with_capacity(h.len());
            for (name, value) in h.iter() {
                owned = owned.insert(rdkafka::message::Header {
                    key: &String::from_utf8_lossy(name),
                    value: Some(value),
                });
            }
            owned
        });
        loop {
            let mut r = rdkafka::producer::BaseRecord::<[u8], [u8]>::to(&config.topic)
                .payload(record.value);
            if let Some(k) = record.key {
                r = r.key(k);
            }
            if let Some(ts) = record.timestamp {
                r = r.timestamp(ts);
            }
            if let Some(p) = partition {
                r = r.partition(p);
            }
            if let Some(h) = &headers {
                r = r.headers(h.clone());
            }
            match producer.send(r) {
                Ok(()) => return Ok(()),
                Err((
                    KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull),
                    _,
                )) => {
                    producer.poll(Duration::from_millis(10));
                }
                Err((e, _)) => {
                    return Err(match partition {
                        Some(p) => format!("to partition {p}: {e}"),
                        None => e.to_string(),
                    });
                }
            }
        }
    }

    /// Adds to the sink's counters (shown with the job's operators): records and their
    /// key and value bytes written, transactions committed and aborted.
    fn count(&self, records: usize, bytes: usize, committed: u64, aborted: u64) {
        let mut counters = self
            .state
            .counters
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for (name, delta) in [
            ("kafka-records-out", records as u64),
            ("kafka-bytes-out", bytes as u64),
            ("kafka-transactions-committed", committed),
            ("kafka-transactions-aborted", aborted),
        ] {
            if delta > 0 {
                *counters.entry(name.to_string()).or_default() += delta;
            }
        }
    }

    fn check_deliveries(&self) -> Result<(), CallError> {
        self.check_deliveries_of(self.producer()?)
    }

    /// The first failed delivery `producer` reported, as an error.
    fn check_deliveries_of(&self, producer: &Producer) -> Result<(), CallError> {
        let failed = producer
            .context()
            .failed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        match failed {
            Some(e) => Err(self.err("a record was not delivered", e)),
            None => Ok(()),
        }
    }

    /// The newest checkpoint whose records this subtask committed (its marker group's
    /// offset), if any.
    fn committed_checkpoint(&self) -> Result<Option<u64>, CallError> {
        self.committed_in(self.marker()?, self.sink.run)
    }

    /// The newest checkpoint of run `run` that the marker group of `consumer` holds.
    fn committed_in(&self, consumer: &BaseConsumer, run: u64) -> Result<Option<u64>, CallError> {
        let marker = read_marker(consumer, &self.config.topic, PRODUCE_TIMEOUT)
            .map_err(|e| self.err("reading the last committed checkpoint", e))?;
        // A marker of another run (one started fresh since, with checkpoint ids from 1
        // again) says nothing about this run's checkpoints.
        Ok(marker.and_then(|(id, metadata)| {
            parse_marker_metadata(&metadata)
                .is_some_and(|(r, _)| r == run)
                .then_some(id)
        }))
    }

    fn marker(&self) -> Result<&BaseConsumer, CallError> {
        self.marker
            .as_ref()
            .ok_or_else(|| CallError::Failed("Kafka sink used before open".into()))
    }

    /// A client of the marker group of subtask `subtask`.
    fn marker_consumer(&self, subtask: u32) -> Result<BaseConsumer, CallError> {
        let mut client = ClientConfig::new();
        // The sink's properties too: the marker group is reached with the same
        // credentials (SASL, TLS) as the topic.
        for (k, v) in &self.config.properties {
            client.set(k, v);
        }
        client
            .set("bootstrap.servers", &self.config.bootstrap)
            .set("group.id", self.transactional_id_of(subtask))
            .set("enable.auto.commit", "false")
            .create()
            .map_err(|e| self.err("creating the marker consumer", e))
    }

    /// Takes over old subtask `old` (of a parallelism the job no longer has): fences its
    /// producer, then writes its pending checkpoints that its marker does not cover, each
    /// in a transaction that moves its marker — so a restore from the same checkpoint
    /// again writes nothing twice.
    fn write_adopted(&mut self, old: u32, state: &[u8]) -> Result<(), CallError> {
        if state.is_empty() {
            return Ok(());
        }
        let part: SinkState = postcard::from_bytes(state)
            .map_err(|e| self.err(&format!("decoding the state of old subtask {old}"), e))?;
        // The old subtask's own transactional id writes its records: initialising it
        // fences the old subtask and any earlier adopter of it, whatever their ids.
        let mut client = ClientConfig::new();
        for (k, v) in &self.config.properties {
            client.set(k, v);
        }
        let producer: Producer = client
            .set("bootstrap.servers", &self.config.bootstrap)
            .set("enable.idempotence", "true")
            .set("transactional.id", self.transactional_id_of(old))
            .set("transaction.timeout.ms", "900000")
            .create_with_context(DeliveryReport::default())
            .map_err(|e| self.err(&format!("taking over old subtask {old}"), e))?;
        producer
            .init_transactions(PRODUCE_TIMEOUT)
            .map_err(|e| self.err(&format!("fencing old subtask {old}"), e))?;
        let marker = self.marker_consumer(old)?;
        let committed = self.committed_in(&marker, part.run)?;
        for (checkpoint, records) in part.pending {
            if committed.is_none_or(|done| checkpoint > done) {
                self.write_transaction(&producer, &marker, part.run, checkpoint, &[&records])?;
            }
        }
        Ok(())
    }

    /// Writes the records of pending checkpoints up to `id` in one transaction each,
    /// with the checkpoint's marker (with a marker note: all in one, marked `id`).
    fn commit_up_to(&mut self, id: u64) -> Result<(), CallError> {
        if self.config.marker_note.is_some() {
            let due = self.sink.pending.partition_point(|(c, _)| *c <= id);
            let Some(&(last, _)) = due.checked_sub(1).and_then(|i| self.sink.pending.get(i)) else {
                return Ok(());
            };
            let batches: Vec<(u64, Vec<u8>)> = self.sink.pending.drain(..due).collect();
            let bytes: u64 = batches.iter().map(|(_, r)| r.len() as u64).sum();
            self.pending_bytes = self.pending_bytes.saturating_sub(bytes);
            let records: Vec<&[u8]> = batches.iter().map(|(_, r)| r.as_slice()).collect();
            return self.write_transaction(
                self.producer()?,
                self.marker()?,
                self.sink.run,
                last,
                &records,
            );
        }
        while self.sink.pending.first().is_some_and(|(c, _)| *c <= id) {
            let (checkpoint, records) = self.sink.pending.remove(0);
            self.pending_bytes = self.pending_bytes.saturating_sub(records.len() as u64);
            self.write_transaction(
                self.producer()?,
                self.marker()?,
                self.sink.run,
                checkpoint,
                &[&records],
            )?;
        }
        Ok(())
    }

    /// With `expect_marker`: fails unless the marker is still the one expected.
    fn check_expected_marker(&self) -> Result<(), CallError> {
        let Some(expected) = &self.config.expect_marker else {
            return Ok(());
        };
        let found = read_marker(self.marker()?, &self.config.topic, PRODUCE_TIMEOUT)
            .map_err(|e| self.err("reading the last committed checkpoint", e))?
            .map(|(id, metadata)| {
                let note = parse_marker_metadata(&metadata).and_then(|(_, note)| note);
                (note.unwrap_or_default().to_string(), id)
            });
        if found != *expected {
            return Err(CallError::Failed(format!(
                "Kafka sink, topic {:?}: another owner committed since this one was \
                 restored (the marker names {}, not {}): it restarts from that",
                self.config.topic,
                describe_marker(found.as_ref()),
                describe_marker(expected.as_ref())
            )));
        }
        Ok(())
    }

    /// Writes the batches `records` of checkpoint `checkpoint` in one transaction that
    /// also marks the checkpoint (of run `run`) in the marker group of `marker`.
    fn write_transaction(
        &self,
        producer: &Producer,
        marker: &BaseConsumer,
        run: u64,
        checkpoint: u64,
        records: &[&[u8]],
    ) -> Result<(), CallError> {
        producer.begin_transaction().map_err(|e| {
            self.err(
                &format!("checkpoint {checkpoint}: beginning the transaction"),
                e,
            )
        })?;
        match self.fill_and_commit(producer, marker, run, checkpoint, records) {
            Ok((count, bytes)) => {
                self.count(count, bytes, 1, 0);
                self.check_deliveries_of(producer)
            }
            Err(e) => {
                // Aborted at once, the transaction stops holding back `read_committed`
                // consumers of its partitions (until the restarted subtask's
                // `init_transactions` would, or for good if the job does not restart).
                // The checkpoint's records stay in its state, written again on restore.
                // (librdkafka aborts only once the records sent are reported on, which
                // a `BaseProducer` must poll for: `flush` does.)
                let _ = producer.flush(PRODUCE_TIMEOUT);
                match producer.abort_transaction(PRODUCE_TIMEOUT) {
                    Ok(()) => {
                        tracing::info!(
                            "{}: checkpoint {checkpoint}: transaction aborted",
                            self.identity.operator
                        );
                        self.count(0, 0, 0, 1);
                    }
                    Err(abort) => tracing::warn!(
                        "{}: checkpoint {checkpoint}: aborting the transaction: {abort}",
                        self.identity.operator
                    ),
                }
                Err(e)
            }
        }
    }

    /// Sends a checkpoint's records and marker in the open transaction and commits it;
    /// returns the records and bytes written.
    fn fill_and_commit(
        &self,
        producer: &Producer,
        marker_group: &BaseConsumer,
        run: u64,
        checkpoint: u64,
        records: &[&[u8]],
    ) -> Result<(usize, usize), CallError> {
        let step = |what: &str, r: Result<(), KafkaError>| {
            r.map_err(|e| self.err(&format!("checkpoint {checkpoint}: {what}"), e))
        };
        let (mut count, mut bytes) = (0, 0);
        for record in records
            .iter()
            .flat_map(|batch| sluice_codec::BatchReader::new(batch))
        {
            let record = record.map_err(|e| self.err("reading pending records", e))?;
            count += 1;
            bytes += record.value.len() + record.key.map_or(0, <[u8]>::len);
            Self::send(producer, &self.config, &record)
                .map_err(|e| self.err(&format!("checkpoint {checkpoint}: sending a record"), e))?;
        }
        let metadata = marker_group
            .group_metadata()
            .ok_or_else(|| self.err("marker group", "no group metadata"))?;
        let mut marker = TopicPartitionList::new();
        step(
            "marking the checkpoint",
            marker.add_partition_offset(&self.config.topic, 0, Offset::Offset(checkpoint as i64)),
        )?;
        if let Some(mut e) = marker.find_partition(&self.config.topic, 0) {
            e.set_metadata(marker_metadata(run, self.config.marker_note.as_deref()));
        }
        step(
            "marking the checkpoint",
            producer.send_offsets_to_transaction(&marker, &metadata, PRODUCE_TIMEOUT),
        )?;
        crate::failpoint!("kafka-sink::before-commit");
        step(
            "committing the transaction",
            producer.commit_transaction(PRODUCE_TIMEOUT),
        )?;
        crate::failpoint!("kafka-sink::after-commit");
        Ok((count, bytes))
    }
}

impl Operator for KafkaSink {
    fn identity(&self) -> &OperatorIdentity {
        &self.identity
    }

    fn state(&mut self) -> &mut OperatorState {
        &mut self.state
    }

    fn open(&mut self, info: &OpenInfo) -> Result<CallOutput, CallError> {
        let mut client = ClientConfig::new();
        client
            .set("bootstrap.servers", &self.config.bootstrap)
            // Java clients' partitioner, so keys land where Kafka Streams or Flink put them.
            .set("partitioner", "murmur2_random")
            .set("enable.idempotence", "true");
        if self.config.delivery == Delivery::ExactlyOnce {
            client
                .set("transactional.id", self.transactional_id())
                .set("transaction.timeout.ms", "900000");
        }
        for (k, v) in &self.config.properties {
            client.set(k, v);
        }
        let producer: Producer = client
            .create_with_context(DeliveryReport::default())
            .map_err(|e| self.err("creating the producer", e))?;
        if self.config.delivery == Delivery::ExactlyOnce {
            // Fences an earlier producer of this subtask and aborts its open transaction.
            producer
                .init_transactions(PRODUCE_TIMEOUT)
                .map_err(|e| self.err("initialising transactions", e))?;
            self.marker = Some(self.marker_consumer(self.subtask)?);
            self.check_expected_marker()?;
        }
        if self.config.by_record_partition {
            let metadata = producer
                .client()
                .fetch_metadata(Some(&self.config.topic), PRODUCE_TIMEOUT)
                .map_err(|e| self.err("reading the topic's partitions", e))?;
            let count = metadata
                .topics()
                .first()
                .map_or(0, |t| t.partitions().len() as u32);
            if count == 0 {
                return Err(self.err("reading the topic's partitions", "the topic has none"));
            }
            self.partitions = Some(count);
        }
        self.producer = Some(producer);
        self.sink.run = new_run_id();
        if let Some(exchange) = &self.config.exchange {
            // Producers start their round-robin at different partitions.
            self.next_partition = exchange.producer as usize;
        }
        let mut own = info.restored_state.clone();
        for (old, bytes) in std::mem::take(&mut self.adopted) {
            if old == self.subtask {
                own = Some(bytes);
            } else {
                self.write_adopted(old, &bytes)?;
            }
        }
        if let Some(bytes) = own.as_deref().filter(|b| !b.is_empty()) {
            let restored: SinkState = postcard::from_bytes(bytes)
                .map_err(|e| self.err("decoding the restored sink state", e))?;
            self.sink.run = restored.run;
            let committed = self.committed_checkpoint()?;
            self.sink.pending = restored
                .pending
                .into_iter()
                .filter(|(c, _)| committed.is_none_or(|done| *c > done))
                .collect();
            self.pending_bytes = self.sink.pending.iter().map(|(_, r)| r.len() as u64).sum();
            if self.config.marker_note.is_some() && !self.sink.pending.is_empty() {
                // A unit restores the checkpoint its marker names, so nothing restored can
                // be newer; written now, it would carry this attempt's note with an id of
                // another attempt's.
                return Err(self.err(
                    "restoring",
                    "the restored checkpoint holds records newer than the marker it was \
                     restored by",
                ));
            }
            // Checkpoints restored were complete: what is still pending goes out now.
            let last = self.sink.pending.last().map(|(c, _)| *c);
            if let Some(last) = last {
                self.commit_up_to(last)?;
            }
        }
        Ok(CallOutput::default())
    }

    fn process(&mut self, records: &[u8]) -> Result<CallOutput, CallError> {
        if let Some(partitions) = self.partitions {
            // Checked as records arrive, not when their checkpoint's transaction is
            // written: a checkpoint holding a record that cannot be written would fail
            // every restore.
            for record in sluice_codec::BatchReader::new(records) {
                let record = record.map_err(|e| CallError::Contract(e.to_string()))?;
                match record.partition {
                    Some(p) if p < partitions => {}
                    Some(p) => {
                        return Err(self.err(
                            "writing each record to the partition it was read from \
                             (`partitioner = \"record\"`)",
                            format!("a record of partition {p}, but the topic has {partitions}"),
                        ));
                    }
                    None => {
                        return Err(self.err(
                            "writing each record to the partition it was read from \
                             (`partitioner = \"record\"`)",
                            "a record without a source partition: its records must come \
                             from a Kafka source",
                        ));
                    }
                }
            }
        }
        match self.config.delivery {
            Delivery::AtLeastOnce => {
                let producer = self.producer()?;
                let (mut count, mut bytes) = (0, 0);
                for record in sluice_codec::BatchReader::new(records) {
                    let record = record.map_err(|e| CallError::Contract(e.to_string()))?;
                    Self::send(producer, &self.config, &record)
                        .map_err(|e| self.err("sending a record", e))?;
                    count += 1;
                    bytes += record.value.len() + record.key.map_or(0, <[u8]>::len);
                }
                self.count(count, bytes, 0, 0);
                producer.poll(Duration::ZERO);
                self.check_deliveries()?;
            }
            Delivery::ExactlyOnce => {
                if let Some(exchange) = &self.config.exchange {
                    for record in sluice_codec::BatchReader::new(records) {
                        let record = record.map_err(|e| CallError::Contract(e.to_string()))?;
                        let partition = match &exchange.key {
                            Some(key) => {
                                let key = key.key(&record).map_err(|e| {
                                    self.err("keying a record for the next stage", e)
                                })?;
                                crate::network::hash_target(
                                    key,
                                    exchange.partitions,
                                    exchange.partitions,
                                )
                            }
                            None => {
                                let p = self.next_partition % exchange.partitions as usize;
                                self.next_partition = p + 1;
                                p
                            }
                        };
                        self.interval.push_record(sluice_codec::RecordRef {
                            partition: Some(partition as u32),
                            ..record
                        });
                    }
                } else {
                    let count = sluice_codec::BatchReader::count(records)
                        .map_err(|e| CallError::Contract(e.to_string()))?;
                    self.interval.extend_encoded(records, count);
                }
                let held = self.pending_bytes + self.interval.byte_len() as u64;
                if held > self.config.max_pending_bytes {
                    return Err(CallError::Limit(format!(
                        "Kafka sink, topic {:?}: {held} bytes of records wait for checkpoints \
                         to complete, more than `max_pending_mb` allows; checkpoint more often \
                         or raise it",
                        self.config.topic
                    )));
                }
            }
        }
        Ok(CallOutput::default())
    }

    fn process_watermark(&mut self, watermark: i64) -> Result<CallOutput, CallError> {
        self.watermark = self.watermark.max(watermark);
        Ok(CallOutput::default())
    }

    fn set_idle(&mut self, idle: bool) {
        self.idle = idle;
    }

    fn on_timers(&mut self, _: &[u8]) -> Result<CallOutput, CallError> {
        Ok(CallOutput::default())
    }

    fn snapshot(&mut self, checkpoint_id: u64) -> Result<Vec<u8>, CallError> {
        match self.config.delivery {
            Delivery::AtLeastOnce => {
                self.producer()?
                    .flush(PRODUCE_TIMEOUT)
                    .map_err(|e| self.err("flushing before the checkpoint", e))?;
                self.check_deliveries()?;
                Ok(Vec::new())
            }
            Delivery::ExactlyOnce => {
                if let Some(exchange) = &self.config.exchange
                    && (self.watermark > self.written_watermark || self.idle != self.written_idle)
                {
                    // The watermark (and whether the input is idle) goes with the
                    // interval's records, after them.
                    let producer = exchange.producer.to_string();
                    let mut headers = vec![(EXCHANGE_WATERMARK.as_bytes(), producer.as_bytes())];
                    if self.idle {
                        headers.push((EXCHANGE_IDLE.as_bytes(), b"1".as_slice()));
                    }
                    let headers = sluice_codec::encode_headers(headers);
                    let headers = sluice_codec::Headers::decode(&headers)
                        .map_err(|e| CallError::Failed(e.to_string()))?;
                    let value = self.watermark.to_be_bytes();
                    for partition in 0..exchange.partitions {
                        self.interval.push_record(sluice_codec::RecordRef {
                            key: None,
                            value: &value,
                            timestamp: None,
                            headers: Some(headers),
                            partition: Some(partition),
                            output: 0,
                        });
                    }
                    self.written_watermark = self.watermark;
                    self.written_idle = self.idle;
                }
                let records = std::mem::take(&mut self.interval).into_bytes();
                // An interval without records needs no transaction, unless the marker
                // must name every checkpoint.
                if !records.is_empty() || self.config.marker_note.is_some() {
                    self.pending_bytes += records.len() as u64;
                    self.sink.pending.push((checkpoint_id, records));
                }
                postcard::to_allocvec(&self.sink).map_err(|e| CallError::Failed(e.to_string()))
            }
        }
    }

    fn notify_complete(&mut self, checkpoint_id: u64) -> Result<(), CallError> {
        if self.config.delivery == Delivery::ExactlyOnce {
            self.commit_up_to(checkpoint_id)?;
        }
        Ok(())
    }

    fn notify_aborted(&mut self, _: u64) -> Result<(), CallError> {
        // The aborted checkpoint's records stay pending; the next completed checkpoint
        // writes them.
        Ok(())
    }

    fn finish(&mut self) -> Result<CallOutput, CallError> {
        // Exactly once, the tail goes out with the final checkpoint.
        if self.config.delivery == Delivery::AtLeastOnce {
            self.producer()?
                .flush(PRODUCE_TIMEOUT)
                .map_err(|e| self.err("flushing the last records", e))?;
            self.check_deliveries()?;
        }
        Ok(CallOutput::default())
    }

    fn close(&mut self) -> Result<CallOutput, CallError> {
        Ok(CallOutput::default())
    }

    fn dispose(&mut self) -> Result<(), CallError> {
        self.producer = None;
        self.marker = None;
        Ok(())
    }
}
