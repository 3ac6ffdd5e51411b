//! Compiled components, cached by content hash in memory and on disk.
//!
//! Compiling a component with Cranelift takes hundreds of milliseconds; loading a
//! precompiled artifact takes well under one. The cache key is the SHA-256 of the
//! component's bytes together with the engine's compatibility hash (which covers the
//! wasmtime version and every setting that changes generated code), so an artifact is
//! only ever loaded by an engine that could have produced it.
//!
//! Both levels are bounded, least recently used first out: [`MEMORY_ENTRIES`] components
//! and [`MEMORY_BYTES`] of their compiled code in memory (an instance keeps its own
//! reference, so eviction never affects a running job), and [`DISK_BYTES`] of artifacts
//! on disk (a file's modification time marks its last use). A server's tenants share
//! both: one tenant's many or large plugins push the others' out, which costs those a
//! load from disk (about a millisecond), not memory.

use parking_lot::Mutex;
use std::fs;
use std::hash::{Hash, Hasher};
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use lru::LruCache;
use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

/// Where a component came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOutcome {
    /// Already compiled in this process.
    Memory,
    /// Loaded from a precompiled artifact on disk.
    Disk,
    /// Compiled now (and stored, when a cache directory is configured).
    Compiled,
}

/// The component cache of one engine.
#[derive(Debug)]
pub struct ComponentCache {
    dir: Option<PathBuf>,
    /// Say on standard error when a large component is compiled.
    announce: bool,
    memory: Mutex<Memory>,
}

/// The components kept in memory, and the bytes of their compiled code.
#[derive(Debug)]
struct Memory {
    components: LruCache<[u8; 32], Component>,
    bytes: u64,
    /// [`MEMORY_BYTES`], but for tests.
    max_bytes: u64,
}

impl Memory {
    fn get(&mut self, key: &[u8; 32]) -> Option<&Component> {
        self.components.get(key)
    }

    /// Keeps `component`, dropping the least recently used ones past either bound.
    fn put(&mut self, key: [u8; 32], component: Component) {
        self.bytes += code_bytes(&component);
        if let Some(old) = self.components.put(key, component) {
            self.bytes -= code_bytes(&old);
        }
        while self.components.len() > 1
            && (self.bytes > self.max_bytes || self.components.len() > MEMORY_ENTRIES.get())
        {
            let (_, old) = self.components.pop_lru().expect("more than one");
            self.bytes -= code_bytes(&old);
        }
    }
}

/// The bytes of a component's compiled code.
fn code_bytes(component: &Component) -> u64 {
    let range = component.image_range();
    (range.end as usize - range.start as usize) as u64
}

/// Compiled components kept in memory.
pub const MEMORY_ENTRIES: NonZeroUsize = NonZeroUsize::new(256).expect("not zero");
/// Bytes of compiled code kept in memory (a Rust operator's is well under a megabyte; a
/// Python or JavaScript one's tens of megabytes).
pub const MEMORY_BYTES: u64 = 1 << 30;
/// Bytes of compiled artifacts kept on disk.
pub const DISK_BYTES: u64 = 2 << 30;
/// Components larger than this are announced when compiled (a Rust operator is well
/// below; an interpreter with its program, as Python and JavaScript components are, is
/// well above).
pub const ANNOUNCED_BYTES: usize = 4 << 20;

impl ComponentCache {
    /// A cache keeping artifacts in `dir` (created when needed), or only in memory.
    pub fn new(dir: Option<PathBuf>) -> Self {
        ComponentCache {
            dir,
            announce: false,
            memory: Mutex::new(Memory {
                components: LruCache::unbounded(),
                bytes: 0,
                max_bytes: MEMORY_BYTES,
            }),
        }
    }

    /// Says on standard error when a component of more than [`ANNOUNCED_BYTES`] is
    /// compiled, and how long it took.
    pub fn announcing(mut self, announce: bool) -> Self {
        self.announce = announce;
        self
    }

