//! Keyed state: typed handles, and the cache in guest memory that sits behind them.
//!
//! Keyed state belongs to the host, which snapshots it without the operator's help. An
//! operator declares each state in [`Operator::open`](crate::Operator::open) and keeps the
//! returned handle; every access names the record key it is for (normally the key of the
//! record being processed or of the timer that fired). Values, list elements and map keys
//! are encoded with postcard.
//!
//! # What a read sees
//!
//! The host answers reads as of the start of the current call and applies the call's
//! writes (sent as effects) after the call returns successfully. The SDK hides that gap
//! with a cache in guest memory, so an operator always reads its own writes, within a call
//! and across calls:
//!
//! - Value and map entries are cached per `(state, key, map key)`: a read goes to the host
//!   once and is then answered from memory. Writes are **written back**: a value or map
//!   entry stays in the cache, marked dirty, and goes to the host (one effect however
//!   often it was written) when a checkpoint's `snapshot` returns, when the cache is
//!   dropped, or when the entries written carried more than a limit — so a counter or a
//!   window updated for every record costs the host one write per checkpoint, not one per
//!   record. The limit is 256 KiB, and doubles up to 4 MiB while these early write-backs
//!   send again what earlier ones of the same checkpoint interval sent (one set of keys
//!   written over and over, which early write-backs would only send more often); it halves
//!   after an interval whose early write-backs sent mostly new entries. The cache lives
//!   as long as the instance. It is dropped (after writing back) when it has taken in
//!   more than a quarter of the instance's memory limit since it was last dropped (keys,
//!   values and a fixed overhead per entry; checked at the end of each call), and after a
//!   call that fails, which fails the task: the host discards the instance and restores
//!   from the last checkpoint.
//! - [`MapState::entries`] fetches a key's entries from the host once, merges the cached
//!   writes into them and keeps the whole map of that key cached.
//! - List state is not cached across calls: [`ListState::get`] reads the list from the host
//!   and adds the elements this call appended (or drops the host's list if this call
//!   cleared it).
//! - States declared with a time-to-live are cached only for the duration of a call: the
//!   host expires their entries by processing time between calls, which the guest cannot
//!   see.

mod cache;

use std::fmt;
use std::marker::PhantomData;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::{Context, Error, Result, from_bytes, to_bytes};

pub(crate) use cache::StateCache;

/// One value per key.
///
/// Declared with [`OpenContext::value_state`](crate::OpenContext::value_state).
pub struct ValueState<T> {
    slot: usize,
    _type: PhantomData<fn() -> T>,
}

/// An ordered list per key; appending does not read the list.
///
/// Declared with [`OpenContext::list_state`](crate::OpenContext::list_state).
pub struct ListState<T> {
    slot: usize,
    _type: PhantomData<fn() -> T>,
}

/// A map per key.
///
/// The host orders and compares map keys by their postcard encoding, so
/// [`MapState::entries`] returns them in the order of their encoded bytes, which for
/// integers (variable-length encoded) and signed numbers differs from their numeric order.
/// Two keys are the same entry exactly when their encodings are equal.
///
/// Declared with [`OpenContext::map_state`](crate::OpenContext::map_state).
pub struct MapState<K, V> {
    slot: usize,
    _type: PhantomData<fn() -> (K, V)>,
}

macro_rules! handle_impls {
    ($name:ident < $($t:ident),+ >) => {
        impl<$($t),+> $name<$($t),+> {
            pub(crate) fn new(slot: usize) -> Self {
                $name { slot, _type: PhantomData }
            }
        }

        impl<$($t),+> Clone for $name<$($t),+> {
            fn clone(&self) -> Self {
                *self
            }
        }

        impl<$($t),+> Copy for $name<$($t),+> {}

        impl<$($t),+> fmt::Debug for $name<$($t),+> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($name)).field("slot", &self.slot).finish()
            }
        }
    };
}

handle_impls!(ValueState<T>);
handle_impls!(ListState<T>);
handle_impls!(MapState<K, V>);

impl<T: Serialize + DeserializeOwned> ValueState<T> {
    /// The value of `key`, if set.
    pub fn get(&self, ctx: &mut Context<'_>, key: &[u8]) -> Result<Option<T>> {
        ctx.rt.states.value_get(ctx.host, self.slot, key)
    }

    /// Sets the value of `key`.
    pub fn put(&self, ctx: &mut Context<'_>, key: &[u8], value: &T) -> Result<()> {
        let rt = &mut *ctx.rt;
        rt.states.value_put_with(self.slot, key, |buf| {
            postcard::to_extend(value, buf).map_err(Error::from)
        })
    }

    /// Removes the value of `key`.
    pub fn clear(&self, ctx: &mut Context<'_>, key: &[u8]) -> Result<()> {
        let rt = &mut *ctx.rt;
        rt.states.clear(&mut rt.effects, self.slot, key)
    }

