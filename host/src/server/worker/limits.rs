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
//! - cgroup v2 (`memory.max`, `pids.max`, `cpu.weight`) where the server's own cgroup is
//!   delegated to it ([`super::cgroup`]); [`describe`] says at start-up whether it is.
//!
//! The system-call filter allows only the calls a worker makes ([`ALLOWED`], and a few
//! with their arguments checked); any other fails with `ENOSYS`, as on a kernel that
//! does not have it. It exists for x86-64; elsewhere [`describe`] says there is none.

use std::collections::BTreeMap;
use std::io;

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

/// The system calls a worker makes, allowed whatever their arguments: those of
/// wasmtime, the allocator, threads, files (RocksDB's included), sockets and polling
/// (librdkafka's and the control socket's), found by tracing workers running every kind
/// of job (heap and RocksDB state, file, stdout and Kafka sources and sinks, restarts,
/// savepoints) and completed with their close relatives (`pwritev` beside `pwrite64`).
#[cfg(target_arch = "x86_64")]
const ALLOWED: &[libc::c_long] = &[
    // Memory.
    libc::SYS_brk,
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mprotect,
    libc::SYS_mremap,
    libc::SYS_madvise,
    libc::SYS_msync,
    libc::SYS_mincore,
    libc::SYS_membarrier,
    libc::SYS_memfd_create,
    // Threads, signals, time, identity.
    libc::SYS_futex,
    libc::SYS_set_robust_list,
    libc::SYS_set_tid_address,
    libc::SYS_rseq,
    libc::SYS_arch_prctl,
    libc::SYS_sigaltstack,
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_restart_syscall,
    libc::SYS_sched_yield,
    libc::SYS_sched_getaffinity,
    libc::SYS_sched_getparam,
    libc::SYS_sched_getscheduler,
    libc::SYS_getpriority,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_getpid,
    libc::SYS_getppid,
    libc::SYS_gettid,
    libc::SYS_getuid,
    libc::SYS_geteuid,
    libc::SYS_getgid,
    libc::SYS_getegid,
    libc::SYS_getresuid,
    libc::SYS_getresgid,
    libc::SYS_getgroups,
    libc::SYS_getrlimit,
    libc::SYS_getrusage,
    libc::SYS_sysinfo,
    libc::SYS_uname,
    libc::SYS_times,
    libc::SYS_getrandom,
    libc::SYS_clock_gettime,
    libc::SYS_clock_getres,
    libc::SYS_clock_nanosleep,
    libc::SYS_nanosleep,
    libc::SYS_gettimeofday,
    libc::SYS_time,
    libc::SYS_timerfd_create,
    libc::SYS_timerfd_settime,
    libc::SYS_timerfd_gettime,
    // Files and descriptors.
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_readv,
    libc::SYS_writev,
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_preadv,
    libc::SYS_pwritev,
    libc::SYS_preadv2,
    libc::SYS_pwritev2,
    libc::SYS_lseek,
    libc::SYS_open,
    libc::SYS_openat,
    libc::SYS_close,
    libc::SYS_close_range,
    libc::SYS_dup,
    libc::SYS_dup2,
    libc::SYS_dup3,
    libc::SYS_fcntl,
    libc::SYS_flock,
    libc::SYS_stat,
    libc::SYS_lstat,
    libc::SYS_fstat,
    libc::SYS_newfstatat,
    libc::SYS_statx,
    libc::SYS_statfs,
    libc::SYS_fstatfs,
    libc::SYS_access,
    libc::SYS_faccessat,
    libc::SYS_faccessat2,
    libc::SYS_getcwd,
    libc::SYS_getdents64,
    libc::SYS_readlink,
    libc::SYS_readlinkat,
    libc::SYS_mkdir,
    libc::SYS_mkdirat,
    libc::SYS_rmdir,
    libc::SYS_unlink,
    libc::SYS_unlinkat,
    libc::SYS_rename,
    libc::SYS_renameat,
    libc::SYS_renameat2,
    libc::SYS_link,
    libc::SYS_linkat,
    libc::SYS_symlink,
    libc::SYS_symlinkat,
    libc::SYS_fchmod,
    libc::SYS_fchmodat,
    libc::SYS_umask,
    libc::SYS_utimensat,
    libc::SYS_ftruncate,
    libc::SYS_truncate,
    libc::SYS_fallocate,
    libc::SYS_fadvise64,
    libc::SYS_readahead,
    libc::SYS_fsync,
    libc::SYS_fdatasync,
    libc::SYS_sync_file_range,
    libc::SYS_copy_file_range,
    libc::SYS_sendfile,
    libc::SYS_pipe,
    libc::SYS_pipe2,
    libc::SYS_eventfd,
    libc::SYS_eventfd2,
    // Polling and sockets (the kinds of socket are checked below).
    libc::SYS_poll,
    libc::SYS_ppoll,
    libc::SYS_select,
    libc::SYS_pselect6,
    libc::SYS_epoll_create,
    libc::SYS_epoll_create1,
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_wait,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_pwait2,
    libc::SYS_socketpair,
    libc::SYS_connect,
    libc::SYS_accept,
    libc::SYS_accept4,
    libc::SYS_bind,
    libc::SYS_listen,
    libc::SYS_shutdown,
    libc::SYS_getsockname,
    libc::SYS_getpeername,
    libc::SYS_setsockopt,
    libc::SYS_getsockopt,
    libc::SYS_sendto,
    libc::SYS_recvfrom,
    libc::SYS_sendmsg,
    libc::SYS_recvmsg,
    libc::SYS_sendmmsg,
    libc::SYS_recvmmsg,
];

