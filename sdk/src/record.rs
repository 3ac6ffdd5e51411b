//! Records and the typed (postcard) encoding of values.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::{Error, Result};

/// One input record, borrowed from the batch the host passed in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    /// The record's key, if the operator that emitted it set one. On keyed input this is
    /// the key the stream is partitioned by, and the key to use for keyed state and timers.
    pub key: Option<&'a [u8]>,
    /// The payload.
    pub value: &'a [u8],
    /// Event time in milliseconds, if the record has one.
    pub timestamp: Option<i64>,
}

impl<'a> Record<'a> {
    /// A record without key and timestamp.
    pub fn new(value: &'a [u8]) -> Self {
        Record {
            key: None,
            value,
            timestamp: None,
        }
    }

    /// The value as UTF-8 text.
    ///
    /// # Errors
    ///
    /// [`Error::Failed`] saying that the record value is not valid UTF-8, and where.
    #[inline]
    pub fn value_str(&self) -> Result<&'a str> {
        utf8(self.value).map_err(|e| not_utf8("value", e))
    }

    /// The key as UTF-8 text.
    ///
    /// # Errors
    ///
    /// [`Error::Failed`] when the record has no key or the key is not valid UTF-8.
    #[inline]
    pub fn key_str(&self) -> Result<&'a str> {
        utf8(self.require_key()?).map_err(|e| not_utf8("key", e))
    }

    /// The key, for operators that need keyed input.
    ///
    /// # Errors
    ///
    /// [`Error::Failed`] when the record has no key, explaining that the input must be
    /// keyed.
    #[inline]
    pub fn require_key(&self) -> Result<&'a [u8]> {
        self.key.ok_or_else(no_key)
    }

    /// The value decoded from postcard, the encoding [`Context::emit_typed`] writes.
    ///
    /// [`Context::emit_typed`]: crate::Context::emit_typed
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T> {
        from_bytes(self.value)
    }

    /// The value read as JSON into a `T` (any `serde` type: a struct with the fields
    /// it needs, or `serde_json::Value`). A source with `format = "json"` or `"avro"`
    /// hands operators JSON: an Avro record is an object with its fields.
    ///
    /// # Errors
    ///
    /// [`Error::Failed`] saying where the value is not JSON or not a `T`.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T> {
        serde_json::from_slice(self.value)
            .map_err(|e| Error::failed(format!("record value is not the JSON expected: {e}")))
    }

    /// An owned copy.
    pub fn to_owned_record(&self) -> OwnedRecord {
        OwnedRecord {
            key: self.key.map(<[u8]>::to_vec),
            value: self.value.to_vec(),
            timestamp: self.timestamp,
        }
    }
}

impl<'a> From<sluice_codec::RecordRef<'a>> for Record<'a> {
    fn from(r: sluice_codec::RecordRef<'a>) -> Self {
        Record {
            key: r.key,
            value: r.value,
            timestamp: r.timestamp,
        }
    }
}

/// A record that owns its bytes, as the [test harness](crate::testing) collects output.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OwnedRecord {
    /// The record's key, if any.
    pub key: Option<Vec<u8>>,
    /// The payload.
    pub value: Vec<u8>,
    /// Event time in milliseconds, if any.
    pub timestamp: Option<i64>,
}

impl OwnedRecord {
    /// A borrowed view.
    pub fn as_record(&self) -> Record<'_> {
        Record {
            key: self.key.as_deref(),
            value: &self.value,
            timestamp: self.timestamp,
        }
    }

    /// The value as UTF-8 text; see [`Record::value_str`].
    pub fn value_str(&self) -> Result<&str> {
        self.as_record().value_str()
    }

    /// The key as UTF-8 text; see [`Record::key_str`].
    pub fn key_str(&self) -> Result<&str> {
        self.as_record().key_str()
    }

    /// The value decoded from postcard; see [`Record::decode`].
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T> {
        from_bytes(&self.value)
    }
}

