//! A client of the test broker: topics, records in, committed records out.
//!
//! The broker is the real Apache Kafka that `scripts/test.sh` starts
//! (`scripts/kafka/broker.sh`); tests find it in `SLUICE_KAFKA`.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// The test broker's address, or `None` (after saying how to start one) when no broker
/// was started. Under `scripts/test.sh` (`SLUICE_KAFKA_REQUIRED=1`) a missing broker is
/// a failure, never a skip.
pub fn broker() -> Option<String> {
    match std::env::var("SLUICE_KAFKA") {
        Ok(b) if !b.is_empty() => Some(b),
        _ if std::env::var_os("SLUICE_KAFKA_REQUIRED").is_some() => {
            panic!("SLUICE_KAFKA_REQUIRED is set but SLUICE_KAFKA names no broker")
        }
        _ => {
            eprintln!(
                "skipped: no Kafka broker. Run the whole suite with scripts/test.sh, or start \
                 one with `eval \"$(scripts/kafka/broker.sh start)\"` and run again"
            );
            None
        }
    }
}

/// The test broker's secure listeners (`scripts/kafka/broker.sh` makes them): SASL_SSL
/// with PLAIN and SCRAM users, and SSL asking for a client certificate (mTLS).
pub struct SecureBroker {
    /// The SASL_SSL listener's address.
    pub sasl_ssl: String,
    /// The SSL (mTLS) listener's address.
    pub ssl: String,
    /// Its TLS files: `ca.pem` (which signed the broker's certificate), `client.pem` and
    /// `client.key` (signed by it), `other-ca.pem` (which signed neither).
    pub tls: PathBuf,
    /// A SASL user and its password.
    pub user: String,
    pub password: String,
}

/// The test broker's secure listeners, or `None` as [`broker`] says (required under
/// `scripts/test.sh`).
pub fn secure_broker() -> Option<SecureBroker> {
    broker()?;
    let var = |name: &str| {
        std::env::var(name).unwrap_or_else(|_| {
            panic!(
                "{name} is not set: start the broker with scripts/kafka/broker.sh (eval its output)"
            )
        })
    };
    Some(SecureBroker {
        sasl_ssl: var("SLUICE_KAFKA_SASL_SSL"),
        ssl: var("SLUICE_KAFKA_SSL"),
        tls: PathBuf::from(var("SLUICE_KAFKA_TLS")),
        user: var("SLUICE_KAFKA_USER"),
        password: var("SLUICE_KAFKA_PASSWORD"),
    })
}

/// A topic name no other test or earlier run uses.
pub fn unique_topic(name: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{name}-{}-{nanos}", std::process::id())
}

struct ThreadWaker(std::thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs a future of the admin client (driven by librdkafka's own thread) to its end.
fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        match future.as_mut().poll(&mut cx) {
            Poll::Ready(v) => return v,
            Poll::Pending => std::thread::park_timeout(Duration::from_millis(100)),
        }
    }
}

/// Creates `topic` with `partitions` partitions, without time retention: the tests'
/// records carry event times of 1970 as their Kafka timestamps, which the broker's
/// default `retention.ms` (7 days) takes for long expired, so a retention check (every 5
/// minutes) falling inside a test would delete its input, or the first committed
/// records of its output (alone in the first segment: the commit marker after them,
/// stamped with the broker's clock, rolls a new one).
pub fn create_topic(broker: &str, topic: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", broker)
        .create()
        .expect("an admin client");
    let results = block_on(admin.create_topics(
        &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1)).set("retention.ms", "-1")],
        &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
    ))
    .expect("creating a topic");
    for r in results {
        r.unwrap_or_else(|(t, e)| panic!("creating topic {t}: {e}"));
    }
}

