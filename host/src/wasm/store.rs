//! What a Wasm operator's `Store` holds.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use parking_lot::Mutex;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

use super::cpu::{CpuShares, CpuTenant};
use super::limits::{MemoryLimiter, SandboxLimits};
use super::sandbox::{CallGuard, wasi_context};
use super::stdio::{GuestOutput, GuestPipe, Stream};
use crate::chain::{OperatorIdentity, OperatorState};

/// The data of one operator instance's `Store`: its sandbox (WASI context and limits,
/// see `sandbox`), its host-managed state, and the bookkeeping of the running call.
pub struct StoreState {
    wasi: WasiCtx,
    table: ResourceTable,
    pub(crate) limiter: MemoryLimiter,
    /// Keyed state, timers, watermark and counters of the instance.
    pub(crate) operator: OperatorState,
    /// Guest stdout/stderr.
    pub(crate) output: Arc<Mutex<GuestOutput>>,
    pub(crate) limits: SandboxLimits,
    /// Set by the task when it is cancelled.
    cancel: Arc<AtomicBool>,
    /// When the current call started (moved on by the time it waited for a core).
    pub(crate) call_started: Instant,
    /// The host's cores, shared between tenants.
    pub(crate) cpu: Arc<CpuShares>,
    /// Whose share the instance's calls take.
    pub(crate) cpu_tenant: CpuTenant,
}

impl StoreState {
    /// State for the instance `identity`.
    pub fn new(
        identity: OperatorIdentity,
        limits: SandboxLimits,
        operator: OperatorState,
        cancel: Arc<AtomicBool>,
        cpu: Arc<CpuShares>,
    ) -> anyhow::Result<Self> {
        let cpu_tenant = CpuTenant {
            name: identity.tenant.as_str().into(),
            weight: limits.cpu_weight,
        };
        let output = GuestOutput::new(identity, limits.log_lines_per_second);
        let wasi = wasi_context(
            &limits,
            GuestPipe::new(output.clone(), Stream::Stdout),
            GuestPipe::new(output.clone(), Stream::Stderr),
        )?;
        Ok(StoreState {
            wasi,
            table: ResourceTable::new(),
            limiter: MemoryLimiter::new(limits.memory_bytes),
            operator,
            output,
            limits,
            cancel,
            call_started: Instant::now(),
            cpu,
            cpu_tenant,
        })
    }

    /// What decides whether the running call may go on.
    pub(crate) fn guard(&self) -> CallGuard {
        CallGuard {
            cancel: self.cancel.clone(),
            deadline: self.limits.call_deadline,
            started: self.call_started,
        }
    }

    /// The table of WASI resources.
    pub(crate) fn table(&mut self) -> &mut ResourceTable {
        &mut self.table
    }

    /// The instance's identity.
    pub fn identity(&self) -> OperatorIdentity {
        self.output.lock().identity().clone()
    }
}

impl WasiView for StoreState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}
