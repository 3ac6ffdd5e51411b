//! What a Kafka source does with a record its `format` (or `key_format`) cannot decode
//! (`on_bad_record`): fail, naming it; leave it out, counted; or write it to a dead-letter
//! topic (`{ dead_letter = "TOPIC" }`) as it was read — key, value, timestamp and headers
//! — with headers saying where it came from and why, as Kafka Connect's
//! `errors.deadletterqueue` does.
//!
//! At least once: what a poll sent is flushed before the poll returns, so a checkpoint
//! whose position is past a bad record finds it in the topic; after a restore the records
//! read again are sent again. A copy carries its topic, partition and offset in
//! `sluice.dead-letter.*` headers, which tell copies of the same record apart.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Result, anyhow, bail};
use rdkafka::ClientConfig;
use rdkafka::Message as _;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Header, Headers as _, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer as _};

use super::KafkaSourceConfig;
use super::producer::{self, DeliveryReport, Producer};
use super::sink::PRODUCE_TIMEOUT;
use crate::connectors::formats::OnBadRecord;

/// The headers a dead letter gets (Kafka Connect calls them `__connect.errors.*`).
pub const TOPIC_HEADER: &str = "sluice.dead-letter.topic";
pub const PARTITION_HEADER: &str = "sluice.dead-letter.partition";
pub const OFFSET_HEADER: &str = "sluice.dead-letter.offset";
pub const REASON_HEADER: &str = "sluice.dead-letter.reason";

/// Properties of a source's that a producer takes too: how to reach and sign in to the
/// cluster, not how to consume.
const CONNECTION_PROPERTIES: [&str; 9] = [
    "security.",
    "sasl.",
    "ssl.",
    "ssl_",
    "enable.ssl",
    "client.",
    "socket.",
    "broker.",
    "reconnect.",
];

/// What becomes of the records a source cannot decode.
pub(super) struct BadRecords {
    on_bad_record: OnBadRecord,
    /// The source's `format`, for the message of a failure.
    format: &'static str,
    dead_letters: Option<DeadLetters>,
    /// Records left out since the source started, and as many as were reported.
    count: u64,
    reported: u64,
}

impl BadRecords {
    pub(super) fn new(config: &KafkaSourceConfig) -> Result<BadRecords> {
        let on_bad_record = config.format.on_bad_record.clone();
        let dead_letters = match &on_bad_record {
            OnBadRecord::DeadLetter(topic) => Some(DeadLetters::new(
                &config.bootstrap,
                &config.properties,
                topic,
            )?),
            OnBadRecord::Fail | OnBadRecord::Skip => None,
        };
        Ok(BadRecords {
            on_bad_record,
            format: config.format.name(),
            dead_letters,
            count: 0,
            reported: 0,
        })
    }

    /// Takes `message`, which cannot be decoded for reason `why`: an error (the source
    /// fails), or it is left out, counted, and sent to the dead-letter topic if any.
    pub(super) fn take(&mut self, message: &BorrowedMessage<'_>, why: &str) -> Result<()> {
        let (topic, partition, offset) = (message.topic(), message.partition(), message.offset());
        let to = match &self.on_bad_record {
            OnBadRecord::Fail => bail!(
                "Kafka record {topic}/{partition} at offset {offset}: {why} (`format = {:?}`; \
                 `on_bad_record = \"skip\"` leaves such records out, counted)",
                self.format,
            ),
            OnBadRecord::DeadLetter(topic) => format!("to dead-letter topic {topic}"),
            OnBadRecord::Skip => "out".to_string(),
        };
        // The first bad records in the log, then every thousandth.
        if self.count < 10 || self.count.is_multiple_of(1000) {
            tracing::warn!(
                "Kafka source: record {topic}/{partition} at offset {offset} goes {to} ({} bad \
                 so far): {why}",
                self.count + 1
            );
        }
        if let Some(dead_letters) = &mut self.dead_letters {
            dead_letters.send(message, why)?;
        }
        self.count += 1;
        Ok(())
    }

