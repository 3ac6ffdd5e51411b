//! The checkpoint coordinator of a job: triggers checkpoints at the sources, collects the
//! tasks' acknowledgements, completes (writes metadata, notifies every task) or aborts.
//!
//! The decisions — when to trigger the next checkpoint, whether a checkpoint is complete
//! — are small pure functions; the coordinator thread only feeds them what it observes
//! and carries out what they return.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use parking_lot::Mutex;

use crate::checkpoint::{
    Acknowledgement, CheckpointMetadata, CheckpointStorage, CoordinatorMessage, FinishedTask,
    OperatorMeta, SnapshotKind, SourceMeta, SourcePosition, StateHandle, TaskId,
};
use crate::network::{Barrier, CheckpointKind, CheckpointingMode};
use crate::task::TaskHandle;
use crate::timers::now_millis;

/// Checkpoint settings of a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointSettings {
    /// Time between periodic checkpoints; zero disables them (savepoints still work).
    pub interval: Duration,
    /// A checkpoint not complete after this long is aborted.
    pub timeout: Duration,
    /// Least time between the end of one checkpoint and the start of the next.
    pub min_pause: Duration,
    /// Most checkpoints in flight at once.
    pub max_concurrent: usize,
    /// Complete checkpoints to keep.
    pub retain: usize,
    /// Exactly-once (aligned) or at-least-once.
    pub mode: CheckpointingMode,
    /// Where checkpoints are stored.
    pub dir: PathBuf,
    /// Periodic checkpoints fall this long after a multiple of the interval, counted in
    /// wall-clock time from the Unix epoch, rather than an interval after the previous
    /// one: jobs on several hosts with the same interval then checkpoint in step, at
    /// offsets of their choosing (the units of a job over several hosts, each stage half
    /// an interval after the one it reads).
    pub phase: Option<Duration>,
}

/// A completed checkpoint, for reports.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CompletedCheckpoint {
    /// Id.
    pub id: u64,
    /// Checkpoint or savepoint.
    pub kind: SnapshotKind,
    /// Its folder.
    pub path: PathBuf,
    /// From trigger to completion.
    pub duration: Duration,
    /// The longest synchronous part of any task.
    pub max_sync: Duration,
    /// Bytes written (incremental: a RocksDB state's files only when they are new).
    pub bytes: u64,
    /// Files written: the tasks' state files and the RocksDB tables copied.
    #[serde(default)]
    pub files: u32,
    /// Bytes of the whole state it restores (the files it names written earlier too).
    #[serde(default)]
    pub full_bytes: u64,
    /// The longest asynchronous part of any task.
    #[serde(default)]
    pub max_async: Duration,
    /// When it was triggered, in milliseconds since the Unix epoch.
    pub triggered_ms: i64,
    /// Records the job's sinks had committed once it completed, over every attempt
    /// (`None` when not known: restored from a checkpoint that did not count them).
    #[serde(default)]
    pub records_committed: Option<u64>,
}

/// What the coordinator did, readable while it runs.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct CheckpointStats {
    /// Completed checkpoints, oldest first.
    pub completed: Vec<CompletedCheckpoint>,
    /// Aborted checkpoints with the reason.
    pub aborted: Vec<(u64, String)>,
    /// The id the next checkpoint triggered gets: a restart goes on from it.
    pub next_id: u64,
    /// Records the job's sinks had committed at the checkpoint this attempt started
    /// from (0 from the beginning; `None` when not known).
    #[serde(default)]
    pub committed_before: Option<u64>,
    /// The checkpoints and savepoints in flight, oldest first.
    #[serde(default)]
    pub in_progress: Vec<InProgressCheckpoint>,
}

