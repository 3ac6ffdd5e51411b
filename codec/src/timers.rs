//! Timer lists, as passed to `on-timers`.
//!
//! ```text
//! timers := timer*
//! timer  := domain:u8 (0 event time, 1 processing time) timestamp:i64 key_len:u32 key
//! ```

use crate::{Cursor, DecodeError, put_sized};

/// Which clock a timer follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TimeDomain {
    /// Fires when the operator's input watermark reaches the timer's time.
    EventTime,
    /// Fires when the wall clock reaches the timer's time.
    ProcessingTime,
}

impl TimeDomain {
    /// The byte this domain is encoded as.
    pub fn to_byte(self) -> u8 {
        match self {
            TimeDomain::EventTime => 0,
            TimeDomain::ProcessingTime => 1,
        }
    }

    /// The domain a byte stands for.
    pub fn from_byte(b: u8) -> Option<Self> {
        match b {
            0 => Some(TimeDomain::EventTime),
            1 => Some(TimeDomain::ProcessingTime),
            _ => None,
        }
    }
}

/// One timer, borrowed from the buffer that holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimerRef<'a> {
    /// The clock the timer follows.
    pub domain: TimeDomain,
    /// When the timer fires, in milliseconds.
    pub timestamp: i64,
    /// The key the timer was registered for (empty for operators on unkeyed input).
    pub key: &'a [u8],
}

/// Encodes a list of timers.
#[derive(Debug, Default, Clone)]
pub struct TimerWriter {
    buf: Vec<u8>,
}

impl TimerWriter {
    /// An empty list.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends one timer.
    pub fn push(&mut self, domain: TimeDomain, timestamp: i64, key: &[u8]) {
        self.buf.push(domain.to_byte());
        self.buf.extend_from_slice(&timestamp.to_le_bytes());
        put_sized(&mut self.buf, key);
    }

    /// True when no timer was written.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// The encoded list.
    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }
}

/// Iterates over an encoded list of timers; stops after the first error.
#[derive(Debug, Clone)]
pub struct TimerReader<'a> {
    cursor: Cursor<'a>,
    failed: bool,
}

impl<'a> TimerReader<'a> {
    /// Reads `buf` as a list of timers.
    pub fn new(buf: &'a [u8]) -> Self {
        TimerReader {
            cursor: Cursor::new(buf, "timer list"),
            failed: false,
        }
    }

    fn read(&mut self) -> Result<TimerRef<'a>, DecodeError> {
        let c = &mut self.cursor;
        let domain =
            TimeDomain::from_byte(c.u8()?).ok_or_else(|| c.error("unknown time domain"))?;
        let timestamp = c.i64()?;
        let key = c.sized()?;
        Ok(TimerRef {
            domain,
            timestamp,
            key,
        })
    }
}

impl<'a> Iterator for TimerReader<'a> {
    type Item = Result<TimerRef<'a>, DecodeError>;

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
    fn round_trip() {
        let mut w = TimerWriter::new();
        w.push(TimeDomain::EventTime, 10, b"a");
        w.push(TimeDomain::ProcessingTime, -1, b"");
        let bytes = w.into_bytes();
        let timers: Vec<_> = TimerReader::new(&bytes).map(Result::unwrap).collect();
        assert_eq!(timers.len(), 2);
        assert_eq!(timers[0].domain, TimeDomain::EventTime);
        assert_eq!(timers[0].key, b"a");
        assert_eq!(timers[1].timestamp, -1);
    }

    #[test]
    fn bad_domain_is_an_error() {
        let mut bytes = vec![7u8];
        bytes.extend_from_slice(&[0; 12]);
        let err = TimerReader::new(&bytes).next().unwrap().unwrap_err();
        assert_eq!(err.reason, "unknown time domain");
    }
}
