//! What operators make the host hold, charged to the instance and to its tenant.
//!
//! Linear memory is bounded by the Wasm limiter; this bounds what lives outside it, in
//! host memory, because a guest asked for it: keyed state, timers and counter names.
//! Every instance has an [`Account`]; after each call's effects are applied it compares
//! what the instance holds with its own limits and charges the change to its tenant's
//! [`TenantUsage`], shared by all the tenant's instances in the host. A breach is an
//! error naming the limit, the tenant and what was held, and fails the task; the
//! instance's charge is given back when it is dropped.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// What all of one tenant's instances in this host hold, against the tenant's limits.
#[derive(Debug)]
pub struct TenantUsage {
    tenant: String,
    state_bytes: AtomicU64,
    timers: AtomicU64,
    max_state_bytes: u64,
    max_timers: u64,
}

impl TenantUsage {
    /// Usage of `tenant`, limited to `max_state_bytes` of keyed state and `max_timers`.
    pub fn new(tenant: &str, max_state_bytes: u64, max_timers: u64) -> Self {
        TenantUsage {
            tenant: tenant.to_string(),
            state_bytes: AtomicU64::new(0),
            timers: AtomicU64::new(0),
            max_state_bytes,
            max_timers,
        }
    }

    /// Keyed-state bytes held now.
    pub fn state_bytes(&self) -> u64 {
        self.state_bytes.load(Ordering::Relaxed)
    }

    /// Timers held now.
    pub fn timers(&self) -> u64 {
        self.timers.load(Ordering::Relaxed)
    }
}

/// The host-side limits of one instance (from its tenant's sandbox limits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstanceLimits {
    /// Keyed-state bytes.
    pub state_bytes: u64,
    /// Timers.
    pub timers: u64,
    /// Distinct counter names.
    pub counters: usize,
    /// Longest counter name (and other guest strings) kept.
    pub string_bytes: usize,
}

impl Default for InstanceLimits {
    fn default() -> Self {
        InstanceLimits {
            state_bytes: u64::MAX,
            timers: u64::MAX,
            counters: usize::MAX,
            string_bytes: usize::MAX,
        }
    }
}

/// What one instance holds, as last charged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Holding {
    /// Keyed-state bytes.
    pub state_bytes: u64,
    /// Timers.
    pub timers: u64,
}

/// One instance's account with its tenant.
#[derive(Debug)]
pub struct Account {
    limits: InstanceLimits,
    tenant: Option<Arc<TenantUsage>>,
    charged: Holding,
}

impl Default for Account {
    /// An account without limits or tenant (tests, benchmarks, native operators).
    fn default() -> Self {
        Account::new(InstanceLimits::default(), None)
    }
}

impl Clone for Account {
    /// A copy charges nothing: it is the state of a snapshot, not a second instance.
    fn clone(&self) -> Self {
        Account::new(self.limits, self.tenant.clone())
    }
}

impl Account {
    /// An account under `limits`, charging `tenant` when there is one.
    pub fn new(limits: InstanceLimits, tenant: Option<Arc<TenantUsage>>) -> Self {
        Account {
            limits,
            tenant,
            charged: Holding::default(),
        }
    }

    /// The instance's limits.
    pub fn limits(&self) -> &InstanceLimits {
        &self.limits
    }

    /// Whether the instance may hold `now`, by its own limits (not its tenant's; see
    /// [`Account::charge`]), when it grew since it was last charged.
    pub fn check(&self, now: Holding) -> Result<(), String> {
        if now.state_bytes > self.charged.state_bytes && now.state_bytes > self.limits.state_bytes {
            return Err(state_over(now.state_bytes, self.limits.state_bytes));
        }
        if now.timers > self.charged.timers && now.timers > self.limits.timers {
            return Err(timers_over(now.timers, self.limits.timers));
        }
        Ok(())
    }

