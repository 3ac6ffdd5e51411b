//! The wasmtime engine of a host: configuration, linker, component cache, epoch ticker.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use anyhow::Result;
use wasmtime::component::{HasSelf, Linker};
use wasmtime::{Config, Engine, OptLevel};

use super::bindings;
use super::cache::ComponentCache;
use super::plugin::Plugin;
use super::store::StoreState;

/// How often the epoch advances: the granularity of call deadlines and of cancelling a
/// running call.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Settings of a [`WasmEngine`].
#[derive(Debug, Clone, Default)]
pub struct EngineSettings {
    /// Where compiled components are cached; `None` keeps them in memory only.
    pub cache_dir: Option<PathBuf>,
}

/// Compiles, caches and instantiates operator components. One per host process; cheap
/// to share (`Arc`).
pub struct WasmEngine {
    engine: Engine,
    linker: Linker<StoreState>,
    cache: ComponentCache,
    ticker_stop: Arc<AtomicBool>,
}

impl WasmEngine {
    /// An engine with epoch interruption (for deadlines and cancellation) and a linker
    /// offering the `runtime` imports and a WASI context that grants nothing.
    pub fn new(settings: EngineSettings) -> Result<Self> {
        let mut config = Config::new();
        config.wasm_component_model(true);
        config.epoch_interruption(true);
        config.cranelift_opt_level(OptLevel::Speed);
        let engine = Engine::new(&config)?;

        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_sync(&mut linker)?;
        bindings::Operator::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)?;

        let ticker_stop = Arc::new(AtomicBool::new(false));
        {
            let engine = engine.clone();
            let stop = ticker_stop.clone();
            thread::Builder::new()
                .name("epoch ticker".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        thread::sleep(EPOCH_TICK);
                        engine.increment_epoch();
                    }
                })?;
        }
        Ok(WasmEngine {
            engine,
            linker,
            cache: ComponentCache::new(settings.cache_dir),
            ticker_stop,
        })
    }

    /// Loads and checks the operator component at `path` (see [`Plugin::load`]).
    pub fn load_plugin(&self, path: &Path) -> Result<Plugin> {
        Plugin::load(self, path)
    }

    /// The wasmtime engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    pub(crate) fn linker(&self) -> &Linker<StoreState> {
        &self.linker
    }

    /// The component cache.
    pub fn cache(&self) -> &ComponentCache {
        &self.cache
    }
}

impl Drop for WasmEngine {
    fn drop(&mut self) {
        self.ticker_stop.store(true, Ordering::Relaxed);
    }
}
