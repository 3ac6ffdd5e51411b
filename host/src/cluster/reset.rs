//! Resetting a unit by hand (`sluice reset-unit`) when the checkpoint its marker names is
//! lost: the marker goes back to an older checkpoint of the same attempt, or away, so
//! that the unit starts over. Either way the unit writes again what it committed since;
//! that is the price of going on, and the command says so.

use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseProducer, Producer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

use super::store::{CheckpointStore, finished_key, unit_key};
use super::{ClusterSettings, Plan};
use crate::connectors::kafka::{parse_marker_metadata, read_marker};
use crate::job::JobGraph;

/// How long fencing, reading or moving a marker may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Where a reset unit goes on from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResetTo {
    /// Checkpoint `id` of attempt `attempt`, older than the one the unit's marker names
    /// and of the same attempt: the only checkpoints whose output the unit's committed
    /// transactions went past (a newer one, or one of another attempt, was never
    /// committed: restoring it would lose its interval's output).
    Checkpoint {
        /// The attempt.
        attempt: String,
        /// The checkpoint.
        id: u64,
    },
    /// No checkpoint: the unit starts over, as when the job first ran.
    Fresh,
}

impl std::str::FromStr for ResetTo {
    type Err = String;

    /// `ATTEMPT/ID`, as the error that names a lost checkpoint writes it.
    fn from_str(s: &str) -> Result<Self, String> {
        let (attempt, id) = s
            .split_once('/')
            .ok_or_else(|| format!("{s:?} is not ATTEMPT/ID"))?;
        let id = id
            .parse()
            .map_err(|_| format!("{s:?}: {id:?} is not a checkpoint id"))?;
        if attempt.is_empty() || !attempt.chars().all(|c| c.is_ascii_alphanumeric()) {
            return Err(format!("{s:?}: {attempt:?} is not an attempt"));
        }
        Ok(ResetTo::Checkpoint {
            attempt: attempt.to_string(),
            id,
        })
    }
}

