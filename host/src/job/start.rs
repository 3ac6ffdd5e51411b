//! Where a run of a job starts, decided before anything is written: a fresh start
//! refuses to take over what an earlier run left (or moves it aside when asked), a
//! restore must fit the job (every piece of state finds its source or operator, by id)
//! and must not take back committed output, of file sinks or of exactly-once Kafka
//! sinks (whose markers say which checkpoint they committed). Only then is the run's
//! lineage recorded. What it refuses is a [`StartRefused`].

use std::fs;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};

use super::graph::{JobGraph, SinkVertex, Vertex};
use super::ownership::{RunLocks, lock_run};
use super::run::{RestorePoint, RunOptions, StartRefused};
use crate::checkpoint::assign_operator_state;
use crate::checkpoint::{CheckpointStorage, LoadedCheckpoint, load};
use crate::connectors::file_sink::{
    Recovery, SinkState, next_generation, output_path, plan_recovery, rewind_refusal, staging_path,
};
use crate::connectors::kafka;
use crate::spec::SinkKind;

/// Where a run starts: its checkpoint storage, the lineage it records there, and the
/// checkpoint its first attempt restores.
pub(super) struct RunStart {
    /// What the run owns while it lasts (see [`super::ownership`]).
    pub _locks: RunLocks,
    /// The job's checkpoint storage, when it checkpoints.
    pub storage: Option<Arc<CheckpointStorage>>,
    /// This run's lineage in that storage.
    pub lineage: Option<crate::checkpoint::Lineage>,
    /// What the first attempt restores.
    pub initial: Option<LoadedCheckpoint>,
    /// The least id the run's checkpoints may take: above every checkpoint that an
    /// exactly-once Kafka sink committed in the run it continues (a run forked into
    /// another checkpoint folder would otherwise number its checkpoints from the one it
    /// restored, and its sink would take them for committed ones and drop their records).
    pub first_id: u64,
}

/// Whether a run may start as `options` say, without changing anything: what
/// [`prepare_run`] would refuse, said before a caller commits to the run (the server
/// answers a start request with it).
pub(super) fn check_start(graph: &JobGraph, options: &RunOptions) -> Result<()> {
    drop(lock_run(graph)?);
    let storage = storage(graph)?;
    decide(graph, storage.as_deref(), options).map(|_| ())
}

/// Prepares a run as `options` say; see the module docs.
pub(super) fn prepare_run(
    graph: &JobGraph,
    options: &RunOptions,
    locks: RunLocks,
) -> Result<RunStart> {
    let storage = storage(graph)?;
    let (initial, earlier, first_id) = decide(graph, storage.as_deref(), options)?;
    if !earlier.is_empty() {
        move_aside(&earlier)?;
        if let Some(s) = &storage {
            fs::create_dir_all(s.dir())
                .with_context(|| format!("creating {}", s.dir().display()))?;
        }
    }
    let lineage = match &storage {
        Some(s) => {
            let from = match &initial {
                Some(c) => Some(
                    fs::canonicalize(&c.path)
                        .with_context(|| format!("resolving {}", c.path.display()))?,
                ),
                None => None,
            };
            let lineage = s.begin_run(from.as_deref())?;
            // No checkpoint of the job is being written now: what no checkpoint names,
            // and the state folders of runs that ended without cleaning up, can go.
            s.collect_shared_files()?;
            s.clear_working()?;
            Some(lineage)
        }
        None => {
            // RocksDB folders of killed runs of jobs without checkpoints, once per run.
            super::deploy::clear_abandoned_state(&super::deploy::state_base(graph));
            None
        }
    };
    Ok(RunStart {
        _locks: locks,
        storage,
        lineage,
        initial,
        first_id,
    })
}

/// Refuses the start: returns a [`StartRefused`] with the `format!` message.
macro_rules! refuse {
    ($($message:tt)*) => {
        return Err(StartRefused(format!($($message)*)).into())
    };
}

fn storage(graph: &JobGraph) -> Result<Option<Arc<CheckpointStorage>>> {
    graph
        .checkpoint
        .as_ref()
        .map(|c| CheckpointStorage::new(&c.dir).map(Arc::new))
        .transpose()
}