/// A checkpoint or savepoint triggered and not yet complete: how far it got.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct InProgressCheckpoint {
    /// Id.
    pub id: u64,
    /// Checkpoint or savepoint.
    pub kind: SnapshotKind,
    /// When it was triggered, in milliseconds since the Unix epoch.
    pub triggered_ms: i64,
    /// Tasks that have acknowledged it (their state written).
    pub acknowledged: u32,
    /// Tasks it waits for in all.
    pub tasks: u32,
    /// Bytes the tasks that acknowledged wrote.
    pub bytes: u64,
}

impl CheckpointStats {
    /// Records the job's sinks have committed, over every attempt: as of the latest
    /// completed checkpoint or savepoint, else of the one this attempt started from.
    pub fn records_committed(&self) -> Option<u64> {
        match self.completed.last() {
            Some(last) => last.records_committed,
            None => self.committed_before,
        }
    }
}

/// How soon a final checkpoint follows the previous trigger (a retry after an abort).
const FINAL_RETRY: Duration = Duration::from_millis(50);

/// When the next checkpoint is due; `None` when none should be triggered (periodic
/// checkpoints off, too many in flight, or no source task left). When every source's
/// input has ended (`inputs_ended`), the final checkpoint is due at once, whatever the
/// interval. With a `phase`, `started` is a moment on it (see [`on_phase`]), and periodic
/// checkpoints fall on it and whole intervals after it: the first such moment more than
/// half an interval after the last trigger (so a trigger that ran late does not skip the
/// next) and after the minimum pause.
pub fn next_trigger(
    settings: &CheckpointSettings,
    last_trigger: Option<Instant>,
    last_completion: Option<Instant>,
    in_flight: usize,
    sources_running: bool,
    inputs_ended: bool,
    started: Instant,
) -> Option<Instant> {
    if !sources_running || in_flight >= settings.max_concurrent {
        return None;
    }
    if inputs_ended {
        let after_retry = last_trigger.map_or(started, |t| t + FINAL_RETRY);
        let after_pause = last_completion.map_or(after_retry, |c| c + settings.min_pause);
        return Some(after_retry.max(after_pause));
    }
    if settings.interval.is_zero() {
        return None;
    }
    let after_pause = last_completion.map(|c| c + settings.min_pause);
    if settings.phase.is_none() {
        let after_interval = last_trigger.unwrap_or(started) + settings.interval;
        return Some(after_pause.map_or(after_interval, |p| after_interval.max(p)));
    }
    let interval = settings.interval;
    let earliest = last_trigger.map_or(started + interval, |t| t + interval / 2);
    let earliest = after_pause.map_or(earliest, |p| earliest.max(p));
    // The first moment `started` + k intervals at or after `earliest`.
    let since = earliest.saturating_duration_since(started).as_nanos();
    let step = interval.as_nanos();
    let offset = u64::try_from(since.div_ceil(step) * step).unwrap_or(u64::MAX);
    Some(
        started
            .checked_add(Duration::from_nanos(offset))
            .unwrap_or(earliest),
    )
}

/// The latest moment at or before `now` on `settings`' phase: `now_ms`, the wall-clock
/// time of `now` in milliseconds since the Unix epoch, less its distance past the last
/// moment that is `phase` past a multiple of the interval. `now` when there is no phase
/// (or no interval).
pub fn on_phase(settings: &CheckpointSettings, now: Instant, now_ms: i64) -> Instant {
    let interval = settings.interval.as_millis() as i64;
    match settings.phase {
        Some(phase) if interval > 0 => {
            let past = (now_ms - phase.as_millis() as i64).rem_euclid(interval);
            now.checked_sub(Duration::from_millis(past as u64))
                .unwrap_or(now)
        }
        _ => now,
    }
}

/// A checkpoint in flight.
#[derive(Debug)]
pub struct PendingCheckpoint {
    /// Id.
    pub id: u64,
    /// Kind.
    pub kind: CheckpointKind,
    triggered: Instant,
    timestamp: i64,
    waiting: BTreeSet<TaskId>,
    acks: Vec<Acknowledgement>,
    reply: Option<Sender<Result<PathBuf, String>>>,
}

