//! Jobs on a server: submission, their threads, control, and the record on disk that
//! lets a restarted server resume them.
//!
//! A restarted server resumes the jobs its registry records as running, but not blindly:
//! each resumption is counted in the job's record before the job is launched, and a job
//! resumed [`QUARANTINE_AFTER`] times without reaching a completed checkpoint or an end
//! since is quarantined instead of launched (it may be what brings the server down). A
//! user `start` runs it again.
//!
//! What the server keeps in memory of a job is bounded: the metrics and log lines of an
//! ended job are forgotten [`ServerSettings::keep_ended_for`] after its end, or once
//! [`ServerSettings::keep_ended_jobs`] newer jobs ended; its record stays on disk, and its
//! log lines move to `logs.txt` in its folder.
//!
//! A job file with `[cluster]` runs as this server's share of a job over several servers
//! ([`crate::cluster`]), within its tenant's Kafka grant: brokers from it, checkpoints in
//! its store, names under its `id_prefix`. It is admitted for all its units, since the
//! group may give them all to this server.
//!
//! [`ServerSettings::keep_ended_for`]: crate::tenant::ServerSettings::keep_ended_for
//! [`ServerSettings::keep_ended_jobs`]: crate::tenant::ServerSettings::keep_ended_jobs

use std::collections::BTreeMap;
use std::fs;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use crossbeam_channel::{Sender, unbounded};

use super::model::{JobState, JobSummary};
use super::plugins::now_ms;
use super::registry::{JobEntry, JobRecord, LOGS_FILE, Needs, QUARANTINE_AFTER, latest_or_fresh};
use super::views::{graph_summary, state_name, summary};
use super::{ApiError, ErrorKind, Server, is_plain_name, write_atomic};
use crate::cluster::Plan;
use crate::cluster::gc::ClusterResources;
use crate::job::{JobControl, JobMonitor, JobOutcome, RestorePoint, RunOptions};
use crate::tenant::TenantConfig;

mod prepare;

pub(super) use prepare::Run;
use prepare::units_need;

impl Server {
    /// Validates a job file, stores it and starts it. Nothing remains of a submission
    /// that fails.
    pub fn submit(&self, tenant: &TenantConfig, text: &str) -> Result<JobSummary, ApiError> {
        if self.jobs.shutting_down.load(Ordering::Relaxed) {
            return Err(ApiError::new(
                ErrorKind::Conflict,
                "the server is shutting down",
            ));
        }
        // 64 random bits: no two jobs of a server meet.
        let id = format!("{:016x}", uuid::Uuid::new_v4().as_u64_pair().0);
        let dir = self.dir.join("jobs").join(&id);
        let mut plugins = BTreeMap::new();
        let (run, output) = self.prepare(tenant, text, &dir, &mut plugins)?;
        self.not_quarantined(tenant, &plugins)?;
        let (needs, cluster_resources) = run.needs()?;
        let disk_used = self.disk_usage(&tenant.name);
        let _admission = self.jobs.admission.lock();
        // (Under the admission lock: a job launched now would not be among those the
        // shutdown stops.)
        if self.jobs.is_shutting_down() {
            return Err(ApiError::new(
                ErrorKind::Conflict,
                "the server is shutting down",
            ));
        }
        // A plugin deleted since `prepare` found it (deletions take the same lock).
        if let Some((op, _)) = plugins
            .iter()
            .find(|(_, hash)| self.plugin_path(&tenant.name, hash).is_none())
        {
            return Err(ApiError::new(
                ErrorKind::Conflict,
                format!("job.toml: operator '{op}': its plugin was deleted meanwhile"),
            ));
        }
        self.admit_stored(tenant)?;
        self.admit(tenant, &run.graph().name, needs, disk_used)?;
        self.admit_cluster_topics(tenant, None, cluster_resources.as_ref())?;
        let record = JobRecord {
            id: id.clone(),
            tenant: tenant.name.clone(),
            name: run.graph().name.clone(),
            state: JobState::Running,
            submitted_ms: now_ms(),
            plugins,
            output,
            savepoint: None,
            failure: None,
            restarts: 0,
            recoveries: 0,
            records_read: 0,
            records_written: 0,
            records_committed: None,
            graph: graph_summary(run.graph()),
            checkpoints: Vec::new(),
            checkpoint_counts: (0, 0),
            cluster: matches!(run, Run::Cluster(_)),
            cluster_resources,
            exceptions: Vec::new(),
        };
        let entry = JobEntry::new(dir.clone(), record.clone());
        let stored = fs::create_dir_all(&dir)
            .with_context(|| format!("creating {}", dir.display()))
            .and_then(|()| write_atomic(&dir.join("job.toml"), text.as_bytes()))
            .and_then(|()| entry.save(&record));
        if let Err(e) = stored {
            let _ = fs::remove_dir_all(&dir);
            return Err(ApiError::internal(e));
        }
        self.jobs.by_id.lock().insert(id.clone(), entry.clone());
        self.launch(&entry, run, needs, RestorePoint::Fresh);
        tracing::info!(tenant = %tenant.name, job = %id, name = %record.name, "job submitted");
        Ok(summary(&record, true))
    }

