//! `sluice serve`: a long-running, multi-tenant job service with an HTTP API.
//!
//! Tenants authenticate with bearer tokens (the host configuration keeps only their
//! SHA-256), upload plugins by content, submit job files that name them, and see and
//! control only their own jobs, plugins and output: another tenant's job is "not found".
//! Everything lives on disk under the `[server] dir`:
//!
//! ```text
//! DIR/plugins/TENANT/SHA256.wasm    uploaded components, by content hash
//! DIR/plugins/TENANT/SHA256.json    their name, size and upload time
//! DIR/jobs/ID/job.toml              a job file as submitted
//! DIR/jobs/ID/record.json           its state, and the plugins its operators resolved to
//! DIR/jobs/ID/checkpoints/          its checkpoints and savepoints
//! DIR/jobs/ID/output/               its committed output (the file sink)
//! DIR/jobs/ID/logs.txt              its last log lines, once they left memory
//! ```
//!
//! Jobs on a server read only what the server gives them: generator sources, and a file
//! sink whose file lands in the job's `output/` folder. A job recorded as running when the
//! server starts resumes from its latest complete checkpoint (from scratch when it has
//! none); with the sink's two-phase commit, a killed server loses and duplicates no
//! committed output. A job resumed three times in a row without reaching a completed
//! checkpoint or an end is quarantined instead (it may be what kills the server).
//!
//! Tenants are held to their quotas (jobs, operator instances, subtasks, disk, plugin
//! bytes; see [`crate::tenant`]) at submission and start, and to their disk quota also
//! while their jobs run: a housekeeping thread checks it every few seconds, and forgets
//! the metrics and log lines of jobs that ended long enough ago.

mod api;
mod blocking;
pub mod client;
mod http;
mod job_file;
mod jobs;
mod kafka_grant;
pub mod logs;
mod metrics;
pub mod model;
mod plugins;
mod registry;
mod savepoints;
mod tls;
mod views;
pub mod worker;

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use anyhow::{Context, Result};
use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use subtle::{ConditionallySelectable, ConstantTimeEq};

pub use api::openapi;
pub use http::{HEADER_TIMEOUT, MAX_CONNECTIONS, RunningServer, serve};
pub use metrics::{JobSample, jobs_metrics};
pub use model::JobState;

use crate::tenant::{HostConfig, InstanceBudget, TenantConfig};
use crate::wasm::WasmEngine;

/// What went wrong with a request, and the HTTP status it maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request is malformed or names something invalid (400).
    BadRequest,
    /// No valid bearer token (401).
    Unauthorized,
    /// The tenant may not do this (403).
    Forbidden,
    /// No such job or plugin of this tenant (404).
    NotFound,
    /// The job is not in a state that allows it (409).
    Conflict,
    /// The request is larger than the server accepts (413).
    TooLarge,
    /// A tenant quota would be exceeded (429).
    Quota,
    /// The server failed (500).
    Internal,
    /// The server is not ready yet: it is still resuming its jobs (503).
    Unavailable,
}

/// An error answered to a client: a kind and a message a person can act on.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// The kind (and so the HTTP status).
    pub kind: ErrorKind,
    /// What was wrong.
    pub message: String,
}

