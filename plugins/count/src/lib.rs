//! `count`: the number of records per key.
//!
//! For each record, adds one to its key's count. With `emit = "every"` it then emits key =
//! the record's key, value = the new count (a running count, with the record's timestamp).
//! With `emit = "final"` it emits nothing per record; instead it registers an event-time
//! timer for the key at the maximum time (`i64::MAX`), which fires when the input ends (the
//! host then advances the watermark to `i64::MAX`), and then emits the key's total once and
//! clears its count. Those records carry the timer's time, `i64::MAX`, as timestamp.
//!
//! The counts live in the host's keyed state (a `ValueState<u64>` named `count`), so they
//! are checkpointed, restored and redistributed with the keys, as are the timers. The input
//! must be keyed (`key_by` in the job file).
//!
//! Config:
//! - `format`: `text` (default, the count as decimal UTF-8) or `postcard` (a postcard `u64`).
//! - `emit`: `every` (default, the running count after every record) or `final` (each key's
//!   total once, at the end of the input).

use sluice_sdk::{Context, Error, OpenContext, Operator, Record, Result, Timer, ValueState};

sluice_sdk::config_keys!(KEYS = ["format", "emit"]);

/// The operator.
pub struct Count {
    counts: ValueState<u64>,
    postcard: bool,
    /// `emit = "final"`: emit each key's count once, when its timer at `i64::MAX` fires.
    emit_final: bool,
    /// Formats counts as text without `fmt`'s machinery.
    text: itoa::Buffer,
}

impl Operator for Count {
    fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        ctx.config().check_known(KEYS)?;
        let postcard = match ctx.config().get("format").unwrap_or("text") {
            "text" => false,
            "postcard" => true,
            other => {
                let why = format!("config `format` = {other:?}: expected `text` or `postcard`");
                return Err(Error::invalid_config(why));
            }
        };
        let emit_final = match ctx.config().get("emit").unwrap_or("every") {
            "every" => false,
            "final" => true,
            other => {
                let why = format!("config `emit` = {other:?}: expected `every` or `final`");
                return Err(Error::invalid_config(why));
            }
        };
        if !ctx.is_keyed() {
            // Restarting cannot fix the job file, hence a configuration error.
            return Err(Error::invalid_config(
                "count needs keyed input: partition its input with `key_by` in the job file",
            ));
        }
        Ok(Count {
            counts: ctx.value_state("count")?,
            postcard,
            emit_final,
            text: itoa::Buffer::new(),
        })
    }

    fn process(&mut self, record: Record<'_>, ctx: &mut Context<'_>) -> Result<()> {
        let key = record.require_key()?;
        let count = self
            .counts
            .update(ctx, key, |n| Some(n.unwrap_or(0) + 1))?
            .unwrap_or(1);
        if self.emit_final {
            // One timer per key, registered with its first record (it is checkpointed
            // and restored with the count, so a restored key has it already).
            if count == 1 {
                ctx.register_event_timer(key, i64::MAX);
            }
            Ok(())
        } else {
            self.emit(ctx, key, count)
        }
    }

    fn on_timer(&mut self, timer: Timer<'_>, ctx: &mut Context<'_>) -> Result<()> {
        // Only `emit = "final"` registers timers.
        if !self.emit_final {
            return Ok(());
        }
        if let Some(count) = self.counts.get(ctx, timer.key)? {
            self.counts.clear(ctx, timer.key)?;
            self.emit(ctx, timer.key, count)?;
        }
        Ok(())
    }
}

impl Count {
    /// Emits `count` for `key` in the configured format, with the timestamp of what is
    /// being processed.
    fn emit(&mut self, ctx: &mut Context<'_>, key: &[u8], count: u64) -> Result<()> {
        if self.postcard {
            ctx.emit_typed(Some(key), &count)?;
        } else {
            ctx.emit(Some(key), self.text.format(count).as_bytes());
        }
        Ok(())
    }
}

