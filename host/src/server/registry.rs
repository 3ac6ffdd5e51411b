//! The server's registry of jobs: what it keeps of each job in memory and on disk
//! (`record.json`), their checkpoint history, and the tenants' quotas it admits jobs
//! against and enforces while they run.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Instant;

use anyhow::{Context, Result};
use crossbeam_channel::Sender;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::model::{ChainSummary, JobState};
use super::savepoints::Triggers;
use super::views::CheckpointSummary;
use super::{ApiError, ErrorKind, Server, write_atomic};
use crate::checkpoint::CheckpointStorage;
use crate::cluster::gc::ClusterResources;
use crate::job::{FailureRecord, JobControl, JobMonitor, RestorePoint};
use crate::tenant::TenantConfig;

/// How many times in a row a restarted server resumes a job that reaches neither a
/// completed checkpoint nor an end before it quarantines it. Three: one crash of the
/// server is bad luck, two could be, three in a row with the same job resumed each time
/// point at the job.
pub const QUARANTINE_AFTER: u32 = 3;

/// The log lines of a job whose lines left memory, in its folder.
pub(super) const LOGS_FILE: &str = "logs.txt";

/// What the server keeps of a job on disk (`record.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct JobRecord {
    pub(super) id: String,
    pub(super) tenant: String,
    pub(super) name: String,
    pub(super) state: JobState,
    pub(super) submitted_ms: u64,
    /// Operator name → SHA-256 of the plugin it runs, fixed at submission.
    pub(super) plugins: BTreeMap<String, String>,
    /// Output files, relative to the job folder.
    pub(super) output: Vec<String>,
    /// The folder name of the last savepoint.
    pub(super) savepoint: Option<String>,
    /// Why the job last failed.
    pub(super) failure: Option<String>,
    /// Restarts over all runs.
    pub(super) restarts: u32,
    /// Times a restarted server resumed the job since it last reached a completed
    /// checkpoint or an end (saved before each resumption; see [`QUARANTINE_AFTER`]).
    #[serde(default)]
    pub(super) recoveries: u32,
    /// Records its sources read in all its runs, as of the last one's end (a run
    /// resumed from a checkpoint after a failure reads again what came after it).
    #[serde(default)]
    pub(super) records_read: u64,
    /// Its tasks and the edges between them, for the dashboard's graph.
    #[serde(default)]
    pub(super) graph: Vec<ChainSummary>,
    /// Its last completed checkpoints and savepoints over all runs, oldest first (at
    /// most [`HISTORY`]), saved every few seconds while it runs and when a run ends.
    #[serde(default)]
    pub(super) checkpoints: Vec<CheckpointSummary>,
    /// Checkpoints completed and aborted over all runs, as of the last save.
    #[serde(default)]
    pub(super) checkpoint_counts: (u64, u64),
    /// Records its sink wrote in all its runs, as of the last one's end.
    #[serde(default)]
    pub(super) records_written: u64,
    /// Records its sinks committed over all its runs, as of its last completed
    /// checkpoint (saved with the checkpoint history; `None` without checkpoints).
    #[serde(default)]
    pub(super) records_committed: Option<u64>,
    /// Whether it runs over several servers (`[cluster]`).
    #[serde(default)]
    pub(super) cluster: bool,
    /// What it makes outside the server when it runs over several (its topics and store
    /// folder), as of its last submission or start: counted against its tenant's
    /// `cluster_partitions` while it is stored, and deleted with it.
    #[serde(default)]
    pub(super) cluster_resources: Option<ClusterResources>,
    /// Its last failures over all runs, oldest first (its exception history), saved with
    /// its checkpoint history.
    #[serde(default)]
    pub(super) exceptions: Vec<FailureRecord>,
}

/// Completed checkpoints a job's record keeps.
const HISTORY: usize = 20;

/// What a run of a job takes of its server's and tenant's quotas.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Needs {
    /// Wasm operator instances.
    pub(super) instances: u32,
    /// Subtasks (threads).
    pub(super) subtasks: u32,
    /// Task slots: its highest parallelism (a job over several servers, the sum of its
    /// units').
    pub(super) slots: u32,
}

impl Needs {
    /// What a run of `graph` needs.
    pub(super) fn of(graph: &crate::job::JobGraph) -> Needs {
        Needs {
            instances: graph.instances(),
            subtasks: graph.subtasks(),
            slots: graph.slots(),
        }
    }

