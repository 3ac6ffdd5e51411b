//! What a run of a job is asked to do and how it ends: where it starts, the requests
//! a running job takes, and its outcome.

use std::fmt;
use std::path::PathBuf;

use crossbeam_channel::Sender;

/// Where a job starts.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RunOptions {
    /// Where it starts.
    pub restore: RestorePoint,
    /// With [`RestorePoint::Fresh`]: move the checkpoints and output of earlier runs
    /// aside (to `NAME.N`) instead of refusing to start.
    pub move_aside: bool,
    /// Restore a checkpoint older than the committed output, keeping the output as it
    /// was as a new file generation (a file sink's), or as it is while the records
    /// after the checkpoint are written again (a Kafka topic's).
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
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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

/// A run that may not start as asked, and nothing was changed: the job ran before and
/// the run neither resumes nor starts over, the checkpoint to restore does not fit the
/// job or would take back committed output, or the tenant's instances are in use. The
/// message says what was found and what would let the run start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartRefused(pub String);

impl fmt::Display for StartRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for StartRefused {}

/// A job that failed and was not restarted again: its restart strategy was spent, or
/// the failure was one a restart cannot fix. Its cause is the last attempt's failure.
#[derive(Debug)]
pub struct JobFailed {
    /// The job's name.
    pub job: String,
    /// Restarts before the last attempt.
    pub restarts: u32,
    /// Why the last attempt failed.
    pub cause: anyhow::Error,
}

impl fmt::Display for JobFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.restarts {
            0 => write!(f, "job '{}' failed", self.job),
            n => write!(f, "job '{}' failed after {n} restarts", self.job),
        }
    }
}

impl std::error::Error for JobFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.cause.as_ref())
    }
}