sluice_sdk::export!(Count);

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_sdk::TimeDomain;
    use sluice_sdk::testing::Harness;

    fn keyed() -> sluice_sdk::testing::HarnessBuilder<Count> {
        Harness::<Count>::builder().keyed(true)
    }

    #[test]
    fn counts_per_key() -> Result<()> {
        let mut h = keyed().open()?;
        for key in ["a", "b", "a", "a", "b"] {
            h.process(Some(key), "ignored", Some(1))?;
        }
        assert_eq!(h.output_values_str(), ["1", "1", "2", "3", "2"]);
        assert_eq!(h.output()[2].key.as_deref(), Some(&b"a"[..]));
        assert_eq!(h.output()[2].timestamp, Some(1));
        assert_eq!(h.state_value::<u64>("count", b"a")?, Some(3));
        // `every` is the default and registers no timers: the end of input adds nothing.
        h.finish()?;
        assert_eq!(h.output().len(), 5);
        let mut h = keyed().config("emit", "every").open()?;
        h.process(Some("a"), "", None)?;
        assert_eq!(h.output_values_str(), ["1"]);
        Ok(())
    }

    #[test]
    fn counts_survive_a_restore() -> Result<()> {
        let mut h = keyed().open()?;
        h.process(Some("a"), "", None)?;
        let snapshot = h.snapshot(1)?;
        h.process(Some("a"), "", None)?; // after the checkpoint: lost on restore
        let mut h = keyed().restore_from(&snapshot).open()?;
        h.process(Some("a"), "", None)?;
        assert_eq!(h.output_values_str(), ["2"]);
        Ok(())
    }

    #[test]
    fn postcard_format() -> Result<()> {
        let mut h = keyed().config("format", "postcard").open()?;
        h.process(Some("a"), "", None)?;
        h.process(Some("a"), "", None)?;
        assert_eq!(h.output()[1].decode::<u64>()?, 2);
        Ok(())
    }

    #[test]
    fn final_emits_each_total_once_at_the_end() -> Result<()> {
        let mut h = keyed().config("emit", "final").open()?;
        for key in ["a", "b", "a", "a", "b", "c"] {
            h.process(Some(key), "ignored", Some(1))?;
        }
        h.process_watermark(1_000)?; // not the end yet
        assert!(h.output().is_empty());
        assert_eq!(h.timers(TimeDomain::EventTime).len(), 3);
        h.finish()?;
        let totals: Vec<(&[u8], &str, Option<i64>)> = h
            .output()
            .iter()
            .map(|r| {
                let key = r.key.as_deref().unwrap_or_default();
                (key, r.value_str().unwrap(), r.timestamp)
            })
            .collect();
        assert_eq!(
            totals,
            [
                (&b"a"[..], "3", Some(i64::MAX)),
                (b"b", "2", Some(i64::MAX)),
                (b"c", "1", Some(i64::MAX))
            ]
        );
        // Emitted counts are cleared, and no timer is left.
        assert_eq!(h.state_value::<u64>("count", b"a")?, None);
        assert!(h.timers(TimeDomain::EventTime).is_empty());
        Ok(())
    }

    #[test]
    fn final_counts_and_timers_survive_a_restore() -> Result<()> {
        let mut h = keyed().config("emit", "final").open()?;
        h.process(Some("a"), "", None)?;
        h.process(Some("a"), "", None)?;
        let snapshot = h.snapshot(1)?;
        let mut h = keyed()
            .config("emit", "final")
            .config("format", "postcard")
            .restore_from(&snapshot)
            .open()?;
        h.process(Some("b"), "", None)?;
        h.finish()?;
        let totals: Vec<u64> = h.output().iter().map(|r| r.decode().unwrap()).collect();
        assert_eq!(totals, [2, 1]);
        Ok(())
    }

    #[test]
    fn errors() {
        let err = keyed().config("format", "json").open().unwrap_err();
        assert!(
            err.is_invalid_config() && err.message().contains("`format`"),
            "{err}"
        );
        let err = keyed().config("emit", "last").open().unwrap_err();
        assert!(
            err.is_invalid_config() && err.message().contains("`emit` = \"last\""),
            "{err}"
        );
        let err = Harness::<Count>::builder().open().unwrap_err();
        assert!(
            err.is_invalid_config() && err.message().contains("key_by"),
            "{err}"
        );
        let mut h = keyed().open().unwrap();
        let err = h.process_value("no key").unwrap_err();
        assert!(
            !err.is_invalid_config() && err.message().contains("key_by"),
            "{err}"
        );
    }
}
