//! Worker processes: each tenant's jobs on a server run in a process of the tenant's
//! own, under OS limits derived from its quotas ([`limits`]), so that a failure the
//! in-process limits miss — an allocation past the machine's memory, an abort, a
//! hang — kills one tenant's worker, never the server or another tenant.
//!
//! Records never cross the boundary: a worker reads its sources and writes its sinks
//! itself, from the server's registry, as the server would. Control, metrics, log lines
//! and ends cross it as typed messages ([`protocol`]). When a worker dies, each of its
//! jobs starts again from its latest checkpoint as its restart strategy allows, unless
//! its plugin or tenant has crashed workers too often of late ([`supervisor::Crashes`]):
//! then it is quarantined.

pub mod cgroup;
pub mod child;
pub mod compile;
pub mod limits;
pub mod protocol;
pub mod supervisor;

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use crossbeam_channel::Receiver;

use self::protocol::JobSource;
use self::supervisor::{WorkerEnd, WorkerJob, Workers};
use super::jobs::Run;
use super::registry::JobEntry;
use super::{ApiError, ErrorKind, Server};
use crate::job::{
    JobControl, JobFailed, JobMonitor, JobOutcome, RestartStrategy, RestorePoint, RunOptions,
};
use crate::tenant::TenantConfig;

impl Server {
    /// Builds a job from the registry and runs it in this process, as a worker process
    /// does for its server; a job over several servers runs as this server's host of it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run_here(
        &self,
        tenant: &TenantConfig,
        text: &str,
        dir: &Path,
        plugins: &mut BTreeMap<String, String>,
        options: RunOptions,
        control: &Receiver<JobControl>,
        monitor: &JobMonitor,
    ) -> Result<JobOutcome> {
        match self.prepare(tenant, text, dir, plugins) {
            Ok((Run::Local(job), _)) => Ok(job.run(options, control, monitor)?.outcome),
            Ok((Run::Cluster(c), _)) => c.run(
                self.engine.clone(),
                Arc::new(self.host.clone()),
                self.budget.clone(),
                control,
                monitor,
            ),
            Err(e) => Err(anyhow::anyhow!("{e}")),
        }
    }

    /// Refuses to start a job whose tenant or plugins crashed workers too often of late.
    pub(super) fn not_quarantined(
        &self,
        tenant: &TenantConfig,
        plugins: &BTreeMap<String, String>,
    ) -> Result<(), ApiError> {
        let Some(workers) = self.workers.get() else {
            return Ok(());
        };
        let hashes: Vec<String> = plugins.values().cloned().collect();
        match workers.quarantine(&tenant.name, &hashes) {
            Some(why) => Err(ApiError::new(ErrorKind::Conflict, why)),
            None => Ok(()),
        }
    }
}

/// A job quarantined because its worker died too often (the job's state becomes
/// `quarantined`, not `failed`).
#[derive(Debug)]
pub struct Quarantined(pub String);

impl std::fmt::Display for Quarantined {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Quarantined {}

/// A job in its tenant's worker, started again when the worker dies: a worker's death is
/// a failure of the job, which restarts from its latest checkpoint after the delay its
/// strategy gives, unless quarantined or out of restarts.
pub struct Restarts<'a> {
    /// The workers.
    pub workers: &'a Workers,
    /// The job's tenant.
    pub tenant: &'a TenantConfig,
    /// The job's restart strategy.
    pub strategy: &'a RestartStrategy,
    /// The job's control.
    pub control: &'a Receiver<JobControl>,
    /// The job's monitor.
    pub monitor: &'a JobMonitor,
}

