//! The REST API's answers as plain data: one type per answer, which the server builds,
//! the client reads and the OpenAPI document (`/v1/openapi.json`) describes.
//!
//! Nothing here knows the runtime: the server fills these from its jobs, the client and
//! the tests read them back. A field once served keeps its name; new ones are added
//! beside it. A time is served twice: as milliseconds since the Unix epoch (`*_ms`) and
//! as the same instant in RFC 3339 (UTC, with milliseconds), named without the suffix.

use std::collections::BTreeMap;
use std::time::{Duration, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The last millisecond RFC 3339 can write with a four-digit year (9999-12-31T23:59:59.999Z).
const LAST_RFC3339_MS: i64 = 253_402_300_800_000 - 1;

/// `ms` since the Unix epoch as RFC 3339 in UTC with milliseconds, e.g.
/// `2026-12-04T22:31:50.123Z`. Instants before the epoch or after the year 9999 (which a
/// damaged record could hold) are written as the nearest one that can be.
pub fn rfc3339(ms: i64) -> String {
    let ms = ms.clamp(0, LAST_RFC3339_MS) as u64;
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
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
    /// Not resumed by a restarted server: it was resumed 3 times in a row without
    /// reaching a completed checkpoint or an end (it may be what brings the server
    /// down). `start` runs it again.
    Quarantined,
}

/// A job in short: what submissions and control requests (`cancel`, `stop`, `start`,
/// `DELETE`) answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct JobSummary {
    /// Its id, for the other requests about it.
    pub id: String,
    /// The job file's `name`.
    pub name: String,
    /// Where it is in its life.
    pub state: JobState,
    /// Whether its tasks run now.
    pub running: bool,
    /// When it was submitted, in milliseconds since the Unix epoch.
    pub submitted_ms: u64,
    /// When it was submitted, in RFC 3339.
    pub submitted: String,
}

/// A completed checkpoint, as a job's list entry names its last.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CheckpointRef {
    /// Its id within the job's run.
    pub id: u64,
    /// When it was triggered, in milliseconds since the Unix epoch.
    pub triggered_ms: i64,
    /// When it was triggered, in RFC 3339.
    pub triggered: String,
}

/// A job as `GET /v1/jobs` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct JobOverview {
    /// The job in short.
    #[serde(flatten)]
    pub job: JobSummary,
    /// The tenant it runs for.
    pub tenant: String,
    /// Records its sources read, over all its runs.
    pub records_read: u64,
    /// Records its sinks wrote, over all its runs.
    pub records_written: u64,
    /// Records its sinks committed, over all its runs, as of its latest completed
    /// checkpoint (its final one, once it finished): what its output holds, where
    /// `records_written` also counts what a restart wrote again. `None` without
    /// checkpoints.
    #[serde(default)]
    pub records_committed: Option<u64>,
    /// Restarts after failures, over all its runs.
    pub restarts: u32,
    /// The last checkpoint of its current run, if it completed one.
    pub last_checkpoint: Option<CheckpointRef>,
}

/// `GET /v1/jobs`: the tenant's jobs, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct JobList {
    /// The jobs.
    pub jobs: Vec<JobOverview>,
}

/// Whether a checkpoint in a job's history completed or was aborted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointStatus {
    /// It completed: a job can restore it.
    Completed,
    /// It was aborted, for the reason given.
    Aborted,
}

/// A completed checkpoint or savepoint of a job's history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CompletedCheckpoint {
    /// Always `completed`.
    pub status: CheckpointStatus,
    /// Its id within its run.
    pub id: u64,
    /// `checkpoint` or `savepoint`.
    pub kind: String,
    /// Its folder's name: for `POST /v1/jobs/{id}/start?savepoint=NAME`.
    pub name: Option<String>,
    /// When it was triggered, in milliseconds since the Unix epoch.
    pub triggered_ms: i64,
    /// When it was triggered, in RFC 3339.
    pub triggered: String,
    /// From trigger to completion.
    pub duration_ms: f64,
    /// The longest synchronous part of any task.
    pub max_sync_ms: f64,
    /// The longest asynchronous part of any task (writing its state).
    #[serde(default)]
    pub max_async_ms: f64,
    /// Bytes it wrote: with RocksDB state, only the files no earlier checkpoint holds.
    pub bytes: u64,
    /// Bytes of the whole state it restores (with RocksDB state, the files it shares
    /// with earlier checkpoints too).
    #[serde(default)]
    pub full_bytes: u64,
    /// Files it wrote: its tasks' state files and the RocksDB tables it copied (not
    /// those it shares with earlier checkpoints).
    #[serde(default)]
    pub files: u32,
}

