//! Resource limits of one operator instance.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use wasmtime::ResourceLimiter;

/// A directory of the host an operator may see, the only way past the empty sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirGrant {
    /// The directory on the host.
    pub host: PathBuf,
    /// Where the operator sees it (an absolute path).
    pub guest: String,
    /// Whether the operator may only read.
    pub read_only: bool,
}

/// What one operator instance may use and reach. Set per tenant; the defaults suit
/// trusted jobs on a developer machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxLimits {
    /// Largest linear memory, in bytes.
    pub memory_bytes: usize,
    /// Longest a single call may run before it is interrupted; `None` for no limit.
    pub call_deadline: Option<Duration>,
    /// Fuel (roughly, Wasm instructions) a single call may use; `None` for no limit.
    pub fuel_per_call: Option<u64>,
    /// Most bytes of records and effects one call may return.
    pub max_output_bytes: usize,
    /// Guest log lines (log import, stdout, stderr) per second before lines are dropped.
    pub log_lines_per_second: u32,
    /// Directories granted (none by default: no file system at all).
    pub dirs: Vec<DirGrant>,
    /// Most bytes of keyed state (keys, values and per-entry overhead) the host may hold
    /// for the instance.
    pub max_state_bytes: u64,
    /// Most timers the host may hold for the instance.
    pub max_timers: u64,
    /// Most distinct counter names the instance may create.
    pub max_counters: usize,
    /// Longest guest string the host keeps or prints (a log line, an error message, a
    /// counter name); longer ones are cut.
    pub max_guest_string_bytes: usize,
    /// The tenant's weight in sharing the host's cores (see `wasm::cpu`).
    pub cpu_weight: u32,
    /// Where keyed state is kept for jobs that do not say (`[state] backend`).
    pub state_backend: crate::state::BackendKind,
}

impl Default for SandboxLimits {
    fn default() -> Self {
        SandboxLimits {
            memory_bytes: 256 << 20,
            call_deadline: Some(Duration::from_secs(30)),
            fuel_per_call: None,
            max_output_bytes: 64 << 20,
            log_lines_per_second: 1000,
            dirs: Vec::new(),
            max_state_bytes: 1 << 30,
            max_timers: 10_000_000,
            max_counters: 1000,
            max_guest_string_bytes: 16 << 10,
            cpu_weight: 1,
            state_backend: crate::state::BackendKind::Heap,
        }
    }
}

/// Core instances one operator instance (a component's store) may create. A component
/// is a handful of core instances (its code, the WASI adapter, shims); a component that
/// instantiates a module over and over is after the host's memory.
pub const MAX_CORE_INSTANCES: usize = 64;
/// Linear memories per store: each reserves address space far beyond its size.
pub const MAX_MEMORIES: usize = 4;
/// Tables per store.
pub const MAX_TABLES: usize = 64;
/// Table elements per store, over all its tables (CPython's function table, the largest
/// among the plugins, has tens of thousands).
pub const MAX_TABLE_ELEMENTS: usize = 1 << 20;

/// Enforces [`SandboxLimits::memory_bytes`] over all the linear memories of a store
/// together, and bounds its core instances, memories, tables and table elements, trapping
/// with a message that says what the operator asked for (rather than letting the
/// allocation fail inside the guest, where a Rust guest aborts without saying why).
#[derive(Debug)]
pub struct MemoryLimiter {
    limit: usize,
    /// Bytes of linear memory over all the store's memories.
    total: usize,
    /// Elements over all the store's tables.
    table_elements: usize,
    /// Largest total linear memory the instance has had, readable from other threads.
    pub peak: Arc<AtomicU64>,
}

/// The trap raised when an operator exceeds its memory limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryLimitExceeded {
    /// Size before the failed growth.
    pub current: usize,
    /// Size the operator asked for.
    pub desired: usize,
    /// The limit.
    pub limit: usize,
}

impl std::fmt::Display for MemoryLimitExceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "memory limit exceeded: tried to grow linear memory (all the instance's \
             memories together) from {} to {} (limit {})",
            size(self.current),
            size(self.desired),
            size(self.limit)
        )
    }
}

