//! The worker's side: `sluice worker` runs one tenant's jobs for the server that started
//! it, as the server would run them itself, and reports over its stdout.
//!
//! It takes stdout for the protocol (its own `stdout` writes go to stderr from then on),
//! installs its system-call filter, and then serves the server's messages until its
//! stdin closes (the server ended or let it go); jobs still running then are stopped
//! where they are, without a savepoint: the server resumes them from their checkpoints.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::PathBuf;
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use anyhow::{Context, Result};
use crossbeam_channel::{Receiver, Sender, bounded, unbounded};
use parking_lot::Mutex;

use super::protocol::{Control, FromWorker, ToWorker, read_frame, write_frame};
use crate::job::{JobControl, JobMonitor};
use crate::server::Server;
use crate::server::logs::{JOB_SPAN, JobLogs};
use crate::tenant::HostConfig;
use crate::wasm::WasmEngine;

/// How often a running job's monitor is reported; also the worker's heartbeat.
pub const REPORT_EVERY: Duration = Duration::from_millis(250);

/// Messages waiting to be written to the server; log lines beyond it are dropped (and
/// a job's own lines are bounded by its tenant's log rate).
const OUTBOX: usize = 10_000;

/// A job the worker runs.
struct Running {
    control: Sender<JobControl>,
    monitor: Arc<JobMonitor>,
    reported: Mutex<(u64, usize, usize)>,
}

/// Runs the worker of `tenant`: see the module docs.
pub fn run(host_config: PathBuf, tenant: &str, engine: Arc<WasmEngine>) -> Result<()> {
    abort_on_panic();
    let protocol = take_stdout()?;
    super::limits::deny_system_calls()?;
    let host = HostConfig::load(&host_config)?;
    let tenant = host.tenant(tenant)?;
    let server = Server::for_worker(host, engine);
    let (outbox, outgoing) = bounded::<FromWorker>(OUTBOX);
    let writer = thread::Builder::new()
        .name("worker reports".into())
        .spawn(move || write_reports(protocol, &outgoing))
        .context("starting the worker's report thread")?;
    let (logs, lines) = unbounded::<(String, String)>();
    JobLogs::global().forward_to(logs);
    let forward = outbox.clone();
    thread::Builder::new()
        .name("worker logs".into())
        .spawn(move || {
            for (job, line) in lines {
                let _ = forward.try_send(FromWorker::Log { job, line });
            }
        })
        .context("starting the worker's log thread")?;
    let jobs: Arc<Mutex<HashMap<String, Arc<Running>>>> = Arc::default();
    {
        let (jobs, outbox, tenant) = (jobs.clone(), outbox.clone(), tenant.name.clone());
        thread::Builder::new()
            .name("worker monitor".into())
            .spawn(move || report_monitors(&jobs, &outbox, &tenant))
            .context("starting the worker's monitor thread")?;
    }
    let mut stdin = BufReader::new(std::io::stdin().lock());
    while let Some(message) = read_frame::<ToWorker>(&mut stdin).context("reading the server")? {
        match message {
            ToWorker::Start {
                job,
                text,
                dir,
                mut plugins,
                options,
            } => {
                let (control, control_rx) = unbounded();
                let monitor = Arc::new(JobMonitor::default());
                let running = Arc::new(Running {
                    control,
                    monitor: monitor.clone(),
                    reported: Mutex::new((0, 0, 0)),
                });
                jobs.lock().insert(job.clone(), running);
                let (server, tenant, jobs, outbox) =
                    (server.clone(), tenant.clone(), jobs.clone(), outbox.clone());
                let spawned = thread::Builder::new()
                    .name(format!("job {job}"))
                    .spawn(move || {
                        let span = tracing::info_span!(JOB_SPAN, tenant = %tenant.name, job = %job);
                        let _span = span.entered();
                        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            server.run_here(
                                &tenant,
                                &text,
                                &dir,
                                &mut plugins,
                                options,
                                &control_rx,
                                &monitor,
                            )
                        }))
                        .unwrap_or_else(|panic| Err(crate::task::panic_to_error(panic)));
                        let mut since = (u64::MAX, 0, 0);
                        let snapshot = monitor.snapshot(&mut since);
                        jobs.lock().remove(&job);
                        // Blocking: an end is never dropped.
                        let _ = outbox.send(FromWorker::Ended {
                            job,
                            result: result.map_err(|e| format!("{e:#}")),
                            snapshot,
                        });
                    });
                if let Err(e) = spawned {
                    anyhow::bail!("starting a job's thread: {e}");
                }
            }
            ToWorker::Control {
                job,
                request,
                control,
            } => {
                let Some(running) = jobs.lock().get(&job).cloned() else {
                    continue;
                };
                match control {
                    Control::Cancel => {
                        let _ = running.control.send(JobControl::Cancel);
                    }
                    Control::Savepoint | Control::StopWithSavepoint { .. } => {
                        let (reply, answer) = unbounded();
                        let message = match control {
                            Control::StopWithSavepoint { drain } => {
                                JobControl::StopWithSavepoint { drain, reply }
                            }
                            _ => JobControl::Savepoint { reply },
                        };
                        let _ = running.control.send(message);
                        let outbox = outbox.clone();
                        thread::Builder::new()
                            .name(format!("job {job} savepoint"))
                            .spawn(move || answer_when_done(job, request, &answer, &outbox))
                            .context("starting a savepoint's thread")?;
                    }
                }
            }
        }
    }
    // The server is gone or let this worker go: jobs still running stop where they are.
    for running in jobs.lock().values() {
        let _ = running.control.send(JobControl::Cancel);
    }
    drop(outbox);
    drop(writer);
    Ok(())
}

