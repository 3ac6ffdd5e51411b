//! Record batches.
//!
//! ```text
//! batch  := record*
//! record := flags:u8
//!           [timestamp:i64]            if flags & 0x01
//!           [key_len:u32 key]          if flags & 0x02
//!           value_len:u32 value
//! ```
//! Unknown flag bits are an error, so a later version can give them a meaning.

use crate::{Cursor, DecodeError, put_sized};

const HAS_TIMESTAMP: u8 = 0x01;
const HAS_KEY: u8 = 0x02;
const KNOWN_FLAGS: u8 = HAS_TIMESTAMP | HAS_KEY;

/// One record of a batch, borrowed from the buffer that holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordRef<'a> {
    /// The record's key, if it has one (set by the operator that emitted it).
    pub key: Option<&'a [u8]>,
    /// The payload.
    pub value: &'a [u8],
    /// Event time in milliseconds, if the record has one.
    pub timestamp: Option<i64>,
}

/// Appends records to a flat batch buffer.
#[derive(Debug, Default, Clone)]
pub struct BatchWriter {
    buf: Vec<u8>,
    len: usize,
}

impl BatchWriter {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty batch with room for `bytes` bytes.
    pub fn with_capacity(bytes: usize) -> Self {
        BatchWriter {
            buf: Vec::with_capacity(bytes),
            len: 0,
        }
    }

    /// Appends one record.
    #[inline]
    pub fn push(&mut self, key: Option<&[u8]>, value: &[u8], timestamp: Option<i64>) {
        self.buf
            .reserve(1 + 8 + 4 + key.map_or(0, <[u8]>::len) + 4 + value.len());
        let mut flags = 0;
        if timestamp.is_some() {
            flags |= HAS_TIMESTAMP;
        }
        if key.is_some() {
            flags |= HAS_KEY;
        }
        self.buf.push(flags);
        if let Some(ts) = timestamp {
            self.buf.extend_from_slice(&ts.to_le_bytes());
        }
        if let Some(key) = key {
            put_sized(&mut self.buf, key);
        }
        put_sized(&mut self.buf, value);
        self.len += 1;
    }

    /// Appends a record read from another batch.
    #[inline]
    pub fn push_record(&mut self, record: RecordRef<'_>) {
        self.push(record.key, record.value, record.timestamp);
    }

    /// Appends already-encoded records (for example a whole batch).
    #[inline]
    pub fn extend_encoded(&mut self, encoded: &[u8], records: usize) {
        self.buf.extend_from_slice(encoded);
        self.len += records;
    }

    /// Number of records written.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no record was written.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size of the encoded batch in bytes.
    #[inline]
    pub fn byte_len(&self) -> usize {
        self.buf.len()
    }

    /// The encoded batch so far.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf
    }

    /// Takes the encoded batch, leaving this writer empty (and without capacity).
    pub fn take(&mut self) -> Vec<u8> {
        self.len = 0;
        std::mem::take(&mut self.buf)
    }

    /// Makes room for `bytes` more bytes.
    pub fn reserve(&mut self, bytes: usize) {
        self.buf.reserve(bytes);
    }

    /// Forgets all records but keeps the allocation.
    pub fn clear(&mut self) {
        self.len = 0;
        self.buf.clear();
    }

    /// The encoded batch.
    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }
}

/// Iterates over the records of a flat batch buffer.
///
/// The iterator yields `Err` once, at the first malformed record, and then stops.
#[derive(Debug, Clone)]
pub struct BatchReader<'a> {
    cursor: Cursor<'a>,
    failed: bool,
}

impl<'a> BatchReader<'a> {
    /// Reads `buf` as a batch.
    pub fn new(buf: &'a [u8]) -> Self {
        BatchReader {
            cursor: Cursor::new(buf, "record batch"),
            failed: false,
        }
    }

    /// Checks the whole batch and returns how many records it holds.
    pub fn count(buf: &[u8]) -> Result<usize, DecodeError> {
        let mut n = 0;
        for record in BatchReader::new(buf) {
            record?;
            n += 1;
        }
        Ok(n)
    }

