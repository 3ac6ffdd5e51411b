//! Record batches.
//!
//! ```text
//! batch   := record*
//! record  := flags:u8
//!            [timestamp:i64]            if flags & 0x01
//!            [key_len:u32 key]          if flags & 0x02
//!            [headers]                  if flags & 0x04   (WIT 0.2.0)
//!            [partition:u32]            if flags & 0x08   (WIT 0.2.0)
//!            [output:u32]               if flags & 0x10   (WIT 0.2.0)
//!            value_len:u32 value
//! headers := count:u32 (name_len:u32 name value_len:u32 value)*
//! ```
//! Unknown flag bits are an error, so a later version can give them a meaning. Batches
//! for operators of WIT 0.1.0 use only the first two flags ([`strip_extensions`]).

use crate::{Cursor, DecodeError, put_sized};

const HAS_TIMESTAMP: u8 = 0x01;
const HAS_KEY: u8 = 0x02;
const HAS_HEADERS: u8 = 0x04;
const HAS_PARTITION: u8 = 0x08;
const HAS_OUTPUT: u8 = 0x10;
const KNOWN_FLAGS: u8 = HAS_TIMESTAMP | HAS_KEY | HAS_HEADERS | HAS_PARTITION | HAS_OUTPUT;
/// The flags WIT 0.1.0 knows.
const V1_FLAGS: u8 = HAS_TIMESTAMP | HAS_KEY;

/// One record of a batch, borrowed from the buffer that holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RecordRef<'a> {
    /// The record's key, if it has one (set by the operator that emitted it).
    pub key: Option<&'a [u8]>,
    /// The payload.
    pub value: &'a [u8],
    /// Event time in milliseconds, if the record has one.
    pub timestamp: Option<i64>,
    /// Headers (a Kafka record's), if it has any.
    pub headers: Option<Headers<'a>>,
    /// The source partition it was read from, if its source has partitions.
    pub partition: Option<u32>,
    /// The side output an operator emitted it to; 0 is the main output.
    pub output: u32,
}

impl<'a> RecordRef<'a> {
    /// A record of only a key, a value and a timestamp.
    pub fn new(key: Option<&'a [u8]>, value: &'a [u8], timestamp: Option<i64>) -> Self {
        RecordRef {
            key,
            value,
            timestamp,
            ..RecordRef::default()
        }
    }
}

/// The encoded headers of a record: name/value pairs, in order, names may repeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Headers<'a> {
    encoded: &'a [u8],
}

impl<'a> Headers<'a> {
    /// Reads headers [`encode_headers`] wrote, checking that they are whole.
    pub fn decode(encoded: &'a [u8]) -> Result<Headers<'a>, DecodeError> {
        let mut c = Cursor::new(encoded, "record headers");
        let count = c.u32()?;
        for _ in 0..count {
            c.sized()?;
            c.sized()?;
        }
        if !c.is_empty() {
            return Err(c.error("bytes after the last header"));
        }
        Ok(Headers { encoded })
    }

    /// The encoded form (count and pairs), as [`encode_headers`] writes it.
    pub fn encoded(&self) -> &'a [u8] {
        self.encoded
    }

    /// The pairs, in order.
    pub fn iter(self) -> impl Iterator<Item = (&'a [u8], &'a [u8])> + 'a {
        let mut cursor = Cursor::new(self.encoded, "record headers");
        let count = cursor.u32().unwrap_or(0);
        (0..count).map_while(move |_| Some((cursor.sized().ok()?, cursor.sized().ok()?)))
    }

    /// The value of the first header named `name`.
    pub fn get(self, name: &[u8]) -> Option<&'a [u8]> {
        self.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
    }

    /// Number of pairs.
    pub fn len(self) -> usize {
        self.iter().count()
    }

    /// True without pairs.
    pub fn is_empty(self) -> bool {
        self.len() == 0
    }
}

/// Encodes name/value pairs as a record's headers.
pub fn encode_headers<'h>(pairs: impl IntoIterator<Item = (&'h [u8], &'h [u8])>) -> Vec<u8> {
    let mut buf = vec![0; 4];
    let mut count = 0u32;
    for (name, value) in pairs {
        put_sized(&mut buf, name);
        put_sized(&mut buf, value);
        count += 1;
    }
    buf[..4].copy_from_slice(&count.to_le_bytes());
    buf
}

/// What [`BatchReader::scan`] found in a batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchScan {
    /// Number of records.
    pub count: usize,
    /// Some record names a side output.
    pub side_outputs: bool,
    /// Some record uses a flag WIT 0.1.0 does not know.
    pub extended: bool,
}

