//! Files written so that a crash leaves either the old content or the new one, never a
//! part: checkpoint metadata, compiled artifacts, the server's records; and files another
//! writer put in place made durable before anything names them (the checkpoints a
//! cluster's directory store holds).

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// Writes `bytes` to `path` durably: into a temporary file beside it, fsync, rename over
/// `path`, fsync the folder (so the rename survives a crash too).
pub fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("creating a temporary file in {}", dir.display()))?;
    tmp.write_all(bytes)
        .and_then(|()| tmp.as_file().sync_all())
        .with_context(|| format!("writing {}", tmp.path().display()))?;
    tmp.persist(path)
        .with_context(|| format!("renaming into {}", path.display()))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("syncing {}", dir.display()))?;
    Ok(())
}

/// Makes `files`, which another writer created or renamed into place without fsync (as
/// `object_store`'s local store does), durable with their names: fsyncs each file, then
/// each folder from theirs up to and including `root`, deepest first and each once.
/// `root` is a folder whose own name is durable (see [`create_dir_all`]); the folders
/// between it and the files may be new.
pub fn sync_written(root: &Path, files: &[PathBuf]) -> Result<()> {
    let mut folders = std::collections::BTreeSet::new();
    for file in files {
        sync(file)?;
        let mut at = file.parent();
        while let Some(dir) = at.filter(|d| d.starts_with(root)) {
            if !folders.insert(dir) {
                break;
            }
            at = dir.parent();
        }
    }
    let mut folders: Vec<&Path> = folders.into_iter().collect();
    folders.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    folders.into_iter().try_for_each(sync)
}

/// Creates `dir` and the folders above it that are missing, durably: the folder each
/// new one is in is fsynced once it holds it.
pub fn create_dir_all(dir: &Path) -> Result<()> {
    let mut missing = Vec::new();
    let mut at = Some(dir);
    while let Some(d) = at.filter(|d| !d.as_os_str().is_empty() && !d.exists()) {
        missing.push(d);
        at = d.parent();
    }
    if missing.is_empty() {
        return Ok(());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for new in missing.iter().rev() {
        match new.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => sync(parent)?,
            _ => sync(Path::new("."))?,
        }
    }
    Ok(())
}

/// Fsyncs a file or folder.
fn sync(path: &Path) -> Result<()> {
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .with_context(|| format!("syncing {}", path.display()))?;
    #[cfg(test)]
    SYNCED.with(|synced| synced.borrow_mut().push(path.to_path_buf()));
    Ok(())
}

#[cfg(test)]
thread_local! {
    /// What [`sync`] fsynced on this thread, in order (for tests).
    static SYNCED: std::cell::RefCell<Vec<PathBuf>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// What this thread fsynced through [`sync_written`] and [`create_dir_all`] since the
/// last call, in order.
#[cfg(test)]
pub(crate) fn take_synced() -> Vec<PathBuf> {
    SYNCED.with(|synced| std::mem::take(&mut *synced.borrow_mut()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_whole_file_and_leaves_nothing_beside_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta");
        write_atomically(&path, b"first, longer").unwrap();
        write_atomically(&path, b"second").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        assert!(write_atomically(&dir.path().join("no/such/dir/f"), b"x").is_err());
    }

    #[test]
    fn written_files_are_synced_then_their_folders_up_to_the_root_deepest_first() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("store");
        take_synced();
        create_dir_all(&root.join("job")).unwrap();
        // The folder each new one went into: the temporary one, then `store`.
        assert_eq!(take_synced(), [dir.path().to_path_buf(), root.clone()]);
        create_dir_all(&root.join("job")).unwrap();
        assert!(take_synced().is_empty(), "nothing new, nothing synced");
        let a = root.join("job/unit-0/a/1/x");
        let b = root.join("job/unit-0/a/1/sub/y");
        for f in [&a, &b] {
            std::fs::create_dir_all(f.parent().unwrap()).unwrap();
            std::fs::write(f, b"data").unwrap();
        }
        sync_written(&root, &[a.clone(), b.clone()]).unwrap();
        let c = root.join("job/unit-0/a/1");
        assert_eq!(
            take_synced(),
            [
                a.clone(),
                b.clone(),
                c.join("sub"),
                c.clone(),
                root.join("job/unit-0/a"),
                root.join("job/unit-0"),
                root.join("job"),
                root.clone(),
            ]
        );
        assert!(sync_written(&root, &[c.join("gone")]).is_err());
    }
}
