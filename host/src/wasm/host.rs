//! The operator's imports (`runtime`), for every WIT version: 0.3.0's implementation is
//! the host's; 0.2.0's and 0.1.0's call it.
//!
//! The imports that take strings or byte lists (`log`, `declare-state`, `declare-output`,
//! `state-get`, `state-get-many`, `state-entries`) are linked a second time by hand
//! ([`link_borrowed`]),
//! over `bindgen!`'s: those read the guest's string or list where it lies in the guest's
//! memory and check its size before copying any of it, where `bindgen!`'s would copy the
//! whole of it into host memory first (up to the guest's memory limit per call).

use std::borrow::Cow;

use anyhow::Result;
use wasmtime::StoreContextMut;
use wasmtime::component::{ComponentType, Lift, Linker, WasmList, WasmStr};

use super::bindings::v3::sluice::operator::runtime::Host;
use super::bindings::v3::sluice::operator::types::{Level, Packed, StateKind};
use super::bindings::{v1, v2, v3};
use super::columns::{PackedWriter, unpack};
use super::store::StoreState;
use crate::state::{StateDescriptor, StateKind as Kind};
use crate::timers::now_millis;

/// Most states one operator instance may declare.
const MAX_STATES: usize = 1024;
/// Longest state or output name.
const MAX_STATE_NAME_BYTES: usize = 1024;
/// Most side outputs one operator may declare.
pub const MAX_OUTPUTS: usize = 64;

impl v3::sluice::operator::types::Host for StoreState {}
impl v2::sluice::operator::types::Host for StoreState {}
impl v1::sluice::operator::types::Host for StoreState {}

impl Host for StoreState {
    fn processing_time(&mut self) -> wasmtime::Result<i64> {
        Ok(now_millis())
    }

    fn current_watermark(&mut self) -> wasmtime::Result<i64> {
        Ok(self.operator.watermark)
    }

    fn declare_state(
        &mut self,
        name: String,
        kind: StateKind,
        ttl_ms: Option<u64>,
    ) -> wasmtime::Result<Result<u32, String>> {
        if !self.operator.opening {
            return Ok(Err(format!(
                "declare-state('{name}') is only allowed during `open`"
            )));
        }
        if name.len() > MAX_STATE_NAME_BYTES {
            return Ok(Err(state_name_too_long(name.len())));
        }
        let Some(backend) = self.operator.keyed.as_mut() else {
            self.operator.unkeyed_state = Some(crate::guest_text::printable(&name).into_owned());
            return Ok(Err(format!(
                "cannot declare keyed state '{name}': the operator's input is not keyed \
                 (set `key_by` for this operator in the job file)"
            )));
        };
        let kind = match kind {
            StateKind::Value => Kind::Value,
            StateKind::List => Kind::List,
            StateKind::Map => Kind::Map,
        };
        if backend.descriptors().len() >= MAX_STATES
            && !backend.descriptors().iter().any(|d| d.name == name)
        {
            return Ok(Err(format!(
                "declare-state('{}'): an operator may declare at most {MAX_STATES} states",
                crate::guest_text::printable(&name)
            )));
        }
        Ok(backend.declare(StateDescriptor { name, kind, ttl_ms }))
    }

    fn state_get(
        &mut self,
        state: u32,
        key: Vec<u8>,
        user_key: Vec<u8>,
    ) -> wasmtime::Result<Option<Vec<u8>>> {
        self.state_get_in_place(state, &key, &user_key)
    }

    fn state_get_many(
        &mut self,
        state: u32,
        keys: Packed,
        user_key: Vec<u8>,
    ) -> wasmtime::Result<Packed> {
        self.state_get_many_in_place(state, &keys.data, &keys.ends, &keys.absent, &user_key)
    }

    fn state_entries(&mut self, state: u32, key: Vec<u8>) -> wasmtime::Result<Vec<u8>> {
        let backend = self.keyed_backend_mut("state-entries")?;
        backend
            .entries(state, &key, now_millis())
            .map_err(|e| wasmtime::format_err!("state-entries: {e}"))
    }

