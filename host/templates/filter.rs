//! `{{name}}`: keeps the records whose value contains a word, drops the others, and
//! counts both.
//!
//! Config: `contains` (required).

use sluice_sdk::{Context, OpenContext, Operator, Record, Result};

sluice_sdk::config_keys!(KEYS = ["contains"]);

/// The operator.
pub struct {{Type}} {
    needle: String,
}

impl Operator for {{Type}} {
    fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        let config = ctx.config();
        config.check_known(KEYS)?;
        Ok({{Type}} {
            needle: config.require("contains")?.to_string(),
        })
    }

    fn process(&mut self, record: Record<'_>, ctx: &mut Context<'_>) -> Result<()> {
        if record.value_str()?.contains(&self.needle) {
            ctx.add_counter("kept", 1);
            ctx.emit_record(record);
        } else {
            ctx.add_counter("dropped", 1);
        }
        Ok(())
    }
}

sluice_sdk::export!({{Type}});

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_sdk::testing::Harness;

    #[test]
    fn keeps_what_contains_the_word() -> Result<()> {
        let mut h = Harness::<{{Type}}>::builder().config("contains", "ab").open()?;
        for value in ["xaby", "xy", "ab"] {
            h.process_value(value)?;
        }
        assert_eq!(h.output_values_str(), ["xaby", "ab"]);
        assert_eq!((h.counter("kept"), h.counter("dropped")), (2, 1));
        Ok(())
    }

    #[test]
    fn the_word_is_required() {
        let err = Harness::<{{Type}}>::builder().open().unwrap_err();
        assert!(err.is_invalid_config(), "{err}");
    }
}
