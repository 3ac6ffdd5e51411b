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
//!
//! Which file holds what:
//! - `source`: the source — its configuration, the partitions a subtask owns and where
//!   it starts in them, its checkpointed position (and merging positions on a rescale),
//!   its reading, event time and idleness;
//! - `stats`: librdkafka's statistics — where each partition starts and ends, the
//!   source's lag, and which partitions it has read to their end;
//! - `exchange`: the exchange topics between the stages of a job spread over several
//!   hosts — watermark and idleness records, and how a reader combines its producers'
//!   watermarks;
//! - `sink`: the sink — its records, and, exactly once, the transactions of
//!   checkpoints' records and the markers that name them;
//! - `producer`: the sink's producers — their settings, delivery reports, and producers
//!   that fenced ahead of their sink;
//! - `marker`: the markers — their metadata, and what they say when a run restores a
//!   checkpoint (a rewind of committed output, the ids its checkpoints stay above);
//! - `admin`: the brokers' settings, read to explain what they refuse.

mod admin;
mod client_errors;
mod dead_letter;
mod exchange;
mod marker;
mod producer;
mod sink;
mod source;
mod stats;
#[cfg(test)]
mod test_support;

pub use exchange::{EXCHANGE_IDLE, EXCHANGE_WATERMARK, ExchangeOutput};
pub(crate) use marker::new_run_id;
pub use marker::{
    SubtaskMarker, committed_after, first_free_id, parse_marker_metadata, read_marker, read_markers,
};
pub use producer::{FencedAhead, fence_ahead};
pub use sink::{Delivery, KafkaSink, KafkaSinkConfig, TRANSACTION_TIMEOUT_MS};
pub use source::{
    KafkaSource, KafkaSourceConfig, OutOfRange, StartFrom, Topics, merge_positions, owner_of,
    topic_pattern,
};
pub use stats::SourceStats;
