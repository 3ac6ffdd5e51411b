//! Sharing the machine's cores between tenants by weight.
//!
//! Every Wasm call runs on its task's thread, so without a rule a tenant with eight busy
//! subtasks would take eight ninths of the machine from a tenant with one. The rule is a
//! weighted fair share of the cores among the *active* tenants — those with a call
//! running or waiting, or that ended one within the last [`ACTIVE_WINDOW`] (a task works
//! between its calls too): a tenant's share is `cores × its weight / the active tenants'
//! weights`.
//!
//! - A call starts when a core is free and its tenant runs fewer calls than its share, or
//!   when no other active tenant has share left unused. So a quiet tenant's next call
//!   finds its core free, instead of waiting for a busy tenant to give one back.
//! - A running call of a tenant over its share gives its core back at the next epoch tick
//!   when another tenant has share left unused and is waiting (the epoch callback of its
//!   store calls [`CpuShares::yield_turn`]), and goes on when its turn comes again. The
//!   time it waited does not count against its call deadline.
//! - A tenant alone, or whose neighbours went quiet, may use every core. A tenant never
//!   runs more calls at once than there are cores (the rest of its tasks' work, outside
//!   calls, is not held back).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};

/// How long after its last call a tenant still counts as active (keeps its share).
pub const ACTIVE_WINDOW: Duration = Duration::from_millis(50);

/// The tenant a call runs for, with its weight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuTenant {
    /// The tenant's name.
    pub name: Arc<str>,
    /// Its weight (at least 1).
    pub weight: u32,
}

/// The shares of one host's cores.
#[derive(Debug)]
pub struct CpuShares {
    cores: u64,
    state: Mutex<Tenants>,
    turn: Condvar,
    /// Calls waiting to start or go on, over all tenants (read without the lock).
    waiting: AtomicUsize,
    /// A clock that [`CpuShares::tick`] moves on (the engine's epoch ticker, every
    /// [`EPOCH_TICK`](super::EPOCH_TICK)): nanoseconds since `origin`. A call's end is
    /// dated by it, which saves reading the system clock (a quarter of the bookkeeping's
    /// cost) for a time that only needs to be good to a tick: it decides whether the
    /// tenant is still active [`ACTIVE_WINDOW`] later.
    origin: Instant,
    ticked_ns: AtomicU64,
}

/// The tenants with calls on this host: a handful, so a list searched in order is
/// quicker than a hash of each name on every call.
#[derive(Debug, Default)]
struct Tenants(Vec<(Arc<str>, Slot)>);

impl Tenants {
    fn get(&self, name: &str) -> Option<&Slot> {
        self.0.iter().find(|(n, _)| &**n == name).map(|(_, s)| s)
    }

    fn get_mut(&mut self, name: &str) -> Option<&mut Slot> {
        self.0
            .iter_mut()
            .find(|(n, _)| &**n == name)
            .map(|(_, s)| s)
    }

    /// The slot of `name`, made with `new` if it has none.
    fn entry(&mut self, name: &Arc<str>, new: impl FnOnce() -> Slot) -> &mut Slot {
        let i = match self.0.iter().position(|(n, _)| n == name) {
            Some(i) => i,
            None => {
                self.0.push((name.clone(), new()));
                self.0.len() - 1
            }
        };
        &mut self.0[i].1
    }

    #[cfg(test)]
    fn insert(&mut self, name: &str, slot: Slot) {
        *self.entry(&name.into(), || slot.clone()) = slot.clone();
    }

    fn retain(&mut self, keep: impl Fn(&Slot) -> bool) {
        self.0.retain(|(_, s)| keep(s));
    }

    fn iter(&self) -> impl Iterator<Item = (&str, &Slot)> {
        self.0.iter().map(|(n, s)| (&**n, s))
    }

    fn values(&self) -> impl Iterator<Item = &Slot> {
        self.0.iter().map(|(_, s)| s)
    }
}

#[derive(Debug, Clone)]
struct Slot {
    weight: u64,
    running: u64,
    waiting: u64,
    /// When a call of the tenant last started or ended.
    last_call: Instant,
}

impl Slot {
    fn new(weight: u64) -> Self {
        Slot {
            weight,
            running: 0,
            waiting: 0,
            last_call: Instant::now(),
        }
    }

    fn is_active(&self, now: Instant) -> bool {
        self.running + self.waiting > 0 || now.duration_since(self.last_call) < ACTIVE_WINDOW
    }
}

impl Default for CpuShares {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        CpuShares::new(cores)
    }
}

