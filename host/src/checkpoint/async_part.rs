//! The asynchronous part of a checkpoint: writing a task's snapshot to storage on a
//! worker thread while the task goes on processing.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{Sender, unbounded};

use super::protocol::{Acknowledgement, CoordinatorMessage};
use super::snapshot::{OperatorSnapshot, TaskId};
use super::storage::{CheckpointStorage, SnapshotKind};
use crate::network::Barrier;

const RUNNING: u8 = 0;
const COMPLETED: u8 = 1;
const DISCARDED: u8 = 2;

/// A fixed pool of threads for asynchronous checkpoint parts, shared by one attempt's
/// tasks.
///
/// Dropping the pool waits for its writers to end: a part still being written after
/// its attempt failed would otherwise go on writing (or deleting, once discarded) in a
/// checkpoint folder that the next attempt may be using.
pub struct AsyncPool {
    tx: Option<Sender<Box<dyn FnOnce() + Send>>>,
    workers: Vec<thread::JoinHandle<()>>,
}

impl AsyncPool {
    /// A pool of `threads` workers.
    pub fn new(threads: usize) -> Self {
        let (tx, rx) = unbounded::<Box<dyn FnOnce() + Send>>();
        let workers = (0..threads.max(1))
            .map(|i| {
                let rx = rx.clone();
                thread::Builder::new()
                    .name(format!("checkpoint writer {i}"))
                    .spawn(move || {
                        for job in rx {
                            job();
                        }
                    })
                    .expect("spawning a checkpoint writer")
            })
            .collect();
        AsyncPool {
            tx: Some(tx),
            workers,
        }
    }

    pub(crate) fn submit(&self, job: Box<dyn FnOnce() + Send>) {
        // The workers live as long as the pool; a send only fails after they exited.
        if let Some(tx) = &self.tx {
            let _ = tx.send(job);
        }
    }
}