/// The checkpoint the run starts from (checked against the job and its output), what
/// an earlier run left that a fresh start moves aside (refused unless asked to), and
/// the least id of the run's checkpoints ([`RunStart::first_id`]).
fn decide(
    graph: &JobGraph,
    storage: Option<&CheckpointStorage>,
    options: &RunOptions,
) -> Result<(Option<LoadedCheckpoint>, Vec<PathBuf>, u64)> {
    let mut earlier = Vec::new();
    let initial = match &options.restore {
        RestorePoint::Fresh => {
            earlier = earlier_run(graph, storage)?;
            if !earlier.is_empty() && !options.move_aside {
                refuse!("{}", refusal(graph, &earlier));
            }
            None
        }
        RestorePoint::Latest => {
            let Some(storage) = storage else {
                refuse!(
                    "--from-checkpoint needs checkpointing: add a [checkpoint] table to the job file"
                );
            };
            match storage.find_latest()? {
                Some(latest) => Some(latest),
                None => refuse!(
                    "no complete checkpoint to restore from in {}",
                    storage.dir().display()
                ),
            }
        }
        RestorePoint::Path(p) => Some(load(p)?),
    };
    let mut first_id = 0;
    if let Some(c) = &initial {
        check_restorable(graph, c, options.allow_non_restored_state)?;
        first_id = check_sink_restore(graph, c, options.allow_rewind)?;
    }
    Ok((initial, earlier, first_id))
}

/// What an earlier run of the job left that a fresh start would take over: its
/// checkpoint directory (when it holds a complete checkpoint), its output files, and
/// then also their staging folders (staged output of a run that completed no
/// checkpoint was never committed: the sink clears it).
fn earlier_run(graph: &JobGraph, storage: Option<&CheckpointStorage>) -> Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    if let Some(s) = storage
        && s.has_history()?
    {
        found.push(s.dir().to_path_buf());
    }
    let mut staging = Vec::new();
    for sink in graph.sinks() {
        let (SinkKind::File, Some(path)) = (sink.kind, &sink.path) else {
            continue;
        };
        for subtask in 0..sink.parallelism {
            let output = output_path(path, subtask, sink.parallelism);
            staging.push(staging_path(&output));
            if fs::symlink_metadata(&output).is_ok() {
                found.push(output);
            }
        }
    }
    if !found.is_empty() {
        found.extend(staging.into_iter().filter(|s| s.exists()));
    }
    Ok(found)
}

fn refusal(graph: &JobGraph, earlier: &[PathBuf]) -> String {
    let list: Vec<String> = earlier.iter().map(|p| p.display().to_string()).collect();
    let resume = if graph.checkpoint.is_some() {
        "resume it from its latest checkpoint (--from-checkpoint latest), or "
    } else {
        ""
    };
    format!(
        "job '{}' has run before and left {}; nothing was changed. To go on, {resume}start it \
         over with --fresh, which moves these aside (to NAME.N) first",
        graph.name,
        list.join(", ")
    )
}

/// Renames `paths` to their next free generation (`NAME.N`).
fn move_aside(paths: &[PathBuf]) -> Result<()> {
    for (from, to) in paths.iter().zip(next_generation(paths)) {
        fs::rename(from, &to)
            .with_context(|| format!("moving {} aside to {}", from.display(), to.display()))?;
        tracing::warn!("moved {} aside to {}", from.display(), to.display());
    }
    Ok(())
}

/// Refuses checkpoints that do not fit the job: another number of key groups, or
/// state of a source or operator the job does not have (unless that state may be
/// dropped).
pub(super) fn check_restorable(
    graph: &JobGraph,
    c: &LoadedCheckpoint,
    allow_non_restored_state: bool,
) -> Result<()> {
    if c.metadata.max_parallelism != graph.max_parallelism {
        refuse!(
            "{} was taken with max_parallelism {}, but the job has {}; key groups cannot be remapped",
            c.path.display(),
            c.metadata.max_parallelism,
            graph.max_parallelism
        );
    }
    let has = |id: &str, source: bool| {
        graph
            .vertices
            .iter()
            .any(|v| v.id() == id && matches!(v, Vertex::Source(_)) == source)
    };
    let unknown: Vec<String> = c
        .metadata
        .sources
        .iter()
        .filter(|s| !has(&s.name, true))
        .map(|s| format!("source '{}'", s.name))
        .chain(
            c.metadata
                .operators
                .iter()
                .filter(|o| !has(&o.name, false))
                .map(|o| format!("operator '{}'", o.name)),
        )
        .collect();
    if !unknown.is_empty() {
        if allow_non_restored_state {
            tracing::warn!(
                "job '{}': dropping the state of {} from {}",
                graph.name,
                unknown.join(", "),
                c.path.display()
            );
        } else {
            let ids: Vec<&str> = graph.vertices.iter().map(Vertex::id).collect();
            refuse!(
                "{} has state for {}, which job '{}' does not have (its ids: {}). If a source or \
                 operator was renamed, give it `id = \"OLD NAME\"` in the job file; to drop that \
                 state, pass --allow-non-restored-state",
                c.path.display(),
                unknown.join(", "),
                graph.name,
                ids.join(", ")
            );
        }
    }
    for source in graph.sources() {
        if !c.metadata.sources.iter().any(|s| s.name == source.id) {
            tracing::warn!(
                "job '{}': {} has no position for source '{}'; it starts from the beginning",
                graph.name,
                c.path.display(),
                source.id
            );
        }
    }
    Ok(())
}

