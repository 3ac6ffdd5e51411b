//! What a job over several hosts leaves outside any host — its control and exchange
//! topics (kept with unlimited retention while the job may resume) and its units'
//! checkpoints in the store — and deleting it once the job ended on every host
//! (`sluice cluster gc JOB`, and `sluice delete` of a server's cluster job).
//!
//! Both go together: an exchange topic made again from nothing under offsets a unit's
//! checkpoint still names would skip records, so the checkpoints go with the topics. The
//! job's name is spent then: the sink topic's committed markers still name checkpoints
//! that are gone, so a job run again under the same name stops with an error saying so
//! (give it a new name, or reset its units with `sluice reset-unit`).

use std::path::Path;

use anyhow::{Context, Result, bail};
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::types::RDKafkaErrorCode;
use serde::{Deserialize, Serialize};

use super::store::CheckpointStore;
use super::{ClusterSettings, Plan};
use super::{REQUEST_TIMEOUT, block_on};

/// The topics, group and store folder of one job over several hosts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterResources {
    /// The hosts' consumer group (on the control topic).
    pub group: String,
    /// The control topic and the exchange topics, each with its partitions.
    pub topics: Vec<(String, u32)>,
    /// The checkpoint store: a URL, or an absolute directory.
    pub store: String,
    /// The job's folder in the store.
    pub store_key: String,
}

impl ClusterResources {
    /// What `plan` makes, with its store as `settings` name it (a directory resolved
    /// against `base`, the job file's folder).
    pub fn of(plan: &Plan, settings: &ClusterSettings, base: &Path) -> Self {
        let mut topics = vec![(plan.control_topic.clone(), plan.units())];
        topics.extend(plan.exchange_topics());
        let store = if settings.checkpoints.contains("://") {
            settings.checkpoints.clone()
        } else {
            base.join(&settings.checkpoints)
                .to_string_lossy()
                .into_owned()
        };
        ClusterResources {
            group: plan.group.clone(),
            topics,
            store,
            store_key: plan.prefix.clone(),
        }
    }

    /// Partitions of its topics, all together.
    pub fn partitions(&self) -> u64 {
        self.topics.iter().map(|(_, p)| u64::from(*p)).sum()
    }
}

/// [`delete`] refused: hosts are still in the job's group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StillRunning {
    /// The group.
    pub group: String,
    /// Its members, as `CLIENT-ID (HOST)`.
    pub members: Vec<String>,
}

impl std::fmt::Display for StillRunning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the job still runs on {} host(s) of its group {:?}: {}; stop it there first \
             (nothing was deleted)",
            self.members.len(),
            self.group,
            self.members.join(", ")
        )
    }
}

impl std::error::Error for StillRunning {}

/// What [`delete`] deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deleted {
    /// Topics deleted (those already gone are left out).
    pub topics: Vec<String>,
    /// The store folder emptied (`STORE/KEY`).
    pub checkpoints: String,
}

/// Deletes `resources` through a client of `client`'s brokers, if no host is in the
/// job's group; refuses (deleting nothing) while one is, naming them.
pub fn delete(resources: &ClusterResources, client: &ClientConfig) -> Result<Deleted> {
    let consumer: BaseConsumer = client.create().context("creating a Kafka client")?;
    let groups = consumer
        .fetch_group_list(Some(&resources.group), REQUEST_TIMEOUT)
        .with_context(|| format!("reading group {:?}", resources.group))?;
    let members: Vec<String> = groups
        .groups()
        .iter()
        .flat_map(|g| g.members())
        .map(|m| format!("{} ({})", m.client_id(), m.client_host()))
        .collect();
    if !members.is_empty() {
        return Err(StillRunning {
            group: resources.group.clone(),
            members,
        }
        .into());
    }
    let admin: AdminClient<DefaultClientContext> =
        client.create().context("creating a Kafka admin client")?;
    let names: Vec<&str> = resources.topics.iter().map(|(t, _)| t.as_str()).collect();
    let options = AdminOptions::new().operation_timeout(Some(REQUEST_TIMEOUT));
    let results = block_on(admin.delete_topics(&names, &options)).context("deleting topics")?;
    let mut deleted = Vec::new();
    for result in results {
        match result {
            Ok(topic) => deleted.push(topic),
            Err((_, RDKafkaErrorCode::UnknownTopicOrPartition)) => {}
            Err((topic, code)) => bail!("deleting topic {topic:?}: {code}"),
        }
    }
    let store = CheckpointStore::open(&resources.store, Path::new("/"))?;
    store.delete_folder(&resources.store_key)?;
    Ok(Deleted {
        topics: deleted,
        checkpoints: store.describe(&resources.store_key),
    })
}