    /// What `entry`'s current run takes.
    pub(super) fn of_run(entry: &JobEntry) -> Needs {
        Needs {
            instances: entry.instances.load(Ordering::Relaxed),
            subtasks: entry.subtasks.load(Ordering::Relaxed),
            slots: entry.slots.load(Ordering::Relaxed),
        }
    }

    /// Records these as `entry`'s current run's.
    pub(super) fn store(self, entry: &JobEntry) {
        entry.instances.store(self.instances, Ordering::Relaxed);
        entry.subtasks.store(self.subtasks, Ordering::Relaxed);
        entry.slots.store(self.slots, Ordering::Relaxed);
    }
}

impl std::iter::Sum for Needs {
    fn sum<I: Iterator<Item = Needs>>(needs: I) -> Needs {
        needs.fold(Needs::default(), |a, b| Needs {
            instances: a.instances + b.instances,
            subtasks: a.subtasks + b.subtasks,
            slots: a.slots + b.slots,
        })
    }
}

/// A job the server knows.
pub(super) struct JobEntry {
    pub(super) dir: PathBuf,
    pub(super) record: Mutex<JobRecord>,
    pub(super) monitor: Mutex<Arc<JobMonitor>>,
    /// Where to send control requests while the job's thread runs.
    pub(super) run: Mutex<Option<Sender<JobControl>>>,
    /// Operator instances of its current run.
    pub(super) instances: AtomicU32,
    /// Subtasks (threads) of its current run.
    pub(super) subtasks: AtomicU32,
    /// Task slots of its current run.
    pub(super) slots: AtomicU32,
    /// When its last run ended, while its metrics and log lines are still in memory.
    pub(super) ended: Mutex<Option<Instant>>,
    /// Records read and written by its runs before the current one, which the current
    /// run's counts add to.
    pub(super) counted_before: Mutex<(u64, u64)>,
    /// Its checkpoint history and counts before the current run.
    pub(super) history_before: Mutex<(Vec<CheckpointSummary>, (u64, u64))>,
    /// Restarts of its runs before the one its monitor shows, which the monitor's
    /// attempts add to.
    pub(super) restarts_before: AtomicU32,
    /// Why the server cancels its run (a quota): the run then ends as failed with it.
    pub(super) kill_cause: Mutex<Option<String>>,
    /// The savepoints triggered through the API, and how they went.
    pub(super) savepoints: Mutex<Triggers>,
}

/// The server's jobs, by id.
#[derive(Default)]
pub(super) struct Jobs {
    pub(super) by_id: Mutex<BTreeMap<String, Arc<JobEntry>>>,
    /// Held while a submission checks quotas and starts its job, so that two submissions
    /// cannot both take the last slot.
    pub(super) admission: Mutex<()>,
    /// Set while the server stops: jobs that end then stay `running` on disk.
    pub(super) shutting_down: Arc<AtomicBool>,
}

impl Jobs {
    /// Whether the server is stopping its jobs.
    pub(super) fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Relaxed)
    }
}

impl JobEntry {
    /// A job kept in `dir`, not running.
    pub(super) fn new(dir: PathBuf, record: JobRecord) -> Arc<JobEntry> {
        let history = (record.checkpoints.clone(), record.checkpoint_counts);
        let restarts = record.restarts;
        let savepoints = Mutex::new(Triggers::new(&record.id));
        let monitor = JobMonitor::default();
        monitor.keep_failures(record.exceptions.clone());
        Arc::new(JobEntry {
            dir,
            record: Mutex::new(record),
            monitor: Mutex::new(Arc::new(monitor)),
            run: Mutex::new(None),
            instances: AtomicU32::new(0),
            subtasks: AtomicU32::new(0),
            slots: AtomicU32::new(0),
            ended: Mutex::new(None),
            kill_cause: Mutex::new(None),
            counted_before: Mutex::new((0, 0)),
            history_before: Mutex::new(history),
            restarts_before: AtomicU32::new(restarts),
            savepoints,
        })
    }

    pub(super) fn record(&self) -> JobRecord {
        self.record.lock().clone()
    }

    pub(super) fn save(&self, record: &JobRecord) -> Result<()> {
        let json = serde_json::to_vec_pretty(record).expect("plain data");
        write_atomic(&self.dir.join("record.json"), &json)
    }