    /// Starts the job's thread; its run counts as `needs` (operator instances, subtasks,
    /// slots)
    /// against the tenant's quotas (a cluster job resumed by a restarted server learns
    /// its needs from its plan, on the thread).
    fn launch(
        &self,
        entry: &Arc<JobEntry>,
        work: Run,
        needs: Needs,
        options: impl Into<RunOptions>,
    ) {
        let options = options.into();
        let (tenant, id) = {
            let record = entry.record.lock();
            (record.tenant.clone(), record.id.clone())
        };
        // Waits for a `forget` under way; afterwards the job's lines are in memory again.
        *entry.ended.lock() = None;
        *entry.kill_cause.lock() = None;
        if let Ok(text) = fs::read_to_string(entry.dir.join(LOGS_FILE)) {
            super::logs::JobLogs::global().restore(&id, &text);
        }
        needs.store(entry);
        let monitor = Arc::new(JobMonitor::default());
        // The exception history goes on over runs.
        monitor.keep_failures(entry.monitor.lock().failure_history());
        *entry.monitor.lock() = monitor.clone();
        {
            let record = entry.record.lock();
            *entry.counted_before.lock() = (record.records_read, record.records_written);
            entry
                .restarts_before
                .store(record.restarts, Ordering::Relaxed);
            *entry.history_before.lock() = (record.checkpoints.clone(), record.checkpoint_counts);
        }
        let (control, control_rx) = unbounded();
        let mut run = entry.run.lock();
        let finished = entry.clone();
        let shutting_down = self.jobs.shutting_down.clone();
        let (engine, host, budget) = (
            self.engine.clone(),
            Arc::new(self.host.clone()),
            self.budget.clone(),
        );
        // A job runs in its tenant's worker process, when there are workers; the server
        // only follows it.
        let in_worker = match (
            self.workers.get(),
            self.tenants().find(|t| t.name == tenant),
        ) {
            (Some(workers), Some(config)) => Some((
                workers.clone(),
                work.graph().restart.clone(),
                config.clone(),
            )),
            _ => None,
        };
        let spawned = thread::Builder::new()
            .name(format!("job {id}"))
            .spawn(move || {
                // The job's own log lines (checkpoints, restarts) carry tenant and job.
                let _span = tracing::info_span!(super::logs::JOB_SPAN, tenant = %tenant, job = %id)
                    .entered();
                // A panic must not leave the job `running` with no thread behind it.
                let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
                    if let Run::Cluster(c) = &work
                        && needs == Needs::default()
                    {
                        // Resumed by a restarted server: its needs come from its plan,
                        // which asks the brokers (here, not on the resuming thread).
                        let plan = Plan::new(&c.graph, &c.settings)?;
                        units_need(&plan, &c.settings)?.store(&finished);
                    }
                    match work {
                        _ if in_worker.is_some() => {
                            let (workers, strategy, config) = in_worker.expect("checked");
                            let restarts = super::worker::Restarts {
                                workers: &workers,
                                tenant: &config,
                                strategy: &strategy,
                                control: &control_rx,
                                monitor: &monitor,
                            };
                            restarts.run_job(&finished, options)
                        }
                        Run::Local(job) => job
                            .run(options, &control_rx, &monitor)
                            .map(|report| report.outcome),
                        Run::Cluster(c) => c.run(engine, host, budget, &control_rx, &monitor),
                    }
                }))
                .unwrap_or_else(|panic| Err(crate::task::panic_to_error(panic)));
                let stopping_server = shutting_down.load(Ordering::Relaxed);
                finished_run(&finished, result, &monitor, stopping_server);
            });
        match spawned {
            Ok(_detached) => *run = Some(control),
            Err(e) => {
                drop(run);
                entry.update(|r| {
                    r.state = JobState::Failed;
                    r.failure = Some(format!("cannot start the job's thread: {e}"));
                });
            }
        }
    }
}

