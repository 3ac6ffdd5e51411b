//! An LSM instance's checkpoints as files: the local checkpoint the synchronous part
//! takes, its upload into the checkpoint storage's shared folder, and the manifest a
//! checkpoint keeps of it.
//!
//! ```text
//! <checkpoint dir>/shared/<unique>-000012.sst    a table file, written once, named uniquely
//! <checkpoint dir>/chk-…/<operator>-<subtask>.state   its manifest: every file the database
//!                                               needs, small ones inline, tables by name
//! ```
//!
//! Table files never change once written, so a table a retained checkpoint already copied
//! is referred to again, not copied: a checkpoint writes the tables made since the last one
//! (by flushes and compactions) and the small files that describe the database. The
//! storage deletes a shared file when no retained checkpoint refers to it any more.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use parking_lot::Mutex;

use super::link::PendingLink;
use crate::checkpoint::CrcWriter;
use crate::state::StateDescriptor;

/// The folder checkpoints keep table files in: `<checkpoint dir>/shared`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedFolder(PathBuf);

impl SharedFolder {
    /// The shared folder of the checkpoint storage in `checkpoint_dir`.
    pub fn of(checkpoint_dir: &Path) -> Self {
        SharedFolder(checkpoint_dir.join(SHARED))
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// True when both name the same folder (in other words, perhaps).
    pub fn same_as(&self, other: &SharedFolder) -> bool {
        self.0 == other.0
            || matches!((fs::canonicalize(&self.0), fs::canonicalize(&other.0)),
                        (Ok(a), Ok(b)) if a == b)
    }
}

/// The shared folder's name inside a checkpoint directory.
pub const SHARED: &str = "shared";

/// One file of a database in a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DbFile {
    /// Its name in the database's folder.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// CRC-32 of its bytes.
    pub crc32: u32,
    /// Where its bytes are.
    pub place: Place,
}

/// Where a file's bytes are kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// In the manifest (the database's small descriptive files).
    Inline(Vec<u8>),
    /// In the shared folder, under this name.
    Shared(String),
}

/// A local checkpoint of an instance's database: linked by a thread of its own, deleted
/// when the last copy of the snapshot is dropped.
#[derive(Debug)]
struct LocalCheckpoint {
    path: PathBuf,
    link: PendingLink,
}

impl LocalCheckpoint {
    /// The folder, once linked.
    fn linked(&self) -> Result<&Path> {
        self.link.wait()?;
        Ok(&self.path)
    }
}

impl Drop for LocalCheckpoint {
    fn drop(&mut self) {
        // Linked (or failed) first, so the folder is not made after it is deleted.
        let _ = self.link.wait();
        if let Err(e) = fs::remove_dir_all(&self.path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!("could not delete {}: {e}", self.path.display());
        }
    }
}

/// What the synchronous part of a checkpoint took of an LSM instance.
#[derive(Debug, Clone)]
pub struct LsmSnapshot {
    local: Arc<LocalCheckpoint>,
    /// Declared states, by id.
    pub descriptors: Vec<StateDescriptor>,
    /// The key groups it holds.
    pub key_groups: Range<u32>,
    /// Processing time when it was taken.
    pub taken_at: i64,
    /// Table files already in the shared folder (the instance's record, updated here).
    uploaded: Arc<Mutex<BTreeMap<String, DbFile>>>,
    shared: Option<SharedFolder>,
}

impl LsmSnapshot {
    pub(super) fn new(
        local: PathBuf,
        link: PendingLink,
        descriptors: Vec<StateDescriptor>,
        key_groups: Range<u32>,
        taken_at: i64,
        uploaded: Arc<Mutex<BTreeMap<String, DbFile>>>,
        shared: Option<SharedFolder>,
    ) -> Self {
        LsmSnapshot {
            local: Arc::new(LocalCheckpoint { path: local, link }),
            descriptors,
            key_groups,
            taken_at,
            uploaded,
            shared,
        }
    }

    /// The local checkpoint's folder (a database RocksDB opens read-only), once its
    /// files are linked: the asynchronous part's first step.
    pub fn local(&self) -> Result<&Path> {
        self.local.linked()
    }

