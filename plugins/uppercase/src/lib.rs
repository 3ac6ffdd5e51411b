//! `uppercase`: turns each record's value to upper case, keeping key and timestamp.
//!
//! UTF-8 values get full Unicode upper-casing (`ß` becomes `SS`); other values get ASCII
//! upper-casing of their bytes. Takes no configuration.

use sluice_sdk::{Context, OpenContext, Operator, Record, Result};

sluice_sdk::config_keys!(KEYS = []);

/// The operator; it has no state.
pub struct Uppercase;

impl Operator for Uppercase {
    fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        ctx.config().check_known(KEYS)?;
        Ok(Uppercase)
    }

    fn process(&mut self, record: Record<'_>, ctx: &mut Context<'_>) -> Result<()> {
        match std::str::from_utf8(record.value) {
            Ok(text) => ctx.emit(record.key, text.to_uppercase().as_bytes()),
            Err(_) => ctx.emit(record.key, &record.value.to_ascii_uppercase()),
        }
        Ok(())
    }
}

sluice_sdk::export!(Uppercase);

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_sdk::testing::Harness;

    #[test]
    fn uppercases_text_and_keeps_key_and_timestamp() -> Result<()> {
        let mut h = Harness::<Uppercase>::builder().open()?;
        h.process(Some("k"), "Straße 1", Some(7))?;
        h.process_value("")?;
        let out = h.output();
        assert_eq!(out[0].value, "STRASSE 1".as_bytes());
        assert_eq!(out[0].key.as_deref(), Some(&b"k"[..]));
        assert_eq!(out[0].timestamp, Some(7));
        assert_eq!(out[1].value, b"");
        assert_eq!(out[1].key, None);
        Ok(())
    }

    #[test]
    fn non_utf8_values_get_ascii_uppercase() -> Result<()> {
        let mut h = Harness::<Uppercase>::builder().open()?;
        h.process_value(b"ab\xffc")?;
        assert_eq!(h.output()[0].value, b"AB\xffC");
        Ok(())
    }

    #[test]
    fn rejects_config() {
        let err = Harness::<Uppercase>::builder()
            .config("mode", "shout")
            .open()
            .unwrap_err();
        assert!(err.is_invalid_config());
        assert!(err.message().contains("`mode`"), "{err}");
    }
}
