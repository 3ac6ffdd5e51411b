//! The host file (`--host-config HOST.toml`): tenants' limits and capabilities, the
//! server's settings and this machine's `[cluster]` defaults, as written. Each optional
//! field left out takes the default of the table above it (`[tenant.NAME]` from
//! `[defaults]`, `[defaults]` from the built-in ones); `crate::tenant` resolves the file
//! into what the runtime uses.

use std::collections::BTreeMap;
use std::path::PathBuf;

use schemars::JsonSchema;
use serde::Deserialize;

use super::job_file::ClusterSpec;

/// A host file.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HostFile {
    /// Refuse jobs of tenants not listed under `[tenant.NAME]` (default false).
    #[serde(default)]
    pub strict_tenants: bool,
    /// Job files to run, besides any given on the command line (relative to the host file).
    #[serde(default)]
    pub jobs: Vec<PathBuf>,
    /// Limits of every tenant, unless its own table says otherwise.
    #[serde(default)]
    pub defaults: LimitsSpec,
    /// Each tenant's limits and capabilities, by name.
    #[serde(default)]
    pub tenant: BTreeMap<String, LimitsSpec>,
    /// `sluice serve` only.
    pub server: Option<ServerSpec>,
    /// `sluice run --cluster`: this machine's defaults for the `[cluster]` of its jobs
    /// (a job's own fields win, and its `properties` go over these).
    pub cluster: Option<ClusterSpec>,
}

/// The fields of `[defaults]` and `[tenant.NAME]`, all optional.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitsSpec {
    /// Linear memory per operator instance, MiB (default 256).
    pub memory_mb: Option<u64>,
    /// Longest single call, waits in host calls included, ms (default 30,000; 0: none).
    pub call_deadline_ms: Option<u64>,
    /// Wasm fuel per call, instantiation too (default 0: unmetered).
    pub fuel_per_call: Option<u64>,
    /// Records and effects one call may return, also `snapshot`, MiB (default 64).
    pub max_output_mb: Option<u64>,
    /// Operator instances of the tenant in this host (default 1000).
    pub max_instances: Option<u32>,
    /// Guest log lines per instance and second; a line costs one per KiB begun (default
    /// 1000).
    pub log_lines_per_second: Option<u32>,
    /// Keyed state, timers (their keys and 240 bytes each) and counter names (theirs and
    /// 96 bytes each) the host holds per instance, MiB (default 1024).
    pub state_mb: Option<u64>,
    /// Timers the host holds per instance (default 10,000,000).
    pub timers: Option<u64>,
    /// Distinct counter names per instance (default 1000).
    pub counters: Option<usize>,
    /// Longest log line, error message, counter name or timer key kept, KiB (default 16).
    pub guest_string_kb: Option<usize>,
    /// Share of the host's cores against other active tenants' weights (default 1).
    pub cpu_weight: Option<u32>,
    /// Where the keyed state of jobs without `[state] backend` is kept: `heap` (default)
    /// or `rocksdb`.
    pub state_backend: Option<crate::state::BackendKind>,
    /// Keyed state of all the tenant's instances in this host, MiB (default 4096).
    pub tenant_state_mb: Option<u64>,
    /// Timers of all the tenant's instances in this host (default 50,000,000).
    pub tenant_timers: Option<u64>,
    /// Host directories the tenant's operators may see (none by default).
    #[serde(default)]
    pub dirs: Vec<DirSpec>,
    /// `sluice serve`: jobs running at once (default 20).
    pub max_jobs: Option<u32>,
    /// `sluice serve`: plugin bytes stored, MiB (default 256).
    pub max_plugin_mb: Option<u64>,
    /// `sluice serve`: subtasks (threads) of its running jobs (default 2000).
    pub max_subtasks: Option<u32>,
    /// `sluice serve`: task slots its running jobs may take, each job as many as its
    /// highest parallelism, as Flink's task slots (default: the server's `slots`).
    pub slots: Option<u32>,
    /// `sluice serve`: jobs it stores, in any state (default 1000).
    pub max_stored_jobs: Option<u32>,
    /// `sluice serve`: disk its jobs and plugins take (blocks allocated), MiB (default
    /// 10,240).
    pub max_disk_mb: Option<u64>,
    /// `sluice serve`: private writable memory of the tenant's worker process
    /// (`RLIMIT_DATA`), MiB (default: `tenant_state_mb` × 1.5 + 1024).
    pub process_memory_mb: Option<u64>,
    /// `sluice serve`: open files and sockets of the tenant's worker process (default
    /// 4096).
    pub open_files: Option<u64>,
    /// `sluice serve`: SHA-256 (hex) of the tenant's bearer token (`[tenant.NAME]` only).
    pub token_sha256: Option<String>,
    /// `sluice serve`: the Kafka the tenant's jobs may use (`[tenant.NAME]` only).
    pub kafka: Option<KafkaSpec>,
}

