//! Tenants: whose limits and capabilities an operator runs under.
//!
//! A job names its tenant (`tenant = "acme"`, default `default`). The host configuration
//! (`sluice run --host-config HOST.toml`) gives each tenant its limits and, explicitly, any
//! capability beyond the empty sandbox; a tenant it does not list gets the defaults, unless
//! the configuration says `strict_tenants = true`.
//!
//! ```toml
//! strict_tenants = false          # refuse jobs of tenants not listed below
//! jobs = ["a.toml", "b.toml"]     # run these (besides any given on the command line)
//!
//! [defaults]                      # for every tenant, unless it says otherwise
//! memory_mb = 256                 # linear memory per operator instance
//! call_deadline_ms = 30000        # longest single call (0: no deadline)
//! fuel_per_call = 0               # Wasm fuel per call (0: unmetered)
//! max_output_mb = 64              # records and effects one call may return
//! max_instances = 1000            # operator instances of the tenant in this host
//! log_lines_per_second = 1000     # guest log lines (log import, stdout, stderr)
//! state_mb = 1024                 # keyed state, timers and counter names per operator instance
//! timers = 10000000               # timers the host holds per operator instance
//! counters = 1000                 # distinct counter names per operator instance
//! guest_string_kb = 16            # longest log line, error, counter name or timer key kept
//! cpu_weight = 1                  # share of the host's cores, against other tenants' weights
//! state_backend = "heap"          # keyed state of jobs without `[state] backend`: heap, rocksdb
//! tenant_state_mb = 4096          # keyed state of all the tenant's instances in this host
//! tenant_timers = 50000000        # timers of all the tenant's instances in this host
//! max_jobs = 20                   # jobs running at once (`sluice serve`)
//! max_plugin_mb = 256             # plugin bytes stored (`sluice serve`)
//! max_subtasks = 2000             # subtasks (threads) of its running jobs (`sluice serve`)
//! slots = 32                      # task slots of its running jobs (`sluice serve`; default
//!                                 #   the server's `slots`)
//! max_disk_mb = 10240             # disk its jobs and plugins take (`sluice serve`)
//! max_stored_jobs = 1000          # jobs stored in any state (`sluice serve`)
//! process_memory_mb = 7168        # its worker process's memory (`sluice serve`; default
//!                                 #   tenant_state_mb × 1.5 + 1024)
//! open_files = 4096               # its worker process's open files and sockets (`sluice serve`)
//!
//! [tenant.acme]                   # any field of [defaults], and capabilities:
//! memory_mb = 64
//! dirs = [{ host = "/srv/acme/ref", guest = "/ref", read_only = true }]
//! token_sha256 = "9f86d0…"        # `sluice serve`: SHA-256 (hex) of the tenant's bearer token
//!
//! [tenant.acme.kafka]             # `sluice serve`: the Kafka the tenant's jobs may use
//! bootstrap = "kafka-1:9092,kafka-2:9092"  # the only brokers its jobs may name
//! read = ["acme\\..*"]             # topics its sources may read (whole-name regexes)
//! write = ["acme\\.out-.*"]        # topics its sinks may write
//! id_prefix = "acme."             # every group and transactional id begins so (default `NAME.`)
//! checkpoints = "/mnt/shared/acme"  # its cluster jobs' checkpoint store (a directory every
//!                                 # server reads, or s3://, gs://, az://); none: no cluster jobs
//! cluster_partitions = 256        # partitions of the topics its cluster jobs make, all stored
//!                                 # jobs together (they stay until a job is deleted)
//! properties = { "security.protocol" = "SASL_SSL", "sasl.mechanism" = "SCRAM-SHA-512", "sasl.username" = "acme", "sasl.password" = "…" }
//!
//! [cluster]                       # `sluice run --cluster`: this machine's defaults for the
//! bootstrap = "kafka-1:9092"      # `[cluster]` of its jobs (any of its fields; a job's own
//! checkpoints = "/mnt/shared"     # win, and its `properties` go over these)
//! properties = { "security.protocol" = "SASL_SSL" }
//!
//! [server]                        # `sluice serve` only
//! address = "127.0.0.1:8600"      # where the HTTP API listens
//! dir = "sluice-server"           # jobs, plugins, checkpoints and output live here
//! max_upload_mb = 64              # largest request body (a plugin or a job file)
//! keep_ended_jobs = 100           # ended jobs whose metrics and logs stay in memory
//! keep_ended_minutes = 10         # ... for at most this long after they end
//! tls_cert = "cert.pem"           # serve HTTPS with this certificate chain (PEM) ...
//! tls_key = "key.pem"             # ... and its private key (PEM); else plain HTTP
//! slots = 32                      # task slots of all tenants' jobs (default 16 per core)
//! ```
//!
//! A server admits a job (at submission and at every start) only within its tenant's
//! quotas, and refuses it with the quota named otherwise:
//!
//! - `max_jobs`: jobs running at once.
//! - `max_instances`: Wasm operator instances of its running jobs (in `sluice run` too).
//! - `max_subtasks`: subtasks of its running jobs. Every subtask is a thread, whether it
//!   runs a source, operators or the sink, so this bounds the threads a tenant makes the
//!   server run. The default, 2000, leaves room for the sources and sinks around
//!   `max_instances` operator instances.
//! - `slots`: task slots of its running jobs, as Flink's: a job takes as many as its
//!   highest parallelism (a job over several servers, the sum of its units'). The
//!   server's own `slots` bound all tenants together. A job asking more parallelism than
//!   the machine can give is refused with both named, rather than run as thousands of
//!   threads on a few cores.
//! - `max_disk_mb`: bytes under the server's folder that are the tenant's: its jobs'
//!   folders (job file, record, checkpoints, output) and its plugins. (The compile cache
//!   is shared by all tenants and not counted.) Checked at submission and start, and every
//!   few seconds while its jobs run: when the tenant is over its quota, its running jobs
//!   fail with the quota named. The default, 10 GiB, is a judgment call: output and
//!   checkpoints of a few long jobs; a deployment sizes it to its disks.
//! - `max_plugin_mb`: plugin bytes stored, checked at upload.
//!
//! A server job may use Kafka only within its tenant's grant (`[tenant.NAME.kafka]`):
//! brokers and topics outside it are refused at submission, group and transactional ids
//! begin with its `id_prefix`, and its `properties` go over the job's own, which may only
//! tune (see `server::kafka_grant`). `sluice run` applies no grant: whoever runs it owns the
//! machine and its network.
//!
//! Every job also stays within the ranges that validation sets for the knobs of a job
//! file (parallelism, batch and buffer sizes, channel capacity, …), whoever runs it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::spec::host_file::{HostFile, KafkaSpec, LimitsSpec, ServerSpec};
use crate::state::TenantUsage;
use crate::wasm::{DirGrant, SandboxLimits};
use anyhow::{Context, Result, bail};
use parking_lot::Mutex;