/// Records how a run ended (called on the job's thread).
fn finished_run(
    entry: &JobEntry,
    result: Result<JobOutcome>,
    monitor: &JobMonitor,
    stopping_server: bool,
) {
    let restarts = monitor.attempt();
    let kill_cause = entry.kill_cause.lock().take();
    let (read, written) = monitor.records_read_written();
    let (read_before, written_before) = *entry.counted_before.lock();
    let checkpointed = !monitor.checkpoints().completed.is_empty();
    entry.save_history();
    *entry.ended.lock() = Some(Instant::now());
    // How it ended is recorded and the run let go in one step: a request that sees the job
    // ended cannot reach its run any more, and one that reaches the run (a savepoint, a
    // start) does not see it ended.
    let mut run = entry.run.lock();
    entry.update(|r| {
        r.restarts += restarts;
        (r.records_read, r.records_written) = (read_before + read, written_before + written);
        // A run that ended, even by the server stopping it cleanly, or that completed a
        // checkpoint does not bring the server down.
        if result.is_ok() || checkpointed {
            r.recoveries = 0;
        }
        let finished_or_stopped =
            matches!(&result, Ok(outcome) if *outcome != JobOutcome::Cancelled);
        match &result {
            // A server going down stops its jobs; they stay `running` and resume when it
            // comes back.
            _ if stopping_server => {}
            // The server cancelled it (a quota): it failed, for that reason.
            _ if kill_cause.is_some() && !finished_or_stopped => {
                r.state = JobState::Failed;
                r.failure = kill_cause.clone();
            }
            Ok(outcome) => match outcome {
                JobOutcome::Finished => r.state = JobState::Finished,
                JobOutcome::Stopped { savepoint } => {
                    r.state = JobState::Stopped;
                    r.savepoint = savepoint
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned());
                }
                JobOutcome::Cancelled => r.state = JobState::Cancelled,
            },
            Err(e) if e.is::<super::worker::Quarantined>() => {
                r.state = JobState::Quarantined;
                r.failure = Some(format!("{e:#}"));
            }
            Err(e) => {
                r.state = JobState::Failed;
                r.failure = Some(format!("{e:#}"));
            }
        }
    });
    run.take();
    drop(run);
    let record = entry.record();
    tracing::info!(
        tenant = %record.tenant, job = %record.id, state = state_name(record.state),
        restarts = record.restarts, failure = record.failure.as_deref().unwrap_or(""),
        "job ended"
    );
}

impl Server {
    pub(super) fn control(
        &self,
        entry: &JobEntry,
        what: &str,
    ) -> Result<Sender<JobControl>, ApiError> {
        match entry.run.lock().as_ref() {
            Some(control) => Ok(control.clone()),
            None => {
                let r = entry.record();
                Err(ApiError::new(
                    ErrorKind::Conflict,
                    format!(
                        "cannot {what} job '{}': it is {}",
                        r.id,
                        state_name(r.state)
                    ),
                ))
            }
        }
    }

