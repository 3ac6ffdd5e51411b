//! The checks of a server job's Kafka use against its tenant's grant.

use crate::connectors::formats::{FormatConfig, OnBadRecord};
use std::collections::BTreeMap;

use super::{ApiError, ErrorKind};
use crate::connectors::kafka::Topics;
use crate::job::{JobGraph, SourceInput, Vertex};
use crate::tenant::TenantConfig;

/// Why a job that uses Kafka is refused to a tenant without a grant.
pub(super) fn no_kafka_grant(tenant: &TenantConfig, what: &str, name: &str) -> ApiError {
    let what = if name.is_empty() {
        what.to_string()
    } else {
        format!("{what} {name}")
    };
    ApiError::new(
        ErrorKind::Forbidden,
        format!(
            "job.toml: {what}: tenant '{}' has no Kafka grant ([tenant.{}.kafka] in the \
             host configuration)",
            tenant.name, tenant.name
        ),
    )
}

/// Client properties a server job may set itself: tuning only, each within bounds
/// (buffers multiply by its subtasks, and all share the server's memory). Anything that
/// reaches further — brokers, credentials, files on the server, plugins librdkafka would
/// load, commands it would run (`sasl.kerberos.kinit.cmd`) — is the grant's to set.
const JOB_PROPERTIES: &[(&str, u64, u64)] = &[
    ("fetch.min.bytes", 1, 16 << 20),
    ("fetch.max.bytes", 1, 64 << 20),
    ("fetch.wait.max.ms", 0, 60_000),
    ("fetch.queue.backoff.ms", 0, 60_000),
    ("fetch.error.backoff.ms", 0, 60_000),
    ("max.partition.fetch.bytes", 1, 16 << 20),
    ("queued.min.messages", 1, 1_000_000),
    ("queued.max.messages.kbytes", 1, 64 << 10),
    ("queue.buffering.max.messages", 1, 1_000_000),
    ("queue.buffering.max.kbytes", 1, 64 << 10),
    ("queue.buffering.max.ms", 0, 60_000),
    ("linger.ms", 0, 60_000),
    ("batch.num.messages", 1, 1_000_000),
    ("batch.size", 1, 16 << 20),
    ("message.max.bytes", 1000, 16 << 20),
    ("receive.message.max.bytes", 1000, 80 << 20),
    ("message.timeout.ms", 0, 3_600_000),
    ("transaction.timeout.ms", 1000, 900_000),
    ("session.timeout.ms", 1, 3_600_000),
    ("heartbeat.interval.ms", 1, 3_600_000),
    ("socket.timeout.ms", 10, 300_000),
    ("retry.backoff.ms", 1, 60_000),
    ("retries", 0, 1_000_000),
    ("statistics.interval.ms", 100, 86_400_000),
];

/// Compression a server job may choose (`compression.type` or `compression.codec`).
const COMPRESSIONS: &[&str] = &["none", "gzip", "snappy", "lz4", "zstd"];

/// Why a server job may not set client property `key` to `value`, if it may not.
fn job_property_refused(key: &str, value: &str) -> Option<String> {
    if key == "compression.type" || key == "compression.codec" {
        return (!COMPRESSIONS.contains(&value)).then(|| {
            format!(
                "property {key:?} must be one of {}",
                COMPRESSIONS.join(", ")
            )
        });
    }
    let Some((_, min, max)) = JOB_PROPERTIES.iter().find(|(k, _, _)| *k == key) else {
        let known: Vec<&str> = JOB_PROPERTIES.iter().map(|(k, _, _)| *k).collect();
        return Some(format!(
            "property {key:?} is not one a server job may set (only tuning: {}, \
             compression.type)",
            known.join(", ")
        ));
    };
    match value.trim().parse::<u64>() {
        Ok(n) if (*min..=*max).contains(&n) => None,
        _ => Some(format!(
            "property {key:?} = {value:?} must be a whole number from {min} to {max}"
        )),
    }
}

/// Keeps a server job's Kafka sources, sink and `[cluster]` within its tenant's grant:
/// brokers and topics it names must be granted (refused with the reason otherwise), a topic pattern
/// reads only granted topics, group and transactional ids begin with the grant's
/// `id_prefix` (put in front where they do not), and the grant's client properties go
/// over the job's own, which may only tune.
/// A job's schema registry (of its values or keys) must be the grant's; it is reached
/// with the grant's credentials.
fn within_registry_grant(
    what: &str,
    format: &mut FormatConfig,
    grant: &crate::tenant::KafkaGrant,
    forbidden: &dyn Fn(String) -> ApiError,
) -> Result<(), ApiError> {
    let registries = [
        format.registry.as_mut(),
        format.key.as_mut().and_then(|key| key.registry.as_mut()),
    ];
    for registry in registries.into_iter().flatten() {
        match &grant.schema_registry {
            Some(granted) if granted.url == registry.url => *registry = granted.clone(),
            Some(granted) => {
                return Err(forbidden(format!(
                    "{what}: schema registry {:?} is not the granted {:?}",
                    registry.url, granted.url
                )));
            }
            None => {
                return Err(forbidden(format!(
                    "{what}: schema registry {:?}: the grant names no schema registry",
                    registry.url
                )));
            }
        }
    }
    Ok(())
}

