//! The allowed range of every knob of a job file, checked when a job is validated: by
//! `sluice run`, `sluice validate`, and a server at submission and at every start alike. A
//! value outside its range is refused with the job file, the table, the field, the value
//! and the range named — never clamped silently, so what runs is what the file says.
//!
//! Each bound is a judgment call: wide enough for a serious deployment on one host, narrow
//! enough that no value makes the host allocate without bound, run out of threads, or
//! overflow its arithmetic. (Unbounded, `channel_capacity = 1000000000` allocated ~40 GB
//! and aborted the process, taking every other job of it down; 30,000 source subtasks
//! exhausted its threads.)

use std::fmt::Display;
use std::ops::RangeInclusive;

use anyhow::{Result, bail};

/// A number of a job file that has a default: the field it is written in, the value it
/// takes when left out, and the values allowed.
#[derive(Debug)]
pub struct Knob<T: 'static> {
    /// The field, as written in the file.
    pub field: &'static str,
    /// The value when the field is left out.
    pub default: T,
    /// The values allowed.
    pub range: RangeInclusive<T>,
}

impl<T: PartialOrd + Display + Copy> Knob<T> {
    /// `value` (checked against the range), or the default when it is `None`.
    pub fn resolve(&self, value: Option<T>) -> Result<T> {
        value.map_or(Ok(self.default), |v| in_range(self.field, v, &self.range))
    }
}

/// `value`, if it lies in `range`; else an error naming the field, the value and the range.
pub fn in_range<T: PartialOrd + Display>(
    field: &str,
    value: T,
    range: &RangeInclusive<T>,
) -> Result<T> {
    if !range.contains(&value) {
        bail!(
            "`{field}` = {value} is out of range: it must be between {} and {}",
            range.start(),
            range.end()
        );
    }
    Ok(value)
}

/// A day in milliseconds: the longest interval, timeout, pause or delay a job file may
/// ask for. A longer wait is a mistake (and far-future instants overflow).
pub const DAY_MS: u64 = 86_400_000;

/// Subtasks of one source, operator or sink. Every subtask is a thread (an operator's
/// subtask also a Wasm instance): 1024 is more cores than one host has.
pub const PARALLELISM: RangeInclusive<u32> = 1..=1024;
/// Key groups (`max_parallelism`): the most a keyed operator can ever be rescaled to.
/// 32,768 is Flink's bound too.
pub const MAX_PARALLELISM: Knob<u32> = Knob {
    field: "max_parallelism",
    default: 128,
    range: 1..=32_768,
};
/// Subtasks (threads) of a whole job: four vertices at the largest parallelism. A
/// server also charges them against the tenant's `max_subtasks`.
pub const JOB_SUBTASKS: u32 = 4096;

/// Records a source reads per batch (default 1024): beyond 65,536 a batch amortizes
/// nothing more, and only delays checkpoint barriers and grows buffers.
pub const BATCH_SIZE: Knob<usize> = Knob {
    field: "batch_size",
    default: 1024,
    range: 1..=65_536,
};
/// Bytes after which a channel buffer is sent (default 32 KiB, as Flink's network
/// buffers): 4 MiB is 128 times that.
pub const BUFFER_BYTES: Knob<usize> = Knob {
    field: "buffer_bytes",
    default: 32 << 10,
    range: 1..=4 << 20,
};
/// Milliseconds a partly filled buffer waits (default 100): a minute is a batch job's
/// latency already.
pub const BUFFER_TIMEOUT_MS: Knob<u64> = Knob {
    field: "buffer_timeout_ms",
    default: 100,
    range: 0..=60_000,
};
/// Buffers a channel holds before its sender blocks (default 8; Flink gives a channel
/// 2 and a task 8 more to share). The slots are allocated up front.
pub const CHANNEL_CAPACITY: Knob<usize> = Knob {
    field: "channel_capacity",
    default: 8,
    range: 1..=1024,
};

/// The most bytes one channel may hold: its `channel_capacity` slots and the buffer
/// its sender fills, of slot bytes (`job::ChannelMemory::slot_bytes`) each. 64 MiB
/// is over 200 times what the defaults need (9 × 32 KiB).
pub const CHANNEL_BYTES: u64 = 64 << 20;
/// Channels of a job: a 256 × 256 keyed or rebalanced exchange. Every channel has its
/// slots allocated up front and is polled by its receiver.
pub const JOB_CHANNELS: u64 = 65_536;
/// The most bytes all the channels of a job may hold: 2 GiB. At the defaults a
/// 64 × 64 keyed exchange can hold 1.2 GB (4096 channels × 9 × 32 KiB); a wider one
/// needs a smaller `channel_capacity` or `buffer_bytes`. (Flink's network memory of a
/// whole TaskManager is at most 1 GB by default.)
pub const JOB_CHANNEL_BYTES: u64 = 2 << 30;
/// What a slot holds besides its bytes (the element and its vector), counted with them.
pub const SLOT_OVERHEAD: u64 = 64;