/// A panic in a worker ends it: what panics in a worker is a bug or the worker's memory
/// running out (a thread or buffer that cannot be allocated), and either leaves it in a
/// state not worth keeping — a panic unwinding while allocations fail can even leave it
/// hung. The server sees it die, and starts its jobs again from their checkpoints in a
/// new one. The hook prints no backtrace: printing one allocates, and an allocation that
/// fails while it prints deadlocks the process instead of aborting it.
fn abort_on_panic() {
    std::panic::set_hook(Box::new(|info| {
        eprintln!("sluice worker: {info}; aborting the worker");
        std::process::abort();
    }));
}

/// Duplicates stdout for the protocol and points fd 1 at stderr, so that nothing else
/// written to stdout can break a frame.
fn take_stdout() -> Result<File> {
    let stdout = rustix::io::dup(rustix::stdio::stdout()).context("duplicating stdout")?;
    rustix::stdio::dup2_stdout(rustix::stdio::stderr()).context("pointing stdout at stderr")?;
    Ok(File::from(stdout))
}

/// Writes reports to the server until every sender is gone or the server stops reading.
fn write_reports(protocol: File, outgoing: &Receiver<FromWorker>) {
    let mut out = BufWriter::new(protocol);
    for message in outgoing {
        if write_frame(&mut out, &message).is_err() {
            // The server is gone; the worker's stdin ends too.
            return;
        }
    }
}

/// Reports each running job's monitor every [`REPORT_EVERY`] (also the worker's sign of
/// life to the server).
fn report_monitors(
    jobs: &Mutex<HashMap<String, Arc<Running>>>,
    outbox: &Sender<FromWorker>,
    tenant: &str,
) {
    loop {
        thread::sleep(REPORT_EVERY);
        // For tests: `worker::report=return(TENANT)` aborts TENANT's worker once one of
        // its jobs completed a checkpoint.
        if crate::failpoints::argument("worker::report").as_deref() == Some(tenant)
            && jobs
                .lock()
                .values()
                .any(|r| !r.monitor.checkpoints().completed.is_empty())
        {
            eprintln!("failpoint worker::report: aborting the worker of tenant '{tenant}'");
            std::process::abort();
        }
        let running: Vec<_> = jobs
            .lock()
            .iter()
            .map(|(job, r)| (job.clone(), r.clone()))
            .collect();
        for (job, running) in running {
            let snapshot = running.monitor.snapshot(&mut running.reported.lock());
            if outbox.send(FromWorker::Monitor { job, snapshot }).is_err() {
                return;
            }
        }
    }
}

/// Sends the answer to a savepoint request once the job gives it (or ends without).
fn answer_when_done(
    job: String,
    request: u64,
    answer: &Receiver<Result<PathBuf, String>>,
    outbox: &Sender<FromWorker>,
) {
    let result = answer
        .recv()
        .unwrap_or_else(|_| Err("the job ended before its savepoint".into()));
    let _ = outbox.send(FromWorker::Answer {
        job,
        request,
        result,
    });
}
