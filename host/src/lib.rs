//! Sluice runs stream operators as sandboxed WebAssembly components.
pub mod chain;
pub mod checkpoint;
pub mod cli;
pub mod cluster;
pub mod connectors;
pub mod failpoints;
pub mod guest_text;
pub mod job;
pub mod mailbox;
pub mod metrics;
pub mod network;
pub mod server;
pub mod state;
pub mod task;
pub mod tenant;
pub mod timers;
pub mod wasm;