/// Settings of `sluice serve` (the `[server]` table).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerSettings {
    /// Where the HTTP API listens (loopback by default).
    pub address: String,
    /// The server's registry: jobs, plugins, checkpoints and output.
    pub dir: PathBuf,
    /// The largest request body accepted.
    pub max_upload_bytes: usize,
    /// How many ended jobs keep their metrics and log lines in memory (the newest ended
    /// first; default 100). Older ones keep their record on disk, and their log lines
    /// move to their folder. The default bounds what a long-lived server holds for ended
    /// jobs to ~100 MiB of logs at most, while the jobs a person looks at (those that just
    /// ended) stay complete.
    pub keep_ended_jobs: usize,
    /// How long after it ends a job keeps its metrics and log lines in memory at most
    /// (default 10 minutes).
    pub keep_ended_for: Duration,
    /// Serve HTTPS with this certificate chain and key (PEM files), else plain HTTP.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Run each tenant's jobs in a worker process of its own, under OS limits (default
    /// true); false runs them in the server's process.
    pub workers: bool,
    /// With workers: how long a worker may send nothing (it reports four times a second)
    /// before it is taken for stuck and killed.
    pub worker_timeout: Duration,
    /// With workers: how long compiling an uploaded plugin may take (in a process of its
    /// own) before it is stopped and the upload refused.
    pub compile_deadline: Duration,
    /// Task slots of all tenants' running jobs together.
    pub slots: u32,
}

