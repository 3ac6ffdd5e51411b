//! A Kafka source's dead-letter topic (`on_bad_record = { dead_letter = "TOPIC" }`): a
//! record its `format` cannot decode is written there as it was read — key, value,
//! timestamp and headers — with headers saying where it came from and why, as Kafka
//! Connect's `errors.deadletterqueue` does.
//!
//! At least once: what a poll sent is flushed before the poll returns, so a checkpoint
//! whose position is past a bad record finds it in the topic; after a restore the records
//! read again are sent again. A copy carries its topic, partition and offset in
//! `sluice.dead-letter.*` headers, which tell copies of the same record apart.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Result, anyhow};
use rdkafka::ClientConfig;
use rdkafka::Message as _;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Header, Headers as _, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer as _};

use super::producer::{DeliveryReport, Producer};
use super::sink::PRODUCE_TIMEOUT;

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

/// Where a source writes the records it cannot decode.
pub(super) struct DeadLetters {
    topic: String,
    producer: Producer,
    /// The source's properties the producer took (to tell a SASL error's mechanism).
    properties: BTreeMap<String, String>,
    /// Records sent since the last flush.
    unflushed: usize,
}

impl DeadLetters {
    /// A producer to `topic` on the cluster at `bootstrap`, signed in as the source is.
    pub(super) fn new(
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
    pub(super) fn send(&mut self, message: &BorrowedMessage<'_>, why: &str) -> Result<()> {
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
    pub(super) fn flush(&mut self) -> Result<()> {
        if self.unflushed == 0 {
            return Ok(());
        }
        let flushed = self.producer.flush(PRODUCE_TIMEOUT);
        if let Some(failed) = self.producer.context().failed.lock().take() {
            return Err(self.failed(&failed));
        }
        flushed.map_err(|e| self.failed(&e.to_string()))?;
        self.unflushed = 0;
        Ok(())
    }

    fn failed(&self, why: &str) -> anyhow::Error {
        let note = super::producer::reports(&self.producer).note(&self.properties);
        anyhow!(
            "writing a bad record to dead-letter topic {:?}: {why}{note}",
            self.topic
        )
    }
}