/// The batch without what WIT 0.1.0 operators cannot read (headers, partitions, side
/// outputs), or `None` when it has none of it.
pub fn strip_extensions(batch: &[u8]) -> Result<Option<Vec<u8>>, DecodeError> {
    if !BatchReader::scan(batch)?.extended {
        return Ok(None);
    }
    let mut out = BatchWriter::with_capacity(batch.len());
    for record in BatchReader::new(batch) {
        let r = record?;
        out.push(r.key, r.value, r.timestamp);
    }
    Ok(Some(out.into_bytes()))
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

    /// Appends a record with all its parts.
    #[inline]
    pub fn push_record(&mut self, record: RecordRef<'_>) {
        if record.headers.is_none() && record.partition.is_none() && record.output == 0 {
            return self.push(record.key, record.value, record.timestamp);
        }
        let headers = record.headers.map_or(&[][..], |h| h.encoded);
        self.buf
            .reserve(1 + 8 + 4 + 4 + 4 + 4 + headers.len() + 4 + record.value.len());
        let mut flags = 0;
        if record.timestamp.is_some() {
            flags |= HAS_TIMESTAMP;
        }
        if record.key.is_some() {
            flags |= HAS_KEY;
        }
        if record.headers.is_some() {
            flags |= HAS_HEADERS;
        }
        if record.partition.is_some() {
            flags |= HAS_PARTITION;
        }
        if record.output != 0 {
            flags |= HAS_OUTPUT;
        }
        self.buf.push(flags);
        if let Some(ts) = record.timestamp {
            self.buf.extend_from_slice(&ts.to_le_bytes());
        }
        if let Some(key) = record.key {
            put_sized(&mut self.buf, key);
        }
        self.buf.extend_from_slice(headers);
        if let Some(p) = record.partition {
            self.buf.extend_from_slice(&p.to_le_bytes());
        }
        if record.output != 0 {
            self.buf.extend_from_slice(&record.output.to_le_bytes());
        }
        put_sized(&mut self.buf, record.value);
        self.len += 1;
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
        Self::scan(buf).map(|s| s.count)
    }

    /// Checks the whole batch: how many records, and which extensions they use.
    pub fn scan(buf: &[u8]) -> Result<BatchScan, DecodeError> {
        let mut scan = BatchScan::default();
        let mut reader = BatchReader::new(buf);
        while !reader.cursor.is_empty() {
            let flags = reader.cursor.buf[reader.cursor.pos];
            reader.read()?;
            scan.count += 1;
            scan.side_outputs |= flags & HAS_OUTPUT != 0;
            scan.extended |= flags & !V1_FLAGS != 0;
        }
        Ok(scan)
    }

    /// The next record together with its encoded bytes (which
    /// [`BatchWriter::extend_encoded`] can copy as they are).
    #[inline]
    pub fn next_with_bytes(&mut self) -> Option<Result<(RecordRef<'a>, &'a [u8]), DecodeError>> {
        let buf = self.cursor.buf;
        self.next_with_range()
            .map(|r| r.map(|(record, range)| (record, &buf[range])))
    }

    /// The next record together with where its encoded bytes lie in the batch.
    #[inline]
    pub fn next_with_range(
        &mut self,
    ) -> Option<Result<(RecordRef<'a>, std::ops::Range<usize>), DecodeError>> {
        let start = self.cursor.pos;
        self.next()
            .map(|r| r.map(|record| (record, start..self.cursor.pos)))
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
        if flags & !V1_FLAGS == 0 {
            let value = c.sized()?;
            return Ok(RecordRef::new(key, value, timestamp));
        }
        let headers = if flags & HAS_HEADERS != 0 {
            let start = c.pos;
            let count = c.u32()?;
            for _ in 0..count {
                c.sized()?;
                c.sized()?;
            }
            Some(Headers {
                encoded: &c.buf[start..c.pos],
            })
        } else {
            None
        };
        let partition = if flags & HAS_PARTITION != 0 {
            Some(c.u32()?)
        } else {
            None
        };
        let output = if flags & HAS_OUTPUT != 0 {
            let output = c.u32()?;
            if output == 0 {
                c.pos -= 4;
                return Err(c.error("output 0 written with the output flag"));
            }
            output
        } else {
            0
        };
        let value = c.sized()?;
        Ok(RecordRef {
            key,
            value,
            timestamp,
            headers,
            partition,
            output,
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
                RecordRef::new(None, b"plain", None),
                RecordRef::new(Some(b"k"), b"", Some(-5)),
                RecordRef::new(Some(b""), b"v", None),
                RecordRef::new(None, b"ts", Some(i64::MAX)),
            ]
        );
        assert_eq!(BatchReader::count(&bytes), Ok(4));
    }

    #[test]
    fn headers_partitions_and_outputs_round_trip_and_strip_for_version_one() {
        let headers = encode_headers([(&b"trace"[..], &b"a1"[..]), (b"x", b"")]);
        let mut w = BatchWriter::new();
        let full = RecordRef {
            key: Some(b"k"),
            value: b"v",
            timestamp: Some(7),
            headers: Some(Headers { encoded: &headers }),
            partition: Some(3),
            output: 2,
        };
        w.push_record(full);
        w.push(None, b"plain", None);
        let bytes = w.into_bytes();
        let records: Vec<_> = BatchReader::new(&bytes).map(Result::unwrap).collect();
        assert_eq!(records[0], full);
        let h = records[0].headers.unwrap();
        assert_eq!(h.get(b"trace"), Some(&b"a1"[..]));
        assert_eq!(h.iter().count(), 2);
        assert_eq!(
            BatchReader::scan(&bytes),
            Ok(BatchScan {
                count: 2,
                side_outputs: true,
                extended: true
            })
        );
        let stripped = strip_extensions(&bytes).unwrap().unwrap();
        let records: Vec<_> = BatchReader::new(&stripped).map(Result::unwrap).collect();
        assert_eq!(records[0], RecordRef::new(Some(b"k"), b"v", Some(7)));
        assert_eq!(strip_extensions(&stripped), Ok(None));
        // Every cut of an extended record is an error, not a panic.
        for cut in 1..bytes.len() {
            let _ = BatchReader::count(&bytes[..cut]);
        }
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
