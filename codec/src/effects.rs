//! Effects: the mutations of host-managed state and timers that an operator call returns.
//!
//! The host applies a call's effects, in order, only when the call returns successfully,
//! so a failed call changes nothing the host keeps.
//!
//! ```text
//! effects := effect*
//! effect  := 1 state:u32 key user_key value        put one entry
//!          | 2 state:u32 key user_key              delete one entry
//!          | 3 state:u32 key                       delete every entry of the key
//!          | 4 state:u32 key value                 append to a list state
//!          | 5 domain:u8 timestamp:i64 key         register a timer
//!          | 6 domain:u8 timestamp:i64 key         delete a timer
//!          | 7 name delta:u64                      add to a counter
//! where key, user_key, value and name are each len:u32 followed by the bytes.
//! ```

use crate::{Cursor, DecodeError, TimeDomain, put_sized};

/// One decoded effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect<'a> {
    /// Sets the value of `(state, key, user_key)`.
    Put {
        /// State handle from `declare-state`.
        state: u32,
        /// The record key the entry belongs to.
        key: &'a [u8],
        /// Entry within the key (empty for value state).
        user_key: &'a [u8],
        /// The new value.
        value: &'a [u8],
    },
    /// Removes the entry `(state, key, user_key)`.
    Delete {
        /// State handle.
        state: u32,
        /// The record key.
        key: &'a [u8],
        /// Entry within the key.
        user_key: &'a [u8],
    },
    /// Removes every entry of `key` in `state`.
    Clear {
        /// State handle.
        state: u32,
        /// The record key.
        key: &'a [u8],
    },
    /// Appends `value` to the list state of `key`.
    Append {
        /// State handle (must be list state).
        state: u32,
        /// The record key.
        key: &'a [u8],
        /// The element.
        value: &'a [u8],
    },
    /// Registers a timer for `key` (registering the same timer twice keeps one).
    RegisterTimer {
        /// Clock of the timer.
        domain: TimeDomain,
        /// When it fires.
        timestamp: i64,
        /// Key it fires for.
        key: &'a [u8],
    },
    /// Deletes a timer if it exists.
    DeleteTimer {
        /// Clock of the timer.
        domain: TimeDomain,
        /// When it would have fired.
        timestamp: i64,
        /// Key it was registered for.
        key: &'a [u8],
    },
    /// Adds `delta` to the operator's counter `name`.
    Counter {
        /// Counter name (UTF-8 expected; the host replaces invalid bytes).
        name: &'a [u8],
        /// Amount to add.
        delta: u64,
    },
}

/// Appends effects to a buffer.
#[derive(Debug, Default, Clone)]
pub struct EffectWriter {
    buf: Vec<u8>,
}

impl EffectWriter {
    /// An empty list.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends one effect.
    pub fn push(&mut self, effect: Effect<'_>) {
        let b = &mut self.buf;
        match effect {
            Effect::Put {
                state,
                key,
                user_key,
                value,
            } => {
                b.push(1);
                b.extend_from_slice(&state.to_le_bytes());
                put_sized(b, key);
                put_sized(b, user_key);
                put_sized(b, value);
            }
            Effect::Delete {
                state,
                key,
                user_key,
            } => {
                b.push(2);
                b.extend_from_slice(&state.to_le_bytes());
                put_sized(b, key);
                put_sized(b, user_key);
            }
            Effect::Clear { state, key } => {
                b.push(3);
                b.extend_from_slice(&state.to_le_bytes());
                put_sized(b, key);
            }
            Effect::Append { state, key, value } => {
                b.push(4);
                b.extend_from_slice(&state.to_le_bytes());
                put_sized(b, key);
                put_sized(b, value);
            }
            Effect::RegisterTimer {
                domain,
                timestamp,
                key,
            }
            | Effect::DeleteTimer {
                domain,
                timestamp,
                key,
            } => {
                b.push(if matches!(effect, Effect::RegisterTimer { .. }) {
                    5
                } else {
                    6
                });
                b.push(domain.to_byte());
                b.extend_from_slice(&timestamp.to_le_bytes());
                put_sized(b, key);
            }
            Effect::Counter { name, delta } => {
                b.push(7);
                put_sized(b, name);
                b.extend_from_slice(&delta.to_le_bytes());
            }
        }
    }

