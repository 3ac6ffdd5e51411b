//! An exactly-once sink's markers: the checkpoint id each subtask's transactions commit
//! as the offset of its marker group, with the run (and a unit's note) as metadata; and
//! what they say when a run restores a checkpoint: which checkpoint each checkpointed
//! subtask last committed, read before the run starts, whether the restore would write
//! committed records again, and the ids the run's checkpoints must stay above.

use std::time::Duration;

use anyhow::{Context, Result};
use rdkafka::ClientConfig;
use rdkafka::consumer::BaseConsumer;
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::{Offset, TopicPartitionList};

use super::sink::{SinkState, restored_prefix};
use super::{Delivery, KafkaSinkConfig};

/// An identity for a fresh run of a sink: 64 random bits.
pub(crate) fn new_run_id() -> u64 {
    uuid::Uuid::new_v4().as_u64_pair().0
}

/// The metadata a marker commits with a checkpoint's id: the run, then `;` and the
/// sink's note if it has one.
pub(super) fn marker_metadata(run: u64, note: Option<&str>) -> String {
    match note {
        Some(note) => format!("sluice-run={run:016x};{note}"),
        None => format!("sluice-run={run:016x}"),
    }
}

/// The checkpoint id and the metadata that the marker group of `consumer` last committed
/// for `topic`, if any.
pub fn read_marker(
    consumer: &BaseConsumer,
    topic: &str,
    timeout: Duration,
) -> Result<Option<(u64, String)>, KafkaError> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, 0);
    let committed = consumer.committed_offsets(tpl, timeout)?;
    Ok(committed.elements().first().and_then(|e| match e.offset() {
        Offset::Offset(o) if o >= 0 => Some((o as u64, e.metadata().to_string())),
        _ => None,
    }))
}

/// A marker as messages name it.
pub(super) fn describe_marker(marker: Option<&(String, u64)>) -> String {
    match marker {
        Some((note, id)) => format!("checkpoint {id} ({note})"),
        None => "none".into(),
    }
}

/// The run and the note of a marker's metadata.
pub fn parse_marker_metadata(metadata: &str) -> Option<(u64, Option<&str>)> {
    let rest = metadata.strip_prefix("sluice-run=")?;
    let (run, note) = match rest.split_once(';') {
        Some((run, note)) => (run, Some(note)),
        None => (rest, None),
    };
    Some((u64::from_str_radix(run, 16).ok()?, note))
}

/// What the marker group of one checkpointed sink subtask holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubtaskMarker {
    /// The subtask, as the checkpoint numbers it.
    pub subtask: u32,
    /// Its marker group (its transactional id).
    pub group: String,
    /// The run its checkpointed state belongs to.
    pub run: u64,
    /// The checkpoint the marker names and the run that committed it, if the group
    /// holds a marker (`None` for the run: metadata that names none).
    pub committed: Option<(u64, Option<u64>)>,
}

/// How long reading a marker may take before the start fails.
const MARKER_TIMEOUT: Duration = Duration::from_secs(30);

/// Reads the markers of the subtasks of the sink `config` whose checkpointed states are
/// `states` (`(subtask, state)`). Nothing for sinks without markers: at least once, or
/// units of a job over several hosts, which restore what their markers name.
pub fn read_markers(
    config: &KafkaSinkConfig,
    states: &[(u32, Vec<u8>)],
) -> Result<Vec<SubtaskMarker>> {
    if config.delivery != Delivery::ExactlyOnce || config.marker_note.is_some() {
        return Ok(Vec::new());
    }
    let mut markers = Vec::new();
    for (subtask, bytes) in states.iter().filter(|(_, b)| !b.is_empty()) {
        let state = SinkState::decode(bytes)
            .with_context(|| format!("decoding the state of subtask {subtask}"))?;
        let group = super::sink::transactional_id(restored_prefix(config, &state), *subtask);
        let mut client = ClientConfig::new();
        // The sink's credentials (SASL, TLS) reach its marker groups too.
        for (k, v) in &config.properties {
            client.set(k, v);
        }
        let consumer: BaseConsumer = client
            .set("bootstrap.servers", &config.bootstrap)
            .set("group.id", &group)
            .set("enable.auto.commit", "false")
            // The marker last committed, without waiting for the transaction a crashed
            // producer left open (which holds a marker too, until the sink's producer
            // fences it as it opens): read committed, the broker answers only once that
            // transaction ends, at its timeout.
            .set("isolation.level", "read_uncommitted")
            .create()
            .context("creating a client of the marker groups")?;
        let committed = read_marker(&consumer, &config.topic, MARKER_TIMEOUT)
            .with_context(|| {
                format!(
                    "reading the checkpoint group {group:?} last committed to topic {:?} at {}",
                    config.topic, config.bootstrap
                )
            })?
            .map(|(id, metadata)| (id, parse_marker_metadata(&metadata).map(|(run, _)| run)));
        markers.push(SubtaskMarker {
            subtask: *subtask,
            group,
            run: state.run,
            committed,
        });
    }
    Ok(markers)
}

/// The marker that makes restoring checkpoint `restored` a rewind: one that names a
/// later checkpoint of the run the subtask's state belongs to. Its records after
/// `restored` reached the topic; restored, the job would write them again. (A marker
/// of another run, one started afresh since, says nothing of this run's checkpoints.)
pub fn committed_after(restored: u64, markers: &[SubtaskMarker]) -> Option<&SubtaskMarker> {
    markers.iter().find(|m| {
        m.committed
            .is_some_and(|(id, run)| id > restored && run == Some(m.run))
    })
}

/// The least id a checkpoint of the run that `markers` were read for may take: above
/// every checkpoint of that run the markers name. A checkpoint at or below one of them
/// would be taken for committed, and its records dropped.
pub fn first_free_id(markers: &[SubtaskMarker]) -> u64 {
    markers
        .iter()
        .filter_map(|m| m.committed.filter(|(_, run)| *run == Some(m.run)))
        .map(|(id, _)| id + 1)
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn marker(subtask: u32, run: u64, committed: Option<(u64, Option<u64>)>) -> SubtaskMarker {
        SubtaskMarker {
            subtask,
            group: format!("p-{subtask}"),
            run,
            committed,
        }
    }

    #[test]
    fn a_later_commit_of_the_same_run_makes_a_restore_a_rewind() {
        let markers = [
            marker(0, 7, Some((12, Some(7)))),
            marker(1, 7, Some((15, Some(7)))),
        ];
        assert_eq!(committed_after(15, &markers), None);
        assert_eq!(committed_after(20, &markers), None);
        assert_eq!(committed_after(14, &markers), Some(&markers[1]));
        assert_eq!(committed_after(3, &markers), Some(&markers[0]));
    }

    #[test]
    fn markers_of_other_runs_or_none_make_no_rewind() {
        let markers = [
            marker(0, 7, Some((40, Some(9)))),
            marker(1, 7, Some((50, None))),
            marker(2, 7, None),
        ];
        assert_eq!(committed_after(3, &markers), None);
        assert_eq!(first_free_id(&markers), 0);
    }

    #[test]
    fn checkpoint_ids_go_on_above_every_commit_of_the_run() {
        let markers = [
            marker(0, 7, Some((12, Some(7)))),
            marker(1, 7, Some((15, Some(7)))),
            marker(2, 7, Some((40, Some(9)))),
            marker(3, 7, None),
        ];
        assert_eq!(first_free_id(&markers), 16);
    }
}
