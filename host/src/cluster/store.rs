//! The checkpoint store every host of a cluster job reads: checkpoints of the units,
//! copied there when they complete, behind the `object_store` crate (a directory on one
//! machine or a shared file system; S3, GCS or Azure in builds with their feature).
//!
//! Layout under the store's root: `JOB/unit-N/ATTEMPT/ID/FILE…` for the checkpoint `ID`
//! of attempt `ATTEMPT` (each start of a unit on some host), and `JOB/finished/unit-N`
//! once the unit's input ended and all its output is committed (one listing tells which
//! units finished).
//!
//! What the store holds is durable when a write returns, since a unit's transaction
//! names a checkpoint as soon as it is copied: an object store's PUT is durable once it
//! succeeded, and in a directory (where `object_store` renames files into place without
//! fsync) each file and the folders above it are fsynced. A checkpoint's files are
//! durable before its metadata is written, so one whose metadata survived a crash is
//! whole.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use std::collections::BTreeSet;

use anyhow::{Context, Result, anyhow};
use object_store::local::LocalFileSystem;
use object_store::path::Path as StorePath;
use object_store::{ObjectStore, PutPayload};

use crate::durable;

/// The file a checkpoint folder is complete with (written last).
pub const METADATA: &str = "_metadata";

/// Checkpoints kept per attempt of a unit (older ones are deleted as new ones come).
const KEEP: u64 = 5;

/// The folder under an attempt's key that keeps the table files of its checkpoints' LSM
/// state (`JOB/unit-N/ATTEMPT/shared/NAME`): each copied once, named by every checkpoint
/// of the attempt that uses it, deleted once none kept does.
const SHARED: &str = "shared";

/// The shared table files one attempt of a unit copied to the store, and which of its
/// kept checkpoints names which.
#[derive(Debug, Default)]
pub struct AttemptTables {
    stored: BTreeSet<String>,
    named_by: std::collections::BTreeMap<u64, BTreeSet<String>>,
}

/// A checkpoint store.
pub struct CheckpointStore {
    store: Arc<dyn ObjectStore>,
    root: StorePath,
    /// A store in a directory: its files' paths, and the directory (canonical).
    local: Option<(Arc<LocalFileSystem>, PathBuf)>,
    /// Where it is, as given (for messages).
    location: String,
    runtime: tokio::runtime::Runtime,
}

