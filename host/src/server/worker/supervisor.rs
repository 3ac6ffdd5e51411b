//! The server's side: one worker process per tenant with running jobs, started with
//! the tenant's OS limits when its first job starts and let go when its last one ends.
//!
//! A job's thread in the server stays what it was — it holds the job's control channel
//! and monitor — but runs the job through [`Workers::run`], which hands it to the
//! tenant's worker, forwards control, mirrors the worker's reports into the monitor,
//! and returns the job's end or the worker's death. A worker that dies (aborts, is
//! killed by its memory limit) or stops answering (`[server] worker_timeout_ms`) fails only its
//! tenant's jobs; each job's thread decides whether to start it again.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use crossbeam_channel::{Receiver, Sender, select, unbounded};
use parking_lot::Mutex;

use super::cgroup::WorkerCgroup;
use super::limits::ProcessLimits;
use super::protocol::{
    Control, FromWorker, JobFailure, JobSource, REPORTS_FD, ToWorker, read_frame, write_frame,
};
use crate::job::{JobControl, JobMonitor, JobOutcome, MonitorSnapshot, RunOptions};
use crate::server::logs::JobLogs;
use crate::tenant::TenantConfig;

/// How a server starts its workers: this program, with the options it was started with.
#[derive(Debug, Clone)]
pub struct WorkerCommand {
    /// The `sluice` executable.
    pub program: PathBuf,
    /// Global options before the `worker` subcommand (logging, compile cache).
    pub args: Vec<String>,
    /// The host configuration the server was started with.
    pub host_config: PathBuf,
}

/// A server's worker processes, by tenant.
pub struct Workers {
    command: WorkerCommand,
    /// A worker that sends nothing for this long is stuck (it reports every running
    /// job's monitor four times a second) and is killed.
    silence: Duration,
    /// Starts processes on one long-lived thread: a worker is killed when the thread
    /// that started it ends (its parent-death signal is the thread's), and a job's
    /// thread ends with its job.
    launcher: Mutex<Sender<(Command, Sender<std::io::Result<Child>>)>>,
    by_tenant: Mutex<BTreeMap<String, Arc<Worker>>>,
    crashes: Arc<Mutex<Crashes>>,
}

/// One worker process.
struct Worker {
    tenant: String,
    pid: u32,
    /// Its stdin; `None` once it is let go.
    to_worker: Mutex<Option<BufWriter<ChildStdin>>>,
    /// Where each of its jobs' messages go (a job's thread in the server), and the
    /// plugins (SHA-256) the job runs.
    jobs: Mutex<HashMap<String, Attached>>,
    crashes: Arc<Mutex<Crashes>>,
    last_heard: Mutex<Instant>,
    child: Mutex<Child>,
    /// Why the server killed it, if it did.
    killed_for: Mutex<Option<String>>,
    /// Its cgroup, where the server has cgroups to give ([`super::cgroup`]).
    cgroup: Option<WorkerCgroup>,
}

/// A job attached to a worker: where its messages go, and the plugins it runs.
struct Attached {
    events: Sender<Event>,
    plugins: Vec<String>,
}

/// What a job's thread hears of its worker.
enum Event {
    Message(Box<FromWorker>),
    /// The worker died, and why.
    Died(String),
}

/// How a job in a worker ended.
pub enum WorkerEnd {
    /// The job ended in the worker: its outcome, or why it failed.
    Job(Result<JobOutcome, JobFailure>),
    /// The worker died or stopped answering, and why.
    Died(String),
}

/// A job for a worker to run.
#[derive(Debug, Clone)]
pub struct WorkerJob {
    /// Job id.
    pub id: String,
    /// What it is.
    pub source: JobSource,
    /// Its operators' plugins (SHA-256), which its worker's deaths count against.
    pub plugins: Vec<String>,
}

