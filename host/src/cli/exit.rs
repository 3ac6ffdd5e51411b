//! How `sluice` exits: the one table of exit statuses, and which errors call for which.
//!
//! The numbers follow `sysexits.h` where one fits, so that scripts and service managers
//! can tell what to do about a failure without reading its message. `sluice --help` and
//! docs/cli.md show the same table.

use std::fmt;
use std::process::ExitCode;

use crate::chain::{CallError, OperatorFailure};
use crate::cluster::gc::StillRunning;
use crate::job::{InUse, JobFailed, StartRefused};
use crate::server::worker::Quarantined;
use crate::server::worker::protocol::JobFailure;

/// An exit status of `sluice`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(into = "u8")]
pub enum Exit {
    /// The command did what it was asked: the jobs finished, or stopped with a savepoint.
    Success,
    /// Any other error.
    Failure,
    /// Wrong arguments (clap's usage errors exit with it too).
    Usage,
    /// A job, host or plugin file that does not parse or validate (`EX_DATAERR`).
    BadInput,
    /// Nothing answers: no server at `--server`, no running job for `sluice savepoint`
    /// (`EX_UNAVAILABLE`).
    Unavailable,
    /// A job failed past its restarts (`EX_SOFTWARE`).
    JobFailed,
    /// A start (or `cluster gc`) was refused and nothing was changed; it can succeed
    /// later or with other flags (`EX_TEMPFAIL`).
    Refused,
    /// Cancelled (128 + SIGINT).
    Cancelled,
}

impl Exit {
    /// Every status, in the order of their codes.
    pub const ALL: [Exit; 8] = [
        Exit::Success,
        Exit::Failure,
        Exit::Usage,
        Exit::BadInput,
        Exit::Unavailable,
        Exit::JobFailed,
        Exit::Refused,
        Exit::Cancelled,
    ];

    /// The number the process exits with.
    pub fn code(self) -> u8 {
        match self {
            Exit::Success => 0,
            Exit::Failure => 1,
            Exit::Usage => 2,
            Exit::BadInput => 65,
            Exit::Unavailable => 69,
            Exit::JobFailed => 70,
            Exit::Refused => 75,
            Exit::Cancelled => 130,
        }
    }

    /// What it means, in a few words.
    pub fn meaning(self) -> &'static str {
        match self {
            Exit::Success => "success",
            Exit::Failure => "any other error",
            Exit::Usage => "wrong arguments",
            Exit::BadInput => "a bad job, host or plugin file",
            Exit::Unavailable => "no server (or running job) answers",
            Exit::JobFailed => "a job failed past its restarts",
            Exit::Refused => "a start or a clean-up was refused, nothing was changed",
            Exit::Cancelled => "cancelled",
        }
    }

    /// The status `error` calls for. A configuration an operator refuses is a bad
    /// file wherever it shows (in `validate`, or in a run that fails at once); else the
    /// outermost cause that says what happened decides: a job that failed, a refused
    /// start, a marked error, a server that does not answer.
    pub fn of(error: &anyhow::Error) -> Exit {
        if error.chain().any(is_invalid_config) {
            return Exit::BadInput;
        }
        error
            .chain()
            .find_map(|cause| {
                if let Some(marked) = cause.downcast_ref::<Marked>() {
                    Some(marked.exit)
                } else if let Some(failure) = cause.downcast_ref::<JobFailure>() {
                    // A job of a `sluice run` that failed in a worker process.
                    Exit::ALL.into_iter().find(|e| e.code() == failure.exit)
                } else if cause.is::<JobFailed>() || cause.is::<Quarantined>() {
                    Some(Exit::JobFailed)
                } else if cause.is::<StartRefused>()
                    || cause.is::<InUse>()
                    || cause.is::<StillRunning>()
                {
                    Some(Exit::Refused)
                } else {
                    cause
                        .downcast_ref::<ureq::Error>()
                        .filter(|e| is_unreachable(e))
                        .map(|_| Exit::Unavailable)
                }
            })
            .unwrap_or(Exit::Failure)
    }

    /// The table for `sluice --help`.
    pub fn help() -> String {
        let mut text = String::from("Exit status:\n");
        for exit in Exit::ALL {
            text.push_str(&format!("  {:>3}  {}\n", exit.code(), exit.meaning()));
        }
        text
    }
}

