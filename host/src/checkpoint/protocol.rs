//! What tasks and the checkpoint coordinator (in `job::coordinator`) tell each other: a
//! task's acknowledgement of its part of a checkpoint, declines, the end of its input
//! and of the task, and requests for savepoints.

use std::path::PathBuf;
use std::time::Duration;

use crossbeam_channel::Sender;

use super::snapshot::{StateHandle, TaskId};

/// A task's report that its part of a checkpoint is written.
#[derive(Debug, Clone)]
pub struct Acknowledgement {
    /// Checkpoint id.
    pub id: u64,
    /// The task.
    pub task: TaskId,
    /// The source's position, for source tasks.
    pub source_position: Option<Vec<u8>>,
    /// Taken after the task's input ended (its operators finished).
    pub finished: bool,
    /// The folder the files were written to.
    pub folder: PathBuf,
    /// The files written.
    pub handles: Vec<StateHandle>,
    /// How long the task thread spent in the synchronous part.
    pub sync_duration: Duration,
    /// How long writing took.
    pub async_duration: Duration,
    /// Bytes written: its state files, and the shared files it copied.
    pub bytes: u64,
    /// Files written: its state files, and the shared files it copied.
    pub files: u32,
    /// Bytes of the whole state: its state files and every shared file they name.
    pub full_bytes: u64,
    /// Records the task's sinks had taken in at the barrier, in this attempt: what they
    /// commit when the checkpoint completes.
    pub sink_records: u64,
}

/// What reaches the coordinator.
#[derive(Debug)]
pub enum CoordinatorMessage {
    /// A task finished its part of a checkpoint.
    Ack(Acknowledgement),
    /// A task cannot take a checkpoint.
    Decline {
        /// Checkpoint id.
        id: u64,
        /// The task.
        task: TaskId,
        /// Why.
        reason: String,
    },
    /// A task's input ended; it waits for its final checkpoint.
    InputEnded(TaskId),
    /// A task ended; it will acknowledge nothing more.
    TaskFinished(TaskId),
    /// Take a savepoint now; with `stop` the job finishes once it completes.
    TriggerSavepoint {
        /// Stop the job after the savepoint.
        stop: bool,
        /// Advance event time to the end first.
        drain: bool,
        /// Gets the savepoint's folder, or why it failed.
        reply: Sender<Result<PathBuf, String>>,
    },
    /// The job is over.
    Shutdown,
}