    fn declare_output(&mut self, name: String) -> wasmtime::Result<Result<u32, String>> {
        let shown = crate::guest_text::printable(&name).into_owned();
        if !self.operator.opening {
            return Ok(Err(format!(
                "declare-output('{shown}') is only allowed during `open`"
            )));
        }
        if name.is_empty() || name.len() > MAX_STATE_NAME_BYTES {
            return Ok(Err(output_name_refused(name.len())));
        }
        let outputs = &mut self.operator.outputs;
        if let Some(i) = outputs.iter().position(|o| *o == name) {
            return Ok(Ok(i as u32 + 1));
        }
        if outputs.len() >= MAX_OUTPUTS {
            return Ok(Err(format!(
                "declare-output('{shown}'): an operator may declare at most {MAX_OUTPUTS} \
                 side outputs"
            )));
        }
        outputs.push(name);
        Ok(Ok(outputs.len() as u32))
    }

    fn log(&mut self, level: Level, message: String) -> wasmtime::Result<()> {
        self.log_text(level, &message);
        Ok(())
    }
}

impl StoreState {
    /// `log`, of a message read where it lies.
    fn log_text(&self, level: Level, message: &str) {
        let mut output = self.output.lock();
        let id = output.identity().clone();
        if !output.rate().admit(&id, message.len()) {
            return;
        }
        drop(output);
        let message = crate::guest_text::guest_text(message, self.limits.max_guest_string_bytes);
        macro_rules! event {
            ($lvl:expr) => {
                tracing::event!(
                    target: "sluice::guest", $lvl,
                    tenant = %id.tenant, job = %id.job, operator = %id.operator,
                    subtask = id.subtask, "{message}"
                )
            };
        }
        match level {
            Level::Trace => event!(tracing::Level::TRACE),
            Level::Debug => event!(tracing::Level::DEBUG),
            Level::Info => event!(tracing::Level::INFO),
            Level::Warn => event!(tracing::Level::WARN),
            Level::Error => event!(tracing::Level::ERROR),
        }
    }

    /// `state-get`, of a key read where it lies.
    fn state_get_in_place(
        &self,
        state: u32,
        key: &[u8],
        user_key: &[u8],
    ) -> wasmtime::Result<Option<Vec<u8>>> {
        let backend = self.keyed_backend("state-get")?;
        backend
            .get(state, key, user_key, now_millis())
            .map_err(|e| wasmtime::format_err!("state-get: {e}"))
    }

    /// `state-get-many`, of keys packed as `packed` holds them, read where they lie:
    /// fails once the answer would come to more than a call may return.
    fn state_get_many_in_place(
        &self,
        state: u32,
        data: &[u8],
        ends: &[u8],
        absent: &[u8],
        user_key: &[u8],
    ) -> wasmtime::Result<Packed> {
        let backend = self.keyed_backend("state-get-many")?;
        let keys = unpack("state-get-many: keys", data, ends, absent, ends.len() / 4)
            .map_err(|e| wasmtime::format_err!("{e}"))?;
        let max = self.limits.max_output_bytes;
        let now = now_millis();
        let mut values = PackedWriter::with_capacity(keys.len(), 0);
        let mut size = 5 * keys.len();
        for (i, key) in keys.into_iter().enumerate() {
            let Some(key) = key else {
                wasmtime::bail!("state-get-many: key {i} is absent (a key is bytes, maybe empty)");
            };
            let value = backend
                .get(state, key, user_key, now)
                .map_err(|e| wasmtime::format_err!("state-get-many: {e}"))?;
            size += value.as_ref().map_or(0, Vec::len);
            if size > max {
                wasmtime::bail!(
                    "state-get-many: the values of the first {} keys come to more than a call \
                     may return ({max} bytes, `max_output_mb`); ask for fewer keys at a time",
                    i + 1
                );
            }
            values.push(value.as_deref());
        }
        Ok(values.finish())
    }

    fn keyed_backend(&self, call: &str) -> wasmtime::Result<&crate::state::KeyedState> {
        self.operator.keyed.as_ref().ok_or_else(|| {
            wasmtime::format_err!(
                "{call}: the operator's input is not keyed, so it has no keyed state"
            )
        })
    }