/// What an acknowledgement did to a pending checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckOutcome {
    /// Every task has acknowledged.
    Complete,
    /// More acknowledgements are needed.
    Waiting,
    /// The task was not expected (already acknowledged, or not part of it).
    Unexpected,
}

/// The checkpoints in flight that a completed checkpoint `id` subsumes: the older ones,
/// but not savepoints (as in Flink): someone waits for each, and it completes in its own
/// time.
fn subsumed_by(pending: &BTreeMap<u64, PendingCheckpoint>, id: u64) -> Vec<u64> {
    pending
        .range(..id)
        .filter(|(_, p)| !matches!(p.kind, CheckpointKind::Savepoint { .. }))
        .map(|(k, _)| *k)
        .collect()
}

impl PendingCheckpoint {
    /// A checkpoint waiting for `tasks`.
    pub fn new(id: u64, kind: CheckpointKind, tasks: impl IntoIterator<Item = TaskId>) -> Self {
        PendingCheckpoint {
            id,
            kind,
            triggered: Instant::now(),
            timestamp: now_millis(),
            waiting: tasks.into_iter().collect(),
            acks: Vec::new(),
            reply: None,
        }
    }

    /// How far it got.
    pub fn progress(&self) -> InProgressCheckpoint {
        InProgressCheckpoint {
            id: self.id,
            kind: self.snapshot_kind(),
            triggered_ms: self.timestamp,
            acknowledged: self.acks.len() as u32,
            tasks: (self.acks.len() + self.waiting.len()) as u32,
            bytes: self.acks.iter().map(|a| a.bytes).sum(),
        }
    }

    /// Records an acknowledgement.
    pub fn acknowledge(&mut self, ack: Acknowledgement) -> AckOutcome {
        if !self.waiting.remove(&ack.task) {
            return AckOutcome::Unexpected;
        }
        self.acks.push(ack);
        if self.waiting.is_empty() {
            AckOutcome::Complete
        } else {
            AckOutcome::Waiting
        }
    }

    /// True when `task` has not acknowledged yet.
    pub fn is_waiting_for(&self, task: TaskId) -> bool {
        self.waiting.contains(&task)
    }

    fn snapshot_kind(&self) -> SnapshotKind {
        self.kind.into()
    }
}

/// Everything the coordinator needs to know about the job.
pub struct CoordinatorSetup {
    /// Job name.
    pub job: String,
    /// Checkpoint settings.
    pub settings: CheckpointSettings,
    /// Storage.
    pub storage: Arc<CheckpointStorage>,
    /// Number of key groups.
    pub max_parallelism: u32,
    /// The source read by each source chain: `chain index -> (name, parallelism)`.
    pub sources_by_chain: BTreeMap<usize, (String, u32)>,
    /// Parallelism of every operator (by name).
    pub operator_parallelism: BTreeMap<String, u32>,
    /// The source tasks (where checkpoints are triggered).
    pub sources: Vec<TaskHandle>,
    /// Every task.
    pub tasks: Vec<TaskHandle>,
    /// The first checkpoint id to use.
    pub first_id: u64,
    /// A checkpoint retention must keep: the current run's starting point.
    pub protect: Option<PathBuf>,
    /// The ids of the vertices of each chain (by chain index), for finished tasks.
    pub chain_vertices: BTreeMap<usize, Vec<String>>,
    /// Runs on every completed checkpoint or savepoint (its id and folder), before any
    /// task hears of it; an error aborts it.
    pub on_complete: Option<CheckpointHook>,
    /// Records the job's sinks had committed at the checkpoint the attempt starts from
    /// (0 from the beginning; `None` when that checkpoint did not count them).
    pub committed_before: Option<u64>,
}

/// What a job does with each completed checkpoint before its tasks are notified (a unit
/// of a job over several hosts copies it to the storage every host reads).
pub type CheckpointHook = Arc<dyn Fn(u64, &Path) -> Result<()> + Send + Sync>;

