//! Failpoints at the steps of the checkpoint protocol, for fault-injection tests.
//!
//! Compiled in only with the `failpoints` feature (the test suite enables it); otherwise
//! [`failpoint!`](crate::failpoint) expands to nothing. A test sets the `FAILPOINTS`
//! environment variable of a `sluice` process, e.g.
//! `FAILPOINTS="checkpoint::after-metadata=1*off->return(abort)"`: `return(abort)`
//! aborts the process at that point (a crash), `return(stop)` stops it there (SIGSTOP:
//! a host frozen at that step until the test continues it with SIGCONT),
//! `return(enospc)` makes the step fail as a full disk does (`No space left on
//! device`), and `return(MESSAGE)` makes the step fail with MESSAGE (an error the job
//! recovers from by a restart).
//!
//! | failpoint | where |
//! |---|---|
//! | `task::after-operator-snapshot` | a task took its operators' snapshots, before writing them |
//! | `sink::after-pre-commit` | the file sink sealed a checkpoint's output |
//! | `checkpoint::after-metadata` | a checkpoint's metadata is written, before any task hears of it |
//! | `sink::commit` | the file sink appended one sealed file, before deleting it |
//! | `restore::after-sink-recovery` | a restored file sink recovered its output |
//! | `savepoint::synchronous-loop` | a task waits for its stop-with-savepoint to complete |
//! | `checkpoint::final` | a finished task took part in its final checkpoint |
//! | `checkpoint::write-state` | a task's state file of a checkpoint is about to be written |
//! | `checkpoint::write-metadata` | a checkpoint's metadata is about to be written |
//! | `checkpoint::before-state-link` | a RocksDB state's switched memtable is flushed, before its files are linked for a checkpoint |
//! | `checkpoint::upload-state-file` | a RocksDB state's table file is about to be copied into the checkpoints' shared folder |
//! | `checkpoint::release-shared-files` | old checkpoints were deleted, before the shared files only they named are |
//! | `sink::write` | the file sink is about to write a batch to its in-progress file |
//! | `sink::append` | the file sink is about to append a sealed file to its output |
//! | `kafka-source::topic-metadata` | a Kafka source read the cluster's topics: `return(TOPIC)` makes it see TOPIC reported with an error |
//! | `kafka-sink::open` | a Kafka sink opens, before it fences (or takes the producer its unit fenced with) |
//! | `kafka-sink::before-commit` | a Kafka sink sent a checkpoint's records and marker, before committing |
//! | `kafka-sink::after-commit` | a Kafka sink committed a checkpoint's transaction |
//! | `kafka-sink::sent-ahead` | a Kafka sink's committer sent records into a transaction whose checkpoint is not complete yet, once an earlier one completed |
//! | `cluster::after-upload` | a unit copied a checkpoint to the store, before its transaction names it |
//! | `cluster::after-fence` | a unit's new owner fenced the earlier ones, before reading the marker |
//! | `cluster::during-download` | a new owner copied one file of the checkpoint it restores |
//! | `cluster::after-delete-attempts` | a new owner deleted the earlier attempts' checkpoints, before it runs |
//! | `worker::report` | a server's worker process reports its jobs: `return(TENANT)` aborts TENANT's worker once one of its jobs completed a checkpoint |

/// Sets up the failpoints named in `FAILPOINTS` (a no-op without the feature). Call
/// once, at the start of the process.
pub fn setup() {
    #[cfg(feature = "failpoints")]
    std::mem::forget(fail::FailScenario::setup());
}

/// What a triggered failpoint does: abort the process, stop it until it is continued
/// (then nothing), or an error to return.
pub fn triggered(name: &str, arg: Option<String>) -> Option<anyhow::Error> {
    match arg.as_deref() {
        None | Some("abort") => {
            eprintln!("failpoint {name}: aborting the process");
            std::process::abort()
        }
        Some("enospc") => Some(
            anyhow::Error::from(std::io::Error::from_raw_os_error(28))
                .context(format!("failpoint {name}")),
        ),
        Some("stop") => {
            eprintln!("failpoint {name}: stopping the process");
            if let Err(e) = signal_hook::low_level::raise(signal_hook::consts::SIGSTOP) {
                eprintln!("failpoint {name}: cannot stop the process: {e}");
            }
            eprintln!("failpoint {name}: continued");
            None
        }
        Some(message) => Some(anyhow::anyhow!("failpoint {name}: {message}")),
    }
}

/// What failpoint `name` was triggered with (`return(ARG)`), for a step that a test
/// breaks in a way of its own rather than with an error; `None` when it is off, and
/// always without the feature.
pub fn argument(name: &str) -> Option<String> {
    #[cfg(feature = "failpoints")]
    return fail::eval(name, |arg| arg).flatten();
    #[cfg(not(feature = "failpoints"))]
    {
        let _ = name;
        None
    }
}

/// A failpoint named after the protocol step it breaks (see the module docs). In a
/// function returning `Result<_, E>` where `E: From<anyhow::Error>`; with `crash` before
/// the name, anywhere (there `return(MESSAGE)` is only logged).
#[macro_export]
macro_rules! failpoint {
    ($name:literal) => {
        #[cfg(feature = "failpoints")]
        if let Some(Some(e)) = fail::eval($name, |arg| $crate::failpoints::triggered($name, arg)) {
            return Err(e.into());
        }
    };
    (crash $name:literal) => {
        #[cfg(feature = "failpoints")]
        if let Some(Some(e)) = fail::eval($name, |arg| $crate::failpoints::triggered($name, arg)) {
            tracing::warn!("{e}");
        }
    };
}