/// Grows `topic` to `partitions` partitions.
pub fn add_partitions(broker: &str, topic: &str, partitions: usize) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", broker)
        .create()
        .expect("an admin client");
    let results = block_on(admin.create_partitions(
        &[NewPartitions::new(topic, partitions)],
        &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
    ))
    .expect("adding partitions");
    for r in results {
        r.unwrap_or_else(|(t, e)| panic!("adding partitions to {t}: {e}"));
    }
}

/// Writes `records` (key, value, timestamp) to `topic` and waits until all are stored.
pub fn produce(broker: &str, topic: &str, records: &[(Option<&str>, &str, Option<i64>)]) {
    produce_to(broker, topic, None, records)
}

/// [`produce`] into one `partition` (or as the partitioner decides).
pub fn produce_to(
    broker: &str,
    topic: &str,
    partition: Option<i32>,
    records: &[(Option<&str>, &str, Option<i64>)],
) {
    let records: Vec<_> = records
        .iter()
        .map(|&(k, v, t)| (k, v, t, &[][..]))
        .collect();
    produce_with_headers(broker, topic, partition, &records);
}

/// [`produce_to`] with each record's headers.
#[allow(clippy::type_complexity)]
pub fn produce_with_headers(
    broker: &str,
    topic: &str,
    partition: Option<i32>,
    records: &[(Option<&str>, &str, Option<i64>, &[(&str, &str)])],
) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", broker)
        .set("linger.ms", "5")
        .create()
        .expect("a producer");
    for (key, value, ts, headers) in records {
        let mut record = BaseRecord::<str, str>::to(topic).payload(*value);
        if !headers.is_empty() {
            let mut owned = rdkafka::message::OwnedHeaders::new();
            for (name, value) in *headers {
                owned = owned.insert(rdkafka::message::Header {
                    key: name,
                    value: Some(*value),
                });
            }
            record = record.headers(owned);
        }
        if let Some(k) = key {
            record = record.key(*k);
        }
        if let Some(ts) = ts {
            record = record.timestamp(*ts);
        }
        if let Some(p) = partition {
            record = record.partition(p);
        }
        send_waiting(&producer, record);
    }
    producer
        .flush(Duration::from_secs(60))
        .expect("flushing the producer");
}

/// A committed record read back: key and value as text.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Read {
    pub key: Option<String>,
    pub value: String,
    pub timestamp: Option<i64>,
    /// The partition it was read from.
    pub partition: i32,
    /// Its headers, as text.
    pub headers: Vec<(String, String)>,
    /// The value's bytes (`value` is them as text).
    pub raw_value: Vec<u8>,
    /// The key's bytes (`key` is them as text).
    pub raw_key: Option<Vec<u8>>,
}

/// A consumer's error that passes: the connection to the broker lost, or a request
/// that took too long, which librdkafka retries on its own.
fn is_transient(e: &rdkafka::error::KafkaError) -> bool {
    use rdkafka::error::KafkaError;
    use rdkafka::types::RDKafkaErrorCode as Code;
    matches!(
        e,
        KafkaError::MessageConsumption(
            Code::AllBrokersDown
                | Code::BrokerTransportFailure
                | Code::RequestTimedOut
                | Code::OperationTimedOut
        )
    )
}

/// Reads every committed record of `topic` (`read_committed`), from the beginning of
/// each partition up to its end when called: what a downstream consumer would see.
pub fn read_committed(broker: &str, topic: &str) -> Vec<Read> {
    read_committed_from(broker, topic, &BTreeMap::new())
}