pub(super) fn within_kafka_grant(
    graph: &mut JobGraph,
    grant: &crate::tenant::KafkaGrant,
    tenant: &str,
) -> Result<(), ApiError> {
    let forbidden = |what: String| {
        ApiError::new(
            ErrorKind::Forbidden,
            format!("job.toml: {what}, outside tenant '{tenant}''s Kafka grant"),
        )
    };
    let check_common = |what: &str,
                        bootstrap: &str,
                        properties: &mut BTreeMap<String, String>|
     -> Result<(), ApiError> {
        for broker in bootstrap
            .split(',')
            .map(str::trim)
            .filter(|b| !b.is_empty())
        {
            if !grant.bootstrap.iter().any(|b| b == broker) {
                return Err(forbidden(format!(
                    "{what}: broker {broker:?} is not one of {:?}",
                    grant.bootstrap
                )));
            }
        }
        if let Some(why) = properties
            .iter()
            .find_map(|(k, v)| job_property_refused(k, v))
        {
            return Err(forbidden(format!("{what}: {why}")));
        }
        properties.extend(grant.properties.clone());
        Ok(())
    };
    let prefixed = |id: &mut String| {
        if !id.starts_with(&grant.id_prefix) {
            *id = format!("{}{id}", grant.id_prefix);
        }
    };
    for vertex in &mut graph.vertices {
        match vertex {
            Vertex::Source(source) => {
                let SourceInput::Kafka(config) = &mut source.input else {
                    continue;
                };
                let what = format!("source '{}'", source.name);
                check_common(&what, &config.bootstrap, &mut config.properties)?;
                if let Topics::Names(names) = &config.topics
                    && let Some(topic) = names.iter().find(|t| !grant.may_read(t))
                {
                    return Err(forbidden(format!(
                        "{what}: topic {topic:?} may not be read (readable: {:?})",
                        grant.read
                    )));
                }
                if grant.read.is_empty() {
                    return Err(forbidden(format!(
                        "{what}: the grant lets the tenant read no topic (its `read` is empty)"
                    )));
                }
                within_registry_grant(&what, &mut config.format, grant, &forbidden)?;
                if let OnBadRecord::DeadLetter(topic) = &config.format.on_bad_record
                    && !grant.may_write(topic)
                {
                    return Err(forbidden(format!(
                        "{what}: dead-letter topic {topic:?} may not be written (writable: \
                         {:?})",
                        grant.write
                    )));
                }
                config.allowed = Some(grant.read.clone());
                prefixed(&mut config.group);
            }
            Vertex::Sink(sink) => {
                let Some(config) = &mut sink.kafka else {
                    continue;
                };
                let what = format!("sink '{}'", sink.name);
                check_common(&what, &config.bootstrap, &mut config.properties)?;
                within_registry_grant(&what, &mut config.format, grant, &forbidden)?;
                // Its subjects are its topic's; those of files its schema imports (named by
                // their paths, anyone's) it only finds, registered already.
                config.format.register_imports = false;
                if let Some(key) = &mut config.format.key {
                    key.register_imports = false;
                }
                if !grant.may_write(&config.topic) {
                    return Err(forbidden(format!(
                        "{what}: topic {:?} may not be written (writable: {:?})",
                        config.topic, grant.write
                    )));
                }
                prefixed(&mut config.transactional_id_prefix);
                // A server job's ids stay under the grant's prefix, whatever its
                // checkpoints were written with (it restores only its own).
                config.default_prefix = false;
            }
            Vertex::Operator(_) => {}
        }
    }
    // A job over several servers meets at granted brokers, and its own clients (the
    // control group, exchange topics) get the grant's properties too.
    if let Some(spec) = &mut graph.cluster {
        let bootstrap = spec.bootstrap.clone().unwrap_or_default();
        let properties = spec.properties.get_or_insert_with(BTreeMap::new);
        check_common("[cluster]", &bootstrap, properties)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectors::formats::{Format, Part, RegistryConfig};

    fn registry(url: &str, auth: Option<(&str, &str)>) -> RegistryConfig {
        RegistryConfig {
            url: url.into(),
            basic_auth: auth.map(|(u, p)| (u.into(), p.into())),
        }
    }

    #[test]
    fn a_jobs_registry_is_the_grants_and_takes_its_credentials() {
        let grant = crate::tenant::KafkaGrant {
            bootstrap: vec!["b:9092".into()],
            read: vec![],
            write: vec![],
            id_prefix: "a.".into(),
            properties: BTreeMap::new(),
            checkpoints: None,
            cluster_partitions: 1,
            schema_registry: Some(registry("https://r", Some(("user", "secret")))),
        };
        let forbidden = |why: String| ApiError::new(ErrorKind::Forbidden, why);
        let with = |url: &str| FormatConfig {
            format: Format::Avro,
            registry: Some(registry(url, None)),
            key: Some(Box::new(FormatConfig {
                format: Format::Avro,
                part: Part::Key,
                registry: Some(registry(url, None)),
                ..FormatConfig::bytes()
            })),
            ..FormatConfig::bytes()
        };
        let mut format = with("https://r");
        within_registry_grant("source 's'", &mut format, &grant, &forbidden).unwrap();
        assert_eq!(format.registry, grant.schema_registry);
        assert_eq!(format.key.unwrap().registry, grant.schema_registry);
        let mut other = with("https://elsewhere");
        let e = within_registry_grant("source 's'", &mut other, &grant, &forbidden).unwrap_err();
        assert!(format!("{e:?}").contains("is not the granted"), "{e:?}");
    }
}