    /// Refuses to `what` a job that runs over several servers: its state is its units'
    /// committed checkpoints, and it has no savepoint of its own.
    pub(super) fn no_savepoints(entry: &JobEntry, what: &str) -> Result<(), ApiError> {
        let record = entry.record();
        if !record.cluster {
            return Ok(());
        }
        Err(ApiError::new(
            ErrorKind::Conflict,
            format!(
                "cannot {what} job '{}': it runs over several servers, and each of its units \
                 resumes from its last committed checkpoint: cancel it (its units move to the \
                 other servers) and start it again",
                record.id
            ),
        ))
    }

    /// Cancels one of `tenant`'s jobs (no savepoint).
    pub fn cancel(&self, tenant: &TenantConfig, id: &str) -> Result<JobSummary, ApiError> {
        let entry = self.entry(tenant, id)?;
        let control = self.control(&entry, "cancel")?;
        let _ = control.send(JobControl::Cancel);
        wait_until_ended(&entry, Duration::from_secs(30));
        Ok(summary(&entry.record(), entry.is_running()))
    }

    /// Stops one of `tenant`'s jobs with a savepoint; `drain` first fires all event-time
    /// timers. Returns when the savepoint is written.
    pub fn stop(
        &self,
        tenant: &TenantConfig,
        id: &str,
        drain: bool,
    ) -> Result<JobSummary, ApiError> {
        let entry = self.entry(tenant, id)?;
        Self::no_savepoints(&entry, "stop")?;
        let control = self.control(&entry, "stop")?;
        let (reply, answer) = unbounded();
        let _ = control.send(JobControl::StopWithSavepoint { drain, reply });
        match answer.recv_timeout(Duration::from_secs(300)) {
            Ok(Ok(_)) => {
                wait_until_ended(&entry, Duration::from_secs(30));
                Ok(summary(&entry.record(), entry.is_running()))
            }
            Ok(Err(e)) => Err(ApiError::new(
                ErrorKind::Conflict,
                format!("the savepoint of job '{id}' failed: {e}"),
            )),
            Err(_) => {
                // The job ended before it could answer (its input ended, or it failed).
                wait_until_ended(&entry, Duration::from_secs(30));
                let r = entry.record();
                Err(ApiError::new(
                    ErrorKind::Conflict,
                    format!(
                        "job '{id}' ended before its savepoint: it is {}",
                        state_name(r.state)
                    ),
                ))
            }
        }
    }

