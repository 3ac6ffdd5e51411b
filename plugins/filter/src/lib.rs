//! `filter`: passes on the records whose value (or key) meets every configured condition.
//!
//! Passing records are emitted unchanged. The tested field is read as UTF-8 text; a record
//! whose field is not valid UTF-8 (or that has no key, when testing the key) fails the task.
//!
//! Config (every condition given must hold; none given passes everything):
//! - `field`: `value` (default), `key`, or `header:NAME` (the record's first header
//!   `NAME`, e.g. of a Kafka record; a record without it meets no condition).
//! - `min-length`, `max-length`: bounds on the length in characters, inclusive.
//! - `contains`, `prefix`, `suffix`: substring tests.
//! - `one-of`: comma-separated list; the field must equal one of them.
//! - `none-of`: comma-separated list; the field must equal none of them (stop words).
//! - `negate` (`true`/`false`, default `false`): pass exactly the records that fail.
//!
//! List items are trimmed of surrounding whitespace and empty items are ignored.

use sluice_sdk::{Config, Context, Error, OpenContext, Operator, Record, Result};

sluice_sdk::config_keys!(
    KEYS = [
        "field",
        "min-length",
        "max-length",
        "contains",
        "prefix",
        "suffix",
        "one-of",
        "none-of",
        "negate",
    ]
);

/// The operator: the parsed predicate.
pub struct Filter {
    field: Field,
    min_length: Option<usize>,
    max_length: Option<usize>,
    contains: Option<String>,
    prefix: Option<String>,
    suffix: Option<String>,
    one_of: Option<Vec<String>>,
    none_of: Vec<String>,
    negate: bool,
}

/// The part of a record the conditions test.
enum Field {
    Value,
    Key,
    Header(String),
}

fn list(config: &Config, key: &str) -> Option<Vec<String>> {
    let items = config.get(key)?.split(',').map(str::trim);
    Some(items.filter(|s| !s.is_empty()).map(str::to_owned).collect())
}

impl Filter {
    fn matches(&self, text: &str) -> bool {
        let len = || text.chars().count();
        self.min_length.is_none_or(|min| len() >= min)
            && self.max_length.is_none_or(|max| len() <= max)
            && self.contains.as_deref().is_none_or(|s| text.contains(s))
            && self.prefix.as_deref().is_none_or(|s| text.starts_with(s))
            && self.suffix.as_deref().is_none_or(|s| text.ends_with(s))
            && self
                .one_of
                .as_ref()
                .is_none_or(|l| l.iter().any(|s| s == text))
            && !self.none_of.iter().any(|s| s == text)
    }
}

impl Operator for Filter {
    fn open(ctx: &mut OpenContext<'_>) -> Result<Self> {
        let config = ctx.config();
        config.check_known(KEYS)?;
        let field = match config.get("field").unwrap_or("value") {
            "value" => Field::Value,
            "key" => Field::Key,
            other => match other.strip_prefix("header:") {
                Some(name) if !name.is_empty() => Field::Header(name.to_owned()),
                _ => {
                    let why = format!(
                        "config `field` = {other:?}: expected `value`, `key` or `header:NAME`"
                    );
                    return Err(Error::invalid_config(why));
                }
            },
        };
        Ok(Filter {
            field,
            min_length: config.parse("min-length")?,
            max_length: config.parse("max-length")?,
            contains: config.get("contains").map(str::to_owned),
            prefix: config.get("prefix").map(str::to_owned),
            suffix: config.get("suffix").map(str::to_owned),
            one_of: list(config, "one-of"),
            none_of: list(config, "none-of").unwrap_or_default(),
            negate: config.parse_or("negate", false)?,
        })
    }

    fn process(&mut self, record: Record<'_>, ctx: &mut Context<'_>) -> Result<()> {
        let matches = match &self.field {
            Field::Value => self.matches(record.value_str()?),
            Field::Key => self.matches(record.key_str()?),
            Field::Header(name) => match ctx.header(name) {
                Some(value) => self.matches(std::str::from_utf8(value).map_err(|_| {
                    Error::failed(format!("header `{name}` of a record is not valid UTF-8"))
                })?),
                None => false,
            },
        };
        if matches != self.negate {
            ctx.emit_record(record);
        }
        Ok(())
    }
}

