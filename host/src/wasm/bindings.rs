//! Host bindings for the `sluice:operator@0.1.0` world, generated from `wit/`.
//!
//! This is the only `bindgen!` of the host. The generated `Operator` type instantiates a
//! component and calls its `stream-operator` exports; `sluice::operator::runtime::Host` is
//! the trait the host implements for the operator's imports (in `host.rs`).
//!
//! Imports are `trappable`: a host function can end the guest's call with a trap (used
//! when an operator breaks the contract badly enough that continuing makes no sense).

wasmtime::component::bindgen!({
    path: "../wit",
    world: "operator",
    imports: { default: trappable },
});

/// The WIT package version this host implements; components built for another are
/// refused by name.
pub const WIT_VERSION: &str = "0.1.0";

/// The export every operator must have.
pub const EXPORT_INTERFACE: &str = "sluice:operator/stream-operator";
