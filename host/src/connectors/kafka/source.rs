//! The Kafka source: its configuration, the partitions each subtask owns and where it
//! starts in them, its checkpointed position, and its reading.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde::{Deserialize, Serialize};
use sluice_codec::BatchWriter;

use super::client_errors::EVENTS_SERVED;
use super::dead_letter::BadRecords;
use super::exchange::{self, is_exchange_batch, watermark_record};
use super::stats::SourceStats;
use crate::chain::CallError;
use crate::connectors::event_time::{EventTime, json_timestamp, timestamp_of};
use crate::connectors::formats::{Decoded, Decoder, FormatConfig};
use crate::connectors::{Source, SourceStatus};
use crate::metrics::OperatorMetrics;

/// How long a metadata or offset request to the broker may take before the source fails
/// (its job restarts by its restart strategy and tries again).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Positions kept for checkpoints not yet complete (the most checkpoints in flight).
const MAX_PENDING_COMMITS: usize = 16;

/// How soon an idle source polls again: librdkafka fetches in the background, so a poll
/// only takes what already arrived.
const IDLE_POLL: Duration = Duration::from_millis(5);

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

/// What a source does when the offset it is to read next is no longer in its partition:
/// retention deleted the records, or the topic was made anew, while the job was stopped
/// or far behind (Kafka's `auto.offset.reset`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutOfRange {
    /// Fail for good, naming the topic, the partition, the offset and what the partition
    /// holds: going on would skip records, or read some again, without a word.
    Fail,
    /// Go on from the partition's first offset still in the log.
    Earliest,
    /// Go on from the partition's end.
    Latest,
}

impl OutOfRange {
    /// librdkafka's `auto.offset.reset` for it.
    fn reset(self) -> &'static str {
        match self {
            OutOfRange::Fail => "error",
            OutOfRange::Earliest => "earliest",
            OutOfRange::Latest => "latest",
        }
    }
}