impl Drop for AsyncPool {
    fn drop(&mut self) {
        // Without a sender the workers end once the parts queued are written.
        self.tx = None;
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}

/// The state of one asynchronous part: it ends COMPLETED (acknowledged) or DISCARDED
/// (its files deleted), exactly once, whichever of finishing and discarding comes first.
#[derive(Debug, Clone)]
pub struct AsyncPartHandle {
    state: Arc<AtomicU8>,
}

impl AsyncPartHandle {
    /// Discards the part if it is still running; it will not acknowledge. Returns
    /// whether this call discarded it.
    pub fn discard(&self) -> bool {
        self.state
            .compare_exchange(RUNNING, DISCARDED, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    /// True once completed or discarded.
    pub fn is_done(&self) -> bool {
        self.state.load(Ordering::SeqCst) != RUNNING
    }

    /// True when it completed (was acknowledged).
    pub fn is_completed(&self) -> bool {
        self.state.load(Ordering::SeqCst) == COMPLETED
    }
}

/// What a task needs to take part in checkpoints.
#[derive(Clone)]
pub struct CheckpointLink {
    coordinator: Sender<CoordinatorMessage>,
    storage: Arc<CheckpointStorage>,
    pool: Arc<AsyncPool>,
}

impl CheckpointLink {
    /// A link reporting to `coordinator`, writing to `storage` on `pool`.
    pub fn new(
        coordinator: Sender<CoordinatorMessage>,
        storage: Arc<CheckpointStorage>,
        pool: Arc<AsyncPool>,
    ) -> Self {
        CheckpointLink {
            coordinator,
            storage,
            pool,
        }
    }

    /// Tells the coordinator that `task`'s input ended: it waits for its final checkpoint.
    pub fn input_ended(&self, task: TaskId) {
        let _ = self.coordinator.send(CoordinatorMessage::InputEnded(task));
    }

    /// Tells the coordinator that `task` declines checkpoint `id`.
    pub fn decline(&self, id: u64, task: TaskId, reason: String) {
        let _ = self
            .coordinator
            .send(CoordinatorMessage::Decline { id, task, reason });
    }

    /// Starts writing `operators` (and the source position) for checkpoint `barrier`,
    /// taken in `sync_duration` on the task thread (`finished`: after the task's input
    /// ended; `sink_records`: what its sinks had taken in at the barrier). The part
    /// acknowledges when done, or declines when writing fails.
    #[allow(clippy::too_many_arguments)]
    pub fn start_async_part(
        &self,
        barrier: Barrier,
        task: TaskId,
        sync_duration: Duration,
        source_position: Option<Vec<u8>>,
        operators: Vec<OperatorSnapshot>,
        finished: bool,
        sink_records: u64,
    ) -> AsyncPartHandle {
        let handle = AsyncPartHandle {
            state: Arc::new(AtomicU8::new(RUNNING)),
        };
        let state = handle.clone();
        let storage = self.storage.clone();
        let coordinator = self.coordinator.clone();
        let kind = SnapshotKind::from(barrier.kind);
        self.pool.submit(Box::new(move || {
            let start = Instant::now();
            let folder = storage.folder(barrier.id, kind);
            let mut handles = Vec::with_capacity(operators.len());
            let (mut written, mut files) = (0, 0);
            let mut failure = None;
            for op in &operators {
                match storage.write_operator_state(&folder, kind, op, task.subtask) {
                    Ok((h, w)) => {
                        handles.push(h);
                        written += w.bytes;
                        files += w.files;
                    }
                    Err(e) => {
                        failure = Some(e);
                        break;
                    }
                }
            }
            let remove_files = |handles: &[super::StateHandle]| {
                for h in handles {
                    let _ = std::fs::remove_file(folder.join(&h.file));
                }
            };
            match failure {
                None if state
                    .state
                    .compare_exchange(RUNNING, COMPLETED, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok() =>
                {
                    // The whole state: its files and every shared file they name.
                    let full_bytes = handles
                        .iter()
                        .map(|h| h.size + h.shared.iter().map(|(_, size)| size).sum::<u64>())
                        .sum();
                    let _ = coordinator.send(CoordinatorMessage::Ack(Acknowledgement {
                        id: barrier.id,
                        task,
                        source_position,
                        finished,
                        folder,
                        handles,
                        sync_duration,
                        async_duration: start.elapsed(),
                        bytes: written,
                        files,
                        full_bytes,
                        sink_records,
                    }));
                }
                None => {
                    tracing::debug!(
                        "asynchronous part of checkpoint {} for {task:?} discarded",
                        barrier.id
                    );
                    remove_files(&handles);
                }
                Some(e) => {
                    remove_files(&handles);
                    if state.discard() {
                        let _ = coordinator.send(CoordinatorMessage::Decline {
                            id: barrier.id,
                            task,
                            reason: format!("writing the snapshot failed: {e:#}"),
                        });
                    }
                }
            }
        }));
        handle
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::network::CheckpointKind;
    use crate::timers::TimerQueues;
    use crossbeam_channel::bounded;

    /// A part still being written when its attempt ends must not go on writing (or
    /// deleting) while the next attempt runs: dropping the pool waits for it.
    #[test]
    fn dropping_the_pool_waits_for_the_parts_it_is_writing() {
        let pool = AsyncPool::new(2);
        let (started, wait_started) = bounded(2);
        let written = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        for _ in 0..2 {
            let (started, written) = (started.clone(), written.clone());
            pool.submit(Box::new(move || {
                started.send(()).unwrap();
                thread::sleep(Duration::from_millis(50));
                written.fetch_add(1, Ordering::SeqCst);
            }));
        }
        wait_started.recv().unwrap();
        drop(pool);
        assert_eq!(written.load(Ordering::SeqCst), 2);
    }

    fn link(
        name: &str,
    ) -> (
        CheckpointLink,
        crossbeam_channel::Receiver<CoordinatorMessage>,
        Arc<CheckpointStorage>,
        Arc<AsyncPool>,
    ) {
        let dir = std::env::temp_dir().join(format!("sluice-async-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let storage = Arc::new(CheckpointStorage::new(dir).unwrap());
        let pool = Arc::new(AsyncPool::new(1));
        let (tx, rx) = unbounded();
        (
            CheckpointLink::new(tx, storage.clone(), pool.clone()),
            rx,
            storage,
            pool,
        )
    }

    fn snapshot() -> Vec<OperatorSnapshot> {
        vec![OperatorSnapshot {
            operator: "op".into(),
            state: b"state".to_vec(),
            keyed: None,
            timers: TimerQueues::new(),
            watermark: i64::MIN,
        }]
    }

    fn barrier(id: u64) -> Barrier {
        Barrier {
            id,
            timestamp: 0,
            kind: CheckpointKind::Checkpoint,
        }
    }

    const TASK: TaskId = TaskId {
        vertex: 1,
        subtask: 0,
    };

    #[test]
    fn a_finished_part_acknowledges_with_its_files() {
        let (link, rx, storage, _pool) = link("ack");
        let part = link.start_async_part(
            barrier(3),
            TASK,
            Duration::ZERO,
            Some(vec![9]),
            snapshot(),
            false,
            12,
        );
        match rx.recv_timeout(Duration::from_secs(10)).unwrap() {
            CoordinatorMessage::Ack(ack) => {
                assert_eq!(
                    (ack.id, ack.task, ack.source_position, ack.sink_records),
                    (3, TASK, Some(vec![9]), 12)
                );
                // One state file per operator instance, and no table to copy.
                assert_eq!(
                    (ack.files, ack.handles.len() as u32),
                    (snapshot().len() as u32, snapshot().len() as u32)
                );
                let file = storage
                    .folder(3, SnapshotKind::Checkpoint)
                    .join(&ack.handles[0].file);
                assert_eq!(std::fs::metadata(file).unwrap().len(), ack.handles[0].size);
            }
            other => panic!("expected an ack, got {other:?}"),
        }
        assert!(part.is_completed());
        assert!(!part.discard(), "a completed part cannot be discarded");
    }

    #[test]
    fn a_discarded_part_never_acknowledges_and_leaves_no_files() {
        let (link, rx, storage, pool) = link("discard");
        // Hold the only worker so the part cannot start before it is discarded.
        let (release, wait) = bounded::<()>(0);
        pool.submit(Box::new(move || {
            let _ = wait.recv();
        }));
        let part =
            link.start_async_part(barrier(4), TASK, Duration::ZERO, None, snapshot(), false, 0);
        assert!(part.discard());
        release.send(()).unwrap();
        // The part runs after the discard: it writes, sees it was discarded, cleans up.
        let (done_tx, done_rx) = bounded(0);
        pool.submit(Box::new(move || done_tx.send(()).unwrap()));
        done_rx.recv().unwrap();
        assert!(rx.try_recv().is_err(), "a discarded part acknowledged");
        let folder = storage.folder(4, SnapshotKind::Checkpoint);
        let files = std::fs::read_dir(&folder).map(|d| d.count()).unwrap_or(0);
        assert_eq!(files, 0, "files left in {}", folder.display());
    }

    #[test]
    fn a_part_ends_exactly_once() {
        let h = AsyncPartHandle {
            state: Arc::new(AtomicU8::new(RUNNING)),
        };
        assert!(!h.is_done());
        assert!(h.discard());
        assert!(!h.discard());
        assert!(h.is_done());
        assert!(!h.is_completed());
    }
}
