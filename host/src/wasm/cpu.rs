//! Sharing the machine's cores between tenants by weight.
//!
//! Every Wasm call runs on its task's thread, so without a rule a tenant with eight busy
//! subtasks would take eight ninths of the machine from a tenant with one. The rule is a
//! weighted fair share of the cores among the tenants that are running or waiting to run
//! a call: a tenant's share is `cores × its weight / the active tenants' weights`.
//!
//! - A call starts at once when a core is free, unless another tenant is waiting while it
//!   runs fewer calls than its share: then a call of a tenant at or over its share waits
//!   its turn. (So a tenant alone runs at most as many calls at once as there are cores;
//!   the rest of its tasks' work, outside calls, is not held back.)
//! - A running call of a tenant over its share gives its core back at the next epoch tick
//!   when a tenant under its share is waiting (the epoch callback of its store calls
//!   [`CpuShares::yield_turn`]), and goes on when its turn comes again. The time it waited
//!   does not count against its call deadline.
//! - Nobody waits while cores are left over: a tenant alone may use them all.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

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
    state: Mutex<HashMap<Arc<str>, Slot>>,
    turn: Condvar,
    /// Calls waiting to start or go on, over all tenants (read without the lock).
    waiting: AtomicUsize,
}

#[derive(Debug, Default)]
struct Slot {
    weight: u64,
    running: u64,
    waiting: u64,
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
            state: Mutex::new(HashMap::new()),
            turn: Condvar::new(),
            waiting: AtomicUsize::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Arc<str>, Slot>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts a call of `tenant`, after waiting for its turn if it has to; returns how long
    /// it waited.
    pub fn begin(&self, tenant: &CpuTenant) -> Duration {
        let mut state = self.lock();
        let slot = state.entry(tenant.name.clone()).or_default();
        slot.weight = u64::from(tenant.weight.max(1));
        if may_run(&state, &tenant.name, self.cores) {
            state.get_mut(&tenant.name).expect("inserted").running += 1;
            return Duration::ZERO;
        }
        let started = Instant::now();
        state.get_mut(&tenant.name).expect("inserted").waiting += 1;
        self.waiting.fetch_add(1, Ordering::Relaxed);
        while !may_run(&state, &tenant.name, self.cores) {
            state = self.turn.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        let slot = state.get_mut(&tenant.name).expect("inserted");
        slot.waiting -= 1;
        slot.running += 1;
        self.waiting.fetch_sub(1, Ordering::Relaxed);
        // Another waiter may be entitled now as well (shares changed).
        self.turn.notify_all();
        started.elapsed()
    }

    /// Ends a call of `tenant`.
    pub fn end(&self, tenant: &CpuTenant) {
        let mut state = self.lock();
        if let Some(slot) = state.get_mut(&tenant.name) {
            slot.running = slot.running.saturating_sub(1);
            if slot.running == 0 && slot.waiting == 0 {
                state.remove(&tenant.name);
            }
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
            let total = active_weight(&state);
            let over = slot.running * total > self.cores * slot.weight;
            if !over || !someone_else_entitled(&state, &tenant.name, self.cores) {
                return Duration::ZERO;
            }
        }
        self.end(tenant);
        self.begin(tenant)
    }
}

fn active_weight(state: &HashMap<Arc<str>, Slot>) -> u64 {
    state
        .values()
        .filter(|s| s.running + s.waiting > 0)
        .map(|s| s.weight)
        .sum::<u64>()
        .max(1)
}

/// Whether a tenant other than `me` waits while running fewer calls than its share.
fn someone_else_entitled(state: &HashMap<Arc<str>, Slot>, me: &str, cores: u64) -> bool {
    let total = active_weight(state);
    state
        .iter()
        .any(|(name, s)| &**name != me && s.waiting > 0 && s.running * total < cores * s.weight)
}

/// Whether a call of `me` may run now: when a core is free, and `me` is under its share
/// or nobody else is waiting under theirs.
fn may_run(state: &HashMap<Arc<str>, Slot>, me: &str, cores: u64) -> bool {
    let running: u64 = state.values().map(|s| s.running).sum();
    if running >= cores {
        return false;
    }
    let total = active_weight(state);
    let slot = &state[me];
    slot.running * total < cores * slot.weight || !someone_else_entitled(state, me, cores)
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

    #[test]
    fn a_tenant_alone_uses_every_core() {
        let shares = CpuShares::new(2);
        let a = tenant("a", 1);
        assert_eq!(shares.begin(&a), Duration::ZERO);
        assert_eq!(shares.begin(&a), Duration::ZERO);
        assert_eq!(shares.yield_turn(&a), Duration::ZERO);
        shares.end(&a);
        shares.end(&a);
        assert!(shares.lock().is_empty());
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
        // of a's calls gives its core to b, and goes on once b's call is done.
        let yielded = shares.yield_turn(&a);
        let waited = waiter.join().unwrap();
        assert!(waited > Duration::ZERO);
        assert!(yielded > Duration::ZERO);
        // Nobody waits now: no more yielding.
        assert_eq!(shares.yield_turn(&a), Duration::ZERO);
        shares.end(&a);
        shares.end(&a);
        assert!(shares.lock().is_empty());
    }

    #[test]
    fn weights_set_the_shares() {
        let shares = CpuShares::new(4);
        let (a, b) = (tenant("a", 3), tenant("b", 1));
        let mut state = shares.lock();
        state.insert(
            a.name.clone(),
            Slot {
                weight: 3,
                running: 3,
                waiting: 0,
            },
        );
        state.insert(
            b.name.clone(),
            Slot {
                weight: 1,
                running: 0,
                waiting: 1,
            },
        );
        // a's share is 3 of 4 cores, b's 1: a may not start a fourth call while b waits,
        // b may start its first.
        assert!(!may_run(&state, "a", 4));
        assert!(may_run(&state, "b", 4));
        // Below its share, a may start a call even while b waits.
        state.get_mut("a").unwrap().running = 2;
        assert!(may_run(&state, "a", 4));
    }
}