    /// Starts a stopped, cancelled or failed job of `tenant` again, from `savepoint` (a
    /// folder name in its checkpoints) or else its latest complete checkpoint or savepoint.
    /// A savepoint older than the committed output is refused unless `allow_rewind`.
    /// With `job_file`, the job starts as that file describes (its settings, parallelism,
    /// plugins changed: an upgrade), which replaces the one it ran by once the start is
    /// accepted; secrets left masked keep their values.
    pub fn start(
        &self,
        tenant: &TenantConfig,
        id: &str,
        savepoint: Option<&str>,
        allow_rewind: bool,
        job_file: Option<&str>,
    ) -> Result<JobSummary, ApiError> {
        let entry = self.entry(tenant, id)?;
        let not_startable = |record: &JobRecord| {
            ApiError::new(
                ErrorKind::Conflict,
                format!(
                    "cannot start job '{id}': it is {}",
                    state_name(record.state)
                ),
            )
        };
        let record = entry.record();
        if entry.is_running() || record.state == JobState::Finished {
            return Err(not_startable(&record));
        }
        // What is slow — compiling its plugins, asking Kafka for a cluster job's
        // partitions, walking the tenant's folders — before the admission lock, which
        // every submission and start waits for.
        let stored = fs::read_to_string(entry.dir.join("job.toml"))
            .map_err(|e| ApiError::internal(anyhow::anyhow!("job {id}: job.toml: {e}")))?;
        let (text, mut plugins) = match job_file {
            // Its plugins named anew: an upgrade may change them.
            Some(edited) => (
                super::job_file::unmasked(edited, &stored).map_err(ApiError::bad)?,
                BTreeMap::new(),
            ),
            None => (stored, record.plugins.clone()),
        };
        let (run, output) = self.prepare(tenant, &text, &entry.dir, &mut plugins)?;
        self.not_quarantined(tenant, &plugins)?;
        let (needs, cluster_resources) = run.needs()?;
        let disk_used = self.disk_usage(&tenant.name);
        let _admission = self.jobs.admission.lock();
        // A job started now would not be among those the shutdown stops.
        if self.jobs.is_shutting_down() {
            return Err(ApiError::new(
                ErrorKind::Conflict,
                format!("cannot start job '{id}': the server is shutting down"),
            ));
        }
        // Started, or deleted, by another request meanwhile.
        let record = entry.record();
        if entry.is_running() || record.state == JobState::Finished {
            return Err(not_startable(&record));
        }
        if !self.jobs.by_id.lock().contains_key(id) {
            return Err(ApiError::not_found("job", id));
        }
        self.admit(tenant, &record.name, needs, disk_used)?;
        let job = match run {
            Run::Local(job) => job,
            Run::Cluster(_) if job_file.is_some() => {
                return Err(ApiError::new(
                    ErrorKind::Conflict,
                    format!(
                        "cannot start job '{id}' with another job file: it runs over several \
                         servers, whose units were planned from the one it was submitted with \
                         (submit the new file as a job of its own)"
                    ),
                ));
            }
            Run::Cluster(_) if savepoint.is_some() => {
                return Err(ApiError::new(
                    ErrorKind::Conflict,
                    format!(
                        "cannot start job '{id}' from a savepoint: it runs over several \
                         servers, and each of its units resumes from its last committed \
                         checkpoint"
                    ),
                ));
            }
            cluster => {
                self.admit_cluster_topics(tenant, Some(id), cluster_resources.as_ref())?;
                entry.update(|r| {
                    r.state = JobState::Running;
                    r.failure = None;
                    r.recoveries = 0;
                    r.cluster_resources = cluster_resources;
                });
                self.launch(&entry, cluster, needs, RestorePoint::Fresh);
                return Ok(summary(&entry.record(), true));
            }
        };
        let restore = match savepoint {
            Some(name) => {
                let path = entry.dir.join("checkpoints").join(name);
                if !is_plain_name(name) || !path.is_dir() {
                    return Err(ApiError::not_found("savepoint", name));
                }
                RestorePoint::Path(path)
            }
            None => latest_or_fresh(&entry.dir).map_err(|e| {
                ApiError::new(
                    ErrorKind::Conflict,
                    format!("cannot start job '{id}': {e:#}"),
                )
            })?,
        };
        let options = RunOptions {
            allow_rewind,
            ..RunOptions::from(restore)
        };
        job.check_start(&options).map_err(|e| {
            ApiError::new(
                ErrorKind::Conflict,
                format!("cannot start job '{id}': {e:#}"),
            )
        })?;
        let graph = graph_summary(job.graph());
        if job_file.is_some() {
            write_atomic(&entry.dir.join("job.toml"), text.as_bytes())
                .map_err(ApiError::internal)?;
            tracing::info!(tenant = %tenant.name, job = %id, "job file replaced at its start");
        }
        let name = job.graph().name.clone();
        entry.update(|r| {
            r.state = JobState::Running;
            r.failure = None;
            r.graph = graph;
            r.name = name;
            r.plugins = plugins;
            // What its earlier runs wrote stays part of its output, in files the new
            // file may no longer name (a sink at another parallelism writes others).
            for file in output {
                if !r.output.contains(&file) {
                    r.output.push(file);
                }
            }
            // A person starting it again takes it out of quarantine.
            r.recoveries = 0;
        });
        self.launch(&entry, Run::Local(job), needs, options);
        Ok(summary(&entry.record(), true))
    }

