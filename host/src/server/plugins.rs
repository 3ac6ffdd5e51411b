//! Plugins uploaded to a server: stored per tenant by content hash, checked before they
//! are kept.

use std::fs;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::model::{Plugin as PluginView, PluginList, rfc3339};
use super::{ApiError, ErrorKind, Server, hex, write_atomic};
use crate::tenant::TenantConfig;
use crate::wasm::Plugin;

/// A stored plugin, as its `SHA256.json` keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct PluginEntry {
    /// SHA-256 of the component, hex.
    pub sha256: String,
    /// The name it was uploaded under.
    pub name: String,
    /// Bytes.
    pub size: u64,
    /// The operator interface it exports.
    pub interface: String,
    /// Upload time, milliseconds since the Unix epoch.
    pub uploaded_ms: u64,
    /// The calls it exports.
    #[serde(default)]
    pub calls: Vec<String>,
    /// The config keys it declares, if it does.
    #[serde(default)]
    pub config_keys: Option<Vec<String>>,
}

impl PluginEntry {
    /// As the API serves it.
    fn view(self) -> PluginView {
        PluginView {
            uploaded: rfc3339(self.uploaded_ms as i64),
            sha256: self.sha256,
            name: self.name,
            size: self.size,
            interface: self.interface,
            uploaded_ms: self.uploaded_ms,
            calls: self.calls,
            config_keys: self.config_keys,
        }
    }
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Server {
    fn plugin_dir(&self, tenant: &str) -> PathBuf {
        self.dir.join("plugins").join(tenant)
    }

    /// The component file of `tenant`'s plugin `sha256`, if it was uploaded.
    pub(super) fn plugin_path(&self, tenant: &str, sha256: &str) -> Option<PathBuf> {
        let plain = sha256.len() == 64 && sha256.bytes().all(|b| b.is_ascii_hexdigit());
        let path = self.plugin_dir(tenant).join(format!("{sha256}.wasm"));
        (plain && path.is_file()).then_some(path)
    }

    /// `tenant`'s plugins, newest first.
    pub fn plugins(&self, tenant: &TenantConfig) -> PluginList {
        let plugins = self.list_plugins(tenant);
        PluginList {
            plugins: plugins.into_iter().map(PluginEntry::view).collect(),
        }
    }

    /// `tenant`'s stored plugins, newest first.
    pub(super) fn list_plugins(&self, tenant: &TenantConfig) -> Vec<PluginEntry> {
        let Ok(dir) = fs::read_dir(self.plugin_dir(&tenant.name)) else {
            return Vec::new();
        };
        let mut entries: Vec<PluginEntry> = dir
            .filter_map(|e| {
                let path = e.ok()?.path();
                if path.extension()? != "json" {
                    return None;
                }
                serde_json::from_slice(&fs::read(path).ok()?).ok()
            })
            .collect();
        entries.sort_by(|a, b| b.uploaded_ms.cmp(&a.uploaded_ms).then(a.name.cmp(&b.name)));
        entries
    }

    /// The newest plugin `tenant` uploaded as `name`.
    pub(super) fn plugin_named(&self, tenant: &TenantConfig, name: &str) -> Option<PluginEntry> {
        self.list_plugins(tenant)
            .into_iter()
            .find(|p| p.name == name)
    }

    /// Deletes `tenant`'s plugin `key` (its SHA-256, or the name it was last uploaded
    /// under), unless a job that could still run uses it.
    pub fn delete_plugin(&self, tenant: &TenantConfig, key: &str) -> Result<PluginView, ApiError> {
        // No job is admitted meanwhile that would use it.
        self.admitting(|| self.delete_plugin_admitted(tenant, key))
            .map(PluginEntry::view)
    }

    fn delete_plugin_admitted(
        &self,
        tenant: &TenantConfig,
        key: &str,
    ) -> Result<PluginEntry, ApiError> {
        let entry = self
            .list_plugins(tenant)
            .into_iter()
            .find(|p| p.sha256 == key.to_ascii_lowercase() || p.name == key)
            .ok_or_else(|| ApiError::not_found("plugin", key))?;
        let users = self.jobs_using_plugin(tenant, &entry.sha256);
        if !users.is_empty() {
            return Err(ApiError::new(
                ErrorKind::Conflict,
                format!(
                    "cannot delete plugin {} ({}): jobs {} use it (delete them first)",
                    entry.name,
                    entry.sha256,
                    users.join(", ")
                ),
            ));
        }
        let dir = self.plugin_dir(&tenant.name);
        for ext in ["json", "wasm"] {
            match fs::remove_file(dir.join(format!("{}.{ext}", entry.sha256))) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(ApiError::internal(anyhow::anyhow!(
                        "deleting plugin {}: {e}",
                        entry.sha256
                    )));
                }
            }
        }
        Ok(entry)
    }

    /// Checks and stores a component for `tenant`. Uploading the same bytes again only
    /// renames it.
    pub fn upload_plugin(
        &self,
        tenant: &TenantConfig,
        name: &str,
        bytes: &[u8],
    ) -> Result<PluginView, ApiError> {
        if !name.ends_with(".wasm")
            || name.contains(['/', '\\'])
            || name.starts_with('.')
            || name.len() > 128
        {
            return Err(ApiError::bad(format!(
                "plugin name {name:?} must be a file name ending in .wasm"
            )));
        }
        let sha256 = hex(&Sha256::digest(bytes));
        let dir = self.plugin_dir(&tenant.name);
        self.not_refusing_uploads(tenant)?;
        let _reservation = self.reserve_upload(tenant, name, &sha256, bytes.len() as u64)?;
        // Check it under its own name, so that errors name the file the tenant sent; in a
        // folder of its own, as the same bytes may be uploaded twice at once.
        static UPLOADS: AtomicU64 = AtomicU64::new(0);
        let n = UPLOADS.fetch_add(1, Ordering::Relaxed);
        let incoming = dir.join(format!(".incoming-{sha256}-{n}"));
        let file = incoming.join(name);
        let checked = fs::create_dir_all(&incoming)
            .and_then(|()| fs::write(&file, bytes))
            .map_err(|e| ApiError::internal(anyhow::anyhow!("storing {name}: {e}")))
            .and_then(|()| {
                let fuel = tenant.limits.fuel_per_call.is_some();
                let prefix = format!("{}/", incoming.display());
                self.compile_apart(tenant, &file, fuel, name)
                    .map_err(|e| ApiError::bad(e.message.replace(&prefix, "")))?;
                Plugin::load(&self.engine, &file, fuel)
                    .map_err(|e| ApiError::bad(format!("{e:#}").replace(&prefix, "")))
            });
        let result = checked.and_then(|plugin| {
            let entry = PluginEntry {
                sha256: sha256.clone(),
                name: name.to_string(),
                size: bytes.len() as u64,
                interface: plugin.info.interface.clone(),
                uploaded_ms: now_ms(),
                calls: plugin.info.calls.clone(),
                config_keys: plugin.info.config_keys.clone(),
            };
            let json = serde_json::to_vec_pretty(&entry).expect("plain data");
            fs::rename(&file, dir.join(format!("{sha256}.wasm")))
                .map_err(anyhow::Error::from)
                .and_then(|()| write_atomic(&dir.join(format!("{sha256}.json")), &json))
                .map_err(ApiError::internal)?;
            Ok(entry)
        });
        let _ = fs::remove_dir_all(&incoming);
        if matches!(&result, Err(e) if e.kind == ErrorKind::BadRequest) {
            // Checking it cost a compile: a tenant gets only so many refusals.
            self.refused_uploads
                .lock()
                .entry(tenant.name.clone())
                .or_default()
                .push(Instant::now());
        }
        result.map(PluginEntry::view)
    }

    /// Refuses uploads of a tenant whose uploads were refused [`REFUSED_UPLOADS`] times
    /// within [`REFUSED_WINDOW`]: each cost a compile in a process of its own.
    fn not_refusing_uploads(&self, tenant: &TenantConfig) -> Result<(), ApiError> {
        let mut refused = self.refused_uploads.lock();
        let times = refused.entry(tenant.name.clone()).or_default();
        times.retain(|t| t.elapsed() < REFUSED_WINDOW);
        if times.len() < REFUSED_UPLOADS {
            return Ok(());
        }
        let wait = REFUSED_WINDOW.saturating_sub(times[0].elapsed());
        Err(ApiError::new(
            ErrorKind::Quota,
            format!(
                "tenant '{}' had {} plugin uploads refused in the last {} minutes (each is \
                 compiled to be checked); it may upload again in {} s",
                tenant.name,
                times.len(),
                REFUSED_WINDOW.as_secs() / 60,
                wait.as_secs().max(1)
            ),
        ))
    }
}