impl CpuShares {
    /// Shares of `cores` cores.
    pub fn new(cores: usize) -> Self {
        CpuShares {
            cores: cores.max(1) as u64,
            state: Mutex::new(Tenants::default()),
            turn: Condvar::new(),
            waiting: AtomicUsize::new(0),
            origin: Instant::now(),
            ticked_ns: AtomicU64::new(0),
        }
    }

    /// Moves the clock that dates the ends of calls to now. Called by the engine's epoch
    /// ticker; without ticks, a call's end is dated at its start.
    pub fn tick(&self) {
        let ns = u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.ticked_ns.fetch_max(ns, Ordering::Relaxed);
    }

    /// The time of the last [`CpuShares::tick`].
    fn ticked(&self) -> Instant {
        self.origin + Duration::from_nanos(self.ticked_ns.load(Ordering::Relaxed))
    }

    fn lock(&self) -> MutexGuard<'_, Tenants> {
        self.state.lock()
    }

    /// Starts a call of `tenant`, after waiting for its turn if it has to; returns how long
    /// it waited.
    pub fn begin(&self, tenant: &CpuTenant) -> Duration {
        self.start(tenant).0
    }

    /// [`CpuShares::begin`], returning also when the call starts (after the wait).
    pub fn start(&self, tenant: &CpuTenant) -> (Duration, Instant) {
        let mut state = self.lock();
        let now = Instant::now();
        // Tenants quiet for long are forgotten.
        state.retain(|s| s.is_active(now));
        let weight = u64::from(tenant.weight.max(1));
        state.entry(&tenant.name, || Slot::new(weight)).weight = weight;
        if may_run(&state, &tenant.name, self.cores, now) {
            let slot = state.get_mut(&tenant.name).expect("inserted");
            slot.running += 1;
            slot.last_call = now;
            return (Duration::ZERO, now);
        }
        state.get_mut(&tenant.name).expect("inserted").waiting += 1;
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let started = loop {
            // Woken when a call ends; also when a neighbour may have gone quiet.
            self.turn.wait_for(&mut state, ACTIVE_WINDOW);
            let at = Instant::now();
            if may_run(&state, &tenant.name, self.cores, at) {
                break at;
            }
        };
        let slot = state.get_mut(&tenant.name).expect("inserted");
        slot.waiting -= 1;
        slot.running += 1;
        slot.last_call = started;
        self.waiting.fetch_sub(1, Ordering::Relaxed);
        (started - now, started)
    }

    /// Ends a call of `tenant`, dated at the last tick (at most a tick early) or at the
    /// latest start of its calls if that is later.
    pub fn end(&self, tenant: &CpuTenant) {
        let ticked = self.ticked();
        let mut state = self.lock();
        if let Some(slot) = state.get_mut(&tenant.name) {
            slot.running = slot.running.saturating_sub(1);
            slot.last_call = slot.last_call.max(ticked);
        }
        drop(state);
        if self.waiting.load(Ordering::Relaxed) > 0 {
            self.turn.notify_all();
        }
    }

    /// At an epoch tick of a running call of `tenant`: when it is over its share and a
    /// tenant under its share waits, gives the core back and waits for its turn again.
    /// Returns how long it waited.
    pub fn yield_turn(&self, tenant: &CpuTenant) -> Duration {
        if self.waiting.load(Ordering::Relaxed) == 0 {
            return Duration::ZERO;
        }
        {
            let state = self.lock();
            let Some(slot) = state.get(&tenant.name) else {
                return Duration::ZERO;
            };
            let now = Instant::now();
            let total = active_weight(&state, now);
            let over = slot.running * total > self.cores * slot.weight;
            let someone_waits = state
                .iter()
                .any(|(name, s)| name != &*tenant.name && s.waiting > 0);
            if !over
                || !someone_waits
                || !share_left_to_others(&state, &tenant.name, self.cores, now)
            {
                return Duration::ZERO;
            }
        }
        self.end(tenant);
        self.begin(tenant)
    }
}

fn active_weight(state: &Tenants, now: Instant) -> u64 {
    state
        .values()
        .filter(|s| s.is_active(now))
        .map(|s| s.weight)
        .sum::<u64>()
        .max(1)
}

/// Whether an active tenant other than `me` runs fewer calls than its share.
fn share_left_to_others(state: &Tenants, me: &str, cores: u64, now: Instant) -> bool {
    let total = active_weight(state, now);
    state
        .iter()
        .any(|(name, s)| name != me && s.is_active(now) && s.running * total < cores * s.weight)
}

