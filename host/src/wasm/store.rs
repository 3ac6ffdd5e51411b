//! What a Wasm operator's `Store` holds.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxView, WasiView};

use super::limits::{MemoryLimiter, SandboxLimits};
use super::stdio::{GuestOutput, GuestPipe, Stream};
use crate::chain::{OperatorIdentity, OperatorState};

/// Why the epoch callback ended a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interrupted {
    /// The task was cancelled.
    Cancelled,
    /// The call ran past its deadline.
    DeadlineExceeded(Duration),
}

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Interrupted::Cancelled => f.write_str("interrupted because the task was cancelled"),
            Interrupted::DeadlineExceeded(d) => {
                write!(f, "interrupted after exceeding the call deadline of {d:?}")
            }
        }
    }
}

impl std::error::Error for Interrupted {}

/// The data of one operator instance's `Store`: its sandbox (WASI context granting
/// nothing, limits), its host-managed state, and the bookkeeping of the running call.
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
    /// When the current call started.
    pub(crate) call_started: Instant,
}

impl StoreState {
    /// State for the instance `identity`.
    pub fn new(
        identity: OperatorIdentity,
        limits: SandboxLimits,
        operator: OperatorState,
        cancel: Arc<AtomicBool>,
    ) -> anyhow::Result<Self> {
        let output = GuestOutput::new(identity, limits.log_lines_per_second);
        // Nothing is granted but what the tenant was given explicitly: no environment,
        // no arguments, no network, no files outside granted directories. Guest stdout and
        // stderr go to the host log.
        let mut wasi = WasiCtx::builder();
        wasi.stdout(GuestPipe::new(output.clone(), Stream::Stdout))
            .stderr(GuestPipe::new(output.clone(), Stream::Stderr))
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false);
        for grant in &limits.dirs {
            let perms = if grant.read_only {
                FsPerms::ReadOnly
            } else {
                FsPerms::ReadWrite
            };
            wasi.preopened_dir(&grant.host, &grant.guest, perms)
                .map_err(anyhow::Error::from)
                .with_context(|| format!("granting directory {}", grant.host.display()))?;
        }
        let wasi = wasi.build();
        Ok(StoreState {
            wasi,
            table: ResourceTable::new(),
            limiter: MemoryLimiter::new(limits.memory_bytes),
            operator,
            output,
            limits,
            cancel,
            call_started: Instant::now(),
        })
    }

    /// Decides, at each epoch tick during a call, whether the call may go on.
    pub(crate) fn check_interrupt(&self) -> Result<(), Interrupted> {
        if self.cancel.load(Ordering::Relaxed) {
            return Err(Interrupted::Cancelled);
        }
        match self.limits.call_deadline {
            Some(deadline) if self.call_started.elapsed() > deadline => {
                Err(Interrupted::DeadlineExceeded(deadline))
            }
            _ => Ok(()),
        }
    }

    /// The instance's identity.
    pub fn identity(&self) -> OperatorIdentity {
        self.output
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .identity()
            .clone()
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