impl Server {
    /// With workers, compiles an uploaded plugin in a process of its own first (see
    /// [`super::worker::compile`]), so that the server only loads what compiled there.
    fn compile_apart(
        &self,
        tenant: &TenantConfig,
        file: &std::path::Path,
        fuel: bool,
        name: &str,
    ) -> Result<(), ApiError> {
        use super::worker::compile::Compiled;
        let Some(workers) = self.workers.get() else {
            return Ok(());
        };
        // What its first bytes tell is refused without starting a process.
        let head = {
            use std::io::Read;
            let mut head = Vec::with_capacity(8);
            fs::File::open(file)
                .and_then(|f| f.take(8).read_to_end(&mut head))
                .map_err(|e| ApiError::internal(anyhow::anyhow!("{}: {e}", file.display())))?;
            head
        };
        crate::wasm::check_is_component(&head, std::path::Path::new(name))
            .map_err(|e| ApiError::bad(format!("{e:#}")))?;
        let deadline = self.host.server.compile_deadline;
        match workers
            .compile(tenant, file, fuel, deadline)
            .map_err(ApiError::internal)?
        {
            Compiled::Done => Ok(()),
            Compiled::Refused(why) => Err(ApiError::bad(why)),
            Compiled::TooSlow(deadline) => Err(ApiError::bad(format!(
                "{name}: compiling it took longer than {} ms (compile_deadline_ms of the \
                 server), and was stopped",
                deadline.as_millis()
            ))),
            Compiled::Died(why) => Err(ApiError::bad(format!(
                "{name}: the process compiling it (under tenant '{}''s memory limit, \
                 process_memory_mb) died: {why}",
                tenant.name
            ))),
        }
    }
}