    pub(super) fn update(&self, f: impl FnOnce(&mut JobRecord)) {
        let mut record = self.record.lock();
        f(&mut record);
        if let Err(e) = self.save(&record) {
            tracing::error!("job {}: {e:#}", record.id);
        }
    }

    pub(super) fn is_running(&self) -> bool {
        self.run.lock().is_some()
    }

    /// Restarts over all its runs: those before the run its monitor shows, and that
    /// run's (a restart counted once, whether the run still goes or has ended).
    pub(super) fn restarts(&self) -> u32 {
        self.restarts_before.load(Ordering::Relaxed) + self.monitor.lock().attempt()
    }

    /// Records read and written: live while it runs, else as of the end of its last run.
    pub(super) fn records_read_written(&self, record: &JobRecord) -> (u64, u64) {
        if self.is_running() {
            let (read, written) = self.monitor.lock().records_read_written();
            let (read_before, written_before) = *self.counted_before.lock();
            (read_before + read, written_before + written)
        } else {
            (record.records_read, record.records_written)
        }
    }

    /// Records its sinks committed over all its runs: as of the current run's latest
    /// checkpoint (or the one it started from) while it runs, else as recorded.
    pub(super) fn records_committed(&self, record: &JobRecord) -> Option<u64> {
        let live = self
            .is_running()
            .then(|| self.monitor.lock().checkpoints().records_committed());
        live.flatten().or(record.records_committed)
    }

    /// Its checkpoint history and counts, over its runs before the current one and the
    /// current one's so far (what [`JobRecord::checkpoints`] keeps).
    pub(super) fn checkpoint_history(&self) -> (Vec<CheckpointSummary>, (u64, u64)) {
        let (mut history, (completed, aborted)) = self.history_before.lock().clone();
        let stats = self.monitor.lock().checkpoints();
        history.extend(stats.completed.iter().map(|c| CheckpointSummary {
            id: c.id,
            kind: c.kind.name().to_string(),
            name: c.path.file_name().map(|n| n.to_string_lossy().into_owned()),
            triggered_ms: c.triggered_ms,
            duration_ms: c.duration.as_secs_f64() * 1e3,
            max_sync_ms: c.max_sync.as_secs_f64() * 1e3,
            max_async_ms: c.max_async.as_secs_f64() * 1e3,
            full_bytes: c.full_bytes,
            bytes: c.bytes,
            files: c.files,
        }));
        let drop = history.len().saturating_sub(HISTORY);
        history.drain(..drop);
        let counts = (
            completed + stats.completed.len() as u64,
            aborted + stats.aborted.len() as u64,
        );
        (history, counts)
    }

    /// Folds the current run's checkpoints and records into what came before it (its
    /// worker died and it starts again in a new one, with a new report).
    pub(super) fn fold_run(&self) {
        let history = self.checkpoint_history();
        let (read, written) = self.monitor.lock().records_read_written();
        *self.history_before.lock() = history;
        let mut before = self.counted_before.lock();
        before.0 += read;
        before.1 += written;
    }

    /// Saves the checkpoint history into the record, for a server that starts next
    /// (written only when it changed).
    pub(super) fn save_history(&self) {
        let (history, counts) = self.checkpoint_history();
        let exceptions = self.monitor.lock().failure_history();
        let record = self.record();
        let committed = self.records_committed(&record);
        if record.checkpoint_counts != counts
            || record.exceptions != exceptions
            || record.records_committed != committed
        {
            self.update(|r| {
                r.checkpoints = history;
                r.checkpoint_counts = counts;
                r.exceptions = exceptions;
                r.records_committed = committed;
            });
        }
    }

    /// Whether its current run completed a checkpoint or savepoint.
    fn completed_a_checkpoint(&self) -> bool {
        !self.monitor.lock().checkpoints().completed.is_empty()
    }
}

impl Server {
    pub(super) fn entry(&self, tenant: &TenantConfig, id: &str) -> Result<Arc<JobEntry>, ApiError> {
        let entry = self.jobs.by_id.lock().get(id).cloned();
        match entry {
            Some(e) if e.record.lock().tenant == tenant.name => Ok(e),
            // Another tenant's job is indistinguishable from no job.
            _ => Err(ApiError::not_found("job", id)),
        }
    }