/// The coordinator loop. Runs on its own thread until [`CoordinatorMessage::Shutdown`].
pub struct Coordinator {
    setup: CoordinatorSetup,
    rx: Receiver<CoordinatorMessage>,
    next_id: u64,
    pending: BTreeMap<u64, PendingCheckpoint>,
    /// When it started, or (with a phase) the moment on the phase before that.
    started: Instant,
    last_trigger: Option<Instant>,
    last_completion: Option<Instant>,
    /// Tasks that ended.
    finished: BTreeSet<TaskId>,
    /// Tasks whose input ended.
    inputs_ended: BTreeSet<TaskId>,
    /// The acknowledgement of each finished task in the newest completed checkpoint: what
    /// later checkpoints keep of it once it has ended.
    final_acks: BTreeMap<TaskId, Acknowledgement>,
    stats: Arc<Mutex<CheckpointStats>>,
}

impl Coordinator {
    /// A coordinator receiving on `rx`, recording into `stats`.
    pub fn new(
        setup: CoordinatorSetup,
        rx: Receiver<CoordinatorMessage>,
        stats: Arc<Mutex<CheckpointStats>>,
    ) -> Self {
        stats.lock().committed_before = setup.committed_before;
        Coordinator {
            next_id: setup.first_id,
            started: on_phase(&setup.settings, Instant::now(), now_millis()),
            setup,
            rx,
            pending: BTreeMap::new(),
            last_trigger: None,
            last_completion: None,
            finished: BTreeSet::new(),
            inputs_ended: BTreeSet::new(),
            final_acks: BTreeMap::new(),
            stats,
        }
    }

    /// True while a source task runs (also one waiting for its final checkpoint).
    fn sources_running(&self) -> bool {
        self.setup
            .sources
            .iter()
            .any(|s| !self.finished.contains(&s.id()))
    }

    /// True when every running source task's input has ended.
    fn inputs_ended(&self) -> bool {
        self.setup
            .sources
            .iter()
            .map(TaskHandle::id)
            .filter(|t| !self.finished.contains(t))
            .all(|t| self.inputs_ended.contains(&t))
    }

    /// Runs until shut down.
    pub fn run(mut self) {
        loop {
            let in_flight = self
                .pending
                .values()
                .filter(|p| p.kind == CheckpointKind::Checkpoint)
                .count();
            let trigger_at = next_trigger(
                &self.setup.settings,
                self.last_trigger,
                self.last_completion,
                in_flight,
                self.sources_running(),
                self.inputs_ended(),
                self.started,
            );
            let timeout_at = self
                .pending
                .values()
                .map(|p| p.triggered + self.setup.settings.timeout)
                .min();
            let wake = [trigger_at, timeout_at].into_iter().flatten().min();
            let message = match wake {
                Some(at) => match self.rx.recv_deadline(at) {
                    Ok(m) => Some(m),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => return self.shutdown(),
                },
                None => match self.rx.recv() {
                    Ok(m) => Some(m),
                    Err(_) => return self.shutdown(),
                },
            };
            match message {
                Some(CoordinatorMessage::Shutdown) => return self.shutdown(),
                Some(m) => self.handle(m),
                None => {}
            }
            let now = Instant::now();
            let expired: Vec<u64> = self
                .pending
                .values()
                .filter(|p| now >= p.triggered + self.setup.settings.timeout)
                .map(|p| p.id)
                .collect();
            for id in expired {
                let timeout = self.setup.settings.timeout;
                self.abort(id, format!("not complete after the timeout of {timeout:?}"));
            }
            if trigger_at.is_some_and(|t| Instant::now() >= t) {
                self.trigger(CheckpointKind::Checkpoint, None);
            }
            self.publish_in_progress();
        }
    }

