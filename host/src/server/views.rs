//! What the REST API serves of jobs, built as the types of [`super::model`]: their
//! summaries and details, output files and log lines.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::model::{
    AbortedCheckpoint, CallInProgress, ChainSummary, CheckpointHistory, CheckpointInProgress,
    CheckpointRef, CheckpointStatus, ClusterGroupMember, ClusterGroupUnit, ClusterHostStatus,
    ClusterStatus, CompletedCheckpoint, JobDetail, JobException, JobList, JobOverview, JobState,
    JobSummary, OperatorMetrics, SourceMetrics, TaskMetrics, rfc3339,
};
use super::registry::{JobEntry, JobRecord, LOGS_FILE};
use super::{ApiError, ErrorKind, Server};
use crate::job::JobGraph;
use crate::metrics::{OperatorReport, TaskReport};
use crate::tenant::TenantConfig;

/// A completed checkpoint or savepoint, as the job's history keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct CheckpointSummary {
    pub(super) id: u64,
    pub(super) kind: String,
    /// Its folder's name.
    pub(super) name: Option<String>,
    pub(super) triggered_ms: i64,
    pub(super) duration_ms: f64,
    /// The longest synchronous part of a task.
    pub(super) max_sync_ms: f64,
    /// The longest asynchronous part of a task.
    #[serde(default)]
    pub(super) max_async_ms: f64,
    pub(super) bytes: u64,
    #[serde(default)]
    pub(super) full_bytes: u64,
    /// Files it wrote (state files and RocksDB tables copied).
    #[serde(default)]
    pub(super) files: u32,
}