    /// Replaces the value of `key` with what `f` makes of the current one (`None` removes
    /// it) and returns the new value.
    ///
    /// ```
    /// # use sluice_sdk::{Context, Result, ValueState};
    /// fn increment(count: &ValueState<u64>, ctx: &mut Context<'_>, key: &[u8]) -> Result<u64> {
    ///     let n = count.update(ctx, key, |n| Some(n.unwrap_or(0) + 1))?;
    ///     Ok(n.unwrap_or(0))
    /// }
    /// ```
    pub fn update(
        &self,
        ctx: &mut Context<'_>,
        key: &[u8],
        f: impl FnOnce(Option<T>) -> Option<T>,
    ) -> Result<Option<T>> {
        let rt = &mut *ctx.rt;
        let new = rt.states.value_update(ctx.host, self.slot, key, f)?;
        if new.is_none() {
            rt.states.clear(&mut rt.effects, self.slot, key)?;
        }
        Ok(new)
    }
}

impl<T: Serialize + DeserializeOwned> ListState<T> {
    /// Appends `value` to the list of `key`.
    pub fn add(&self, ctx: &mut Context<'_>, key: &[u8], value: &T) -> Result<()> {
        let bytes = to_bytes(value)?;
        let rt = &mut *ctx.rt;
        rt.states.list_add(&mut rt.effects, self.slot, key, bytes)
    }

    /// The list of `key`, in the order of appends (empty when there is none).
    pub fn get(&self, ctx: &mut Context<'_>, key: &[u8]) -> Result<Vec<T>> {
        let mut items = Vec::new();
        ctx.rt
            .states
            .list_for_each(ctx.host, self.slot, key, |bytes| {
                items.push(from_bytes(bytes)?);
                Ok(())
            })?;
        Ok(items)
    }

    /// Removes the list of `key`.
    pub fn clear(&self, ctx: &mut Context<'_>, key: &[u8]) -> Result<()> {
        let rt = &mut *ctx.rt;
        rt.states.clear(&mut rt.effects, self.slot, key)
    }
}

impl<K, V> MapState<K, V>
where
    K: Serialize + DeserializeOwned,
    V: Serialize + DeserializeOwned,
{
    /// The value of `map_key` in the map of `key`.
    pub fn get(&self, ctx: &mut Context<'_>, key: &[u8], map_key: &K) -> Result<Option<V>> {
        ctx.rt.states.map_get(ctx.host, self.slot, key, map_key)
    }

    /// Sets `map_key` to `value` in the map of `key`.
    pub fn put(&self, ctx: &mut Context<'_>, key: &[u8], map_key: &K, value: &V) -> Result<()> {
        ctx.rt.states.map_put_with(self.slot, key, map_key, |buf| {
            postcard::to_extend(value, buf).map_err(Error::from)
        })
    }

    /// Replaces the value of `map_key` in the map of `key` with what `f` makes of the
    /// current one (`None` removes it) and returns the new value: one lookup, where a
    /// [`MapState::get`] followed by a [`MapState::put`] takes two.
    ///
    /// ```
    /// # use sluice_sdk::{Context, MapState, Result};
    /// fn add(sums: &MapState<i64, f64>, ctx: &mut Context<'_>, key: &[u8], window: i64, x: f64) -> Result<f64> {
    ///     let sum = sums.update(ctx, key, &window, |sum| Some(sum.unwrap_or(0.0) + x))?;
    ///     Ok(sum.unwrap_or(0.0))
    /// }
    /// ```
    pub fn update(
        &self,
        ctx: &mut Context<'_>,
        key: &[u8],
        map_key: &K,
        f: impl FnOnce(Option<V>) -> Option<V>,
    ) -> Result<Option<V>> {
        ctx.rt
            .states
            .map_update(ctx.host, self.slot, key, map_key, f)
    }

    /// Removes `map_key` from the map of `key`.
    pub fn remove(&self, ctx: &mut Context<'_>, key: &[u8], map_key: &K) -> Result<()> {
        ctx.rt.states.map_remove_key(self.slot, key, map_key)
    }

    /// All entries of the map of `key`, in the order of the encoded map keys.
    pub fn entries(&self, ctx: &mut Context<'_>, key: &[u8]) -> Result<Vec<(K, V)>> {
        self.entries_where(ctx, key, |_| true)
    }

    /// The map keys of the map of `key`, in the order of their encodings: no value is
    /// decoded.
    pub fn keys(&self, ctx: &mut Context<'_>, key: &[u8]) -> Result<Vec<K>> {
        let mut keys = Vec::new();
        ctx.rt
            .states
            .map_for_each(ctx.host, self.slot, key, |user_key, _| {
                keys.push(from_bytes(user_key)?);
                Ok(())
            })?;
        Ok(keys)
    }

    /// The entries of the map of `key` whose map key `keep` accepts, in the order of the
    /// encoded map keys: only their values are decoded (a range of times out of many,
    /// say).
    pub fn entries_where(
        &self,
        ctx: &mut Context<'_>,
        key: &[u8],
        mut keep: impl FnMut(&K) -> bool,
    ) -> Result<Vec<(K, V)>> {
        let mut entries = Vec::new();
        ctx.rt
            .states
            .map_for_each(ctx.host, self.slot, key, |user_key, value| {
                let map_key = from_bytes(user_key)?;
                if keep(&map_key) {
                    entries.push((map_key, from_bytes(value)?));
                }
                Ok(())
            })?;
        Ok(entries)
    }

    /// Removes the whole map of `key`.
    pub fn clear(&self, ctx: &mut Context<'_>, key: &[u8]) -> Result<()> {
        let rt = &mut *ctx.rt;
        rt.states.clear(&mut rt.effects, self.slot, key)
    }
}
