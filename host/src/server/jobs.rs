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

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use crossbeam_channel::{Sender, unbounded};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::plugins::now_ms;
use super::{ApiError, ErrorKind, Object, Server, hex, is_plain_name, write_atomic};
use crate::checkpoint::CheckpointStorage;
use crate::cluster::plan::is_topic_char;
use crate::cluster::{ClusterHost, ClusterSettings, HostEnd, HostView, Plan};
use crate::connectors::kafka::Topics;
use crate::job::{
    Job, JobControl, JobFile, JobGraph, JobMonitor, JobOutcome, RestorePoint, RunOptions, SinkKind,
    SourceInput, SourceKind, Vertex,
};
use crate::tenant::TenantConfig;

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum JobState {
    /// Its tasks run (or it is restarting after a failure).
    Running,
    /// Its input ended and all output was committed.
    Finished,
    /// Stopped with a savepoint; `start` resumes it.
    Stopped,
    /// Cancelled; `start` resumes it from its latest checkpoint.
    Cancelled,
    /// Failed past its restart strategy; `start` retries from its latest checkpoint.
    Failed,
    /// Not resumed by a restarted server: it was resumed [`QUARANTINE_AFTER`] times
    /// without reaching a completed checkpoint or an end. `start` runs it again.
    Quarantined,
}

/// How many times in a row a restarted server resumes a job that reaches neither a
/// completed checkpoint nor an end before it quarantines it. Three: one crash of the
/// server is bad luck, two could be, three in a row with the same job resumed each time
/// point at the job.
pub const QUARANTINE_AFTER: u32 = 3;

/// The log lines of a job whose lines left memory, in its folder.
const LOGS_FILE: &str = "logs.txt";

/// What the server keeps of a job on disk (`record.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct JobRecord {
    id: String,
    tenant: String,
    name: String,
    state: JobState,
    submitted_ms: u64,
    /// Operator name → SHA-256 of the plugin it runs, fixed at submission.
    plugins: BTreeMap<String, String>,
    /// Output files, relative to the job folder.
    output: Vec<String>,
    /// The folder name of the last savepoint.
    savepoint: Option<String>,
    /// Why the job last failed.
    failure: Option<String>,
    /// Restarts over all runs.
    restarts: u32,
    /// Times a restarted server resumed the job since it last reached a completed
    /// checkpoint or an end (saved before each resumption; see [`QUARANTINE_AFTER`]).
    #[serde(default)]
    recoveries: u32,
    /// Records its sources read in all its runs, as of the last one's end (a run
    /// resumed from a checkpoint after a failure reads again what came after it).
    #[serde(default)]
    records_read: u64,
    /// Its tasks and the edges between them, for the dashboard's graph.
    #[serde(default)]
    graph: Vec<ChainSummary>,
    /// Its last completed checkpoints and savepoints over all runs, oldest first (at
    /// most [`HISTORY`]), saved every few seconds while it runs and when a run ends.
    #[serde(default)]
    checkpoints: Vec<CheckpointSummary>,
    /// Checkpoints completed and aborted over all runs, as of the last save.
    #[serde(default)]
    checkpoint_counts: (u64, u64),
    /// Records its sink wrote in all its runs, as of the last one's end.
    #[serde(default)]
    records_written: u64,
    /// Whether it runs over several servers (`[cluster]`).
    #[serde(default)]
    cluster: bool,
}

/// Completed checkpoints a job's record keeps.
const HISTORY: usize = 20;

/// A completed checkpoint or savepoint, as the job's history keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct CheckpointSummary {
    id: u64,
    kind: String,
    /// Its folder's name.
    name: Option<String>,
    triggered_ms: i64,
    duration_ms: f64,
    /// The longest synchronous part of a task.
    max_sync_ms: f64,
    bytes: u64,
}

/// A task of a job's graph: its chain of vertices, parallelism and inputs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct ChainSummary {
    /// `source -> tokenize`.
    name: String,
    parallelism: u32,
    /// `(upstream task index, partitioner)`.
    inputs: Vec<(usize, String)>,
}

fn graph_summary(graph: &JobGraph) -> Vec<ChainSummary> {
    graph
        .chains
        .iter()
        .map(|c| ChainSummary {
            name: c.name(graph),
            parallelism: c.parallelism,
            inputs: c
                .inputs
                .iter()
                .map(|i| (i.from, i.partitioner.name().to_string()))
                .collect(),
        })
        .collect()
}

/// The files, under the job's directory, a file sink writing `file_name` with
/// `parallelism` subtasks commits its output to.
fn output_files(file_name: &str, parallelism: u32) -> Vec<String> {
    if parallelism <= 1 {
        return vec![format!("output/{file_name}")];
    }
    let path = Path::new(file_name);
    let stem = path.file_stem().unwrap_or_default().to_string_lossy();
    let ext = path
        .extension()
        .map(|e| format!(".{}", e.to_string_lossy()))
        .unwrap_or_default();
    (0..parallelism)
        .map(|i| format!("output/{stem}-{i}{ext}"))
        .collect()
}

/// A job the server knows.
struct JobEntry {
    dir: PathBuf,
    record: Mutex<JobRecord>,
    monitor: Mutex<Arc<JobMonitor>>,
    /// Where to send control requests while the job's thread runs.
    run: Mutex<Option<Sender<JobControl>>>,
    /// Operator instances of its current run.
    instances: AtomicU32,
    /// Subtasks (threads) of its current run.
    subtasks: AtomicU32,
    /// When its last run ended, while its metrics and log lines are still in memory.
    ended: Mutex<Option<Instant>>,
    /// Records read and written by its runs before the current one, which the current
    /// run's counts add to.
    counted_before: Mutex<(u64, u64)>,
    /// Its checkpoint history and counts before the current run.
    history_before: Mutex<(Vec<CheckpointSummary>, (u64, u64))>,
    /// Why the server cancels its run (a quota): the run then ends as failed with it.
    kill_cause: Mutex<Option<String>>,
    /// What this server's host of a cluster job does, while it runs.
    cluster: Mutex<Option<Arc<Mutex<HostView>>>>,
}

/// A job ready to run: on this server alone, or as this server's share of a job over
/// several servers (`[cluster]`).
enum Run {
    Local(Box<Job>),
    Cluster(Box<ClusterRun>),
}

/// A job over several servers, as this server runs its share.
struct ClusterRun {
    graph: JobGraph,
    settings: ClusterSettings,
}

impl Run {
    fn graph(&self) -> &JobGraph {
        match self {
            Run::Local(job) => job.graph(),
            Run::Cluster(c) => &c.graph,
        }
    }