impl ApiError {
    fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        ApiError {
            kind,
            message: message.into(),
        }
    }

    fn bad(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::BadRequest, message)
    }

    fn not_found(what: &str, id: &str) -> Self {
        Self::new(ErrorKind::NotFound, format!("no {what} '{id}'"))
    }

    fn internal(e: anyhow::Error) -> Self {
        tracing::error!("server: {e:#}");
        Self::new(ErrorKind::Internal, format!("internal error: {e:#}"))
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// The SHA-256 of a bearer token, as the host configuration's `token_sha256` holds it.
pub fn token_sha256(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Lowercase hex of `bytes`.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes `bytes` to `path` durably: a temporary file, fsync, rename.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let mut file = fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing {}", tmp.display()))?;
    fs::rename(&tmp, path).with_context(|| format!("renaming {}", tmp.display()))?;
    Ok(())
}

/// Names that become folder names (tenants, job ids) are plain.
fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The job service: tenants, plugins and jobs, without the HTTP layer.
pub struct Server {
    host: HostConfig,
    engine: Arc<WasmEngine>,
    dir: PathBuf,
    budget: InstanceBudget,
    tokens: Vec<([u8; 32], TenantConfig)>,
    jobs: registry::Jobs,
    /// Bytes of plugin uploads under way, by tenant: counted against its quota until
    /// they are stored, so that concurrent uploads cannot pass it together.
    uploads: Mutex<BTreeMap<String, u64>>,
    /// Whether it resumed the jobs of its registry: until then its API answers 503.
    resumed: AtomicBool,
    /// When each tenant's plugin uploads were refused of late (`plugins::REFUSED_UPLOADS`).
    refused_uploads: Mutex<BTreeMap<String, Vec<std::time::Instant>>>,
    /// Requests of each tenant waiting on the blocking pool (`blocking::BLOCKING_PER_TENANT`).
    blocking: Mutex<BTreeMap<String, u32>>,
    /// The tenants' worker processes, when jobs run in them ([`Server::use_workers`]).
    workers: std::sync::OnceLock<Arc<worker::supervisor::Workers>>,
}

/// How often the housekeeping thread checks disk quotas and forgets ended jobs.
const HOUSEKEEPING_PERIOD: Duration = Duration::from_secs(2);

impl Server {
    /// Opens the registry under `host.server.dir` (creating it) and resumes the jobs it
    /// records as running.
    pub fn open(host: HostConfig, engine: Arc<WasmEngine>) -> Result<Arc<Server>> {
        let server = Server::load(host, engine)?;
        server.resume_jobs()?;
        Ok(server)
    }

    /// Opens the registry under `host.server.dir` (creating it) without resuming its
    /// jobs: until [`Server::resume_jobs`] its API answers 503 and `/readyz` says it is
    /// starting, while `/livez` answers, so that a server with many jobs to resume can be
    /// told from one that hangs.
    pub fn load(host: HostConfig, engine: Arc<WasmEngine>) -> Result<Arc<Server>> {
        let dir = host.server.dir.clone();
        for sub in ["plugins", "jobs"] {
            fs::create_dir_all(dir.join(sub))
                .with_context(|| format!("creating {}", dir.join(sub).display()))?;
        }
        let mut tokens = Vec::new();
        for tenant in host.tenants() {
            match tenant.token_sha256 {
                Some(hash) if is_plain_name(&tenant.name) => tokens.push((hash, tenant.clone())),
                Some(_) => anyhow::bail!(
                    "tenant '{}': a served tenant's name may hold only letters, digits, '-' and '_'",
                    tenant.name
                ),
                None => tracing::warn!(
                    "tenant '{}' has no token_sha256: it cannot use the server",
                    tenant.name
                ),
            }
        }
        if tokens.is_empty() {
            tracing::warn!("no tenant has a token_sha256: every request will be refused");
        }
        let server = Arc::new(Server {
            host,
            engine,
            dir,
            budget: InstanceBudget::default(),
            tokens,
            jobs: registry::Jobs::default(),
            uploads: Mutex::default(),
            resumed: AtomicBool::new(false),
            blocking: Mutex::default(),
            refused_uploads: Mutex::default(),
            workers: std::sync::OnceLock::new(),
        });
        // The thread holds the server weakly: it ends once the server is dropped.
        let weak = Arc::downgrade(&server);
        thread::Builder::new()
            .name("server housekeeping".into())
            .spawn(move || {
                loop {
                    thread::sleep(HOUSEKEEPING_PERIOD);
                    match weak.upgrade() {
                        Some(server) if !server.jobs.is_shutting_down() => server.housekeeping(),
                        _ => break,
                    }
                }
            })
            .context("starting the server's housekeeping thread")?;
        Ok(server)
    }

    /// The server as a worker process uses it: to build and run its tenant's jobs from
    /// the registry, with no API, housekeeping or jobs of its own.
    pub fn for_worker(host: HostConfig, engine: Arc<WasmEngine>) -> Arc<Server> {
        Arc::new(Server {
            dir: host.server.dir.clone(),
            host,
            engine,
            budget: InstanceBudget::default(),
            tokens: Vec::new(),
            jobs: registry::Jobs::default(),
            uploads: Mutex::default(),
            resumed: AtomicBool::new(true),
            blocking: Mutex::default(),
            refused_uploads: Mutex::default(),
            workers: std::sync::OnceLock::new(),
        })
    }

    /// Runs each tenant's jobs in a worker process of its own (if the host configuration
    /// does not say `[server] workers = false`); call before [`Server::resume_jobs`].
    pub fn use_workers(&self, command: worker::supervisor::WorkerCommand) -> Result<()> {
        if self.host.server.workers {
            tracing::info!("{}", worker::limits::describe());
            let _ = self.workers.set(Arc::new(worker::supervisor::Workers::new(
                command,
                self.host.server.worker_timeout,
            )?));
        } else {
            tracing::info!("jobs run in the server's process ([server] workers = false)");
        }
        Ok(())
    }

    /// Resumes the jobs the registry records as running (once); the API answers from then
    /// on.
    pub fn resume_jobs(&self) -> Result<()> {
        if !self.resumed.load(Ordering::Acquire) {
            self.recover()?;
            self.resumed.store(true, Ordering::Release);
        }
        Ok(())
    }

    /// How `/readyz` finds the server: ready once it resumed its jobs, until it shuts
    /// down.
    pub fn readiness(&self) -> model::ProbeStatus {
        if self.jobs.is_shutting_down() {
            model::ProbeStatus::ShuttingDown
        } else if self.resumed.load(Ordering::Acquire) {
            model::ProbeStatus::Ready
        } else {
            model::ProbeStatus::Starting
        }
    }

    /// The tenant whose token this is.
    pub fn authenticate(&self, token: &str) -> Option<&TenantConfig> {
        let hash = token_sha256(token);
        // Every known hash is compared in full and the match is selected without a
        // branch, so timing says nothing about which one matched, nor how much of it.
        let mut found = u32::MAX;
        for (i, (known, _)) in self.tokens.iter().enumerate() {
            found.conditional_assign(&(i as u32), known.ct_eq(&hash));
        }
        self.tokens.get(found as usize).map(|(_, tenant)| tenant)
    }

    /// The configured tenants that can log in.
    pub fn tenants(&self) -> impl Iterator<Item = &TenantConfig> {
        self.tokens.iter().map(|(_, t)| t)
    }

    /// The registry folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}