impl Default for ServerSettings {
    fn default() -> Self {
        ServerSettings {
            address: "127.0.0.1:8600".into(),
            dir: PathBuf::from("sluice-server"),
            max_upload_bytes: 64 << 20,
            keep_ended_jobs: 100,
            keep_ended_for: Duration::from_secs(600),
            tls: None,
            workers: true,
            compile_deadline: Duration::from_secs(300),
            worker_timeout: Duration::from_secs(30),
            slots: SLOTS_PER_CORE * cores(),
        }
    }
}

/// What a tenant may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantConfig {
    /// The tenant's name.
    pub name: String,
    /// Limits and capabilities of each operator instance.
    pub limits: SandboxLimits,
    /// Most operator instances the tenant may have in this host at once.
    pub max_instances: u32,
    /// Most jobs the tenant may have running at once in a server.
    pub max_jobs: u32,
    /// Most plugin bytes the tenant may store in a server.
    pub max_plugin_bytes: u64,
    /// Most subtasks (threads) the tenant's running jobs may have in a server.
    pub max_subtasks: u32,
    /// Most task slots the tenant's running jobs may take in a server (`None`: the
    /// server's).
    pub slots: Option<u32>,
    /// Most bytes the tenant's jobs and plugins may take on a server's disk.
    pub max_disk_bytes: u64,
    /// SHA-256 of the tenant's bearer token (a server refuses tenants without one).
    pub token_sha256: Option<[u8; 32]>,
    /// Most keyed-state bytes all the tenant's instances in this host may make it hold.
    pub max_state_bytes: u64,
    /// Most timers all the tenant's instances in this host may make it hold.
    pub max_timers: u64,
    /// What Kafka the tenant's server jobs may use (none: no Kafka at all).
    pub kafka: Option<KafkaGrant>,
    /// Most private writable memory of the tenant's worker process on a server
    /// (`RLIMIT_DATA`), set or derived from `max_state_bytes` ([`TenantConfig::of`]'s
    /// rule: 1.5× its state and 1 GiB for linear memories, threads and buffers).
    pub process_memory_bytes: u64,
    /// Most open files and sockets of the tenant's worker process on a server.
    pub open_files: u64,
    /// Most jobs the tenant may store on a server, in any state.
    pub max_stored_jobs: u32,
}

/// The worker memory of a tenant that does not set `process_memory_mb`: its state's
/// worth and half again (what the state's bytes cost beyond what is counted), and 1 GiB
/// for linear memories, threads and buffers.
fn derived_process_memory(max_state_bytes: u64) -> u64 {
    max_state_bytes
        .saturating_add(max_state_bytes / 2)
        .saturating_add(1 << 30)
}

/// A tenant's Kafka grant (`[tenant.NAME.kafka]`): the brokers, topics, and group and
/// transactional-id names its server jobs may use, and the client properties (such as
/// SASL credentials) every Kafka client of its jobs gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaGrant {
    /// The brokers (`host:port`) its jobs may name; a job that names none gets these.
    pub bootstrap: Vec<String>,
    /// Topics its sources may read: regular expressions, each matching whole names.
    pub read: Vec<String>,
    /// Topics its sinks may write: regular expressions, each matching whole names.
    pub write: Vec<String>,
    /// How every consumer group and transactional id of its jobs begins (default
    /// `TENANT.`), so that no tenant commits to another's group or fences its producers.
    pub id_prefix: String,
    /// Client properties set on every Kafka client of its jobs, over the job's own.
    pub properties: BTreeMap<String, String>,
    /// The checkpoint store of its jobs run over several servers (`[cluster]`): a
    /// directory (resolved against the host file's) or a URL. None: it may run none.
    pub checkpoints: Option<String>,
    /// Partitions of the control and exchange topics its cluster jobs may make, all its
    /// stored jobs together.
    pub cluster_partitions: u64,
    /// The schema registry its jobs may name, with the credentials they use.
    pub schema_registry: Option<crate::connectors::formats::RegistryConfig>,
}