    /// The next record together with its encoded bytes (which
    /// [`BatchWriter::extend_encoded`] can copy as they are).
    #[inline]
    pub fn next_with_bytes(&mut self) -> Option<Result<(RecordRef<'a>, &'a [u8]), DecodeError>> {
        let start = self.cursor.pos;
        let buf = self.cursor.buf;
        self.next()
            .map(|r| r.map(|record| (record, &buf[start..self.cursor.pos])))
    }

    #[inline]
    fn read(&mut self) -> Result<RecordRef<'a>, DecodeError> {
        let c = &mut self.cursor;
        let flags = c.u8()?;
        if flags & !KNOWN_FLAGS != 0 {
            c.pos -= 1;
            return Err(c.error("unknown record flags"));
        }
        let timestamp = if flags & HAS_TIMESTAMP != 0 {
            Some(c.i64()?)
        } else {
            None
        };
        let key = if flags & HAS_KEY != 0 {
            Some(c.sized()?)
        } else {
            None
        };
        let value = c.sized()?;
        Ok(RecordRef {
            key,
            value,
            timestamp,
        })
    }
}

impl<'a> Iterator for BatchReader<'a> {
    type Item = Result<RecordRef<'a>, DecodeError>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.cursor.is_empty() {
            return None;
        }
        let item = self.read();
        self.failed = item.is_err();
        Some(item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_shape_of_record() {
        let mut w = BatchWriter::new();
        w.push(None, b"plain", None);
        w.push(Some(b"k"), b"", Some(-5));
        w.push(Some(b""), b"v", None);
        w.push(None, b"ts", Some(i64::MAX));
        assert_eq!(w.len(), 4);
        let bytes = w.into_bytes();
        let records: Vec<_> = BatchReader::new(&bytes).map(Result::unwrap).collect();
        assert_eq!(
            records,
            vec![
                RecordRef {
                    key: None,
                    value: b"plain",
                    timestamp: None
                },
                RecordRef {
                    key: Some(b"k"),
                    value: b"",
                    timestamp: Some(-5)
                },
                RecordRef {
                    key: Some(b""),
                    value: b"v",
                    timestamp: None
                },
                RecordRef {
                    key: None,
                    value: b"ts",
                    timestamp: Some(i64::MAX)
                },
            ]
        );
        assert_eq!(BatchReader::count(&bytes), Ok(4));
    }

    #[test]
    fn records_come_with_their_encoded_bytes() {
        let mut w = BatchWriter::new();
        w.push(Some(b"k"), b"v1", Some(3));
        w.push(None, b"v2", None);
        let bytes = w.into_bytes();
        let mut reader = BatchReader::new(&bytes);
        let mut copy = BatchWriter::new();
        while let Some(item) = reader.next_with_bytes() {
            let (_, raw) = item.unwrap();
            copy.extend_encoded(raw, 1);
        }
        assert_eq!(copy.as_bytes(), &bytes[..]);
        assert_eq!(copy.len(), 2);
    }

    #[test]
    fn empty_buffer_is_an_empty_batch() {
        assert_eq!(BatchReader::count(&[]), Ok(0));
    }

    #[test]
    fn truncated_value_is_an_error_not_a_panic() {
        let mut w = BatchWriter::new();
        w.push(Some(b"key"), b"value", Some(1));
        let bytes = w.into_bytes();
        for cut in 1..bytes.len() {
            let err = BatchReader::count(&bytes[..cut]).unwrap_err();
            assert_eq!(err.what, "record batch");
        }
    }

    #[test]
    fn huge_declared_length_is_an_error() {
        let mut bytes = vec![0u8];
        bytes.extend_from_slice(&u32::MAX.to_le_bytes());
        let err = BatchReader::count(&bytes).unwrap_err();
        assert_eq!(err.offset, 1 + 4);
        assert!(err.reason.contains("past the end"));
    }

    #[test]
    fn unknown_flags_are_rejected() {
        let err = BatchReader::count(&[0x80, 0, 0, 0, 0]).unwrap_err();
        assert_eq!(err.offset, 0);
        assert_eq!(err.reason, "unknown record flags");
    }

    #[test]
    fn reader_stops_after_first_error() {
        let mut w = BatchWriter::new();
        w.push(None, b"ok", None);
        let mut bytes = w.into_bytes();
        bytes.push(0xff);
        let items: Vec<_> = BatchReader::new(&bytes).collect();
        assert_eq!(items.len(), 2);
        assert!(items[0].is_ok());
        assert!(items[1].is_err());
    }
}