/// The kinds of socket a worker opens: Unix (its control socket), IPv4 and IPv6 (Kafka,
/// DNS), and netlink (the C library asks the kernel for the host's addresses there when
/// it resolves a name).
const SOCKET_DOMAINS: &[libc::c_int] = &[
    libc::AF_UNIX,
    libc::AF_INET,
    libc::AF_INET6,
    libc::AF_NETLINK,
];

/// The `ioctl` requests a worker makes: is a descriptor a terminal (and how wide), make
/// it non-blocking or close-on-exec, how much can be read, and a file's generation
/// (RocksDB's unique file ids).
const IOCTLS: &[u64] = &[
    libc::TCGETS,
    libc::TIOCGWINSZ,
    libc::FIONBIO,
    libc::FIONREAD,
    libc::FIOCLEX,
    libc::FIONCLEX,
    0x8008_7601, // FS_IOC_GETVERSION
];

/// The `prctl` operations a worker makes: name a thread, and (harmless) read-only ones.
const PRCTLS: &[libc::c_int] = &[
    libc::PR_SET_NAME,
    libc::PR_GET_NAME,
    libc::PR_SET_NO_NEW_PRIVS,
    libc::PR_GET_NO_NEW_PRIVS,
    libc::PR_GET_PDEATHSIG,
    libc::PR_GET_DUMPABLE,
];

/// `clone` flags that make a namespace: a new thread never sets them.
const NAMESPACE_FLAGS: u64 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWCGROUP
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET) as u64;

/// The worker's system-call filter for a process whose id is `pid`: the calls in
/// [`ALLOWED`]; `socket`, `ioctl` and `prctl` for the kinds, requests and operations
/// listed above; `clone` without namespace flags (`clone3`, whose flags a filter cannot
/// read, is refused, and the C library falls back to `clone`); `tgkill` and `prlimit64`
/// on this process only (a worker runs as the server's user, and would otherwise reach
/// the server and the other workers). Every other call fails with `ENOSYS`, as on a
/// kernel without it: `execve`, `fork`, `kill`, `ptrace`, mounts and namespaces, module
/// and key calls, eBPF, `perf_event_open`, `io_uring`, `userfaultfd`, clocks, …
#[cfg(target_arch = "x86_64")]
fn filter(pid: u32) -> Result<seccompiler::BpfProgram> {
    use seccompiler::{
        SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition as If,
        SeccompFilter, SeccompRule, TargetArch,
    };
    let error = |e: seccompiler::BackendError| anyhow::anyhow!("system-call filter: {e}");
    let when = |conditions: Vec<If>| SeccompRule::new(conditions).map_err(error);
    let any_of = |arg: u8, len: Len, values: &mut dyn Iterator<Item = u64>| {
        values
            .map(|v| when(vec![If::new(arg, len.clone(), Op::Eq, v).map_err(error)?]))
            .collect::<Result<Vec<_>>>()
    };
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        ALLOWED.iter().map(|&call| (call, Vec::new())).collect();
    rules.insert(
        libc::SYS_socket,
        any_of(0, Len::Dword, &mut SOCKET_DOMAINS.iter().map(|&d| d as u64))?,
    );
    rules.insert(
        libc::SYS_ioctl,
        any_of(1, Len::Dword, &mut IOCTLS.iter().copied())?,
    );
    rules.insert(
        libc::SYS_prctl,
        any_of(0, Len::Dword, &mut PRCTLS.iter().map(|&op| op as u64))?,
    );
    rules.insert(
        libc::SYS_clone,
        vec![when(vec![
            If::new(0, Len::Qword, Op::MaskedEq(NAMESPACE_FLAGS), 0).map_err(error)?,
        ])?],
    );
    rules.insert(
        libc::SYS_tgkill,
        any_of(0, Len::Dword, &mut std::iter::once(u64::from(pid)))?,
    );
    rules.insert(
        libc::SYS_prlimit64,
        any_of(0, Len::Dword, &mut [0, u64::from(pid)].into_iter())?,
    );
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Errno(libc::ENOSYS as u32),
        SeccompAction::Allow,
        TargetArch::x86_64,
    )
    .map_err(|e| anyhow::anyhow!("system-call filter: {e}"))?;
    filter
        .try_into()
        .map_err(|e| anyhow::anyhow!("system-call filter: {e:?}"))
}