    /// True when no effect was written.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Takes the encoded list, leaving this writer empty.
    pub fn take(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.buf)
    }
}

/// Iterates over encoded effects; stops after the first error.
#[derive(Debug, Clone)]
pub struct EffectReader<'a> {
    cursor: Cursor<'a>,
    failed: bool,
}

impl<'a> EffectReader<'a> {
    /// Reads `buf` as a list of effects.
    pub fn new(buf: &'a [u8]) -> Self {
        EffectReader {
            cursor: Cursor::new(buf, "effects"),
            failed: false,
        }
    }

    fn read(&mut self) -> Result<Effect<'a>, DecodeError> {
        let c = &mut self.cursor;
        let tag = c.u8()?;
        Ok(match tag {
            1 => Effect::Put {
                state: c.u32()?,
                key: c.sized()?,
                user_key: c.sized()?,
                value: c.sized()?,
            },
            2 => Effect::Delete {
                state: c.u32()?,
                key: c.sized()?,
                user_key: c.sized()?,
            },
            3 => Effect::Clear {
                state: c.u32()?,
                key: c.sized()?,
            },
            4 => Effect::Append {
                state: c.u32()?,
                key: c.sized()?,
                value: c.sized()?,
            },
            5 | 6 => {
                let domain =
                    TimeDomain::from_byte(c.u8()?).ok_or_else(|| c.error("unknown time domain"))?;
                let timestamp = c.i64()?;
                let key = c.sized()?;
                if tag == 5 {
                    Effect::RegisterTimer {
                        domain,
                        timestamp,
                        key,
                    }
                } else {
                    Effect::DeleteTimer {
                        domain,
                        timestamp,
                        key,
                    }
                }
            }
            7 => Effect::Counter {
                name: c.sized()?,
                delta: c.u64()?,
            },
            _ => {
                c.pos -= 1;
                return Err(c.error("unknown effect tag"));
            }
        })
    }
}

impl<'a> Iterator for EffectReader<'a> {
    type Item = Result<Effect<'a>, DecodeError>;

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

    fn all_effects() -> Vec<Effect<'static>> {
        vec![
            Effect::Put {
                state: 1,
                key: b"k",
                user_key: b"",
                value: b"v",
            },
            Effect::Delete {
                state: 2,
                key: b"k",
                user_key: b"u",
            },
            Effect::Clear { state: 3, key: b"" },
            Effect::Append {
                state: 4,
                key: b"k",
                value: b"e",
            },
            Effect::RegisterTimer {
                domain: TimeDomain::EventTime,
                timestamp: 99,
                key: b"k",
            },
            Effect::DeleteTimer {
                domain: TimeDomain::ProcessingTime,
                timestamp: -3,
                key: b"",
            },
            Effect::Counter {
                name: b"late",
                delta: 7,
            },
        ]
    }

    #[test]
    fn round_trips_every_effect() {
        let mut w = EffectWriter::new();
        for e in all_effects() {
            w.push(e);
        }
        let bytes = w.take();
        let got: Vec<_> = EffectReader::new(&bytes).map(Result::unwrap).collect();
        assert_eq!(got, all_effects());
    }

    #[test]
    fn every_truncation_is_an_error() {
        let mut w = EffectWriter::new();
        for e in all_effects() {
            w.push(e);
        }
        let bytes = w.take();
        for cut in 1..bytes.len() {
            let result: Result<Vec<_>, _> = EffectReader::new(&bytes[..cut]).collect();
            // A cut on an effect boundary is a shorter valid list; anywhere else it fails.
            if let Err(e) = result {
                assert_eq!(e.what, "effects");
            }
        }
        let err = EffectReader::new(&[9]).next().unwrap().unwrap_err();
        assert_eq!(err.reason, "unknown effect tag");
    }
}
