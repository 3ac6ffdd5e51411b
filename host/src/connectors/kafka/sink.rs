//! The Kafka sink: its configuration, its producer and the delivery reports it polls,
//! and, exactly once, the write-ahead log of checkpoints' records, written into
//! transactions by a committer thread (`committer.rs`), with the markers that name the
//! checkpoints committed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::Producer as _;
use rdkafka::types::RDKafkaErrorCode;
use serde::{Deserialize, Serialize};
use sluice_codec::BatchWriter;

use crate::connectors::formats::{Encoder, Format, FormatConfig};

use super::admin::broker_setting;
use super::exchange::{EXCHANGE_IDLE, EXCHANGE_WATERMARK, ExchangeOutput};
use super::marker::{describe_marker, new_run_id, parse_marker_metadata, read_marker};
use super::producer::{self, DeliveryReport, Producer, producer_client, reports, take_fenced};
use crate::chain::{
    CallError, CallOutput, OpenInfo, Operator, OperatorIdentity, OperatorState, TrapKind,
};
use crate::state::Holding;

mod committer;
mod writer;
use committer::Committer;
use writer::Writer;

/// How a Kafka sink delivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// Records are sent as they come; a checkpoint waits until every record sent before
    /// it is acknowledged. After a failure, records since the last checkpoint are sent
    /// again.
    AtLeastOnce,
    /// Records of each checkpoint interval are written in a Kafka transaction that
    /// commits once the checkpoint is complete; consumers reading `read_committed` see
    /// each record once.
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
    /// `transactional_id_prefix` is a default, not one the job file names: a restored
    /// subtask then takes the prefix its checkpointed state was written with. The
    /// transactional ids, and the markers in their groups, go with the checkpoints, so a
    /// job restored from a checkpoint of another folder (whose default prefix differs)
    /// goes on with the ids of the run it continues: it fences that run's producers and
    /// reads and moves its markers.
    pub default_prefix: bool,
    /// Most bytes of records one subtask holds for checkpoints not yet complete (exactly
    /// once).
    pub max_pending_bytes: u64,
    /// Write each record to the partition it was read from (`partitioner = "record"`),
    /// not by its key.
    pub by_record_partition: bool,
    /// Further librdkafka producer properties.
    pub properties: BTreeMap<String, String>,
    /// What the values written are (encoded from the operators' JSON).
    pub format: FormatConfig,
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

/// The checkpointed state of an exactly-once sink subtask: the records of checkpoints
/// taken but not known to be committed, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct SinkState {
    /// Which run of the job these checkpoints belong to (fixed at its fresh start), so a
    /// marker that an earlier run left in the group is not taken for this one's.
    pub(super) run: u64,
    pending: Vec<(u64, Vec<u8>)>,
    /// The prefix of the transactional ids the subtask wrote with (`None` in states
    /// written before they kept it).
    prefix: Option<String>,
}

impl SinkState {
    /// Decodes a subtask's checkpointed state, also one without its prefix.
    pub(super) fn decode(bytes: &[u8]) -> Result<SinkState, postcard::Error> {
        postcard::from_bytes(bytes).or_else(|_| {
            postcard::from_bytes::<(u64, Vec<(u64, Vec<u8>)>)>(bytes).map(|(run, pending)| {
                SinkState {
                    run,
                    pending,
                    prefix: None,
                }
            })
        })
    }
}

/// The transactional id of subtask `subtask` of a sink whose ids have prefix `prefix`
/// (the group of its markers too).
pub(super) fn transactional_id(prefix: &str, subtask: u32) -> String {
    format!("{prefix}-{subtask}")
}

/// The prefix of the transactional ids of a subtask of the sink `config` restored from
/// `restored` (see [`KafkaSinkConfig::default_prefix`]).
pub(super) fn restored_prefix<'a>(config: &'a KafkaSinkConfig, restored: &'a SinkState) -> &'a str {
    match &restored.prefix {
        Some(prefix) if config.default_prefix => prefix,
        _ => &config.transactional_id_prefix,
    }
}

