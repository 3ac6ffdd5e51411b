//! `{{name}}`: puts a prefix before each record's value, keeping its key and timestamp.
//!
//! Config: `prefix` (default empty).

use sluice_sdk::{Context, OpenContext, Operator, Record, Result};

sluice_sdk::config_keys!(KEYS = ["prefix"]);

/// The operator.
pub struct {{Type}} {
    prefix: Vec<u8>,
}

impl Operator for {{Type}} {
    fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        let config = ctx.config();
        config.check_known(KEYS)?;
        Ok({{Type}} {
            prefix: config.get("prefix").unwrap_or("").as_bytes().to_vec(),
        })
    }

    fn process(&mut self, record: Record<'_>, ctx: &mut Context<'_>) -> Result<()> {
        let mut value = Vec::with_capacity(self.prefix.len() + record.value.len());
        value.extend_from_slice(&self.prefix);
        value.extend_from_slice(record.value);
        ctx.emit(record.key, &value);
        Ok(())
    }
}

sluice_sdk::export!({{Type}});

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_sdk::testing::Harness;

    #[test]
    fn prefixes_values_and_keeps_keys() -> Result<()> {
        let mut h = Harness::<{{Type}}>::builder().config("prefix", "> ").open()?;
        h.process(Some("k"), "hello", Some(7))?;
        assert_eq!(h.output_values_str(), ["> hello"]);
        assert_eq!(h.output()[0].key.as_deref(), Some(&b"k"[..]));
        assert_eq!(h.output()[0].timestamp, Some(7));
        Ok(())
    }

    #[test]
    fn unknown_config_is_refused() {
        let err = Harness::<{{Type}}>::builder().config("prefx", "x").open().unwrap_err();
        assert!(err.is_invalid_config(), "{err}");
    }
}
