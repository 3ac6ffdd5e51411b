//! Checkpoint storage in a local directory.
//!
//! ```text
//! <dir>/chk-0000000007/            a periodic checkpoint
//!         count-0.state             one file per operator subtask (see `format`)
//!         _metadata                 written last: its presence makes the checkpoint complete
//! <dir>/savepoint-0000000009/      a savepoint (never deleted by retention)
//! <dir>/_lineage                    where the current run of the job started (see below)
//! <dir>/shared/                     table files of LSM state, named by the checkpoints that
//!                                   need them (see `state::lsm`)
//! <dir>/_working/                   the running tasks' LSM databases
//! ```
//!
//! A directory may hold checkpoints of several runs of a job: a run that restored an
//! older savepoint continues a timeline that forked from the one the newer checkpoints
//! belong to. `_lineage` records where the current run started and the first id it
//! took, so "latest" — for a restart after a failure and for `--from-checkpoint
//! latest` — is always the newest checkpoint of the current run, or its starting point,
//! never a checkpoint of an abandoned timeline.
//!
//! `_metadata` is written to a temporary file, fsynced and renamed into place, and the
//! folder is fsynced, so a checkpoint is either complete or it has no metadata. Before a
//! checkpoint is restored, every file is checked against the size and CRC-32 in the
//! metadata; an incomplete or corrupt checkpoint is skipped in favour of the previous one.

use std::collections::BTreeSet;
use std::fs::{self, File};
use std::io::{BufReader, BufWriter, Read};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

use crate::durable::write_atomically;
use crate::network::CheckpointKind;
use serde::{Deserialize, Serialize};

use super::format::{CrcWriter, read_operator_state, write_operator_state};
use super::snapshot::{OperatorSnapshot, StateHandle};
use crate::state::KeyedSnapshot;
use crate::state::lsm::SharedFolder;

const METADATA: &str = "_metadata";
const LINEAGE: &str = "_lineage";
const WORKING: &str = "_working";
const FORMAT: u32 = 1;

/// Checkpoint or savepoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SnapshotKind {
    /// Periodic, retained `retain` at a time.
    Checkpoint,
    /// Taken on request, kept until deleted by hand.
    Savepoint,
}

impl SnapshotKind {
    fn prefix(self) -> &'static str {
        match self {
            SnapshotKind::Checkpoint => "chk-",
            SnapshotKind::Savepoint => "savepoint-",
        }
    }

    /// `checkpoint` or `savepoint`, as the API and the logs name it.
    pub fn name(self) -> &'static str {
        match self {
            SnapshotKind::Checkpoint => "checkpoint",
            SnapshotKind::Savepoint => "savepoint",
        }
    }
}

impl From<CheckpointKind> for SnapshotKind {
    fn from(kind: CheckpointKind) -> Self {
        match kind {
            CheckpointKind::Checkpoint => SnapshotKind::Checkpoint,
            CheckpointKind::Savepoint { .. } => SnapshotKind::Savepoint,
        }
    }
}

/// The positions of one source's subtasks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceMeta {
    /// Source name.
    pub name: String,
    /// Parallelism it ran with.
    pub parallelism: u32,
    /// One position per subtask.
    pub positions: Vec<SourcePosition>,
}

/// Position of one source subtask.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourcePosition {
    /// Subtask index.
    pub subtask: u32,
    /// The source's position bytes.
    pub position: Vec<u8>,
}

/// The written state of one operator.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OperatorMeta {
    /// Operator name.
    pub name: String,
    /// Parallelism it ran with.
    pub parallelism: u32,
    /// One file per subtask.
    pub subtasks: Vec<StateHandle>,
}

/// What writing one operator instance's state wrote: its state file and the tables it
/// copied into the shared folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// Bytes.
    pub bytes: u64,
    /// Files.
    pub files: u32,
}

/// The `_metadata` of a complete checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointMetadata {
    /// Format version of this file.
    pub format: u32,
    /// Checkpoint id.
    pub id: u64,
    /// Checkpoint or savepoint.
    pub kind: SnapshotKind,
    /// Job name.
    pub job: String,
    /// When it was triggered (ms since the epoch).
    pub triggered_at: i64,
    /// When it completed (ms since the epoch).
    pub completed_at: i64,
    /// Number of key groups of the job.
    pub max_parallelism: u32,
    /// Source positions.
    pub sources: Vec<SourceMeta>,
    /// Operator states.
    pub operators: Vec<OperatorMeta>,
    /// Tasks whose input had ended when the checkpoint was taken: restored, they do not
    /// read input or finish their operators again.
    #[serde(default)]
    pub finished: Vec<FinishedTask>,
    /// Records the job's sinks had taken in up to its barriers, over every run and
    /// attempt since the job's first: what they had committed once it completed
    /// (`None`: restored from a checkpoint written before this was counted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub records_committed: Option<u64>,
}