    /// The operator instances and subtasks it may take on this server. A cluster job
    /// may take all of its units' (the group can give every unit to one server), so it
    /// is admitted for them all; finding its units asks the brokers for its source's
    /// partitions.
    fn needs(&self) -> Result<(u32, u32), ApiError> {
        let bad = |e: anyhow::Error| ApiError::bad(format!("{e:#}"));
        match self {
            Run::Local(job) => Ok((job.instances(), job.graph().subtasks())),
            Run::Cluster(c) => {
                let plan = Plan::new(&c.graph, &c.settings).map_err(bad)?;
                units_need(&plan, &c.settings).map_err(bad)
            }
        }
    }
}

/// The operator instances and subtasks of all of a plan's units.
fn units_need(plan: &Plan, settings: &ClusterSettings) -> Result<(u32, u32)> {
    let (mut instances, mut subtasks) = (0, 0);
    for unit in 0..plan.units() {
        let graph = plan.unit_graph(unit, settings, Path::new("unit"), "", None)?;
        instances += graph.operators().map(|o| o.parallelism).sum::<u32>();
        subtasks += graph.subtasks();
    }
    Ok((instances, subtasks))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The server's jobs, by id.
#[derive(Default)]
pub(super) struct Jobs {
    by_id: Mutex<BTreeMap<String, Arc<JobEntry>>>,
    /// Held while a submission checks quotas and starts its job, so that two submissions
    /// cannot both take the last slot.
    admission: Mutex<()>,
    /// Set while the server stops: jobs that end then stay `running` on disk.
    shutting_down: Arc<AtomicBool>,
    next: AtomicU64,
}

impl Jobs {
    /// Whether the server is stopping its jobs.
    pub(super) fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Relaxed)
    }
}

impl JobEntry {
    /// A job kept in `dir`, not running.
    fn new(dir: PathBuf, record: JobRecord) -> Arc<JobEntry> {
        let history = (record.checkpoints.clone(), record.checkpoint_counts);
        Arc::new(JobEntry {
            dir,
            record: Mutex::new(record),
            monitor: Mutex::new(Arc::new(JobMonitor::default())),
            run: Mutex::new(None),
            instances: AtomicU32::new(0),
            subtasks: AtomicU32::new(0),
            ended: Mutex::new(None),
            kill_cause: Mutex::new(None),
            cluster: Mutex::new(None),
            counted_before: Mutex::new((0, 0)),
            history_before: Mutex::new(history),
        })
    }

    fn record(&self) -> JobRecord {
        lock(&self.record).clone()
    }

    fn save(&self, record: &JobRecord) -> Result<()> {
        let json = serde_json::to_vec_pretty(record).expect("plain data");
        write_atomic(&self.dir.join("record.json"), &json)
    }

    fn update(&self, f: impl FnOnce(&mut JobRecord)) {
        let mut record = lock(&self.record);
        f(&mut record);
        if let Err(e) = self.save(&record) {
            tracing::error!("job {}: {e:#}", record.id);
        }
    }

    fn is_running(&self) -> bool {
        lock(&self.run).is_some()
    }

    /// Records read and written: live while it runs, else as of the end of its last run.
    fn records_read_written(&self, record: &JobRecord) -> (u64, u64) {
        if self.is_running() {
            let (read, written) = lock(&self.monitor).records_read_written();
            let (read_before, written_before) = *lock(&self.counted_before);
            (read_before + read, written_before + written)
        } else {
            (record.records_read, record.records_written)
        }
    }

    /// Its checkpoint history and counts, over its runs before the current one and the
    /// current one's so far (what [`JobRecord::checkpoints`] keeps).
    fn checkpoint_history(&self) -> (Vec<CheckpointSummary>, (u64, u64)) {
        let (mut history, (completed, aborted)) = lock(&self.history_before).clone();
        let stats = lock(&self.monitor).checkpoints();
        history.extend(stats.completed.iter().map(|c| CheckpointSummary {
            id: c.id,
            kind: format!("{:?}", c.kind).to_lowercase(),
            name: c.path.file_name().map(|n| n.to_string_lossy().into_owned()),
            triggered_ms: c.triggered_ms,
            duration_ms: c.duration.as_secs_f64() * 1e3,
            max_sync_ms: c.max_sync.as_secs_f64() * 1e3,
            bytes: c.bytes,
        }));
        let drop = history.len().saturating_sub(HISTORY);
        history.drain(..drop);
        let counts = (
            completed + stats.completed.len() as u64,
            aborted + stats.aborted.len() as u64,
        );
        (history, counts)
    }

    /// Saves the checkpoint history into the record, for a server that starts next
    /// (written only when it changed).
    fn save_history(&self) {
        let (history, counts) = self.checkpoint_history();
        if self.record().checkpoint_counts != counts {
            self.update(|r| {
                r.checkpoints = history;
                r.checkpoint_counts = counts;
            });
        }
    }

    /// Whether its current run completed a checkpoint or savepoint.
    fn completed_a_checkpoint(&self) -> bool {
        !lock(&self.monitor).checkpoints().completed.is_empty()
    }
}

impl Server {
    fn entry(&self, tenant: &TenantConfig, id: &str) -> Result<Arc<JobEntry>, ApiError> {
        let entry = lock(&self.jobs.by_id).get(id).cloned();
        match entry {
            Some(e) if lock(&e.record).tenant == tenant.name => Ok(e),
            // Another tenant's job is indistinguishable from no job.
            _ => Err(ApiError::not_found("job", id)),
        }
    }