    /// Charges what the instance holds now. On a breach the new holding stays charged
    /// (it is held, after all) and the error says which limit; the task fails and the
    /// charge is given back when the instance is dropped.
    pub fn charge(&mut self, now: Holding) -> Result<(), String> {
        if now == self.charged {
            return Ok(());
        }
        let before = std::mem::replace(&mut self.charged, now);
        let tenant = self.tenant.as_deref();
        let tenant_state =
            tenant.map(|t| adjust(&t.state_bytes, before.state_bytes, now.state_bytes));
        let tenant_timers = tenant.map(|t| adjust(&t.timers, before.timers, now.timers));
        if now.state_bytes > before.state_bytes && now.state_bytes > self.limits.state_bytes {
            return Err(state_over(now.state_bytes, self.limits.state_bytes));
        }
        if now.timers > before.timers && now.timers > self.limits.timers {
            return Err(timers_over(now.timers, self.limits.timers));
        }
        if let (Some(t), Some(held)) = (tenant, tenant_state)
            && now.state_bytes > before.state_bytes
            && held > t.max_state_bytes
        {
            return Err(format!(
                "keyed state limit exceeded: tenant '{}' holds {} of keyed state in this host \
                 (limit {}, `tenant_state_mb`)",
                t.tenant,
                size(held),
                size(t.max_state_bytes)
            ));
        }
        if let (Some(t), Some(held)) = (tenant, tenant_timers)
            && now.timers > before.timers
            && held > t.max_timers
        {
            return Err(format!(
                "timer limit exceeded: tenant '{}' holds {held} timers in this host (limit {}, \
                 `tenant_timers`)",
                t.tenant, t.max_timers
            ));
        }
        Ok(())
    }
}

impl Drop for Account {
    fn drop(&mut self) {
        if let Some(t) = &self.tenant {
            adjust(&t.state_bytes, self.charged.state_bytes, 0);
            adjust(&t.timers, self.charged.timers, 0);
        }
    }
}

fn state_over(held: u64, limit: u64) -> String {
    format!(
        "keyed state limit exceeded: the instance holds {} of keyed state (limit {} per \
         instance, `state_mb`)",
        size(held),
        size(limit)
    )
}

fn timers_over(held: u64, limit: u64) -> String {
    format!(
        "timer limit exceeded: the instance holds {held} timers (limit {limit} per instance, \
         `timers`)"
    )
}

/// Moves `total` by `now - before`; returns the new total.
fn adjust(total: &AtomicU64, before: u64, now: u64) -> u64 {
    if now >= before {
        total.fetch_add(now - before, Ordering::Relaxed) + (now - before)
    } else {
        total
            .fetch_sub(before - now, Ordering::Relaxed)
            .saturating_sub(before - now)
    }
}

fn size(bytes: u64) -> String {
    bytesize::ByteSize(bytes).display().iec().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(state_bytes: u64, timers: u64) -> InstanceLimits {
        InstanceLimits {
            state_bytes,
            timers,
            ..InstanceLimits::default()
        }
    }

    fn holding(state_bytes: u64, timers: u64) -> Holding {
        Holding {
            state_bytes,
            timers,
        }
    }

    #[test]
    fn an_instance_is_held_to_its_own_limits() {
        let mut a = Account::new(limits(100, 10), None);
        a.charge(holding(100, 10)).unwrap();
        let err = a.charge(holding(101, 10)).unwrap_err();
        assert!(
            err.contains("holds 101 B of keyed state (limit 100 B per instance"),
            "{err}"
        );
        let err = a.charge(holding(50, 11)).unwrap_err();
        assert!(
            err.contains("holds 11 timers (limit 10 per instance"),
            "{err}"
        );
        // Shrinking is always allowed, even when still over a limit lowered meanwhile.
        a.charge(holding(50, 11)).unwrap();
        a.charge(holding(40, 5)).unwrap();
    }

    #[test]
    fn a_tenants_instances_share_its_limits_and_give_back_their_charge() {
        let tenant = Arc::new(TenantUsage::new("acme", 150, 1000));
        let mut a = Account::new(limits(100, 100), Some(tenant.clone()));
        let mut b = Account::new(limits(100, 100), Some(tenant.clone()));
        a.charge(holding(100, 1)).unwrap();
        let err = b.charge(holding(60, 1)).unwrap_err();
        assert!(
            err.contains("tenant 'acme' holds 160 B of keyed state in this host (limit 150 B"),
            "{err}"
        );
        assert_eq!(tenant.state_bytes(), 160);
        b.charge(holding(50, 1)).unwrap();
        assert_eq!(tenant.state_bytes(), 150);
        drop(a);
        assert_eq!((tenant.state_bytes(), tenant.timers()), (50, 1));
        // A snapshot's copy charges nothing.
        let copy = b.clone();
        drop(copy);
        assert_eq!(tenant.state_bytes(), 50);
        drop(b);
        assert_eq!((tenant.state_bytes(), tenant.timers()), (0, 0));
    }
}
