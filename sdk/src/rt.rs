//! The glue between the WIT exports and an [`Operator`]: decodes the input buffers, calls
//! the operator's hooks and encodes what they produced. Used by the code [`crate::export!`]
//! generates (through [`wasm`]) and by [`crate::testing`] (directly, with its own host), so
//! the tests exercise the same path as the real host.

use sluice_codec::{BatchReader, TimeDomain, TimerReader};

use crate::context::{CallOutput, OpenInfo, Runtime};
use crate::host::Host;
use crate::{Context, Error, OpenContext, Operator, Result, Timer};

/// Where the exports keep the operator instance between calls.
#[derive(Debug, Default)]
pub enum Slot<T> {
    /// `open` has not succeeded yet.
    #[default]
    Unopened,
    /// Between a successful `open` and `dispose`.
    Open(Box<Instance<T>>),
    /// After `dispose`.
    Disposed,
}

/// An opened operator and the SDK's state for it.
#[derive(Debug)]
pub struct Instance<T> {
    operator: T,
    rt: Runtime,
}

impl<T> Slot<T> {
    /// A slot before `open`.
    pub const fn new() -> Self {
        Slot::Unopened
    }

    fn instance(&mut self, call: &str) -> Result<&mut Instance<T>> {
        match self {
            Slot::Open(instance) => Ok(instance),
            Slot::Unopened => Err(Error::failed(format!("{call} called before open"))),
            Slot::Disposed => Err(Error::failed(format!("{call} called after dispose"))),
        }
    }

    /// The operator, if open (for the test harness's inspection helpers).
    pub(crate) fn operator(&self) -> Option<&T> {
        match self {
            Slot::Open(instance) => Some(&instance.operator),
            _ => None,
        }
    }
}

pub(crate) fn open<T: Operator>(
    slot: &mut Slot<T>,
    host: &dyn Host,
    info: &OpenInfo,
) -> Result<CallOutput> {
    match slot {
        Slot::Unopened => {}
        Slot::Open(_) => return Err(Error::failed("open called twice")),
        Slot::Disposed => return Err(Error::failed("open called after dispose")),
    }
    let mut rt = Runtime::default();
    let mut ctx = OpenContext {
        host,
        rt: &mut rt,
        info,
    };
    let operator = T::open(&mut ctx)?;
    let output = rt.end_call(true);
    *slot = Slot::Open(Box::new(Instance { operator, rt }));
    Ok(output)
}

/// Runs `f` as call `call` with a fresh [`Context`] and returns the call's output.
fn run<'c, T: Operator>(
    slot: &'c mut Slot<T>,
    host: &'c dyn Host,
    call: &str,
    f: impl FnOnce(&mut T, &mut Context<'c>) -> Result<()>,
) -> Result<CallOutput> {
    let instance = slot.instance(call)?;
    let mut ctx = Context {
        host,
        rt: &mut instance.rt,
        timestamp: None,
        input: None,
        batch: &[],
        unchanged: Default::default(),
        input_index: 0,
    };
    let result = f(&mut instance.operator, &mut ctx);
    ctx.copy_unchanged();
    let output = ctx.rt.end_call(result.is_ok());
    result.map(|()| output)
}

/// What `process` produced: the call's output, the watermarks passed on among its
/// records, and where it stopped (see the WIT's `processed`).
#[derive(Debug, Default)]
pub(crate) struct Processed {
    pub(crate) output: CallOutput,
    pub(crate) watermarks: Vec<(u32, i64)>,
    pub(crate) stopped_at: Option<u32>,
}