sluice_sdk::export!(Filter);

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_sdk::testing::Harness;

    /// The values of `inputs` that pass a filter configured with `config`.
    fn passing(config: &[(&str, &str)], inputs: &[&str]) -> Vec<String> {
        let mut builder = Harness::<Filter>::builder();
        for (k, v) in config {
            builder = builder.config(*k, *v);
        }
        let mut h = builder.open().unwrap();
        for input in inputs {
            h.process_value(input).unwrap();
        }
        h.output_values_str()
    }

    const WORDS: &[&str] = &["a", "the", "über", "stream", "streams", "upstream"];

    #[test]
    fn a_header_can_be_tested_and_passes_on_with_its_record() {
        let mut h = Harness::<Filter>::builder()
            .config("field", "header:type")
            .config("one-of", "click")
            .open()
            .unwrap();
        let record = |v: &'static str| Record::new(v.as_bytes());
        h.process_with_headers(record("a"), &[("type", "click"), ("x", "1")], Some(3))
            .unwrap();
        h.process_with_headers(record("b"), &[("type", "view")], Some(3))
            .unwrap();
        h.process_with_headers(record("c"), &[], None).unwrap();
        h.process_value("d").unwrap();
        assert_eq!(h.output_values_str(), ["a"]);
        // The record goes on whole: headers and partition.
        let raw = h.take_raw_output();
        let passed: Vec<_> = raw
            .iter()
            .flat_map(|b| sluice_sdk::codec::BatchReader::new(b))
            .map(Result::unwrap)
            .collect();
        assert_eq!(passed.len(), 1);
        assert_eq!(passed[0].partition, Some(3));
        let headers: Vec<_> = passed[0].headers.unwrap().iter().collect();
        assert_eq!(headers, [(&b"type"[..], &b"click"[..]), (b"x", b"1")]);
    }

    #[test]
    fn each_condition() {
        assert_eq!(passing(&[], WORDS), WORDS);
        assert_eq!(
            passing(&[("min-length", "4")], WORDS),
            ["über", "stream", "streams", "upstream"]
        );
        assert_eq!(passing(&[("max-length", "4")], WORDS), ["a", "the", "über"]);
        assert_eq!(
            passing(&[("contains", "ea")], WORDS),
            ["stream", "streams", "upstream"]
        );
        assert_eq!(passing(&[("prefix", "str")], WORDS), ["stream", "streams"]);
        assert_eq!(passing(&[("suffix", "am")], WORDS), ["stream", "upstream"]);
        assert_eq!(
            passing(&[("one-of", "the, über,,")], WORDS),
            ["the", "über"]
        );
        assert_eq!(
            passing(&[("none-of", "a,the")], WORDS),
            ["über", "stream", "streams", "upstream"]
        );
    }

    #[test]
    fn conditions_combine_and_negate_inverts_the_whole() {
        let config = [("contains", "stream"), ("max-length", "6")];
        assert_eq!(passing(&config, WORDS), ["stream"]);
        let negated = [config[0], config[1], ("negate", "true")];
        assert_eq!(
            passing(&negated, WORDS),
            ["a", "the", "über", "streams", "upstream"]
        );
        assert_eq!(passing(&[("negate", "false")], WORDS), WORDS);
    }

    #[test]
    fn tests_the_key_when_asked_and_emits_records_unchanged() -> Result<()> {
        let mut h = Harness::<Filter>::builder()
            .config("field", "key")
            .config("prefix", "k")
            .open()?;
        h.process(Some("k1"), b"\xff", Some(3))?;
        h.process(Some("x1"), "dropped", None)?;
        assert_eq!(h.output().len(), 1);
        let out = h.output()[0].as_record();
        assert_eq!(
            (out.key, out.value, out.timestamp),
            (Some(&b"k1"[..]), &b"\xff"[..], Some(3))
        );
        let err = h.process_value("no key").unwrap_err();
        assert!(err.message().contains("no key"), "{err}");
        Ok(())
    }

    #[test]
    fn config_and_input_errors_name_their_cause() {
        for (key, value) in [
            ("min-length", "x"),
            ("max-length", "-2"),
            ("negate", "yes"),
            ("field", "both"),
        ] {
            let err = Harness::<Filter>::builder()
                .config(key, value)
                .open()
                .unwrap_err();
            assert!(err.is_invalid_config(), "{err}");
            assert!(err.message().contains(&format!("`{key}`")), "{err}");
        }
        let err = Harness::<Filter>::builder()
            .config("max-len", "2")
            .open()
            .unwrap_err();
        assert!(
            err.is_invalid_config() && err.message().contains("`max-len`"),
            "{err}"
        );
        let mut h = Harness::<Filter>::builder().open().unwrap();
        let err = h.process_value(b"\xff").unwrap_err();
        assert!(!err.is_invalid_config());
        assert!(
            err.message().contains("record value is not valid UTF-8"),
            "{err}"
        );
    }
}