    /// `$SLUICE_CACHE_DIR`, else `$XDG_CACHE_HOME/sluice`, else `~/.cache/sluice`.
    pub fn default_dir() -> Option<PathBuf> {
        if let Some(dir) = std::env::var_os("SLUICE_CACHE_DIR") {
            return Some(PathBuf::from(dir));
        }
        dirs::cache_dir().map(|dir| dir.join("sluice"))
    }

    /// The directory artifacts are kept in, if any.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }

    /// The compiled form of `bytes`, compiling it only when no cache has it.
    pub fn get_or_compile(
        &self,
        engine: &Engine,
        bytes: &[u8],
        what: &Path,
    ) -> Result<(Component, CacheOutcome)> {
        let key = cache_key(engine, bytes);
        if let Some(c) = self.lock().get(&key) {
            return Ok((c.clone(), CacheOutcome::Memory));
        }
        let file = self
            .dir
            .as_ref()
            .map(|d| d.join(format!("{}.cwasm", hex::encode(key))));
        if let Some(file) = file.as_ref().filter(|f| f.exists() && only_ours(f)) {
            // SAFETY: the file was written by `store` below from `Component::serialize`
            // of this very engine configuration (the key covers the engine's
            // compatibility hash), into a directory only this user may write (checked by
            // `only_ours`, created 0700 by `store`), with an atomic rename, so it is a
            // complete artifact wasmtime produced. wasmtime checks its header and version
            // again while loading.
            match unsafe { Component::deserialize_file(engine, file) } {
                Ok(c) => {
                    // Marks its use, for the disk's least-recently-used order.
                    let _ = fs::File::options()
                        .append(true)
                        .open(file)
                        .and_then(|f| f.set_modified(std::time::SystemTime::now()));
                    self.lock().put(key, c.clone());
                    return Ok((c, CacheOutcome::Disk));
                }
                Err(e) => tracing::warn!(
                    "ignoring unusable cached artifact {}: {e:#}; compiling again",
                    file.display()
                ),
            }
        }
        let start = std::time::Instant::now();
        let announce = self.announce && bytes.len() > ANNOUNCED_BYTES;
        if announce {
            eprintln!(
                "compiling {} ({:.1} MB) for the first time; later runs load it from the cache",
                what.display(),
                bytes.len() as f64 / 1e6
            );
        }
        tracing::info!(plugin = %what.display(), bytes = bytes.len(), "compiling a component");
        let component = Component::new(engine, bytes)?;
        if announce {
            eprintln!(
                "compiled {} in {:.1} s",
                what.display(),
                start.elapsed().as_secs_f64()
            );
        }
        if let Some(file) = &file {
            match store(file, &component) {
                Ok(()) => trim_dir(file.parent().expect("in the cache directory"), DISK_BYTES),
                Err(e) => tracing::warn!(
                    "could not cache compiled component in {}: {e:#}",
                    file.display()
                ),
            }
        }
        self.lock().put(key, component.clone());
        Ok((component, CacheOutcome::Compiled))
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, Memory> {
        self.memory.lock()
    }
}

fn store(file: &Path, component: &Component) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = file.parent().expect("cache files live in a directory");
    // Artifacts are native code this process loads: no one else may write beside them.
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    crate::durable::write_atomically(file, &component.serialize()?)
}

/// Whether `file` and its folder belong to this process's user and no one else may
/// write them: an artifact is loaded as native code, so one that another user could
/// have put there or changed is compiled again instead (and said, once per file).
fn only_ours(file: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let me = rustix::process::geteuid().as_raw();
    let ours =
        |path: &Path| fs::metadata(path).is_ok_and(|m| m.uid() == me && m.mode() & 0o022 == 0);
    let dir = file.parent().unwrap_or(Path::new("."));
    if ours(dir) && ours(file) {
        return true;
    }
    tracing::warn!(
        "not loading cached artifact {}: it or its folder belongs to another user or may be \
         written by others (the cache folder should be the user's own, mode 0700); compiling \
         again",
        file.display()
    );
    false
}

