//! A sink's producers: their client configuration, the delivery reports they poll, and
//! producers that fenced every earlier producer of a transactional id ahead of the sink
//! that writes with them (a unit of a job over several hosts fences as it starts).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rdkafka::ClientConfig;
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::producer::{BaseProducer, Producer as _, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;

use super::KafkaSinkConfig;
use super::sink::{PRODUCE_TIMEOUT, TRANSACTION_TIMEOUT_MS};

/// The first delivery failure of a producer, reported by librdkafka on a poll, and
/// what else it reported that no request returned.
#[derive(Default)]
pub(super) struct DeliveryReport {
    pub(super) failed: Mutex<Option<String>>,
    pub(super) errors: super::client_errors::ClientErrors,
}

impl rdkafka::ClientContext for DeliveryReport {
    fn error(&self, error: KafkaError, reason: &str) {
        self.errors.record(&error, reason);
    }

    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, facility: &str, message: &str) {
        self.errors.log(level, facility, message);
    }
}

impl ProducerContext for DeliveryReport {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &rdkafka::message::DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = result {
            let mut failed = self.failed.lock();
            failed.get_or_insert_with(|| e.to_string());
        }
    }
}

pub(super) type Producer = BaseProducer<DeliveryReport>;

/// Waits until every record given to `producer` is delivered or failed, for up to
/// `timeout`.
///
/// `rdkafka`'s own `flush` checks, then sleeps in a poll of up to 100 ms that only an
/// event to serve cuts short; with reports of failed deliveries only, none comes, so each
/// flush — and each transaction's commit, which flushes first — took 100 ms more than its
/// work. This checks every millisecond.
pub(super) fn flush<C: ProducerContext>(
    producer: &BaseProducer<C>,
    timeout: Duration,
) -> KafkaResult<()> {
    let deadline = Instant::now() + timeout;
    loop {
        match producer.flush(Duration::ZERO) {
            Err(KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut))
                if Instant::now() < deadline =>
            {
                producer.poll(Duration::from_millis(1));
            }
            done => return done,
        }
    }
}

/// Commits `producer`'s open transaction, for up to `timeout`: [`flush`], then the commit
/// (whose own flush finds nothing left).
pub(super) fn commit_transaction<C: ProducerContext>(
    producer: &BaseProducer<C>,
    timeout: Duration,
) -> KafkaResult<()> {
    let started = Instant::now();
    flush(producer, timeout)?;
    producer.commit_transaction(timeout.saturating_sub(started.elapsed()))
}

/// What `producer` reported that no request returned, once the events it queued are
/// served (a poll serves one): for the error of a request that failed.
pub(super) fn reports(producer: &Producer) -> &super::client_errors::ClientErrors {
    for _ in 0..super::client_errors::EVENTS_SERVED {
        producer.poll(Duration::ZERO);
    }
    &producer.context().errors
}

/// The client configuration of the producer of a sink as `config` says (transactional,
/// as `transactional_id`, when given).
pub(super) fn producer_client(
    config: &KafkaSinkConfig,
    transactional_id: Option<&str>,
) -> ClientConfig {
    let mut client = ClientConfig::new();
    client
        .set("bootstrap.servers", &config.bootstrap)
        // Java clients' partitioner, so keys land where Kafka Streams or Flink put them.
        .set("partitioner", "murmur2_random")
        .set("enable.idempotence", "true")
        // The sink looks at failed deliveries only (`DeliveryReport`): without a report
        // per delivered record, librdkafka neither queues nor serves one (about a
        // quarter of an exchange's CPU, on the cluster word count).
        .set("delivery.report.only.error", "true");
    if transactional_id.is_some() {
        client.set("transaction.timeout.ms", TRANSACTION_TIMEOUT_MS);
        // Records become visible when their transaction commits, which flushes what
        // waits: lingering longer costs no latency and makes fewer, larger requests
        // (librdkafka's default is 5 ms; measured on the `kafka` bench's exactly-once
        // word count: 5–8% less time at 50 ms).
        client.set("linger.ms", "50");
    }
    for (k, v) in &config.properties {
        client.set(k, v);
    }
    if let Some(id) = transactional_id {
        client.set("transactional.id", id);
    }
    // Warnings too reach its context (a refused authentication, a failed handshake).
    client.set_log_level(rdkafka::config::RDKafkaLogLevel::Warning);
    client
}

/// Producers that fenced every earlier producer of their transactional id ahead of their
/// sink's open (see [`fence_ahead`]), by transactional id.
static FENCED: Mutex<BTreeMap<String, Producer>> = Mutex::new(BTreeMap::new());

/// The producer that fenced ahead for `transactional_id`, if one waits for its sink.
pub(super) fn take_fenced(transactional_id: &str) -> Option<Producer> {
    FENCED.lock().remove(transactional_id)
}

/// What [`fence_ahead`] returns: while it lives, the sink it fenced for takes its producer
/// when it opens; dropped before that, the producer goes too.
#[must_use = "the producer waits for its sink only while this lives"]
pub struct FencedAhead {
    transactional_id: String,
}

impl Drop for FencedAhead {
    fn drop(&mut self) {
        FENCED.lock().remove(&self.transactional_id);
    }
}

/// Fences every earlier producer of subtask `subtask` of the exactly-once sink `config`
/// describes (and aborts its open transaction), with the producer that subtask then
/// writes with when it opens in this process: it does not fence again when it opens, so
/// a producer that fenced it meanwhile (a unit's newer owner's) keeps it fenced, however
/// long this one was stopped between the two.
pub fn fence_ahead(config: &KafkaSinkConfig, subtask: u32) -> anyhow::Result<FencedAhead> {
    let transactional_id = format!("{}-{subtask}", config.transactional_id_prefix);
    let producer: Producer = producer_client(config, Some(&transactional_id))
        .create_with_context(DeliveryReport::default())
        .map_err(|e| anyhow::anyhow!("creating a producer ({transactional_id}): {e}"))?;
    producer.init_transactions(PRODUCE_TIMEOUT).map_err(|e| {
        anyhow::anyhow!(
            "fencing the earlier producers of {transactional_id}{}: {e}",
            reports(&producer).note(&config.properties)
        )
    })?;
    FENCED.lock().insert(transactional_id.clone(), producer);
    Ok(FencedAhead { transactional_id })
}