/// Refused uploads a tenant may have within [`REFUSED_WINDOW`] before its uploads are
/// refused without a look.
pub const REFUSED_UPLOADS: usize = 20;

/// How long a refused upload counts.
pub const REFUSED_WINDOW: std::time::Duration = std::time::Duration::from_secs(600);

/// Bytes of an upload under way, counted against the tenant's quotas until dropped.
struct UploadReservation<'a> {
    server: &'a Server,
    tenant: String,
    bytes: u64,
}

impl Server {
    /// Checks that `bytes` more plugin bytes fit the tenant's plugin and disk quotas,
    /// counting the uploads under way, and counts them as under way until the returned
    /// reservation is dropped. Check and count happen under one lock, so that concurrent
    /// uploads cannot pass a quota together.
    fn reserve_upload(
        &self,
        tenant: &TenantConfig,
        name: &str,
        sha256: &str,
        bytes: u64,
    ) -> Result<UploadReservation<'_>, ApiError> {
        let mut uploads = self.uploads.lock();
        let pending = uploads.get(&tenant.name).copied().unwrap_or(0);
        let stored: u64 = self
            .list_plugins(tenant)
            .iter()
            .filter(|p| p.sha256 != sha256)
            .map(|p| p.size)
            .sum();
        if stored + pending + bytes > tenant.max_plugin_bytes {
            return Err(ApiError::new(
                ErrorKind::Quota,
                format!(
                    "tenant '{}' stores {stored} plugin bytes (and uploads {pending} more); \
                     {name} ({bytes} bytes) would pass its quota of {} (max_plugin_mb)",
                    tenant.name, tenant.max_plugin_bytes
                ),
            ));
        }
        let used = self.disk_usage(&tenant.name);
        if used + pending + bytes > tenant.max_disk_bytes {
            return Err(ApiError::new(
                ErrorKind::Quota,
                format!(
                    "tenant '{}' takes {used} bytes of the server's disk (and uploads {pending} \
                     more); {name} ({bytes} bytes) would pass its quota of {} (max_disk_mb)",
                    tenant.name, tenant.max_disk_bytes
                ),
            ));
        }
        *uploads.entry(tenant.name.clone()).or_default() += bytes;
        Ok(UploadReservation {
            server: self,
            tenant: tenant.name.clone(),
            bytes,
        })
    }
}

impl Drop for UploadReservation<'_> {
    fn drop(&mut self) {
        let mut uploads = self.server.uploads.lock();
        if let Some(pending) = uploads.get_mut(&self.tenant) {
            *pending = pending.saturating_sub(self.bytes);
        }
    }
}
