//! State entries of one key, as returned by the host's `state-entries`.
//!
//! ```text
//! entries := entry*
//! entry   := user_key_len:u32 user_key value_len:u32 value
//! ```
//! Entries come in ascending order of user key; for list state the user key is the
//! element's position, so the order is the order of appends.

use crate::{Cursor, DecodeError, put_sized};

/// Encodes state entries.
#[derive(Debug, Default, Clone)]
pub struct EntryWriter {
    buf: Vec<u8>,
}

impl EntryWriter {
    /// An empty list.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends one entry.
    pub fn push(&mut self, user_key: &[u8], value: &[u8]) {
        put_sized(&mut self.buf, user_key);
        put_sized(&mut self.buf, value);
    }

    /// The encoded list.
    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }
}

/// Iterates over encoded `(user key, value)` entries; stops after the first error.
#[derive(Debug, Clone)]
pub struct EntryReader<'a> {
    cursor: Cursor<'a>,
    failed: bool,
}

impl<'a> EntryReader<'a> {
    /// Reads `buf` as a list of entries.
    pub fn new(buf: &'a [u8]) -> Self {
        EntryReader {
            cursor: Cursor::new(buf, "state entries"),
            failed: false,
        }
    }
}

impl<'a> Iterator for EntryReader<'a> {
    type Item = Result<(&'a [u8], &'a [u8]), DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.cursor.is_empty() {
            return None;
        }
        let item = self
            .cursor
            .sized()
            .and_then(|k| Ok((k, self.cursor.sized()?)));
        self.failed = item.is_err();
        Some(item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let mut w = EntryWriter::new();
        w.push(b"a", b"1");
        w.push(b"", b"");
        let bytes = w.into_bytes();
        let got: Vec<_> = EntryReader::new(&bytes).map(Result::unwrap).collect();
        assert_eq!(got, vec![(&b"a"[..], &b"1"[..]), (&b""[..], &b""[..])]);
        assert!(EntryReader::new(&bytes[..3]).next().unwrap().is_err());
    }
}