impl Workers {
    /// Workers started as `command` says.
    pub fn new(command: WorkerCommand, silence: Duration) -> Result<Workers> {
        let (launcher, launches) = unbounded::<(Command, Sender<std::io::Result<Child>>)>();
        thread::Builder::new()
            .name("worker launcher".into())
            .spawn(move || {
                for (mut command, reply) in launches {
                    let _ = reply.send(command.spawn());
                }
            })
            .context("starting the worker launcher thread")?;
        Ok(Workers {
            command,
            silence,
            launcher: Mutex::new(launcher),
            by_tenant: Mutex::default(),
            crashes: Arc::default(),
        })
    }

    /// Why a job of `tenant` running `plugins` may not start now, if its tenant or one of
    /// its plugins crashed workers too often of late.
    pub fn quarantine(&self, tenant: &str, plugins: &[String]) -> Option<String> {
        self.crashes
            .lock()
            .quarantine(tenant, plugins, Instant::now())
    }

    /// How it starts processes.
    pub(super) fn command(&self) -> &WorkerCommand {
        &self.command
    }

    /// Starts `command` on the launcher thread (see its `launcher` field).
    pub(super) fn spawn(&self, command: Command) -> Result<Child> {
        let (reply, spawned) = unbounded();
        let _ = self.launcher.lock().send((command, reply));
        spawned
            .recv()
            .unwrap_or_else(|_| Err(std::io::Error::other("the launcher thread is gone")))
            .with_context(|| format!("starting {}", self.command.program.display()))
    }

    /// Runs `job` in `tenant`'s worker (started if it has none), forwarding `control`
    /// and mirroring its reports into `monitor` (whose attempts count from
    /// `earlier_attempts`), until the job ends or the worker dies.
    pub fn run(
        &self,
        tenant: &TenantConfig,
        job: WorkerJob,
        options: RunOptions,
        control: &Receiver<JobControl>,
        monitor: &JobMonitor,
        earlier_attempts: u32,
    ) -> Result<WorkerEnd> {
        let (events, heard) = unbounded();
        let worker = self.attach(tenant, &job.id, events, job.plugins)?;
        let id = job.id.clone();
        let end = worker
            .send(&ToWorker::Start {
                job: job.id,
                source: job.source,
                options,
            })
            .map_err(|e| anyhow::anyhow!("{e:#}"))
            .and_then(|()| {
                let heard = Heard {
                    events: &heard,
                    silence: self.silence,
                };
                follow(&worker, &id, heard, control, monitor, earlier_attempts)
            });
        self.detach(&worker, &id);
        end
    }

    /// The tenant's worker with `job` attached, started if it has none.
    fn attach(
        &self,
        tenant: &TenantConfig,
        job: &str,
        events: Sender<Event>,
        plugins: Vec<String>,
    ) -> Result<Arc<Worker>> {
        let mut by_tenant = self.by_tenant.lock();
        let worker = match by_tenant.get(&tenant.name) {
            Some(worker) => worker.clone(),
            None => {
                let worker = self.start(tenant)?;
                by_tenant.insert(tenant.name.clone(), worker.clone());
                worker
            }
        };
        worker
            .jobs
            .lock()
            .insert(job.to_string(), Attached { events, plugins });
        Ok(worker)
    }

    /// Detaches `job`; a worker left without jobs is let go (its stdin closes and it
    /// exits).
    fn detach(&self, worker: &Arc<Worker>, job: &str) {
        let mut by_tenant = self.by_tenant.lock();
        let mut jobs = worker.jobs.lock();
        jobs.remove(job);
        if jobs.is_empty()
            && by_tenant
                .get(&worker.tenant)
                .is_some_and(|w| Arc::ptr_eq(w, worker))
        {
            by_tenant.remove(&worker.tenant);
            drop(jobs);
            worker.let_go();
        }
    }

