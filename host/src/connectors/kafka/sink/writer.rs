//! How a Kafka sink's records reach Kafka: one record sent, a checkpoint's transaction
//! begun, filled, marked and committed (or aborted), and the sink's counters and failed
//! deliveries — shared by the sink's task thread and its committer thread.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use rdkafka::consumer::ConsumerGroupMetadata;
use rdkafka::error::KafkaError;
use rdkafka::producer::Producer as _;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

use sluice_codec::BatchWriter;

use super::super::exchange::{EXCHANGE_BATCH, EXCHANGE_BATCH_BYTES, EXCHANGE_WATERMARK};
use super::super::marker::marker_metadata;
use super::super::producer::{self, Producer};
use super::{KafkaSinkConfig, PRODUCE_TIMEOUT};
use crate::chain::{CallError, TrapKind};

/// Whether `record` is an exchange topic's watermark record.
fn is_watermark(record: &sluice_codec::RecordRef<'_>) -> bool {
    record.headers.is_some_and(|h| {
        h.iter()
            .any(|(name, _)| name == EXCHANGE_WATERMARK.as_bytes())
    })
}

/// Why a record was not handed to the producer.
pub(super) enum NotSent {
    /// The task was cancelled while the producer's queue was full.
    Cancelled,
    /// librdkafka refused it, or the sink's settings do not allow it.
    Refused(String),
}

/// What a sink subtask writes with: its settings, its counters and its task's
/// cancellation flag.
pub(super) struct Writer {
    pub(super) config: KafkaSinkConfig,
    /// The operator's name, for the log.
    operator: String,
    counters: Arc<Mutex<BTreeMap<String, u64>>>,
    /// Set when the sink's task is cancelled: a wait for room in the producer's queue
    /// (which lasts until records time out, `message.timeout.ms`, when the brokers do
    /// not answer) ends at once.
    cancel: Arc<AtomicBool>,
}

impl Writer {
    pub(super) fn new(
        config: KafkaSinkConfig,
        operator: String,
        counters: Arc<Mutex<BTreeMap<String, u64>>>,
        cancel: Arc<AtomicBool>,
    ) -> Writer {
        Writer {
            config,
            operator,
            counters,
            cancel,
        }
    }

    pub(super) fn cancelled(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }

    pub(super) fn err(&self, what: &str, e: impl std::fmt::Display) -> CallError {
        error(&self.config, what, e)
    }

    /// A record [`Writer::send`] did not send, as the call's error.
    pub(super) fn not_sent(&self, what: &str, e: NotSent) -> CallError {
        match e {
            NotSent::Refused(e) => self.err(what, e),
            NotSent::Cancelled => CallError::Trap {
                kind: TrapKind::Cancelled,
                message: format!(
                    "Kafka sink, topic {:?}: {what}: cancelled while waiting for room in \
                     the producer's queue",
                    self.config.topic
                ),
            },
        }
    }

