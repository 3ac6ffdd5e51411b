//! The worker's side: `sluice worker` runs one tenant's jobs for the server (or the
//! `sluice run`) that started it, as that process would run them itself, and reports
//! over its file descriptor [`REPORTS_FD`].
//!
//! It installs its system-call filter, and then serves its parent's messages until its
//! stdin closes (the parent ended or let it go); jobs still running then are stopped
//! where they are, without a savepoint: they resume from their checkpoints.

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

use super::protocol::{
    Control, FromWorker, JobFailure, JobSource, REPORTS_FD, ToWorker, read_frame, write_frame,
};
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
    reported: Mutex<(u64, usize, usize, u32)>,
}

/// Runs the worker of `tenant`: see the module docs.
pub fn run(host_config: PathBuf, tenant: &str, engine: Arc<WasmEngine>) -> Result<()> {
    abort_on_panic();
    let protocol = take_reports_fd()?;
    super::limits::filter_system_calls()?;
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
                source,
                options,
            } => {
                let (control, control_rx) = unbounded();
                let monitor = Arc::new(JobMonitor::default());
                let running = Arc::new(Running {
                    control: control.clone(),
                    monitor: monitor.clone(),
                    reported: Mutex::new((0, 0, 0, 0)),
                });
                jobs.lock().insert(job.clone(), running);
                let (server, tenant, jobs, outbox) =
                    (server.clone(), tenant.clone(), jobs.clone(), outbox.clone());
                let spawned = thread::Builder::new()
                    .name(format!("job {job}"))
                    .spawn(move || {
                        let span = tracing::info_span!(JOB_SPAN, tenant = %tenant.name, job = %job);
                        let _span = span.entered();
                        let result =
                            std::panic::catch_unwind(std::panic::AssertUnwindSafe(
                                || match source {
                                    JobSource::Registry {
                                        text,
                                        dir,
                                        mut plugins,
                                    } => server.run_here(
                                        &tenant,
                                        &text,
                                        &dir,
                                        &mut plugins,
                                        options,
                                        &control_rx,
                                        &monitor,
                                    ),
                                    JobSource::File(path) => run_file(
                                        &server,
                                        &tenant,
                                        &path,
                                        options,
                                        control,
                                        &control_rx,
                                        &monitor,
                                    ),
                                },
                            ))
                            .unwrap_or_else(|panic| Err(crate::task::panic_to_error(panic)));
                        let mut since = (u64::MAX, 0, 0, 0);
                        let snapshot = monitor.snapshot(&mut since);
                        jobs.lock().remove(&job);
                        // Blocking: an end is never dropped.
                        let _ = outbox.send(FromWorker::Ended {
                            job,
                            result: result.map_err(|e| JobFailure::of(&e)),
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

/// The report pipe its parent gave it as [`REPORTS_FD`].
fn take_reports_fd() -> Result<File> {
    use std::os::fd::{FromRawFd, OwnedFd};
    // SAFETY: F_GETFD only reads the descriptor's flags; it fails on a closed one.
    if unsafe { libc::fcntl(REPORTS_FD, libc::F_GETFD) } == -1 {
        anyhow::bail!(
            "`sluice worker` reports on file descriptor {REPORTS_FD}, which is not open: it is \
             started by `sluice serve` or `sluice run`, not by hand"
        );
    }
    // SAFETY: the descriptor is open (checked above) and nothing else in this process
    // owns it: its parent opened it for this.
    let fd = unsafe { OwnedFd::from_raw_fd(REPORTS_FD) };
    rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::CLOEXEC).context("the report pipe")?;
    Ok(File::from(fd))
}

/// Runs a job file of a `sluice run` as `sluice run` does in its own process: loaded
/// here (its plugins compiled in this worker), its run locked, and `sluice savepoint`
/// answered on its control socket.
fn run_file(
    server: &Server,
    tenant: &crate::tenant::TenantConfig,
    path: &std::path::Path,
    options: crate::job::RunOptions,
    control: Sender<JobControl>,
    control_rx: &Receiver<JobControl>,
    monitor: &JobMonitor,
) -> Result<crate::job::JobOutcome> {
    let job = crate::job::Job::load_with(path, &server.engine, &server.host)
        .with_context(|| path.display().to_string())
        .map_err(crate::cli::exit::bad_input)?
        .with_budget(server.budget.clone());
    anyhow::ensure!(
        job.tenant().name == tenant.name,
        "{}: job '{}' is tenant '{}''s, not '{}''s",
        path.display(),
        job.graph().name,
        job.tenant().name,
        tenant.name
    );
    let locks = job.lock()?;
    let _listener = job
        .graph()
        .checkpoint
        .as_ref()
        .and_then(|c| crate::cli::control::listen(&c.dir, control));
    Ok(job.run_locked(locks, options, control_rx, monitor)?.outcome)
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
