//! `tokenize`: splits each line of text into lowercase words.
//!
//! Every input value is read as UTF-8 text and split on characters that are not
//! alphanumeric (`char::is_alphanumeric`, so letters and digits of any script). Each word is
//! lowercased and emitted with key = value = the word, keeping the line's timestamp, which
//! makes the output ready to be partitioned by word.
//!
//! Config:
//! - `min-length` (default 1): drop words shorter than this many characters.

use sluice_sdk::{Context, OpenContext, Operator, Record, Result};

sluice_sdk::config_keys!(KEYS = ["min-length"]);

/// The operator.
pub struct Tokenize {
    min_length: usize,
}

impl Operator for Tokenize {
    fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        let config = ctx.config();
        config.check_known(KEYS)?;
        Ok(Tokenize {
            min_length: config.parse_or("min-length", 1)?,
        })
    }

    fn process(&mut self, record: Record<'_>, ctx: &mut Context<'_>) -> Result<()> {
        let line = record.value_str()?;
        for word in line.split(|c: char| !c.is_alphanumeric()) {
            if word.is_empty() || word.chars().count() < self.min_length {
                continue;
            }
            if word
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            {
                // Already lowercase: no copy needed.
                ctx.emit(Some(word.as_bytes()), word.as_bytes());
            } else {
                let word = word.to_lowercase();
                ctx.emit(Some(word.as_bytes()), word.as_bytes());
            }
        }
        Ok(())
    }
}

sluice_sdk::export!(Tokenize);

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_sdk::testing::Harness;

    #[test]
    fn splits_lowercases_and_keys_by_word() -> Result<()> {
        let mut h = Harness::<Tokenize>::builder().open()?;
        h.process(None::<&str>, "Hello, wörld! It's 2024...", Some(9))?;
        assert_eq!(h.output_values_str(), ["hello", "wörld", "it", "s", "2024"]);
        for record in h.output() {
            assert_eq!(record.key.as_deref(), Some(&record.value[..]));
            assert_eq!(record.timestamp, Some(9));
        }
        Ok(())
    }

    #[test]
    fn min_length_counts_characters() -> Result<()> {
        let mut h = Harness::<Tokenize>::builder()
            .config("min-length", "3")
            .open()?;
        h.process_value("a an ÄÖÜ the of")?;
        assert_eq!(h.output_values_str(), ["äöü", "the"]);
        Ok(())
    }

    #[test]
    fn empty_and_separator_only_lines_emit_nothing() -> Result<()> {
        let mut h = Harness::<Tokenize>::builder().open()?;
        h.process_value("")?;
        h.process_value(" -- !? ")?;
        assert!(h.output().is_empty());
        Ok(())
    }

    #[test]
    fn bad_config_and_bad_input_are_errors() {
        let err = Harness::<Tokenize>::builder()
            .config("min-length", "-1")
            .open()
            .unwrap_err();
        assert!(
            err.is_invalid_config() && err.message().contains("min-length"),
            "{err}"
        );
        let err = Harness::<Tokenize>::builder()
            .config("min_length", "2")
            .open()
            .unwrap_err();
        assert!(
            err.is_invalid_config() && err.message().contains("min_length"),
            "{err}"
        );

        let mut h = Harness::<Tokenize>::builder().open().unwrap();
        let err = h.process_value(b"caf\xe9").unwrap_err();
        assert!(!err.is_invalid_config());
        assert!(err.message().contains("not valid UTF-8"), "{err}");
    }
}