/// The error of an offset no longer in its partition, which holds `low..high`.
fn out_of_range(topic: &str, partition: i32, offset: i64, low: i64, high: i64) -> anyhow::Error {
    CallError::Unrecoverable(format!(
        "Kafka topic {topic:?} partition {partition} ({topic}/{partition}): offset {offset}, \
         where the source is to go on reading, is no longer in the partition, which holds \
         offsets {low} up to its end at {high} (retention deleted records, or the topic was \
         made anew): going on would skip records or read some again. To go on anyway, set \
         the source's `on_out_of_range` to \"earliest\" (from offset {low}) or \"latest\" \
         (from {high})"
    ))
    .into()
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
    /// What to do when an offset to read is no longer in its partition.
    pub on_out_of_range: OutOfRange,
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
    /// [`EXCHANGE_WATERMARK`](super::EXCHANGE_WATERMARK)): their watermark records set
    /// event time and end the input.
    pub exchange_producers: Option<u32>,
    /// What the values are, and what to do with one that is not (boxed: most sources
    /// read bytes, and the config travels in every source vertex).
    pub format: Box<FormatConfig>,
}

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
pub(super) struct Position {
    pub(super) offsets: Vec<(String, i32, i64)>,
    /// Bounded sources: the offset each partition ends at.
    pub(super) stops: Vec<(String, i32, i64)>,
    /// The largest record timestamp read from each partition.
    pub(super) max_timestamps: Vec<(String, i32, i64)>,
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

/// The partitions a subtask owns (topic, partition), and the topics the metadata
/// reported with an error.
type OwnedPartitions = (Vec<(String, i32)>, BTreeSet<String>);

/// A Kafka source subtask.
pub struct KafkaSource {
    config: KafkaSourceConfig,
    /// `Topics::Pattern`, compiled.
    pattern: Option<regex::Regex>,
    /// `allowed`, compiled.
    allowed: Option<Vec<regex::Regex>>,
    pub(super) consumer: BaseConsumer<SourceStats>,
    /// Where event time comes from: the records' timestamps, or a field of their values
    /// (see `stamps_event_time`); none without event time.
    event_time: Option<EventTime>,
    /// Where the source reports its counters and lag (see `attach_metrics`).
    pub(super) metrics: Option<Arc<OperatorMetrics>>,
    subtask: u32,
    parallelism: u32,
    /// The partitions this subtask reads, with the next offset of each.
    pub(super) next: BTreeMap<(String, i32), i64>,
    /// Whether the partitions were assigned (on the first poll, after a restore).
    started: bool,
    /// Offsets restored from a checkpoint, for the first assignment; after it, those of
    /// topics the metadata has not told since (see `assign`).
    restored: Option<BTreeMap<(String, i32), i64>>,
    /// Bounded sources: where each partition ends (fixed when it is first assigned).
    stops: BTreeMap<(String, i32), i64>,
    /// Per partition: the largest record timestamp read (checkpointed), and when its last
    /// record came (for idleness).
    max_timestamps: BTreeMap<(String, i32), i64>,
    last_record: BTreeMap<(String, i32), Instant>,
    /// When each partition was assigned (since a restore).
    pub(super) assigned_at: BTreeMap<(String, i32), Instant>,
    /// As of the last statistics: for each partition whose end they told, whether the
    /// source has read to it.
    pub(super) read_to_end: BTreeMap<(String, i32), bool>,
    last_discovery: Instant,
    /// Positions taken for checkpoints, until they complete (then committed) or a later
    /// one completes.
    pending: BTreeMap<u64, Vec<(String, i32, i64)>>,
    /// An exchange topic's reader: the newest watermark of each producer, and those that
    /// said they are idle (both checkpointed).
    pub(super) producer_watermarks: BTreeMap<u32, i64>,
    pub(super) idle_producers: BTreeSet<u32>,
    /// An exchange topic's reader: the largest watermark its producers' records allowed,
    /// taken record by record as an input gate takes its channels' events (checkpointed).
    pub(super) exchange_reached: Option<i64>,
    /// Decodes the values by the source's `format`, and the keys by its `key_format`.
    decoder: Decoder,
    key_decoder: Option<Decoder>,
    /// What becomes of records it cannot decode (`on_bad_record`).
    bad: BadRecords,
}

impl KafkaSource {
    /// What the consumer reported lately that no request returned (a refused
    /// authentication, an untrusted certificate), to follow a failed request's context.
    /// Polls it to take those reports in: only on the way to failing the task, which
    /// restarts from a checkpoint (a record the poll fetched is read again then).
    fn client_errors(&self) -> String {
        // (A poll serves one event at most.)
        for _ in 0..EVENTS_SERVED {
            let _ = self.consumer.poll(Duration::ZERO);
        }
        self.consumer.context().errors.note(&self.config.properties)
    }

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
        client.set("auto.offset.reset", config.on_out_of_range.reset());
        if client.get("statistics.interval.ms") == Some("0") {
            // (Without them no partition would ever be known read to its end.)
            client.set("statistics.interval.ms", "1000");
        }
        let consumer = client
            .set_log_level(RDKafkaLogLevel::Warning)
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
        let decoder = Decoder::new(&config.format)?;
        let key_decoder = config.format.key.as_deref().map(Decoder::new).transpose()?;
        let bad = BadRecords::new(&config)?;
        Ok(KafkaSource {
            decoder,
            key_decoder,
            bad,
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

    /// The partitions of the configured topics this subtask owns, and the topics the
    /// metadata reported with an error (a pattern's: a topic named outright fails the
    /// source instead), whose partitions it does not tell.
    fn owned_partitions(&self) -> Result<OwnedPartitions> {
        let metadata = match &self.config.topics {
            Topics::Names(names) => {
                let mut all = Vec::with_capacity(names.len());
                for topic in names {
                    let metadata = self
                        .consumer
                        .fetch_metadata(Some(topic), REQUEST_TIMEOUT)
                        .with_context(|| {
                            format!(
                                "reading the partitions of Kafka topic {topic:?}{}",
                                self.client_errors()
                            )
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
                    .with_context(|| {
                        format!(
                            "reading the topics of the Kafka cluster{}",
                            self.client_errors()
                        )
                    })?,
            ],
        };
        // (A test makes a topic look reported with an error.)
        let failed = match &self.config.topics {
            Topics::Pattern(_) => crate::failpoints::argument("kafka-source::topic-metadata"),
            Topics::Names(_) => None,
        };
        let mut owned = Vec::new();
        let mut unread = BTreeSet::new();
        for metadata in &metadata {
            for t in metadata.topics() {
                let topic = t.name();
                if self.pattern.is_some()
                    && (t.error().is_some() || failed.as_deref() == Some(topic))
                {
                    unread.insert(topic.to_string());
                    continue;
                }
                let wanted = match (&self.config.topics, &self.pattern) {
                    (Topics::Names(names), _) => names.iter().any(|n| n == topic),
                    (_, Some(pattern)) => !topic.starts_with("__") && pattern.is_match(topic),
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
        Ok((owned, unread))
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
    ///
    /// The restored offsets of a topic the metadata reported with an error are kept
    /// (and checkpointed) until a later discovery reads the topic: dropped, its
    /// partitions would be found again as new ones and read from their start.
    fn assign(&mut self) -> Result<()> {
        let (owned, unread) = self.owned_partitions()?;
        let (kept, restored) = match self.restored.take() {
            Some(r) => {
                let (kept, restored): (BTreeMap<_, _>, BTreeMap<_, _>) = r
                    .into_iter()
                    .partition(|((topic, _), _)| unread.contains(topic));
                (kept, Some(restored))
            }
            None => (BTreeMap::new(), None),
        };
        let new: Vec<(String, i32)> = if self.started && self.config.bounded {
            // A bounded source reads the partitions it found at its start only (and
            // those its checkpoint names).
            Vec::new()
        } else {
            owned
                .iter()
                .filter(|p| !self.next.contains_key(*p))
                .filter(|p| !restored.as_ref().is_some_and(|r| r.contains_key(*p)))
                .cloned()
                .collect()
        };
        let restores_some = restored
            .as_ref()
            .is_some_and(|r| r.keys().any(|p| owned.contains(p)));
        if self.started && new.is_empty() && !restores_some {
            // Nothing new: assigning again would throw away what librdkafka fetched.
            self.restored = (!kept.is_empty()).then_some(kept);
            self.last_discovery = Instant::now();
            return Ok(());
        }
        // What a restored position says of partitions another subtask owns now is theirs
        // (after a rescale every subtask gets every partition's).
        let mine = |p: &(String, i32)| owned.contains(p) || kept.contains_key(p);
        self.stops.retain(|p, _| mine(p));
        self.max_timestamps.retain(|p, _| mine(p));
        if let Some(restored) = &restored {
            let mut from_checkpoint = Vec::new();
            for (p, offset) in restored {
                if owned.contains(p) {
                    self.next.insert(p.clone(), *offset);
                    from_checkpoint.push(p.clone());
                }
            }
            self.resolve_out_of_range(&from_checkpoint)?;
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
        self.restored = (!kept.is_empty()).then_some(kept);
        self.last_discovery = Instant::now();
        Ok(())
    }
}

impl KafkaSource {
    /// Checks that the next offsets of `partitions` are still in them; those that are
    /// not fail the source or move to their partition's start or end, as
    /// `on_out_of_range` says.
    fn resolve_out_of_range(&mut self, partitions: &[(String, i32)]) -> Result<()> {
        for p in partitions {
            let Some(&offset) = self.next.get(p) else {
                continue;
            };
            let (low, high) = self
                .consumer
                .fetch_watermarks(&p.0, p.1, REQUEST_TIMEOUT)
                .with_context(|| format!("reading the offsets of {}/{}", p.0, p.1))?;
            if (low..=high).contains(&offset) {
                continue;
            }
            let to = match self.config.on_out_of_range {
                OutOfRange::Fail => return Err(out_of_range(&p.0, p.1, offset, low, high)),
                OutOfRange::Earliest => low,
                OutOfRange::Latest => high,
            };
            tracing::warn!(
                "Kafka source: {}/{}: offset {offset} is no longer in the partition (it holds \
                 {low} up to {high}); going on from {to} (`on_out_of_range`)",
                p.0,
                p.1
            );
            self.next.insert(p.clone(), to);
        }
        Ok(())
    }

    /// The error of a partition librdkafka found out of range while reading (it does
    /// not say which): the first whose next offset is not in it.
    fn out_of_range_while_reading(&self, e: KafkaError) -> anyhow::Error {
        for ((topic, partition), &offset) in &self.next {
            if let Ok((low, high)) =
                self.consumer
                    .fetch_watermarks(topic, *partition, REQUEST_TIMEOUT)
                && !(low..=high).contains(&offset)
            {
                return out_of_range(topic, *partition, offset, low, high);
            }
        }
        anyhow::Error::from(CallError::Unrecoverable(format!(
            "reading from Kafka: an offset to go on at is no longer in the log ({e}); set the \
             source's `on_out_of_range` to go on anyway"
        )))
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
        // either, with `on_out_of_range = "earliest"` (the consumer resets to the log's
        // start; its position moves only with a record). Otherwise the consumer reports
        // the offset out of range.
        if self.config.on_out_of_range != OutOfRange::Earliest {
            return Ok(());
        }
        let ends = self.consumer.context().bounds();
        for (p, next) in &mut self.next {
            if let Some(bounds) = ends.get(p) {
                *next = (*next).max(bounds.start);
            }
        }
        Ok(())
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
        // A bounded source reads the partitions it found at its start only (but looks
        // again for the topics of restored offsets the metadata did not tell).
        let discover = !self.config.bounded || self.restored.is_some();
        if !self.started || (discover && self.last_discovery.elapsed() >= self.config.discovery) {
            self.assign().with_context(|| {
                format!(
                    "Kafka source reading {} from {}",
                    self.config.topics, self.config.bootstrap
                )
            })?;
        }
        if self.config.bounded
            && self.restored.is_none()
            && self
                .next
                .iter()
                .all(|(p, next)| self.stops.get(p).is_some_and(|stop| next >= stop))
        {
            // What is left unread of what it was to read: nothing (the statistics'
            // last lag is up to an interval old).
            if let Some(metrics) = &self.metrics {
                *metrics.lag.lock() = self
                    .next
                    .keys()
                    .map(|(topic, partition)| (format!("{topic}/{partition}"), 0))
                    .collect();
            }
            return Ok(SourceStatus::End);
        }
        // Every producer of the exchange ended its output: so does this input.
        if let Some(producers) = self.config.exchange_producers
            && self.exchange_ended(producers)
        {
            return Ok(SourceStatus::End);
        }
        let (mut records, mut bytes) = (0, 0);
        // The partition of the last record (records come in runs of one partition: its
        // name is not copied per record), and the partitions records were taken from.
        let mut key = (String::new(), -1);
        let mut touched: Vec<(String, i32)> = Vec::new();
        for _ in 0..max {
            // (An exchange topic's record may be a batch of many.)
            if records >= max as u64 {
                break;
            }
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
                    // An offset no longer in the log, with `on_out_of_range = "fail"`:
                    // records would be skipped.
                    if let KafkaError::MessageConsumption(
                        rdkafka::types::RDKafkaErrorCode::AutoOffsetReset,
                    ) = e
                    {
                        return Err(self.out_of_range_while_reading(e));
                    }
                    tracing::warn!("Kafka source: {e}");
                    continue;
                }
            };
            if key.1 != message.partition() || key.0 != message.topic() {
                key = (message.topic().to_string(), message.partition());
            }
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
            if self.config.exchange_producers.is_some() && is_exchange_batch(&message) {
                let (n, b) = exchange::take_batch(&message, key.1, out).with_context(|| {
                    format!(
                        "exchange topic {}/{}: the batch at offset {}",
                        key.0,
                        key.1,
                        message.offset()
                    )
                })?;
                if touched.last() != Some(&key) {
                    touched.push(key.clone());
                }
                records += n;
                bytes += b;
                continue;
            }
            let decoding = |e: anyhow::Error| {
                e.context(format!(
                    "decoding Kafka record {}/{} at offset {}",
                    key.0,
                    key.1,
                    message.offset()
                ))
            };
            let record_key = match (&mut self.key_decoder, message.key()) {
                (Some(decoder), Some(bytes)) => match decoder.decode(&key.0, bytes) {
                    Ok(Decoded::Value(decoded)) => Some(decoded),
                    Ok(Decoded::Bad(why)) => {
                        self.bad.take(&message, &format!("the key: {why}"))?;
                        continue;
                    }
                    Err(e) => return Err(decoding(e)),
                },
                (_, key) => key,
            };
            let value = match self
                .decoder
                .decode(&key.0, message.payload().unwrap_or_default())
            {
                Ok(Decoded::Value(value)) => value,
                Ok(Decoded::Bad(why)) => {
                    self.bad.take(&message, &why)?;
                    continue;
                }
                Err(e) => return Err(decoding(e)),
            };
            let from_value =
                self.event_time
                    .as_ref()
                    .and_then(|e| match (&e.json_field, e.field) {
                        (Some(name), _) => Some(json_timestamp(name, value)),
                        (None, Some(field)) => Some(timestamp_of(e, field, value)),
                        (None, None) => None,
                    });
            let timestamp = match from_value {
                Some(ts) => Some(ts.with_context(|| {
                    format!(
                        "Kafka record {}/{} at offset {}",
                        key.0,
                        key.1,
                        message.offset()
                    )
                })?),
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
                match self.max_timestamps.get_mut(&key) {
                    Some(max) => *max = (*max).max(ts),
                    None => {
                        self.max_timestamps.insert(key.clone(), ts);
                    }
                }
            }
            if touched.last() != Some(&key) {
                touched.push(key.clone());
            }
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
                key: record_key,
                value,
                timestamp,
                headers: headers
                    .as_deref()
                    .map(sluice_codec::Headers::decode)
                    .transpose()?,
                partition: Some(message.partition() as u32),
                output: 0,
            });
        }
        // When each partition last gave a record (for idleness): now, to the precision of
        // one poll.
        if !touched.is_empty() {
            let now = Instant::now();
            for partition in touched {
                self.last_record.insert(partition, now);
            }
        }
        // A checkpoint taken after this poll is past its bad records: they are in the
        // dead-letter topic first.
        self.bad.flush()?;
        let bad = self.bad.unreported();
        self.report(records, bytes, bad);
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
        // Restored but not polled yet (a checkpoint may come first), or of a topic not
        // read since: the restored offsets are still where it stands.
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
        self.started && self.next.is_empty() && self.restored.is_none()
    }

    fn watermark_without_records(&self) -> bool {
        self.config.exchange_producers.is_some()
    }

    fn read_to_end(&self) -> bool {
        // (An exchange topic's reader is idle when its producers say so, not by silence.)
        self.config.exchange_producers.is_some()
            || self.started
                && self.restored.is_none()
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

#[cfg(test)]
mod tests;