/// An aborted checkpoint of a job's current run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct AbortedCheckpoint {
    /// Its id within its run.
    pub id: u64,
    /// Always `aborted`.
    pub status: CheckpointStatus,
    /// Why it was aborted.
    pub reason: String,
}

/// A job's checkpoints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct CheckpointHistory {
    /// Checkpoints and savepoints completed, over all its runs.
    pub completed: u64,
    /// Checkpoints aborted, over all its runs.
    pub aborted: u64,
    /// Its last completed checkpoints and savepoints (at most 20), newest first.
    pub last: Vec<CompletedCheckpoint>,
    /// The last aborted checkpoints of its current run (at most 5), newest first.
    pub last_aborted: Vec<AbortedCheckpoint>,
    /// The checkpoints and savepoints of its current run in flight, oldest first.
    #[serde(default)]
    pub in_progress: Vec<CheckpointInProgress>,
}

/// A checkpoint or savepoint triggered and not yet complete.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CheckpointInProgress {
    /// Its id within its run.
    pub id: u64,
    /// `checkpoint` or `savepoint`.
    pub kind: String,
    /// When it was triggered, in milliseconds since the Unix epoch.
    pub triggered_ms: i64,
    /// Tasks that have acknowledged it (their state written).
    pub acknowledged: u32,
    /// Tasks it waits for in all.
    pub tasks: u32,
    /// Bytes the tasks that acknowledged wrote so far.
    pub bytes: u64,
}

/// The source a task reads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SourceMetrics {
    /// Its name.
    pub source: String,
    /// Its subtask.
    pub subtask: u32,
    /// Records it read.
    pub records_out: u64,
    /// Its own counters (a Kafka source's records and bytes in, ...).
    pub counters: BTreeMap<String, u64>,
    /// Records behind the end of each partition it reads (`TOPIC/PARTITION`).
    pub lag: BTreeMap<String, u64>,
}

/// An operator instance of a task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct OperatorMetrics {
    /// Its name.
    pub operator: String,
    /// Its subtask.
    pub subtask: u32,
    /// Records in.
    pub records_in: u64,
    /// Records out.
    pub records_out: u64,
    /// Time inside its calls.
    pub busy_ms: u64,
    /// Its largest linear memory, in bytes.
    pub memory_bytes: u64,
    /// Memory the host holds for its keyed state (RocksDB: its cache and write buffers),
    /// as of its last checkpoint.
    #[serde(default)]
    pub state_memory_bytes: u64,
    /// Disk its keyed state takes (RocksDB's files), as of its last checkpoint.
    #[serde(default)]
    pub state_disk_bytes: u64,
    /// Its own counters.
    pub counters: BTreeMap<String, u64>,
    /// The call it is in, if any: an operator stuck in one call (a loop under its
    /// deadline, a sink waiting on a full queue) shows here, its time growing.
    #[serde(default)]
    pub in_call: Option<CallInProgress>,
}

/// A call an operator is in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct CallInProgress {
    /// The call (`process`, `process-watermark`, `on-timers`, `snapshot`, …).
    pub call: String,
    /// How long it has run so far.
    pub running_ms: u64,
}

/// A task (a chain's subtask) of a job's current run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TaskMetrics {
    /// Its name, e.g. `tokenize -> count (2/4)`.
    pub task: String,
    /// Records in.
    pub records_in: u64,
    /// Records out.
    pub records_out: u64,
    /// Time busy.
    pub busy_ms: u64,
    /// Time idle, waiting for input.
    pub idle_ms: u64,
    /// Time waiting for room downstream.
    pub backpressured_ms: u64,
    /// Mails waiting, when last sampled.
    pub mailbox_depth: u64,
    /// Its input watermark (milliseconds of event time), once it has one.
    pub watermark: Option<i64>,
    /// The source it reads, if it reads one.
    pub source: Option<SourceMetrics>,
    /// Its operators, head first.
    pub operators: Vec<OperatorMetrics>,
    /// In a job over several servers: the unit it belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<u32>,
    /// In a job over several servers: the host that runs it (its name in the job's
    /// group).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
}

/// A task of a job's graph: its chain of vertices, parallelism and inputs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ChainSummary {
    /// Its vertices, e.g. `source -> tokenize`.
    pub name: String,
    /// Its subtasks.
    pub parallelism: u32,
    /// `[upstream task index, partitioner]` per input.
    #[schema(value_type = Vec<Vec<serde_json::Value>>)]
    pub inputs: Vec<(usize, String)>,
}

