//! Host-managed keyed state.
//!
//! Operators read and write keyed state through the `runtime` imports and the effects of
//! their calls; the host keeps it so that a checkpoint can snapshot it in O(1) on the task
//! thread and write it out asynchronously, and so that a restore with another parallelism
//! can redistribute it by key group.

mod account;
mod backend;
pub mod key_groups;
mod keyed;
pub mod lsm;

pub use account::{Account, Holding, InstanceLimits, TenantUsage};
pub use backend::{
    Entry, KeyedStateBackend, KeyedStateSnapshot, StateDescriptor, StateError, StateKind, Value,
    split_composite,
};
pub use keyed::{BackendKind, KeyedSnapshot, KeyedState};
