//! The wasmtime engine of a host: configuration, linker, component cache, epoch ticker.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread;
use std::time::Duration;

use anyhow::Result;
use parking_lot::Mutex;
use wasmtime::component::{HasSelf, Linker};
use wasmtime::{Config, Engine, OptLevel, ProfilingStrategy};

use super::bindings;
use super::cache::ComponentCache;
use super::cpu::CpuShares;
use super::sandbox;
use super::store::StoreState;

/// How often the epoch advances: the granularity of call deadlines and of cancelling a
/// running call.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Settings of a [`WasmEngine`].
#[derive(Debug, Clone, Default)]
pub struct EngineSettings {
    /// Where compiled components are cached; `None` keeps them in memory only.
    pub cache_dir: Option<PathBuf>,
    /// Say on standard error when a large component is compiled (not found in the
    /// cache), and how long it took: the first run of a Python or JavaScript operator
    /// compiles for tens of seconds. For commands people watch; a server logs instead.
    pub announce_compiles: bool,
}

/// One wasmtime engine with its linker.
struct Variant {
    engine: Engine,
    linker: Linker<StoreState>,
}

impl Variant {
    fn new(fuel: bool) -> Result<Self> {
        let mut config = Config::new();
        config.wasm_component_model(true);
        config.epoch_interruption(true);
        config.consume_fuel(fuel);
        config.cranelift_opt_level(OptLevel::Speed);
        if std::env::var_os("SLUICE_PERF_MAP").is_some_and(|v| v == "1") {
            // Names the operators' compiled functions for `perf` (in /tmp/perf-PID.map).
            config.profiler(ProfilingStrategy::PerfMap);
        }
        let engine = Engine::new(&config)?;
        let mut linker = Linker::new(&engine);
        sandbox::add_wasi_to_linker(&mut linker)?;
        bindings::v3::Operator::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)?;
        bindings::v2::Operator::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)?;
        bindings::v1::Operator::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)?;
        super::host::link_borrowed(&mut linker)?;
        Ok(Variant { engine, linker })
    }
}

/// Compiles, caches and instantiates operator components. One per host process; cheap
/// to share (`Arc`).
///
/// Fuel metering changes the generated code, so tenants with a fuel budget get their
/// components compiled by a second engine configured for it, created when first needed;
/// the component cache keeps both kinds apart (its key covers the engine configuration).
pub struct WasmEngine {
    plain: Variant,
    metered: OnceLock<Variant>,
    cache: ComponentCache,
    ticking: Arc<Mutex<Vec<Engine>>>,
    ticker_stop: Arc<AtomicBool>,
    cpu: Arc<CpuShares>,
}

impl WasmEngine {
    /// An engine with epoch interruption (for deadlines and cancellation) and a linker
    /// offering the `runtime` imports and a WASI context that grants nothing.
    pub fn new(settings: EngineSettings) -> Result<Self> {
        let plain = Variant::new(false)?;
        let ticking = Arc::new(Mutex::new(vec![plain.engine.clone()]));
        let ticker_stop = Arc::new(AtomicBool::new(false));
        let cpu = Arc::new(CpuShares::default());
        {
            let engines = ticking.clone();
            let stop = ticker_stop.clone();
            let cpu = cpu.clone();
            thread::Builder::new()
                .name("epoch ticker".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        thread::sleep(EPOCH_TICK);
                        for engine in engines.lock().iter() {
                            engine.increment_epoch();
                        }
                        cpu.tick();
                    }
                })?;
        }
        Ok(WasmEngine {
            plain,
            metered: OnceLock::new(),
            cache: ComponentCache::new(settings.cache_dir).announcing(settings.announce_compiles),
            ticking,
            ticker_stop,
            cpu,
        })
    }

    fn variant(&self, fuel: bool) -> Result<&Variant> {
        if !fuel {
            return Ok(&self.plain);
        }
        if let Some(v) = self.metered.get() {
            return Ok(v);
        }
        let v = Variant::new(true)?;
        let engine = v.engine.clone();
        if self.metered.set(v).is_ok() {
            self.ticking.lock().push(engine);
        }
        Ok(self.metered.get().expect("set above"))
    }

    /// The wasmtime engine (without fuel metering).
    pub fn engine(&self) -> &Engine {
        &self.plain.engine
    }

    pub(crate) fn engine_for(&self, fuel: bool) -> Result<&Engine> {
        Ok(&self.variant(fuel)?.engine)
    }

    pub(crate) fn linker_for(&self, fuel: bool) -> Result<&Linker<StoreState>> {
        Ok(&self.variant(fuel)?.linker)
    }

    /// How the host's cores are shared between tenants.
    pub fn cpu(&self) -> &Arc<CpuShares> {
        &self.cpu
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