/// Partitions of cluster topics a tenant's stored jobs may make, unless its grant says.
pub const DEFAULT_CLUSTER_PARTITIONS: u64 = 256;

impl KafkaGrant {
    /// Whether `topic` is one the tenant may read.
    pub fn may_read(&self, topic: &str) -> bool {
        matches_any(&self.read, topic)
    }

    /// Whether `topic` is one the tenant may write.
    pub fn may_write(&self, topic: &str) -> bool {
        matches_any(&self.write, topic)
    }
}

fn matches_any(patterns: &[String], topic: &str) -> bool {
    patterns
        .iter()
        .any(|p| crate::connectors::kafka::topic_pattern(p).is_ok_and(|re| re.is_match(topic)))
}

/// No tenant's Kafka `id_prefix` may begin another's: a name under one would then also
/// be under the other, and the tenants could commit to each other's groups. Nor may one
/// tenant's checkpoint store hold another's.
fn check_grants_apart(tenants: &BTreeMap<String, TenantConfig>) -> Result<()> {
    let prefixes: Vec<(&str, &str)> = tenants
        .values()
        .filter_map(|t| Some((t.name.as_str(), t.kafka.as_ref()?.id_prefix.as_str())))
        .collect();
    for (a, pa) in &prefixes {
        for (b, pb) in &prefixes {
            if a != b && pb.starts_with(pa) {
                bail!(
                    "[tenant.{a}.kafka] id_prefix {pa:?} begins [tenant.{b}.kafka] id_prefix \
                     {pb:?}: each tenant's groups and transactional ids must be its own"
                );
            }
        }
    }
    let stores: Vec<(&str, String)> = tenants
        .values()
        .filter_map(|t| {
            let store = t.kafka.as_ref()?.checkpoints.as_ref()?;
            Some((t.name.as_str(), store_key(store)))
        })
        .collect();
    for (a, sa) in &stores {
        for (b, sb) in &stores {
            if a != b && sb.starts_with(sa.as_str()) {
                bail!(
                    "[tenant.{a}.kafka] checkpoints {sa:?} holds [tenant.{b}.kafka] checkpoints \
                     {sb:?}: each tenant's checkpoint store must be its own"
                );
            }
        }
    }
    Ok(())
}

/// A checkpoint store as it is compared with another: a URL normalized (scheme and host
/// in lower case, `.` and `..` resolved), a directory with its symbolic links, `.` and
/// `..` resolved (as far as it exists), each ending in `/`. Two spellings of one place
/// compare equal, so a tenant cannot name another's store by spelling it otherwise.
fn store_key(store: &str) -> String {
    let key = if store.contains("://") {
        url::Url::parse(store).map_or_else(
            |_| store.to_string(),
            |mut url| {
                // (A bucket or host name is the same in any case; the url crate lowers
                // only those of the schemes it knows.)
                if let Some(host) = url.host_str().map(str::to_ascii_lowercase) {
                    let _ = url.set_host(Some(&host));
                }
                url.to_string()
            },
        )
    } else {
        let mut path = PathBuf::new();
        for part in Path::new(store).components() {
            match part {
                std::path::Component::ParentDir => {
                    path.pop();
                }
                std::path::Component::CurDir => {}
                other => path.push(other),
            }
        }
        // The longest part that exists, with its links resolved, and the rest as written.
        let mut existing = path.clone();
        while !existing.exists() && existing.pop() {}
        match std::fs::canonicalize(&existing) {
            Ok(mut real) => {
                real.extend(path.components().skip(existing.components().count()));
                real.to_string_lossy().into_owned()
            }
            Err(_) => path.to_string_lossy().into_owned(),
        }
    };
    format!("{}/", key.trim_end_matches('/'))
}