/// Generator records in total: a trillion is a day at ten million a second, and keeps
/// the event time of the last record (records × `step_ms`) within 64 bits.
pub const RECORDS: RangeInclusive<u64> = 0..=1_000_000_000_000;
/// Generator words per line (default 8): a line of 1024 words is about 11 KiB.
pub const WORDS_PER_RECORD: Knob<usize> = Knob {
    field: "words_per_record",
    default: 8,
    range: 0..=1024,
};
/// Generator distinct words or keys (default 1000): a billion; the generator
/// multiplies two numbers below it, which must fit 64 bits.
pub const VOCABULARY: Knob<u64> = Knob {
    field: "vocabulary",
    default: 1000,
    range: 1..=1_000_000_000,
};
/// Generator distinct keys of `events` (default 1000): as [`VOCABULARY`].
pub const KEYS: Knob<u64> = Knob {
    field: "keys",
    default: 1000,
    range: VOCABULARY.range,
};
/// Generator event time between records (default 10 ms): at most an hour.
pub const STEP_MS: Knob<i64> = Knob {
    field: "step_ms",
    default: 10,
    range: 0..=3_600_000,
};
/// Generator lateness of a record (default 0): at most a day.
pub const JITTER_MS: Knob<i64> = Knob {
    field: "jitter_ms",
    default: 0,
    range: 0..=DAY_MS as i64,
};
/// Generator records per second per subtask: one per thousand seconds to a billion
/// (beyond any generator's speed).
pub const RATE: RangeInclusive<f64> = 0.001..=1e9;
/// Bounded out-of-orderness of event time: at most a week.
pub const OUT_OF_ORDERNESS_MS: RangeInclusive<u64> = 0..=7 * DAY_MS;
/// Silence before a source declares itself idle: at most a day.
pub const IDLE_TIMEOUT_MS: RangeInclusive<u64> = 0..=DAY_MS;
/// How often a Kafka source looks for new partitions (default 10 s): from 100 ms to
/// a day (each look asks the broker for the topics' metadata).
pub const DISCOVERY_MS: Knob<u64> = Knob {
    field: "discovery_ms",
    default: 10_000,
    range: 100..=DAY_MS,
};
/// Records a Kafka sink subtask holds for checkpoints not yet complete, in MiB
/// (default 256): at most 64 GiB.
pub const MAX_PENDING_MB: Knob<u64> = Knob {
    field: "max_pending_mb",
    default: 256,
    range: 1..=65_536,
};

/// Milliseconds between checkpoints, when not 0 (savepoints only): from 10 ms (more
/// often only piles barriers up) to a day.
pub const CHECKPOINT_INTERVAL_MS: RangeInclusive<u64> = 10..=DAY_MS;
/// Checkpoint timeout (default 10 minutes): at most a day.
pub const CHECKPOINT_TIMEOUT_MS: Knob<u64> = Knob {
    field: "timeout_ms",
    default: 600_000,
    range: 0..=DAY_MS,
};
/// Least pause between checkpoints (default 0): at most a day.
pub const MIN_PAUSE_MS: Knob<u64> = Knob {
    field: "min_pause_ms",
    default: 0,
    range: CHECKPOINT_TIMEOUT_MS.range,
};
/// Checkpoints in flight (default 1): each holds its snapshots until complete.
pub const MAX_CONCURRENT: Knob<usize> = Knob {
    field: "max_concurrent",
    default: 1,
    range: 1..=16,
};
/// Memory of an operator instance's RocksDB (block cache and write buffers), MiB.
pub const STATE_MEMORY_MB: Knob<u64> = Knob {
    field: "memory_mb",
    default: 64,
    range: 8..=65_536,
};
/// Complete checkpoints kept on disk (default 3).
pub const RETAIN: Knob<usize> = Knob {
    field: "retain",
    default: 3,
    range: 1..=100,
};

/// Restarts after failures: a million restarts is weeks of crash looping; a job meant
/// to restart forever says a million. (Every restart keeps its failure in the report.)
pub const RESTART_ATTEMPTS: Knob<u32> = Knob {
    field: "attempts",
    default: 3,
    range: 0..=1_000_000,
};
/// Delay before a restart (the first one, for `exponential`; default a second): at most
/// a day.
pub const RESTART_DELAY_MS: Knob<u64> = Knob {
    field: "delay_ms",
    default: 1000,
    range: 0..=DAY_MS,
};
/// The longest delay of `exponential` (default a minute): at most a day.
pub const RESTART_MAX_DELAY_MS: Knob<u64> = Knob {
    field: "max_delay_ms",
    default: 60_000,
    range: 0..=DAY_MS,
};
/// Growth of `exponential` delays (default 2).
pub const RESTART_MULTIPLIER: Knob<f64> = Knob {
    field: "multiplier",
    default: 2.0,
    range: 1.0..=10.0,
};

/// Bytes of a generated word with its separator, at most: a word of a vocabulary of
/// at most a billion has at most 10 letters.
pub(crate) const WORD_BYTES: u64 = 11;
/// Bytes of a generated event line (`timestamp,kKEY,value`), at most.
pub(crate) const EVENT_BYTES: u64 = 40;
/// Bytes a record takes in a batch besides its value (flags, timestamp, lengths).
pub(crate) const RECORD_OVERHEAD: u64 = 17;

/// `[cluster] exchange_partitions`: partitions of each exchange topic, so the units of
/// each stage after the first (default 8).
pub const EXCHANGE_PARTITIONS: Knob<u32> = Knob {
    field: "exchange_partitions",
    default: 8,
    range: 1..=1024,
};
/// `[cluster] session_timeout_ms`: how long a silent host keeps its units (Kafka's
/// `session.timeout.ms`, default 10 s): from a second to an hour.
pub const SESSION_TIMEOUT_MS: Knob<u32> = Knob {
    field: "session_timeout_ms",
    default: 10_000,
    range: 1_000..=3_600_000,
};
