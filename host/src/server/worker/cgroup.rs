//! cgroup v2 limits on worker processes, where the server's own cgroup is delegated to
//! it (systemd's `Delegate=yes`, a container given a cgroup of its own): each worker
//! process runs in a cgroup of its own under the server's, with `memory.max` (its
//! tenant's `process_memory_mb`, counting what `RLIMIT_DATA` does not: page cache,
//! kernel memory, shared mappings), `pids.max` (threads) and `cpu.weight` (its tenant's
//! `cpu_weight`). Past `memory.max` the kernel's out-of-memory killer kills that worker
//! alone, and the server says so in the jobs' failure.
//!
//! A cgroup that enables controllers for its children may hold no process itself, so
//! the server first moves itself into a leaf beside its workers:
//!
//! ```text
//! <the server's cgroup>/          memory, pids and cpu enabled for its children
//!     server/                     the server process
//!     worker-<tenant>-<n>/        one per worker process, removed when it has ended
//! ```
//!
//! Where the hierarchy is cgroup v1, or the server's cgroup is not its to change, nothing
//! is created and [`describe`] says why at start-up; the resource limits of
//! [`super::limits`] apply either way.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::tenant::TenantConfig;

/// The controllers whose limits workers get, in the order they are enabled.
const CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];

/// Threads a worker may have beyond four per subtask of its tenant: RocksDB's, Kafka
/// clients', the checkpoint writers, the control socket's.
const SPARE_THREADS: u64 = 256;

/// The cgroup the server runs in, taken over for its workers.
#[derive(Debug)]
pub struct Cgroups {
    dir: PathBuf,
    /// The controllers of [`CONTROLLERS`] enabled for workers (those the server's cgroup
    /// has).
    controllers: Vec<&'static str>,
    next: AtomicU64,
}

/// The server's cgroups, prepared at the first call; `Err` says why workers get none.
pub fn cgroups() -> Result<&'static Cgroups, &'static str> {
    static CGROUPS: OnceLock<Result<Cgroups, String>> = OnceLock::new();
    CGROUPS
        .get_or_init(Cgroups::detect)
        .as_ref()
        .map_err(String::as_str)
}

/// One line for the server's log: which cgroup limits workers run under, or why none.
pub fn describe() -> String {
    match cgroups() {
        Ok(cgroups) => cgroups.describe(),
        Err(why) => {
            format!("cgroup v2 limits (memory.max, pids.max, cpu.weight) do not apply: {why}")
        }
    }
}

impl Cgroups {
    /// The server's own cgroup v2, if the machine has one and it is the server's to change.
    fn detect() -> Result<Cgroups, String> {
        let root = Path::new("/sys/fs/cgroup");
        if !root.join("cgroup.controllers").exists() {
            return Err(if root.join("unified/cgroup.controllers").exists() {
                "the machine's cgroup hierarchy is hybrid: the controllers are cgroup v1's, and \
                 the cgroup v2 at /sys/fs/cgroup/unified has none of them"
                    .into()
            } else {
                "no cgroup v2 hierarchy at /sys/fs/cgroup".into()
            });
        }
        let own = fs::read_to_string("/proc/self/cgroup")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("0::").map(str::to_string))
            })
            .ok_or("/proc/self/cgroup names no cgroup v2 of the server's")?;
        Cgroups::take_over(&root.join(own.trim().trim_start_matches('/')))
    }

    /// Takes over `dir`, the cgroup the server runs in: moves the server into its leaf
    /// `server`, enables the [`CONTROLLERS`] it has for its children, and removes the
    /// empty worker cgroups an earlier server left there.
    pub(crate) fn take_over(dir: &Path) -> Result<Cgroups, String> {
        let control = dir.join("cgroup.subtree_control");
        if rustix::fs::access(&control, rustix::fs::Access::WRITE_OK).is_err() {
            return Err(format!(
                "the server's cgroup {} is not delegated to it",
                dir.display()
            ));
        }
        let available = fs::read_to_string(dir.join("cgroup.controllers"))
            .map_err(|e| format!("reading {}: {e}", dir.join("cgroup.controllers").display()))?;
        let controllers: Vec<&'static str> = CONTROLLERS
            .into_iter()
            .filter(|c| available.split_whitespace().any(|a| a == *c))
            .collect();
        let leaf = dir.join("server");
        match fs::create_dir(&leaf) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => {
                return Err(format!("creating {}: {e}", leaf.display()));
            }
            _ => {}
        }
        write(&leaf.join("cgroup.procs"), &std::process::id().to_string())
            .map_err(|e| format!("moving the server into {}: {e}", leaf.display()))?;
        if !controllers.is_empty() {
            let enable: Vec<String> = controllers.iter().map(|c| format!("+{c}")).collect();
            write(&control, &enable.join(" ")).map_err(|e| {
                let why = if e.raw_os_error() == Some(libc::EBUSY) {
                    "other processes than the server's are in it".to_string()
                } else {
                    e.to_string()
                };
                format!(
                    "enabling {} for the children of {}: {why}",
                    controllers.join(", "),
                    dir.display()
                )
            })?;
        }
        if let Ok(entries) = fs::read_dir(dir) {
            for entry in entries.flatten() {
                if entry.file_name().to_string_lossy().starts_with("worker-") {
                    // Fails, harmlessly, for a cgroup with a process still in it.
                    let _ = fs::remove_dir(entry.path());
                }
            }
        }
        Ok(Cgroups {
            dir: dir.to_path_buf(),
            controllers,
            next: AtomicU64::new(0),
        })
    }

    fn describe(&self) -> String {
        let files: Vec<&str> = self
            .controllers
            .iter()
            .map(|c| match *c {
                "memory" => "memory.max (process_memory_mb)",
                "pids" => "pids.max",
                _ => "cpu.weight (cpu_weight)",
            })
            .collect();
        let missing: Vec<&str> = CONTROLLERS
            .into_iter()
            .filter(|c| !self.controllers.contains(c))
            .collect();
        let mut line = format!(
            "each worker process runs in a cgroup v2 of its own under {}",
            self.dir.display()
        );
        if !files.is_empty() {
            line += &format!(" with {}", files.join(", "));
        }
        if !missing.is_empty() {
            line += &format!(
                "; the {} controller(s) are not available there",
                missing.join(", ")
            );
        }
        line
    }

    /// Creates the cgroup of a new worker process of `tenant`, with its limits.
    pub fn create(&self, tenant: &TenantConfig) -> io::Result<WorkerCgroup> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let name: String = tenant
            .name
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        let path = self.dir.join(format!("worker-{name}-{n}"));
        fs::create_dir(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("creating {}: {e}", path.display())))?;
        let cgroup = WorkerCgroup {
            procs: File::options()
                .write(true)
                .create(true)
                .truncate(false)
                .open(path.join("cgroup.procs"))
                .map_err(|e| {
                    io::Error::new(e.kind(), format!("opening {}: {e}", path.display()))
                })?,
            path,
        };
        for controller in &self.controllers {
            match *controller {
                "memory" => {
                    cgroup.set("memory.max", tenant.process_memory_bytes)?;
                    // The worker is one process: killed whole, never left half-running.
                    cgroup.set("memory.oom.group", 1)?;
                }
                "pids" => cgroup.set(
                    "pids.max",
                    4 * u64::from(tenant.max_subtasks) + SPARE_THREADS,
                )?,
                // cgroup's weights run from 1 to 10,000, 100 by default (the server's).
                _ => cgroup.set(
                    "cpu.weight",
                    (u64::from(tenant.limits.cpu_weight) * 100).clamp(1, 10_000),
                )?,
            }
        }
        Ok(cgroup)
    }
}

