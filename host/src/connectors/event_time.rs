//! Event time at the source: reading each record's timestamp and generating watermarks
//! with bounded out-of-orderness.

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};
use sluice_codec::{BatchReader, BatchWriter};

use crate::network::BatchWatermark;

/// Where a source's records carry their event time, and how far out of order they may
/// arrive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventTime {
    /// The field of the (UTF-8) value holding the timestamp in milliseconds; `None`: the
    /// timestamp the record came with (a Kafka record's).
    pub field: Option<usize>,
    /// Separator between fields.
    pub separator: String,
    /// Instead of `field`: the top-level field of a JSON object value (a Kafka source's
    /// with `format = "json"` or `"avro"`, decoded) holding the timestamp.
    pub json_field: Option<String>,
    /// Bounded out-of-orderness in milliseconds.
    pub out_of_orderness_ms: i64,
}

/// The watermark generator of one source subtask, Flink's `BoundedOutOfOrderness`:
/// after the records seen so far, the watermark is `max timestamp − bound − 1`.
///
/// A watermark goes before each record that follows a new maximum (inside the batch, see
/// [`BatchWatermark`]) and after each batch, so every record is judged against the
/// watermark of exactly the records before it, at any batch size.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatermarkGenerator {
    /// Largest timestamp seen.
    pub max_timestamp: Option<i64>,
}

impl WatermarkGenerator {
    /// Gives every record of `batch` its timestamp (rewriting the batch), remembering the
    /// largest; returns the batch and the watermarks before its records that came after a
    /// new maximum (above `emitted`, the last watermark sent, which it updates).
    pub fn assign(
        &mut self,
        spec: &EventTime,
        batch: &[u8],
        emitted: &mut i64,
    ) -> Result<(Vec<u8>, Vec<BatchWatermark>)> {
        let mut out = BatchWriter::with_capacity(batch.len() + batch.len() / 4);
        let mut watermarks = Vec::new();
        for (n, record) in BatchReader::new(batch).enumerate() {
            let record = record?;
            if n > 0
                && let Some(w) = self.watermark(spec)
                && w > *emitted
            {
                watermarks.push(BatchWatermark {
                    before: n as u32,
                    watermark: w,
                });
                *emitted = w;
            }
            let ts = match (&spec.json_field, spec.field) {
                (Some(name), _) => json_timestamp(name, record.value)?,
                (None, Some(field)) => timestamp_of(spec, field, record.value)?,
                (None, None) => record.timestamp.ok_or_else(|| {
                    anyhow::anyhow!(
                        "record {:?} came without a timestamp (`timestamp = \"record\"`)",
                        String::from_utf8_lossy(record.value)
                    )
                })?,
            };
            self.max_timestamp = Some(self.max_timestamp.map_or(ts, |m| m.max(ts)));
            out.push_record(sluice_codec::RecordRef {
                timestamp: Some(ts),
                ..record
            });
        }
        Ok((out.into_bytes(), watermarks))
    }

    /// The watermark after the records seen so far, if any was seen.
    pub fn watermark(&self, spec: &EventTime) -> Option<i64> {
        self.max_timestamp
            .map(|m| m.saturating_sub(spec.out_of_orderness_ms).saturating_sub(1))
    }
}

/// The timestamp in field `index` of `value`, or why there is none.
pub fn timestamp_of(spec: &EventTime, index: usize, value: &[u8]) -> Result<i64> {
    let parsed = crate::network::field_of(value, &spec.separator, index)
        .map(|field| parse_millis(&String::from_utf8_lossy(field)));
    match parsed {
        Some(Ok(ts)) => Ok(ts),
        Some(Err(field)) => bail!(
            "record {:?}: timestamp field {index} is {field:?}, not a number of milliseconds",
            String::from_utf8_lossy(value)
        ),
        None => bail!(
            "record {:?} has no timestamp field {index} (fields separated by {:?})",
            String::from_utf8_lossy(value),
            spec.separator
        ),
    }
}