fn kafka_grant_from(
    tenant: &str,
    spec: &KafkaSpec,
    resolve: &dyn Fn(&Path) -> PathBuf,
) -> Result<KafkaGrant> {
    let bootstrap: Vec<String> = spec
        .bootstrap
        .split(',')
        .map(|b| b.trim().to_string())
        .filter(|b| !b.is_empty())
        .collect();
    if bootstrap.is_empty() {
        bail!("kafka: `bootstrap` must name the brokers (host:port,...)");
    }
    for p in spec.read.iter().chain(&spec.write) {
        crate::connectors::kafka::topic_pattern(p).context("kafka")?;
    }
    let id_prefix = spec
        .id_prefix
        .clone()
        .unwrap_or_else(|| format!("{tenant}."));
    if id_prefix.is_empty() {
        bail!("kafka: `id_prefix` must not be empty (it keeps tenants' groups apart)");
    }
    let checkpoints = match spec.checkpoints.as_deref().map(str::trim) {
        None => None,
        Some("") => bail!("kafka: `checkpoints` must name a directory or a URL"),
        Some(url) if url.contains("://") => Some(url.to_string()),
        Some(dir) => Some(resolve(Path::new(dir)).to_string_lossy().into_owned()),
    };
    Ok(KafkaGrant {
        bootstrap,
        read: spec.read.clone(),
        write: spec.write.clone(),
        id_prefix,
        properties: crate::spec::secrets::resolved(&spec.properties, resolve)
            .with_context(|| format!("kafka: `properties` of tenant '{tenant}'"))?,
        checkpoints,
        cluster_partitions: spec
            .cluster_partitions
            .unwrap_or(DEFAULT_CLUSTER_PARTITIONS),
        schema_registry: spec
            .schema_registry
            .as_ref()
            .map(|r| crate::job::validate::registry_config(r, resolve))
            .transpose()
            .with_context(|| format!("kafka: `schema_registry` of tenant '{tenant}'"))?,
    })
}

/// The host configuration.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// Where it was read from (for error messages).
    pub path: Option<PathBuf>,
    /// Refuse jobs of tenants not configured.
    pub strict_tenants: bool,
    /// Jobs to run.
    pub jobs: Vec<PathBuf>,
    /// Settings of `sluice serve`.
    pub server: ServerSettings,
    /// `[cluster]`: this machine's defaults for the `[cluster]` of every job it runs
    /// with `sluice run --cluster` (its paths resolved against the host file's folder).
    pub cluster: Option<crate::spec::ClusterSpec>,
    defaults: TenantConfig,
    tenants: BTreeMap<String, TenantConfig>,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            path: None,
            strict_tenants: false,
            jobs: Vec::new(),
            server: ServerSettings::default(),
            cluster: None,
            defaults: TenantConfig {
                name: "default".into(),
                limits: SandboxLimits::default(),
                max_instances: 1000,
                max_jobs: 20,
                max_plugin_bytes: 256 << 20,
                max_subtasks: 2000,
                slots: None,
                max_disk_bytes: 10 << 30,
                token_sha256: None,
                max_state_bytes: 4 << 30,
                max_timers: 50_000_000,
                kafka: None,
                process_memory_bytes: derived_process_memory(4 << 30),
                open_files: 4096,
                max_stored_jobs: 1000,
            },
            tenants: BTreeMap::new(),
        }
    }
}

