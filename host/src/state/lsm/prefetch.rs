//! The value states of a batch's keys, read in one multi-get before the operator's call,
//! so the call's `state-get`s are answered from memory.
//!
//! A multi-get of sorted keys probes each table's filter and index once for all of them
//! where single gets each search from the top. When the operator reads few of what was
//! read for it, prefetching pauses for a while: it would only add reads.

use std::cell::Cell;

use super::arena::{Arena, Span};

/// Entries read for one call: sorted keys and what each holds (`None`: absent).
#[derive(Debug, Default)]
pub struct Prefetched {
    bytes: Arena,
    /// Key and value, in key order.
    entries: Vec<(Span, Option<Span>)>,
    /// How many of `entries` the call read.
    used: Cell<usize>,
    /// Calls left to go without prefetching.
    pause: u32,
}

/// Calls without prefetching after one whose operator read fewer than a quarter of the
/// entries read for it.
const PAUSE_CALLS: u32 = 32;

impl Prefetched {
    /// False while prefetching is paused (counting the call down).
    pub fn wanted(&mut self) -> bool {
        if self.pause > 0 {
            self.pause -= 1;
            return false;
        }
        true
    }

    /// Forgets what was read (the database is about to change), pausing prefetching when
    /// the call used little of it.
    pub fn forget(&mut self) {
        if self.entries.is_empty() {
            return;
        }
        if self.used.get() * 4 < self.entries.len() {
            self.pause = PAUSE_CALLS;
        }
        self.entries.clear();
        self.bytes.clear();
        self.used.set(0);
    }

    /// Adds an entry; keys must come in increasing order.
    pub fn push(&mut self, key: &[u8], value: Option<&[u8]>) {
        let key = self.bytes.push(key);
        let value = value.map(|v| self.bytes.push(v));
        self.entries.push((key, value));
    }

    fn slice(&self, span: Span) -> &[u8] {
        self.bytes.get(span)
    }

    /// What was read for `key`: `Some(Some(value))`, `Some(None)` when it is absent, or
    /// `None` when it was not read.
    pub fn get(&self, key: &[u8]) -> Option<Option<&[u8]>> {
        if self.entries.is_empty() {
            return None;
        }
        let i = self
            .entries
            .binary_search_by(|(k, _)| self.slice(*k).cmp(key))
            .ok()?;
        self.used.set(self.used.get() + 1);
        Some(self.entries[i].1.map(|v| self.slice(v)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_what_was_read_and_pauses_when_little_is_used() {
        let mut p = Prefetched::default();
        assert!(p.wanted());
        p.push(b"a", Some(b"1"));
        p.push(b"b", None);
        p.push(b"c", Some(b"3"));
        assert_eq!(p.get(b"a"), Some(Some(&b"1"[..])));
        assert_eq!(p.get(b"b"), Some(None));
        assert_eq!(p.get(b"x"), None);
        p.forget();
        assert_eq!(p.get(b"a"), None);
        assert!(p.wanted(), "two of three used: keep prefetching");
        for k in 0..8u8 {
            p.push(&[k], None);
        }
        p.get(&[0]);
        p.forget();
        assert!((0..PAUSE_CALLS).all(|_| !p.wanted()));
        assert!(p.wanted());
    }
}