/// Installs the worker's system-call filter ([`filter`]) on every thread of the calling
/// process (call it before starting threads that run plugins).
#[cfg(target_arch = "x86_64")]
pub fn filter_system_calls() -> Result<()> {
    let program = filter(std::process::id())?;
    seccompiler::apply_filter_all_threads(&program).context("installing the system-call filter")
}

/// Without a list for this architecture, no filter (said at start-up by [`describe`]).
#[cfg(not(target_arch = "x86_64"))]
pub fn filter_system_calls() -> Result<()> {
    Ok(())
}

/// One line for the server's log at start-up: which limits apply to workers here.
pub fn describe() -> String {
    let filter = if cfg!(target_arch = "x86_64") {
        "a system-call filter (seccomp: an allow list)"
    } else {
        "no system-call filter (none for this architecture)"
    };
    format!(
        "worker processes run under RLIMIT_DATA (process_memory_mb), RLIMIT_NOFILE \
         (open_files), no core files, no new privileges and {filter}; {}",
        super::cgroup::describe()
    )
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// Set for the copy of this test binary that runs [`probe_under_the_filter`].
    const PROBE: &str = "SLUICE_SYSCALL_FILTER_PROBE";

    /// `syscall(call, args…)`, and its `errno` when it failed.
    fn call(call: libc::c_long, args: [libc::c_long; 4]) -> Result<libc::c_long, i32> {
        // SAFETY: each probe passes arguments the call accepts (null pointers where it
        // writes nothing back); a refused call does nothing.
        let r = unsafe { libc::syscall(call, args[0], args[1], args[2], args[3]) };
        if r == -1 {
            Err(io::Error::last_os_error().raw_os_error().unwrap_or(0))
        } else {
            Ok(r)
        }
    }

    /// Installs the filter in this process and checks what it lets through; run only
    /// in the process [`the_filter_lets_a_worker_work_and_refuses_what_reaches_outside`]
    /// starts (the filter cannot be taken off again).
    #[test]
    fn probe_under_the_filter() {
        let Some(parent) = std::env::var_os(PROBE) else {
            return;
        };
        let parent: libc::c_long = parent.to_str().unwrap().parse().unwrap();
        filter_system_calls().unwrap();
        let own = std::process::id() as libc::c_long;
        let refused = |name: &str, r: Result<libc::c_long, i32>| {
            assert_eq!(r, Err(libc::ENOSYS), "{name}");
        };
        // What a worker does still works: threads (`clone3` refused, `clone` used),
        // files, pipes, sockets of the kinds it uses, signals to itself.
        let t = std::thread::spawn(|| 7).join().unwrap();
        assert_eq!(t, 7);
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"x").unwrap();
        std::fs::rename(dir.path().join("f"), dir.path().join("g")).unwrap();
        assert_eq!(std::fs::read(dir.path().join("g")).unwrap(), b"x");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let tid = call(libc::SYS_gettid, [0; 4]).unwrap();
        call(libc::SYS_tgkill, [own, tid, 0, 0]).unwrap();
        call(libc::SYS_prlimit64, [0, libc::RLIMIT_NOFILE as _, 0, 0]).unwrap();
        // What reaches outside the process is refused.
        refused("kill the parent", call(libc::SYS_kill, [parent, 0, 0, 0]));
        refused(
            "tgkill the parent",
            call(libc::SYS_tgkill, [parent, parent, 0, 0]),
        );
        refused(
            "prlimit64 of the parent",
            call(
                libc::SYS_prlimit64,
                [parent, libc::RLIMIT_NOFILE as _, 0, 0],
            ),
        );
        refused(
            "ptrace",
            call(libc::SYS_ptrace, [libc::PTRACE_TRACEME as _, 0, 0, 0]),
        );
        refused("fork", call(libc::SYS_fork, [0; 4]));
        refused("execve", call(libc::SYS_execve, [0; 4]));
        refused(
            "unshare a user namespace",
            call(libc::SYS_unshare, [libc::CLONE_NEWUSER as _, 0, 0, 0]),
        );
        refused(
            "a packet socket",
            call(
                libc::SYS_socket,
                [libc::AF_PACKET as _, libc::SOCK_RAW as _, 0, 0],
            ),
        );
        refused(
            "TIOCSTI",
            call(libc::SYS_ioctl, [0, libc::TIOCSTI as _, 0, 0]),
        );
        refused(
            "io_uring_setup",
            call(libc::SYS_io_uring_setup, [1, 0, 0, 0]),
        );
        refused("bpf", call(libc::SYS_bpf, [0; 4]));
        refused("mount", call(libc::SYS_mount, [0; 4]));
    }

    #[test]
    fn the_filter_lets_a_worker_work_and_refuses_what_reaches_outside() {
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "server::worker::limits::tests::probe_under_the_filter",
                "--test-threads",
                "1",
            ])
            .env(PROBE, std::process::id().to_string())
            .status()
            .unwrap();
        assert!(
            status.success(),
            "the probe under the filter failed: {status}"
        );
    }
}