    fn keyed_backend_mut(&mut self, call: &str) -> wasmtime::Result<&mut crate::state::KeyedState> {
        self.operator.keyed.as_mut().ok_or_else(|| {
            wasmtime::format_err!(
                "{call}: the operator's input is not keyed, so it has no keyed state"
            )
        })
    }
}

/// The runtime imports of an older WIT version `$v`, answered by the current ones (its
/// `level` and `state-kind` convert into 0.3.0's); `$($extra)*` are the imports it has
/// beyond 0.1.0's.
macro_rules! older_runtime {
    ($v:ident $(, $extra:item)*) => {
        impl $v::sluice::operator::runtime::Host for StoreState {
            fn processing_time(&mut self) -> wasmtime::Result<i64> {
                Host::processing_time(self)
            }

            fn current_watermark(&mut self) -> wasmtime::Result<i64> {
                Host::current_watermark(self)
            }

            fn declare_state(
                &mut self,
                name: String,
                kind: $v::sluice::operator::types::StateKind,
                ttl_ms: Option<u64>,
            ) -> wasmtime::Result<Result<u32, String>> {
                Host::declare_state(self, name, kind.into(), ttl_ms)
            }

            fn state_get(
                &mut self,
                state: u32,
                key: Vec<u8>,
                user_key: Vec<u8>,
            ) -> wasmtime::Result<Option<Vec<u8>>> {
                Host::state_get(self, state, key, user_key)
            }

            fn state_entries(&mut self, state: u32, key: Vec<u8>) -> wasmtime::Result<Vec<u8>> {
                Host::state_entries(self, state, key)
            }

            fn log(
                &mut self,
                level: $v::sluice::operator::types::Level,
                message: String,
            ) -> wasmtime::Result<()> {
                Host::log(self, level.into(), message)
            }

            $($extra)*
        }
    };
}

older_runtime!(
    v2,
    fn declare_output(&mut self, name: String) -> wasmtime::Result<Result<u32, String>> {
        Host::declare_output(self, name)
    }
);
older_runtime!(v1);

/// Links the imports that take strings or byte lists once more, over `bindgen!`'s, for
/// every WIT version (see the module docs).
pub(crate) fn link_borrowed(linker: &mut Linker<StoreState>) -> Result<()> {
    linker.allow_shadowing(true);
    let linked =
        link_runtime::<Level, StateKind>(linker, "sluice:operator/runtime@0.3.0")
            .and_then(|()| link_state_get_many(linker, "sluice:operator/runtime@0.3.0"))
            .and_then(|()| {
                link_runtime::<
                    v2::sluice::operator::types::Level,
                    v2::sluice::operator::types::StateKind,
                >(linker, "sluice:operator/runtime@0.2.0")
            })
            .and_then(|()| {
                link_runtime::<
                    v1::sluice::operator::types::Level,
                    v1::sluice::operator::types::StateKind,
                >(linker, "sluice:operator/runtime@0.1.0")
            });
    linker.allow_shadowing(false);
    linked
}

/// Why `declare-state` refuses a name of `len` bytes.
fn state_name_too_long(len: usize) -> String {
    format!(
        "declare-state: a state name of {len} bytes is longer than the limit of \
         {MAX_STATE_NAME_BYTES}"
    )
}

/// Why `declare-output` refuses a name of `len` bytes.
fn output_name_refused(len: usize) -> String {
    format!("declare-output: an output name must have 1 to {MAX_STATE_NAME_BYTES} bytes, not {len}")
}

/// A guest string of at most `max` bytes, read where it lies; its length when longer.
fn bounded_str<'a>(
    store: &'a StoreContextMut<'_, StoreState>,
    text: &WasmStr,
    max: usize,
) -> wasmtime::Result<Result<Cow<'a, str>, usize>> {
    let text = text.to_str(store)?;
    Ok(if text.len() <= max {
        Ok(text)
    } else {
        Err(text.len())
    })
}

