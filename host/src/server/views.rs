//! The JSON views of jobs the REST API serves: their summaries and details, output files
//! and log lines.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::registry::{JobEntry, JobRecord, JobState, LOGS_FILE};
use super::{ApiError, ErrorKind, Object, Server};
use crate::job::JobGraph;
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
    pub(super) bytes: u64,
}

/// A task of a job's graph: its chain of vertices, parallelism and inputs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct ChainSummary {
    /// `source -> tokenize`.
    name: String,
    parallelism: u32,
    /// `(upstream task index, partitioner)`.
    inputs: Vec<(usize, String)>,
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
pub(super) fn summary(record: &JobRecord, running: bool) -> Object {
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
        let entries: Vec<Arc<JobEntry>> = self.jobs.by_id.lock().values().cloned().collect();
        let mut jobs: Vec<(u64, Object)> = entries
            .iter()
            .map(|e| (e.record(), e))
            .filter(|(r, _)| r.tenant == tenant.name)
            .map(|(r, e)| {
                let mut o = summary(&r, e.is_running());
                let (read, written) = e.records_read_written(&r);
                o.insert("records_read".into(), json!(read));
                o.insert("records_written".into(), json!(written));
                let monitor = e.monitor.lock().clone();
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
        let monitor = entry.monitor.lock().clone();
        let cluster = entry
            .cluster
            .lock()
            .as_ref()
            .filter(|_| record.cluster)
            .map(|view| view.lock().clone());
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