    /// Starts a worker for `tenant`, under its limits, in a process group of its own
    /// (a terminal's Ctrl-C reaches whoever started it, which decides what to do).
    fn start(&self, tenant: &TenantConfig) -> Result<Arc<Worker>> {
        let limits = ProcessLimits::of(tenant);
        let cgroup = worker_cgroup(tenant);
        let joiner = cgroup.as_ref().map(WorkerCgroup::joiner).transpose()?;
        let (reports, reports_end) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
            .context("creating a worker's report pipe")?;
        let mut command = Command::new(&self.command.program);
        command
            .args(&self.command.args)
            .arg("worker")
            .arg("--host-config")
            .arg(&self.command.host_config)
            .arg("--tenant")
            .arg(&tenant.name)
            .stdin(Stdio::piped())
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit())
            .process_group(0);
        // SAFETY: the closure only makes system calls (write, setrlimit, prctl, dup2,
        // fcntl), which are async-signal-safe; it allocates nothing and takes no lock.
        unsafe {
            command.pre_exec(move || {
                if let Some(joiner) = &joiner {
                    joiner.join_in_child()?;
                }
                limits.apply_in_child()?;
                give_reports_fd(&reports_end)
            });
        }
        let mut child = self
            .spawn(command)
            .with_context(|| format!("starting the worker process of tenant '{}'", tenant.name))?;
        let stdin = child.stdin.take().context("the worker's stdin")?;
        let worker = Arc::new(Worker {
            tenant: tenant.name.clone(),
            pid: child.id(),
            to_worker: Mutex::new(Some(BufWriter::new(stdin))),
            jobs: Mutex::default(),
            crashes: self.crashes.clone(),
            last_heard: Mutex::new(Instant::now()),
            child: Mutex::new(child),
            killed_for: Mutex::new(None),
            cgroup,
        });
        tracing::info!(
            tenant = %tenant.name, pid = worker.pid,
            memory_mb = limits.memory_bytes >> 20, open_files = limits.open_files,
            cgroup = worker.cgroup.as_ref().map(|c| c.path().display().to_string()),
            "worker process started"
        );
        let reader = worker.clone();
        thread::Builder::new()
            .name(format!("worker {}", tenant.name))
            .spawn(move || reader.read_reports(BufReader::new(File::from(reports))))
            .context("starting a worker's reader thread")?;
        Ok(worker)
    }
}

/// A cgroup of its own for a new worker process of `tenant`, where the server has
/// cgroups to give; without one (said in the log), the resource limits still apply.
pub(super) fn worker_cgroup(tenant: &TenantConfig) -> Option<WorkerCgroup> {
    let cgroups = super::cgroup::cgroups().ok()?;
    cgroups
        .create(tenant)
        .inspect_err(|e| {
            tracing::warn!(
                tenant = %tenant.name,
                "a worker process of the tenant runs without a cgroup of its own: {e}"
            )
        })
        .ok()
}

