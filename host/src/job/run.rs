//! What a run of a job is asked to do and how it ends: where it starts, the requests
//! a running job takes, and its outcome.

use std::path::PathBuf;

use crossbeam_channel::Sender;

/// Where a job starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestorePoint {
    /// From scratch. Refused when the job has run before (it has checkpoints or
    /// output), unless [`RunOptions::move_aside`] is set.
    Fresh,
    /// From the newest complete checkpoint or savepoint in the job's checkpoint directory.
    Latest,
    /// From this checkpoint or savepoint folder.
    Path(PathBuf),
}

/// How a run starts and what it may do to what earlier runs left.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunOptions {
    /// Where it starts.
    pub restore: RestorePoint,
    /// With [`RestorePoint::Fresh`]: move the checkpoints and output of earlier runs
    /// aside (to `NAME.N`) instead of refusing to start.
    pub move_aside: bool,
    /// Restore a checkpoint older than the committed output, keeping the output as it
    /// was as a new file generation.
    pub allow_rewind: bool,
    /// Restore a checkpoint with state of sources or operators the job no longer has
    /// (that state is dropped).
    pub allow_non_restored_state: bool,
}

impl From<RestorePoint> for RunOptions {
    fn from(restore: RestorePoint) -> Self {
        RunOptions {
            restore,
            move_aside: false,
            allow_rewind: false,
            allow_non_restored_state: false,
        }
    }
}

/// Requests to a running job.
#[derive(Debug)]
pub enum JobControl {
    /// Take a savepoint, then finish; `drain` first advances event time to the end.
    StopWithSavepoint {
        /// Fire all event-time timers first.
        drain: bool,
        /// Gets the savepoint folder, or why it failed.
        reply: Sender<Result<PathBuf, String>>,
    },
    /// Take a savepoint and go on running.
    Savepoint {
        /// Gets the savepoint folder, or why it failed.
        reply: Sender<Result<PathBuf, String>>,
    },
    /// Stop now, without a savepoint.
    Cancel,
}

/// How a job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobOutcome {
    /// The input ended and everything was committed.
    Finished,
    /// Stopped with a savepoint.
    Stopped {
        /// The savepoint folder.
        savepoint: PathBuf,
    },
    /// Cancelled.
    Cancelled,
}
