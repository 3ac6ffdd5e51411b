//! What the server (or a `sluice run` of several tenants' jobs) and a worker process
//! say to each other: typed messages, each a frame of a little-endian `u32` length and
//! its postcard bytes, over the worker's stdin (to the worker) and its file descriptor
//! [`REPORTS_FD`] (from it). Records never cross; control, metrics, log lines and ends do.

use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::path::PathBuf;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::job::{JobOutcome, MonitorSnapshot, RunOptions};

/// The largest frame either side accepts: a snapshot of a job with many tasks and
/// counters is well below; anything larger is a broken or hostile peer.
pub const MAX_FRAME: usize = 64 << 20;

/// The worker's file descriptor for its reports: not its stdout, which stays what it is
/// (a `stdout` sink of a `sluice run` job writes there).
pub const REPORTS_FD: i32 = 3;

/// From the server to a worker.
#[derive(Debug, Serialize, Deserialize)]
pub enum ToWorker {
    /// Run a job of the worker's tenant.
    Start {
        /// Job id.
        job: String,
        /// What it is.
        source: JobSource,
        /// Where it starts.
        options: RunOptions,
    },
    /// Control a running job; `request` comes back with the answer.
    Control {
        /// Job id.
        job: String,
        /// Matches the [`FromWorker::Answer`].
        request: u64,
        /// What to do.
        control: Control,
    },
}

/// Where a worker finds a job.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum JobSource {
    /// A server's job: the worker builds it from the server's registry as the server
    /// does, from the job file as submitted, in `dir`, and its operators' plugins by
    /// their SHA-256.
    Registry {
        /// The job file as submitted.
        text: String,
        /// The job's folder in the registry.
        dir: PathBuf,
        /// Each operator's plugin, by SHA-256.
        plugins: BTreeMap<String, String>,
    },
    /// A job file of a `sluice run`, loaded (and its run locked) by the worker as
    /// `sluice run` does.
    File(PathBuf),
}

/// What a server asks of a job in a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Control {
    /// Take a savepoint, then finish; `drain` first fires all event-time timers.
    StopWithSavepoint {
        /// Fire all event-time timers first.
        drain: bool,
    },
    /// Take a savepoint and go on running.
    Savepoint,
    /// Stop now, without a savepoint.
    Cancel,
}

/// From a worker to the server.
#[derive(Debug, Serialize, Deserialize)]
pub enum FromWorker {
    /// How a job is doing (sent a few times a second while it runs).
    Monitor {
        /// Job id.
        job: String,
        /// Its monitor.
        snapshot: MonitorSnapshot,
    },
    /// A log line of a job, for `GET /v1/jobs/ID/logs`.
    Log {
        /// Job id.
        job: String,
        /// The line.
        line: String,
    },
    /// The answer to a [`ToWorker::Control`] that takes a savepoint: its folder, or why
    /// it failed.
    Answer {
        /// Job id.
        job: String,
        /// The request answered.
        request: u64,
        /// The savepoint folder, or why there is none.
        result: Result<PathBuf, String>,
    },
    /// A job ended: how, or why it failed (its restarts inside the worker are over).
    Ended {
        /// Job id.
        job: String,
        /// Its outcome, or why it failed.
        result: Result<JobOutcome, JobFailure>,
        /// Its monitor at the end.
        snapshot: MonitorSnapshot,
    },
}

/// Why a job in a worker failed: its error as text, and the status `sluice run` exits
/// with for it (a refused start, a bad file, a failed job).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobFailure {
    /// The error, with its causes.
    pub message: String,
    /// `sluice run`'s exit status for it.
    pub exit: u8,
}

impl JobFailure {
    /// The failure `error` is.
    pub fn of(error: &anyhow::Error) -> JobFailure {
        JobFailure {
            message: format!("{error:#}"),
            exit: crate::cli::exit::Exit::of(error).code(),
        }
    }
}

impl std::fmt::Display for JobFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for JobFailure {}

/// Writes one message as a frame and flushes it.
pub fn write_frame<T: Serialize>(out: &mut impl Write, message: &T) -> io::Result<()> {
    let bytes = postcard::to_stdvec(message).map_err(io::Error::other)?;
    if bytes.len() > MAX_FRAME {
        return Err(io::Error::other(format!(
            "a message of {} bytes is larger than a frame may be ({MAX_FRAME})",
            bytes.len()
        )));
    }
    out.write_all(&(bytes.len() as u32).to_le_bytes())?;
    out.write_all(&bytes)?;
    out.flush()
}

/// Reads one frame's message; `Ok(None)` at the end of the stream between frames.
pub fn read_frame<T: DeserializeOwned>(input: &mut impl Read) -> io::Result<Option<T>> {
    let mut len = [0u8; 4];
    match input.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("a frame of {len} bytes is larger than a frame may be ({MAX_FRAME})"),
        ));
    }
    let mut bytes = vec![0u8; len];
    input.read_exact(&mut bytes)?;
    postcard::from_bytes(&bytes)
        .map(Some)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_cross_as_frames_and_an_oversized_or_cut_frame_is_an_error() {
        let mut pipe = Vec::new();
        write_frame(
            &mut pipe,
            &ToWorker::Control {
                job: "j".into(),
                request: 7,
                control: Control::StopWithSavepoint { drain: true },
            },
        )
        .unwrap();
        write_frame(
            &mut pipe,
            &FromWorker::Ended {
                job: "j".into(),
                result: Ok(JobOutcome::Finished),
                snapshot: MonitorSnapshot::default(),
            },
        )
        .unwrap();
        let mut input = &pipe[..];
        match read_frame::<ToWorker>(&mut input).unwrap() {
            Some(ToWorker::Control {
                job,
                request: 7,
                control: Control::StopWithSavepoint { drain: true },
            }) => assert_eq!(job, "j"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            read_frame::<FromWorker>(&mut input).unwrap(),
            Some(FromWorker::Ended {
                result: Ok(JobOutcome::Finished),
                ..
            })
        ));
        assert!(read_frame::<FromWorker>(&mut input).unwrap().is_none());
        // A length beyond the bound is refused before anything is allocated for it.
        let huge = ((MAX_FRAME + 1) as u32).to_le_bytes();
        let err = read_frame::<FromWorker>(&mut &huge[..]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        // A frame cut short is an error, not an end.
        let cut = &pipe[..pipe.len() - 1];
        let mut input = cut;
        read_frame::<ToWorker>(&mut input).unwrap();
        assert!(read_frame::<FromWorker>(&mut input).is_err());
    }
}