    /// Builds the job a record describes: its file as submitted, with the server's
    /// choices for plugins, checkpoints and output.
    fn prepare(
        &self,
        tenant: &TenantConfig,
        text: &str,
        job_dir: &Path,
        plugins: &mut BTreeMap<String, String>,
    ) -> Result<(Run, Vec<String>), ApiError> {
        let shown = Path::new("job.toml");
        let mut file = JobFile::parse(text, shown).map_err(|e| ApiError::bad(format!("{e:#}")))?;
        if file.tenant != tenant.name && file.tenant != "default" {
            return Err(ApiError::new(
                ErrorKind::Forbidden,
                format!(
                    "job.toml names tenant '{}', but the token is tenant '{}'",
                    file.tenant, tenant.name
                ),
            ));
        }
        file.tenant = tenant.name.clone();
        let grant = tenant.kafka.as_ref();
        for (i, source) in file.source.iter_mut().enumerate() {
            let name = source.name.clone().unwrap_or_else(|| format!("#{}", i + 1));
            match (source.kind, grant) {
                (SourceKind::Generator, _) => {}
                (SourceKind::Kafka, Some(grant)) => {
                    source
                        .bootstrap
                        .get_or_insert_with(|| grant.bootstrap.join(","));
                }
                (SourceKind::Kafka, None) => return Err(no_kafka_grant(tenant, "source", &name)),
                _ => {
                    return Err(ApiError::bad(format!(
                        "job.toml: source {name}: only generator and kafka sources run on a \
                         server (a file or stdin source would read the server's own files and \
                         input)"
                    )));
                }
            }
        }
        for (i, sink) in file.sink.iter_mut().enumerate() {
            let name = sink.name.clone().unwrap_or_else(|| format!("#{}", i + 1));
            match (sink.kind, grant) {
                (SinkKind::File, _) => {
                    let file_name = sink
                        .path
                        .as_deref()
                        .and_then(Path::file_name)
                        .filter(|n| !n.to_string_lossy().starts_with('.'))
                        .map(|n| n.to_string_lossy().into_owned())
                        .ok_or_else(|| {
                            ApiError::bad(format!("job.toml: sink {name}: `path` must name a file"))
                        })?;
                    sink.path = Some(job_dir.join("output").join(&file_name));
                }
                (SinkKind::Kafka, Some(grant)) => {
                    sink.bootstrap
                        .get_or_insert_with(|| grant.bootstrap.join(","));
                }
                (SinkKind::Kafka, None) => return Err(no_kafka_grant(tenant, "sink", &name)),
                (SinkKind::Stdout, _) => {
                    return Err(ApiError::bad(format!(
                        "job.toml: sink {name}: a server job writes to a file sink (type = \"file\"), whose \
                         output is read back with GET /jobs/ID/output, or to a kafka sink",
                    )));
                }
            }
        }
        if let Some(checkpoint) = &mut file.checkpoint {
            checkpoint.dir = Some(job_dir.join("checkpoints"));
        }
        if let Some(spec) = &mut file.cluster {
            let Some(grant) = grant else {
                return Err(no_kafka_grant(tenant, "[cluster]", ""));
            };
            for (key, set) in [
                ("checkpoints", spec.checkpoints.is_some()),
                ("work_dir", spec.work_dir.is_some()),
            ] {
                if set {
                    return Err(ApiError::bad(format!(
                        "job.toml: [cluster]: `{key}` is the server's to choose (a tenant's \
                         checkpoint store is `checkpoints` in [tenant.{}.kafka] of the host \
                         configuration): leave it out",
                        tenant.name
                    )));
                }
            }
            let store = grant.checkpoints.clone().ok_or_else(|| {
                ApiError::new(
                    ErrorKind::Forbidden,
                    format!(
                        "job.toml: [cluster]: tenant '{}''s Kafka grant names no checkpoint \
                         store (`checkpoints` in [tenant.{}.kafka] of the host configuration), \
                         so it runs no job over several servers",
                        tenant.name, tenant.name
                    ),
                )
            })?;
            if let Some(c) = grant.id_prefix.chars().find(|c| !is_topic_char(*c)) {
                return Err(ApiError::new(
                    ErrorKind::Forbidden,
                    format!(
                        "job.toml: [cluster]: the job's topics are named under tenant '{}''s \
                         Kafka id_prefix {:?}, and a topic's name cannot hold {c:?}",
                        tenant.name, grant.id_prefix
                    ),
                ));
            }
            spec.bootstrap
                .get_or_insert_with(|| grant.bootstrap.join(","));
            spec.checkpoints = Some(store);
            spec.work_dir = Some(job_dir.join("cluster"));
        }
        for op in &mut file.operators {
            let hash = match plugins.get(&op.name) {
                Some(hash) => hash.clone(),
                None => {
                    let named = op.plugin.to_string_lossy();
                    let hash = match named.strip_prefix("sha256:") {
                        Some(hash) => hash.to_ascii_lowercase(),
                        None => self
                            .plugin_named(tenant, &named)
                            .map(|p| p.sha256)
                            .unwrap_or_default(),
                    };
                    plugins.insert(op.name.clone(), hash.clone());
                    hash
                }
            };
            op.plugin = self.plugin_path(&tenant.name, &hash).ok_or_else(|| {
                ApiError::bad(format!(
                    "job.toml: operator '{}': plugin {:?} was not uploaded by tenant '{}' \
                     (upload it first: POST /plugins?name=FILE.wasm)",
                    op.name,
                    op.plugin.display().to_string(),
                    tenant.name
                ))
            })?;
        }
        let mut graph =
            JobGraph::from_file(&file, shown).map_err(|e| ApiError::bad(format!("{e:#}")))?;
        // From the validated graph: its parallelism is within bounds.
        let output = graph
            .sinks()
            .filter_map(|s| Some((s.path.as_deref()?.file_name()?, s.parallelism)))
            .flat_map(|(name, parallelism)| output_files(&name.to_string_lossy(), parallelism))
            .collect();
        if let Some(grant) = grant {
            within_kafka_grant(&mut graph, grant, &tenant.name)?;
        }
        let bad = |e: anyhow::Error| ApiError::bad(format!("{e:#}"));
        let Some(grant) = grant.filter(|_| graph.cluster.is_some()) else {
            let job = Job::from_graph(graph, &self.engine, &self.host)
                .map_err(bad)?
                .with_budget(self.budget.clone());
            return Ok((Run::Local(Box::new(job)), output));
        };
        // Its plugins load, whichever units come here.
        Job::from_graph(graph.clone(), &self.engine, &self.host).map_err(bad)?;
        // (The host file's `[cluster]` is for `sluice run --cluster`: a server's come from
        // the grant.)
        let mut settings = ClusterSettings::of(&graph, None, None).map_err(bad)?;
        settings.name_prefix = grant.id_prefix.clone();
        Ok((
            Run::Cluster(Box::new(ClusterRun { graph, settings })),
            output,
        ))
    }

    /// Checks the tenant's quotas for one more running job. Called under the admission
    /// lock, which is held until the job is launched, so that what it counts is current.
    fn admit(
        &self,
        tenant: &TenantConfig,
        job: &str,
        (instances, subtasks): (u32, u32),
    ) -> Result<(), ApiError> {
        let (running, in_use, threads) = lock(&self.jobs.by_id)
            .values()
            .filter(|e| e.is_running() && lock(&e.record).tenant == tenant.name)
            .fold((0u32, 0u32, 0u32), |(jobs, instances, subtasks), e| {
                (
                    jobs + 1,
                    instances + e.instances.load(Ordering::Relaxed),
                    subtasks + e.subtasks.load(Ordering::Relaxed),
                )
            });
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
        let used = self.disk_usage(&tenant.name);
        if used >= tenant.max_disk_bytes {
            return Err(ApiError::new(
                ErrorKind::Quota,
                disk_quota_message(tenant, used),
            ));
        }
        Ok(())
    }