/// The milliseconds in the top-level field `name` of the JSON object `value` (a number,
/// or a string of digits), or why there are none. Reads past the other fields without
/// building them.
pub fn json_timestamp(name: &str, value: &[u8]) -> Result<i64> {
    use serde::de::{DeserializeSeed, IgnoredAny, MapAccess, Visitor};

    /// Finds field `.0` of an object.
    struct Find<'n>(&'n str);
    /// Whether a key is `.0`.
    struct KeyIs<'n>(&'n str);

    impl<'de> DeserializeSeed<'de> for KeyIs<'_> {
        type Value = bool;
        fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
            d.deserialize_str(self)
        }
    }
    impl<'de> Visitor<'de> for KeyIs<'_> {
        type Value = bool;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a field name")
        }
        fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<bool, E> {
            Ok(key == self.0)
        }
    }
    impl<'de> DeserializeSeed<'de> for Find<'_> {
        type Value = Option<serde_json::Value>;
        fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_map(self)
        }
    }
    impl<'de> Visitor<'de> for Find<'_> {
        type Value = Option<serde_json::Value>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut found = None;
            while let Some(is) = map.next_key_seed(KeyIs(self.0))? {
                if is && found.is_none() {
                    found = Some(map.next_value()?);
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(found)
        }
    }

    let shown = || String::from_utf8_lossy(&value[..value.len().min(200)]).into_owned();
    let mut de = serde_json::Deserializer::from_slice(value);
    let found = Find(name)
        .deserialize(&mut de)
        .map_err(|e| anyhow::anyhow!("record {:?}: not a JSON object ({e})", shown()))?;
    match found {
        Some(serde_json::Value::Number(n)) if n.is_i64() => Ok(n.as_i64().expect("i64")),
        Some(serde_json::Value::String(s)) if parse_millis(&s).is_ok() => {
            Ok(parse_millis(&s).expect("checked"))
        }
        Some(other) => bail!(
            "record {:?}: timestamp field {name:?} is {other}, not a number of milliseconds",
            shown()
        ),
        None => bail!("record {:?} has no timestamp field {name:?}", shown()),
    }
}