/// The cgroup of one worker process; removed when dropped (after the process ended).
#[derive(Debug)]
pub struct WorkerCgroup {
    path: PathBuf,
    /// Its `cgroup.procs`.
    procs: File,
}

/// What a process being started takes along to join a [`WorkerCgroup`] between `fork`
/// and `exec`: the cgroup's `cgroup.procs`, open.
#[derive(Debug)]
pub struct Joiner(File);

impl Joiner {
    /// In the child between `fork` and `exec`: moves the calling process into the
    /// cgroup (only a system call: no allocation, no lock).
    pub fn join_in_child(&self) -> io::Result<()> {
        // "0" is the writing process.
        rustix::io::write(&self.0, b"0")?;
        Ok(())
    }
}

impl WorkerCgroup {
    /// A [`Joiner`] for the closure that runs in the child.
    pub fn joiner(&self) -> io::Result<Joiner> {
        Ok(Joiner(self.procs.try_clone()?))
    }

    /// The cgroup's folder.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Why its process died, when the kernel killed it for passing its `memory.max`.
    pub fn killed_past_memory_max(&self) -> Option<String> {
        (self.oom_kills() > 0).then(|| {
            "the kernel killed it for passing its cgroup's memory.max (the tenant's \
             process_memory_mb)"
                .to_string()
        })
    }

    /// The processes the kernel killed in it for passing its `memory.max`.
    pub fn oom_kills(&self) -> u64 {
        fs::read_to_string(self.path.join("memory.events"))
            .ok()
            .and_then(|events| {
                events.lines().find_map(|l| {
                    l.strip_prefix("oom_kill ")
                        .and_then(|n| n.trim().parse().ok())
                })
            })
            .unwrap_or(0)
    }

    fn set(&self, file: &str, value: u64) -> io::Result<()> {
        let path = self.path.join(file);
        write(&path, &value.to_string())
            .map_err(|e| io::Error::new(e.kind(), format!("setting {}: {e}", path.display())))
    }
}

impl Drop for WorkerCgroup {
    fn drop(&mut self) {
        if let Err(e) = fs::remove_dir(&self.path) {
            tracing::debug!(cgroup = %self.path.display(), "not removed: {e}");
        }
    }
}

/// Writes `value` to the cgroup file `path` in one call, as the kernel reads it.
fn write(path: &Path, value: &str) -> io::Result<()> {
    // (`create` for a plain folder standing in for one in tests; the kernel's files
    // exist, and opening one with it opens it.)
    File::options()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?
        .write_all(value.as_bytes())
}

#[cfg(test)]
mod tests;
