//! The bindings of the `operator` world, generated from the WIT contract
//! (`wit/operator.wit`, copied into the crate as `sdk/wit/operator.wit` so that the
//! published crate carries it; a test keeps the two the same).
//!
//! Only `host::WasmHost` calls the imports and only the glue behind
//! [`crate::export!`] implements the exports; everything else in the SDK works on its own
//! types, so the same code runs natively under [`crate::testing`]. On targets other than
//! `wasm32` wit-bindgen turns the imports into `unreachable!()` stubs, which nothing reaches.
#![allow(
    missing_docs,
    unused_qualifications,
    reason = "generated code: documented by the WIT file, qualified paths are its style"
)]

wit_bindgen::generate!({
    path: "wit",
    world: "operator",
    pub_export_macro: true,
    default_bindings_module: "sluice_sdk::bindings",
});