    /// Shows the checkpoints in flight in the stats: which tasks acknowledged, the bytes
    /// they wrote.
    fn publish_in_progress(&self) {
        let in_progress = self
            .pending
            .values()
            .map(PendingCheckpoint::progress)
            .collect();
        let mut stats = self.stats.lock();
        if stats.in_progress != in_progress {
            stats.in_progress = in_progress;
        }
    }

    fn handle(&mut self, message: CoordinatorMessage) {
        match message {
            CoordinatorMessage::Ack(ack) => {
                let id = ack.id;
                let Some(pending) = self.pending.get_mut(&id) else {
                    // Aborted meanwhile: its folder (a checkpoint's or a savepoint's) is
                    // gone, or was made again by this late write: drop the files, and the
                    // folder if nothing else is in it.
                    for h in &ack.handles {
                        let _ = std::fs::remove_file(ack.folder.join(&h.file));
                    }
                    let _ = std::fs::remove_dir(&ack.folder);
                    return;
                };
                match pending.acknowledge(ack) {
                    AckOutcome::Complete => self.complete(id),
                    AckOutcome::Waiting => {}
                    AckOutcome::Unexpected => {
                        tracing::warn!("unexpected acknowledgement of checkpoint {id}")
                    }
                }
            }
            CoordinatorMessage::Decline { id, task, reason } => {
                if self.pending.contains_key(&id) {
                    tracing::debug!("{task:?} declined checkpoint {id}: {reason}");
                    self.abort(id, reason);
                }
            }
            CoordinatorMessage::InputEnded(task) => {
                self.inputs_ended.insert(task);
            }
            CoordinatorMessage::TaskFinished(task) => {
                self.finished.insert(task);
                let waiting: Vec<u64> = self
                    .pending
                    .values()
                    .filter(|p| p.is_waiting_for(task))
                    .map(|p| p.id)
                    .collect();
                for id in waiting {
                    if self.final_acks.contains_key(&task) {
                        // It ended after its final checkpoint: what that one has of it
                        // stands for it in this one too.
                        let pending = self.pending.get_mut(&id).expect("listed above");
                        pending.waiting.remove(&task);
                        if pending.waiting.is_empty() {
                            self.complete(id);
                        }
                    } else {
                        let reason = format!("task {task:?} finished before acknowledging it");
                        self.abort_quietly(id, reason);
                    }
                }
            }
            CoordinatorMessage::TriggerSavepoint { stop, drain, reply } => {
                self.trigger(CheckpointKind::Savepoint { stop, drain }, Some(reply));
            }
            CoordinatorMessage::Shutdown => {}
        }
    }

    fn trigger(&mut self, kind: CheckpointKind, reply: Option<Sender<Result<PathBuf, String>>>) {
        let id = self.next_id;
        self.next_id += 1;
        self.stats.lock().next_id = self.next_id;
        self.last_trigger = Some(Instant::now());
        if !self.sources_running() {
            if let Some(reply) = reply {
                let _ = reply.send(Err("the job's sources have finished".into()));
            }
            return;
        }
        let tasks = self
            .setup
            .tasks
            .iter()
            .map(TaskHandle::id)
            .filter(|t| !self.finished.contains(t));
        let mut pending = PendingCheckpoint::new(id, kind, tasks);
        pending.reply = reply;
        let barrier = Barrier {
            id,
            timestamp: pending.timestamp,
            kind,
        };
        self.pending.insert(id, pending);
        tracing::debug!("triggering {kind:?} {id}");
        for source in &self.setup.sources {
            if self.finished.contains(&source.id()) {
                continue;
            }
            // A source that ends meanwhile is settled by its `TaskFinished`.
            let _ = source.trigger_checkpoint(barrier);
        }
    }

