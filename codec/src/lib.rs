//! The flat buffer encodings that cross the boundary between the Sluice host and its
//! operators.
//!
//! Records, timers, state entries and effects travel between host and guest as one
//! `list<u8>` each, never as lists of nested lists: the component model copies a flat
//! buffer with one allocation, while a `list<record>` with `list<u8>` fields allocates once
//! per record inside the guest. This crate is the single definition of those encodings; the
//! host and the Rust SDK both use it, and `wit/operator.wit` describes the same layouts for
//! authors in other languages.
//!
//! All integers are little-endian. Every reader validates lengths and returns a
//! [`DecodeError`] on malformed input instead of panicking, because the host decodes what a
//! possibly hostile guest returned.

mod batch;
mod effects;
mod entries;
mod timers;

pub use batch::{
    BatchReader, BatchScan, BatchWriter, Headers, RecordRef, encode_headers, strip_extensions,
};
pub use effects::{Effect, EffectReader, EffectWriter};
pub use entries::{EntryReader, EntryWriter};
pub use timers::{TimeDomain, TimerReader, TimerRef, TimerWriter};

use std::fmt;

/// A buffer did not follow the encoding it claimed to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    /// What was being decoded ("record batch", "effects", ...).
    pub what: &'static str,
    /// Byte offset in the buffer where decoding failed.
    pub offset: usize,
    /// What was wrong there.
    pub reason: &'static str,
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "malformed {} at byte {}: {}",
            self.what, self.offset, self.reason
        )
    }
}

impl std::error::Error for DecodeError {}

/// A bounds-checked cursor over a byte buffer.
#[derive(Debug, Clone)]
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Cursor<'a> {
    #[inline]
    fn new(buf: &'a [u8], what: &'static str) -> Self {
        Cursor { buf, pos: 0, what }
    }

    #[inline]
    fn is_empty(&self) -> bool {
        self.pos >= self.buf.len()
    }

    fn error(&self, reason: &'static str) -> DecodeError {
        DecodeError {
            what: self.what,
            offset: self.pos,
            reason,
        }
    }

    #[inline]
    fn bytes(&mut self, len: usize) -> Result<&'a [u8], DecodeError> {
        let end = self
            .pos
            .checked_add(len)
            .filter(|&end| end <= self.buf.len())
            .ok_or_else(|| self.error("length runs past the end of the buffer"))?;
        let bytes = &self.buf[self.pos..end];
        self.pos = end;
        Ok(bytes)
    }

    #[inline]
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.bytes(1)?[0])
    }

    #[inline]
    fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.bytes(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    #[inline]
    fn u64(&mut self) -> Result<u64, DecodeError> {
        let b = self.bytes(8)?;
        Ok(u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }

    #[inline]
    fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(self.u64()? as i64)
    }

    /// A `u32` length followed by that many bytes.
    #[inline]
    fn sized(&mut self) -> Result<&'a [u8], DecodeError> {
        let len = self.u32()? as usize;
        self.bytes(len)
    }
}

#[inline]
fn put_sized(buf: &mut Vec<u8>, bytes: &[u8]) {
    let len = u32::try_from(bytes.len()).expect("a field larger than 4 GiB cannot be encoded");
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(bytes);
}