/// `process` of a batch of input `input` with `watermarks` among its records (`(before,
/// watermark)`, ascending): each watermark is handled (`process_watermark`) before the
/// records after it and passed on at the point of the output it reached. Stops before a
/// watermark that makes due an event-time timer registered in this call, so that the
/// host fires it there.
pub(crate) fn process<'c, T: Operator>(
    slot: &'c mut Slot<T>,
    host: &'c dyn Host,
    input: u32,
    records: &'c [u8],
    watermarks: &[(u32, i64)],
) -> Result<Processed> {
    let mut passed: Vec<(u32, i64)> = Vec::new();
    let mut stopped_at = None;
    let output = run(slot, host, "process", |operator, ctx| {
        // Most operators emit about as much as they read: one allocation, no regrowth.
        ctx.rt.records.reserve(records.len());
        ctx.input_index = input;
        ctx.batch = records;
        let mut reader = BatchReader::new(records);
        let mut next = 0;
        let mut n = 0u32;
        loop {
            while let Some(&(before, watermark)) = watermarks.get(next)
                && before <= n
            {
                if ctx.rt.new_event_timer.is_some_and(|t| t <= watermark) {
                    stopped_at = Some(next as u32);
                    return Ok(());
                }
                ctx.rt.watermark.set(Some(watermark));
                ctx.timestamp = None;
                ctx.input = None;
                operator.process_watermark(watermark, ctx)?;
                ctx.copy_unchanged();
                let at = ctx.rt.records.len() as u32;
                match passed.last_mut() {
                    Some(last) if last.0 == at => last.1 = watermark,
                    _ => passed.push((at, watermark)),
                }
                next += 1;
            }
            let Some(item) = reader.next_with_range() else {
                break;
            };
            let (record, encoded) = item.map_err(|e| Error::failed(format!("process: {e}")))?;
            ctx.timestamp = record.timestamp;
            ctx.input = Some((record, encoded));
            operator.process(record.into(), ctx)?;
            n += 1;
        }
        ctx.input = None;
        Ok(())
    })?;
    Ok(Processed {
        output,
        watermarks: passed,
        stopped_at,
    })
}

pub(crate) fn process_watermark<T: Operator>(
    slot: &mut Slot<T>,
    host: &dyn Host,
    watermark: i64,
) -> Result<CallOutput> {
    run(slot, host, "process-watermark", |operator, ctx| {
        operator.process_watermark(watermark, ctx)
    })
}

pub(crate) fn on_timers<T: Operator>(
    slot: &mut Slot<T>,
    host: &dyn Host,
    timers: &[u8],
) -> Result<CallOutput> {
    run(slot, host, "on-timers", |operator, ctx| {
        let mut until = i64::MIN;
        for timer in TimerReader::new(timers) {
            let timer = timer.map_err(|e| Error::failed(format!("on-timers: {e}")))?;
            until = until.max(timer.timestamp);
        }
        ctx.rt.begin_timers(until);
        for timer in TimerReader::new(timers) {
            let timer = timer.map_err(|e| Error::failed(format!("on-timers: {e}")))?;
            // A timer an earlier one of the batch deleted does not fire, as in Flink.
            if !ctx.rt.fire_timer(timer.domain, timer.key, timer.timestamp) {
                continue;
            }
            // As in Flink: what an event-time timer emits carries the timer's time, what a
            // processing-time timer emits carries none.
            ctx.timestamp = match timer.domain {
                TimeDomain::EventTime => Some(timer.timestamp),
                TimeDomain::ProcessingTime => None,
            };
            let timer = Timer {
                domain: timer.domain,
                timestamp: timer.timestamp,
                key: timer.key,
            };
            operator.on_timer(timer, ctx)?;
        }
        Ok(())
    })
}

/// `snapshot`: the operator's own state, and the effects that write back the keyed
/// values written since the last write-back (the host applies them before it copies
/// keyed state for the checkpoint).
pub(crate) fn snapshot<T: Operator>(
    slot: &mut Slot<T>,
    checkpoint_id: u64,
) -> Result<(Vec<u8>, Vec<u8>)> {
    let instance = slot.instance("snapshot")?;
    let state = instance.operator.snapshot(checkpoint_id)?;
    Ok((state, write_back(slot)))
}

/// The effects that write back the keyed values written since the last write-back.
pub(crate) fn write_back<T>(slot: &mut Slot<T>) -> Vec<u8> {
    match slot {
        Slot::Open(instance) => {
            let rt = &mut instance.rt;
            rt.states.write_back(&mut rt.effects);
            rt.effects.take()
        }
        _ => Vec::new(),
    }
}