    fn complete(&mut self, id: u64) {
        let Some(pending) = self.pending.remove(&id) else {
            return;
        };
        let kind = pending.snapshot_kind();
        let folder = self.setup.storage.folder(id, kind);
        let mut acks = pending.acks.clone();
        if let Err(e) = self.carry_ended_tasks(&folder, &mut acks) {
            let reason = format!("keeping the state of ended tasks failed: {e:#}");
            self.pending.insert(id, pending);
            self.abort(id, reason);
            return;
        }
        let mut sources: BTreeMap<usize, SourceMeta> = BTreeMap::new();
        for ack in &acks {
            let (Some(position), Some((name, parallelism))) = (
                &ack.source_position,
                self.setup.sources_by_chain.get(&ack.task.vertex),
            ) else {
                continue;
            };
            let meta = sources
                .entry(ack.task.vertex)
                .or_insert_with(|| SourceMeta {
                    name: name.clone(),
                    parallelism: *parallelism,
                    positions: Vec::new(),
                });
            meta.positions.push(SourcePosition {
                subtask: ack.task.subtask,
                position: position.clone(),
            });
        }
        let sources: Vec<SourceMeta> = sources
            .into_values()
            .map(|mut m| {
                m.positions.sort_by_key(|p| p.subtask);
                m
            })
            .collect();
        let mut operators: BTreeMap<String, Vec<StateHandle>> = BTreeMap::new();
        for ack in &acks {
            for h in &ack.handles {
                operators
                    .entry(h.operator.clone())
                    .or_default()
                    .push(h.clone());
            }
        }
        // Each ack counts its task's sinks in this attempt (an ended task's, carried over,
        // as of its final checkpoint); earlier attempts' count is in `committed_before`.
        let records_committed = self
            .setup
            .committed_before
            .map(|before| before + acks.iter().map(|a| a.sink_records).sum::<u64>());
        let metadata = CheckpointMetadata {
            format: 1,
            records_committed,
            id,
            kind,
            job: self.setup.job.clone(),
            triggered_at: pending.timestamp,
            completed_at: now_millis(),
            max_parallelism: self.setup.max_parallelism,
            sources,
            operators: operators
                .into_iter()
                .map(|(name, mut subtasks)| {
                    subtasks.sort_by_key(|h| h.subtask);
                    OperatorMeta {
                        parallelism: self
                            .setup
                            .operator_parallelism
                            .get(&name)
                            .copied()
                            .unwrap_or(1),
                        name,
                        subtasks,
                    }
                })
                .collect(),
            finished: acks
                .iter()
                .filter(|a| a.finished)
                .map(|a| FinishedTask {
                    vertices: self
                        .setup
                        .chain_vertices
                        .get(&a.task.vertex)
                        .cloned()
                        .unwrap_or_default(),
                    subtask: a.task.subtask,
                })
                .collect(),
        };
        if let Err(e) = self.setup.storage.commit(&folder, &metadata) {
            let reason = format!("writing metadata failed: {e:#}");
            self.pending.insert(id, pending);
            self.abort(id, reason);
            return;
        }
        if let Some(hook) = &self.setup.on_complete
            && let Err(e) = hook(id, &folder)
        {
            let reason = format!("{e:#}");
            self.pending.insert(id, pending);
            self.abort(id, reason);
            return;
        }
        // The whole state includes what ended tasks keep (carried over, written before).
        let full_bytes = acks.iter().map(|a| a.full_bytes).sum();
        for ack in acks.into_iter().filter(|a| a.finished) {
            self.final_acks.insert(ack.task, ack);
        }
        crate::failpoint!(crash "checkpoint::after-metadata");
        let duration = pending.triggered.elapsed();
        let completed = CompletedCheckpoint {
            triggered_ms: now_millis() - duration.as_millis() as i64,
            id,
            kind,
            path: folder.clone(),
            duration,
            max_sync: pending
                .acks
                .iter()
                .map(|a| a.sync_duration)
                .max()
                .unwrap_or_default(),
            bytes: pending.acks.iter().map(|a| a.bytes).sum(),
            files: pending.acks.iter().map(|a| a.files).sum(),
            full_bytes,
            max_async: pending
                .acks
                .iter()
                .map(|a| a.async_duration)
                .max()
                .unwrap_or_default(),
            records_committed,
        };
        tracing::info!(
            "completed {} {id} in {:?} ({} bytes written, {} in all)",
            if kind == SnapshotKind::Savepoint {
                "savepoint"
            } else {
                "checkpoint"
            },
            completed.duration,
            completed.bytes,
            completed.full_bytes
        );
        self.last_completion = Some(Instant::now());
        for old in subsumed_by(&self.pending, id) {
            self.abort_quietly(old, format!("subsumed by checkpoint {id}"));
        }
        // Whoever asked for a savepoint hears of it before the tasks do: a
        // stop-with-savepoint ends the tasks as soon as they are notified.
        if let Some(reply) = &pending.reply {
            let _ = reply.send(Ok(folder.clone()));
        }
        for task in &self.setup.tasks {
            let _ = task.notify_complete(id);
        }
        let in_flight: Vec<u64> = self.pending.keys().copied().collect();
        if kind == SnapshotKind::Checkpoint
            && let Err(e) = self.setup.storage.retain(
                self.setup.settings.retain,
                self.setup.protect.as_deref(),
                &in_flight,
            )
        {
            tracing::warn!("retention of checkpoints failed: {e:#}");
        }
        self.stats.lock().completed.push(completed);
    }

