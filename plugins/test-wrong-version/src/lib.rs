//! `test-wrong-version`: a pass-through operator built for `sluice:operator@0.9.0`, a
//! version of the contract the host does not support, for the host's tests (not an
//! example). It uses wit-bindgen directly instead of the SDK, which only speaks the
//! current version; `wit/operator.wit` is a copy of the contract with only the package
//! version changed.

mod bindings {
    #![allow(unused_qualifications, reason = "generated code")]

    wit_bindgen::generate!({ path: "wit", world: "operator" });
}

use bindings::exports::sluice::operator::stream_operator::{Error, Guest, OpenContext, Output};

struct PassThrough;

impl Guest for PassThrough {
    fn open(_ctx: OpenContext) -> Result<Output, Error> {
        Ok(Output {
            records: Vec::new(),
            effects: Vec::new(),
        })
    }

    fn process(records: Vec<u8>) -> Result<Output, Error> {
        Ok(Output {
            records,
            effects: Vec::new(),
        })
    }

    fn process_watermark(_watermark: i64) -> Result<Output, Error> {
        Ok(Output {
            records: Vec::new(),
            effects: Vec::new(),
        })
    }

    fn on_timers(_timers: Vec<u8>) -> Result<Output, Error> {
        Ok(Output {
            records: Vec::new(),
            effects: Vec::new(),
        })
    }

    fn snapshot(_checkpoint_id: u64) -> Result<Vec<u8>, Error> {
        Ok(Vec::new())
    }

    fn notify_complete(_checkpoint_id: u64) -> Result<(), Error> {
        Ok(())
    }

    fn notify_aborted(_checkpoint_id: u64) -> Result<(), Error> {
        Ok(())
    }

    fn finish() -> Result<Output, Error> {
        Ok(Output {
            records: Vec::new(),
            effects: Vec::new(),
        })
    }

    fn close() -> Result<Output, Error> {
        Ok(Output {
            records: Vec::new(),
            effects: Vec::new(),
        })
    }

    fn dispose() {}
}

bindings::export!(PassThrough with_types_in bindings);
