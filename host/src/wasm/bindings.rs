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

/// `process` of `sluice:operator@0.3.0`, called with the batch borrowed.
///
/// bindgen's `call_process` takes a `&Records`, whose `flat` case owns its bytes: a
/// batch the host already holds would be copied into a `Vec` on every call only to be
/// copied again into the guest's memory. [`RecordsRef`] lowers to the same WIT type from
/// borrowed parts.
pub(crate) mod process_v3 {
    use anyhow::Context;
    use wasmtime::component::{
        Component, ComponentExportIndex, ComponentType, Func, Instance, Lower, TypedFunc,
    };
    use wasmtime::{AsContextMut, Store};

    use super::v3::sluice::operator::types::{BatchWatermark, Columns, Error, Processed};
    use super::{EXPORT_INTERFACE, WIT_VERSION};

    /// The WIT `records` variant, borrowing what it holds.
    #[derive(ComponentType, Lower)]
    #[component(variant)]
    pub(crate) enum RecordsRef<'a> {
        #[component(name = "flat")]
        Flat(&'a [u8]),
        #[component(name = "columns")]
        Columns(&'a Columns),
    }

    type Params<'a> = (u32, RecordsRef<'a>, &'a [BatchWatermark]);
    type Results = (Result<Processed, Error>,);

    /// Where `process` is in a component, found once per plugin.
    #[derive(Clone)]
    pub(crate) struct ProcessIndex(ComponentExportIndex);

    impl ProcessIndex {
        pub(crate) fn new(component: &Component) -> anyhow::Result<ProcessIndex> {
            let interface = format!("{EXPORT_INTERFACE}@{WIT_VERSION}");
            let (_, instance) = component
                .get_export(None, &interface)
                .with_context(|| format!("no export {interface}"))?;
            let (_, process) = component
                .get_export(Some(&instance), "process")
                .with_context(|| format!("{interface} has no function process"))?;
            Ok(ProcessIndex(process))
        }

        /// The instance's `process`, its type checked.
        pub(crate) fn load<T>(
            &self,
            store: &mut Store<T>,
            instance: &Instance,
        ) -> anyhow::Result<Process> {
            let func = instance
                .get_func(store.as_context_mut(), self.0)
                .context("process is not a function")?;
            // The type check does not depend on the lifetimes: checked once here with
            // 'static, it holds for every call.
            func.typed::<Params<'static>, Results>(&*store)?;
            Ok(Process(func))
        }
    }

    /// An instance's `process`.
    pub(crate) struct Process(Func);

    impl Process {
        pub(crate) fn call<T>(
            &self,
            store: &mut Store<T>,
            input: u32,
            records: RecordsRef<'_>,
            watermarks: &[BatchWatermark],
        ) -> wasmtime::Result<Result<Processed, Error>> {
            // SAFETY: `load` checked this function's type against these parameter and
            // result types (the lifetimes are not part of the component type).
            let typed = unsafe { TypedFunc::<Params<'_>, Results>::new_unchecked(self.0) };
            let (result,) = typed.call(store.as_context_mut(), (input, records, watermarks))?;
            Ok(result)
        }
    }
}
