//! The `export!` macro.

/// Exports an [`Operator`](crate::Operator) type as the component's `stream-operator`.
///
/// Use it once per plugin crate, at the top level:
///
/// ```
/// # use sluice_sdk::{Context, OpenContext, Operator, Record, Result};
/// struct PassThrough;
///
/// impl Operator for PassThrough {
///     fn open(_ctx: &mut OpenContext<'_>) -> Result<Self> {
///         Ok(PassThrough)
///     }
///
///     fn process(&mut self, record: Record<'_>, ctx: &mut Context<'_>) -> Result<()> {
///         ctx.emit_record(record);
///         Ok(())
///     }
/// }
///
/// sluice_sdk::export!(PassThrough);
/// ```
///
/// The instance lives in a thread-local slot between calls (a component instance is
/// single-threaded and the host makes one call at a time). Calls before a successful
/// `open` or after `dispose` fail with an error instead of panicking.
#[macro_export]
macro_rules! export {
    ($operator:ty) => {
        const _: () = {
            use ::core::cell::RefCell;
            use ::core::result::Result;
            use ::std::vec::Vec;
            use $crate::__rt::Slot;
            use $crate::__rt::wasm::{
                self as glue, WitBatchWatermark, WitError, WitOpenContext, WitOpened, WitOutput,
                WitProcessed, WitRecords, WitSnapshotOutput,
            };

            struct SluiceExports;

            ::std::thread_local! {
                static SLUICE_OPERATOR: RefCell<Slot<$operator>> =
                    const { RefCell::new(Slot::new()) };
            }

            impl glue::Guest for SluiceExports {
                fn open(ctx: WitOpenContext) -> Result<WitOpened, WitError> {
                    SLUICE_OPERATOR.with_borrow_mut(|slot| glue::open(slot, ctx))
                }

                fn process(
                    input: u32,
                    records: WitRecords,
                    watermarks: Vec<WitBatchWatermark>,
                ) -> Result<WitProcessed, WitError> {
                    SLUICE_OPERATOR
                        .with_borrow_mut(|slot| glue::process(slot, input, &records, &watermarks))
                }

                fn process_watermark(watermark: i64) -> Result<WitOutput, WitError> {
                    SLUICE_OPERATOR.with_borrow_mut(|slot| glue::process_watermark(slot, watermark))
                }

                fn on_timers(timers: Vec<u8>) -> Result<WitOutput, WitError> {
                    SLUICE_OPERATOR.with_borrow_mut(|slot| glue::on_timers(slot, &timers))
                }

                fn snapshot(checkpoint_id: u64) -> Result<WitSnapshotOutput, WitError> {
                    SLUICE_OPERATOR.with_borrow_mut(|slot| glue::snapshot(slot, checkpoint_id))
                }

                fn notify_complete(checkpoint_id: u64) -> Result<(), WitError> {
                    SLUICE_OPERATOR
                        .with_borrow_mut(|slot| glue::notify_complete(slot, checkpoint_id))
                }

                fn notify_aborted(checkpoint_id: u64) -> Result<(), WitError> {
                    SLUICE_OPERATOR
                        .with_borrow_mut(|slot| glue::notify_aborted(slot, checkpoint_id))
                }

                fn finish() -> Result<WitOutput, WitError> {
                    SLUICE_OPERATOR.with_borrow_mut(|slot| glue::finish(slot))
                }

                fn close() -> Result<WitOutput, WitError> {
                    SLUICE_OPERATOR.with_borrow_mut(|slot| glue::close(slot))
                }

                fn dispose() {
                    SLUICE_OPERATOR.with_borrow_mut(|slot| glue::dispose(slot))
                }
            }

            $crate::bindings::export! {
                SluiceExports with_types_in $crate::bindings
            }
        };
    };
}

/// Declares the config keys an operator accepts, as a constant `NAME` (to pass to
/// [`Config::check_known`](crate::Config::check_known)) and in the plugin's
/// `sluice:config-keys` custom section, where `sluice inspect` finds them without
/// running the plugin.
///
/// ```
/// sluice_sdk::config_keys!(KEYS = ["min-length", "max-length"]);
/// assert_eq!(KEYS, ["min-length", "max-length"]);
/// ```
#[macro_export]
macro_rules! config_keys {
    ($name:ident = [$($key:literal),* $(,)?]) => {
        /// The config keys this operator accepts.
        const $name: &[&str] = &[$($key),*];
        const _: () = {
            // (Never empty, or the linker would drop the section: no keys is "\n".)
            #[allow(dead_code)]
            const TEXT: &str = ::core::concat!("\n", $($key, "\n"),*);
            #[cfg(target_family = "wasm")]
            #[used]
            #[unsafe(link_section = "sluice:config-keys")]
            static SLUICE_CONFIG_KEYS: [u8; TEXT.len()] =
                $crate::__rt::section_bytes::<{ TEXT.len() }>(TEXT);
        };
    };
}
