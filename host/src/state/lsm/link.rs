//! The step between a checkpoint's synchronous part and its upload: once the memtable the
//! synchronous part switched is in a table file, the database's files are hard-linked
//! into the checkpoint's local folder, and the instance may switch memtables again.

use std::path::{Path, PathBuf};
use std::sync::Arc;
#[cfg(test)]
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use parking_lot::{Condvar, Mutex};
use rocksdb::{DB, properties};

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
    #[cfg(test)]
    waiting: AtomicUsize,
    /// Links wait while this is set (for tests).
    #[cfg(test)]
    hold: Mutex<bool>,
    #[cfg(test)]
    released: Condvar,
}

impl LinkGate {
    /// Waits until no link is pending.
    pub fn wait(&self) {
        let mut closed = self.closed.lock();
        while *closed {
            #[cfg(test)]
            self.waiting.fetch_add(1, Ordering::SeqCst);
            self.opened.wait(&mut closed);
            #[cfg(test)]
            self.waiting.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Threads waiting now.
    #[cfg(test)]
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    /// Holds links back (`true`) until released (`false`).
    #[cfg(test)]
    pub fn hold(&self, hold: bool) {
        *self.hold.lock() = hold;
        self.released.notify_all();
    }

    fn held(&self) {
        #[cfg(test)]
        {
            let mut hold = self.hold.lock();
            while *hold {
                self.released.wait(&mut hold);
            }
        }
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

/// A checkpoint's link, made on a thread of its own from the synchronous part on (so
/// that the gate opens a flush's time after the barrier, whatever the checkpoint writers
/// are busy with). The gate is closed until the link is made. It keeps the database,
/// and so its working folder, which holds the local checkpoint, open.
pub struct PendingLink {
    _store: Arc<Store>,
    /// The linking thread until joined; then what the link came to.
    state: Mutex<LinkState>,
}

enum LinkState {
    Running(JoinHandle<Result<(), String>>),
    Done(Result<(), String>),
}

impl std::fmt::Debug for PendingLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingLink").finish_non_exhaustive()
    }
}

impl PendingLink {
    /// Called by the synchronous part, right after it switched the memtable: closes the
    /// gate and starts linking the database's files into `local` (a new folder).
    pub fn start(store: Arc<Store>, gate: Arc<LinkGate>, local: PathBuf) -> Self {
        gate.close();
        let link = {
            let (store, gate, local) = (store.clone(), gate.clone(), local.clone());
            move || {
                gate.held();
                link_and_open(&store.db, &gate, &local)
            }
        };
        let state = match std::thread::Builder::new()
            .name("state link".into())
            .spawn(link)
        {
            Ok(thread) => LinkState::Running(thread),
            // No thread to be had (a process at its memory limit): linked here, then.
            Err(_) => LinkState::Done(link_and_open(&store.db, &gate, &local)),
        };
        PendingLink {
            _store: store,
            state: Mutex::new(state),
        }
    }

    /// Waits for the link to be made; what it came to.
    pub fn wait(&self) -> Result<()> {
        let mut state = self.state.lock();
        if let LinkState::Running(_) = &*state {
            let LinkState::Running(thread) =
                std::mem::replace(&mut *state, LinkState::Done(Ok(())))
            else {
                unreachable!("matched above")
            };
            let linked = thread
                .join()
                .unwrap_or_else(|_| Err("the thread linking the state's files panicked".into()));
            *state = LinkState::Done(linked);
        }
        match &*state {
            LinkState::Done(Err(e)) => bail!("{e}"),
            _ => Ok(()),
        }
    }
}

/// Links the files into `local`, then opens the gate, whatever came of it.
fn link_and_open(db: &DB, gate: &LinkGate, local: &Path) -> Result<(), String> {
    let linked = link_files(db, local).map_err(|e| format!("{e:#}"));
    gate.open();
    linked
}

/// Waits for the memtables switched so far to be flushed, then hard-links the database's
/// files into `local` (a new folder).
fn link_files(db: &DB, local: &Path) -> Result<()> {
    let deadline = Instant::now() + FLUSH_TIMEOUT;
    let int = |name| db.property_int_value(name).ok().flatten().unwrap_or(0);
    while int(properties::NUM_IMMUTABLE_MEM_TABLE) > 0 {
        if int(properties::BACKGROUND_ERRORS) > 0 {
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
    // No flush of its own (the memtable holds only what came after the barrier), so no
    // write-ahead log either: the tables and the files describing them.
    rocksdb::checkpoint::Checkpoint::new(db)
        .and_then(|c| c.create_checkpoint_with_log_size(local, u64::MAX))
        .with_context(|| format!("linking the state's files into {}", local.display()))
}

impl Drop for PendingLink {
    /// Joins the thread: it must not create its folder after the snapshot's owner deleted
    /// it.
    fn drop(&mut self) {
        let _ = self.wait();
    }
}
