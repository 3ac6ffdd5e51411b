//! The guest policy, in one place: what an operator's WASI context grants, the clocks it
//! sees, how long it may wait in a host call, its linear memory, fuel and epoch
//! interruption.
//!
//! - **Nothing is granted** but what the tenant was given explicitly: no environment (but
//!   `SLUICE_MEMORY_BYTES`, the instance's linear memory limit, by which the SDK sizes its
//!   state cache), no arguments, no network, no files outside granted directories. Guest stdout and stderr
//!   go to the host log (rate-limited, see `stdio`).
//! - **No clock moves.** WASI's wall clock reads the epoch and its monotonic clock stands
//!   at zero: an operator's results must not depend on when it runs (it gets the time it
//!   may use from the host: the watermark, timers, `processing-time`).
//! - **Waiting is bounded.** WASI is linked in its blocking form, so a guest that sleeps
//!   or polls waits inside a host call, where epoch interruption cannot reach it. The
//!   `wasi:io/poll` functions are therefore replaced by ones that wait at most until the
//!   call's deadline and give up as soon as the task is cancelled, with the same error a
//!   deadline or cancellation in Wasm code gives.
//! - **Every call is armed** — the instantiation (which runs the component's start code)
//!   as much as each export call: a fresh deadline, a fresh fuel budget.
//! - **Cores are shared by weight** between tenants: a call waits for its tenant's turn,
//!   and a long call gives its core back at an epoch tick when its tenant is over its
//!   share (see `cpu`).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use wasmtime::component::{Linker, Resource};
use wasmtime::{Engine, Store, StoreContextMut};
use wasmtime_wasi::p2::DynPollable;
use wasmtime_wasi::p2::bindings::io::poll::{Host as _, HostPollable as _};
use wasmtime_wasi::{FsPerms, HostMonotonicClock, HostWallClock, WasiCtx};

use super::engine::EPOCH_TICK;
use super::limits::SandboxLimits;
use super::store::StoreState;

/// Why the sandbox ended a call.
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

/// What decides whether the running call may go on: the task's cancellation and the
/// call's deadline. Cheap to copy out of the store, so a host call can check it while it
/// holds the store's data.
#[derive(Debug, Clone)]
pub(crate) struct CallGuard {
    pub(crate) cancel: Arc<AtomicBool>,
    pub(crate) deadline: Option<Duration>,
    pub(crate) started: Instant,
}

impl CallGuard {
    /// Whether the call may go on.
    pub(crate) fn check(&self) -> Result<(), Interrupted> {
        if self.cancel.load(Ordering::Relaxed) {
            return Err(Interrupted::Cancelled);
        }
        match self.deadline {
            Some(deadline) if self.started.elapsed() > deadline => {
                Err(Interrupted::DeadlineExceeded(deadline))
            }
            _ => Ok(()),
        }
    }

    /// Waits for `future`, but no longer than the call may go on.
    fn wait<T>(&self, future: impl Future<Output = T>) -> Result<T, Interrupted> {
        wasmtime_wasi::runtime::in_tokio(async {
            let mut future = std::pin::pin!(future);
            loop {
                self.check()?;
                if let Ok(value) = tokio::time::timeout(EPOCH_TICK, future.as_mut()).await {
                    return Ok(value);
                }
            }
        })
    }
}