/// A Kafka sink subtask: the last operator of its chain.
///
/// Exactly once keeps a write-ahead log, because librdkafka cannot resume a transaction
/// another producer opened (a restarted subtask's `init_transactions` aborts it): the
/// records of a checkpoint interval are kept and go into the checkpoint, until the
/// committer thread, which sends them into a transaction as they come, has committed
/// that transaction once the checkpoint is complete. The transaction
/// also commits the checkpoint's id as the offset of the subtask's marker group
/// (`PREFIX-N`), so after a failure the restored subtask knows which of its pending
/// checkpoints already reached Kafka and writes only the others.
pub struct KafkaSink {
    identity: OperatorIdentity,
    state: OperatorState,
    config: KafkaSinkConfig,
    subtask: u32,
    producer: Option<Arc<Producer>>,
    /// What writes records (made at open).
    writer: Option<Arc<Writer>>,
    /// Exactly once: the thread that writes checkpoints' transactions (started at open).
    committer: Option<Committer>,
    /// Exactly once: the newest checkpoint the job completed.
    completed: u64,
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
    /// Encodes values by the sink's `format`, and keys by its `key_format` (made at
    /// open: they may ask the registry).
    encoder: Option<Encoder>,
    key_encoder: Option<Encoder>,
    /// Set when the sink's task is cancelled: a wait for room in the producer's queue
    /// (which lasts until records time out, `message.timeout.ms`, when the brokers do
    /// not answer) ends at once.
    cancel: Arc<AtomicBool>,
}

/// How long a flush or a transaction step may take before the sink fails (its job
/// restarts from the last checkpoint).
pub(super) const PRODUCE_TIMEOUT: Duration = Duration::from_secs(60);

/// How long one try to reach the brokers waits for their answer.
const REACH_TRY: Duration = Duration::from_secs(1);

