//! The WebAssembly side of the host: the engine and its component cache, loading and
//! checking plugins, and operator instances in their own sandboxed stores.

pub mod bindings;
mod cache;
mod columns;
mod cpu;
mod engine;
mod host;
mod instance;
mod limits;
mod plugin;
mod sandbox;
mod stdio;
mod store;

pub use cache::{CacheOutcome, ComponentCache, content_digest};
pub use cpu::{CpuShares, CpuTenant};
pub use engine::{EPOCH_TICK, EngineSettings, WasmEngine};
pub use instance::WasmOperator;
pub use limits::{DirGrant, MemoryLimitExceeded, SandboxLimits};
pub use plugin::{Plugin, PluginInfo, check_is_component, supported_version};
pub use sandbox::Interrupted;
pub use store::StoreState;
