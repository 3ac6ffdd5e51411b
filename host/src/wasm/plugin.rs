//! Loading an operator component from a file, with the checks that turn bad input into
//! errors a person can act on.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::{Context, Result, bail};
use wasmtime::component::Component;
use wasmtime::component::types::ComponentItem;

use super::bindings::process_v3::ProcessIndex;
use super::bindings::{EXPORT_INTERFACE, WIT_VERSION, WIT_VERSIONS, v1, v2, v3};
use super::cache::{CacheOutcome, content_digest};
use super::cpu::CpuShares;
use super::engine::WasmEngine;
use super::instance::{Bindings, WasmOperator};
use super::limits::SandboxLimits;
use super::sandbox;
use super::store::StoreState;
use crate::chain::{OperatorIdentity, OperatorState};

/// A checked, compiled operator component, ready to instantiate many times.
#[derive(Clone)]
pub struct Plugin {
    /// The file it was loaded from.
    pub path: PathBuf,
    /// SHA-256 of its bytes.
    pub digest: String,
    /// Size of the file.
    pub size: u64,
    /// Whether it was compiled now or came from a cache.
    pub compiled: CacheOutcome,
    /// What it exports and imports.
    pub info: PluginInfo,
    /// Whether it was compiled for fuel metering.
    pub metered: bool,
    engine: wasmtime::Engine,
    pre: Pre,
    cpu: Arc<CpuShares>,
}

/// A component ready to instantiate, of its WIT version.
#[derive(Clone)]
enum Pre {
    V3(v3::OperatorPre<StoreState>, ProcessIndex),
    V2(v2::OperatorPre<StoreState>),
    V1(v1::OperatorPre<StoreState>),
}

/// What `sluice inspect` shows about a component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginInfo {
    /// The operator interface it exports, with version.
    pub interface: String,
    /// Functions of that interface.
    pub calls: Vec<String>,
    /// Types of that interface.
    pub types: Vec<String>,
    /// Interfaces it imports.
    pub imports: Vec<String>,
    /// The config keys it accepts, when it declares them (its `sluice:config-keys`
    /// custom section, which the SDK's `config_keys!` writes).
    pub config_keys: Option<Vec<String>>,
}

/// Name of the custom section that lists the config keys a plugin accepts, one per line.
pub const CONFIG_KEYS_SECTION: &str = "sluice:config-keys";

/// The config keys `bytes` (a component) declares, if it does: the lines of its
/// `sluice:config-keys` custom section, in its own or in a module inside it.
fn declared_config_keys(bytes: &[u8]) -> Option<Vec<String>> {
    for payload in wasmparser::Parser::new(0).parse_all(bytes) {
        if let Ok(wasmparser::Payload::CustomSection(section)) = payload
            && section.name() == CONFIG_KEYS_SECTION
        {
            let text = String::from_utf8_lossy(section.data());
            return Some(
                text.lines()
                    .map(|l| crate::guest_text::printable(l.trim()).into_owned())
                    .filter(|l| !l.is_empty())
                    .collect(),
            );
        }
    }
    None
}

impl fmt::Debug for Plugin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Plugin")
            .field("path", &self.path)
            .field("digest", &self.digest)
            .finish()
    }
}

/// What kind of file a byte string is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WasmKind {
    NotWasm,
    CoreModule,
    Component,
    Unknown,
}

fn wasm_kind(bytes: &[u8]) -> WasmKind {
    if wasmparser::Parser::is_component(bytes) {
        WasmKind::Component
    } else if wasmparser::Parser::is_core_wasm(bytes) {
        WasmKind::CoreModule
    } else if bytes.len() < 8 || !bytes.starts_with(b"\0asm") {
        WasmKind::NotWasm
    } else {
        WasmKind::Unknown
    }
}