/// The producers' `transaction.timeout.ms` unless the job's `properties` set it: the
/// brokers' default `transaction.max.timeout.ms` (15 minutes), above the longest a
/// checkpoint may take by default (10 minutes): a checkpoint's transaction is open from
/// its barrier until it completes (a job whose checkpoints may take longer is refused).
pub const TRANSACTION_TIMEOUT_MS: &str = "900000";

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
            writer: None,
            committer: None,
            completed: 0,
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
            encoder: None,
            key_encoder: None,
            cancel: Arc::default(),
        }
    }

    /// Makes the sink stop waiting for room in its producer's queue once `cancel` is
    /// set (the task's cancellation flag).
    pub fn with_cancel(mut self, cancel: Arc<AtomicBool>) -> Self {
        self.cancel = cancel;
        self
    }

    /// This subtask's transactional id (its marker group's too).
    fn transactional_id(&self) -> String {
        transactional_id(self.prefix(), self.subtask)
    }

    /// The prefix of this subtask's transactional ids (see
    /// [`KafkaSinkConfig::default_prefix`]).
    fn prefix(&self) -> &str {
        self.sink
            .prefix
            .as_deref()
            .unwrap_or(&self.config.transactional_id_prefix)
    }

    /// The prefix the transactional ids of a subtask restored from `restored` take.
    fn prefix_of(&self, restored: &SinkState) -> String {
        restored_prefix(&self.config, restored).to_owned()
    }

    fn err(&self, what: &str, e: impl std::fmt::Display) -> CallError {
        writer::error(&self.config, what, e)
    }

    fn producer(&self) -> Result<&Producer, CallError> {
        self.producer
            .as_deref()
            .ok_or_else(|| CallError::Failed("Kafka sink used before open".into()))
    }

    fn writer(&self) -> Result<&Writer, CallError> {
        self.writer
            .as_deref()
            .ok_or_else(|| CallError::Failed("Kafka sink used before open".into()))
    }

    fn check_deliveries(&self) -> Result<(), CallError> {
        self.writer()?.check_deliveries(self.producer()?)
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

    /// The settings of a producer of this sink: with `transactional_id`, a transactional
    /// one. The job's `properties` go over the defaults (not over the transactional id).
    fn producer_config(&self, transactional_id: Option<String>) -> ClientConfig {
        producer_client(&self.config, transactional_id.as_deref())
    }

    /// `init_transactions` of `producer` (made from `client`): fences the earlier
    /// producers of its transactional id and aborts their open transaction. A
    /// transaction timeout the brokers do not allow fails for good, with both values:
    /// no restart would change them.
    fn init_transactions(
        &self,
        producer: &Producer,
        client: &ClientConfig,
        what: &str,
    ) -> Result<(), CallError> {
        let Err(e) = producer.init_transactions(PRODUCE_TIMEOUT) else {
            return Ok(());
        };
        if e.rdkafka_error_code() != Some(RDKafkaErrorCode::InvalidTransactionTimeout) {
            let what = format!("{what}{}", reports(producer).note(&self.config.properties));
            return Err(self.err(&what, e));
        }
        const BROKERS: &str = "transaction.max.timeout.ms";
        let ours = client.get("transaction.timeout.ms").unwrap_or_default();
        let theirs = match broker_setting(client, BROKERS, PRODUCE_TIMEOUT) {
            Ok(ms) => format!("the brokers' `{BROKERS}`, {ms} ms"),
            Err(why) => format!("the brokers' `{BROKERS}` (which could not be read: {why})"),
        };
        Err(CallError::InvalidConfig(format!(
            "Kafka sink, topic {:?} at {}: its producers' `transaction.timeout.ms` is {ours} \
             ms, above {theirs}, so the brokers refuse every transaction; lower \
             `transaction.timeout.ms` in the sink's `properties` (it must stay well above \
             the time a checkpoint's records take to write), or raise `{BROKERS}` on the \
             brokers",
            self.config.topic, self.config.bootstrap
        )))
    }

    /// Waits until the brokers answer `producer` (up to [`PRODUCE_TIMEOUT`], or until the
    /// task is cancelled), and fails at once when they refuse it — a failed
    /// authentication or TLS handshake, which initialising transactions would retry
    /// until its timeout.
    fn reach_brokers(&self, producer: &Producer) -> Result<(), CallError> {
        let deadline = Instant::now() + PRODUCE_TIMEOUT;
        loop {
            if self.cancel.load(Ordering::Relaxed) {
                return Err(CallError::Trap {
                    kind: TrapKind::Cancelled,
                    message: format!(
                        "Kafka sink, topic {:?}: cancelled while reaching the brokers at {}",
                        self.config.topic, self.config.bootstrap
                    ),
                });
            }
            let tried = producer
                .client()
                .fetch_metadata(Some(&self.config.topic), REACH_TRY);
            let Err(e) = tried else { return Ok(()) };
            let errors = reports(producer);
            if errors.refused() || Instant::now() >= deadline {
                let what = format!(
                    "reaching the brokers{}",
                    errors.note(&self.config.properties)
                );
                return Err(self.err(&what, e));
            }
        }
    }

    /// A client of the marker group `group` (a transactional id).
    fn marker_consumer(&self, group: &str) -> Result<BaseConsumer, CallError> {
        let mut client = ClientConfig::new();
        // The sink's properties too: the marker group is reached with the same
        // credentials (SASL, TLS) as the topic.
        for (k, v) in &self.config.properties {
            client.set(k, v);
        }
        client
            .set("bootstrap.servers", &self.config.bootstrap)
            .set("group.id", group)
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
        let part = SinkState::decode(state)
            .map_err(|e| self.err(&format!("decoding the state of old subtask {old}"), e))?;
        // The old subtask's own transactional id writes its records: initialising it
        // fences the old subtask and any earlier adopter of it, whatever their ids.
        let id = transactional_id(&self.prefix_of(&part), old);
        let client = self.producer_config(Some(id.clone()));
        let producer: Producer = client
            .create_with_context(DeliveryReport::default())
            .map_err(|e| self.err(&format!("taking over old subtask {old}"), e))?;
        self.init_transactions(&producer, &client, &format!("fencing old subtask {old}"))?;
        let marker = self.marker_consumer(&id)?;
        let group = group_metadata(&self.config, &marker)?;
        let committed = self.committed_in(&marker, part.run)?;
        for (checkpoint, records) in part.pending {
            if committed.is_none_or(|done| checkpoint > done) {
                self.writer()?.write_transaction(
                    &producer,
                    &group,
                    part.run,
                    checkpoint,
                    &[&records],
                )?;
            }
        }
        Ok(())
    }

    /// Charges the records the subtask holds for checkpoints (written or pending) to its
    /// tenant, as keyed state is: they are host memory a tenant's job makes the host hold.
    /// The committer holds a copy of each until it is committed: twice as much.
    fn charge_pending(&mut self) -> Result<(), CallError> {
        let held = self.pending_bytes + self.interval.byte_len() as u64;
        let copies = if self.committer.is_some() { 2 } else { 1 };
        self.state
            .account
            .charge(Holding {
                state_bytes: held * copies,
                timers: 0,
            })
            .map_err(|e| {
                CallError::Limit(format!(
                    "Kafka sink, topic {:?}: the records waiting for checkpoints count as the \
                     tenant's state: {e}",
                    self.config.topic
                ))
            })
    }

    /// Writes the records of the restored checkpoints (all complete) in one transaction
    /// each, with the checkpoint's marker, before the committer starts.
    fn write_restored(&mut self) -> Result<(), CallError> {
        let pending = std::mem::take(&mut self.sink.pending);
        self.pending_bytes = 0;
        let (writer, producer) = (self.writer()?, self.producer()?);
        let group = group_metadata(&self.config, self.marker()?)?;
        for (checkpoint, records) in &pending {
            writer.write_transaction(producer, &group, self.sink.run, *checkpoint, &[records])?;
        }
        Ok(())
    }

    fn committer(&self) -> Result<&Committer, CallError> {
        self.committer
            .as_ref()
            .ok_or_else(|| CallError::Failed("Kafka sink used before open".into()))
    }

    /// Hands the records the interval holds past its first `before` bytes to the
    /// committer.
    fn send_since(&self, before: usize) -> Result<(), CallError> {
        let new = &self.interval.as_bytes()[before..];
        if new.is_empty() {
            return Ok(());
        }
        self.committer()?.records(new.to_vec())
    }

    /// While the records held pass `max_pending_mb` and the oldest held belong to a
    /// completed checkpoint, waits for the committer to write them: backpressure while
    /// Kafka is slower than the job.
    fn wait_while_over_limit(&mut self) -> Result<(), CallError> {
        loop {
            let held = self.pending_bytes + self.interval.byte_len() as u64;
            let oldest = self.sink.pending.first().map(|(c, _)| *c);
            let Some(oldest) = oldest.filter(|c| *c <= self.completed) else {
                return Ok(());
            };
            if held <= self.config.max_pending_bytes {
                return Ok(());
            }
            self.committer()?.wait_for(oldest)?;
            self.forget_committed()?;
        }
    }

    /// Forgets the records the committer has committed.
    fn forget_committed(&mut self) -> Result<(), CallError> {
        let Some(committer) = &self.committer else {
            return Ok(());
        };
        let Some(committed) = committer.committed()? else {
            return Ok(());
        };
        let done = self.sink.pending.partition_point(|(c, _)| *c <= committed);
        if done > 0 {
            let bytes: u64 = self.sink.pending[..done]
                .iter()
                .map(|(_, r)| r.len() as u64)
                .sum();
            self.sink.pending.drain(..done);
            self.pending_bytes = self.pending_bytes.saturating_sub(bytes);
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
}

/// The group metadata of the marker group `marker` is a client of.
fn group_metadata(
    config: &KafkaSinkConfig,
    marker: &BaseConsumer,
) -> Result<rdkafka::consumer::ConsumerGroupMetadata, CallError> {
    marker
        .group_metadata()
        .ok_or_else(|| writer::error(config, "marker group", "no group metadata"))
}

impl Operator for KafkaSink {
    fn identity(&self) -> &OperatorIdentity {
        &self.identity
    }

    fn state(&mut self) -> &mut OperatorState {
        &mut self.state
    }

    fn open(&mut self, info: &OpenInfo) -> Result<CallOutput, CallError> {
        crate::failpoint!("kafka-sink::open");
        if self.config.format.format != Format::Bytes {
            let encoder = Encoder::open(&self.config.format, &self.config.topic).map_err(|e| {
                self.err(
                    &format!("opening its `format = {:?}`", self.config.format.name()),
                    format!("{e:#}"),
                )
            })?;
            self.encoder = Some(encoder);
        }
        if let Some(key) = &self.config.format.key {
            let encoder = Encoder::open(key, &self.config.topic).map_err(|e| {
                self.err(
                    &format!("opening its `key_format = {:?}`", key.name()),
                    format!("{e:#}"),
                )
            })?;
            self.key_encoder = Some(encoder);
        }
        self.writer = Some(Arc::new(Writer::new(
            self.config.clone(),
            self.identity.operator.clone(),
            self.state.counters.clone(),
            self.cancel.clone(),
        )));
        let mut own = info.restored_state.clone();
        let mut adopted = Vec::new();
        for (old, bytes) in std::mem::take(&mut self.adopted) {
            if old == self.subtask {
                own = Some(bytes);
            } else {
                adopted.push((old, bytes));
            }
        }
        let restored = own
            .as_deref()
            .filter(|b| !b.is_empty())
            .map(SinkState::decode)
            .transpose()
            .map_err(|e| self.err("decoding the restored sink state", e))?;
        self.sink.prefix = Some(match &restored {
            Some(restored) => self.prefix_of(restored),
            None => self.config.transactional_id_prefix.clone(),
        });
        let exactly_once = self.config.delivery == Delivery::ExactlyOnce;
        let producer = match exactly_once
            .then(|| take_fenced(&self.transactional_id()))
            .flatten()
        {
            // Fenced with when its unit started: fencing again would fence whoever
            // fenced it since (the unit's newer owner) instead of being fenced.
            Some(producer) => Arc::new(producer),
            None => {
                let client = self.producer_config(exactly_once.then(|| self.transactional_id()));
                let producer: Producer = client
                    .create_with_context(DeliveryReport::default())
                    .map_err(|e| self.err("creating the producer", e))?;
                if exactly_once {
                    self.reach_brokers(&producer)?;
                    // Fences an earlier producer of this subtask and aborts its open
                    // transaction.
                    self.init_transactions(&producer, &client, "initialising transactions")?;
                }
                Arc::new(producer)
            }
        };
        if exactly_once {
            self.marker = Some(self.marker_consumer(&self.transactional_id())?);
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
        for (old, bytes) in adopted {
            self.write_adopted(old, &bytes)?;
        }
        if let Some(restored) = restored {
            self.sink.run = restored.run;
            let committed = self.committed_checkpoint()?;
            self.sink.pending = restored
                .pending
                .into_iter()
                .filter(|(c, _)| committed.is_none_or(|done| *c > done))
                .collect();
            self.pending_bytes = self.sink.pending.iter().map(|(_, r)| r.len() as u64).sum();
            self.charge_pending()?;
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
            self.write_restored()?;
        }
        if exactly_once {
            let group = group_metadata(&self.config, self.marker()?)?;
            let committer = Committer::start(
                self.writer.clone().expect("made above"),
                self.producer.clone().expect("made above"),
                group,
                self.sink.run,
            )
            .map_err(|e| self.err("starting the committer thread", e))?;
            self.committer = Some(committer);
        }
        Ok(CallOutput::default())
    }

    fn process(&mut self, records: &[u8]) -> Result<CallOutput, CallError> {
        let encoded;
        let records = if self.encoder.is_some() || self.key_encoder.is_some() {
            encoded = encode_batch(self.encoder.as_mut(), self.key_encoder.as_mut(), records)
                .map_err(|e| {
                    writer::error(
                        &self.config,
                        &format!("writing a record as {:?}", self.config.format.name()),
                        e,
                    )
                })?;
            &encoded[..]
        } else {
            records
        };
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
                let (writer, producer) = (self.writer()?, self.producer()?);
                let (mut count, mut bytes) = (0, 0);
                for record in sluice_codec::BatchReader::new(records) {
                    let record = record.map_err(|e| CallError::Contract(e.to_string()))?;
                    writer
                        .send(producer, &record)
                        .map_err(|e| writer.not_sent("sending a record", e))?;
                    count += 1;
                    bytes += record.value.len() + record.key.map_or(0, <[u8]>::len);
                }
                writer.count(count, bytes, 0, 0);
                producer.poll(Duration::ZERO);
                self.check_deliveries()?;
            }
            Delivery::ExactlyOnce => {
                let before = self.interval.byte_len();
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
                self.send_since(before)?;
                self.forget_committed()?;
                self.wait_while_over_limit()?;
                let held = self.pending_bytes + self.interval.byte_len() as u64;
                if held > self.config.max_pending_bytes {
                    return Err(CallError::Limit(format!(
                        "Kafka sink, topic {:?}: {held} bytes of records wait for checkpoints \
                         to complete, more than `max_pending_mb` allows; checkpoint more often \
                         or raise it",
                        self.config.topic
                    )));
                }
                self.charge_pending()?;
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
                producer::flush(self.producer()?, PRODUCE_TIMEOUT)
                    .map_err(|e| self.err("flushing before the checkpoint", e))?;
                self.check_deliveries()?;
                Ok(Vec::new())
            }
            Delivery::ExactlyOnce => {
                let before = self.interval.byte_len();
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
                self.send_since(before)?;
                let records = std::mem::take(&mut self.interval).into_bytes();
                // An interval without records needs no transaction, unless the marker
                // must name every checkpoint.
                if !records.is_empty() || self.config.marker_note.is_some() {
                    self.pending_bytes += records.len() as u64;
                    self.sink.pending.push((checkpoint_id, records));
                    self.committer()?.barrier(checkpoint_id)?;
                }
                self.forget_committed()?;
                postcard::to_allocvec(&self.sink).map_err(|e| CallError::Failed(e.to_string()))
            }
        }
    }

    fn notify_complete(&mut self, checkpoint_id: u64) -> Result<(), CallError> {
        if self.config.delivery == Delivery::ExactlyOnce {
            self.completed = self.completed.max(checkpoint_id);
            self.committer()?.complete(checkpoint_id)?;
            if self.config.marker_note.is_some()
                && self
                    .sink
                    .pending
                    .first()
                    .is_some_and(|(c, _)| *c <= checkpoint_id)
            {
                // A unit of a job over several hosts: its marker names where a new owner
                // restores, and the store keeps only the newest checkpoints, so the
                // marker moves to this one before anything goes on (its records were
                // sent ahead: what is left is the commit).
                self.committer()?.wait_for(checkpoint_id)?;
            }
            self.forget_committed()?;
            self.charge_pending()?;
        }
        Ok(())
    }

    fn notify_aborted(&mut self, checkpoint_id: u64) -> Result<(), CallError> {
        // The aborted checkpoint's records stay pending; the next completed checkpoint
        // writes them.
        if let Some(committer) = &self.committer {
            committer.aborted(checkpoint_id)?;
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<CallOutput, CallError> {
        // Exactly once, the tail goes out with the final checkpoint.
        if self.config.delivery == Delivery::AtLeastOnce {
            producer::flush(self.producer()?, PRODUCE_TIMEOUT)
                .map_err(|e| self.err("flushing the last records", e))?;
            self.check_deliveries()?;
        }
        Ok(CallOutput::default())
    }

    fn close(&mut self) -> Result<CallOutput, CallError> {
        // Exactly once, the transactions of the checkpoints completed (the final one
        // among them) commit before the sink closes.
        if let Some(committer) = self.committer.take() {
            let due = self
                .sink
                .pending
                .iter()
                .map(|(c, _)| *c)
                .take_while(|c| *c <= self.completed)
                .last();
            if let Some(due) = due {
                committer.wait_for(due)?;
            }
            committer.stop()?;
        }
        Ok(CallOutput::default())
    }

    fn dispose(&mut self) -> Result<(), CallError> {
        self.committer = None;
        self.producer = None;
        self.marker = None;
        Ok(())
    }
}

/// The batch `records` with each value encoded by `encoder`; the error names the record
/// that does not fit (its value's start) and why.
fn encode_batch(
    mut encoder: Option<&mut Encoder>,
    mut key_encoder: Option<&mut Encoder>,
    records: &[u8],
) -> Result<Vec<u8>, String> {
    let shown = |what: &str, bytes: &[u8], why: String| {
        format!(
            "the {what} {}: {why}",
            crate::connectors::formats::quoted(bytes)
        )
    };
    let mut out = BatchWriter::with_capacity(records.len());
    for record in sluice_codec::BatchReader::new(records) {
        let record = record.map_err(|e| e.to_string())?;
        let value = match encoder.as_deref_mut() {
            Some(encoder) => encoder
                .encode(record.value)
                .map_err(|why| shown("value", record.value, why))?,
            None => record.value,
        };
        let key = match (key_encoder.as_deref_mut(), record.key) {
            (Some(encoder), Some(key)) => {
                Some(encoder.encode(key).map_err(|why| shown("key", key, why))?)
            }
            (_, key) => key,
        };
        out.push_record(sluice_codec::RecordRef {
            key,
            value,
            ..record
        });
    }
    Ok(out.into_bytes())
}