impl std::error::Error for MemoryLimitExceeded {}

fn size(bytes: usize) -> String {
    bytesize::ByteSize(bytes as u64).display().iec().to_string()
}

impl MemoryLimiter {
    /// A limiter allowing `limit` bytes of linear memory.
    pub fn new(limit: usize) -> Self {
        MemoryLimiter {
            limit,
            total: 0,
            table_elements: 0,
            peak: Arc::default(),
        }
    }
}

impl ResourceLimiter for MemoryLimiter {
    // A new memory or table grows from 0: every byte and element is counted here once.
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let total = self.total - current.min(self.total) + desired;
        if total > self.limit {
            return Err(wasmtime::Error::new(MemoryLimitExceeded {
                current: self.total,
                desired: total,
                limit: self.limit,
            }));
        }
        self.total = total;
        self.peak.fetch_max(total as u64, Ordering::Relaxed);
        Ok(true)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let total = self.table_elements - current.min(self.table_elements) + desired;
        if total > MAX_TABLE_ELEMENTS {
            return Err(wasmtime::Error::msg(format!(
                "table limit exceeded: tried to grow the instance's tables to {total} \
                 elements in all (limit {MAX_TABLE_ELEMENTS})"
            )));
        }
        self.table_elements = total;
        Ok(true)
    }

    fn instances(&self) -> usize {
        MAX_CORE_INSTANCES
    }

    fn memories(&self) -> usize {
        MAX_MEMORIES
    }

    fn tables(&self) -> usize {
        MAX_TABLES
    }
}

#[cfg(test)]
mod tests {
    use wasmtime::{Engine, Instance, Module, Store};

    use super::*;

    /// A store limited to `limit` bytes of memory, and a way to compile modules for it.
    fn store(limit: usize) -> (Store<MemoryLimiter>, impl Fn(&str) -> Module) {
        let engine = Engine::default();
        let mut store = Store::new(&engine, MemoryLimiter::new(limit));
        store.limiter(|l| l);
        let compile = move |wat: &str| Module::new(&engine, wat::parse_str(wat).unwrap()).unwrap();
        (store, compile)
    }

    #[test]
    fn memory_is_limited_over_all_the_memories_of_a_store() {
        let (mut store, compile) = store(10 << 20);
        // 64 pages of 64 KiB.
        let four_mib = compile("(module (memory 64))");
        Instance::new(&mut store, &four_mib, &[]).unwrap();
        Instance::new(&mut store, &four_mib, &[]).unwrap();
        let e = Instance::new(&mut store, &four_mib, &[]).unwrap_err();
        assert!(
            format!("{e:#}").contains("all the instance's memories together"),
            "{e:#}"
        );
        assert_eq!(store.data().peak.load(Ordering::Relaxed), 8 << 20);
    }

    #[test]
    fn a_store_has_few_memories_core_instances_and_table_elements() {
        let (mut store, compile) = store(1 << 30);
        let tiny = compile("(module (memory 1))");
        for _ in 0..MAX_MEMORIES {
            Instance::new(&mut store, &tiny, &[]).unwrap();
        }
        assert!(Instance::new(&mut store, &tiny, &[]).is_err());

        let (mut store, compile) = self::store(1 << 30);
        let empty = compile("(module)");
        for _ in 0..MAX_CORE_INSTANCES {
            Instance::new(&mut store, &empty, &[]).unwrap();
        }
        assert!(Instance::new(&mut store, &empty, &[]).is_err());

        let (mut store, compile) = self::store(1 << 30);
        let half = compile(&format!(
            "(module (table {} funcref))",
            MAX_TABLE_ELEMENTS / 2 + 1
        ));
        Instance::new(&mut store, &half, &[]).unwrap();
        let e = Instance::new(&mut store, &half, &[]).unwrap_err();
        assert!(format!("{e:#}").contains("table limit exceeded"), "{e:#}");
    }
}