/// Whether a call of `me` may run now: when a core is free, and `me` is under its share
/// or no other active tenant has share left.
fn may_run(state: &Tenants, me: &str, cores: u64, now: Instant) -> bool {
    let running: u64 = state.values().map(|s| s.running).sum();
    if running >= cores {
        return false;
    }
    let total = active_weight(state, now);
    let Some(slot) = state.get(me) else {
        return false;
    };
    slot.running * total < cores * slot.weight || !share_left_to_others(state, me, cores, now)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(name: &str, weight: u32) -> CpuTenant {
        CpuTenant {
            name: name.into(),
            weight,
        }
    }

    fn idle(shares: &CpuShares) -> bool {
        shares
            .lock()
            .values()
            .all(|s| s.running == 0 && s.waiting == 0)
    }

    #[test]
    fn a_tenant_alone_uses_every_core() {
        let shares = CpuShares::new(2);
        let a = tenant("a", 1);
        assert_eq!(shares.begin(&a), Duration::ZERO);
        assert_eq!(shares.begin(&a), Duration::ZERO);
        assert_eq!(shares.yield_turn(&a), Duration::ZERO);
        shares.end(&a);
        shares.end(&a);
        assert!(idle(&shares));
    }

    #[test]
    fn a_tenant_over_its_share_yields_to_one_under_it() {
        let shares = Arc::new(CpuShares::new(2));
        let (a, b) = (tenant("a", 1), tenant("b", 1));
        // a runs on both cores; b's call waits for one.
        shares.begin(&a);
        shares.begin(&a);
        let waiter = {
            let (shares, b) = (shares.clone(), b.clone());
            std::thread::spawn(move || {
                let waited = shares.begin(&b);
                shares.end(&b);
                waited
            })
        };
        while shares.waiting.load(Ordering::Relaxed) == 0 {
            std::thread::yield_now();
        }
        // With b waiting, a is over its share (one core of two): at its next tick one
        // of a's calls gives its core to b, and goes on once b is no longer active.
        let yielded = shares.yield_turn(&a);
        let waited = waiter.join().unwrap();
        assert!(waited > Duration::ZERO);
        assert!(yielded >= ACTIVE_WINDOW / 2, "{yielded:?}");
        // Nobody waits now: no more yielding.
        assert_eq!(shares.yield_turn(&a), Duration::ZERO);
        shares.end(&a);
        shares.end(&a);
        assert!(idle(&shares));
    }

    #[test]
    fn a_call_ends_at_the_last_tick_or_its_start() {
        let shares = CpuShares::new(2);
        let a = tenant("a", 1);
        let last_call = |shares: &CpuShares| shares.lock().get("a").unwrap().last_call;
        // No tick since the call started: its end is dated at its start.
        let (_, started) = shares.start(&a);
        shares.end(&a);
        assert_eq!(last_call(&shares), started);
        // A tick after the start dates the end (a long call keeps its tenant active for
        // the window after it ended, not after it started).
        let (_, started) = shares.start(&a);
        let later = started - shares.origin + ACTIVE_WINDOW * 4;
        shares
            .ticked_ns
            .store(later.as_nanos() as u64, Ordering::Relaxed);
        shares.end(&a);
        assert_eq!(last_call(&shares), shares.origin + later);
        assert!(
            shares
                .lock()
                .get("a")
                .unwrap()
                .is_active(started + ACTIVE_WINDOW * 4)
        );
        // The clock only moves on.
        shares.tick();
        assert_eq!(shares.ticked(), shares.origin + later);
    }

    fn slot(weight: u64, running: u64, waiting: u64, ago: Duration) -> Slot {
        Slot {
            weight,
            running,
            waiting,
            last_call: Instant::now() - ago,
        }
    }

    #[test]
    fn weights_set_the_shares_and_a_quiet_tenant_keeps_its_share_while_active() {
        let shares = CpuShares::new(4);
        let now = Instant::now();
        let mut state = shares.lock();
        state.insert("a", slot(3, 3, 0, Duration::ZERO));
        state.insert("b", slot(1, 0, 1, Duration::ZERO));
        // a's share is 3 of 4 cores, b's 1: a may not take the fourth core from b, and b
        // may start its first call.
        assert!(!may_run(&state, "a", 4, now));
        assert!(may_run(&state, "b", 4, now));
        // Below its share, a may start a call whatever b does.
        state.get_mut("a").unwrap().running = 2;
        assert!(may_run(&state, "a", 4, now));
        // b between two calls, a moment ago: its core stays free for it.
        state.insert("b", slot(1, 0, 0, Duration::from_millis(1)));
        state.get_mut("a").unwrap().running = 3;
        assert!(!may_run(&state, "a", 4, Instant::now()));
        // b quiet for longer than the window: a may use every core.
        state.insert("b", slot(1, 0, 0, ACTIVE_WINDOW * 2));
        assert!(may_run(&state, "a", 4, Instant::now()));
    }
}