impl HostConfig {
    /// Reads the host configuration at `path`.
    pub fn load(path: &Path) -> Result<HostConfig> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read host configuration {}", path.display()))?;
        let file: HostFile = crate::spec::from_toml(&text, path)?;
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        // An absolute path replaces the base.
        let resolve = |p: &Path| base.join(p);
        let fallback = HostConfig::default().defaults;
        for (field, set) in [
            ("token_sha256", file.defaults.token_sha256.is_some()),
            ("kafka", file.defaults.kafka.is_some()),
        ] {
            if set {
                bail!(
                    "{}: [defaults]: `{field}` belongs to a [tenant.NAME] table",
                    path.display()
                );
            }
        }
        let defaults = tenant_from(&fallback, "default", &file.defaults, &resolve)
            .with_context(|| format!("{}: [defaults]", path.display()))?;
        let tenants = file
            .tenant
            .iter()
            .map(|(name, spec)| {
                tenant_from(&defaults, name, spec, &resolve)
                    .with_context(|| format!("{}: [tenant.{name}]", path.display()))
                    .map(|t| (name.clone(), t))
            })
            .collect::<Result<_>>()?;
        check_grants_apart(&tenants).with_context(|| format!("{}", path.display()))?;
        Ok(HostConfig {
            path: Some(path.to_path_buf()),
            strict_tenants: file.strict_tenants,
            jobs: file.jobs.iter().map(|j| resolve(j)).collect(),
            server: server_from(file.server.unwrap_or_default(), &resolve)
                .with_context(|| format!("{}: [server]", path.display()))?,
            cluster: file
                .cluster
                .map(|mut c| -> Result<_> {
                    c.checkpoints = c.checkpoints.map(|store| match store.contains("://") {
                        true => store,
                        false => resolve(Path::new(&store)).to_string_lossy().into_owned(),
                    });
                    c.work_dir = c.work_dir.map(|dir| resolve(&dir));
                    c.properties = c
                        .properties
                        .map(|p| crate::spec::secrets::resolved(&p, &resolve))
                        .transpose()
                        .with_context(|| format!("{}: [cluster]", path.display()))?;
                    Ok(c)
                })
                .transpose()?,
            defaults,
            tenants,
        })
    }

    /// The tenants configured by name (not the defaults).
    pub fn tenants(&self) -> impl Iterator<Item = &TenantConfig> {
        self.tenants.values()
    }

    /// The configuration of tenant `name`.
    pub fn tenant(&self, name: &str) -> Result<TenantConfig> {
        if let Some(t) = self.tenants.get(name) {
            return Ok(t.clone());
        }
        if self.strict_tenants && name != "default" {
            bail!(
                "tenant '{name}' is not configured in {} (it sets strict_tenants)",
                self.path.as_deref().map_or_else(
                    || "the host configuration".into(),
                    |p| p.display().to_string()
                )
            );
        }
        Ok(TenantConfig {
            name: name.to_string(),
            ..self.defaults.clone()
        })
    }
}

fn server_from(spec: ServerSpec, resolve: &dyn Fn(&Path) -> PathBuf) -> Result<ServerSettings> {
    let default = ServerSettings::default();
    let address = spec.address.unwrap_or(default.address);
    address
        .parse::<std::net::SocketAddr>()
        .map_err(|e| anyhow::anyhow!("address {address:?} is not a socket address ({e})"))?;
    let max_upload_bytes = match spec.max_upload_mb {
        Some(0) => bail!("max_upload_mb must be at least 1"),
        Some(mb) => (mb as usize) << 20,
        None => default.max_upload_bytes,
    };
    let tls = match (spec.tls_cert, spec.tls_key) {
        (Some(cert), Some(key)) => {
            let (cert, key) = (resolve(&cert), resolve(&key));
            for file in [&cert, &key] {
                if !file.is_file() {
                    bail!("TLS file {} does not exist", file.display());
                }
            }
            Some((cert, key))
        }
        (None, None) => None,
        _ => bail!("`tls_cert` and `tls_key` go together (a certificate chain and its key)"),
    };
    Ok(ServerSettings {
        tls,
        address,
        dir: resolve(&spec.dir.unwrap_or(default.dir)),
        max_upload_bytes,
        keep_ended_jobs: spec.keep_ended_jobs.unwrap_or(default.keep_ended_jobs),
        keep_ended_for: spec.keep_ended_minutes.map_or(default.keep_ended_for, |m| {
            Duration::from_secs(m.saturating_mul(60))
        }),
        workers: spec.workers.unwrap_or(default.workers),
        compile_deadline: match spec.compile_deadline_ms {
            Some(0) => bail!("compile_deadline_ms must be at least 1"),
            Some(ms) => Duration::from_millis(ms),
            None => default.compile_deadline,
        },
        worker_timeout: match spec.worker_timeout_ms {
            Some(ms) if ms < 1000 => bail!("worker_timeout_ms must be at least 1000"),
            Some(ms) => Duration::from_millis(ms),
            None => default.worker_timeout,
        },
        slots: match spec.slots {
            Some(0) => bail!("slots must be at least 1"),
            Some(n) => n,
            None => default.slots,
        },
    })
}