/// A timestamp field's milliseconds, or the field when it is not a number.
fn parse_millis(field: &str) -> Result<i64, String> {
    field.trim().parse().map_err(|_| field.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(bound: i64) -> EventTime {
        EventTime {
            field: Some(0),
            separator: ",".into(),
            json_field: None,
            out_of_orderness_ms: bound,
        }
    }

    /// The timestamp is the field `str::split` gives on the value as (lossy) text,
    /// whatever the separator; the errors name the record and the field.
    #[test]
    fn timestamp_fields_are_split_as_text_splits() {
        let values: [&[u8]; 8] = [
            b"100,a",
            b" 7 ,x",
            b"a,-5",
            "wörld,42,日本".as_bytes(),
            b"\xff,9,\xfe",
            b"1::2:::3",
            "é→12→x".as_bytes(),
            b"",
        ];
        for separator in [",", ":", "::", "\t", "→", "é"] {
            for value in values {
                for index in 0..4 {
                    let spec = EventTime {
                        field: Some(index),
                        separator: separator.into(),
                        json_field: None,
                        out_of_orderness_ms: 0,
                    };
                    let text = String::from_utf8_lossy(value);
                    let field = text.split(separator).nth(index);
                    match (timestamp_of(&spec, index, value), field) {
                        (Ok(ts), Some(field)) => assert_eq!(Ok(ts), field.trim().parse()),
                        (Err(e), Some(field)) => {
                            assert!(field.trim().parse::<i64>().is_err(), "{field:?}");
                            let e = e.to_string();
                            assert!(e.contains(&format!("{field:?}")), "{e}");
                        }
                        (Err(e), None) => {
                            let e = e.to_string();
                            assert!(e.contains("has no timestamp field"), "{e}");
                        }
                        (Ok(ts), None) => panic!("{value:?} {separator:?} {index}: {ts}"),
                    }
                }
            }
        }
    }

    #[test]
    fn timestamps_come_from_the_field_and_the_watermark_trails_the_maximum() {
        let mut w = BatchWriter::new();
        for v in ["100,a", "250,b", "180,c"] {
            w.push(None, v.as_bytes(), None);
        }
        let mut generator = WatermarkGenerator::default();
        assert_eq!(generator.watermark(&spec(50)), None);
        let mut emitted = i64::MIN;
        let (out, watermarks) = generator
            .assign(&spec(50), w.as_bytes(), &mut emitted)
            .unwrap();
        // Before "250,b": 100 − 50 − 1; before "180,c": 250 − 50 − 1.
        assert_eq!(
            watermarks,
            [
                BatchWatermark {
                    before: 1,
                    watermark: 49
                },
                BatchWatermark {
                    before: 2,
                    watermark: 199
                }
            ]
        );
        assert_eq!(emitted, 199);
        let ts: Vec<i64> = BatchReader::new(&out)
            .map(|r| r.unwrap().timestamp.unwrap())
            .collect();
        assert_eq!(ts, [100, 250, 180]);
        // Flink's formula: max − bound − 1.
        assert_eq!(generator.watermark(&spec(50)), Some(199));
    }

    #[test]
    fn record_timestamps_are_kept_and_a_record_without_one_is_named() {
        let spec = EventTime {
            field: None,
            ..spec(10)
        };
        let mut w = BatchWriter::new();
        w.push(None, b"a", Some(500));
        w.push(None, b"b", Some(400));
        let mut generator = WatermarkGenerator::default();
        let (out, _) = generator
            .assign(&spec, w.as_bytes(), &mut i64::MIN.clone())
            .unwrap();
        let ts: Vec<i64> = BatchReader::new(&out)
            .map(|r| r.unwrap().timestamp.unwrap())
            .collect();
        assert_eq!(ts, [500, 400]);
        assert_eq!(generator.watermark(&spec), Some(489));
        let mut w = BatchWriter::new();
        w.push(None, b"late", None);
        let err = generator
            .assign(&spec, w.as_bytes(), &mut i64::MIN.clone())
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("\"late\" came without a timestamp"),
            "{err}"
        );
    }

    #[test]
    fn a_record_without_a_usable_timestamp_is_an_error_naming_it() {
        let mut w = BatchWriter::new();
        w.push(None, b"soon,a", None);
        let err = WatermarkGenerator::default()
            .assign(&spec(0), w.as_bytes(), &mut i64::MIN.clone())
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("\"soon,a\": timestamp field 0 is \"soon\""),
            "{err}"
        );
        let mut w = BatchWriter::new();
        w.push(None, b"12", None);
        let spec2 = EventTime {
            field: Some(1),
            ..spec(0)
        };
        let err = WatermarkGenerator::default()
            .assign(&spec2, w.as_bytes(), &mut i64::MIN.clone())
            .unwrap_err();
        assert!(
            err.to_string().contains("has no timestamp field 1"),
            "{err}"
        );
    }

    #[test]
    fn json_timestamps_are_a_top_level_field_of_milliseconds() {
        let v = br#"{"a":{"ts":1},"ts":1700000000123,"b":[1,{"ts":2}]}"#;
        assert_eq!(json_timestamp("ts", v).unwrap(), 1_700_000_000_123);
        assert_eq!(json_timestamp("t", br#"{"t":" 42 "}"#).unwrap(), 42);
        assert_eq!(json_timestamp("t", br#"{"t":-5}"#).unwrap(), -5);
        let e = json_timestamp("ts", br#"{"a":1}"#).unwrap_err().to_string();
        assert_eq!(e, r#"record "{\"a\":1}" has no timestamp field "ts""#);
        let e = json_timestamp("t", br#"{"t":1.5}"#)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(r#"timestamp field "t" is 1.5, not a number of milliseconds"#),
            "{e}"
        );
        let e = json_timestamp("t", br#"{"t":"2024-01-01"}"#)
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a number of milliseconds"), "{e}");
        assert!(
            json_timestamp("t", b"[1]")
                .unwrap_err()
                .to_string()
                .contains("not a JSON object")
        );
        assert!(json_timestamp("t", b"{\"t\":").is_err());
    }
}