/// Links the borrowing imports into `interface`, whose `level` and `state-kind` types are
/// `L` and `K`.
fn link_runtime<L, K>(linker: &mut Linker<StoreState>, interface: &str) -> Result<()>
where
    L: ComponentType + Lift + Into<Level> + Send + Sync + 'static,
    K: ComponentType + Lift + Into<StateKind> + Send + Sync + 'static,
{
    let mut runtime = linker.instance(interface)?;
    runtime.func_wrap(
        "log",
        |store: StoreContextMut<'_, StoreState>, (level, message): (L, WasmStr)| {
            let message = message.to_str(&store)?;
            store.data().log_text(level.into(), &message);
            Ok(())
        },
    )?;
    runtime.func_wrap(
        "declare-state",
        |mut store: StoreContextMut<'_, StoreState>,
         (name, kind, ttl_ms): (WasmStr, K, Option<u64>)| {
            let name = match bounded_str(&store, &name, MAX_STATE_NAME_BYTES)? {
                Ok(name) => name.into_owned(),
                Err(len) => return Ok((Err(state_name_too_long(len)),)),
            };
            Ok((Host::declare_state(
                store.data_mut(),
                name,
                kind.into(),
                ttl_ms,
            )?,))
        },
    )?;
    runtime.func_wrap(
        "declare-output",
        |mut store: StoreContextMut<'_, StoreState>, (name,): (WasmStr,)| {
            let name = match bounded_str(&store, &name, MAX_STATE_NAME_BYTES)? {
                Ok(name) => name.into_owned(),
                Err(len) => return Ok((Err(output_name_refused(len)),)),
            };
            Ok((Host::declare_output(store.data_mut(), name)?,))
        },
    )?;
    runtime.func_wrap(
        "state-get",
        |store: StoreContextMut<'_, StoreState>,
         (state, key, user_key): (u32, WasmList<u8>, WasmList<u8>)| {
            let (key, user_key) = (key.as_le_slice(&store), user_key.as_le_slice(&store));
            Ok((store.data().state_get_in_place(state, key, user_key)?,))
        },
    )?;
    runtime.func_wrap(
        "state-entries",
        |mut store: StoreContextMut<'_, StoreState>, (state, key): (u32, WasmList<u8>)| {
            // Read into the host: reading the entries may write what the call holds
            // (RocksDB), which needs the store. A state key is at most what one call
            // may return.
            let max = store.data().limits.max_output_bytes;
            if key.len() > max {
                wasmtime::bail!(
                    "state-entries: a key of {} bytes is longer than any key of keyed state \
                     can be ({max} bytes, `max_output_mb`)",
                    key.len()
                );
            }
            let key = key.as_le_slice(&store).to_vec();
            Ok((Host::state_entries(store.data_mut(), state, key)?,))
        },
    )?;
    Ok(())
}

/// A `packed` the guest passes, read where it lies.
#[derive(ComponentType, Lift)]
#[component(record)]
struct PackedInGuest {
    data: WasmList<u8>,
    ends: WasmList<u8>,
    absent: WasmList<u8>,
}

/// Links `state-get-many` (0.3.0 on), reading the keys where they lie.
fn link_state_get_many(linker: &mut Linker<StoreState>, interface: &str) -> Result<()> {
    linker.instance(interface)?.func_wrap(
        "state-get-many",
        |store: StoreContextMut<'_, StoreState>,
         (state, keys, user_key): (u32, PackedInGuest, WasmList<u8>)| {
            let (data, ends, absent) = (
                keys.data.as_le_slice(&store),
                keys.ends.as_le_slice(&store),
                keys.absent.as_le_slice(&store),
            );
            let user_key = user_key.as_le_slice(&store);
            Ok((store
                .data()
                .state_get_many_in_place(state, data, ends, absent, user_key)?,))
        },
    )?;
    Ok(())
}

/// `level` and `state-kind` of an older WIT version `$v`, as 0.3.0's.
macro_rules! older_types {
    ($v:ident) => {
        impl From<$v::sluice::operator::types::Level> for Level {
            fn from(level: $v::sluice::operator::types::Level) -> Level {
                use $v::sluice::operator::types::Level as Old;
                match level {
                    Old::Trace => Level::Trace,
                    Old::Debug => Level::Debug,
                    Old::Info => Level::Info,
                    Old::Warn => Level::Warn,
                    Old::Error => Level::Error,
                }
            }
        }

        impl From<$v::sluice::operator::types::StateKind> for StateKind {
            fn from(kind: $v::sluice::operator::types::StateKind) -> StateKind {
                use $v::sluice::operator::types::StateKind as Old;
                match kind {
                    Old::Value => StateKind::Value,
                    Old::List => StateKind::List,
                    Old::Map => StateKind::Map,
                }
            }
        }
    };
}