    /// Checks the tenant's quotas for one more running job. Called under the admission
    /// lock, which is held until the job is launched, so that what it counts is current.
    /// `disk_used` is the tenant's [`Server::disk_usage`], measured before the lock was
    /// taken (a walk of its folders is too slow to hold every submission up for).
    /// Admits a cluster job's topics (`resources`) within its tenant's
    /// `cluster_partitions`, counting those of its other stored jobs (every job but
    /// `id`): the topics stay while their job is stored, running or not.
    pub(super) fn admit_cluster_topics(
        &self,
        tenant: &TenantConfig,
        id: Option<&str>,
        resources: Option<&ClusterResources>,
    ) -> Result<(), ApiError> {
        let (Some(resources), Some(grant)) = (resources, tenant.kafka.as_ref()) else {
            return Ok(());
        };
        let stored: u64 = self
            .jobs
            .by_id
            .lock()
            .iter()
            .filter(|(other, _)| Some(other.as_str()) != id)
            .filter_map(|(_, e)| {
                let r = e.record.lock();
                match &r.cluster_resources {
                    Some(c) if r.tenant == tenant.name => Some(c.partitions()),
                    _ => None,
                }
            })
            .sum();
        let wanted = resources.partitions();
        if stored + wanted > grant.cluster_partitions {
            return Err(ApiError::new(
                ErrorKind::Quota,
                format!(
                    "job.toml: [cluster]: the job's topics need {wanted} partitions, but tenant \
                     '{}''s stored jobs over several servers have {stored} of its {} \
                     (cluster_partitions in [tenant.{}.kafka]); delete jobs it no longer \
                     needs, which deletes their topics",
                    tenant.name, grant.cluster_partitions, tenant.name
                ),
            ));
        }
        Ok(())
    }

    pub(super) fn admit(
        &self,
        tenant: &TenantConfig,
        job: &str,
        needs: Needs,
        disk_used: u64,
    ) -> Result<(), ApiError> {
        let Needs {
            instances,
            subtasks,
            slots,
        } = needs;
        let (running, tenants, everyone) = {
            let jobs = self.jobs.by_id.lock();
            let running = || jobs.values().filter(|e| e.is_running());
            let theirs = running()
                .filter(|e| e.record.lock().tenant == tenant.name)
                .collect::<Vec<_>>();
            (
                theirs.len() as u32,
                theirs.iter().map(|e| Needs::of_run(e)).sum::<Needs>(),
                running().map(|e| Needs::of_run(e)).sum::<Needs>(),
            )
        };
        let (in_use, threads) = (tenants.instances, tenants.subtasks);
        if running >= tenant.max_jobs {
            return Err(ApiError::new(
                ErrorKind::Quota,
                format!(
                    "tenant '{}' has {running} of its {} jobs running (max_jobs)",
                    tenant.name, tenant.max_jobs
                ),
            ));
        }
        if in_use + instances > tenant.max_instances {
            return Err(ApiError::new(
                ErrorKind::Quota,
                format!(
                    "job '{job}' needs {instances} operator instances, but tenant '{}' has \
                     {in_use} of its {} in use (max_instances)",
                    tenant.name, tenant.max_instances
                ),
            ));
        }
        if threads + subtasks > tenant.max_subtasks {
            return Err(ApiError::new(
                ErrorKind::Quota,
                format!(
                    "job '{job}' needs {subtasks} subtasks (threads), but tenant '{}' has {threads} \
                     of its {} in use (max_subtasks)",
                    tenant.name, tenant.max_subtasks
                ),
            ));
        }
        let (server_slots, tenant_slots) = (
            self.host.server.slots,
            tenant.slots.unwrap_or(self.host.server.slots),
        );
        if tenants.slots + slots > tenant_slots {
            return Err(ApiError::new(
                ErrorKind::Quota,
                format!(
                    "job '{job}' needs {slots} task slots (its highest parallelism), but \
                     tenant '{}' has {} of its {tenant_slots} in use (slots)",
                    tenant.name, tenants.slots
                ),
            ));
        }
        if everyone.slots + slots > server_slots {
            return Err(ApiError::new(
                ErrorKind::Quota,
                format!(
                    "job '{job}' needs {slots} task slots (its highest parallelism), but the \
                     server has {} of its {server_slots} in use ([server] slots; by default {} \
                     per core of the machine's {})",
                    everyone.slots,
                    crate::tenant::SLOTS_PER_CORE,
                    crate::tenant::cores()
                ),
            ));
        }
        if disk_used >= tenant.max_disk_bytes {
            return Err(ApiError::new(
                ErrorKind::Quota,
                disk_quota_message(tenant, disk_used),
            ));
        }
        Ok(())
    }