    /// Bytes the tenant's job folders and plugins take under the server's folder.
    pub(super) fn disk_usage(&self, tenant: &str) -> u64 {
        let dirs: Vec<PathBuf> = lock(&self.jobs.by_id)
            .values()
            .filter(|e| lock(&e.record).tenant == tenant)
            .map(|e| e.dir.clone())
            .collect();
        dirs.iter()
            .map(|d| dir_bytes(d))
            .sum::<u64>()
            .saturating_add(dir_bytes(&self.dir.join("plugins").join(tenant)))
    }

    /// Validates a job file, stores it and starts it. Nothing remains of a submission
    /// that fails.
    pub fn submit(&self, tenant: &TenantConfig, text: &str) -> Result<Object, ApiError> {
        if self.jobs.shutting_down.load(Ordering::Relaxed) {
            return Err(ApiError::new(
                ErrorKind::Conflict,
                "the server is shutting down",
            ));
        }
        let seq = self.jobs.next.fetch_add(1, Ordering::Relaxed);
        let seed = format!("{}/{}/{seq}/{}", tenant.name, now_ms(), std::process::id());
        let id = hex(&super::token_sha256(&seed)[..8]);
        let dir = self.dir.join("jobs").join(&id);
        let mut plugins = BTreeMap::new();
        let (run, output) = self.prepare(tenant, text, &dir, &mut plugins)?;
        let needs = run.needs()?;
        let _admission = lock(&self.jobs.admission);
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
        self.admit(tenant, &run.graph().name, needs)?;
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
            graph: graph_summary(run.graph()),
            checkpoints: Vec::new(),
            checkpoint_counts: (0, 0),
            cluster: matches!(run, Run::Cluster(_)),
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
        lock(&self.jobs.by_id).insert(id.clone(), entry.clone());
        self.launch(&entry, run, needs, RestorePoint::Fresh);
        tracing::info!(tenant = %tenant.name, job = %id, name = %record.name, "job submitted");
        Ok(summary(&record, true))
    }