/// Refuses `bytes` (of the file at `path`) unless they are a WebAssembly component: a
/// check of their first bytes, before anything compiles them.
pub fn check_is_component(bytes: &[u8], path: &Path) -> Result<()> {
    match wasm_kind(bytes) {
        WasmKind::Component => Ok(()),
        WasmKind::NotWasm => bail!(
            "{} is not a WebAssembly file (it does not start with the `\\0asm` magic bytes)",
            path.display()
        ),
        WasmKind::CoreModule => bail!(
            "{} is a core WebAssembly module, not a component: build the plugin with \
             `cargo build --target wasm32-wasip2` (which produces a component), or wrap \
             the module with `wasm-tools component new`",
            path.display()
        ),
        WasmKind::Unknown => bail!(
            "{} has an unsupported WebAssembly binary version {:?}",
            path.display(),
            &bytes[4..8]
        ),
    }
}

impl Plugin {
    /// Reads `path`, checks that it is a component exporting this host's version of
    /// the operator interface, and compiles it (or takes it from the cache).
    pub fn load(engine: &WasmEngine, path: &Path, fuel: bool) -> Result<Plugin> {
        let bytes = std::fs::read(path)
            .with_context(|| format!("cannot read plugin file {}", path.display()))?;
        check_is_component(&bytes, path)?;
        let wasmtime_engine = engine.engine_for(fuel)?;
        let (component, compiled) = engine
            .cache()
            .get_or_compile(wasmtime_engine, &bytes, path)
            .with_context(|| format!("{} is not a valid component", path.display()))?;
        let mut info = check_interface(wasmtime_engine, &component)
            .with_context(|| format!("{} cannot be used as an operator", path.display()))?;
        info.config_keys = declared_config_keys(&bytes);
        let pre = engine
            .linker_for(fuel)?
            .instantiate_pre(&component)
            .map_err(anyhow::Error::from)
            .with_context(|| {
                format!(
                    "{} needs imports that Sluice does not provide (operators may import only \
                     sluice:operator/runtime of their version and WASI 0.2)",
                    path.display()
                )
            })?;
        let pre = if info.interface.ends_with("@0.1.0") {
            v1::OperatorPre::new(pre)
                .map(Pre::V1)
                .map_err(anyhow::Error::from)
        } else if info.interface.ends_with("@0.2.0") {
            v2::OperatorPre::new(pre)
                .map(Pre::V2)
                .map_err(anyhow::Error::from)
        } else {
            ProcessIndex::new(&component).and_then(|process| {
                v3::OperatorPre::new(pre)
                    .map(|pre| Pre::V3(pre, process))
                    .map_err(anyhow::Error::from)
            })
        }
        .with_context(|| format!("{} does not match the operator world", path.display()))?;
        Ok(Plugin {
            path: path.to_path_buf(),
            digest: content_digest(&bytes),
            size: bytes.len() as u64,
            compiled,
            info,
            metered: fuel,
            engine: wasmtime_engine.clone(),
            pre,
            cpu: engine.cpu().clone(),
        })
    }

    /// A new, isolated instance in its own `Store`.
    pub fn instantiate(
        &self,
        identity: OperatorIdentity,
        limits: SandboxLimits,
        state: OperatorState,
        cancel: Arc<AtomicBool>,
    ) -> Result<WasmOperator> {
        if limits.fuel_per_call.is_some() && !self.metered {
            anyhow::bail!(
                "{identity}: its tenant has a fuel budget, but {} was compiled without fuel metering",
                self.path.display()
            );
        }
        let data = StoreState::new(identity.clone(), limits, state, cancel, self.cpu.clone())
            .with_context(|| format!("{identity}: setting up its sandbox"))?;
        let mut store = sandbox::new_store(&self.engine, data);
        // Instantiating runs the component's start code: a call like any other.
        let tenant = store.data().cpu_tenant.clone();
        self.cpu.begin(&tenant);
        sandbox::arm(&mut store);
        let bindings = match &self.pre {
            Pre::V3(pre, process) => pre
                .instance_pre()
                .instantiate(&mut store)
                .map_err(anyhow::Error::from)
                .and_then(|instance| {
                    let operator = v3::Operator::new(&mut store, &instance)?;
                    let process = process.load(&mut store, &instance)?;
                    Ok(Bindings::V3(
                        operator,
                        v3::sluice::operator::types::Layout::Flat,
                        process,
                    ))
                }),
            Pre::V2(pre) => pre
                .instantiate(&mut store)
                .map(Bindings::V2)
                .map_err(anyhow::Error::from),
            Pre::V1(pre) => pre
                .instantiate(&mut store)
                .map(Bindings::V1)
                .map_err(anyhow::Error::from),
        };
        self.cpu.end(&tenant);
        let bindings = bindings
            .with_context(|| format!("{identity}: instantiating {} failed", self.path.display()))?;
        Ok(WasmOperator::new(store, bindings, identity))
    }
}