/// In the child between `fork` and `exec`: makes the write end of the report pipe its
/// [`REPORTS_FD`], open across `exec`. The parent's copy closes when the command (which
/// owns it) is dropped after the spawn, so the reader sees the end when the worker exits.
fn give_reports_fd(reports: &std::os::fd::OwnedFd) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let fd = reports.as_raw_fd();
    // SAFETY: plain system calls on descriptors this process owns.
    let ok = unsafe {
        if fd == REPORTS_FD {
            libc::fcntl(fd, libc::F_SETFD, 0) != -1
        } else {
            libc::dup2(fd, REPORTS_FD) != -1
        }
    };
    if ok {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

impl Worker {
    fn send(&self, message: &ToWorker) -> Result<()> {
        let gone = || {
            anyhow::anyhow!(
                "the worker process of tenant '{}' (pid {}) is gone",
                self.tenant,
                self.pid
            )
        };
        let mut to_worker = self.to_worker.lock();
        let to_worker = to_worker.as_mut().ok_or_else(gone)?;
        write_frame(to_worker, message).map_err(|e| gone().context(e))
    }

    /// Closes its stdin: it stops whatever still runs and exits.
    fn let_go(&self) {
        self.to_worker.lock().take();
    }

    /// Routes the worker's reports to its jobs until its report pipe ends; then tells each
    /// job how it died.
    fn read_reports(&self, mut reports: BufReader<File>) {
        let why = loop {
            match read_frame::<FromWorker>(&mut reports) {
                Ok(Some(message)) => {
                    *self.last_heard.lock() = Instant::now();
                    let job = match &message {
                        FromWorker::Log { job, line } => {
                            JobLogs::global().push(job, line.clone());
                            continue;
                        }
                        FromWorker::Monitor { job, .. }
                        | FromWorker::Answer { job, .. }
                        | FromWorker::Ended { job, .. } => job.clone(),
                    };
                    if let Some(attached) = self.jobs.lock().get(&job) {
                        let _ = attached.events.send(Event::Message(Box::new(message)));
                    }
                }
                Ok(None) => break None,
                Err(e) => break Some(format!("it sent a broken report ({e})")),
            }
        };
        // Whatever it did, it is of no use any more.
        let mut child = self.child.lock();
        if why.is_some() {
            let _ = child.kill();
        }
        let status = child.wait();
        drop(child);
        let jobs: Vec<_> = self.jobs.lock().drain().collect();
        if jobs.is_empty() {
            return;
        }
        let memory_max = self
            .cgroup
            .as_ref()
            .and_then(WorkerCgroup::killed_past_memory_max);
        let why = why
            .or_else(|| self.killed_for.lock().clone())
            .or(memory_max)
            .unwrap_or_else(|| match &status {
                Ok(status) => describe_exit(*status),
                Err(e) => format!("its exit could not be read ({e})"),
            });
        let why = format!(
            "the worker process of tenant '{}' (pid {}) died: {why}",
            self.tenant, self.pid
        );
        tracing::error!(tenant = %self.tenant, pid = self.pid, "{why}");
        let plugins: Vec<String> = jobs
            .iter()
            .flat_map(|(_, a)| a.plugins.iter().cloned())
            .collect();
        self.crashes
            .lock()
            .record(&self.tenant, &plugins, Instant::now());
        for (_, attached) in jobs {
            let _ = attached.events.send(Event::Died(why.clone()));
        }
    }

    /// Kills it, for `why`; its reader reports the death.
    fn kill(&self, why: String) {
        *self.killed_for.lock() = Some(why);
        let _ = self.child.lock().kill();
    }
}

/// How a worker's exit reads in a job's failure.
pub(super) fn describe_exit(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("it exited with status {code}"),
        (None, Some(signal)) => {
            let name = match signal {
                6 => " (SIGABRT: it aborted, e.g. an allocation past its memory limit failed)",
                9 => " (SIGKILL: killed, e.g. by the kernel's out-of-memory killer)",
                11 => " (SIGSEGV)",
                _ => "",
            };
            format!("it was killed by signal {signal}{name}")
        }
        _ => format!("it ended ({status})"),
    }
}

/// What a job's thread hears from its worker, and how long the worker may be silent.
struct Heard<'a> {
    events: &'a Receiver<Event>,
    silence: Duration,
}