/// Moves the marker of unit `unit` of the job `graph` runs over several hosts as `to`
/// says, after fencing whoever runs it (which then starts again from the marker left
/// here); returns what was done, for people.
pub fn reset_unit(
    graph: &JobGraph,
    settings: ClusterSettings,
    unit: u32,
    to: &ResetTo,
) -> Result<String> {
    let plan = Plan::new(graph, &settings)?;
    if unit >= plan.units() {
        bail!(
            "job '{}' has {} units (0 to {}): there is no unit {unit}",
            graph.name,
            plan.units(),
            plan.units().saturating_sub(1)
        );
    }
    let store = CheckpointStore::open(&settings.checkpoints, &graph.base_dir)?;
    let group = format!("{}-0", plan.transactional_prefix(unit));
    let topic = plan.output_topic(unit);
    let client = plan.sink_client(unit, &settings);
    // Fenced first: no owner commits while the marker moves.
    let producer: BaseProducer = client
        .clone()
        .set("transactional.id", &group)
        .set("transaction.timeout.ms", "60000")
        .create()
        .context("creating a producer to fence the unit's owner")?;
    producer
        .init_transactions(REQUEST_TIMEOUT)
        .with_context(|| format!("fencing the unit's owner ({group})"))?;
    let consumer: BaseConsumer = client
        .clone()
        .set("group.id", &group)
        .set("enable.auto.commit", "false")
        .create()
        .context("creating a client of the unit's marker group")?;
    let marker = read_marker(&consumer, &topic, REQUEST_TIMEOUT)
        .with_context(|| format!("reading the unit's marker ({group})"))?;
    let what = plan.describe(unit);
    let done = match to {
        ResetTo::Checkpoint { attempt, id } => {
            let Some((marked, metadata)) = marker else {
                bail!(
                    "unit {unit} ({what}) has no marker: it starts over anyway, and has no \
                     checkpoint to go on from"
                );
            };
            let named = parse_marker_metadata(&metadata)
                .and_then(|(_, note)| note?.strip_prefix("attempt="))
                .ok_or_else(|| {
                    anyhow!("the marker of group {group} ({metadata:?}) names no attempt")
                })?;
            if named != attempt || *id >= marked {
                let key = format!("{}/{named}", unit_key(&plan.prefix, unit));
                let older: Vec<String> = store
                    .complete_checkpoints(&key)?
                    .into_iter()
                    .filter(|c| *c < marked)
                    .map(|c| format!("{named}/{c}"))
                    .collect();
                bail!(
                    "unit {unit} ({what}): its marker names checkpoint {marked} of attempt \
                     {named}, so it can go on only from an older checkpoint of that attempt \
                     (the store has {}): the output of a newer one, or of one of another \
                     attempt, was never committed, and would be lost",
                    if older.is_empty() {
                        "none".to_string()
                    } else {
                        older.join(", ")
                    }
                );
            }
            let key = format!("{}/{attempt}/{id}", unit_key(&plan.prefix, unit));
            let copy = tempfile::tempdir().context("a temporary folder")?;
            if !store.download_checkpoint(&key, copy.path())? {
                bail!("{} is not a complete checkpoint", store.describe(&key));
            }
            crate::checkpoint::load(copy.path())
                .map_err(|e| {
                    anyhow!(
                        "{}",
                        format!("{e:#}")
                            .replace(&copy.path().display().to_string(), &store.describe(&key))
                    )
                })
                .context("the checkpoint to go on from is not whole")?;
            commit_marker(&producer, &consumer, &topic, *id, &metadata).with_context(|| {
                format!(
                    "moving the marker of unit {unit} ({group}) to checkpoint {id} (if a host \
                     took the unit over meanwhile, run the command again)"
                )
            })?;
            format!(
                "unit {unit} ({what}) goes on from checkpoint {id} of attempt {attempt} (its \
                 marker named {marked}): what it committed after {id} is written again"
            )
        }
        ResetTo::Fresh => {
            drop(consumer);
            let admin: AdminClient<DefaultClientContext> =
                client.create().context("creating a Kafka admin client")?;
            let options = AdminOptions::new().operation_timeout(Some(REQUEST_TIMEOUT));
            let results = super::block_on(admin.delete_groups(&[&group], &options))
                .with_context(|| format!("deleting the unit's marker group {group}"))?;
            for result in results {
                if let Err((_, code)) = result
                    && code != RDKafkaErrorCode::GroupIdNotFound
                {
                    bail!("deleting the unit's marker group {group}: {code}");
                }
            }
            format!("unit {unit} ({what}) starts over: everything it wrote is written again")
        }
    };
    // A unit that had finished runs again.
    store.delete_object(&finished_key(&plan.prefix, unit))?;
    Ok(done)
}

/// Commits, in one transaction of `producer` and nothing else, checkpoint `id` as the
/// marker of the group of `consumer` on `topic`, with `metadata` (the run and attempt
/// the marker named).
fn commit_marker(
    producer: &BaseProducer,
    consumer: &BaseConsumer,
    topic: &str,
    id: u64,
    metadata: &str,
) -> Result<()> {
    let mut marker = TopicPartitionList::new();
    marker.add_partition_offset(topic, 0, Offset::Offset(id as i64))?;
    if let Some(mut e) = marker.find_partition(topic, 0) {
        e.set_metadata(metadata);
    }
    let group = consumer
        .group_metadata()
        .ok_or_else(|| anyhow!("the marker group has no metadata"))?;
    producer.begin_transaction()?;
    let committed = producer
        .send_offsets_to_transaction(&marker, &group, REQUEST_TIMEOUT)
        .and_then(|()| producer.commit_transaction(REQUEST_TIMEOUT));
    if let Err(e) = committed {
        let _ = producer.abort_transaction(REQUEST_TIMEOUT);
        return Err(e.into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_to_go_on_from_is_written_as_the_error_names_it() {
        assert_eq!(
            "0f3a9c/12".parse::<ResetTo>(),
            Ok(ResetTo::Checkpoint {
                attempt: "0f3a9c".into(),
                id: 12
            })
        );
        for bad in ["12", "a/b", "/3", "../x/3", "a/-1"] {
            assert!(bad.parse::<ResetTo>().is_err(), "{bad}");
        }
    }
}