/// A server's task slots per core of its machine, by default: enough for a few jobs of
/// the parallelism people give on small machines, far below thousands of threads.
pub const SLOTS_PER_CORE: u32 = 16;

/// The cores this process may run on.
pub fn cores() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u32)
}

/// Parses the hex SHA-256 of a token.
fn parse_sha256(hex: &str) -> Result<[u8; 32]> {
    let hex = hex.trim();
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!("token_sha256 must be 64 hex digits (the SHA-256 of the token), not {hex:?}");
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("checked hex");
    }
    Ok(out)
}

fn tenant_from(
    base: &TenantConfig,
    name: &str,
    spec: &LimitsSpec,
    resolve: &dyn Fn(&Path) -> PathBuf,
) -> Result<TenantConfig> {
    let mut limits = base.limits.clone();
    if spec.process_memory_mb == Some(0) {
        bail!("process_memory_mb must be at least 1");
    }
    if spec.open_files.is_some_and(|n| n < 64) {
        bail!(
            "open_files must be at least 64 (a worker opens plugins, checkpoint files and sockets)"
        );
    }
    if let Some(mb) = spec.memory_mb {
        if mb == 0 {
            bail!("memory_mb must be at least 1");
        }
        limits.memory_bytes = (mb as usize) << 20;
    }
    if let Some(ms) = spec.call_deadline_ms {
        limits.call_deadline = (ms > 0).then(|| Duration::from_millis(ms));
    }
    if let Some(fuel) = spec.fuel_per_call {
        limits.fuel_per_call = (fuel > 0).then_some(fuel);
    }
    if let Some(mb) = spec.max_output_mb {
        limits.max_output_bytes = (mb as usize) << 20;
    }
    if let Some(rate) = spec.log_lines_per_second {
        limits.log_lines_per_second = rate;
    }
    if let Some(mb) = spec.state_mb {
        limits.max_state_bytes = mb << 20;
    }
    if let Some(n) = spec.timers {
        limits.max_timers = n;
    }
    if let Some(n) = spec.counters {
        limits.max_counters = n;
    }
    if let Some(backend) = spec.state_backend {
        limits.state_backend = backend;
    }
    if let Some(weight) = spec.cpu_weight {
        if weight == 0 {
            bail!("cpu_weight must be at least 1");
        }
        limits.cpu_weight = weight;
    }
    if let Some(kb) = spec.guest_string_kb {
        if kb == 0 {
            bail!("guest_string_kb must be at least 1");
        }
        limits.max_guest_string_bytes = kb << 10;
    }
    if !spec.dirs.is_empty() {
        limits.dirs = spec
            .dirs
            .iter()
            .map(|d| {
                let host = resolve(&d.host);
                if !host.is_dir() {
                    bail!("dir {}: no such directory on the host", host.display());
                }
                if !d.guest.starts_with('/') {
                    bail!("dir guest path {:?} must be absolute", d.guest);
                }
                Ok(DirGrant {
                    host,
                    guest: d.guest.clone(),
                    read_only: d.read_only,
                })
            })
            .collect::<Result<_>>()?;
    }
    Ok(TenantConfig {
        name: name.to_string(),
        limits,
        max_instances: spec.max_instances.unwrap_or(base.max_instances),
        max_jobs: spec.max_jobs.unwrap_or(base.max_jobs),
        max_plugin_bytes: spec
            .max_plugin_mb
            .map_or(base.max_plugin_bytes, |mb| mb << 20),
        max_subtasks: spec.max_subtasks.unwrap_or(base.max_subtasks),
        slots: match spec.slots {
            Some(0) => bail!("slots must be at least 1"),
            slots => slots.or(base.slots),
        },
        max_disk_bytes: spec.max_disk_mb.map_or(base.max_disk_bytes, |mb| mb << 20),
        token_sha256: spec.token_sha256.as_deref().map(parse_sha256).transpose()?,
        max_state_bytes: spec
            .tenant_state_mb
            .map_or(base.max_state_bytes, |mb| mb << 20),
        max_timers: spec.tenant_timers.unwrap_or(base.max_timers),
        process_memory_bytes: match (spec.process_memory_mb, spec.tenant_state_mb) {
            (Some(mb), _) => mb << 20,
            // Its own state bound, unless its memory was set explicitly where it inherits
            // from.
            (None, Some(state))
                if base.process_memory_bytes == derived_process_memory(base.max_state_bytes) =>
            {
                derived_process_memory(state << 20)
            }
            (None, _) => base.process_memory_bytes,
        },
        open_files: spec.open_files.unwrap_or(base.open_files),
        max_stored_jobs: spec.max_stored_jobs.unwrap_or(base.max_stored_jobs),
        kafka: spec
            .kafka
            .as_ref()
            .map(|k| kafka_grant_from(name, k, resolve))
            .transpose()?,
    })
}