/// [`read_committed`] from the offsets `from` gives (the beginning of a partition it
/// does not name): what was written since [`end_offsets`] gave them.
pub fn read_committed_from(broker: &str, topic: &str, from: &BTreeMap<i32, i64>) -> Vec<Read> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", broker)
        .set("group.id", unique_topic("reader"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()
        .expect("a consumer");
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(30))
        .expect("topic metadata");
    let partitions: Vec<i32> = metadata.topics()[0]
        .partitions()
        .iter()
        .map(|p| p.id())
        .collect();
    // Read committed, a partition ends at its last stable offset: the high watermark
    // once no transaction is open (the tests read after their jobs ended).
    let mut ends = BTreeMap::new();
    let mut tpl = TopicPartitionList::new();
    for &p in &partitions {
        let (_, high) = consumer
            .fetch_watermarks(topic, p, Duration::from_secs(30))
            .expect("watermarks");
        ends.insert(p, high);
        let start = from
            .get(&p)
            .map_or(Offset::Beginning, |&o| Offset::Offset(o));
        tpl.add_partition_offset(topic, p, start).unwrap();
    }
    consumer.assign(&tpl).expect("assigning");
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last_record = Instant::now();
    let mut since_check = 0;
    loop {
        // Positions are asked for now and then: each answer is a list built in C.
        if since_check == 0 || since_check >= 10_000 {
            since_check = 0;
            let position = consumer.position().expect("positions");
            let done = position.elements().iter().all(|e| match e.offset() {
                Offset::Offset(o) => o >= ends[&e.partition()],
                _ => ends[&e.partition()] <= from.get(&e.partition()).copied().unwrap_or(0),
            });
            // A transaction's commit marker takes the last offset and is never
            // delivered, so a partition may also end quiet.
            if done || Instant::now() > deadline || last_record.elapsed() > Duration::from_secs(5) {
                break;
            }
        }
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                last_record = Instant::now();
                since_check += 1;
                use rdkafka::message::Headers as _;
                let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
                out.push(Read {
                    key: m.key().map(text),
                    value: text(m.payload().unwrap_or_default()),
                    raw_value: m.payload().unwrap_or_default().to_vec(),
                    raw_key: m.key().map(<[u8]>::to_vec),
                    timestamp: m.timestamp().to_millis(),
                    partition: m.partition(),
                    headers: m
                        .headers()
                        .map(|h| {
                            h.iter()
                                .map(|h| (h.key.to_owned(), text(h.value.unwrap_or_default())))
                                .collect()
                        })
                        .unwrap_or_default(),
                });
            }
            // The broker out of reach for a moment (a loaded machine): librdkafka
            // reconnects and goes on from its position.
            Some(Err(e)) if is_transient(&e) => {}
            Some(Err(e)) => panic!("reading {topic}: {e}"),
            None => since_check = 0,
        }
    }
    out
}

/// The names of the topics on `broker` (read from the metadata of all, which makes none).
pub fn topics(broker: &str) -> BTreeSet<String> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", broker)
        .create()
        .expect("a consumer");
    let metadata = consumer
        .fetch_metadata(None, Duration::from_secs(30))
        .expect("metadata");
    metadata
        .topics()
        .iter()
        .map(|t| t.name().to_string())
        .collect()
}

/// Where each partition of `topic` ends now (its high watermark).
pub fn end_offsets(broker: &str, topic: &str) -> BTreeMap<i32, i64> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", broker)
        .create()
        .expect("a consumer");
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(30))
        .expect("topic metadata");
    metadata.topics()[0]
        .partitions()
        .iter()
        .map(|p| {
            let (_, high) = consumer
                .fetch_watermarks(topic, p.id(), Duration::from_secs(30))
                .expect("watermarks");
            (p.id(), high)
        })
        .collect()
}

/// Deletes the records of `partition` of `topic` before offset `before`, as retention
/// would: the partition then starts at `before`.
pub fn delete_records(broker: &str, topic: &str, partition: i32, before: i64) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", broker)
        .create()
        .expect("an admin client");
    let mut offsets = TopicPartitionList::new();
    offsets
        .add_partition_offset(topic, partition, Offset::Offset(before))
        .unwrap();
    let deleted = block_on(admin.delete_records(
        &offsets,
        &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
    ))
    .expect("deleting records");
    for e in deleted.elements() {
        if let Err(err) = e.error() {
            panic!("deleting records of {topic}/{partition} before {before}: {err}");
        }
    }
}