/// What this server's host of a job over several servers does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ClusterHostStatus {
    /// The host's name in the job's group.
    pub host: String,
    /// Units of the job, in all stages.
    pub units: u32,
    /// The units the group gave this host.
    pub owned: Vec<u32>,
    /// The units running here now.
    pub running: Vec<u32>,
    /// The units known to have finished (here or on another host).
    pub finished: Vec<u32>,
    /// Runs of units that failed here (each runs again after a delay).
    pub failures: u64,
    /// Why the last of them failed.
    pub last_failure: Option<String>,
    /// Every host in the job's group with the units it runs, as the group said last
    /// (asked every 5 seconds; empty until then).
    #[serde(default)]
    pub group: Vec<ClusterGroupMember>,
}

/// A host in a job's group over several servers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ClusterGroupMember {
    /// Its name in the group (`sluice-HOSTNAME-PID`).
    pub host: String,
    /// Where it connects to the brokers from.
    pub address: String,
    /// The units the group gave it, each with its stage, input and operators.
    pub units: Vec<ClusterGroupUnit>,
}

/// A unit a host of a job over several servers runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ClusterGroupUnit {
    /// Its number.
    pub unit: u32,
    /// Its stage, input and operators (`stage 0: words/1 -> count -> sink`).
    pub runs: String,
}

/// Whether a job runs over several servers, and what this server does of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum ClusterStatus {
    /// It does (`[cluster]`), and this server's host has planned it.
    Host(ClusterHostStatus),
    /// `false`: it runs on this server alone; `true`: it runs over several servers,
    /// and this server's host has not planned it yet.
    Flag(bool),
}

/// `GET /v1/jobs/{id}`: everything about a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct JobDetail {
    /// The job in short.
    #[serde(flatten)]
    pub job: JobSummary,
    /// The tenant it runs for.
    pub tenant: String,
    /// Operator name to the SHA-256 of the plugin it runs (fixed at submission).
    pub plugins: BTreeMap<String, String>,
    /// Restarts after failures, over all its runs.
    pub restarts: u32,
    /// Records its sources read, over all its runs.
    pub records_read: u64,
    /// Records its sinks wrote, over all its runs.
    pub records_written: u64,
    /// Records its sinks committed, over all its runs, as of its latest completed
    /// checkpoint (its final one, once it finished): what its output holds, where
    /// `records_written` also counts what a restart wrote again. `None` without
    /// checkpoints.
    #[serde(default)]
    pub records_committed: Option<u64>,
    /// Failed attempts of its current run by kind: panic, deadline, memory,
    /// stack-overflow, memory-access, fuel, error, invalid-config, contract, host, other.
    pub failures_by_kind: BTreeMap<String, u64>,
    /// The error that ended its last failed attempt (tenant, job, operator, subtask,
    /// call and cause), or why it failed or was quarantined.
    pub last_failure: Option<String>,
    /// The name of the savepoint its last stop took.
    pub savepoint: Option<String>,
    /// Its checkpoints.
    pub checkpoints: CheckpointHistory,
    /// The tasks of its current run (or of its last one, until the server forgets it).
    pub tasks: Vec<TaskMetrics>,
    /// Its tasks and the edges between them.
    pub graph: Vec<ChainSummary>,
    /// Its file sinks' files, relative to its folder (for `output?file=`).
    pub output: Vec<String>,
    /// Whether it runs over several servers, and this server's share.
    pub cluster: ClusterStatus,
    /// Its exception history: its last failures over all its runs (at most 20), newest
    /// first.
    #[serde(default)]
    pub exceptions: Vec<JobException>,
    /// Its job file as submitted, with the values of settings that hold secrets
    /// (passwords, keys, tokens, credentials) masked.
    #[serde(default)]
    pub job_file: Option<String>,
}

/// A failure of one of a job's attempts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct JobException {
    /// When it happened, in milliseconds since the Unix epoch.
    pub at_ms: i64,
    /// When it happened, in RFC 3339.
    pub at: String,
    /// The attempt it ended (0 for a run's first).
    pub attempt: u32,
    /// Its kind: panic, deadline, memory, stack-overflow, memory-access, fuel, error,
    /// invalid-config, contract, host, worker, other.
    pub kind: String,
    /// The error (tenant, job, task, operator, subtask, call and cause).
    pub error: String,
}