    /// Refuses to store one more job of a tenant that stores `max_stored_jobs` (every
    /// job is a folder, a record in memory and a walk of the disk quota).
    pub(super) fn admit_stored(&self, tenant: &TenantConfig) -> Result<(), ApiError> {
        let stored = self
            .jobs
            .by_id
            .lock()
            .values()
            .filter(|e| e.record.lock().tenant == tenant.name)
            .count();
        if stored >= tenant.max_stored_jobs as usize {
            return Err(ApiError::new(
                ErrorKind::Quota,
                format!(
                    "tenant '{}' stores {stored} jobs, its quota (max_stored_jobs): delete jobs \
                     it no longer needs (DELETE /v1/jobs/ID) first",
                    tenant.name
                ),
            ));
        }
        Ok(())
    }

    /// Bytes of disk the tenant's job folders and plugins take under the server's folder
    /// (blocks allocated, so many small files and sparse ones count as what they take).
    pub(super) fn disk_usage(&self, tenant: &str) -> u64 {
        let dirs: Vec<PathBuf> = self
            .jobs
            .by_id
            .lock()
            .values()
            .filter(|e| e.record.lock().tenant == tenant)
            .map(|e| e.dir.clone())
            .collect();
        dirs.iter()
            .map(|d| dir_bytes(d))
            .sum::<u64>()
            .saturating_add(dir_bytes(&self.dir.join("plugins").join(tenant)))
    }

    /// Runs `f` under the lock that submissions and starts take to admit a job.
    pub(super) fn admitting<T>(&self, f: impl FnOnce() -> T) -> T {
        let _admission = self.jobs.admission.lock();
        f()
    }

    /// The ids of `tenant`'s jobs that could run plugin `sha256` again (any but finished
    /// ones).
    pub(super) fn jobs_using_plugin(&self, tenant: &TenantConfig, sha256: &str) -> Vec<String> {
        self.jobs
            .by_id
            .lock()
            .values()
            .map(|e| e.record())
            .filter(|r| r.tenant == tenant.name && r.state != JobState::Finished)
            .filter(|r| r.plugins.values().any(|p| p == sha256))
            .map(|r| r.id)
            .collect()
    }

    /// What the server does every few seconds while it runs: it enforces disk quotas,
    /// clears the resumption count of jobs that completed a checkpoint, and forgets the
    /// metrics and log lines of jobs that ended long enough ago.
    pub(super) fn housekeeping(&self) {
        let entries: Vec<Arc<JobEntry>> = self.jobs.by_id.lock().values().cloned().collect();
        let running: Vec<&Arc<JobEntry>> = entries.iter().filter(|e| e.is_running()).collect();

        for entry in &running {
            if entry.record().recoveries > 0 && entry.completed_a_checkpoint() {
                entry.update(|r| r.recoveries = 0);
            }
            // A server killed now still shows this run's checkpoints when it comes back.
            entry.save_history();
        }

        let tenants: BTreeSet<String> = running.iter().map(|e| e.record().tenant).collect();
        for tenant in self.tenants().filter(|t| tenants.contains(&t.name)) {
            let used = self.disk_usage(&tenant.name);
            if used <= tenant.max_disk_bytes {
                continue;
            }
            let cause = disk_quota_message(tenant, used);
            tracing::warn!("{cause}: failing its running jobs");
            for entry in running.iter().filter(|e| e.record().tenant == tenant.name) {
                *entry.kill_cause.lock() = Some(cause.clone());
                if let Some(control) = entry.run.lock().as_ref() {
                    let _ = control.send(JobControl::Cancel);
                }
            }
        }

        let settings = &self.host.server;
        let mut ended: Vec<(Instant, &Arc<JobEntry>)> = entries
            .iter()
            .filter_map(|e| e.ended.lock().map(|at| (at, e)))
            .collect();
        // Newest first: the first `keep_ended_jobs` stay, unless ended too long ago.
        ended.sort_by_key(|(at, _)| std::cmp::Reverse(*at));
        for (i, (at, entry)) in ended.into_iter().enumerate() {
            if i >= settings.keep_ended_jobs || at.elapsed() > settings.keep_ended_for {
                self.forget(entry);
            }
        }
    }