pub(crate) fn notify_complete<T: Operator>(slot: &mut Slot<T>, checkpoint_id: u64) -> Result<()> {
    slot.instance("notify-complete")?
        .operator
        .notify_complete(checkpoint_id)
}

pub(crate) fn notify_aborted<T: Operator>(slot: &mut Slot<T>, checkpoint_id: u64) -> Result<()> {
    slot.instance("notify-aborted")?
        .operator
        .notify_aborted(checkpoint_id)
}

pub(crate) fn finish<T: Operator>(slot: &mut Slot<T>, host: &dyn Host) -> Result<CallOutput> {
    run(slot, host, "finish", |operator, ctx| operator.finish(ctx))
}

pub(crate) fn close<T: Operator>(slot: &mut Slot<T>, host: &dyn Host) -> Result<CallOutput> {
    let output = run(slot, host, "close", |operator, ctx| operator.close(ctx))?;
    if !output.records.is_empty() {
        // The host refuses it too; saying so here lets the harness catch it in tests.
        return Err(Error::failed(
            "emitted records from `close`, which may not emit: the job's output was \
             committed before it; emit buffered records in `finish`",
        ));
    }
    Ok(output)
}

pub(crate) fn dispose<T: Operator>(slot: &mut Slot<T>) {
    if let Slot::Open(instance) = slot {
        instance.operator.dispose();
    }
    *slot = Slot::Disposed;
}

/// The exports in terms of the generated WIT types, against the real host.
pub mod wasm {
    use super::Slot;
    use crate::bindings::sluice::operator::types as wit;
    use crate::context::{CallOutput, OpenInfo};
    use crate::host::WasmHost;
    use crate::{Error, Operator, Result};

    /// The generated `Guest` trait the exports implement.
    pub use crate::bindings::exports::sluice::operator::stream_operator::Guest;
    pub use wit::{
        BatchWatermark as WitBatchWatermark, Error as WitError, OpenContext as WitOpenContext,
        Opened as WitOpened, Output as WitOutput, Processed as WitProcessed, Records as WitRecords,
        SnapshotOutput as WitSnapshotOutput,
    };

    fn to_wit_error(err: Error) -> wit::Error {
        match err {
            Error::InvalidConfig(message) => wit::Error::InvalidConfig(message),
            Error::Failed(message) => wit::Error::Failed(message),
        }
    }

    fn to_wit(result: Result<CallOutput>) -> Result<wit::Output, wit::Error> {
        result
            .map(|output| wit::Output {
                records: wit::Records::Flat(output.records),
                effects: output.effects,
            })
            .map_err(to_wit_error)
    }

    /// `open`: records come flat (read in place; columns would allocate per record).
    pub fn open<T: Operator>(
        slot: &mut Slot<T>,
        ctx: wit::OpenContext,
    ) -> Result<wit::Opened, wit::Error> {
        to_wit(super::open(slot, &WasmHost, &OpenInfo::from(ctx))).map(|output| wit::Opened {
            output,
            layout: wit::Layout::Flat,
        })
    }

    /// `process`.
    pub fn process<T: Operator>(
        slot: &mut Slot<T>,
        input: u32,
        records: &wit::Records,
        watermarks: &[wit::BatchWatermark],
    ) -> Result<wit::Processed, wit::Error> {
        let wit::Records::Flat(records) = records else {
            return Err(wit::Error::Failed(
                "process: the host gave records in columns, though `open` asked for them flat"
                    .into(),
            ));
        };
        let given: Vec<(u32, i64)> = watermarks.iter().map(|w| (w.before, w.watermark)).collect();
        super::process(slot, &WasmHost, input, records, &given)
            .map(|p| wit::Processed {
                records: wit::Records::Flat(p.output.records),
                effects: p.output.effects,
                watermarks: p
                    .watermarks
                    .into_iter()
                    .map(|(before, watermark)| wit::BatchWatermark { before, watermark })
                    .collect(),
                stopped_at: p.stopped_at,
            })
            .map_err(to_wit_error)
    }