/// A plugin a tenant uploaded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Plugin {
    /// SHA-256 of the component, hex; a job file may name it as `sha256:HEX`.
    pub sha256: String,
    /// The name it was uploaded under; a job file may name it by it (the newest upload
    /// of a name wins).
    pub name: String,
    /// Bytes.
    pub size: u64,
    /// The operator interface it exports, with its WIT version.
    pub interface: String,
    /// When it was uploaded, in milliseconds since the Unix epoch.
    pub uploaded_ms: u64,
    /// When it was uploaded, in RFC 3339.
    pub uploaded: String,
    /// The calls it exports.
    pub calls: Vec<String>,
    /// The config keys it declares, if it declares them.
    pub config_keys: Option<Vec<String>>,
}

/// `GET /v1/tenant`: the tenant a token logs in as, and its quotas.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct TenantInfo {
    /// Its name.
    pub tenant: String,
    /// Jobs it may run at once (`max_jobs`).
    pub max_jobs: u32,
    /// Task slots its running jobs may take (`slots`, else the server's).
    pub slots: u32,
    /// Subtasks (threads) its running jobs may have (`max_subtasks`).
    pub max_subtasks: u32,
    /// Bytes its jobs and plugins may take on disk (`max_disk_mb`).
    pub max_disk_bytes: u64,
}

/// `GET /v1/plugins`: the tenant's plugins, newest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PluginList {
    /// The plugins.
    pub plugins: Vec<Plugin>,
}

/// What a refused or failed request answers, with its status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// What was wrong, naming the file, operator, tenant or quota at fault.
    pub error: String,
}

/// How a probe finds the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProbeStatus {
    /// The process answers (`/health`, `/livez`).
    Ok,
    /// It resumed its jobs and accepts requests (`/readyz`, 200).
    Ready,
    /// It is still resuming the jobs of its registry (`/readyz`, 503).
    Starting,
    /// It is stopping its jobs to exit (`/readyz`, 503).
    ShuttingDown,
}

/// What `/health`, `/livez` and `/readyz` answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Probe {
    /// How the server is.
    pub status: ProbeStatus,
}

/// `POST /v1/jobs/{id}/savepoint`: the savepoint it waited for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SavepointTaken {
    /// Its name, for `POST /v1/jobs/{id}/start?savepoint=NAME`.
    pub savepoint: String,
}

/// `POST /v1/jobs/{id}/savepoints` (202): the savepoint is triggered; ask about it with
/// `GET /v1/jobs/{id}/savepoints/{request_id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SavepointTriggered {
    /// What to ask about it with.
    pub request_id: String,
}

/// Where a triggered savepoint is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TriggerStatus {
    /// Not written yet.
    InProgress,
    /// Written: its `location` names it.
    Completed,
    /// Not taken: its `error` says why.
    Failed,
}

/// `GET /v1/jobs/{id}/savepoints/{request_id}`: a triggered savepoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct SavepointStatus {
    /// Where it is.
    pub status: TriggerStatus,
    /// Once completed: the savepoint's name, for `start?savepoint=NAME`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// Once failed: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// When it was triggered, in milliseconds since the Unix epoch.
    pub triggered_ms: u64,
    /// When it was triggered, in RFC 3339.
    pub triggered: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_written_in_rfc3339_and_out_of_range_ones_do_not_panic() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_796_423_510_123), "2026-12-04T22:31:50.123Z");
        assert_eq!(rfc3339(-5), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(i64::MAX), "9999-12-31T23:59:59.999Z");
        assert_eq!(rfc3339(LAST_RFC3339_MS + 1), "9999-12-31T23:59:59.999Z");
    }

    #[test]
    fn a_job_served_before_the_cluster_field_was_an_object_still_reads() {
        let host: ClusterStatus = serde_json::from_str(
            r#"{"host": "h", "units": 2, "owned": [0], "running": [], "finished": [1],
                "failures": 0, "last_failure": null}"#,
        )
        .unwrap();
        assert!(matches!(host, ClusterStatus::Host(ref h) if h.units == 2));
        let flag: ClusterStatus = serde_json::from_str("false").unwrap();
        assert_eq!(flag, ClusterStatus::Flag(false));
        assert_eq!(serde_json::to_string(&flag).unwrap(), "false");
    }

    #[test]
    fn a_trigger_status_leaves_out_what_it_does_not_have() {
        let status = SavepointStatus {
            status: TriggerStatus::InProgress,
            location: None,
            error: None,
            triggered_ms: 0,
            triggered: rfc3339(0),
        };
        let json = serde_json::to_value(&status).unwrap();
        assert_eq!(json["status"], "in_progress");
        assert!(
            json.get("location").is_none() && json.get("error").is_none(),
            "{json}"
        );
    }
}