/// The offsets `group` committed for the partitions of `topic` (none where it
/// committed nothing).
pub fn committed_offsets(broker: &str, group: &str, topic: &str) -> BTreeMap<i32, i64> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", broker)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .expect("a consumer");
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(30))
        .expect("topic metadata");
    let mut tpl = TopicPartitionList::new();
    for p in metadata.topics()[0].partitions() {
        tpl.add_partition(topic, p.id());
    }
    consumer
        .committed_offsets(tpl, Duration::from_secs(30))
        .expect("committed offsets")
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(o) => Some((e.partition(), o)),
            _ => None,
        })
        .collect()
}

/// Waits until `topic`'s partitions end, as a `read_committed` consumer sees them, at
/// `records` records in all: what a bounded source takes as the end when it starts.
pub fn wait_for_end(broker: &str, topic: &str, records: i64) {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", broker)
        .set("group.id", unique_topic("ends"))
        .set("isolation.level", "read_committed")
        .create()
        .expect("a consumer");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let metadata = consumer
            .fetch_metadata(Some(topic), Duration::from_secs(30))
            .expect("topic metadata");
        let end: i64 = metadata.topics()[0]
            .partitions()
            .iter()
            .map(|p| {
                consumer
                    .fetch_watermarks(topic, p.id(), Duration::from_secs(30))
                    .map_or(0, |(_, high)| high)
            })
            .sum();
        if end >= records {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{topic} ends at {end} records, not {records}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A broker for a benchmark's run: the one in `SLUICE_KAFKA`, or one started here.
pub struct BenchBroker {
    /// Its address.
    pub address: String,
    /// Its secure listeners, when it has them.
    pub secure: Option<SecureBroker>,
    started: Option<PathBuf>,
}

impl BenchBroker {
    pub fn get() -> BenchBroker {
        if let Ok(address) = std::env::var("SLUICE_KAFKA") {
            let var = |name: &str| std::env::var(name).ok();
            return BenchBroker {
                address,
                secure: secure_from(&var),
                started: None,
            };
        }
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/kafka/broker.sh");
        let dir = crate::test_dir("bench-kafka-broker");
        let out = Command::new(&script)
            .arg("start")
            .arg(&dir)
            .output()
            .expect("running scripts/kafka/broker.sh");
        assert!(
            out.status.success(),
            "starting the broker: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let address = stdout
            .lines()
            .find_map(|l| l.strip_prefix("export SLUICE_KAFKA="))
            .expect("broker.sh prints export SLUICE_KAFKA=ADDRESS")
            .to_string();
        // (`export A=1 B=2` lines.)
        let exports: BTreeMap<String, String> = stdout
            .lines()
            .filter_map(|l| l.strip_prefix("export "))
            .flat_map(|l| l.split(' '))
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        BenchBroker {
            address,
            secure: secure_from(&|name: &str| exports.get(name).cloned()),
            started: Some(dir),
        }
    }
}

/// A broker's secure listeners from its variables (`broker.sh start`'s exports).
fn secure_from(var: &dyn Fn(&str) -> Option<String>) -> Option<SecureBroker> {
    Some(SecureBroker {
        sasl_ssl: var("SLUICE_KAFKA_SASL_SSL")?,
        ssl: var("SLUICE_KAFKA_SSL")?,
        tls: PathBuf::from(var("SLUICE_KAFKA_TLS")?),
        user: var("SLUICE_KAFKA_USER")?,
        password: var("SLUICE_KAFKA_PASSWORD")?,
    })
}

impl Drop for BenchBroker {
    fn drop(&mut self) {
        if let Some(dir) = &self.started {
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/kafka/broker.sh");
            let _ = Command::new(script).arg("stop").arg(dir).status();
        }
    }
}

/// Sends `record`, waiting while the producer's queue is full.
fn send_waiting<K: rdkafka::message::ToBytes + ?Sized, V: rdkafka::message::ToBytes + ?Sized>(
    producer: &BaseProducer,
    record: BaseRecord<'_, K, V>,
) {
    let mut record = Some(record);
    while let Some(r) = record.take() {
        if let Err((e, r)) = producer.send(r) {
            assert!(
                matches!(
                    e,
                    rdkafka::error::KafkaError::MessageProduction(
                        rdkafka::types::RDKafkaErrorCode::QueueFull
                    )
                ),
                "producing: {e}"
            );
            producer.poll(Duration::from_millis(10));
            record = Some(r);
        }
    }
}

/// Produces records with these values (bytes, without key) into partition 0 of `topic`.
pub fn produce_values(broker: &str, topic: &str, values: &[Vec<u8>]) {
    let records: Vec<(Option<Vec<u8>>, Vec<u8>)> =
        values.iter().map(|v| (None, v.clone())).collect();
    produce_keyed_values(broker, topic, &records);
}

/// Produces records with these keys and values (bytes) into partition 0 of `topic`.
pub fn produce_keyed_values(broker: &str, topic: &str, records: &[(Option<Vec<u8>>, Vec<u8>)]) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", broker)
        .create()
        .expect("a producer");
    for (key, value) in records {
        let mut record = BaseRecord::<[u8], [u8]>::to(topic)
            .payload(value)
            .partition(0);
        if let Some(key) = key {
            record = record.key(key);
        }
        send_waiting(&producer, record);
    }
    producer
        .flush(Duration::from_secs(60))
        .expect("flushing the producer");
}

/// The values of [`read_committed`], as bytes.
pub fn read_committed_values(broker: &str, topic: &str) -> Vec<Vec<u8>> {
    read_committed(broker, topic)
        .into_iter()
        .map(|r| r.raw_value)
        .collect()
}

/// The schema registry `scripts/test.sh` starts (`SLUICE_SCHEMA_REGISTRY`, the base of
/// its Confluent API), or `None` (the test skips) unless `SLUICE_KAFKA_REQUIRED` is set.
pub fn schema_registry() -> Option<String> {
    match std::env::var("SLUICE_SCHEMA_REGISTRY") {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var_os("SLUICE_KAFKA_REQUIRED").is_some() => {
            panic!("SLUICE_KAFKA_REQUIRED is set but SLUICE_SCHEMA_REGISTRY names no registry")
        }
        _ => {
            eprintln!(
                "skipped: no schema registry. Start one with \
                 `eval \"$(scripts/registry/registry.sh start)\"`"
            );
            None
        }
    }
}

/// The schema registry of a benchmark: the one `SLUICE_SCHEMA_REGISTRY` names, or one
/// started with `scripts/registry/registry.sh` (and stopped when dropped).
pub struct BenchRegistry {
    /// The base of its Confluent API.
    pub url: String,
    started: Option<PathBuf>,
}

impl BenchRegistry {
    pub fn get() -> BenchRegistry {
        if let Ok(url) = std::env::var("SLUICE_SCHEMA_REGISTRY") {
            return BenchRegistry { url, started: None };
        }
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/registry/registry.sh");
        let dir = crate::test_dir("bench-registry");
        let out = Command::new(&script)
            .arg("start")
            .arg(&dir)
            .output()
            .expect("running scripts/registry/registry.sh");
        assert!(
            out.status.success(),
            "starting the registry: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let url = String::from_utf8_lossy(&out.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("export SLUICE_SCHEMA_REGISTRY="))
            .expect("registry.sh prints export SLUICE_SCHEMA_REGISTRY=URL")
            .to_string();
        BenchRegistry {
            url,
            started: Some(dir),
        }
    }
}

impl Drop for BenchRegistry {
    fn drop(&mut self) {
        if let Some(dir) = &self.started {
            let script =
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/registry/registry.sh");
            let _ = Command::new(script).arg("stop").arg(dir).status();
        }
    }
}