/// SHA-256 of the bytes, hex-encoded: how plugins are identified in logs and checkpoints.
/// Deletes the least recently used artifacts in `dir` until they take at most `max`
/// bytes. Failures are logged: the cache is an optimization.
fn trim_dir(dir: &Path, max: u64) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let mut files: Vec<(std::time::SystemTime, u64, PathBuf)> = entries
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "cwasm"))
        .filter_map(|e| {
            let meta = e.metadata().ok()?;
            Some((meta.modified().ok()?, meta.len(), e.path()))
        })
        .collect();
    let mut total: u64 = files.iter().map(|(_, len, _)| len).sum();
    files.sort();
    for (_, len, path) in files {
        if total <= max {
            break;
        }
        match fs::remove_file(&path) {
            Ok(()) => total -= len,
            Err(e) => tracing::warn!("could not trim the compile cache: {}: {e}", path.display()),
        }
    }
}

pub fn content_digest(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn cache_key(engine: &Engine, bytes: &[u8]) -> [u8; 32] {
    struct ShaHasher(Sha256);
    impl Hasher for ShaHasher {
        fn finish(&self) -> u64 {
            unreachable!("only used to feed Hash impls into SHA-256")
        }
        fn write(&mut self, bytes: &[u8]) {
            self.0.update(bytes);
        }
    }
    let mut h = ShaHasher(Sha256::new());
    h.0.update(bytes);
    engine.precompile_compatibility_hash().hash(&mut h);
    h.0.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    #[test]
    fn memory_keeps_the_most_recently_used_components_within_its_bytes() {
        let engine = Engine::default();
        let component = |n: u32| {
            let body = "(local.set 0 (i32.mul (local.get 0) (i32.const 3)))".repeat(n as usize);
            let wat = format!(
                "(component (core module (func (export \"f\") (param i32) (result i32) \
                 {body} (local.get 0))))"
            );
            Component::new(&engine, wat::parse_str(&wat).unwrap()).unwrap()
        };
        let (a, b, c) = (component(100), component(101), component(102));
        let size = code_bytes(&a).max(code_bytes(&b)).max(code_bytes(&c));
        assert!(size > 0);
        let mut memory = Memory {
            components: LruCache::unbounded(),
            bytes: 0,
            max_bytes: 2 * size,
        };
        memory.put([1; 32], a);
        memory.put([2; 32], b);
        assert!(memory.get(&[1; 32]).is_some());
        // A third does not fit: the least recently used (b) goes.
        memory.put([3; 32], c);
        assert!(memory.get(&[2; 32]).is_none());
        assert!(memory.get(&[1; 32]).is_some() && memory.get(&[3; 32]).is_some());
        assert!(memory.bytes <= 2 * size, "{}", memory.bytes);
        // The same key again replaces its bytes rather than adding them.
        let before = memory.bytes;
        memory.put([3; 32], component(102));
        assert_eq!(memory.bytes, before);
    }

    #[test]
    fn the_disk_cache_drops_the_least_recently_used_first() {
        let dir = std::env::temp_dir().join(format!("sluice-cache-trim-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let now = SystemTime::now();
        for (name, age) in [("old", 30), ("mid", 20), ("new", 10)] {
            let path = dir.join(format!("{name}.cwasm"));
            fs::write(&path, vec![0u8; 100]).unwrap();
            let f = fs::File::options().append(true).open(&path).unwrap();
            f.set_modified(now - Duration::from_secs(age)).unwrap();
        }
        fs::write(dir.join("other.txt"), vec![0u8; 1000]).unwrap();
        trim_dir(&dir, 200);
        let mut left: Vec<String> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["mid.cwasm", "new.cwasm", "other.txt"]);
    }
}
