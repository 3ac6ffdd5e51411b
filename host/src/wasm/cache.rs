//! Compiled components, cached by content hash in memory and on disk.
//!
//! Compiling a component with Cranelift takes hundreds of milliseconds; loading a
//! precompiled artifact takes well under one. The cache key is the SHA-256 of the
//! component's bytes together with the engine's compatibility hash (which covers the
//! wasmtime version and every setting that changes generated code), so an artifact is
//! only ever loaded by an engine that could have produced it.

use std::collections::HashMap;
use std::fs;
use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{Context, Result};
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
    memory: Mutex<HashMap<[u8; 32], Component>>,
}

impl ComponentCache {
    /// A cache keeping artifacts in `dir` (created when needed), or only in memory.
    pub fn new(dir: Option<PathBuf>) -> Self {
        ComponentCache {
            dir,
            memory: Mutex::new(HashMap::new()),
        }
    }

    /// `$SLUICE_CACHE_DIR`, else `$XDG_CACHE_HOME/sluice`, else `~/.cache/sluice`.
    pub fn default_dir() -> Option<PathBuf> {
        if let Some(dir) = std::env::var_os("SLUICE_CACHE_DIR") {
            return Some(PathBuf::from(dir));
        }
        if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
            return Some(PathBuf::from(dir).join("sluice"));
        }
        std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache").join("sluice"))
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
    ) -> Result<(Component, CacheOutcome)> {
        let key = cache_key(engine, bytes);
        if let Some(c) = self.lock().get(&key) {
            return Ok((c.clone(), CacheOutcome::Memory));
        }
        let file = self
            .dir
            .as_ref()
            .map(|d| d.join(format!("{}.cwasm", hex(&key))));
        if let Some(file) = file.as_ref().filter(|f| f.exists()) {
            // SAFETY: the file was written by `store` below from `Component::serialize`
            // of this very engine configuration (the key covers the engine's
            // compatibility hash), into a directory owned by the host, with an atomic
            // rename, so it is a complete artifact wasmtime produced. wasmtime checks
            // its header and version again while loading.
            match unsafe { Component::deserialize_file(engine, file) } {
                Ok(c) => {
                    self.lock().insert(key, c.clone());
                    return Ok((c, CacheOutcome::Disk));
                }
                Err(e) => tracing::warn!(
                    "ignoring unusable cached artifact {}: {e:#}; compiling again",
                    file.display()
                ),
            }
        }
        let component = Component::new(engine, bytes)?;
        if let Some(file) = &file
            && let Err(e) = store(file, &component)
        {
            tracing::warn!(
                "could not cache compiled component in {}: {e:#}",
                file.display()
            );
        }
        self.lock().insert(key, component.clone());
        Ok((component, CacheOutcome::Compiled))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Component>> {
        self.memory.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn store(file: &Path, component: &Component) -> Result<()> {
    let dir = file.parent().expect("cache files live in a directory");
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let bytes = component.serialize()?;
    let tmp = file.with_extension(format!("tmp{}", std::process::id()));
    let mut f = fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(&bytes)?;
    f.sync_all()?;
    fs::rename(&tmp, file).with_context(|| format!("renaming {} into place", tmp.display()))?;
    Ok(())
}

/// SHA-256 of the bytes, hex-encoded: how plugins are identified in logs and checkpoints.
pub fn content_digest(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes).into())
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

fn hex(bytes: &[u8; 32]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
