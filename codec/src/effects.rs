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
//!          | 8 state:u32 user_key count:u32         put `count` entries of one user key
//!              key_ends:u32*count keys
//!              value_ends:u32*count values
//! where key, user_key, value, name, keys and values are each len:u32 followed by the
//! bytes. In effect 8 (WIT 0.3.0) `keys` and `values` hold `count` keys and values one
//! after another, and `key_ends`/`value_ends` where each ends in them (it starts where
//! the one before ended): a batch's puts that an interpreter packs with native
//! functions. [`EffectReader`] gives them as `count` [`Effect::Put`]s, in order.
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
    /// The puts of an effect 8 not given yet.
    many: Option<PutMany<'a>>,
}

/// The puts of an effect 8, checked, given one at a time.
#[derive(Debug, Clone)]
struct PutMany<'a> {
    state: u32,
    user_key: &'a [u8],
    key_ends: &'a [u8],
    keys: &'a [u8],
    value_ends: &'a [u8],
    values: &'a [u8],
    next: usize,
    count: usize,
    key_start: usize,
    value_start: usize,
}

impl<'a> PutMany<'a> {
    fn next(&mut self) -> Option<Effect<'a>> {
        if self.next == self.count {
            return None;
        }
        let at = |ends: &[u8], i: usize| {
            u32::from_le_bytes(ends[4 * i..4 * i + 4].try_into().expect("4 bytes")) as usize
        };
        let (key_end, value_end) = (at(self.key_ends, self.next), at(self.value_ends, self.next));
        let effect = Effect::Put {
            state: self.state,
            key: &self.keys[self.key_start..key_end],
            user_key: self.user_key,
            value: &self.values[self.value_start..value_end],
        };
        (self.key_start, self.value_start) = (key_end, value_end);
        self.next += 1;
        Some(effect)
    }
}

impl<'a> EffectReader<'a> {
    /// Reads `buf` as a list of effects.
    pub fn new(buf: &'a [u8]) -> Self {
        EffectReader {
            cursor: Cursor::new(buf, "effects"),
            failed: false,
            many: None,
        }
    }

    /// Reads effect 8 after its tag and gives its first put.
    fn read_many(&mut self) -> Result<Option<Effect<'a>>, DecodeError> {
        let c = &mut self.cursor;
        let state = c.u32()?;
        let user_key = c.sized()?;
        let count = c.u32()? as usize;
        let column = |c: &mut Cursor<'a>| -> Result<(&'a [u8], &'a [u8]), DecodeError> {
            let at = c.pos;
            let ends = c.bytes(
                count
                    .checked_mul(4)
                    .ok_or_else(|| c.error("too many puts"))?,
            )?;
            let data = c.sized()?;
            let mut start = 0;
            for end in ends.chunks_exact(4) {
                let end = u32::from_le_bytes(end.try_into().expect("4 bytes")) as usize;
                if end < start || end > data.len() {
                    c.pos = at;
                    return Err(c.error("puts whose ends are out of order or beyond their bytes"));
                }
                start = end;
            }
            Ok((ends, data))
        };
        let (key_ends, keys) = column(c)?;
        let (value_ends, values) = column(c)?;
        let mut many = PutMany {
            state,
            user_key,
            key_ends,
            keys,
            value_ends,
            values,
            next: 0,
            count,
            key_start: 0,
            value_start: 0,
        };
        let first = many.next();
        self.many = Some(many);
        Ok(first)
    }

    fn read(&mut self) -> Result<Option<Effect<'a>>, DecodeError> {
        let c = &mut self.cursor;
        let tag = c.u8()?;
        Ok(Some(match tag {
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
            8 => match self.read_many()? {
                Some(put) => put,
                // No puts: the next effect.
                None if self.cursor.is_empty() => return Ok(None),
                None => return self.read(),
            },
            _ => {
                c.pos -= 1;
                return Err(c.error("unknown effect tag"));
            }
        }))
    }
}

impl<'a> Iterator for EffectReader<'a> {
    type Item = Result<Effect<'a>, DecodeError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(put) = self.many.as_mut().and_then(PutMany::next) {
            return Some(Ok(put));
        }
        self.many = None;
        if self.failed || self.cursor.is_empty() {
            return None;
        }
        let item = self.read();
        self.failed = item.is_err();
        item.transpose()
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

#[cfg(test)]
mod put_many_tests {
    use super::*;

    /// Effect 8 of `puts` (key, value) for state 3 and user key `uk`.
    fn put_many(puts: &[(&[u8], &[u8])]) -> Vec<u8> {
        let mut b = vec![8];
        b.extend_from_slice(&3u32.to_le_bytes());
        put_sized(&mut b, b"uk");
        b.extend_from_slice(&(puts.len() as u32).to_le_bytes());
        for column in [0, 1] {
            let parts: Vec<&[u8]> = puts
                .iter()
                .map(|p| if column == 0 { p.0 } else { p.1 })
                .collect();
            let mut end = 0u32;
            for part in &parts {
                end += part.len() as u32;
                b.extend_from_slice(&end.to_le_bytes());
            }
            put_sized(&mut b, &parts.concat());
        }
        b
    }

    #[test]
    fn puts_of_a_batch_read_as_single_puts_in_order() {
        let mut w = EffectWriter::new();
        w.push(Effect::Counter {
            name: b"c",
            delta: 1,
        });
        let mut bytes = w.take();
        bytes.extend(put_many(&[(b"a", b"1"), (b"", b""), (b"ccc", b"33")]));
        bytes.extend(put_many(&[]));
        let mut w = EffectWriter::new();
        w.push(Effect::Clear {
            state: 3,
            key: b"a",
        });
        bytes.extend(w.take());
        let got: Vec<Effect<'_>> = EffectReader::new(&bytes).collect::<Result<_, _>>().unwrap();
        let put = |key: &'static [u8], value: &'static [u8]| Effect::Put {
            state: 3,
            key,
            user_key: b"uk",
            value,
        };
        assert_eq!(
            got,
            [
                Effect::Counter {
                    name: b"c",
                    delta: 1
                },
                put(b"a", b"1"),
                put(b"", b""),
                put(b"ccc", b"33"),
                Effect::Clear {
                    state: 3,
                    key: b"a"
                },
            ]
        );
    }

    #[test]
    fn puts_whose_ends_are_wrong_are_refused_before_any_is_given() {
        let good = put_many(&[(b"a", b"1"), (b"b", b"2")]);
        // The second key's end (offset: tag, state, user key, count, first end).
        let at = 1 + 4 + 6 + 4 + 4;
        for end in [0u32, 3] {
            let mut bad = good.clone();
            bad[at..at + 4].copy_from_slice(&end.to_le_bytes());
            let got: Vec<_> = EffectReader::new(&bad).collect();
            assert_eq!(got.len(), 1, "{end}: {got:?}");
            assert!(got[0].is_err(), "{end}: {got:?}");
        }
        let mut cut = good.clone();
        cut.truncate(good.len() - 1);
        assert!(EffectReader::new(&cut).any(|e| e.is_err()));
    }
}