/// Follows one job in `worker` until it ends or the worker dies.
fn follow(
    worker: &Worker,
    job: &str,
    heard: Heard<'_>,
    control: &Receiver<JobControl>,
    monitor: &JobMonitor,
    earlier_attempts: u32,
) -> Result<WorkerEnd> {
    let mut requests = 0u64;
    let mut replies: HashMap<u64, Sender<Result<PathBuf, String>>> = HashMap::new();
    let failures_before: BTreeMap<String, u64> = monitor.failures_by_kind();
    let history_before = monitor.failure_history();
    // Failures that killed earlier workers stay counted beside the new worker's own, and
    // its attempts count on from theirs.
    let apply = |mut snapshot: MonitorSnapshot, failures_before: &BTreeMap<String, u64>| {
        snapshot.attempt += earlier_attempts;
        for failure in &mut snapshot.failures {
            failure.attempt += earlier_attempts;
        }
        snapshot.failures = history_before
            .iter()
            .cloned()
            .chain(snapshot.failures)
            .collect();

        for (kind, n) in failures_before {
            *snapshot.failures_by_kind.entry(kind.clone()).or_default() += n;
        }
        monitor.apply(snapshot);
    };
    let mut control_open = true;
    loop {
        let never = crossbeam_channel::never();
        let control = if control_open { control } else { &never };
        select! {
            recv(control) -> message => {
                let (control, reply) = match message {
                    Ok(JobControl::Cancel) => (Control::Cancel, None),
                    Ok(JobControl::Savepoint { reply }) => (Control::Savepoint, Some(reply)),
                    Ok(JobControl::StopWithSavepoint { drain, reply }) => {
                        (Control::StopWithSavepoint { drain }, Some(reply))
                    }
                    // The server dropped the job's control (it forgot it): cancel.
                    Err(_) => {
                        control_open = false;
                        (Control::Cancel, None)
                    }
                };
                requests += 1;
                if let Some(reply) = reply {
                    replies.insert(requests, reply);
                }
                // A worker that is gone has its death reported by its reader.
                let _ = worker.send(&ToWorker::Control { job: job.to_string(), request: requests, control });
            }
            recv(heard.events) -> event => match event {
                Ok(Event::Message(message)) => match *message {
                    FromWorker::Monitor { snapshot, .. } => apply(snapshot, &failures_before),
                    FromWorker::Answer { request, result, .. } => {
                        if let Some(reply) = replies.remove(&request) {
                            let _ = reply.send(result);
                        }
                    }
                    FromWorker::Ended { result, snapshot, .. } => {
                        apply(snapshot, &failures_before);
                        let savepoint = match &result {
                            Ok(JobOutcome::Stopped { savepoint }) => Ok(savepoint.clone()),
                            _ => Err("the job ended before its savepoint".to_string()),
                        };
                        for (_, reply) in replies.drain() {
                            let _ = reply.send(savepoint.clone());
                        }
                        return Ok(WorkerEnd::Job(result));
                    }
                    FromWorker::Log { .. } => {}
                },
                Ok(Event::Died(why)) => return Ok(WorkerEnd::Died(why)),
                Err(_) => return Ok(WorkerEnd::Died("its reader ended".into())),
            },
            default(heard.silence.min(Duration::from_secs(1))) => {
                let silent = worker.last_heard.lock().elapsed();
                if silent > heard.silence {
                    let why = format!(
                        "it sent nothing for {} ms (worker_timeout_ms {}), so the server killed it",
                        silent.as_millis(),
                        heard.silence.as_millis()
                    );
                    tracing::error!(tenant = %worker.tenant, pid = worker.pid, "{why}");
                    worker.kill(why);
                }
            }
        }
    }
}

/// Worker deaths of late, by tenant and by plugin: a plugin whose jobs' workers died
/// [`PLUGIN_CRASHES`] times within [`CRASH_WINDOW`] is quarantined, and so is a tenant
/// whose workers died [`TENANT_CRASHES`] times. What counts is the time since the deaths,
/// not what the job did in between: a job that checkpoints and then brings its worker
/// down is quarantined all the same, and submitting it again does not clear it.
#[derive(Debug, Default)]
pub struct Crashes {
    by_tenant: HashMap<String, Vec<Instant>>,
    by_plugin: HashMap<(String, String), Vec<Instant>>,
}

/// Worker deaths a plugin's jobs may cause within [`CRASH_WINDOW`] before it is
/// quarantined.
pub const PLUGIN_CRASHES: usize = 3;