    /// Adds to `acks` what the newest completed checkpoint has of the tasks that ended
    /// since, linking their state files into `folder` (they stay restorable after that
    /// checkpoint is deleted by retention).
    fn carry_ended_tasks(&self, folder: &Path, acks: &mut Vec<Acknowledgement>) -> Result<()> {
        for (task, last) in &self.final_acks {
            if !self.finished.contains(task) || acks.iter().any(|a| a.task == *task) {
                continue;
            }
            std::fs::create_dir_all(folder)?;
            for h in &last.handles {
                let (from, to) = (last.folder.join(&h.file), folder.join(&h.file));
                if std::fs::hard_link(&from, &to).is_err() {
                    // Durable before the metadata names it (which syncs the folder).
                    std::fs::copy(&from, &to)
                        .and_then(|_| std::fs::File::open(&to)?.sync_all())
                        .with_context(|| {
                            format!("copying {} to {}", from.display(), to.display())
                        })?;
                }
            }
            acks.push(Acknowledgement {
                folder: folder.to_path_buf(),
                ..last.clone()
            });
        }
        Ok(())
    }

    /// Aborts a checkpoint that failed (declined, timed out): logged as a warning.
    fn abort(&mut self, id: u64, reason: String) {
        self.abort_with(id, reason, false);
    }

    /// Aborts a checkpoint for an expected reason (subsumed, the job is ending).
    fn abort_quietly(&mut self, id: u64, reason: String) {
        self.abort_with(id, reason, true);
    }

    fn abort_with(&mut self, id: u64, reason: String, expected: bool) {
        let Some(pending) = self.pending.remove(&id) else {
            return;
        };
        if expected {
            tracing::debug!("checkpoint {id} aborted: {reason}");
        } else {
            tracing::warn!("checkpoint {id} aborted: {reason}");
        }
        self.setup
            .storage
            .discard(&self.setup.storage.folder(id, pending.snapshot_kind()));
        for task in &self.setup.tasks {
            let _ = task.notify_aborted(id);
        }
        if let Some(reply) = pending.reply {
            let _ = reply.send(Err(reason.clone()));
        }
        self.stats.lock().aborted.push((id, reason));
    }

    fn shutdown(mut self) {
        let ids: Vec<u64> = self.pending.keys().copied().collect();
        for id in ids {
            self.abort_quietly(id, "the job ended".into());
        }
    }
}

#[cfg(test)]
mod tests;
