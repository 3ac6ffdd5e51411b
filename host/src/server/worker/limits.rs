//! The operating system's limits on a worker process, derived from its tenant's quotas:
//! resource limits set between `fork` and `exec`, and a system-call filter the worker
//! installs on itself before it loads any plugin.
//!
//! - `RLIMIT_DATA` bounds the worker's private writable memory — the heap, thread
//!   stacks, and every Wasm linear memory once it is made accessible (Linux counts a
//!   mapping when `mprotect` makes it writable) — to the tenant's `process_memory_mb`.
//!   `RLIMIT_AS` is not used: the pooling allocator reserves address space it never
//!   commits (guard regions), which would count.
//! - `RLIMIT_NOFILE` bounds its open files and sockets to the tenant's `open_files`.
//! - `RLIMIT_CORE` is 0: a crashing worker leaves no core file with a tenant's data.
//! - No new privileges, and the parent's death kills it.
//! - An `oom_score_adj` of 500: when the machine runs out of memory, the kernel's
//!   out-of-memory killer picks a worker before the server.
//! - cgroup v2 (`memory.max`, `pids.max`, `cpu.weight`) applies only where the server's
//!   own cgroup is delegated to it; [`describe`] says at start-up whether it is.
//!
//! The filter denies, with `EPERM`, the system calls a worker never makes and that
//! widen the kernel's attack surface or reach outside the process: tracing and other
//! processes' memory, namespaces and mounts, kernel modules and keyrings, eBPF and
//! performance counters, `io_uring`, `userfaultfd`, clocks, reboot, and `exec`. It is a
//! deny list, not an allow list, on purpose: a worker's calls are wasmtime's, the
//! allocator's, librdkafka's and the file system's, and an allow list that misses a
//! rare one turns that rare path (a TLS handshake, a full disk) into a dead worker.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;

use anyhow::{Context, Result};
use rustix::process::{Resource, Rlimit, setrlimit};

use crate::tenant::TenantConfig;

/// What one worker process may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessLimits {
    /// Private writable memory, bytes (`RLIMIT_DATA`).
    pub memory_bytes: u64,
    /// Open files and sockets (`RLIMIT_NOFILE`).
    pub open_files: u64,
}

impl ProcessLimits {
    /// The limits of `tenant`'s worker.
    pub fn of(tenant: &TenantConfig) -> ProcessLimits {
        ProcessLimits {
            memory_bytes: tenant.process_memory_bytes,
            open_files: tenant.open_files,
        }
    }

    /// Sets these limits on the calling process. Called in the child between `fork` and
    /// `exec`, so it only makes system calls (no allocation, no locks).
    pub fn apply_in_child(&self) -> io::Result<()> {
        let set = |resource, n: u64| {
            // Never above the hard limit the server itself runs under.
            let hard = rustix::process::getrlimit(resource).maximum;
            let n = hard.map_or(n, |hard| n.min(hard));
            setrlimit(
                resource,
                Rlimit {
                    current: Some(n),
                    maximum: Some(n),
                },
            )
        };
        set(Resource::Data, self.memory_bytes)?;
        set(Resource::Nofile, self.open_files)?;
        set(Resource::Core, 0)?;
        // When the machine runs out of memory, the kernel kills a worker before the
        // server (raising one's own score needs no privilege).
        let adj = rustix::fs::open(
            "/proc/self/oom_score_adj",
            rustix::fs::OFlags::WRONLY | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )?;
        rustix::io::write(&adj, OOM_SCORE_ADJ)?;
        drop(adj);
        rustix::thread::set_no_new_privs(true)?;
        rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
        Ok(())
    }
}

/// A worker's `oom_score_adj`: the kernel's out-of-memory killer picks workers before the
/// server (whose own is usually 0).
const OOM_SCORE_ADJ: &[u8] = b"500";

/// The system calls a worker is denied (see the module docs), on every architecture with
/// a filter.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
const DENIED: &[libc::c_long] = &[
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_kcmp,
    libc::SYS_pidfd_getfd,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_reboot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_acct,
    libc::SYS_quotactl,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    libc::SYS_sethostname,
    libc::SYS_setdomainname,
    libc::SYS_syslog,
    libc::SYS_vhangup,
    libc::SYS_personality,
    libc::SYS_execve,
    libc::SYS_execveat,
];

/// ... and those only x86-64 has (or that this list names there only).
#[cfg(target_arch = "x86_64")]
const DENIED_HERE: &[libc::c_long] = &[
    libc::SYS_iopl,
    libc::SYS_ioperm,
    libc::SYS_fanotify_init,
    libc::SYS_open_tree,
    libc::SYS_move_mount,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
];

/// ... and those only x86-64 has (or that this list names there only).
#[cfg(target_arch = "aarch64")]
const DENIED_HERE: &[libc::c_long] = &[];

/// Installs the worker's system-call filter on every thread of the calling process
/// (call it before starting threads that run plugins).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub fn deny_system_calls() -> Result<()> {
    use seccompiler::{BpfProgram, SeccompAction, SeccompFilter, TargetArch};
    let rules = DENIED
        .iter()
        .chain(DENIED_HERE)
        .map(|&call| (call, Vec::new()))
        .collect::<BTreeMap<_, _>>();
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| anyhow::anyhow!("system-call filter: {e:?}"))?;
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(|e| anyhow::anyhow!("system-call filter: {e}"))?;
    let program: BpfProgram = filter
        .try_into()
        .map_err(|e| anyhow::anyhow!("system-call filter: {e:?}"))?;
    seccompiler::apply_filter_all_threads(&program).context("installing the system-call filter")
}

/// Without a list for this architecture, no filter (said at start-up by [`describe`]).
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub fn deny_system_calls() -> Result<()> {
    Ok(())
}

/// One line for the server's log at start-up: which limits apply to workers here.
pub fn describe() -> String {
    let filter = if cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
        "a system-call filter (seccomp)"
    } else {
        "no system-call filter (none for this architecture)"
    };
    format!(
        "worker processes run under RLIMIT_DATA (process_memory_mb), RLIMIT_NOFILE \
         (open_files), no core files, no new privileges and {filter}; {}",
        cgroup_v2()
    )
}

/// Whether cgroup v2 limits can be set for workers, and why not.
fn cgroup_v2() -> String {
    let root = Path::new("/sys/fs/cgroup");
    if !root.join("cgroup.controllers").exists() {
        return "cgroup v2 limits (memory.max, pids.max, cpu.weight) do not apply: no cgroup v2 \
                hierarchy at /sys/fs/cgroup"
            .into();
    }
    let own = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("0::").map(str::to_string))
        })
        .unwrap_or_default();
    let dir = root.join(own.trim_start_matches('/'));
    let delegated = rustix::fs::access(
        dir.join("cgroup.subtree_control"),
        rustix::fs::Access::WRITE_OK,
    )
    .is_ok();
    if delegated {
        format!(
            "cgroup v2 limits (memory.max, pids.max, cpu.weight) do not apply: the server's \
             cgroup {} is delegated, but Sluice does not create worker cgroups yet",
            dir.display()
        )
    } else {
        format!(
            "cgroup v2 limits (memory.max, pids.max, cpu.weight) do not apply: the server's \
             cgroup {} is not delegated to it",
            dir.display()
        )
    }
}