older_types!(v2);
older_types!(v1);

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    use sluice_codec::{Effect, EffectWriter};

    use super::*;
    use crate::chain::{OperatorIdentity, OperatorState};
    use crate::state::KeyedState;
    use crate::wasm::{CpuShares, SandboxLimits};

    /// A store whose keyed state `s` holds `values` (key → value), answering at most
    /// `max_output_bytes` per call.
    fn store(values: &[(&[u8], &[u8])], max_output_bytes: usize) -> (StoreState, u32) {
        let identity = OperatorIdentity {
            tenant: "t".into(),
            job: "j".into(),
            operator: "o".into(),
            subtask: 0,
            parallelism: 1,
        };
        let limits = SandboxLimits {
            max_output_bytes,
            ..SandboxLimits::default()
        };
        let state = OperatorState::new(Some(KeyedState::heap(128, 0..128)));
        let cancel = Arc::new(AtomicBool::new(false));
        let mut store =
            StoreState::new(identity, limits, state, cancel, Arc::new(CpuShares::new(1))).unwrap();
        store.operator.opening = true;
        let id = Host::declare_state(&mut store, "s".into(), StateKind::Value, None)
            .unwrap()
            .unwrap();
        store.operator.opening = false;
        let mut effects = EffectWriter::new();
        for (key, value) in values {
            effects.push(Effect::Put {
                state: id,
                key,
                user_key: b"",
                value,
            });
        }
        let now = now_millis();
        let writes = store.operator.apply_effects(&effects.take(), now).unwrap();
        store.operator.settle(now, writes).unwrap();
        (store, id)
    }

    fn packed(keys: &[&[u8]]) -> Packed {
        let mut w = PackedWriter::with_capacity(keys.len(), 0);
        for key in keys {
            w.push(Some(key));
        }
        w.finish()
    }

    #[test]
    fn state_get_many_answers_each_key_in_order_packed() {
        let (mut store, id) = store(&[(b"a", b"1"), (b"c", b"333")], 1 << 20);
        let got = Host::state_get_many(&mut store, id, packed(&[b"c", b"b", b"a", b"c"]), vec![])
            .unwrap();
        let got = unpack("got", &got.data, &got.ends, &got.absent, 4).unwrap();
        assert_eq!(
            got,
            [Some(&b"333"[..]), None, Some(&b"1"[..]), Some(&b"333"[..])]
        );
    }

    #[test]
    fn state_get_many_refuses_more_than_a_call_may_return_and_bad_keys() {
        // A guest asking for one large value many times: the answer would be far larger
        // than its request; refused once past the bound, before it is built.
        let big = vec![7u8; 1000];
        let (mut store, id) = store(&[(b"k", &big)], 10_000);
        let keys: Vec<&[u8]> = vec![b"k"; 100];
        let err = Host::state_get_many(&mut store, id, packed(&keys), vec![]).unwrap_err();
        assert!(
            format!("{err}").contains("come to more than a call may return"),
            "{err}"
        );
        assert!(Host::state_get_many(&mut store, id, packed(&keys[..9]), vec![]).is_ok());
        // Ends that point past the keys' bytes, and an absent key.
        let mut bad = packed(&[b"k"]);
        bad.ends = 5u32.to_le_bytes().to_vec();
        let err = Host::state_get_many(&mut store, id, bad, vec![]).unwrap_err();
        assert!(format!("{err}").contains("ends at byte 5"), "{err}");
        let mut absent = packed(&[b"k"]);
        absent.absent = vec![1];
        let err = Host::state_get_many(&mut store, id, absent, vec![]).unwrap_err();
        assert!(format!("{err}").contains("key 0 is absent"), "{err}");
    }
}