impl From<Exit> for u8 {
    fn from(exit: Exit) -> u8 {
        exit.code()
    }
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        ExitCode::from(exit.code())
    }
}

fn is_invalid_config(cause: &(dyn std::error::Error + 'static)) -> bool {
    let invalid = |e: &CallError| matches!(e, CallError::InvalidConfig(_));
    cause.downcast_ref::<CallError>().is_some_and(invalid)
        || cause
            .downcast_ref::<OperatorFailure>()
            .is_some_and(|f| invalid(&f.error))
}

/// Whether a request failed because nothing answered at the address (or the answer
/// could not be trusted), rather than because of what was asked.
fn is_unreachable(e: &ureq::Error) -> bool {
    matches!(
        e,
        ureq::Error::Io(_)
            | ureq::Error::Timeout(_)
            | ureq::Error::HostNotFound
            | ureq::Error::ConnectionFailed
            | ureq::Error::Tls(_)
            | ureq::Error::Rustls(_)
    )
}

/// An error marked with the status it calls for, its message and causes as they were.
#[derive(Debug)]
struct Marked {
    exit: Exit,
    error: anyhow::Error,
}

impl fmt::Display for Marked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Only the outermost message: its causes follow through `source`.
        write!(f, "{}", self.error)
    }
}

impl std::error::Error for Marked {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error.source()
    }
}

/// Marks `error` with `exit`.
pub(super) fn mark(exit: Exit, error: anyhow::Error) -> anyhow::Error {
    Marked { exit, error }.into()
}

/// Marks an error of reading a file the user wrote (a job, host or plugin file).
pub(crate) fn bad_input(error: anyhow::Error) -> anyhow::Error {
    mark(Exit::BadInput, error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::{Context, anyhow};

    #[test]
    fn each_status_has_its_own_code() {
        let codes: std::collections::BTreeSet<u8> = Exit::ALL.iter().map(|e| e.code()).collect();
        assert_eq!(codes.len(), Exit::ALL.len());
        assert!(Exit::ALL.windows(2).all(|w| w[0].code() < w[1].code()));
    }

    #[test]
    fn a_marked_error_reads_as_before_and_keeps_its_mark_under_context() {
        let error = anyhow!("line 3: no such key").context("job.toml");
        let marked = bad_input(error).context("loading");
        assert_eq!(
            format!("{marked:#}"),
            "loading: job.toml: line 3: no such key"
        );
        assert_eq!(Exit::of(&marked), Exit::BadInput);
    }

    #[test]
    fn the_outermost_cause_decides() {
        let refused = anyhow::Error::from(StartRefused("ran before".into()));
        assert_eq!(Exit::of(&refused), Exit::Refused);
        let failed = anyhow::Error::from(JobFailed {
            job: "j".into(),
            restarts: 2,
            cause: anyhow!("trap").context("task a"),
        });
        assert_eq!(
            format!("{failed:#}"),
            "job 'j' failed after 2 restarts: task a: trap"
        );
        assert_eq!(Exit::of(&failed), Exit::JobFailed);
        let unreachable = Err::<(), _>(ureq::Error::ConnectionFailed)
            .context("GET http://127.0.0.1:9/jobs")
            .unwrap_err();
        assert_eq!(Exit::of(&unreachable), Exit::Unavailable);
        let refused_by_server = Err::<(), _>(ureq::Error::StatusCode(429))
            .context("POST /jobs")
            .unwrap_err();
        assert_eq!(Exit::of(&refused_by_server), Exit::Failure);
        assert_eq!(Exit::of(&anyhow!("something else")), Exit::Failure);
    }

    #[test]
    fn a_configuration_an_operator_refuses_is_a_bad_file_even_in_a_failed_run() {
        let failed = anyhow::Error::from(JobFailed {
            job: "j".into(),
            restarts: 0,
            cause: anyhow::Error::from(CallError::InvalidConfig("min-length".into()))
                .context("open"),
        });
        assert_eq!(Exit::of(&failed), Exit::BadInput);
    }
}