/// Links WASI (in its blocking form, with `wasi:io/poll` bounded as the module docs say)
/// into `linker`.
pub(crate) fn add_wasi_to_linker(linker: &mut Linker<StoreState>) -> Result<()> {
    wasmtime_wasi::p2::add_to_linker_sync(linker)?;
    // The replacements must take the place of what wasmtime-wasi linked. Under another
    // version name they would be a second interface nobody imports, and waits would be
    // unbounded again: defining one without shadowing must fail, as the name is taken.
    let taken = linker
        .instance(POLL_INTERFACE)?
        .func_wrap(
            "poll",
            |_: StoreContextMut<'_, StoreState>, (_,): (Vec<Resource<DynPollable>>,)| {
                Ok((Vec::<u32>::new(),))
            },
        )
        .is_err();
    anyhow::ensure!(
        taken,
        "{POLL_INTERFACE} is not the version wasmtime-wasi links: update POLL_INTERFACE"
    );
    linker.allow_shadowing(true);
    let mut poll = linker.instance(POLL_INTERFACE)?;
    poll.func_wrap(
        "poll",
        |mut store: StoreContextMut<'_, StoreState>,
         (pollables,): (Vec<Resource<DynPollable>>,)| {
            let state = store.data_mut();
            let ready = off_core(state, |state, guard| {
                guard.wait(state.table().poll(pollables))
            })
            .map_err(wasmtime::Error::new)?;
            Ok((ready?,))
        },
    )?;
    poll.func_wrap(
        "[method]pollable.block",
        |mut store: StoreContextMut<'_, StoreState>, (pollable,): (Resource<DynPollable>,)| {
            let state = store.data_mut();
            off_core(state, |state, guard| {
                guard.wait(state.table().block(pollable))
            })
            .map_err(wasmtime::Error::new)??;
            Ok(())
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

/// Runs `wait` (a wait inside a host call) with the call's core given back to the other
/// tenants meanwhile: a guest that sleeps uses no CPU and must not hold a share. The time
/// spent waiting for the core again does not count against the call's deadline.
fn off_core<T>(
    state: &mut StoreState,
    wait: impl FnOnce(&mut StoreState, &CallGuard) -> Result<T, Interrupted>,
) -> Result<T, Interrupted> {
    let (cpu, tenant) = (state.cpu.clone(), state.cpu_tenant.clone());
    let guard = state.guard();
    cpu.end(&tenant);
    let result = wait(state, &guard);
    state.call_started += cpu.begin(&tenant);
    result
}

/// The `wasi:io/poll` version `wasmtime-wasi` links (a component importing any 0.2.x
/// version is served by it).
const POLL_INTERFACE: &str = "wasi:io/poll@0.2.12";

/// The WASI context of one instance: see the module docs.
pub(crate) fn wasi_context(
    limits: &SandboxLimits,
    stdout: impl wasmtime_wasi::cli::StdoutStream + 'static,
    stderr: impl wasmtime_wasi::cli::StdoutStream + 'static,
) -> Result<WasiCtx> {
    let mut wasi = WasiCtx::builder();
    wasi.stdout(stdout)
        .stderr(stderr)
        .wall_clock(Frozen)
        .monotonic_clock(Frozen)
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        .env("SLUICE_MEMORY_BYTES", limits.memory_bytes.to_string());
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
    Ok(wasi.build())
}

/// A clock that never moves: the wall clock at the epoch, the monotonic clock at zero.
struct Frozen;

impl HostWallClock for Frozen {
    fn resolution(&self) -> Duration {
        Duration::from_nanos(1)
    }
    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

impl HostMonotonicClock for Frozen {
    fn resolution(&self) -> u64 {
        1
    }
    fn now(&self) -> u64 {
        0
    }
}

/// A store for one instance, with its memory limiter and the epoch callback that ends a
/// call past its deadline or of a cancelled task.
pub(crate) fn new_store(engine: &Engine, data: StoreState) -> Store<StoreState> {
    let mut store = Store::new(engine, data);
    store.limiter(|s| &mut s.limiter);
    store.epoch_deadline_callback(|mut ctx| {
        let data = ctx.data_mut();
        // Give the core to a tenant under its share if this one is over its own; the
        // wait is not the call's time.
        let waited = data.cpu.yield_turn(&data.cpu_tenant);
        data.call_started += waited;
        match data.guard().check() {
            Ok(()) => Ok(wasmtime::UpdateDeadline::Continue(1)),
            Err(interrupted) => Err(wasmtime::Error::new(interrupted)),
        }
    });
    arm(&mut store);
    store
}

/// Starts a call (or the instantiation): its deadline counts from now, and it gets the
/// tenant's fuel budget afresh.
pub(crate) fn arm(store: &mut Store<StoreState>) {
    arm_at(store, Instant::now());
}

/// [`arm`] for a call that starts at `started`.
pub(crate) fn arm_at(store: &mut Store<StoreState>, started: Instant) {
    store.data_mut().call_started = started;
    store.set_epoch_deadline(1);
    if let Some(fuel) = store.data().limits.fuel_per_call {
        // Only stores of engines built for fuel get here (`Plugin::instantiate` checks).
        let _ = store.set_fuel(fuel);
    }
}
