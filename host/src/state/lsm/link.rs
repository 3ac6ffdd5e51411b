//! The step between a checkpoint's synchronous part and its upload: once the memtable the
//! synchronous part switched is in a table file, the database's files are hard-linked
//! into the checkpoint's local folder, and the instance may switch memtables again.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use parking_lot::{Condvar, Mutex};
use rocksdb::DB;

/// An instance's database and its working folder, which is deleted once the database
/// (declared first, so closed first) is.
pub struct Store {
    pub db: DB,
    _folder: Folder,
}

impl Store {
    pub fn new(db: DB, dir: PathBuf) -> Self {
        Store {
            db,
            _folder: Folder(dir),
        }
    }
}

/// A working folder, deleted when dropped: it is the instance's alone, and the
/// checkpoints keep their own copies of its files.
struct Folder(PathBuf);

impl Drop for Folder {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(
                "could not delete the state folder {}: {e}",
                self.0.display()
            );
        }
    }
}

/// Closed while a checkpoint's files are still to be linked: the instance switches no
/// memtable meanwhile (a switched memtable is flushed, and its entries, written after
/// the barrier, would be in the files linked).
#[derive(Debug, Default)]
pub struct LinkGate {
    closed: Mutex<bool>,
    opened: Condvar,
    /// Threads waiting (for tests).
    waiting: AtomicUsize,
}

impl LinkGate {
    /// Waits until no link is pending.
    pub fn wait(&self) {
        let mut closed = self.closed.lock();
        while *closed {
            self.waiting.fetch_add(1, Ordering::SeqCst);
            self.opened.wait(&mut closed);
            self.waiting.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Threads waiting now.
    #[cfg(test)]
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    fn close(&self) {
        *self.closed.lock() = true;
    }

    fn open(&self) {
        *self.closed.lock() = false;
        self.opened.notify_all();
    }
}

/// How long the link waits for the switched memtable's flush before it gives up (the
/// checkpoint then fails, and the next one tries again).
const FLUSH_TIMEOUT: Duration = Duration::from_secs(600);

/// A checkpoint's link: the gate is closed from its making until the link is made or it
/// is dropped (a checkpoint discarded before its asynchronous part ran). It keeps the
/// database, and so its working folder, which holds the local checkpoint, open.
pub struct PendingLink {
    store: Arc<Store>,
    gate: Arc<LinkGate>,
}

impl std::fmt::Debug for PendingLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingLink").finish_non_exhaustive()
    }
}

impl PendingLink {
    /// Called by the synchronous part, right after it switched the memtable.
    pub fn new(store: Arc<Store>, gate: Arc<LinkGate>) -> Self {
        gate.close();
        PendingLink { store, gate }
    }

    /// Waits for the memtables switched so far to be flushed, then hard-links the
    /// database's files into `local` (a new folder), and opens the gate. Once.
    pub fn link(&self, local: &Path) -> Result<()> {
        let linked = self.link_files(local);
        self.gate.open();
        linked
    }

    fn link_files(&self, local: &Path) -> Result<()> {
        let db = &self.store.db;
        let deadline = Instant::now() + FLUSH_TIMEOUT;
        let int = |name: &str| db.property_int_value(name).ok().flatten().unwrap_or(0);
        while int("rocksdb.num-immutable-mem-table") > 0 {
            if int("rocksdb.background-errors") > 0 {
                bail!("the state database failed to write a table file (see its LOG)");
            }
            if Instant::now() > deadline {
                bail!(
                    "the state database did not write its memtable to a table file in {} s",
                    FLUSH_TIMEOUT.as_secs()
                );
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        crate::failpoint!("checkpoint::before-state-link");
        // No flush of its own (the memtable holds only what came after the barrier), so
        // no write-ahead log either: the tables and the files describing them.
        rocksdb::checkpoint::Checkpoint::new(db)
            .and_then(|c| c.create_checkpoint_with_log_size(local, u64::MAX))
            .with_context(|| format!("linking the state's files into {}", local.display()))
    }
}

impl Drop for PendingLink {
    fn drop(&mut self) {
        self.gate.open();
    }
}
