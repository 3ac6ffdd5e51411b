//! Compiling an uploaded plugin apart from the server: in a process of its own (`sluice
//! compile`), under the tenant's memory limit and the system-call filter, at a lower
//! priority than running jobs, and within `[server] compile_deadline_ms`. A component
//! built to make Cranelift take minutes or gigabytes costs its own process, which the
//! server kills at the deadline; what it compiles lands in the compile cache, where the
//! server then loads it in a millisecond.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Result;

use super::cgroup::WorkerCgroup;
use super::limits::ProcessLimits;
use super::supervisor::Workers;
use crate::tenant::TenantConfig;

/// The most of a failed compile's error output kept for the answer.
const ERROR_BYTES: u64 = 16 << 10;

/// How a compile apart ended.
#[derive(Debug)]
pub enum Compiled {
    /// It compiled (and is in the compile cache).
    Done,
    /// It is not a usable component: why, as the compiling process said.
    Refused(String),
    /// It took longer than the deadline, and was stopped.
    TooSlow(Duration),
    /// The compiling process died (e.g. past its memory limit).
    Died(String),
}

impl Workers {
    /// Compiles plugin `file` of `tenant` (with fuel metering if `fuel`) in a process of
    /// its own within `deadline`.
    pub fn compile(
        &self,
        tenant: &TenantConfig,
        file: &Path,
        fuel: bool,
        deadline: Duration,
    ) -> Result<Compiled> {
        let limits = ProcessLimits::of(tenant);
        let cgroup = super::supervisor::worker_cgroup(tenant);
        let joiner = cgroup.as_ref().map(WorkerCgroup::joiner).transpose()?;
        let mut command = Command::new(&self.command().program);
        command
            .args(&self.command().args)
            .arg("compile")
            .arg(file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if fuel {
            command.arg("--fuel");
        }
        // SAFETY: the closure only makes system calls (write, setrlimit, prctl,
        // setpriority), which are async-signal-safe; it allocates nothing and takes no lock.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, move || {
                if let Some(joiner) = &joiner {
                    joiner.join_in_child()?;
                }
                limits.apply_in_child()?;
                // Below running jobs: a compile waits for the cores they use.
                rustix::process::setpriority_process(None, 10)?;
                Ok(())
            });
        }
        let mut child = self.spawn(command)?;
        let stderr = child.stderr.take().expect("piped");
        let reader = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = stderr.take(ERROR_BYTES).read_to_string(&mut text);
            text
        });
        let started = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break Some(status);
            }
            if started.elapsed() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        let said = reader.join().unwrap_or_default();
        Ok(match status {
            None => Compiled::TooSlow(deadline),
            Some(status) if status.success() => Compiled::Done,
            Some(status) if status.code().is_some() => Compiled::Refused(
                said.lines()
                    .filter(|l| !l.trim().is_empty())
                    .map(|l| l.strip_prefix("error: ").unwrap_or(l))
                    .collect::<Vec<_>>()
                    .join("\n"),
            ),
            Some(status) => Compiled::Died(
                cgroup
                    .as_ref()
                    .and_then(WorkerCgroup::killed_past_memory_max)
                    .unwrap_or_else(|| super::supervisor::describe_exit(status)),
            ),
        })
    }
}