/// Counts the operator instances each tenant has in this host, refusing a job that would
/// take a tenant past its `max_instances`.
#[derive(Debug, Default, Clone)]
pub struct InstanceBudget {
    in_use: Arc<Mutex<BTreeMap<String, u32>>>,
    /// What each tenant's instances make the host hold (keyed state, timers).
    usage: Arc<Mutex<BTreeMap<String, Arc<TenantUsage>>>>,
}

/// Instances reserved for one job; released when dropped.
#[derive(Debug)]
pub struct Reservation {
    budget: InstanceBudget,
    tenant: String,
    instances: u32,
}

impl InstanceBudget {
    /// Reserves `instances` for `tenant`, or says why not (a [`crate::job::StartRefused`]).
    pub fn reserve(&self, tenant: &TenantConfig, instances: u32, job: &str) -> Result<Reservation> {
        let mut in_use = self.in_use.lock();
        let used = in_use.entry(tenant.name.clone()).or_default();
        if *used + instances > tenant.max_instances {
            return Err(crate::job::StartRefused(format!(
                "job '{job}' needs {instances} operator instances, but tenant '{}' has {} of its \
                 {} in use",
                tenant.name, used, tenant.max_instances
            ))
            .into());
        }
        *used += instances;
        Ok(Reservation {
            budget: self.clone(),
            tenant: tenant.name.clone(),
            instances,
        })
    }

    /// The host resources `tenant`'s instances hold, shared by all of them.
    pub fn usage(&self, tenant: &TenantConfig) -> Arc<TenantUsage> {
        let mut usage = self.usage.lock();
        usage
            .entry(tenant.name.clone())
            .or_insert_with(|| {
                Arc::new(TenantUsage::new(
                    &tenant.name,
                    tenant.max_state_bytes,
                    tenant.max_timers,
                ))
            })
            .clone()
    }

    /// Instances `tenant` has in use.
    pub fn in_use(&self, tenant: &str) -> u32 {
        let in_use = self.in_use.lock();
        in_use.get(tenant).copied().unwrap_or(0)
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut in_use = self.budget.in_use.lock();
        if let Some(used) = in_use.get_mut(&self.tenant) {
            *used = used.saturating_sub(self.instances);
        }
    }
}

#[cfg(test)]
mod tests;