/// The error of a record without a key where one is needed.
#[cold]
fn no_key() -> Error {
    Error::failed(
        "record has no key: this operator needs keyed input \
         (partition its input with `key_by` in the job file)",
    )
}

/// The error of a record's `part` that is not UTF-8 text (out of line: the check is
/// inlined where it is used, and text usually is UTF-8).
#[cold]
fn not_utf8(part: &str, e: std::str::Utf8Error) -> Error {
    Error::failed(format!("record {part} is not valid UTF-8: {e}"))
}

/// `bytes` as UTF-8 text. Text that is all ASCII (most keys and words) is recognised
/// by a plain byte test first: compiled to Wasm, std's UTF-8 validation costs several
/// times more per short string than the test, and its result is the same.
#[inline]
fn utf8(bytes: &[u8]) -> std::result::Result<&str, std::str::Utf8Error> {
    if bytes.is_ascii() {
        // SAFETY: every ASCII byte sequence is valid UTF-8.
        return Ok(unsafe { std::str::from_utf8_unchecked(bytes) });
    }
    std::str::from_utf8(bytes)
}

/// Encodes `value` with postcard, the encoding the SDK uses for typed values and state.
pub fn to_bytes<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>> {
    Ok(postcard::to_stdvec(value)?)
}

/// Decodes a value written by [`to_bytes`].
///
/// # Errors
///
/// [`Error::Failed`] when `bytes` is not a postcard encoding of `T` or has bytes left over.
#[inline]
pub fn from_bytes<T: DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    let (value, rest) = postcard::take_from_bytes(bytes)?;
    if !rest.is_empty() {
        return Err(Error::failed(format!(
            "cannot decode a value (postcard): {} bytes left over",
            rest.len()
        )));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_accessors_name_the_problem() {
        let r = Record {
            key: Some(&[0xff]),
            value: &[0xc3],
            timestamp: None,
        };
        assert!(
            r.value_str()
                .unwrap_err()
                .message()
                .contains("record value")
        );
        assert!(r.key_str().unwrap_err().message().contains("record key"));
        let unkeyed = Record::new(b"v");
        assert!(unkeyed.key_str().unwrap_err().message().contains("key_by"));
        assert_eq!(unkeyed.value_str().unwrap(), "v");
    }

    #[test]
    fn text_is_checked_as_std_checks_it() {
        let long = "x".repeat(40);
        let cases: Vec<Vec<u8>> = vec![
            b"".to_vec(),
            b"word".to_vec(),
            b"\x7f\x00 ascii edges".to_vec(),
            "wörld".into(),
            "日本".into(),
            format!("{long}é").into(),
            [long.as_bytes(), b"\x80"].concat(),
            b"\x80".to_vec(),
            b"caf\xe9".to_vec(),
            b"\xc3".to_vec(),
            b"\xed\xa0\x80".to_vec(),
            b"\xf4\x90\x80\x80".to_vec(),
        ];
        for bytes in cases {
            let ours = utf8(&bytes).map_err(|e| e.to_string());
            let std = std::str::from_utf8(&bytes).map_err(|e| e.to_string());
            assert_eq!(ours, std, "{bytes:?}");
            let record = Record {
                key: Some(&bytes),
                value: &bytes,
                timestamp: None,
            };
            assert_eq!(record.value_str().is_ok(), std.is_ok());
            assert_eq!(record.key_str().is_ok(), std.is_ok());
        }
    }

    #[test]
    fn typed_round_trip() {
        let bytes = to_bytes(&(7u32, "seven")).unwrap();
        let r = Record::new(&bytes);
        assert_eq!(
            r.decode::<(u32, String)>().unwrap(),
            (7, "seven".to_owned())
        );
        assert!(
            from_bytes::<u8>(&[1, 2])
                .unwrap_err()
                .message()
                .contains("left over")
        );
    }
}