    /// Copies the table files the shared folder lacks into it and returns the manifest:
    /// tables by their shared names, the small files inline. The asynchronous part.
    pub fn upload(&self) -> Result<LsmFiles> {
        let shared = self
            .shared
            .as_ref()
            .context("the job has no checkpoint directory to keep state files in")?;
        fs::create_dir_all(shared.path())
            .with_context(|| format!("creating {}", shared.path().display()))?;
        let local = self.local()?;
        let mut names: Vec<String> = fs::read_dir(local)
            .with_context(|| format!("listing {}", local.display()))?
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<std::io::Result<_>>()?;
        names.sort();
        let mut files = Vec::with_capacity(names.len());
        let (mut copied, mut copied_files) = (0, 0);
        for name in names {
            let path = local.join(&name);
            if !name.ends_with(".sst") {
                let bytes =
                    fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
                files.push(DbFile {
                    size: bytes.len() as u64,
                    crc32: crc32fast::hash(&bytes),
                    name,
                    place: Place::Inline(bytes),
                });
                continue;
            }
            let size = fs::metadata(&path)
                .with_context(|| format!("reading {}", path.display()))?
                .len();
            let known = self.uploaded.lock().get(&name).cloned();
            if let Some(known) = known.filter(|k| k.size == size) {
                files.push(known);
                continue;
            }
            crate::failpoint!("checkpoint::upload-state-file");
            let unique = format!("{}-{name}", uuid::Uuid::new_v4().simple());
            let crc32 = copy_durably(&path, &shared.path().join(&unique))?;
            copied += size;
            copied_files += 1;
            let file = DbFile {
                name: name.clone(),
                size,
                crc32,
                place: Place::Shared(unique),
            };
            self.uploaded.lock().insert(name, file.clone());
            files.push(file);
        }
        File::open(shared.path())?.sync_all()?;
        Ok(LsmFiles {
            descriptors: self.descriptors.clone(),
            key_groups: self.key_groups.clone(),
            taken_at: self.taken_at,
            files,
            shared: Some(shared.clone()),
            copied,
            copied_files,
        })
    }
}

/// Copies `from` to `to` (a new file) and syncs it; returns its CRC-32.
fn copy_durably(from: &Path, to: &Path) -> Result<u32> {
    let mut src = File::open(from).with_context(|| format!("opening {}", from.display()))?;
    let dst = File::options()
        .write(true)
        .create_new(true)
        .open(to)
        .with_context(|| format!("creating {}", to.display()))?;
    let mut w = CrcWriter::new(dst);
    std::io::copy(&mut src, &mut w)
        .with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    let (dst, _, crc32) = w.finish();
    dst.sync_all()
        .with_context(|| format!("writing {}", to.display()))?;
    Ok(crc32)
}

/// An LSM instance's state as a checkpoint keeps it: the manifest of its files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LsmFiles {
    /// Declared states, by id.
    pub descriptors: Vec<StateDescriptor>,
    /// The key groups it holds.
    pub key_groups: Range<u32>,
    /// Processing time when it was taken.
    pub taken_at: i64,
    /// Every file of the database.
    pub files: Vec<DbFile>,
    /// The shared folder its tables are in (known once read from a checkpoint).
    pub shared: Option<SharedFolder>,
    /// Bytes of tables the upload that made it copied (0 when read back).
    pub copied: u64,
    /// Tables the upload that made it copied (0 when read back).
    pub copied_files: u32,
}

impl LsmFiles {
    /// Names and sizes of the shared files it refers to.
    pub fn shared_files(&self) -> impl Iterator<Item = (&str, u64)> {
        self.files.iter().filter_map(|f| match &f.place {
            Place::Shared(name) => Some((name.as_str(), f.size)),
            Place::Inline(_) => None,
        })
    }

    /// Puts the database's files into `dir` (a new folder): tables hard-linked from the
    /// shared folder (copied when it is on another file system), the others written.
    /// Fails, naming the file, when a table is missing or has another size.
    pub fn materialize(&self, dir: &Path) -> Result<()> {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        for f in &self.files {
            let to = dir.join(&f.name);
            match &f.place {
                Place::Inline(bytes) => {
                    fs::write(&to, bytes).with_context(|| format!("writing {}", to.display()))?
                }
                Place::Shared(name) => {
                    let shared = self
                        .shared
                        .as_ref()
                        .context("the state's manifest names no shared folder")?;
                    let from = shared.path().join(name);
                    let size = fs::metadata(&from)
                        .with_context(|| format!("state file {} is missing", from.display()))?
                        .len();
                    if size != f.size {
                        bail!(
                            "state file {} has {size} bytes, not the {} its checkpoint recorded",
                            from.display(),
                            f.size
                        );
                    }
                    if fs::hard_link(&from, &to).is_err() {
                        fs::copy(&from, &to).with_context(|| {
                            format!("copying {} to {}", from.display(), to.display())
                        })?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Reads every entry of key groups `range` (`f(key group, composite key, written at,
    /// value)`), from a copy of the database made in `scratch` (deleted after).
    pub fn read_entries(
        &self,
        scratch: &Path,
        range: Range<u32>,
        f: impl FnMut(u32, &[u8], i64, &[u8]) -> Result<()>,
    ) -> Result<()> {
        struct Scratch<'a>(&'a Path);
        impl Drop for Scratch<'_> {
            fn drop(&mut self) {
                let _ = fs::remove_dir_all(self.0);
            }
        }
        let _cleanup = Scratch(scratch);
        self.materialize(scratch)?;
        super::read_entries(scratch, range, f)
    }
}