    /// Sends one record (key, value, timestamp and headers), waiting while librdkafka's
    /// queue is full, unless the task is cancelled.
    pub(super) fn send(
        &self,
        producer: &Producer,
        record: &sluice_codec::RecordRef<'_>,
    ) -> Result<(), NotSent> {
        let config = &self.config;
        let by_record = config.by_record_partition || config.exchange.is_some();
        let partition = match (by_record, record.partition) {
            (false, _) => None,
            (true, Some(p)) => Some(i32::try_from(p).unwrap_or(i32::MAX)),
            (true, None) => {
                return Err(NotSent::Refused(
                    "a record without a source partition: this sink writes each record to \
                     the partition it was read from (`partitioner = \"record\"`), so its \
                     records must come from a Kafka source"
                        .to_owned(),
                ));
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
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    if self.cancelled() {
                        return Err(NotSent::Cancelled);
                    }
                    producer.poll(Duration::from_millis(10));
                }
                Err((e, _)) => {
                    return Err(NotSent::Refused(match partition {
                        Some(p) => format!("to partition {p}: {e}"),
                        None => e.to_string(),
                    }));
                }
            }
        }
    }

    /// Adds to the sink's counters (shown with the job's operators): records and their
    /// key and value bytes written, transactions committed and aborted.
    pub(super) fn count(&self, records: usize, bytes: usize, committed: u64, aborted: u64) {
        let mut counters = self.counters.lock();
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

    /// The first failed delivery `producer` reported, as an error.
    pub(super) fn check_deliveries(&self, producer: &Producer) -> Result<(), CallError> {
        let failed = producer.context().failed.lock().clone();
        match failed {
            Some(e) => {
                let what = format!(
                    "a record was not delivered{}",
                    producer.context().errors.note(&self.config.properties)
                );
                Err(self.err(&what, e))
            }
            None => Ok(()),
        }
    }

    /// Begins the transaction of checkpoint `checkpoint`.
    pub(super) fn begin(&self, producer: &Producer, checkpoint: u64) -> Result<(), CallError> {
        producer.begin_transaction().map_err(|e| {
            self.err(
                &format!("checkpoint {checkpoint}: beginning the transaction"),
                e,
            )
        })
    }

    /// Sends the records of the batch `records` (of checkpoint `checkpoint`) in the
    /// open transaction; returns how many records and key and value bytes.
    pub(super) fn send_batch(
        &self,
        producer: &Producer,
        checkpoint: u64,
        records: &[u8],
    ) -> Result<(usize, usize), CallError> {
        let sending = |e| self.not_sent(&format!("checkpoint {checkpoint}: sending a record"), e);
        let (mut count, mut bytes) = (0, 0);
        // An exchange topic's data records go in batches, one per partition (see
        // `EXCHANGE_BATCH`); a watermark record after what its partition was given.
        let mut batches: Vec<BatchWriter> = match &self.config.exchange {
            Some(exchange) => (0..exchange.partitions)
                .map(|_| BatchWriter::new())
                .collect(),
            None => Vec::new(),
        };
        for record in sluice_codec::BatchReader::new(records) {
            let record = record.map_err(|e| self.err("reading pending records", e))?;
            let watermark = !batches.is_empty() && is_watermark(&record);
            if !watermark {
                count += 1;
                bytes += record.value.len() + record.key.map_or(0, <[u8]>::len);
            }
            let partition = record.partition.filter(|p| (*p as usize) < batches.len());
            match partition {
                Some(p) if !watermark => {
                    let batch = &mut batches[p as usize];
                    batch.push_record(sluice_codec::RecordRef {
                        partition: None,
                        ..record
                    });
                    if batch.byte_len() >= EXCHANGE_BATCH_BYTES {
                        self.send_exchange_batch(producer, p, batch)
                            .map_err(sending)?;
                    }
                }
                _ => {
                    // A watermark record follows what its partition was given.
                    if let Some(p) = partition {
                        self.send_exchange_batch(producer, p, &mut batches[p as usize])
                            .map_err(sending)?;
                    }
                    self.send(producer, &record).map_err(sending)?;
                }
            }
        }
        for (p, batch) in batches.iter_mut().enumerate() {
            self.send_exchange_batch(producer, p as u32, batch)
                .map_err(sending)?;
        }
        Ok((count, bytes))
    }

    /// Sends what `batch` holds to exchange partition `partition` as one record, and
    /// empties it.
    fn send_exchange_batch(
        &self,
        producer: &Producer,
        partition: u32,
        batch: &mut BatchWriter,
    ) -> Result<(), NotSent> {
        if batch.is_empty() {
            return Ok(());
        }
        let headers = sluice_codec::encode_headers([(EXCHANGE_BATCH.as_bytes(), &b"1"[..])]);
        let value = std::mem::take(batch).into_bytes();
        self.send(
            producer,
            &sluice_codec::RecordRef {
                key: None,
                value: &value,
                timestamp: None,
                headers: Some(
                    sluice_codec::Headers::decode(&headers)
                        .map_err(|e| NotSent::Refused(e.to_string()))?,
                ),
                partition: Some(partition),
                output: 0,
            },
        )
    }

    /// Marks checkpoint `checkpoint` (of run `run`) in the marker group `group` within
    /// the open transaction and commits it.
    pub(super) fn commit(
        &self,
        producer: &Producer,
        group: &ConsumerGroupMetadata,
        run: u64,
        checkpoint: u64,
    ) -> Result<(), CallError> {
        let step = |what: &str, r: Result<(), KafkaError>| {
            r.map_err(|e| self.err(&format!("checkpoint {checkpoint}: {what}"), e))
        };
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
            producer.send_offsets_to_transaction(&marker, group, PRODUCE_TIMEOUT),
        )?;
        crate::failpoint!("kafka-sink::before-commit");
        step(
            "committing the transaction",
            producer::commit_transaction(producer, PRODUCE_TIMEOUT),
        )?;
        crate::failpoint!("kafka-sink::after-commit");
        Ok(())
    }

    /// Aborts the open transaction (of checkpoint `checkpoint`), so that it stops holding
    /// back `read_committed` consumers of its partitions (until the restarted subtask's
    /// `init_transactions` would, or for good if the job does not restart); the records
    /// stay in the checkpoints' state, to be written again. A failure is logged.
    pub(super) fn abort(&self, producer: &Producer, checkpoint: u64) {
        // (librdkafka aborts only once the records sent are reported on, which a
        // `BaseProducer` must poll for: `flush` does.)
        let _ = producer::flush(producer, PRODUCE_TIMEOUT);
        match producer.abort_transaction(PRODUCE_TIMEOUT) {
            Ok(()) => {
                tracing::info!(
                    "{}: checkpoint {checkpoint}: transaction aborted",
                    self.operator
                );
                self.count(0, 0, 0, 1);
            }
            Err(abort) => {
                tracing::warn!(
                    "{}: checkpoint {checkpoint}: aborting the transaction: {abort}",
                    self.operator
                );
            }
        }
    }

    /// Writes the batches `records` of checkpoint `checkpoint` in one transaction that
    /// also marks the checkpoint (of run `run`) in the marker group `group`; aborts the
    /// transaction when a step fails.
    pub(super) fn write_transaction(
        &self,
        producer: &Producer,
        group: &ConsumerGroupMetadata,
        run: u64,
        checkpoint: u64,
        records: &[&[u8]],
    ) -> Result<(), CallError> {
        self.begin(producer, checkpoint)?;
        let written = records
            .iter()
            .try_fold((0, 0), |(count, bytes), batch| {
                let (c, b) = self.send_batch(producer, checkpoint, batch)?;
                Ok((count + c, bytes + b))
            })
            .and_then(|sent| {
                self.commit(producer, group, run, checkpoint)?;
                Ok(sent)
            });
        match written {
            Ok((count, bytes)) => {
                self.count(count, bytes, 1, 0);
                self.check_deliveries(producer)
            }
            Err(e) => {
                self.abort(producer, checkpoint);
                Err(e)
            }
        }
    }
}

/// An error of the sink `config` describes, naming its topic and brokers.
pub(super) fn error(config: &KafkaSinkConfig, what: &str, e: impl std::fmt::Display) -> CallError {
    CallError::Failed(format!(
        "Kafka sink, topic {:?} at {}: {what}: {e}",
        config.topic, config.bootstrap
    ))
}