/// Worker deaths of one tenant within [`CRASH_WINDOW`] before all its jobs are.
pub const TENANT_CRASHES: usize = 10;

/// How long a worker's death counts.
pub const CRASH_WINDOW: Duration = Duration::from_secs(600);

impl Crashes {
    fn record(&mut self, tenant: &str, plugins: &[String], now: Instant) {
        self.by_tenant
            .entry(tenant.to_string())
            .or_default()
            .push(now);
        let mut seen = plugins.to_vec();
        seen.sort();
        seen.dedup();
        for plugin in seen {
            self.by_plugin
                .entry((tenant.to_string(), plugin))
                .or_default()
                .push(now);
        }
    }

    fn quarantine(&mut self, tenant: &str, plugins: &[String], now: Instant) -> Option<String> {
        let recent = |deaths: &mut Vec<Instant>| {
            deaths.retain(|t| now.duration_since(*t) < CRASH_WINDOW);
            (
                deaths.len(),
                deaths
                    .first()
                    .map(|t| CRASH_WINDOW - now.duration_since(*t)),
            )
        };
        let minutes = |left: Option<Duration>| left.map_or(0, |d| d.as_secs().div_ceil(60));
        if let Some(deaths) = self.by_tenant.get_mut(tenant) {
            let (n, left) = recent(deaths);
            if n >= TENANT_CRASHES {
                return Some(format!(
                    "quarantined: tenant '{tenant}''s worker process died {n} times in the last \
                     {} minutes; its jobs start again in {} minutes at the earliest",
                    CRASH_WINDOW.as_secs() / 60,
                    minutes(left)
                ));
            }
        }
        for plugin in plugins {
            if let Some(deaths) = self
                .by_plugin
                .get_mut(&(tenant.to_string(), plugin.clone()))
            {
                let (n, left) = recent(deaths);
                if n >= PLUGIN_CRASHES {
                    return Some(format!(
                        "quarantined: the worker process running plugin sha256:{plugin} died {n} \
                         times in the last {} minutes; jobs with it start again in {} minutes at \
                         the earliest",
                        CRASH_WINDOW.as_secs() / 60,
                        minutes(left)
                    ));
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plugin_or_tenant_that_crashes_workers_is_quarantined_until_its_deaths_age_out() {
        let mut crashes = Crashes::default();
        let t0 = Instant::now();
        let bad = vec!["bad".to_string()];
        let good = vec!["good".to_string()];
        for i in 0..PLUGIN_CRASHES as u64 - 1 {
            crashes.record("acme", &bad, t0 + Duration::from_secs(i));
        }
        assert!(
            crashes
                .quarantine("acme", &bad, t0 + Duration::from_secs(5))
                .is_none()
        );
        crashes.record("acme", &bad, t0 + Duration::from_secs(5));
        let why = crashes
            .quarantine("acme", &bad, t0 + Duration::from_secs(6))
            .unwrap();
        assert!(why.contains("sha256:bad died 3 times"), "{why}");
        // Another plugin of the tenant, and the same plugin of another tenant, run.
        assert!(
            crashes
                .quarantine("acme", &good, t0 + Duration::from_secs(6))
                .is_none()
        );
        assert!(
            crashes
                .quarantine("other", &bad, t0 + Duration::from_secs(6))
                .is_none()
        );
        // Once the first death is older than the window, it runs again.
        let later = t0 + CRASH_WINDOW + Duration::from_secs(1);
        assert!(crashes.quarantine("acme", &bad, later).is_none());
        // A tenant whose workers die often is quarantined whatever the plugin.
        for i in 0..TENANT_CRASHES as u64 {
            crashes.record("acme", &[format!("p{i}")], later + Duration::from_secs(i));
        }
        let why = crashes
            .quarantine("acme", &good, later + Duration::from_secs(20))
            .unwrap();
        assert!(
            why.contains("tenant 'acme''s worker process died 10 times"),
            "{why}"
        );
    }
}