    /// `process-watermark`.
    pub fn process_watermark<T: Operator>(
        slot: &mut Slot<T>,
        watermark: i64,
    ) -> Result<wit::Output, wit::Error> {
        to_wit(super::process_watermark(slot, &WasmHost, watermark))
    }

    /// `on-timers`.
    pub fn on_timers<T: Operator>(
        slot: &mut Slot<T>,
        timers: &[u8],
    ) -> Result<wit::Output, wit::Error> {
        to_wit(super::on_timers(slot, &WasmHost, timers))
    }

    /// `snapshot`.
    pub fn snapshot<T: Operator>(
        slot: &mut Slot<T>,
        checkpoint_id: u64,
    ) -> Result<wit::SnapshotOutput, wit::Error> {
        super::snapshot(slot, checkpoint_id)
            .map(|(state, effects)| wit::SnapshotOutput { state, effects })
            .map_err(to_wit_error)
    }

    /// `notify-complete`.
    pub fn notify_complete<T: Operator>(
        slot: &mut Slot<T>,
        checkpoint_id: u64,
    ) -> Result<(), wit::Error> {
        super::notify_complete(slot, checkpoint_id).map_err(to_wit_error)
    }

    /// `notify-aborted`.
    pub fn notify_aborted<T: Operator>(
        slot: &mut Slot<T>,
        checkpoint_id: u64,
    ) -> Result<(), wit::Error> {
        super::notify_aborted(slot, checkpoint_id).map_err(to_wit_error)
    }

    /// `finish`.
    pub fn finish<T: Operator>(slot: &mut Slot<T>) -> Result<wit::Output, wit::Error> {
        to_wit(super::finish(slot, &WasmHost))
    }

    /// `close`.
    pub fn close<T: Operator>(slot: &mut Slot<T>) -> Result<wit::Output, wit::Error> {
        to_wit(super::close(slot, &WasmHost))
    }

    /// `dispose`.
    pub fn dispose<T: Operator>(slot: &mut Slot<T>) {
        super::dispose(slot);
    }
}

