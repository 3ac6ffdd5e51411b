//! `test-recorder`: a pass-through operator that records the calls it receives, for the
//! host's tests (not an example).
//!
//! Calls are recorded as `open(restored=none|<n> bytes,attempt=<a>)`, `process(<n>)`,
//! `watermark(<ts>)`, `timer(event|processing,<ts>)`, `snapshot(<id>)`,
//! `notify-complete(<id>)`, `notify-aborted(<id>)`, `finish` and `close`. `process(<n>)`
//! stands for `n` records processed in a row, however the host batched them, so the list
//! does not depend on batch sizes.
//!
//! On `finish` it emits one record with key `calls` and value
//! `<subtask index>:<calls joined by ",">`. `snapshot` saves the list and `open` restores
//! it, so the list spans restores.
//!
//! Config:
//! - `register-event-timer` (i64, optional): for every record with a key, register an
//!   event-time timer for that key at this time.

use sluice_sdk::{Context, OpenContext, Operator, Record, Result, TimeDomain, Timer, to_bytes};

/// The operator.
pub struct Recorder {
    subtask: u32,
    calls: Vec<String>,
    /// Records processed since the last recorded call.
    records_in_a_row: u64,
    event_timer_at: Option<i64>,
}

impl Recorder {
    fn note(&mut self, call: String) {
        if self.records_in_a_row > 0 {
            self.calls
                .push(format!("process({})", self.records_in_a_row));
            self.records_in_a_row = 0;
        }
        self.calls.push(call);
    }
}

impl Operator for Recorder {
    fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        ctx.config().check_known(&["register-event-timer"])?;
        let restored = match ctx.restored_state() {
            None => "none".to_owned(),
            Some(bytes) => format!("{} bytes", bytes.len()),
        };
        let mut recorder = Recorder {
            subtask: ctx.subtask_index(),
            calls: ctx.restore()?.unwrap_or_default(),
            records_in_a_row: 0,
            event_timer_at: ctx.config().parse("register-event-timer")?,
        };
        recorder.note(format!(
            "open(restored={restored},attempt={})",
            ctx.attempt()
        ));
        Ok(recorder)
    }

    fn process(&mut self, record: Record<'_>, ctx: &mut Context<'_>) -> Result<()> {
        self.records_in_a_row += 1;
        if let (Some(key), Some(at)) = (record.key, self.event_timer_at) {
            ctx.register_event_timer(key, at);
        }
        ctx.emit_record(record);
        Ok(())
    }

    fn process_watermark(&mut self, watermark: i64, _ctx: &mut Context<'_>) -> Result<()> {
        self.note(format!("watermark({watermark})"));
        Ok(())
    }

    fn on_timer(&mut self, timer: Timer<'_>, _ctx: &mut Context<'_>) -> Result<()> {
        let domain = match timer.domain {
            TimeDomain::EventTime => "event",
            TimeDomain::ProcessingTime => "processing",
        };
        self.note(format!("timer({domain},{})", timer.timestamp));
        Ok(())
    }

    fn snapshot(&mut self, checkpoint_id: u64) -> Result<Vec<u8>> {
        self.note(format!("snapshot({checkpoint_id})"));
        to_bytes(&self.calls)
    }

    fn notify_complete(&mut self, checkpoint_id: u64) -> Result<()> {
        self.note(format!("notify-complete({checkpoint_id})"));
        Ok(())
    }

    fn notify_aborted(&mut self, checkpoint_id: u64) -> Result<()> {
        self.note(format!("notify-aborted({checkpoint_id})"));
        Ok(())
    }

    fn finish(&mut self, ctx: &mut Context<'_>) -> Result<()> {
        self.note("finish".to_owned());
        let calls = format!("{}:{}", self.subtask, self.calls.join(","));
        ctx.emit(Some(b"calls"), calls.as_bytes());
        Ok(())
    }

    fn close(&mut self, _ctx: &mut Context<'_>) -> Result<()> {
        self.note("close".to_owned());
        Ok(())
    }
}

sluice_sdk::export!(Recorder);

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_sdk::testing::Harness;

    #[test]
    fn records_calls_across_a_restore() -> Result<()> {
        let mut h = Harness::<Recorder>::builder().subtask(1, 2).open()?;
        h.process_value("x")?;
        h.process_records([Record::new(b"y"), Record::new(b"z")])?;
        h.process_watermark(5)?;
        let snapshot = h.snapshot(1)?;
        h.notify_complete(1)?;
        h.notify_aborted(2)?;
        let mut h = Harness::<Recorder>::builder()
            .subtask(1, 2)
            .attempt(1)
            .restore_from(&snapshot)
            .open()?;
        h.process_value("w")?;
        h.finish()?;
        h.close()?;
        let out = h.take_output();
        assert_eq!(out[0].value, b"w");
        assert_eq!(out[1].key.as_deref(), Some(&b"calls"[..]));
        let n = snapshot.operator_state().len();
        let expected = format!(
            "1:open(restored=none,attempt=0),process(3),watermark(5),snapshot(1),\
             open(restored={n} bytes,attempt=1),process(1),watermark({}),finish",
            i64::MAX
        );
        assert_eq!(out[1].value_str()?, expected);
        Ok(())
    }

    #[test]
    fn registers_event_timers_for_keyed_records() -> Result<()> {
        let mut h = Harness::<Recorder>::builder()
            .keyed(true)
            .config("register-event-timer", "10")
            .open()?;
        h.process(Some("k"), "v", Some(1))?;
        h.process_value("unkeyed")?;
        h.process_watermark(20)?;
        h.finish()?;
        let calls = h.output().last().unwrap().value_str()?.to_owned();
        assert!(
            calls.contains("process(2),timer(event,10),watermark(20)"),
            "{calls}"
        );
        Ok(())
    }
}