impl Restarts<'_> {
    /// Runs a server's job until it ends.
    pub(super) fn run_job(&self, entry: &JobEntry, options: RunOptions) -> Result<JobOutcome> {
        let job = || {
            let record = entry.record();
            Ok(WorkerJob {
                id: record.id.clone(),
                source: JobSource::Registry {
                    text: fs::read_to_string(entry.dir.join("job.toml"))?,
                    dir: entry.dir.clone(),
                    plugins: record.plugins.clone(),
                },
                plugins: record.plugins.values().cloned().collect(),
            })
        };
        let restarting = || {
            entry.fold_run();
            // As a server that restarts resumes it: from its latest checkpoint, or from
            // scratch when it completed none (and so committed nothing).
            Ok(RunOptions::from(super::registry::latest_or_fresh(
                &entry.dir,
            )?))
        };
        self.run(options, job, restarting)
    }

    /// Runs a job file of a `sluice run` until it ends; after a worker's death it resumes
    /// from its latest checkpoint in `checkpoints` (or from scratch when it has none),
    /// keeping `options`' other choices.
    pub fn run_file(
        &self,
        job: WorkerJob,
        options: RunOptions,
        checkpoints: Option<&Path>,
    ) -> Result<JobOutcome> {
        let job = || Ok(job.clone());
        let restarting = || {
            Ok(RunOptions {
                restore: match checkpoints {
                    Some(dir) => super::registry::resume_from(dir)?,
                    None => RestorePoint::Fresh,
                },
                // What it moved aside at its start stays aside; it resumes its own.
                move_aside: false,
                ..options.clone()
            })
        };
        self.run(options.clone(), job, restarting)
    }

    /// Runs the job `job` gives from `options`, and again from what `restarting` gives
    /// (called as soon as a worker dies) after each worker's death, until it ends, is
    /// quarantined or is out of restarts.
    fn run(
        &self,
        mut options: RunOptions,
        job: impl Fn() -> Result<WorkerJob>,
        restarting: impl Fn() -> Result<RunOptions>,
    ) -> Result<JobOutcome> {
        let (workers, tenant, monitor) = (self.workers, self.tenant, self.monitor);
        let mut earlier_attempts = 0;
        loop {
            let job = job()?;
            let id = job.id.clone();
            let plugins = job.plugins.clone();
            if let Some(why) = workers.quarantine(&tenant.name, &plugins) {
                return Err(Quarantined(why).into());
            }
            let why = match workers.run(
                tenant,
                job,
                options.clone(),
                self.control,
                monitor,
                earlier_attempts,
            )? {
                WorkerEnd::Job(result) => return result.map_err(anyhow::Error::from),
                WorkerEnd::Died(why) => why,
            };
            // Taken at once: a server folds the dead run's figures into the job's here.
            let next = restarting();
            let quarantined = workers.quarantine(&tenant.name, &plugins);
            let why = match &quarantined {
                Some(quarantined) => format!("{why}; {quarantined}"),
                None => why,
            };
            earlier_attempts = monitor.failed_outside("worker", &why);
            if quarantined.is_some() {
                return Err(Quarantined(why).into());
            }
            let Some(delay) = self.strategy.delay_before(earlier_attempts) else {
                return Err(JobFailed {
                    job: id,
                    restarts: earlier_attempts - 1,
                    cause: anyhow::anyhow!(
                        "{why}; the job's restart strategy allows no more restarts"
                    ),
                }
                .into());
            };
            tracing::warn!("job '{id}': {why}; restarting from its latest checkpoint in {delay:?}");
            if wait_or_cancelled(self.control, delay) {
                return Ok(JobOutcome::Cancelled);
            }
            options = next?;
        }
    }
}

/// Waits `delay` before a restart; true if the job was cancelled meanwhile (a savepoint
/// asked for meanwhile is refused: there is no running job to take it).
fn wait_or_cancelled(control: &Receiver<JobControl>, delay: Duration) -> bool {
    let deadline = std::time::Instant::now() + delay;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match control.recv_timeout(left) {
            Ok(JobControl::Cancel) => return true,
            Ok(JobControl::Savepoint { reply } | JobControl::StopWithSavepoint { reply, .. }) => {
                let _ = reply.send(Err(
                    "the job is restarting after its worker process died: try again".into(),
                ));
            }
            Err(_) => return false,
        }
    }
}