    /// Deletes one of `tenant`'s jobs that is not running, with its folder: job file,
    /// record, checkpoints, savepoints, output and logs. A job over several servers takes
    /// its topics and its store folder with it ([`crate::cluster::gc`]), refused while a
    /// server still runs it.
    pub fn delete(&self, tenant: &TenantConfig, id: &str) -> Result<JobSummary, ApiError> {
        let entry = self.entry(tenant, id)?;
        let not_running = || {
            if entry.is_running() {
                return Err(ApiError::new(
                    ErrorKind::Conflict,
                    format!("cannot delete job '{id}': it is running (stop or cancel it first)"),
                ));
            }
            Ok(())
        };
        let resources = {
            let _admission = self.jobs.admission.lock();
            not_running()?;
            entry.record().cluster_resources
        };
        if let Some(resources) = resources {
            // Out of the registry while Kafka is asked (no `start` finds it meanwhile),
            // without holding the admission lock.
            {
                let _admission = self.jobs.admission.lock();
                not_running()?;
                self.jobs.by_id.lock().remove(id);
            }
            if let Err(e) = self.delete_cluster_resources(tenant, &resources) {
                self.jobs.by_id.lock().insert(id.to_string(), entry.clone());
                return Err(ApiError::new(
                    e.kind,
                    format!("cannot delete job '{id}': {}", e.message),
                ));
            }
        }
        // Under the admission lock, so that no `start` launches it meanwhile, and with
        // its lines' lock, so that no `forget` writes them into the folder meanwhile.
        let _admission = self.jobs.admission.lock();
        let _ended = entry.ended.lock();
        not_running()?;
        let summary = summary(&entry.record(), false);
        self.jobs.by_id.lock().remove(id);
        super::logs::JobLogs::global().take(id);
        fs::remove_dir_all(&entry.dir).map_err(|e| {
            ApiError::internal(anyhow::anyhow!(
                "deleting job {id}: {}: {e}",
                entry.dir.display()
            ))
        })?;
        tracing::info!(tenant = %tenant.name, job = %id, "job deleted");
        Ok(summary)
    }

    /// Deletes a cluster job's topics and store folder through its tenant's grant.
    fn delete_cluster_resources(
        &self,
        tenant: &TenantConfig,
        resources: &ClusterResources,
    ) -> Result<(), ApiError> {
        let Some(grant) = &tenant.kafka else {
            return Err(ApiError::new(
                ErrorKind::Forbidden,
                format!(
                    "tenant '{}' has no Kafka grant any more, so its topics {:?} cannot be \
                     deleted from this server (delete them with Kafka's tools, or give the \
                     grant back)",
                    tenant.name,
                    resources.topics.iter().map(|t| &t.0).collect::<Vec<_>>()
                ),
            ));
        };
        let mut client = rdkafka::ClientConfig::new();
        for (key, value) in &grant.properties {
            client.set(key, value);
        }
        client.set("bootstrap.servers", grant.bootstrap.join(","));
        let deleted = crate::cluster::gc::delete(resources, &client).map_err(|e| {
            let kind = if e.is::<crate::cluster::gc::StillRunning>() {
                ErrorKind::Conflict
            } else {
                ErrorKind::Unavailable
            };
            ApiError::new(kind, format!("{e:#}"))
        })?;
        tracing::info!(
            tenant = %tenant.name,
            "deleted topics {:?} and the checkpoints under {}",
            deleted.topics,
            deleted.checkpoints
        );
        Ok(())
    }

