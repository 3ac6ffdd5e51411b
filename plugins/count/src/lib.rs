//! `count`: the running number of records per key.
//!
//! For each record, adds one to its key's count and emits key = the record's key, value =
//! the new count. The counts live in the host's keyed state (a `ValueState<u64>` named
//! `count`), so they are checkpointed, restored and redistributed with the keys. The input
//! must be keyed (`key_by` in the job file).
//!
//! Config:
//! - `format`: `text` (default, the count as decimal UTF-8) or `postcard` (a postcard `u64`).

use sluice_sdk::{Context, Error, OpenContext, Operator, Record, Result, ValueState};

/// The operator.
pub struct Count {
    counts: ValueState<u64>,
    postcard: bool,
}

impl Operator for Count {
    fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        ctx.config().check_known(&["format"])?;
        let postcard = match ctx.config().get("format").unwrap_or("text") {
            "text" => false,
            "postcard" => true,
            other => {
                let why = format!("config `format` = {other:?}: expected `text` or `postcard`");
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
        })
    }

    fn process(&mut self, record: Record<'_>, ctx: &mut Context<'_>) -> Result<()> {
        let key = record.require_key()?;
        let count = self.counts.get(ctx, key)?.unwrap_or(0) + 1;
        self.counts.put(ctx, key, &count)?;
        if self.postcard {
            ctx.emit_typed(Some(key), &count)?;
        } else {
            ctx.emit(Some(key), count.to_string().as_bytes());
        }
        Ok(())
    }
}

sluice_sdk::export!(Count);

#[cfg(test)]
mod tests {
    use super::*;
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
    fn errors() {
        let err = keyed().config("format", "json").open().unwrap_err();
        assert!(
            err.is_invalid_config() && err.message().contains("`format`"),
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
