//! Which part of a checkpoint each subtask of a restored job gets (Flink's
//! `StateAssignmentOperation`): its own operator state at the same parallelism, and keyed
//! state and timers by key group at any parallelism. It reads a loaded checkpoint and
//! decides; the storage code does the reading.

use anyhow::{Result, bail};
use sluice_codec::TimeDomain;

use super::LoadedCheckpoint;
use crate::state::KeyedSnapshot;
use crate::state::key_groups::{key_group_of, key_groups_of_subtask};
use crate::timers::TimerQueues;

/// What an operator instance gets back from a checkpoint.
#[derive(Debug, Clone)]
pub struct OperatorRestore {
    /// What its `snapshot` returned (same subtask index).
    pub state: Option<Vec<u8>>,
    /// Keyed state of every old subtask whose key groups overlap this one's.
    pub keyed: Vec<KeyedSnapshot>,
    /// Timers (of this subtask's key groups, for keyed operators).
    pub timers: TimerQueues,
    /// The watermark to continue from: the lowest of the restored subtasks'.
    pub watermark: i64,
}

/// The state of vertex `id`, subtask `subtask` of `parallelism`; `None` when the
/// checkpoint has no state for that operator. Keyed state is gathered from every old
/// subtask whose key groups overlap the new subtask's, so the parallelism may differ.
/// The own state of an operator with a broadcast input (`broadcast`) is its broadcast
/// state, the same on every subtask: after a rescale each new subtask gets a copy (of
/// old subtask `subtask % old parallelism`, as Flink assigns broadcast state).
pub fn assign_operator_state(
    checkpoint: &LoadedCheckpoint,
    id: &str,
    subtask: u32,
    parallelism: u32,
    keyed: bool,
    broadcast: bool,
) -> Result<Option<OperatorRestore>> {
    let Some(op) = checkpoint.operator(id) else {
        return Ok(None);
    };
    let max = checkpoint.metadata.max_parallelism;
    let rescaled = op.parallelism != parallelism;
    let mine = key_groups_of_subtask(subtask, parallelism, max);
    let mut restore = OperatorRestore {
        state: None,
        keyed: Vec::new(),
        timers: TimerQueues::new(),
        watermark: i64::MIN,
    };
    let mut lowest: Option<i64> = None;
    for h in &op.subtasks {
        let theirs = key_groups_of_subtask(h.subtask, op.parallelism, max);
        let same = !rescaled && h.subtask == subtask;
        let copy = rescaled && broadcast && h.subtask == subtask % op.parallelism;
        let overlaps = keyed && mine.start < theirs.end && theirs.start < mine.end;
        // Unkeyed state cannot move between subtasks: after a rescale it must be empty.
        let must_be_empty = rescaled && !keyed && !broadcast;
        if !same && !copy && !overlaps && !must_be_empty {
            continue;
        }
        let snapshot = checkpoint.read_state(h)?;
        if copy {
            restore.state = Some(snapshot.state.clone());
        } else if rescaled && !broadcast && !snapshot.state.is_empty() {
            bail!(
                "operator '{id}' has operator state (not keyed) from parallelism {}; it \
                 cannot be redistributed to parallelism {parallelism}",
                op.parallelism
            );
        }
        lowest = Some(lowest.map_or(snapshot.watermark, |w| w.min(snapshot.watermark)));
        if same {
            restore.state = Some(snapshot.state);
        }
        if keyed && rescaled {
            if !overlaps {
                continue;
            }
            for (domain, ts, key) in timers_of(&snapshot.timers) {
                let kg = key_group_of(&key, max);
                if mine.contains(&kg) {
                    restore.timers.register(domain, ts, &key);
                }
            }
            restore.keyed.extend(snapshot.keyed);
        } else if same {
            // The subtask's own file, at the same parallelism: its timers are all its.
            restore.keyed.extend(snapshot.keyed);
            restore.timers = snapshot.timers;
        } else if !snapshot.timers.is_empty() {
            bail!(
                "operator '{id}' has timers on unkeyed input; they cannot be \
                 redistributed from parallelism {} to {parallelism}",
                op.parallelism
            );
        }
    }
    restore.watermark = lowest.unwrap_or(i64::MIN);
    Ok(Some(restore))
}

fn timers_of(t: &TimerQueues) -> Vec<(TimeDomain, i64, Vec<u8>)> {
    use TimeDomain::{EventTime, ProcessingTime};
    [EventTime, ProcessingTime]
        .into_iter()
        .flat_map(|d| t.iter(d).map(move |(ts, k)| (d, ts, k.to_vec())))
        .collect()
}
