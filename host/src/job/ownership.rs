//! A run owns what it writes. Two runs of one job at once would reuse checkpoint ids,
//! overwrite each other's state and lineage, delete each other's checkpoints by retention
//! and staging files by sink recovery, and append to one output; so a run holds an OS
//! file lock on its checkpoint folder and on every file sink's output for as long as it
//! lasts, and a second run is refused with the holder's pid.
//!
//! The lock is a hidden file beside what it guards (`.NAME.lock`), not inside it: a fresh
//! start moves the folder and the output aside, and the lock must stay with the name the
//! next run would write under. The operating system releases it when its holder exits,
//! however it exits (SIGKILL included), so a crashed run never leaves a job locked.

use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::graph::JobGraph;
use crate::spec::SinkKind;

/// The locks of one run; dropping it releases them.
#[derive(Debug)]
pub struct RunLocks {
    _held: Vec<File>,
}

/// A run was refused because another process holds what it would write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InUse {
    /// What is in use (the checkpoint folder or an output file).
    pub what: String,
    /// The path of what is in use.
    pub path: PathBuf,
    /// The holder, as it described itself (`pid N: COMMAND`), if it could be read.
    pub holder: Option<String>,
}

impl std::fmt::Display for InUse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} is in use by another run of the job ({}); nothing was changed. Wait for \
             that run to end, or stop it (`sluice savepoint`, SIGTERM)",
            self.what,
            self.path.display(),
            self.holder
                .as_deref()
                .unwrap_or("a process that did not say which")
        )
    }
}

impl std::error::Error for InUse {}

/// Takes the locks of a run of `graph`: its checkpoint folder and its file sinks' output.
/// Fails with [`InUse`] when another process holds one of them.
pub fn lock_run(graph: &JobGraph) -> Result<RunLocks> {
    let mut held = Vec::new();
    if let Some(c) = &graph.checkpoint {
        held.push(lock(&c.dir, "the checkpoint folder")?);
    }
    for sink in graph.sinks() {
        if let (SinkKind::File, Some(path)) = (sink.kind, &sink.path) {
            held.push(lock(path, "the output")?);
        }
    }
    Ok(RunLocks { _held: held })
}

/// The lock file guarding `target`.
pub fn lock_path(target: &Path) -> PathBuf {
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "job".into());
    target.with_file_name(format!(".{name}.lock"))
}

fn lock(target: &Path, what: &str) -> Result<File> {
    let path = lock_path(target);
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .with_context(|| format!("opening the lock file {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = holder.trim();
            return Err(InUse {
                what: what.to_string(),
                path: target.to_path_buf(),
                holder: (!holder.is_empty()).then(|| holder.to_string()),
            }
            .into());
        }
        Err(TryLockError::Error(e)) => {
            return Err(e).with_context(|| format!("locking {}", path.display()));
        }
    }
    // Who holds it, for the message a second run gets.
    let me = format!("pid {}: {}", std::process::id(), command_line());
    file.set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| file.write_all(me.as_bytes()))
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(file)
}

fn command_line() -> String {
    let args: Vec<String> = std::env::args().collect();
    crate::guest_text::guest_text(&args.join(" "), 200)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_of_the_same_target_is_refused_with_the_holder_until_the_first_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("out").join("counts.tsv");
        let first = lock(&target, "the output").unwrap();
        assert!(lock_path(&target).ends_with("out/.counts.tsv.lock"));
        let refused = lock(&target, "the output").unwrap_err();
        let in_use = refused.downcast_ref::<InUse>().expect("an InUse error");
        assert_eq!(in_use.path, target);
        let holder = in_use.holder.as_deref().expect("the holder said who it is");
        assert!(
            holder.starts_with(&format!("pid {}:", std::process::id())),
            "{holder}"
        );
        assert!(
            refused.to_string().contains("is in use by another run"),
            "{refused}"
        );
        drop(first);
        let again = lock(&target, "the output").unwrap();
        drop(again);
        // Another target is independent.
        let _a = lock(&dir.path().join("a"), "the output").unwrap();
        let _b = lock(&dir.path().join("b"), "the output").unwrap();
    }
}