/// The bytes of `text` as an array of its length, for a custom section
/// ([`config_keys!`](crate::config_keys)).
pub const fn section_bytes<const N: usize>(text: &str) -> [u8; N] {
    let bytes = text.as_bytes();
    let mut out = [0u8; N];
    let mut i = 0;
    while i < N {
        out[i] = bytes[i];
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Record;
    use crate::host::{Level, StateKind};
    use sluice_codec::{BatchWriter, RecordRef};

    struct Echo;

    impl Operator for Echo {
        fn open(_ctx: &mut OpenContext<'_>) -> Result<Self> {
            Ok(Echo)
        }

        fn process(&mut self, record: Record<'_>, ctx: &mut Context<'_>) -> Result<()> {
            ctx.emit_record(record);
            Ok(())
        }
    }

    #[test]
    fn calls_out_of_order_are_errors() {
        let mut slot = Slot::<Echo>::new();
        let err = process(&mut slot, &TestHost::default(), 0, &[], &[]).unwrap_err();
        assert_eq!(err, Error::failed("process called before open"));
        assert_eq!(
            snapshot(&mut slot, 1).unwrap_err(),
            Error::failed("snapshot called before open")
        );
        open(&mut slot, &TestHost::default(), &OpenInfo::default()).unwrap();
        assert_eq!(
            open(&mut slot, &TestHost::default(), &OpenInfo::default()).unwrap_err(),
            Error::failed("open called twice")
        );
        dispose(&mut slot);
        assert_eq!(
            finish(&mut slot, &TestHost::default()).unwrap_err(),
            Error::failed("finish called after dispose")
        );
    }

    /// A host without state whose watermark the test sets, counting how often it is read.
    #[derive(Default)]
    struct TestHost {
        watermark: std::cell::Cell<i64>,
        reads: std::cell::Cell<usize>,
    }

    impl Host for TestHost {
        fn processing_time(&self) -> i64 {
            0
        }
        fn current_watermark(&self) -> i64 {
            self.reads.set(self.reads.get() + 1);
            self.watermark.get()
        }
        fn declare_state(&self, _: &str, _: StateKind, _: Option<u64>) -> Result<u32, String> {
            Err("no state here".to_owned())
        }
        fn state_get(&self, _: u32, _: &[u8], _: &[u8]) -> Option<Vec<u8>> {
            None
        }
        fn state_entries(&self, _: u32, _: &[u8]) -> Vec<u8> {
            Vec::new()
        }
        fn log(&self, _: Level, _: &str) {}
    }

    /// Emits the watermark it sees, three times per record.
    struct Watermarks;

    impl Operator for Watermarks {
        fn open(_ctx: &mut OpenContext<'_>) -> Result<Self> {
            Ok(Watermarks)
        }

        fn process(&mut self, _record: Record<'_>, ctx: &mut Context<'_>) -> Result<()> {
            for _ in 0..3 {
                let w = ctx.current_watermark();
                ctx.emit(None, w.to_string().as_bytes());
            }
            Ok(())
        }
    }

    #[test]
    fn the_watermark_is_read_from_the_host_once_per_call() {
        let host = TestHost::default();
        host.watermark.set(5);
        let mut slot = Slot::<Watermarks>::new();
        open(&mut slot, &host, &OpenInfo::default()).unwrap();
        let mut batch = BatchWriter::new();
        batch.push(None, b"a", None);
        batch.push(None, b"b", None);
        let batch = batch.into_bytes();
        let values = |output: CallOutput| -> Vec<String> {
            BatchReader::new(&output.records)
                .map(|r| String::from_utf8(r.unwrap().value.to_vec()).unwrap())
                .collect()
        };
        assert_eq!(
            values(
                process(&mut slot, &host, 0, &batch, &[])
                    .map(|p| p.output)
                    .unwrap()
            ),
            ["5"; 6]
        );
        assert_eq!(host.reads.get(), 1);
        // The host moves the watermark between calls: the next call sees the new one.
        host.watermark.set(9);
        assert_eq!(
            values(
                process(&mut slot, &host, 0, &batch, &[])
                    .map(|p| p.output)
                    .unwrap()
            ),
            ["9"; 6]
        );
        assert_eq!(host.reads.get(), 2);
    }

    /// By the first byte of the value: `p` passes the record on unchanged, `d` passes it on
    /// twice, `n` emits a new record then passes it on, `t` passes it on with another
    /// timestamp, anything else drops it; an odd watermark emits `w`.
    struct Mixed;

    impl Operator for Mixed {
        fn open(_ctx: &mut OpenContext<'_>) -> Result<Self> {
            Ok(Mixed)
        }

        fn process(&mut self, record: Record<'_>, ctx: &mut Context<'_>) -> Result<()> {
            match record.value.first() {
                Some(b'p') => ctx.emit_record(record),
                Some(b'd') => {
                    ctx.emit_record(record);
                    ctx.emit_record(record);
                }
                Some(b'n') => {
                    ctx.emit(None, b"new");
                    ctx.emit_record(record);
                }
                Some(b't') => ctx.emit_record(Record {
                    timestamp: Some(-1),
                    ..record
                }),
                _ => {}
            }
            Ok(())
        }

        fn process_watermark(&mut self, watermark: i64, ctx: &mut Context<'_>) -> Result<()> {
            if watermark % 2 == 1 {
                ctx.emit(None, b"w");
            }
            Ok(())
        }
    }

    /// What [`Mixed`] emits for `batch` with `watermarks`, written record by record, and
    /// where the watermarks fall in it.
    fn mixed_model(batch: &[u8], watermarks: &[(u32, i64)]) -> (Vec<u8>, Vec<(u32, i64)>) {
        let mut out = BatchWriter::new();
        let mut positions = Vec::new();
        let records: Vec<_> = BatchReader::new(batch).map(Result::unwrap).collect();
        for i in 0..=records.len() {
            for &(_, w) in watermarks.iter().filter(|(b, _)| *b == i as u32) {
                if w % 2 == 1 {
                    out.push(None, b"w", None);
                }
                positions.push((out.len() as u32, w));
            }
            let Some(&record) = records.get(i) else {
                break;
            };
            match record.value[0] {
                b'p' => out.push_record(record),
                b'd' => {
                    out.push_record(record);
                    out.push_record(record);
                }
                b'n' => {
                    out.push_record(RecordRef {
                        key: None,
                        value: b"new",
                        ..record
                    });
                    out.push_record(record);
                }
                b't' => out.push_record(RecordRef {
                    timestamp: Some(-1),
                    ..record
                }),
                _ => {}
            }
        }
        (out.into_bytes(), positions)
    }

    /// Records passed on unchanged are copied a run at a time: what comes out, in what
    /// order and where the watermarks fall, is what copying them one by one gives.
    #[test]
    fn records_passed_on_unchanged_keep_their_place_among_the_others() {
        let host = TestHost::default();
        let mut slot = Slot::<Mixed>::new();
        open(&mut slot, &host, &OpenInfo::default()).unwrap();
        let values = [
            "p1", "p2", "x", "p3", "d4", "p5", "n6", "p7", "t8", "p9", "p10", "x", "p11",
        ];
        let headers = sluice_codec::encode_headers([(&b"h"[..], &b"v"[..])]);
        let mut batch = BatchWriter::new();
        for (i, value) in values.iter().enumerate() {
            batch.push_record(RecordRef {
                key: (i % 3 == 0).then_some(b"k".as_slice()),
                value: value.as_bytes(),
                timestamp: (i % 2 == 0).then_some(i as i64),
                headers: (i == 9).then(|| sluice_codec::Headers::decode(&headers).unwrap()),
                partition: (i == 10).then_some(3),
                output: 0,
            });
        }
        let batch = batch.into_bytes();
        let decoded = |bytes: &[u8]| -> Vec<String> {
            BatchReader::new(bytes)
                .map(|r| format!("{:?}", r.unwrap()))
                .collect()
        };
        for watermarks in [
            &[][..],
            &[(0, 1), (2, 2), (7, 3), (13, 4)][..],
            &[(1, 2), (4, 4), (5, 5), (13, 6)][..],
        ] {
            let processed = process(&mut slot, &host, 0, &batch, watermarks).unwrap();
            let (records, positions) = mixed_model(&batch, watermarks);
            assert_eq!(
                decoded(&processed.output.records),
                decoded(&records),
                "{watermarks:?}"
            );
            assert_eq!(processed.output.records, records, "{watermarks:?}");
            assert_eq!(processed.watermarks, positions, "{watermarks:?}");
            assert_eq!(processed.stopped_at, None);
        }
    }

    /// Emits `T K` for each timer; the one at 10 deletes the event timer at 20 of its key,
    /// and for key `r` registers it again; the one at 15 registers the one at 20.
    struct Deleter;

    impl Operator for Deleter {
        fn open(_ctx: &mut OpenContext<'_>) -> Result<Self> {
            Ok(Deleter)
        }

        fn process(&mut self, record: Record<'_>, ctx: &mut Context<'_>) -> Result<()> {
            ctx.delete_event_timer(record.require_key()?, 20);
            Ok(())
        }

        fn on_timer(&mut self, timer: Timer<'_>, ctx: &mut Context<'_>) -> Result<()> {
            let text = format!("{} {}", timer.timestamp, String::from_utf8_lossy(timer.key));
            ctx.emit(None, text.as_bytes());
            if timer.timestamp == 10 {
                ctx.delete_event_timer(timer.key, 20);
                if timer.key == b"r" {
                    ctx.register_event_timer(timer.key, 20);
                }
            }
            if timer.timestamp == 15 {
                // Registers a timer of its own batch without deleting it first.
                ctx.register_event_timer(timer.key, 20);
            }
            Ok(())
        }
    }

    /// Calls `on-timers` with event-time `timers`; returns the records' values and the
    /// timer effects as `(registered, time, key)`.
    fn fire(
        slot: &mut Slot<Deleter>,
        timers: &[(i64, &str)],
    ) -> (Vec<String>, Vec<(bool, i64, String)>) {
        let mut encoded = sluice_codec::TimerWriter::new();
        for (timestamp, key) in timers {
            encoded.push(TimeDomain::EventTime, *timestamp, key.as_bytes());
        }
        let output = on_timers(slot, &TestHost::default(), &encoded.into_bytes()).unwrap();
        let records = BatchReader::new(&output.records)
            .map(|r| String::from_utf8(r.unwrap().value.to_vec()).unwrap())
            .collect();
        let effects = sluice_codec::EffectReader::new(&output.effects)
            .map(|e| match e.unwrap() {
                sluice_codec::Effect::RegisterTimer { timestamp, key, .. } => {
                    (true, timestamp, String::from_utf8_lossy(key).into_owned())
                }
                sluice_codec::Effect::DeleteTimer { timestamp, key, .. } => {
                    (false, timestamp, String::from_utf8_lossy(key).into_owned())
                }
                other => panic!("unexpected effect {other:?}"),
            })
            .collect();
        (records, effects)
    }

    fn opened_deleter() -> Slot<Deleter> {
        let mut slot = Slot::<Deleter>::new();
        open(&mut slot, &TestHost::default(), &OpenInfo::default()).unwrap();
        slot
    }

    #[test]
    fn a_timer_deleted_earlier_in_the_batch_is_skipped() {
        let mut slot = opened_deleter();
        let (records, effects) = fire(&mut slot, &[(10, "k"), (10, "l"), (20, "k"), (30, "k")]);
        assert_eq!(records, ["10 k", "10 l", "30 k"]);
        assert_eq!(
            effects,
            [(false, 20, "k".to_owned()), (false, 20, "l".to_owned())]
        );
    }

    #[test]
    fn a_timer_deleted_and_registered_again_fires_and_its_registration_is_cancelled() {
        let mut slot = opened_deleter();
        let (records, effects) = fire(&mut slot, &[(10, "r"), (20, "r"), (30, "r")]);
        assert_eq!(records, ["10 r", "20 r", "30 r"]);
        // Applied in order after the call, these leave 20 unregistered: it fired.
        assert_eq!(
            effects,
            [
                (false, 20, "r".to_owned()),
                (true, 20, "r".to_owned()),
                (false, 20, "r".to_owned())
            ]
        );
    }

    #[test]
    fn a_timer_registered_again_by_an_earlier_one_of_its_batch_fires_once() {
        // A fresh instance (as after a restore) does not know that 20 is registered:
        // registering it sends the registration, and its turn cancels it.
        let mut slot = opened_deleter();
        let (records, effects) = fire(&mut slot, &[(15, "q"), (20, "q")]);
        assert_eq!(records, ["15 q", "20 q"]);
        assert_eq!(
            effects,
            [(true, 20, "q".to_owned()), (false, 20, "q".to_owned())]
        );
        // Registered for a time past the batch: a new timer, kept.
        let (_, effects) = fire(&mut slot, &[(15, "p")]);
        assert_eq!(effects, [(true, 20, "p".to_owned())]);
    }

    #[test]
    fn only_deletions_of_the_same_call_skip_timers() {
        let mut slot = opened_deleter();
        // Deleted by a timer of an earlier call: the host decides whether it fires.
        fire(&mut slot, &[(10, "k")]);
        assert_eq!(fire(&mut slot, &[(20, "k")]).0, ["20 k"]);
        // Deleted in `process`: likewise.
        let mut batch = BatchWriter::new();
        batch.push(Some(b"k"), b"", None);
        process(&mut slot, &TestHost::default(), 0, &batch.into_bytes(), &[]).unwrap();
        assert_eq!(fire(&mut slot, &[(20, "k")]).0, ["20 k"]);
    }

    #[test]
    fn malformed_input_is_an_error_naming_it() {
        let mut slot = Slot::<Echo>::new();
        open(&mut slot, &TestHost::default(), &OpenInfo::default()).unwrap();
        let err = process(&mut slot, &TestHost::default(), 0, &[0x80], &[]).unwrap_err();
        assert_eq!(
            err.message(),
            "process: malformed record batch at byte 0: unknown record flags"
        );
        let err = on_timers(&mut slot, &TestHost::default(), &[0]).unwrap_err();
        assert!(
            err.message().starts_with("on-timers: malformed timer list"),
            "{err}"
        );
    }
}