impl CheckpointStore {
    /// Opens `location`: a URL (`file://`, `s3://`, `gs://`, `az://`) or a directory,
    /// relative to `base` (created if missing).
    pub fn open(location: &str, base: &Path) -> Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("checkpoint store")
            .enable_all()
            .build()
            .context("starting the checkpoint store's runtime")?;
        let url = if location.contains("://") {
            Some(
                url::Url::parse(location)
                    .with_context(|| format!("checkpoint store {location:?} is not a URL"))?,
            )
        } else {
            None
        };
        let dir = match &url {
            None => Some(base.join(location)),
            Some(url) if url.scheme() == "file" => Some(url.to_file_path().map_err(|()| {
                anyhow!("checkpoint store {location:?}: not a path on this machine")
            })?),
            Some(_) => None,
        };
        let (store, root, local): (Arc<dyn ObjectStore>, StorePath, _) = match (dir, url) {
            (Some(dir), _) => {
                durable::create_dir_all(&dir)
                    .with_context(|| format!("creating checkpoint store {}", dir.display()))?;
                let canonical = dir
                    .canonicalize()
                    .with_context(|| format!("checkpoint store {}", dir.display()))?;
                let fs = Arc::new(
                    LocalFileSystem::new_with_prefix(&canonical)
                        .with_context(|| format!("checkpoint store {}", dir.display()))?
                        .with_automatic_cleanup(true),
                );
                (fs.clone(), StorePath::default(), Some((fs, canonical)))
            }
            (None, Some(url)) => {
                let (store, root) = object_store::parse_url(&url).map_err(|e| {
                    anyhow!(
                        "checkpoint store {location:?}: {e} (s3://, gs:// and az:// need a \
                         build with the `s3`, `gcs` or `azure` feature)"
                    )
                })?;
                (Arc::from(store), root, None)
            }
            (None, None) => unreachable!("a location is a directory or a URL"),
        };
        Ok(CheckpointStore {
            store,
            root,
            local,
            location: location.to_string(),
            runtime,
        })
    }

    fn path(&self, key: &str) -> StorePath {
        key.split('/')
            .filter(|p| !p.is_empty())
            .fold(self.root.clone(), |p, part| p.child(part))
    }

    fn err(&self, what: &str) -> String {
        format!("checkpoint store {:?}: {what}", self.location)
    }

    /// Where `key` is, for people: a path on this machine for a store in a directory,
    /// else the store's URL with the key.
    pub fn describe(&self, key: &str) -> String {
        let path = self.path(key);
        match &self.local {
            Some((fs, _)) => fs
                .path_to_filesystem(&path)
                .map_or_else(|_| path.to_string(), |p| p.display().to_string()),
            None => format!("{}/{key}", self.location.trim_end_matches('/')),
        }
    }

    /// Every object under `prefix`.
    async fn list(&self, prefix: &StorePath) -> Result<Vec<object_store::ObjectMeta>> {
        use futures::TryStreamExt;
        self.store
            .list(Some(prefix))
            .try_collect()
            .await
            .with_context(|| self.err(&format!("listing {prefix}")))
    }

    /// Copies the files of `folder` (recursively) under `key`, a checkpoint's metadata
    /// last, each durable when it returns: a copy without metadata is incomplete, and one
    /// with it whole.
    pub fn upload(&self, key: &str, folder: &Path) -> Result<()> {
        let mut files = Vec::new();
        collect_files(folder, folder, &mut files)?;
        let (metadata, data): (Vec<_>, Vec<_>) = files
            .into_iter()
            .partition(|(relative, _)| relative == METADATA);
        self.put_files(key, &data)?;
        self.put_files(key, &metadata)
    }

    /// Copies `files` (`(relative, path)`) under `key`, and makes them durable.
    fn put_files(&self, key: &str, files: &[(String, PathBuf)]) -> Result<()> {
        let written = self.runtime.block_on(async {
            let mut written = Vec::new();
            for (relative, full) in files {
                let bytes =
                    std::fs::read(full).with_context(|| format!("reading {}", full.display()))?;
                let to = self.path(&format!("{key}/{relative}"));
                self.store
                    .put(&to, PutPayload::from(bytes))
                    .await
                    .with_context(|| self.err(&format!("writing {to}")))?;
                written.push(to);
            }
            anyhow::Ok(written)
        })?;
        self.make_durable(&written)
    }

    /// Makes what was just written at `paths` durable: in a directory, fsyncs each file
    /// and the folders above it (an object store's PUT is durable once it succeeded).
    fn make_durable(&self, paths: &[StorePath]) -> Result<()> {
        let Some((fs, root)) = &self.local else {
            return Ok(());
        };
        let files = paths
            .iter()
            .map(|p| fs.path_to_filesystem(p))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| anyhow!(e))
            .with_context(|| self.err("making what was written durable"))?;
        durable::sync_written(root, &files)
            .with_context(|| self.err("making what was written durable"))
    }

    /// Copies everything under `key` into `into` (created); false when nothing is there.
    pub fn download(&self, key: &str, into: &Path) -> Result<bool> {
        let prefix = self.path(key);
        self.runtime.block_on(async {
            let objects = self.list(&prefix).await?;
            for object in &objects {
                let relative: Vec<_> = object
                    .location
                    .prefix_match(&prefix)
                    .map(|parts| parts.map(|p| p.as_ref().to_string()).collect())
                    .unwrap_or_default();
                if relative.is_empty() || relative.iter().any(|p| p == "..") {
                    continue;
                }
                let to = relative
                    .iter()
                    .fold(into.to_path_buf(), |p, part| p.join(part));
                let bytes = self
                    .store
                    .get(&object.location)
                    .await
                    .with_context(|| self.err(&format!("reading {}", object.location)))?
                    .bytes()
                    .await
                    .with_context(|| self.err(&format!("reading {}", object.location)))?;
                if let Some(parent) = to.parent() {
                    std::fs::create_dir_all(parent)
                        .with_context(|| format!("creating {}", parent.display()))?;
                }
                std::fs::write(&to, &bytes).with_context(|| format!("writing {}", to.display()))?;
                crate::failpoint!("cluster::during-download");
            }
            Ok(!objects.is_empty())
        })
    }

    /// Copies the checkpoint under `key` into `into`; false when it is not there or
    /// incomplete (no metadata).
    pub fn download_checkpoint(&self, key: &str, into: &Path) -> Result<bool> {
        Ok(self.download(key, into)? && into.join(METADATA).is_file())
    }

    /// The ids of the checkpoints under `attempt_key` that have their metadata, in order.
    pub fn complete_checkpoints(&self, attempt_key: &str) -> Result<Vec<u64>> {
        let prefix = self.path(attempt_key);
        self.runtime.block_on(async {
            let objects = self.list(&prefix).await?;
            let mut ids: Vec<u64> = objects
                .iter()
                .filter_map(|o| {
                    let mut parts = o.location.prefix_match(&prefix)?;
                    let id = parts.next()?.as_ref().parse().ok()?;
                    match (parts.next(), parts.next()) {
                        (Some(name), None) if name.as_ref() == METADATA => Some(id),
                        _ => None,
                    }
                })
                .collect();
            ids.sort_unstable();
            Ok(ids)
        })
    }

    /// The names directly under `key` that hold objects.
    pub fn folders(&self, key: &str) -> Result<Vec<String>> {
        let prefix = self.path(key);
        self.runtime.block_on(async {
            // From the objects, not the store's folders: a directory store keeps empty
            // folders, which hold nothing.
            let objects = self.list(&prefix).await?;
            let mut folders = BTreeSet::new();
            for object in objects {
                let mut parts = object.location.prefix_match(&prefix).into_iter().flatten();
                if let (Some(first), Some(_)) = (parts.next(), parts.next()) {
                    folders.insert(first.as_ref().to_string());
                }
            }
            Ok(folders.into_iter().collect())
        })
    }

    /// The names of the objects directly under `key`.
    pub fn names(&self, key: &str) -> Result<Vec<String>> {
        let prefix = self.path(key);
        self.runtime.block_on(async {
            let objects = self.list(&prefix).await?;
            Ok(objects
                .iter()
                .filter_map(|o| {
                    let mut parts = o.location.prefix_match(&prefix)?;
                    match (parts.next(), parts.next()) {
                        (Some(name), None) => Some(name.as_ref().to_string()),
                        _ => None,
                    }
                })
                .collect())
        })
    }

    /// The units of the job under `job` that finished, in one listing.
    pub fn finished_units(&self, job: &str) -> Result<BTreeSet<u32>> {
        Ok(self
            .names(&format!("{job}/finished"))?
            .iter()
            .filter_map(|n| n.strip_prefix("unit-")?.parse().ok())
            .collect())
    }

    /// Deletes everything under `key`.
    pub fn delete(&self, key: &str) -> Result<()> {
        let prefix = self.path(key);
        self.runtime.block_on(async {
            let objects = self.list(&prefix).await?;
            for object in objects {
                self.store
                    .delete(&object.location)
                    .await
                    .with_context(|| self.err(&format!("deleting {}", object.location)))?;
            }
            Ok(())
        })
    }

    /// Deletes everything under `key`, and in a directory store the folder itself with
    /// what a write cut short left in it (a crash between writing a file's staging copy
    /// and renaming it into place leaves the copy, which no listing shows).
    pub fn delete_folder(&self, key: &str) -> Result<()> {
        self.delete(key)?;
        let Some((fs, _)) = &self.local else {
            return Ok(());
        };
        let folder = fs
            .path_to_filesystem(&self.path(key))
            .map_err(|e| anyhow!(e))
            .with_context(|| self.err(&format!("finding {key}")))?;
        match std::fs::remove_dir_all(&folder) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(e).with_context(|| format!("deleting {}", folder.display()))
            }
            _ => Ok(()),
        }
    }

    /// Deletes the object at `key`, if there is one.
    pub fn delete_object(&self, key: &str) -> Result<()> {
        let path = self.path(key);
        self.runtime.block_on(async {
            match self.store.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(anyhow!(e)).with_context(|| self.err(&format!("deleting {path}"))),
            }
        })
    }

    /// Writes a small object, durably.
    pub fn put(&self, key: &str, bytes: Vec<u8>) -> Result<()> {
        let to = self.path(key);
        self.runtime.block_on(async {
            self.store
                .put(&to, PutPayload::from(bytes))
                .await
                .with_context(|| self.err(&format!("writing {to}")))
        })?;
        self.make_durable(&[to])
    }

    /// Reads a small object, `None` if it does not exist.
    pub fn get(&self, key: &str) -> Result<Option<Vec<u8>>> {
        let from = self.path(key);
        self.runtime.block_on(async {
            match self.store.get(&from).await {
                Ok(r) => Ok(Some(
                    r.bytes()
                        .await
                        .with_context(|| self.err(&format!("reading {from}")))?
                        .to_vec(),
                )),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(anyhow!(e)).with_context(|| self.err(&format!("reading {from}"))),
            }
        })
    }

    /// Copies checkpoint `id` of a unit's attempt (its local `folder`) to the store — the
    /// shared table files it names that the store lacks first, its folder after, its
    /// metadata last — then deletes that attempt's checkpoints older than the newest few,
    /// and after them the shared files no checkpoint kept names. `tables` is what this
    /// attempt's earlier calls copied (an attempt's folder has one writer, this one).
    pub fn save_checkpoint(
        &self,
        attempt_key: &str,
        id: u64,
        folder: &Path,
        tables: &mut AttemptTables,
    ) -> Result<()> {
        let shared_key = format!("{attempt_key}/{SHARED}");
        let named = crate::checkpoint::shared_files_of(folder);
        let local = crate::checkpoint::shared_folder_of(folder);
        let missing: Vec<(String, PathBuf)> = named
            .difference(&tables.stored)
            .map(|name| (name.clone(), local.path().join(name)))
            .collect();
        self.put_files(&shared_key, &missing)?;
        tables.stored.extend(named.iter().cloned());
        self.upload(&format!("{attempt_key}/{id}"), folder)?;
        tables.named_by.insert(id, named);
        crate::failpoint!("cluster::after-upload");
        for old in self.folders(attempt_key)? {
            if old.parse::<u64>().is_ok_and(|o| o + KEEP <= id) {
                self.delete(&format!("{attempt_key}/{old}"))?;
            }
        }
        tables.named_by.retain(|kept, _| kept + KEEP > id);
        let still_named: BTreeSet<String> = tables.named_by.values().flatten().cloned().collect();
        for name in tables.stored.difference(&still_named) {
            self.delete_object(&format!("{shared_key}/{name}"))?;
        }
        tables.stored.retain(|name| still_named.contains(name));
        Ok(())
    }

    /// Copies the shared table files the checkpoint copied into `folder` from
    /// `attempt_key` names into the shared folder beside it, where a restore looks. The
    /// inner error: one is not in the store (the checkpoint is lost).
    pub fn download_shared_files(
        &self,
        attempt_key: &str,
        folder: &Path,
    ) -> Result<std::result::Result<(), String>> {
        let named = crate::checkpoint::shared_files_of(folder);
        if named.is_empty() {
            return Ok(Ok(()));
        }
        let local = crate::checkpoint::shared_folder_of(folder);
        std::fs::create_dir_all(local.path())
            .with_context(|| format!("creating {}", local.path().display()))?;
        for name in named {
            let key = format!("{attempt_key}/{SHARED}/{name}");
            let Some(bytes) = self.get(&key)? else {
                return Ok(Err(format!("{} is missing", self.describe(&key))));
            };
            let to = local.path().join(&name);
            std::fs::write(&to, bytes).with_context(|| format!("writing {}", to.display()))?;
        }
        Ok(Ok(()))
    }
}