pub(super) fn graph_summary(graph: &JobGraph) -> Vec<ChainSummary> {
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
pub(super) fn output_files(file_name: &str, parallelism: u32) -> Vec<String> {
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

/// The short form of a job, for lists and answers to control requests.
pub(super) fn summary(record: &JobRecord, running: bool) -> JobSummary {
    JobSummary {
        id: record.id.clone(),
        name: record.name.clone(),
        state: record.state,
        running,
        submitted_ms: record.submitted_ms,
        submitted: rfc3339(record.submitted_ms as i64),
    }
}

fn task_metrics(task: &TaskReport) -> TaskMetrics {
    TaskMetrics {
        task: task.task.clone(),
        records_in: task.records_in,
        records_out: task.records_out,
        busy_ms: task.busy.as_millis() as u64,
        idle_ms: task.idle.as_millis() as u64,
        backpressured_ms: task.backpressured.as_millis() as u64,
        mailbox_depth: task.mailbox_depth,
        watermark: task.watermark,
        source: task.source.as_ref().map(|src| SourceMetrics {
            source: src.operator.clone(),
            subtask: src.subtask,
            records_out: src.records_out,
            counters: src.counters.clone(),
            lag: src.lag.clone(),
        }),
        operators: task.operators.iter().map(operator_metrics).collect(),
        unit: task.unit,
        host: task.host.clone(),
    }
}

fn operator_metrics(op: &OperatorReport) -> OperatorMetrics {
    OperatorMetrics {
        operator: op.operator.clone(),
        subtask: op.subtask,
        records_in: op.records_in,
        records_out: op.records_out,
        busy_ms: op.busy.as_millis() as u64,
        memory_bytes: op.memory_bytes,
        state_memory_bytes: op.state_memory_bytes,
        state_disk_bytes: op.state_disk_bytes,
        counters: op.counters.clone(),
        in_call: op.in_call.as_ref().map(|c| CallInProgress {
            call: c.call.clone(),
            running_ms: c.running.as_millis() as u64,
        }),
    }
}

impl Server {
    /// `tenant`'s jobs, oldest first.
    pub fn list_jobs(&self, tenant: &TenantConfig) -> JobList {
        let entries: Vec<Arc<JobEntry>> = self.jobs.by_id.lock().values().cloned().collect();
        let mut jobs: Vec<JobOverview> = entries
            .iter()
            .map(|e| (e.record(), e))
            .filter(|(r, _)| r.tenant == tenant.name)
            .map(|(r, e)| {
                let (records_read, records_written) = e.records_read_written(&r);
                let monitor = e.monitor.lock().clone();
                let last_checkpoint =
                    monitor
                        .checkpoints()
                        .completed
                        .last()
                        .map(|c| CheckpointRef {
                            id: c.id,
                            triggered_ms: c.triggered_ms,
                            triggered: rfc3339(c.triggered_ms),
                        });
                JobOverview {
                    job: summary(&r, e.is_running()),
                    tenant: r.tenant.clone(),
                    records_read,
                    records_written,
                    records_committed: e.records_committed(&r),
                    restarts: e.restarts(),
                    last_checkpoint,
                }
            })
            .collect();
        jobs.sort_by_key(|j| j.job.submitted_ms);
        JobList { jobs }
    }

    /// Everything about one of `tenant`'s jobs.
    pub fn job_detail(&self, tenant: &TenantConfig, id: &str) -> Result<JobDetail, ApiError> {
        let entry = self.entry(tenant, id)?;
        let record = entry.record();
        let running = entry.is_running();
        let monitor = entry.monitor.lock().clone();
        let cluster = monitor.cluster_view().filter(|_| record.cluster);
        let (records_read, records_written) = entry.records_read_written(&record);
        let checkpoints = monitor.checkpoints();
        let (history, (completed, aborted)) = entry.checkpoint_history();
        let last = history
            .iter()
            .rev()
            .map(|c| CompletedCheckpoint {
                status: CheckpointStatus::Completed,
                id: c.id,
                kind: c.kind.clone(),
                name: c.name.clone(),
                triggered_ms: c.triggered_ms,
                triggered: rfc3339(c.triggered_ms),
                duration_ms: c.duration_ms,
                max_sync_ms: c.max_sync_ms,
                max_async_ms: c.max_async_ms,
                bytes: c.bytes,
                full_bytes: c.full_bytes,
                files: c.files,
            })
            .collect();
        let last_aborted = checkpoints
            .aborted
            .iter()
            .rev()
            .take(5)
            .map(|(id, reason)| AbortedCheckpoint {
                id: *id,
                status: CheckpointStatus::Aborted,
                reason: reason.clone(),
            })
            .collect();
        let last_failure = monitor
            .last_failure()
            .or_else(|| cluster.as_ref()?.last_failure.clone())
            .or(record.failure.clone());
        let cluster = match cluster {
            Some(view) => ClusterStatus::Host(ClusterHostStatus {
                host: view.client_id,
                units: view.units,
                owned: view.owned,
                running: view.running,
                finished: view.finished,
                failures: view.failures,
                last_failure: view.last_failure,
                group: view
                    .members
                    .into_iter()
                    .map(|m| ClusterGroupMember {
                        host: m.client_id,
                        address: m.host,
                        units: m
                            .units
                            .into_iter()
                            .map(|u| ClusterGroupUnit {
                                unit: u.unit,
                                runs: u.runs,
                            })
                            .collect(),
                    })
                    .collect(),
            }),
            None => ClusterStatus::Flag(record.cluster),
        };
        Ok(JobDetail {
            job: summary(&record, running),
            tenant: record.tenant.clone(),
            plugins: record.plugins.clone(),
            restarts: entry.restarts(),
            records_read,
            records_written,
            records_committed: entry.records_committed(&record),
            failures_by_kind: monitor.failures_by_kind(),
            last_failure,
            savepoint: record.savepoint.clone(),
            checkpoints: CheckpointHistory {
                completed,
                aborted,
                last,
                last_aborted,
                // (What a coordinator left in flight when its run ended is not.)
                in_progress: if running {
                    checkpoints
                        .in_progress
                        .iter()
                        .map(|c| CheckpointInProgress {
                            id: c.id,
                            kind: c.kind.name().to_string(),
                            triggered_ms: c.triggered_ms,
                            acknowledged: c.acknowledged,
                            tasks: c.tasks,
                            bytes: c.bytes,
                        })
                        .collect()
                } else {
                    Vec::new()
                },
            },
            tasks: monitor.tasks().iter().map(task_metrics).collect(),
            graph: record.graph.clone(),
            output: record.output.clone(),
            cluster,
            exceptions: monitor
                .failure_history()
                .into_iter()
                .rev()
                .map(|f| JobException {
                    at: rfc3339(f.at_ms),
                    at_ms: f.at_ms,
                    attempt: f.attempt,
                    kind: f.kind,
                    error: f.error,
                })
                .collect(),
            job_file: fs::read_to_string(entry.dir.join("job.toml"))
                .ok()
                .and_then(|text| super::job_file::masked(&text)),
        })
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
}

pub(super) fn state_name(state: JobState) -> &'static str {
    match state {
        JobState::Running => "running",
        JobState::Finished => "finished",
        JobState::Stopped => "stopped",
        JobState::Cancelled => "cancelled",
        JobState::Failed => "failed",
        JobState::Quarantined => "quarantined",
    }
}