    /// Starts the job's thread.
    /// Starts the job's thread; its run counts as `needs` (operator instances, subtasks)
    /// against the tenant's quotas (a cluster job resumed by a restarted server learns
    /// its needs from its plan, on the thread).
    fn launch(
        &self,
        entry: &Arc<JobEntry>,
        work: Run,
        needs: (u32, u32),
        options: impl Into<RunOptions>,
    ) {
        let options = options.into();
        let (tenant, id) = {
            let record = lock(&entry.record);
            (record.tenant.clone(), record.id.clone())
        };
        // Waits for a `forget` under way; afterwards the job's lines are in memory again.
        *lock(&entry.ended) = None;
        *lock(&entry.kill_cause) = None;
        if let Ok(text) = fs::read_to_string(entry.dir.join(LOGS_FILE)) {
            super::logs::JobLogs::global().restore(&id, &text);
        }
        entry.instances.store(needs.0, Ordering::Relaxed);
        entry.subtasks.store(needs.1, Ordering::Relaxed);
        let monitor = Arc::new(JobMonitor::default());
        *lock(&entry.monitor) = monitor.clone();
        {
            let record = lock(&entry.record);
            *lock(&entry.counted_before) = (record.records_read, record.records_written);
            *lock(&entry.history_before) = (record.checkpoints.clone(), record.checkpoint_counts);
        }
        let (control, control_rx) = unbounded();
        let mut run = lock(&entry.run);
        let finished = entry.clone();
        let shutting_down = self.jobs.shutting_down.clone();
        let (engine, host, budget) = (
            self.engine.clone(),
            Arc::new(self.host.clone()),
            self.budget.clone(),
        );
        let spawned = thread::Builder::new()
            .name(format!("job {id}"))
            .spawn(move || {
                // The job's own log lines (checkpoints, restarts) carry tenant and job.
                let _span = tracing::info_span!(super::logs::JOB_SPAN, tenant = %tenant, job = %id)
                    .entered();
                // A panic must not leave the job `running` with no thread behind it.
                let result = std::panic::catch_unwind(AssertUnwindSafe(|| match work {
                    Run::Local(job) => job
                        .run(options, &control_rx, &monitor)
                        .map(|report| report.outcome),
                    Run::Cluster(c) => {
                        let settings = c.settings.clone();
                        let host = ClusterHost::new(&c.graph, c.settings, engine, host)?
                            .with_budget(budget)
                            .quiet();
                        let (instances, subtasks) = units_need(host.plan(), &settings)?;
                        finished.instances.store(instances, Ordering::Relaxed);
                        finished.subtasks.store(subtasks, Ordering::Relaxed);
                        *lock(&finished.cluster) = Some(host.view());
                        Ok(match host.run(&control_rx)? {
                            HostEnd::JobFinished => JobOutcome::Finished,
                            HostEnd::Stopped => JobOutcome::Cancelled,
                        })
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
    let kill_cause = lock(&entry.kill_cause).take();
    let (read, written) = monitor.records_read_written();
    let (read_before, written_before) = *lock(&entry.counted_before);
    let checkpointed = !monitor.checkpoints().completed.is_empty();
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
            Err(e) => {
                r.state = JobState::Failed;
                r.failure = Some(format!("{e:#}"));
            }
        }
    });
    entry.save_history();
    let record = entry.record();
    tracing::info!(
        tenant = %record.tenant, job = %record.id, state = state_name(record.state),
        restarts = record.restarts, failure = record.failure.as_deref().unwrap_or(""),
        "job ended"
    );
    *lock(&entry.ended) = Some(Instant::now());
    lock(&entry.run).take();
}

/// The short form of a job, for lists and answers to control requests.
fn summary(record: &JobRecord, running: bool) -> Object {
    let mut o = Object::new();
    o.insert("id".into(), json!(record.id));
    o.insert("name".into(), json!(record.name));
    o.insert("state".into(), json!(record.state));
    o.insert("running".into(), json!(running));
    o.insert("submitted_ms".into(), json!(record.submitted_ms));
    o
}

impl Server {
    /// `tenant`'s jobs, oldest first.
    pub fn list_jobs(&self, tenant: &TenantConfig) -> Vec<Object> {
        let entries: Vec<Arc<JobEntry>> = lock(&self.jobs.by_id).values().cloned().collect();
        let mut jobs: Vec<(u64, Object)> = entries
            .iter()
            .map(|e| (e.record(), e))
            .filter(|(r, _)| r.tenant == tenant.name)
            .map(|(r, e)| {
                let mut o = summary(&r, e.is_running());
                let (read, written) = e.records_read_written(&r);
                o.insert("records_read".into(), json!(read));
                o.insert("records_written".into(), json!(written));
                let monitor = lock(&e.monitor).clone();
                o.insert("tenant".into(), json!(r.tenant));
                o.insert("restarts".into(), json!(r.restarts + monitor.attempt()));
                let last = monitor
                    .checkpoints()
                    .completed
                    .last()
                    .map(|c| json!({"id": c.id, "triggered_ms": c.triggered_ms}));
                o.insert("last_checkpoint".into(), json!(last));
                (r.submitted_ms, o)
            })
            .collect();
        jobs.sort_by_key(|(t, _)| *t);
        jobs.into_iter().map(|(_, o)| o).collect()
    }

    /// Everything about one of `tenant`'s jobs.
    pub fn job_detail(&self, tenant: &TenantConfig, id: &str) -> Result<Object, ApiError> {
        let entry = self.entry(tenant, id)?;
        let record = entry.record();
        let monitor = lock(&entry.monitor).clone();
        let cluster = lock(&entry.cluster)
            .as_ref()
            .filter(|_| record.cluster)
            .map(|view| lock(view).clone());
        let mut o = summary(&record, entry.is_running());
        let (read, written) = entry.records_read_written(&record);
        let checkpoints = monitor.checkpoints();
        let (history, (completed, aborted)) = entry.checkpoint_history();
        let last: Vec<_> = history
            .iter()
            .rev()
            .map(|c| {
                json!({
                    "status": "completed",
                    "triggered_ms": c.triggered_ms,
                    "id": c.id,
                    "kind": c.kind,
                    "name": c.name,
                    "duration_ms": c.duration_ms,
                    "max_sync_ms": c.max_sync_ms,
                    "bytes": c.bytes,
                })
            })
            .collect();
        let tasks: Vec<_> = monitor
            .tasks()
            .iter()
            .map(|t| {
                json!({
                    "task": t.task,
                    "records_in": t.records_in,
                    "records_out": t.records_out,
                    "busy_ms": t.busy.as_millis() as u64,
                    "idle_ms": t.idle.as_millis() as u64,
                    "backpressured_ms": t.backpressured.as_millis() as u64,
                    "mailbox_depth": t.mailbox_depth,
                    "watermark": t.watermark,
                    "source": t.source.as_ref().map(|src| json!({
                        "source": src.operator,
                        "subtask": src.subtask,
                        "records_out": src.records_out,
                        "counters": src.counters,
                        "lag": src.lag,
                    })),
                    "operators": t.operators.iter().map(|op| json!({
                        "operator": op.operator,
                        "subtask": op.subtask,
                        "records_in": op.records_in,
                        "records_out": op.records_out,
                        "busy_ms": op.busy.as_millis() as u64,
                        "memory_bytes": op.memory_bytes,
                        "counters": op.counters,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        let extra = [
            ("tenant", json!(record.tenant)),
            ("plugins", json!(record.plugins)),
            ("restarts", json!(record.restarts + monitor.attempt())),
            ("records_read", json!(read)),
            ("records_written", json!(written)),
            ("failures_by_kind", json!(monitor.failures_by_kind())),
            (
                "last_failure",
                json!(
                    monitor
                        .last_failure()
                        .or_else(|| cluster.as_ref()?.last_failure.clone())
                        .or(record.failure.clone())
                ),
            ),
            ("savepoint", json!(record.savepoint)),
            (
                "checkpoints",
                json!({
                    "completed": completed,
                    "aborted": aborted,
                    "last": last,
                    "last_aborted": checkpoints.aborted.iter().rev().take(5)
                        .map(|(id, reason)| json!({"id": id, "status": "aborted", "reason": reason}))
                        .collect::<Vec<_>>(),
                }),
            ),
            ("tasks", json!(tasks)),
            ("graph", json!(record.graph)),
            ("output", json!(record.output)),
            (
                "cluster",
                match cluster {
                    Some(view) => json!({
                        "host": view.client_id,
                        "units": view.units,
                        "owned": view.owned,
                        "running": view.running,
                        "finished": view.finished,
                        "failures": view.failures,
                        "last_failure": view.last_failure,
                    }),
                    None => json!(record.cluster),
                },
            ),
        ];
        o.extend(extra.into_iter().map(|(k, v)| (k.to_string(), v)));
        Ok(o)
    }

    /// The committed output files of one of `tenant`'s jobs that exist, for the API to
    /// stream one after the other: every file sink's, in the job file's order and each
    /// in subtask order, or only `file` (one of them, as the job's status lists them).
    pub fn job_output(
        &self,
        tenant: &TenantConfig,
        id: &str,
        file: Option<&str>,
    ) -> Result<Vec<PathBuf>, ApiError> {
        let entry = self.entry(tenant, id)?;
        let files = entry.record().output;
        if let Some(file) = file
            && !files.iter().any(|f| f == file)
        {
            return Err(ApiError::new(
                ErrorKind::NotFound,
                format!("job {id} has no output file {file:?} (it has: {files:?})"),
            ));
        }
        Ok(files
            .iter()
            .filter(|f| file.is_none_or(|file| file == f.as_str()))
            .map(|f| entry.dir.join(f))
            .filter(|path| path.is_file())
            .collect())
    }

    /// The recent log lines of one of `tenant`'s jobs as text, oldest first, after a line
    /// saying how many older ones were dropped (if any): from memory, or from its folder
    /// once they left memory.
    pub fn job_logs(&self, tenant: &TenantConfig, id: &str) -> Result<String, ApiError> {
        let entry = self.entry(tenant, id)?;
        let logs = super::logs::JobLogs::global();
        if let Some(text) = logs.text(id) {
            return Ok(text);
        }
        match fs::read_to_string(entry.dir.join(LOGS_FILE)) {
            Ok(text) => Ok(text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
            Err(e) => Err(ApiError::internal(anyhow::anyhow!(
                "job {id}: reading {LOGS_FILE}: {e}"
            ))),
        }
    }

    fn control(&self, entry: &JobEntry, what: &str) -> Result<Sender<JobControl>, ApiError> {
        match lock(&entry.run).as_ref() {
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
    fn no_savepoints(entry: &JobEntry, what: &str) -> Result<(), ApiError> {
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
    pub fn cancel(&self, tenant: &TenantConfig, id: &str) -> Result<Object, ApiError> {
        let entry = self.entry(tenant, id)?;
        let control = self.control(&entry, "cancel")?;
        let _ = control.send(JobControl::Cancel);
        wait_until_ended(&entry, Duration::from_secs(30));
        Ok(summary(&entry.record(), entry.is_running()))
    }

    /// Stops one of `tenant`'s jobs with a savepoint; `drain` first fires all event-time
    /// timers. Returns when the savepoint is written.
    pub fn stop(&self, tenant: &TenantConfig, id: &str, drain: bool) -> Result<Object, ApiError> {
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

    /// Takes a savepoint of one of `tenant`'s running jobs without stopping it. Returns
    /// when it is written.
    pub fn savepoint(&self, tenant: &TenantConfig, id: &str) -> Result<Object, ApiError> {
        let entry = self.entry(tenant, id)?;
        Self::no_savepoints(&entry, "take a savepoint of")?;
        let control = self.control(&entry, "take a savepoint of")?;
        let (reply, answer) = unbounded();
        let _ = control.send(JobControl::Savepoint { reply });
        match answer.recv_timeout(Duration::from_secs(300)) {
            Ok(Ok(path)) => {
                let name = path
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let mut object = Object::new();
                object.insert("savepoint".into(), json!(name));
                Ok(object)
            }
            Ok(Err(e)) => Err(ApiError::new(
                ErrorKind::Conflict,
                format!("the savepoint of job '{id}' failed: {e}"),
            )),
            Err(_) => Err(ApiError::new(
                ErrorKind::Conflict,
                format!("job '{id}' ended before its savepoint completed"),
            )),
        }
    }

    /// Starts a stopped, cancelled or failed job of `tenant` again, from `savepoint` (a
    /// folder name in its checkpoints) or else its latest complete checkpoint or savepoint.
    /// A savepoint older than the committed output is refused unless `allow_rewind`.
    pub fn start(
        &self,
        tenant: &TenantConfig,
        id: &str,
        savepoint: Option<&str>,
        allow_rewind: bool,
    ) -> Result<Object, ApiError> {
        let entry = self.entry(tenant, id)?;
        let _admission = lock(&self.jobs.admission);
        let record = entry.record();
        if entry.is_running() || record.state == JobState::Finished {
            return Err(ApiError::new(
                ErrorKind::Conflict,
                format!(
                    "cannot start job '{id}': it is {}",
                    state_name(record.state)
                ),
            ));
        }
        let text = fs::read_to_string(entry.dir.join("job.toml"))
            .map_err(|e| ApiError::internal(anyhow::anyhow!("job {id}: job.toml: {e}")))?;
        let mut plugins = record.plugins.clone();
        let (run, _) = self.prepare(tenant, &text, &entry.dir, &mut plugins)?;
        let needs = run.needs()?;
        self.admit(tenant, &record.name, needs)?;
        let job = match run {
            Run::Local(job) => job,
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
                entry.update(|r| {
                    r.state = JobState::Running;
                    r.failure = None;
                    r.recoveries = 0;
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
            None => latest_or_fresh(&entry.dir),
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
        entry.update(|r| {
            r.state = JobState::Running;
            r.failure = None;
            r.graph = graph;
            // A person starting it again takes it out of quarantine.
            r.recoveries = 0;
        });
        self.launch(&entry, Run::Local(job), needs, options);
        Ok(summary(&entry.record(), true))
    }

    /// Deletes one of `tenant`'s jobs that is not running, with its folder: job file,
    /// record, checkpoints, savepoints, output and logs.
    pub fn delete(&self, tenant: &TenantConfig, id: &str) -> Result<Object, ApiError> {
        let entry = self.entry(tenant, id)?;
        // Under the admission lock, so that no `start` launches it meanwhile, and with
        // its lines' lock, so that no `forget` writes them into the folder meanwhile.
        let _admission = lock(&self.jobs.admission);
        let _ended = lock(&entry.ended);
        if entry.is_running() {
            return Err(ApiError::new(
                ErrorKind::Conflict,
                format!("cannot delete job '{id}': it is running (stop or cancel it first)"),
            ));
        }
        let summary = summary(&entry.record(), false);
        lock(&self.jobs.by_id).remove(id);
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

    /// Runs `f` under the lock that submissions and starts take to admit a job.
    pub(super) fn admitting<T>(&self, f: impl FnOnce() -> T) -> T {
        let _admission = lock(&self.jobs.admission);
        f()
    }

    /// The ids of `tenant`'s jobs that could run plugin `sha256` again (any but finished
    /// ones).
    pub(super) fn jobs_using_plugin(&self, tenant: &TenantConfig, sha256: &str) -> Vec<String> {
        lock(&self.jobs.by_id)
            .values()
            .map(|e| e.record())
            .filter(|r| r.tenant == tenant.name && r.state != JobState::Finished)
            .filter(|r| r.plugins.values().any(|p| p == sha256))
            .map(|r| r.id)
            .collect()
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
            lock(&self.jobs.by_id).insert(record.id.clone(), entry.clone());
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
            match self.prepare(&tenant, &text, &dir, &mut plugins) {
                Ok((run, _)) => {
                    let needs = match &run {
                        Run::Local(_) => run.needs().unwrap_or_default(),
                        Run::Cluster(_) => (0, 0),
                    };
                    self.launch(&entry, run, needs, latest_or_fresh(&dir));
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
        self.jobs.shutting_down.store(true, Ordering::Relaxed);
        let entries: Vec<Arc<JobEntry>> = lock(&self.jobs.by_id).values().cloned().collect();
        let mut answers = Vec::new();
        for entry in &entries {
            if let Some(control) = lock(&entry.run).as_ref() {
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

    /// What the server does every few seconds while it runs: it enforces disk quotas,
    /// clears the resumption count of jobs that completed a checkpoint, and forgets the
    /// metrics and log lines of jobs that ended long enough ago.
    pub(super) fn housekeeping(&self) {
        let entries: Vec<Arc<JobEntry>> = lock(&self.jobs.by_id).values().cloned().collect();
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
                *lock(&entry.kill_cause) = Some(cause.clone());
                if let Some(control) = lock(&entry.run).as_ref() {
                    let _ = control.send(JobControl::Cancel);
                }
            }
        }

        let settings = &self.host.server;
        let mut ended: Vec<(Instant, &Arc<JobEntry>)> = entries
            .iter()
            .filter_map(|e| lock(&e.ended).map(|at| (at, e)))
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
    fn forget(&self, entry: &JobEntry) {
        // Held throughout, so a launch waits until the lines are on disk.
        let mut ended = lock(&entry.ended);
        if entry.is_running() {
            return;
        }
        let id = entry.record().id;
        if let Some(text) = super::logs::JobLogs::global().take(&id)
            && let Err(e) = write_atomic(&entry.dir.join(LOGS_FILE), text.as_bytes())
        {
            tracing::error!("job {id}: keeping its log lines: {e:#}");
        }
        *lock(&entry.monitor) = Arc::new(JobMonitor::default());
        // The run's checkpoints are in the record now; they are its history.
        let record = entry.record();
        *lock(&entry.history_before) = (record.checkpoints, record.checkpoint_counts);
        *ended = None;
    }

    /// Per tenant, job and operator metrics of `tenant`, in Prometheus' text format.
    pub fn metrics(&self, tenant: &TenantConfig) -> String {
        let mut m = super::api::Metrics::default();
        let entries: Vec<Arc<JobEntry>> = lock(&self.jobs.by_id).values().cloned().collect();
        let t = tenant.name.as_str();
        let mut states: BTreeMap<&'static str, u64> = BTreeMap::new();
        for entry in entries {
            let record = entry.record();
            if record.tenant != tenant.name {
                continue;
            }
            *states.entry(state_name(record.state)).or_default() += 1;
            let monitor = lock(&entry.monitor).clone();
            let job = [("tenant", t), ("job", record.id.as_str())];
            m.add(
                "sluice_job_restarts_total",
                "counter",
                "Restarts after failures.",
                &job,
                (record.restarts + monitor.attempt()) as f64,
            );
            for (kind, n) in monitor.failures_by_kind() {
                let labels = [job[0], job[1], ("kind", kind.as_str())];
                m.add(
                    "sluice_job_failures_total",
                    "counter",
                    "Failed attempts by kind (traps, deadlines, memory, errors).",
                    &labels,
                    n as f64,
                );
            }
            let checkpoints = monitor.checkpoints();
            m.add(
                "sluice_checkpoints_completed_total",
                "counter",
                "Completed checkpoints and savepoints.",
                &job,
                checkpoints.completed.len() as f64,
            );
            m.add(
                "sluice_checkpoints_aborted_total",
                "counter",
                "Aborted checkpoints.",
                &job,
                checkpoints.aborted.len() as f64,
            );
            if let Some(c) = checkpoints.completed.last() {
                m.add(
                    "sluice_checkpoint_last_duration_seconds",
                    "gauge",
                    "Trigger to completion of the last checkpoint.",
                    &job,
                    c.duration.as_secs_f64(),
                );
                m.add(
                    "sluice_checkpoint_last_size_bytes",
                    "gauge",
                    "Bytes written by the last checkpoint.",
                    &job,
                    c.bytes as f64,
                );
            }
            for c in &checkpoints.completed {
                m.observe(
                    "sluice_checkpoint_duration_seconds",
                    "Trigger to completion of the checkpoints and savepoints completed.",
                    &job,
                    c.duration.as_secs_f64(),
                );
                m.observe(
                    "sluice_checkpoint_sync_seconds",
                    "The longest synchronous part of a task in each completed checkpoint (how \
                     long its records waited).",
                    &job,
                    c.max_sync.as_secs_f64(),
                );
            }
            for task in monitor.tasks() {
                if let Some(watermark) = task.watermark {
                    let labels = [job[0], job[1], ("task", task.task.as_str())];
                    m.add(
                        "sluice_task_watermark_milliseconds",
                        "gauge",
                        "The task's current input watermark (event time).",
                        &labels,
                        watermark as f64,
                    );
                    m.add(
                        "sluice_task_watermark_lag_seconds",
                        "gauge",
                        "Wall-clock time minus the task's watermark.",
                        &labels,
                        (now_ms() as f64 - watermark as f64) / 1e3,
                    );
                }
                for op in &task.operators {
                    let subtask = op.subtask.to_string();
                    let labels = [
                        job[0],
                        job[1],
                        ("operator", op.operator.as_str()),
                        ("subtask", subtask.as_str()),
                    ];
                    m.add(
                        "sluice_operator_records_in_total",
                        "counter",
                        "Records into an operator.",
                        &labels,
                        op.records_in as f64,
                    );
                    m.add(
                        "sluice_operator_records_out_total",
                        "counter",
                        "Records out of an operator.",
                        &labels,
                        op.records_out as f64,
                    );
                    m.add(
                        "sluice_operator_busy_seconds_total",
                        "counter",
                        "Time spent in an operator's calls.",
                        &labels,
                        op.busy.as_secs_f64(),
                    );
                    m.add(
                        "sluice_operator_memory_bytes",
                        "gauge",
                        "Linear memory of an operator instance.",
                        &labels,
                        op.memory_bytes as f64,
                    );
                }
                for op in task.source.iter().chain(&task.operators) {
                    let subtask = op.subtask.to_string();
                    for (counter, n) in &op.counters {
                        let labels = [
                            job[0],
                            job[1],
                            ("operator", op.operator.as_str()),
                            ("subtask", subtask.as_str()),
                            ("counter", counter.as_str()),
                        ];
                        m.add(
                            "sluice_operator_counter_total",
                            "counter",
                            "Counters of operators, sources and sinks (Kafka records, bytes and \
                             transactions among them).",
                            &labels,
                            *n as f64,
                        );
                    }
                    for (partition, lag) in &op.lag {
                        let labels = [
                            job[0],
                            job[1],
                            ("source", op.operator.as_str()),
                            ("subtask", subtask.as_str()),
                            ("partition", partition.as_str()),
                        ];
                        m.add(
                            "sluice_source_lag_records",
                            "gauge",
                            "Records behind the end of a partition a source reads (consumer lag).",
                            &labels,
                            *lag as f64,
                        );
                    }
                }
            }
        }
        for (state, n) in states {
            m.add(
                "sluice_jobs",
                "gauge",
                "Jobs by state.",
                &[("tenant", t), ("state", state)],
                n as f64,
            );
        }
        m.finish()
    }
}

/// Why a job that uses Kafka is refused to a tenant without a grant.
fn no_kafka_grant(tenant: &TenantConfig, what: &str, name: &str) -> ApiError {
    let what = if name.is_empty() {
        what.to_string()
    } else {
        format!("{what} {name}")
    };
    ApiError::new(
        ErrorKind::Forbidden,
        format!(
            "job.toml: {what}: tenant '{}' has no Kafka grant ([tenant.{}.kafka] in the \
             host configuration)",
            tenant.name, tenant.name
        ),
    )
}

/// Client properties a server job may set itself: tuning only, each within bounds
/// (buffers multiply by its subtasks, and all share the server's memory). Anything that
/// reaches further — brokers, credentials, files on the server, plugins librdkafka would
/// load, commands it would run (`sasl.kerberos.kinit.cmd`) — is the grant's to set.
const JOB_PROPERTIES: &[(&str, u64, u64)] = &[
    ("fetch.min.bytes", 1, 16 << 20),
    ("fetch.max.bytes", 1, 64 << 20),
    ("fetch.wait.max.ms", 0, 60_000),
    ("fetch.queue.backoff.ms", 0, 60_000),
    ("fetch.error.backoff.ms", 0, 60_000),
    ("max.partition.fetch.bytes", 1, 16 << 20),
    ("queued.min.messages", 1, 1_000_000),
    ("queued.max.messages.kbytes", 1, 64 << 10),
    ("queue.buffering.max.messages", 1, 1_000_000),
    ("queue.buffering.max.kbytes", 1, 64 << 10),
    ("queue.buffering.max.ms", 0, 60_000),
    ("linger.ms", 0, 60_000),
    ("batch.num.messages", 1, 1_000_000),
    ("batch.size", 1, 16 << 20),
    ("message.max.bytes", 1000, 16 << 20),
    ("receive.message.max.bytes", 1000, 80 << 20),
    ("message.timeout.ms", 0, 3_600_000),
    ("transaction.timeout.ms", 1000, 900_000),
    ("session.timeout.ms", 1, 3_600_000),
    ("heartbeat.interval.ms", 1, 3_600_000),
    ("socket.timeout.ms", 10, 300_000),
    ("retry.backoff.ms", 1, 60_000),
    ("retries", 0, 1_000_000),
    ("statistics.interval.ms", 100, 86_400_000),
];

/// Compression a server job may choose (`compression.type` or `compression.codec`).
const COMPRESSIONS: &[&str] = &["none", "gzip", "snappy", "lz4", "zstd"];

/// Why a server job may not set client property `key` to `value`, if it may not.
fn job_property_refused(key: &str, value: &str) -> Option<String> {
    if key == "compression.type" || key == "compression.codec" {
        return (!COMPRESSIONS.contains(&value)).then(|| {
            format!(
                "property {key:?} must be one of {}",
                COMPRESSIONS.join(", ")
            )
        });
    }
    let Some((_, min, max)) = JOB_PROPERTIES.iter().find(|(k, _, _)| *k == key) else {
        let known: Vec<&str> = JOB_PROPERTIES.iter().map(|(k, _, _)| *k).collect();
        return Some(format!(
            "property {key:?} is not one a server job may set (only tuning: {}, \
             compression.type)",
            known.join(", ")
        ));
    };
    match value.trim().parse::<u64>() {
        Ok(n) if (*min..=*max).contains(&n) => None,
        _ => Some(format!(
            "property {key:?} = {value:?} must be a whole number from {min} to {max}"
        )),
    }
}

/// Keeps a server job's Kafka sources, sink and `[cluster]` within its tenant's grant:
/// brokers and topics it names must be granted (refused with the reason otherwise), a topic pattern
/// reads only granted topics, group and transactional ids begin with the grant's
/// `id_prefix` (put in front where they do not), and the grant's client properties go
/// over the job's own, which may only tune.
fn within_kafka_grant(
    graph: &mut JobGraph,
    grant: &crate::tenant::KafkaGrant,
    tenant: &str,
) -> Result<(), ApiError> {
    let forbidden = |what: String| {
        ApiError::new(
            ErrorKind::Forbidden,
            format!("job.toml: {what}, outside tenant '{tenant}''s Kafka grant"),
        )
    };
    let check_common = |what: &str,
                        bootstrap: &str,
                        properties: &mut BTreeMap<String, String>|
     -> Result<(), ApiError> {
        for broker in bootstrap
            .split(',')
            .map(str::trim)
            .filter(|b| !b.is_empty())
        {
            if !grant.bootstrap.iter().any(|b| b == broker) {
                return Err(forbidden(format!(
                    "{what}: broker {broker:?} is not one of {:?}",
                    grant.bootstrap
                )));
            }
        }
        if let Some(why) = properties
            .iter()
            .find_map(|(k, v)| job_property_refused(k, v))
        {
            return Err(forbidden(format!("{what}: {why}")));
        }
        properties.extend(grant.properties.clone());
        Ok(())
    };
    let prefixed = |id: &mut String| {
        if !id.starts_with(&grant.id_prefix) {
            *id = format!("{}{id}", grant.id_prefix);
        }
    };
    for vertex in &mut graph.vertices {
        match vertex {
            Vertex::Source(source) => {
                let SourceInput::Kafka(config) = &mut source.input else {
                    continue;
                };
                let what = format!("source '{}'", source.name);
                check_common(&what, &config.bootstrap, &mut config.properties)?;
                if let Topics::Names(names) = &config.topics
                    && let Some(topic) = names.iter().find(|t| !grant.may_read(t))
                {
                    return Err(forbidden(format!(
                        "{what}: topic {topic:?} may not be read (readable: {:?})",
                        grant.read
                    )));
                }
                if grant.read.is_empty() {
                    return Err(forbidden(format!(
                        "{what}: the grant lets the tenant read no topic (its `read` is empty)"
                    )));
                }
                config.allowed = Some(grant.read.clone());
                prefixed(&mut config.group);
            }
            Vertex::Sink(sink) => {
                let Some(config) = &mut sink.kafka else {
                    continue;
                };
                let what = format!("sink '{}'", sink.name);
                check_common(&what, &config.bootstrap, &mut config.properties)?;
                if !grant.may_write(&config.topic) {
                    return Err(forbidden(format!(
                        "{what}: topic {:?} may not be written (writable: {:?})",
                        config.topic, grant.write
                    )));
                }
                prefixed(&mut config.transactional_id_prefix);
            }
            Vertex::Operator(_) => {}
        }
    }
    // A job over several servers meets at granted brokers, and its own clients (the
    // control group, exchange topics) get the grant's properties too.
    if let Some(spec) = &mut graph.cluster {
        let bootstrap = spec.bootstrap.clone().unwrap_or_default();
        let properties = spec.properties.get_or_insert_with(BTreeMap::new);
        check_common("[cluster]", &bootstrap, properties)?;
    }
    Ok(())
}

fn state_name(state: JobState) -> &'static str {
    match state {
        JobState::Running => "running",
        JobState::Finished => "finished",
        JobState::Stopped => "stopped",
        JobState::Cancelled => "cancelled",
        JobState::Failed => "failed",
        JobState::Quarantined => "quarantined",
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

/// Bytes of the files under `path` (symbolic links are not followed; what cannot be read
/// counts nothing).
fn dir_bytes(path: &Path) -> u64 {
    let Ok(meta) = fs::symlink_metadata(path) else {
        return 0;
    };
    if !meta.is_dir() {
        return meta.len();
    }
    fs::read_dir(path)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| dir_bytes(&e.path()))
                .fold(0u64, u64::saturating_add)
        })
        .unwrap_or(0)
}

/// The latest complete checkpoint or savepoint of a job folder, or a fresh start.
fn latest_or_fresh(job_dir: &Path) -> RestorePoint {
    let dir = job_dir.join("checkpoints");
    match CheckpointStorage::new(&dir).and_then(|s| s.find_latest()) {
        Ok(Some(_)) => RestorePoint::Latest,
        _ => RestorePoint::Fresh,
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