    /// Loads the jobs on disk and resumes those that were running.
    pub(super) fn recover(&self) -> Result<()> {
        let jobs_dir = self.dir.join("jobs");
        let mut resumed = 0;
        for dir_entry in
            fs::read_dir(&jobs_dir).with_context(|| format!("reading {}", jobs_dir.display()))?
        {
            let dir = dir_entry?.path();
            let record_path = dir.join("record.json");
            let record: JobRecord = match fs::read(&record_path)
                .map_err(anyhow::Error::from)
                .and_then(|b| serde_json::from_slice(&b).map_err(anyhow::Error::from))
            {
                Ok(r) => r,
                Err(e) => {
                    // A submission interrupted before its record was written.
                    tracing::warn!("skipping {}: {e:#}", record_path.display());
                    continue;
                }
            };
            let entry = JobEntry::new(dir.clone(), record.clone());
            self.jobs
                .by_id
                .lock()
                .insert(record.id.clone(), entry.clone());
            if record.state != JobState::Running {
                continue;
            }
            if record.recoveries >= QUARANTINE_AFTER {
                entry.update(|r| {
                    r.state = JobState::Quarantined;
                    r.failure = Some(format!(
                        "quarantined after {} server restarts that resumed it, none of which \
                         it brought to a completed checkpoint or an end: it may be what brings \
                         the server down. `start` runs it again",
                        r.recoveries
                    ));
                });
                tracing::warn!(
                    tenant = %record.tenant, job = %record.id,
                    "job quarantined: resumed {} times without a completed checkpoint or an end",
                    record.recoveries
                );
                continue;
            }
            // Counted on disk before the launch, so that a launch that brings the server
            // down is counted too.
            entry.update(|r| r.recoveries += 1);
            let tenant = match self.tenants().find(|t| t.name == record.tenant) {
                Some(t) => t.clone(),
                None => {
                    entry.update(|r| {
                        r.state = JobState::Failed;
                        r.failure = Some(format!(
                            "tenant '{}' is no longer configured on this server",
                            r.tenant
                        ));
                    });
                    continue;
                }
            };
            let text = fs::read_to_string(dir.join("job.toml")).unwrap_or_default();
            let mut plugins = record.plugins.clone();
            let prepared = self
                .prepare(&tenant, &text, &dir, &mut plugins)
                .and_then(|p| {
                    let restore = latest_or_fresh(&dir).map_err(ApiError::internal)?;
                    Ok((p, restore))
                });
            match prepared {
                Ok(((run, _), restore)) => {
                    let needs = match &run {
                        Run::Local(_) => run.needs().map(|n| n.0).unwrap_or_default(),
                        Run::Cluster(_) => Needs::default(),
                    };
                    self.launch(&entry, run, needs, restore);
                    resumed += 1;
                }
                Err(e) => entry.update(|r| {
                    r.state = JobState::Failed;
                    r.failure = Some(format!("cannot resume: {e}"));
                }),
            }
        }
        if resumed > 0 {
            tracing::info!("resumed {resumed} jobs");
        }
        Ok(())
    }

    /// Stops every running job so that it resumes when a server opens this registry
    /// again: with a savepoint when it checkpoints, else cancelled. Waits at most
    /// `timeout`.
    pub fn shutdown(&self, timeout: Duration) {
        // Under the admission lock, so that no submission or start launches a job after
        // the jobs to stop are listed.
        self.admitting(|| self.jobs.shutting_down.store(true, Ordering::Relaxed));
        let entries: Vec<Arc<JobEntry>> = self.jobs.by_id.lock().values().cloned().collect();
        let mut answers = Vec::new();
        for entry in &entries {
            if let Some(control) = entry.run.lock().as_ref() {
                let (reply, answer) = unbounded();
                let _ = control.send(JobControl::StopWithSavepoint {
                    drain: false,
                    reply,
                });
                answers.push((entry, control.clone(), answer));
            }
        }
        let deadline = Instant::now() + timeout;
        for (entry, control, answer) in answers {
            let left = deadline.saturating_duration_since(Instant::now());
            // A job that cannot take a savepoint (no checkpointing) is cancelled; it
            // starts again from scratch.
            if let Ok(Err(_)) = answer.recv_timeout(left) {
                let _ = control.send(JobControl::Cancel);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if !wait_until_ended(entry, left) {
                let _ = control.send(JobControl::Cancel);
                wait_until_ended(entry, Duration::from_secs(5));
            }
        }
        // Their log lines go to their folders, for the server that opens the registry next.
        for entry in &entries {
            if !entry.is_running() {
                self.forget(entry);
            }
        }
    }
}

/// Waits until the job's thread has recorded its end; false on timeout.
fn wait_until_ended(entry: &JobEntry, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while entry.is_running() {
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(5));
    }
    true
}