/// The key that says unit `unit` of the job whose objects are under `job` finished.
pub fn finished_key(job: &str, unit: u32) -> String {
    format!("{job}/finished/unit-{unit}")
}

/// The key of unit `unit`'s attempts, of the job whose objects are under `job`.
pub fn unit_key(job: &str, unit: u32) -> String {
    format!("{job}/unit-{unit}")
}

/// Every file under `dir`, with its path relative to `root` (`/`-separated).
fn collect_files(root: &Path, dir: &Path, out: &mut Vec<(String, PathBuf)>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let entry = entry?;
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            collect_files(root, &path, out)?;
        } else {
            let relative = path
                .strip_prefix(root)
                .map_err(|e| anyhow!("{}: {e}", path.display()))?
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect::<Vec<_>>()
                .join("/");
            out.push((relative, path));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A job's folder goes whole, with the staging copy a crashed write left (which no
    /// listing of the store shows).
    #[test]
    fn a_folder_goes_with_what_a_crashed_write_left() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open("store", dir.path()).unwrap();
        store
            .put("job/unit-0/a0/1/state", b"state".to_vec())
            .unwrap();
        let staged = dir.path().join("store/job/unit-0/a0/2/_metadata#1");
        std::fs::create_dir_all(staged.parent().unwrap()).unwrap();
        std::fs::write(&staged, b"cut short").unwrap();
        store.put("other/kept", b"kept".to_vec()).unwrap();
        store.delete_folder("job").unwrap();
        assert!(!dir.path().join("store/job").exists());
        assert_eq!(
            store.get("other/kept").unwrap().as_deref(),
            Some(&b"kept"[..])
        );
    }

    #[test]
    fn checkpoints_go_to_the_store_and_back_and_old_ones_are_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open("store", dir.path()).unwrap();
        let local = dir.path().join("chk");
        std::fs::create_dir_all(local.join("sub")).unwrap();
        std::fs::write(local.join("_metadata"), b"meta").unwrap();
        std::fs::write(local.join("sub/state"), b"state").unwrap();
        // Without its metadata a checkpoint is not one.
        store.upload("job/unit-0/a0/1", &local.join("sub")).unwrap();
        assert!(
            !store
                .download_checkpoint("job/unit-0/a0/1", &dir.path().join("partial"))
                .unwrap()
        );
        store.delete("job/unit-0/a0").unwrap();
        let mut tables = AttemptTables::default();
        for id in 1..=7 {
            store
                .save_checkpoint("job/unit-0/a1", id, &local, &mut tables)
                .unwrap();
        }
        let mut kept = store.folders("job/unit-0/a1").unwrap();
        kept.sort();
        assert_eq!(kept, ["3", "4", "5", "6", "7"]);
        store.delete_object("job/unit-0/a1/5/_metadata").unwrap();
        assert_eq!(
            store.complete_checkpoints("job/unit-0/a1").unwrap(),
            [3, 4, 6, 7],
            "only those with their metadata"
        );
        let back = dir.path().join("back");
        assert!(store.download_checkpoint("job/unit-0/a1/7", &back).unwrap());
        assert_eq!(std::fs::read(back.join("_metadata")).unwrap(), b"meta");
        assert_eq!(std::fs::read(back.join("sub/state")).unwrap(), b"state");
        assert!(
            !store
                .download("job/unit-0/a1/1", &dir.path().join("none"))
                .unwrap()
        );
        assert_eq!(store.get("job/finished/unit-0").unwrap(), None);
        store
            .put(&finished_key("job", 0), b"a1/7".to_vec())
            .unwrap();
        store
            .put(&finished_key("job", 3), b"a2/9".to_vec())
            .unwrap();
        assert_eq!(
            store.finished_units("job").unwrap(),
            [0, 3].into_iter().collect()
        );
        assert_eq!(store.get("job/finished/unit-0").unwrap().unwrap(), b"a1/7");
        let mut names = store.names("job/finished").unwrap();
        names.sort();
        assert_eq!(names, ["unit-0", "unit-3"]);
        // Only what is directly under it.
        assert!(store.names("job").unwrap().is_empty());
        store.delete("job/unit-0/a1").unwrap();
        assert!(store.folders("job/unit-0/a1").unwrap().is_empty());
    }

    /// Power lost right after a checkpoint is copied must not lose it: the marker that
    /// names it commits as soon as the copy returns. Every file and every folder up to
    /// the store's is fsynced, the checkpoint's files before its metadata is written.
    #[test]
    fn a_checkpoint_in_a_directory_store_is_durable_when_its_copy_returns() {
        let dir = tempfile::tempdir().unwrap();
        let store = CheckpointStore::open("store", dir.path()).unwrap();
        let root = dir.path().join("store").canonicalize().unwrap();
        let local = dir.path().join("chk");
        std::fs::create_dir_all(local.join("sub")).unwrap();
        std::fs::write(local.join("_metadata"), b"meta").unwrap();
        std::fs::write(local.join("sub/state"), b"state").unwrap();
        std::fs::write(local.join("other"), b"other").unwrap();
        durable::take_synced();
        store
            .save_checkpoint("job/unit-0/a1", 1, &local, &mut AttemptTables::default())
            .unwrap();
        let synced = durable::take_synced();
        let at = |p: &Path| synced.iter().position(|s| s == p);
        let checkpoint = root.join("job/unit-0/a1/1");
        let metadata = at(&checkpoint.join("_metadata")).expect("the metadata synced");
        for file in ["sub/state", "other"] {
            let synced_at = at(&checkpoint.join(file)).unwrap_or_else(|| panic!("{file}"));
            assert!(
                synced_at < metadata,
                "{file} after the metadata: {synced:?}"
            );
        }
        for folder in [
            checkpoint.join("sub"),
            checkpoint.clone(),
            root.join("job/unit-0/a1"),
            root.join("job/unit-0"),
            root.join("job"),
            root.clone(),
        ] {
            let before = at(&folder).unwrap_or_else(|| panic!("{}", folder.display()));
            assert!(before < metadata, "{}: {synced:?}", folder.display());
        }
        let named = synced.iter().rposition(|s| *s == checkpoint).unwrap();
        assert!(
            metadata < named,
            "the folder that names the metadata: {synced:?}"
        );
        store
            .put(&finished_key("job", 0), b"a1/1".to_vec())
            .unwrap();
        let synced = durable::take_synced();
        assert_eq!(synced[0], root.join("job/finished/unit-0"));
        assert!(synced.contains(&root.join("job/finished")), "{synced:?}");
        // A `file://` URL is a directory store too.
        let url = format!("file://{}", dir.path().join("by-url").display());
        let store = CheckpointStore::open(&url, Path::new("/")).unwrap();
        durable::take_synced();
        store.put("x", b"x".to_vec()).unwrap();
        assert_eq!(durable::take_synced().len(), 2);
        assert_eq!(
            store.describe("job/unit-0/a/1/_metadata"),
            dir.path()
                .canonicalize()
                .unwrap()
                .join("by-url/job/unit-0/a/1/_metadata")
                .display()
                .to_string()
        );
    }
}