/// A task that had finished, by the ids of its chain's vertices and its subtask.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinishedTask {
    /// Ids of the task's vertices, head first.
    pub vertices: Vec<String>,
    /// Subtask index.
    pub subtask: u32,
}

/// A checkpoint folder whose files were checked.
#[derive(Debug, Clone)]
pub struct LoadedCheckpoint {
    /// The folder.
    pub path: PathBuf,
    /// Its metadata.
    pub metadata: CheckpointMetadata,
}

/// A directory of checkpoints.
#[derive(Debug, Clone)]
pub struct CheckpointStorage {
    dir: PathBuf,
}

impl CheckpointStorage {
    /// Storage in `dir`, created if needed.
    pub fn new(dir: impl Into<PathBuf>) -> Result<Self> {
        let dir = dir.into();
        fs::create_dir_all(&dir)
            .with_context(|| format!("creating checkpoint directory {}", dir.display()))?;
        Ok(CheckpointStorage { dir })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The folder of checkpoint `id`.
    pub fn folder(&self, id: u64, kind: SnapshotKind) -> PathBuf {
        self.dir.join(format!("{}{id:010}", kind.prefix()))
    }

    /// The folder the LSM instances of the job's running tasks keep their databases in
    /// (one file system with the checkpoints, so checkpoints link files, not copy them).
    pub fn working(&self) -> PathBuf {
        self.dir.join(WORKING)
    }

    /// Deletes what earlier runs left in [`CheckpointStorage::working`] (a crash leaves
    /// its databases). Only when a run starts.
    pub fn clear_working(&self) -> Result<()> {
        match fs::remove_dir_all(self.working()) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(e).with_context(|| format!("deleting {}", self.working().display()))
            }
            _ => Ok(()),
        }
    }

    /// The folder LSM instances' table files are shared in by its checkpoints.
    pub fn shared(&self) -> SharedFolder {
        SharedFolder::of(&self.dir)
    }

    /// Writes one operator instance's state into `folder`. An LSM instance's state goes
    /// into a checkpoint as its files (those not yet in the shared folder copied there),
    /// into a savepoint as entries (self-contained). Returns where it is and what was
    /// written (its state file, and the tables it copied).
    pub fn write_operator_state(
        &self,
        folder: &Path,
        kind: SnapshotKind,
        snapshot: &OperatorSnapshot,
        subtask: u32,
    ) -> Result<(StateHandle, Written)> {
        fs::create_dir_all(folder).with_context(|| format!("creating {}", folder.display()))?;
        let uploaded;
        let snapshot = match (&snapshot.keyed, kind) {
            (Some(KeyedSnapshot::Lsm(local)), SnapshotKind::Checkpoint) => {
                let files = local.upload().with_context(|| {
                    format!(
                        "copying the state files of {} (subtask {subtask})",
                        snapshot.operator
                    )
                })?;
                uploaded = OperatorSnapshot {
                    keyed: Some(KeyedSnapshot::Files(files)),
                    ..snapshot.clone()
                };
                &uploaded
            }
            _ => snapshot,
        };
        let (shared, copied, copied_files) = match &snapshot.keyed {
            Some(KeyedSnapshot::Files(files)) => (
                files
                    .shared_files()
                    .map(|(name, size)| (name.to_string(), size))
                    .collect(),
                files.copied,
                files.copied_files,
            ),
            _ => (Vec::new(), 0, 0),
        };
        let file = state_file_name(&snapshot.operator, subtask);
        let path = folder.join(&file);
        crate::failpoint!("checkpoint::write-state");
        let f = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
        let mut w = CrcWriter::new(BufWriter::with_capacity(1 << 20, f));
        write_operator_state(&mut w, snapshot)
            .with_context(|| format!("writing {}", path.display()))?;
        let (buffered, size, crc32) = w.finish();
        let f = buffered.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        let handle = StateHandle {
            operator: snapshot.operator.clone(),
            subtask,
            file,
            size,
            crc32,
            shared,
        };
        let written = Written {
            bytes: size + copied,
            files: 1 + copied_files,
        };
        Ok((handle, written))
    }

    /// Makes the checkpoint in `folder` complete by writing its metadata last, once every
    /// state file it names is there at the size written (never a `_metadata` over files
    /// that went missing) and the folder's entries are durable.
    pub fn commit(&self, folder: &Path, metadata: &CheckpointMetadata) -> Result<()> {
        for handle in metadata.operators.iter().flat_map(|o| &o.subtasks) {
            let path = folder.join(&handle.file);
            let found = fs::metadata(&path)
                .with_context(|| format!("{} is missing", path.display()))?
                .len();
            if found != handle.size {
                bail!(
                    "{} holds {found} bytes, {} were written",
                    path.display(),
                    handle.size
                );
            }
        }
        fs::create_dir_all(folder)?;
        File::open(folder)?.sync_all()?;
        crate::failpoint!("checkpoint::write-metadata");
        write_atomically(
            &folder.join(METADATA),
            &serde_json::to_vec_pretty(metadata)?,
        )?;
        File::open(&self.dir)?.sync_all()?;
        Ok(())
    }

    /// Deletes a checkpoint folder (an aborted checkpoint); failures are logged.
    pub fn discard(&self, folder: &Path) {
        if let Err(e) = fs::remove_dir_all(folder)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!("could not delete {}: {e}", folder.display());
        }
    }

    /// Every checkpoint folder as `(id, kind, path, has metadata)`, by id.
    pub fn folders(&self) -> Result<Vec<(u64, SnapshotKind, PathBuf, bool)>> {
        let mut out = Vec::new();
        for entry in
            fs::read_dir(&self.dir).with_context(|| format!("listing {}", self.dir.display()))?
        {
            let path = entry?.path();
            let name = path
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            for kind in [SnapshotKind::Checkpoint, SnapshotKind::Savepoint] {
                if let Some(id) = name
                    .strip_prefix(kind.prefix())
                    .and_then(|s| s.parse().ok())
                {
                    let complete = path.join(METADATA).exists();
                    out.push((id, kind, path.clone(), complete));
                }
            }
        }
        out.sort_by_key(|f| f.0);
        Ok(out)
    }

    /// The id to use for the next checkpoint: above every existing folder.
    pub fn next_id(&self) -> Result<u64> {
        Ok(self.folders()?.last().map_or(1, |f| f.0 + 1))
    }

    /// Keeps the newest `keep` complete checkpoints and `protect` (the current run's
    /// starting point), deletes the other complete checkpoints and every incomplete
    /// folder older than the newest complete one (aborted, or orphaned by a crash)
    /// unless its id is `in_flight`: a savepoint is not subsumed by a newer checkpoint
    /// and may still be being written when one completes. Complete savepoints are never
    /// deleted.
    pub fn retain(&self, keep: usize, protect: Option<&Path>, in_flight: &[u64]) -> Result<()> {
        let folders = self.folders()?;
        // The same folder may be named in other words (relative, through a link).
        let protect = protect.and_then(|p| fs::canonicalize(p).ok());
        let protected = |path: &Path| {
            protect
                .as_deref()
                .is_some_and(|p| fs::canonicalize(path).is_ok_and(|c| c == p))
        };
        let newest = folders
            .iter()
            .filter(|f| f.3)
            .map(|f| f.0)
            .max()
            .unwrap_or(0);
        let kept: Vec<u64> = folders
            .iter()
            .filter(|f| f.1 == SnapshotKind::Checkpoint && f.3)
            .map(|f| f.0)
            .rev()
            .take(keep.max(1))
            .collect();
        let mut released = BTreeSet::new();
        let mut still_named = BTreeSet::new();
        for (id, kind, path, is_complete) in folders {
            let delete = match (kind, is_complete) {
                (SnapshotKind::Savepoint, true) => false,
                (SnapshotKind::Checkpoint, true) => !kept.contains(&id),
                (_, false) => id < newest && !in_flight.contains(&id),
            };
            let names = if is_complete {
                shared_files_of(&path)
            } else {
                BTreeSet::new()
            };
            if delete && !protected(&path) {
                self.discard(&path);
                released.extend(names);
            } else {
                still_named.extend(names);
            }
        }
        // Shared files the deleted checkpoints named and no other complete one does:
        // deleted after the checkpoints (a crash between leaves files no checkpoint names,
        // which the next run collects), never before.
        crate::failpoint!("checkpoint::release-shared-files");
        for name in released.difference(&still_named) {
            self.delete_shared(name);
        }
        Ok(())
    }

    /// Deletes the shared files no complete checkpoint names (left by checkpoints that
    /// were aborted, or by a crash while old ones were deleted). Only while no
    /// checkpoint of the job is being written: when a run starts.
    pub fn collect_shared_files(&self) -> Result<()> {
        let shared = self.shared();
        let entries = match fs::read_dir(shared.path()) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => {
                return Err(e).with_context(|| format!("listing {}", shared.path().display()));
            }
        };
        let named: BTreeSet<String> = self
            .folders()?
            .into_iter()
            .filter(|f| f.3)
            .flat_map(|f| shared_files_of(&f.2))
            .collect();
        for entry in entries {
            let name = entry?.file_name().to_string_lossy().into_owned();
            if !named.contains(&name) {
                self.delete_shared(&name);
            }
        }
        Ok(())
    }

    fn delete_shared(&self, name: &str) {
        let path = self.shared().path().join(name);
        if let Err(e) = fs::remove_file(&path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!("could not delete {}: {e}", path.display());
        }
    }

    /// Where the current run started; `None` in a directory written before lineages
    /// were recorded (all of it counts as one run).
    pub fn lineage(&self) -> Result<Option<Lineage>> {
        let path = self.dir.join(LINEAGE);
        match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .with_context(|| format!("{} is corrupt", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    /// Records that a new run starts, from `started_from` or from scratch: checkpoints
    /// taken before it no longer count as "latest".
    pub fn begin_run(&self, started_from: Option<&Path>) -> Result<Lineage> {
        let lineage = Lineage {
            first_id: self.next_id()?,
            started_from: started_from.map(Path::to_path_buf),
        };
        write_atomically(
            &self.dir.join(LINEAGE),
            &serde_json::to_vec_pretty(&lineage)?,
        )?;
        Ok(lineage)
    }

    /// Whether the directory holds a complete checkpoint or savepoint, which a new run
    /// would take over.
    pub fn has_history(&self) -> Result<bool> {
        Ok(self.folders()?.iter().any(|f| f.3))
    }

    /// The newest complete and intact checkpoint or savepoint of the current run, or
    /// else the point the run started from (`None`: it started from scratch). Newer
    /// folders that are incomplete or corrupt are skipped with a warning.
    pub fn find_latest(&self) -> Result<Option<LoadedCheckpoint>> {
        let lineage = self.lineage()?.unwrap_or_default();
        self.latest_in(&lineage)
    }

    /// [`CheckpointStorage::find_latest`] for a given run.
    pub fn latest_in(&self, lineage: &Lineage) -> Result<Option<LoadedCheckpoint>> {
        for (id, _kind, path, complete) in self.folders()?.into_iter().rev() {
            if id < lineage.first_id {
                break;
            }
            if !complete {
                tracing::warn!(
                    "skipping checkpoint {id} in {}: it is incomplete (no {METADATA})",
                    path.display()
                );
                continue;
            }
            match load(&path) {
                Ok(c) => return Ok(Some(c)),
                Err(e) => tracing::warn!("skipping checkpoint {id}: {e:#}"),
            }
        }
        lineage
            .started_from
            .as_deref()
            .map(|p| {
                load(p).with_context(|| {
                    format!(
                        "the current run of the job started from {}, and it has no intact \
                         checkpoint of its own",
                        p.display()
                    )
                })
            })
            .transpose()
    }
}

/// Where a run of a job started (the `_lineage` file of its checkpoint directory).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lineage {
    /// The first checkpoint id of the run; lower ids belong to earlier runs.
    pub first_id: u64,
    /// The checkpoint or savepoint the run restored, if it restored one.
    pub started_from: Option<PathBuf>,
}

/// The shared folder of the checkpoint storage the checkpoint in `folder` is in.
pub fn shared_folder_of(folder: &Path) -> SharedFolder {
    SharedFolder::of(folder.parent().unwrap_or(Path::new(".")))
}

/// The shared files the complete checkpoint in `folder` names (none when its metadata
/// cannot be read: it is then no checkpoint to keep files for).
pub fn shared_files_of(folder: &Path) -> BTreeSet<String> {
    let Ok(bytes) = fs::read(folder.join(METADATA)) else {
        return BTreeSet::new();
    };
    let Ok(metadata) = serde_json::from_slice::<CheckpointMetadata>(&bytes) else {
        return BTreeSet::new();
    };
    metadata
        .operators
        .iter()
        .flat_map(|o| &o.subtasks)
        .flat_map(|h| h.shared.iter().map(|(name, _)| name.clone()))
        .collect()
}

/// Loads and checks the checkpoint or savepoint in `path`.
pub fn load(path: &Path) -> Result<LoadedCheckpoint> {
    let meta_path = path.join(METADATA);
    let bytes = fs::read(&meta_path).with_context(|| {
        format!(
            "{} is not a complete checkpoint (cannot read {METADATA})",
            path.display()
        )
    })?;
    let metadata: CheckpointMetadata = serde_json::from_slice(&bytes)
        .with_context(|| format!("{} is corrupt", meta_path.display()))?;
    if metadata.format != FORMAT {
        bail!(
            "{}: metadata format {} is not supported",
            path.display(),
            metadata.format
        );
    }
    for op in &metadata.operators {
        for h in &op.subtasks {
            let file = path.join(&h.file);
            let mut f =
                File::open(&file).with_context(|| format!("{} is missing", file.display()))?;
            let mut hasher = crc32fast::Hasher::new();
            let mut buf = vec![0u8; 1 << 20];
            let mut size = 0u64;
            loop {
                let n = f.read(&mut buf)?;
                if n == 0 {
                    break;
                }
                hasher.update(&buf[..n]);
                size += n as u64;
            }
            if size != h.size || hasher.finalize() != h.crc32 {
                bail!(
                    "{} is corrupt: {size} bytes with another checksum than the {} recorded",
                    file.display(),
                    h.size
                );
            }
            // Shared table files are checked by size (reading them all would read the
            // whole state); RocksDB checks their blocks' checksums as it reads them.
            for (name, size) in &h.shared {
                let shared = shared_folder_of(path).path().join(name);
                match fs::metadata(&shared) {
                    Ok(m) if m.len() == *size => {}
                    Ok(m) => bail!(
                        "{} has {} bytes, not the {size} {} recorded",
                        shared.display(),
                        m.len(),
                        file.display()
                    ),
                    Err(e) => bail!("{} is missing: {e}", shared.display()),
                }
            }
        }
    }
    Ok(LoadedCheckpoint {
        path: path.to_path_buf(),
        metadata,
    })
}

impl LoadedCheckpoint {
    /// True when the task of `vertices` (ids, head first), subtask `subtask`, had
    /// finished when the checkpoint was taken.
    pub fn is_finished(&self, vertices: &[String], subtask: u32) -> bool {
        self.metadata
            .finished
            .iter()
            .any(|f| f.subtask == subtask && f.vertices == vertices)
    }

    /// Every subtask's position of source `name` with the parallelism it ran with (for
    /// sources whose positions can be merged and spread anew, as Kafka partitions'
    /// offsets); `None` when the checkpoint has none.
    pub fn source_positions(&self, name: &str) -> Option<(u32, Vec<Vec<u8>>)> {
        let source = self.metadata.sources.iter().find(|s| s.name == name)?;
        Some((
            source.parallelism,
            source
                .positions
                .iter()
                .map(|p| p.position.clone())
                .collect(),
        ))
    }

    /// The position of subtask `subtask` of `parallelism` of source `name`; `None` when
    /// the checkpoint has none (the source starts from the beginning).
    pub fn source_position(
        &self,
        name: &str,
        subtask: u32,
        parallelism: u32,
    ) -> Result<Option<Vec<u8>>> {
        let Some(source) = self.metadata.sources.iter().find(|s| s.name == name) else {
            return Ok(None);
        };
        if source.parallelism != parallelism {
            bail!(
                "source '{name}' ran with parallelism {} in checkpoint {} and cannot resume with {parallelism}",
                source.parallelism,
                self.metadata.id
            );
        }
        Ok(source
            .positions
            .iter()
            .find(|s| s.subtask == subtask)
            .map(|s| s.position.clone()))
    }

    /// Reads the state file of `handle`.
    pub fn read_state(&self, handle: &StateHandle) -> Result<OperatorSnapshot> {
        let file = self.path.join(&handle.file);
        let mut snapshot = read_operator_state(BufReader::new(
            File::open(&file).with_context(|| format!("opening {}", file.display()))?,
        ))
        .with_context(|| format!("reading {}", file.display()))?;
        if let Some(KeyedSnapshot::Files(files)) = &mut snapshot.keyed {
            files.shared = Some(shared_folder_of(&self.path));
        }
        Ok(snapshot)
    }

    /// The metadata of vertex `id`'s state, if the checkpoint has any.
    pub fn operator(&self, id: &str) -> Option<&OperatorMeta> {
        self.metadata.operators.iter().find(|o| o.name == id)
    }
}

/// The state file of subtask `subtask` of the vertex with id `id`: ASCII letters,
/// digits and `-` stand for themselves, every other byte as `_` and two hex digits, so
/// distinct ids never share a file (`a.b` is `a_2eb`, `a_b` is `a_5fb`).
pub fn state_file_name(id: &str, subtask: u32) -> String {
    let mut name = String::with_capacity(id.len() + 16);
    for b in id.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' {
            name.push(b as char);
        } else {
            name.push_str(&format!("_{b:02x}"));
        }
    }
    name.push_str(&format!("-{subtask}.state"));
    name
}

#[cfg(test)]
mod tests;