/// `[tenant.NAME.kafka]`: the Kafka a tenant's server jobs may use.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KafkaSpec {
    /// The only brokers its jobs may name, `host:port[,host:port...]`.
    pub bootstrap: String,
    /// Topics its sources may read (regular expressions matching whole names).
    #[serde(default)]
    pub read: Vec<String>,
    /// Topics its sinks may write (regular expressions matching whole names).
    #[serde(default)]
    pub write: Vec<String>,
    /// How every group and transactional id of its jobs begins (default `NAME.`).
    pub id_prefix: Option<String>,
    /// Its cluster jobs' checkpoint store: a directory every server reads, or `s3://`,
    /// `gs://`, `az://` (none: no cluster jobs).
    pub checkpoints: Option<String>,
    /// Partitions of the control and exchange topics its cluster jobs make, all its
    /// stored jobs together (default 256): they stay until a job is deleted.
    pub cluster_partitions: Option<u64>,
    /// librdkafka properties of every Kafka client of its jobs, over the job's own.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    /// The schema registry its jobs may name (`url`), with the credentials they use
    /// (`username` and `password`, which may be `"${env:NAME}"` or `"${file:PATH}"`):
    /// a job names the address only.
    pub schema_registry: Option<crate::spec::job_file::SchemaRegistrySpec>,
}

/// A host directory granted to a tenant's operators.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DirSpec {
    /// The directory on the host (relative to the host file).
    pub host: PathBuf,
    /// Where operators see it (an absolute path).
    pub guest: String,
    /// Whether operators may only read it (default true).
    #[serde(default = "yes")]
    pub read_only: bool,
}

fn yes() -> bool {
    true
}

/// `[server]`: settings of `sluice serve`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ServerSpec {
    /// Where the HTTP API listens (default `127.0.0.1:8600`).
    pub address: Option<String>,
    /// Where jobs, plugins, checkpoints and output live (default `sluice-server`,
    /// relative to the host file).
    pub dir: Option<PathBuf>,
    /// Largest request body, a plugin or a job file, MiB (default 64).
    pub max_upload_mb: Option<u64>,
    /// Ended jobs whose metrics and logs stay in memory (default 100).
    pub keep_ended_jobs: Option<usize>,
    /// ... for at most this many minutes after they end (default 10).
    pub keep_ended_minutes: Option<u64>,
    /// Serve HTTPS with this certificate chain (PEM) ...
    pub tls_cert: Option<PathBuf>,
    /// ... and its private key (PEM); plain HTTP without both.
    pub tls_key: Option<PathBuf>,
    /// Run each tenant's jobs in a worker process of its own, under OS limits derived
    /// from its quotas (default true); false runs them in the server's process.
    pub workers: Option<bool>,
    /// With workers: how long compiling an uploaded plugin (in a process of its own, under
    /// the tenant's memory limit) may take before the upload is refused, ms (default
    /// 300,000: a Python or JavaScript component takes tens of seconds).
    pub compile_deadline_ms: Option<u64>,
    /// With workers: how long a worker may send nothing (it reports four times a second)
    /// before it is taken for stuck and killed, ms (default 30,000, at least 1,000).
    pub worker_timeout_ms: Option<u64>,
    /// Task slots of all tenants' running jobs together, each job taking as many as its
    /// highest parallelism (default 16 per core of the machine).
    pub slots: Option<u32>,
}
