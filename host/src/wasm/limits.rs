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
        }
    }
}

/// Enforces [`SandboxLimits::memory_bytes`], trapping with a message that says what the
/// operator asked for (rather than letting the allocation fail inside the guest, where a
/// Rust guest aborts without saying why).
#[derive(Debug)]
pub struct MemoryLimiter {
    limit: usize,
    /// Largest linear memory the instance has had, readable from other threads.
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
            "memory limit exceeded: tried to grow linear memory from {} to {} (limit {})",
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
            peak: Arc::default(),
        }
    }
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.limit {
            return Err(wasmtime::Error::new(MemoryLimitExceeded {
                current,
                desired,
                limit: self.limit,
            }));
        }
        self.peak.fetch_max(desired as u64, Ordering::Relaxed);
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 1_000_000)
    }
}
