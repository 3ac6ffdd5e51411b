//! `{{name}}`: counts the records of each key and emits the running count. The counts
//! live in the host's keyed state: checkpointed, restored and rescaled with the job.
//!
//! Input: keyed (`key_by` in the job file).

use sluice_sdk::{Context, Error, OpenContext, Operator, Record, Result, ValueState};

sluice_sdk::config_keys!(KEYS = []);

/// The operator.
pub struct {{Type}} {
    counts: ValueState<u64>,
}

impl Operator for {{Type}} {
    fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        ctx.config().check_known(KEYS)?;
        if !ctx.is_keyed() {
            return Err(Error::invalid_config(
                "{{name}} needs keyed input: set `key_by` for it in the job file",
            ));
        }
        Ok({{Type}} {
            counts: ctx.value_state("counts")?,
        })
    }

    fn process(&mut self, record: Record<'_>, ctx: &mut Context<'_>) -> Result<()> {
        let key = record.require_key()?;
        let count = self.counts.get(ctx, key)?.unwrap_or(0) + 1;
        self.counts.put(ctx, key, &count)?;
        ctx.emit(Some(key), count.to_string().as_bytes());
        Ok(())
    }
}

sluice_sdk::export!({{Type}});

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_sdk::testing::Harness;

    #[test]
    fn counts_per_key_across_a_restore() -> Result<()> {
        let mut h = Harness::<{{Type}}>::builder().keyed(true).open()?;
        h.process(Some("a"), "x", None)?;
        h.process(Some("b"), "x", None)?;
        h.process(Some("a"), "x", None)?;
        assert_eq!(h.output_values_str(), ["1", "1", "2"]);
        let snapshot = h.snapshot(1)?;
        let mut restored = Harness::<{{Type}}>::builder()
            .keyed(true)
            .restore_from(&snapshot)
            .open()?;
        restored.process(Some("a"), "x", None)?;
        assert_eq!(restored.output_values_str(), ["3"]);
        Ok(())
    }

    #[test]
    fn unkeyed_input_is_refused() {
        let err = Harness::<{{Type}}>::builder().open().unwrap_err();
        assert!(err.is_invalid_config(), "{err}");
    }
}