/// Refuses a restore that would take back committed output of a file sink, or that
/// finds less output than the checkpoint says was committed, or that goes back behind
/// what an exactly-once Kafka sink committed. Returns the least id the run's
/// checkpoints may take ([`RunStart::first_id`]).
fn check_sink_restore(graph: &JobGraph, c: &LoadedCheckpoint, allow_rewind: bool) -> Result<u64> {
    if graph.checkpoint.is_none() {
        return Ok(0);
    }
    let mut first_id = 0;
    for sink in graph.sinks() {
        check_file_sink_restore(sink, c, allow_rewind)?;
        first_id = first_id.max(check_kafka_sink_restore(sink, c, allow_rewind)?);
    }
    Ok(first_id)
}

/// [`check_sink_restore`] for an exactly-once Kafka sink: refuses (unless rewinding) a
/// checkpoint older than one its subtasks' markers say they committed. Returns the id
/// above every checkpoint of the restored run that they committed.
fn check_kafka_sink_restore(
    sink: &SinkVertex,
    c: &LoadedCheckpoint,
    allow_rewind: bool,
) -> Result<u64> {
    let (Some(config), Some(op)) = (&sink.kafka, c.operator(&sink.id)) else {
        return Ok(0);
    };
    let mut states = Vec::with_capacity(op.subtasks.len());
    for handle in &op.subtasks {
        states.push((handle.subtask, c.read_state(handle)?.state));
    }
    let markers = kafka::read_markers(config, &states)
        .with_context(|| format!("restoring {}: Kafka sink '{}'", c.path.display(), sink.name))?;
    let restored = c.metadata.id;
    if let Some(m) = kafka::committed_after(restored, &markers) {
        let (committed, _) = m.committed.expect("a marker after the restored checkpoint");
        if allow_rewind {
            tracing::warn!(
                "job restored from checkpoint {restored}, before checkpoint {committed} that \
                 Kafka sink '{}' committed to topic {:?}: the records after checkpoint \
                 {restored} are written to the topic again (--allow-rewind)",
                sink.name,
                config.topic
            );
        } else {
            refuse!(
                "restoring {} refused: Kafka sink '{}' committed checkpoint {committed} to topic \
                 {:?} (subtask {}, marker group {:?}), after checkpoint {restored}, the one \
                 being restored: the records after checkpoint {restored} are in the topic \
                 already, and would be written again. Restore checkpoint {committed} or a \
                 later one, or pass --allow-rewind to go on from checkpoint {restored} anyway \
                 (what was committed stays, and the records after it are written again)",
                c.path.display(),
                sink.name,
                config.topic,
                m.subtask,
                m.group
            );
        }
    }
    Ok(kafka::first_free_id(&markers))
}

/// [`check_sink_restore`] for one sink.
fn check_file_sink_restore(
    sink: &SinkVertex,
    c: &LoadedCheckpoint,
    allow_rewind: bool,
) -> Result<()> {
    let (SinkKind::File, Some(path)) = (sink.kind, &sink.path) else {
        return Ok(());
    };
    for subtask in 0..sink.parallelism {
        let output = output_path(path, subtask, sink.parallelism);
        let current = fs::metadata(&output).map(|m| m.len()).ok();
        let state = assign_operator_state(c, &sink.id, subtask, sink.parallelism, false, false)?
            .and_then(|r| r.state)
            .filter(|s| !s.is_empty());
        let Some(bytes) = state else {
            if current.is_some() {
                refuse!(
                    "{} has no state for sink '{}', but {} exists; it is left as it is (move it \
                     away, or restore a checkpoint of this job)",
                    c.path.display(),
                    sink.name,
                    output.display()
                );
            }
            continue;
        };
        let state: SinkState = postcard::from_bytes(&bytes)
            .with_context(|| format!("{}: decoding the sink's state", c.path.display()))?;
        match plan_recovery(current.unwrap_or(0), &state) {
            Recovery::Appended(_) => {}
            Recovery::Rewind { .. } if allow_rewind => {}
            Recovery::Rewind { target } => refuse!(
                "restoring {} refused: {} {}",
                c.path.display(),
                output.display(),
                rewind_refusal(current.unwrap_or(0), target)
            ),
            Recovery::Missing => refuse!(
                "restoring {} refused: {} has {} bytes, but the checkpoint says {} were committed \
                 (was it moved or changed by someone else?)",
                c.path.display(),
                output.display(),
                current.unwrap_or(0),
                state.base_len
            ),
        }
    }
    Ok(())
}
