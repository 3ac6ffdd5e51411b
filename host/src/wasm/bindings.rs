//! Host bindings for the operator worlds the host runs, generated from `wit/`:
//! `sluice:operator@0.3.0` (the current contract, `wit/operator.wit`),
//! `sluice:operator@0.2.0` (`wit/0.2.0/`) and `sluice:operator@0.1.0` (`wit/0.1.0/`), for
//! plugins built before it.
//!
//! These are the only `bindgen!`s of the host. Each generated `Operator` type instantiates
//! a component and calls its `stream-operator` exports; each version's
//! `sluice::operator::runtime::Host` is a trait the host implements for the operator's
//! imports (in `host.rs`). Every version's imports live in one linker: their interface
//! names carry the version.
//!
//! Imports are `trappable`: a host function can end the guest's call with a trap (used
//! when an operator breaks the contract badly enough that continuing makes no sense).

/// `sluice:operator@0.3.0`.
pub mod v3 {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "operator",
        imports: { default: trappable },
    });
}

/// `sluice:operator@0.2.0`.
pub mod v2 {
    wasmtime::component::bindgen!({
        path: "../wit/0.2.0",
        world: "operator",
        imports: { default: trappable },
    });
}

/// `sluice:operator@0.1.0`.
pub mod v1 {
    wasmtime::component::bindgen!({
        path: "../wit/0.1.0",
        world: "operator",
        imports: { default: trappable },
    });
}

/// The WIT package version of the current contract; plugins of an older supported
/// version ([`WIT_VERSIONS`]) still run.
pub const WIT_VERSION: &str = "0.3.0";

/// Every WIT package version this host runs, newest first; components built for another
/// are refused by name.
pub const WIT_VERSIONS: [&str; 3] = ["0.3.0", "0.2.0", "0.1.0"];

/// The export every operator must have.
pub const EXPORT_INTERFACE: &str = "sluice:operator/stream-operator";