    /// Drops the metrics and log lines an ended job keeps in memory; its lines go to its
    /// folder, where [`Server::job_logs`] reads them and its next run picks them up.
    pub(super) fn forget(&self, entry: &JobEntry) {
        // Held throughout, so a launch waits until the lines are on disk.
        let mut ended = entry.ended.lock();
        if entry.is_running() {
            return;
        }
        let id = entry.record().id;
        if let Some(text) = super::logs::JobLogs::global().take(&id)
            && let Err(e) = write_atomic(&entry.dir.join(LOGS_FILE), text.as_bytes())
        {
            tracing::error!("job {id}: keeping its log lines: {e:#}");
        }
        let record = entry.record();
        // The run's restarts and checkpoints are in the record now; they are its history.
        *entry.monitor.lock() = Arc::new(JobMonitor::default());
        entry
            .restarts_before
            .store(record.restarts, Ordering::Relaxed);
        *entry.history_before.lock() = (record.checkpoints, record.checkpoint_counts);
        *ended = None;
    }
}

/// Why a tenant over its disk quota is refused or has its jobs failed.
fn disk_quota_message(tenant: &TenantConfig, used: u64) -> String {
    format!(
        "tenant '{}' takes {used} bytes of the server's disk (job output, checkpoints and \
         plugins); its quota is {} (max_disk_mb)",
        tenant.name, tenant.max_disk_bytes
    )
}

/// Bytes of disk allocated to `path` and everything under it, folders included
/// (symbolic links are not followed; what cannot be read counts nothing).
fn dir_bytes(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = fs::symlink_metadata(path) else {
        return 0;
    };
    let own = meta.blocks().saturating_mul(512);
    if !meta.is_dir() {
        return own;
    }
    fs::read_dir(path)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| dir_bytes(&e.path()))
                .fold(own, u64::saturating_add)
        })
        .unwrap_or(own)
}

/// The latest complete checkpoint or savepoint of a job folder, or a fresh start when
/// it has none. A folder that cannot be read is an error, not a fresh start: that would
/// take back what the job committed.
pub(super) fn latest_or_fresh(job_dir: &Path) -> Result<RestorePoint> {
    resume_from(&job_dir.join("checkpoints"))
}

/// [`latest_or_fresh`] of a job whose checkpoints are in `dir`.
pub(crate) fn resume_from(dir: &Path) -> Result<RestorePoint> {
    if !dir.exists() {
        return Ok(RestorePoint::Fresh);
    }
    let latest = CheckpointStorage::new(dir)
        .and_then(|s| s.find_latest())
        .with_context(|| format!("finding where the job resumes in {}", dir.display()))?;
    Ok(match latest {
        Some(_) => RestorePoint::Latest,
        None => RestorePoint::Fresh,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_folder_resumes_from_its_latest_checkpoint_and_one_that_cannot_be_read_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            latest_or_fresh(dir.path()),
            Ok(RestorePoint::Fresh)
        ));
        let checkpoints = dir.path().join("checkpoints");
        fs::create_dir_all(&checkpoints).unwrap();
        assert!(matches!(
            latest_or_fresh(dir.path()),
            Ok(RestorePoint::Fresh)
        ));
        // What a crash or a full disk can leave: a lineage that does not parse. A fresh
        // start would take back what the job committed.
        fs::write(checkpoints.join("_lineage"), b"{ not json").unwrap();
        let err = format!("{:#}", latest_or_fresh(dir.path()).unwrap_err());
        assert!(
            err.contains("finding where the job resumes") && err.contains("is corrupt"),
            "{err}"
        );
    }

    #[test]
    fn disk_usage_counts_the_blocks_files_take_not_their_apparent_size() {
        let dir = tempfile::tempdir().unwrap();
        // A sparse gigabyte takes (almost) nothing.
        let sparse = fs::File::create(dir.path().join("sparse")).unwrap();
        sparse.set_len(1 << 30).unwrap();
        assert!(dir_bytes(dir.path()) < 1 << 20, "{}", dir_bytes(dir.path()));
        // A thousand one-byte files take a block each at least, beside their folder's.
        let many = dir.path().join("many");
        fs::create_dir(&many).unwrap();
        for i in 0..1000 {
            fs::write(many.join(i.to_string()), b"x").unwrap();
        }
        let used = dir_bytes(&many);
        assert!(used >= 1000 * 512, "{used}");
        assert!(dir_bytes(dir.path()) >= used);
    }
}
