//! Host processes of a job run over several hosts (`sluice run --cluster`), and what
//! their logs say.

use std::path::Path;
use std::process::{Child, Command, Stdio};

use crate::scratch_root;

/// A host process of `job` meeting at `broker`, logging (at `info`) into `log`; `bin`
/// is `env!("CARGO_BIN_EXE_sluice-test-cli")` (only tests and benches know it).
pub fn spawn_host(bin: &str, job: &Path, broker: &str, log: &Path) -> Child {
    spawn_host_with(bin, job, broker, log, &[])
}

/// [`spawn_host`] with further arguments of `sluice run`.
pub fn spawn_host_with(bin: &str, job: &Path, broker: &str, log: &Path, args: &[&str]) -> Child {
    Command::new(bin)
        .args(["--log", "info", "run", "--quiet"])
        .arg(job)
        .args(["--cluster", broker])
        .args(args)
        .env("SLUICE_CACHE_DIR", scratch_root().join("cache"))
        .env_remove("FAILPOINTS")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("a host's log file"))
        .spawn()
        .expect("spawning sluice")
}

/// How many units a host's log last said it owns.
pub fn owned_units(log: &str) -> Option<usize> {
    let line = log.lines().rev().find(|l| l.contains(" owns units "))?;
    let list = line.rsplit_once('[')?.1.trim_end_matches(']');
    Some(list.split(',').filter(|u| !u.trim().is_empty()).count())
}

/// How many units a host's log says it started or restored.
pub fn started_units(log: &str) -> usize {
    log.matches("): restoring ").count() + log.matches("): starting").count()
}
