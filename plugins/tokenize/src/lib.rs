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
    /// A lowercased ASCII word.
    lower: Vec<u8>,
}

impl Operator for Tokenize {
    fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        let config = ctx.config();
        config.check_known(KEYS)?;
        Ok(Tokenize {
            min_length: config.parse_or("min-length", 1)?,
            lower: Vec::new(),
        })
    }

    fn process(&mut self, record: Record<'_>, ctx: &mut Context<'_>) -> Result<()> {
        let mut emit = |word: &[u8]| ctx.emit(Some(word), word);
        if record.value.is_ascii() {
            ascii_words(record.value, self.min_length, &mut self.lower, &mut emit);
        } else {
            words(record.value_str()?, self.min_length, &mut emit);
        }
        Ok(())
    }
}

/// Calls `emit` with each word of `line` of at least `min_length` characters, lowercased.
fn words(line: &str, min_length: usize, emit: &mut impl FnMut(&[u8])) {
    for word in line.split(|c: char| !c.is_alphanumeric()) {
        if word.is_empty() || word.chars().count() < min_length {
            continue;
        }
        if word
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        {
            // Already lowercase: no copy needed.
            emit(word.as_bytes());
        } else {
            emit(word.to_lowercase().as_bytes());
        }
    }
}

/// [`words`] for ASCII text (most lines), byte by byte: there the alphanumeric characters
/// are the ASCII letters and digits, each one byte, lowercased one byte at a time
/// (into `lower`).
fn ascii_words(line: &[u8], min_length: usize, lower: &mut Vec<u8>, emit: &mut impl FnMut(&[u8])) {
    let mut rest = line;
    while let Some(start) = rest.iter().position(u8::is_ascii_alphanumeric) {
        rest = &rest[start..];
        let len = rest
            .iter()
            .position(|b| !b.is_ascii_alphanumeric())
            .unwrap_or(rest.len());
        let (word, tail) = rest.split_at(len);
        rest = tail;
        if len < min_length.max(1) {
            continue;
        }
        if word.iter().any(u8::is_ascii_uppercase) {
            lower.clear();
            lower.extend(word.iter().map(u8::to_ascii_lowercase));
            emit(lower);
        } else {
            emit(word);
        }
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
    fn ascii_lines_split_as_any_text_does() {
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        const BYTES: &[u8] = b"aZ09 ,.-_\t!'Mx";
        let mut lower = Vec::new();
        for _ in 0..2000 {
            let len = next(40) as usize;
            let line: Vec<u8> = (0..len)
                .map(|_| BYTES[next(BYTES.len() as u64) as usize])
                .collect();
            let line = std::str::from_utf8(&line).unwrap();
            for min_length in [0, 1, 2, 3] {
                let (mut want, mut got) = (vec![], vec![]);
                words(line, min_length, &mut |w| want.push(w.to_vec()));
                ascii_words(line.as_bytes(), min_length, &mut lower, &mut |w| {
                    got.push(w.to_vec())
                });
                assert_eq!(got, want, "{line:?}, min-length {min_length}");
            }
        }
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