/// Finds the operator export and checks its version.
fn check_interface(engine: &wasmtime::Engine, component: &Component) -> Result<PluginInfo> {
    let ty = component.component_type();
    let exports: Vec<(String, ComponentItem)> = ty
        .exports(engine)
        .map(|(name, item)| (name.to_string(), item.ty))
        .collect();
    let imports: Vec<String> = ty
        .imports(engine)
        .map(|(name, _)| name.to_string())
        .collect();
    let wanted = format!("{EXPORT_INTERFACE}@{WIT_VERSION}");
    let supported = supported_versions_sentence();
    let Some((name, item)) = exports
        .iter()
        .find(|(name, _)| name.starts_with(EXPORT_INTERFACE))
    else {
        let names: Vec<&str> = exports.iter().map(|(n, _)| n.as_str()).collect();
        bail!(
            "it does not export `{wanted}`, so it is not a Sluice operator (it exports: {})",
            if names.is_empty() {
                "nothing".to_string()
            } else {
                names.join(", ")
            }
        );
    };
    let version = name.rsplit_once('@').map_or("no version", |(_, v)| v);
    if name.strip_prefix(EXPORT_INTERFACE) != Some(&format!("@{version}"))
        || !WIT_VERSIONS.contains(&version)
    {
        bail!(
            "it was built for sluice:operator@{version}, but this host supports \
             {supported}; rebuild it against this version of the SDK"
        );
    }
    let (mut calls, mut types) = (Vec::new(), Vec::new());
    if let ComponentItem::ComponentInstance(instance) = item {
        for (n, export) in instance.exports(engine) {
            match export.ty {
                ComponentItem::ComponentFunc(_) => calls.push(n.to_string()),
                _ => types.push(n.to_string()),
            }
        }
    }
    Ok(PluginInfo {
        interface: name.clone(),
        calls,
        types,
        imports,
        config_keys: None,
    })
}

/// The WIT versions this host supports, newest first.
pub fn supported_version() -> String {
    WIT_VERSIONS
        .map(|v| format!("sluice:operator@{v}"))
        .join(", ")
}

/// The same, as a sentence says them ("…, … and …").
fn supported_versions_sentence() -> String {
    let names = WIT_VERSIONS.map(|v| format!("sluice:operator@{v}"));
    match names.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sdk_carries_the_same_contract_as_the_host() {
        assert_eq!(
            include_str!("../../../sdk/wit/operator.wit"),
            include_str!("../../../wit/operator.wit"),
            "sdk/wit/operator.wit must be a copy of wit/operator.wit"
        );
    }

    #[test]
    fn recognises_file_kinds_by_header() {
        assert_eq!(wasm_kind(b"hello world"), WasmKind::NotWasm);
        assert_eq!(wasm_kind(b"\0asm"), WasmKind::NotWasm);
        assert_eq!(wasm_kind(b"\0asm\x01\0\0\0"), WasmKind::CoreModule);
        assert_eq!(wasm_kind(b"\0asm\x0d\0\x01\0"), WasmKind::Component);
        assert_eq!(wasm_kind(b"\0asm\x02\0\0\0"), WasmKind::Unknown);
    }
}