    /// Waits until the dead letters sent are in their topic: before a poll returns, so
    /// that a checkpoint taken after it is past them.
    pub(super) fn flush(&mut self) -> Result<()> {
        match &mut self.dead_letters {
            Some(dead_letters) => dead_letters.flush(),
            None => Ok(()),
        }
    }

    /// Records left out since this was last asked.
    pub(super) fn unreported(&mut self) -> u64 {
        let new = self.count - self.reported;
        self.reported = self.count;
        new
    }
}

/// Where a source writes the records it cannot decode.
struct DeadLetters {
    topic: String,
    producer: Producer,
    /// The source's properties the producer took (to tell a SASL error's mechanism).
    properties: BTreeMap<String, String>,
    /// Records sent since the last flush.
    unflushed: usize,
}

impl DeadLetters {
    /// A producer to `topic` on the cluster at `bootstrap`, signed in as the source is.
    fn new(
        bootstrap: &str,
        properties: &BTreeMap<String, String>,
        topic: &str,
    ) -> Result<DeadLetters> {
        let properties: BTreeMap<String, String> = properties
            .iter()
            .filter(|(k, _)| CONNECTION_PROPERTIES.iter().any(|p| k.starts_with(p)))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut client = ClientConfig::new();
        client
            .set("bootstrap.servers", bootstrap)
            .set("enable.idempotence", "true");
        for (k, v) in &properties {
            client.set(k, v);
        }
        client.set_log_level(rdkafka::config::RDKafkaLogLevel::Warning);
        let producer = client
            .create_with_context(DeliveryReport::default())
            .map_err(|e| anyhow!("creating the producer of dead-letter topic {topic:?}: {e}"))?;
        Ok(DeadLetters {
            topic: topic.to_string(),
            producer,
            properties,
            unflushed: 0,
        })
    }

    /// Sends `message` (read, and not decoded, for reason `why`).
    fn send(&mut self, message: &BorrowedMessage<'_>, why: &str) -> Result<()> {
        let mut headers = OwnedHeaders::new();
        if let Some(original) = message.headers() {
            for h in original.iter() {
                headers = headers.insert(Header {
                    key: h.key,
                    value: h.value,
                });
            }
        }
        let partition = message.partition().to_string();
        let offset = message.offset().to_string();
        for (key, value) in [
            (TOPIC_HEADER, message.topic()),
            (PARTITION_HEADER, partition.as_str()),
            (OFFSET_HEADER, offset.as_str()),
            (REASON_HEADER, why),
        ] {
            headers = headers.insert(Header {
                key,
                value: Some(value),
            });
        }
        let mut record = BaseRecord::<[u8], [u8]>::to(&self.topic).headers(headers);
        if let Some(key) = message.key() {
            record = record.key(key);
        }
        if let Some(value) = message.payload() {
            record = record.payload(value);
        }
        if let Some(ts) = message.timestamp().to_millis() {
            record = record.timestamp(ts);
        }
        loop {
            match self.producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    self.producer.poll(Duration::from_millis(10));
                }
                Err((e, _)) => return Err(self.failed(&e.to_string())),
            }
        }
        self.unflushed += 1;
        Ok(())
    }

    /// Waits until everything sent is in the topic.
    fn flush(&mut self) -> Result<()> {
        if self.unflushed == 0 {
            return Ok(());
        }
        let flushed = producer::flush(&self.producer, PRODUCE_TIMEOUT);
        if let Some(failed) = self.producer.context().failed.lock().take() {
            return Err(self.failed(&failed));
        }
        flushed.map_err(|e| self.failed(&e.to_string()))?;
        self.unflushed = 0;
        Ok(())
    }

    fn failed(&self, why: &str) -> anyhow::Error {
        let note = producer::reports(&self.producer).note(&self.properties);
        anyhow!(
            "writing a bad record to dead-letter topic {:?}: {why}{note}",
            self.topic
        )
    }
}
