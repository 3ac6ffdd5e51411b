//! Byte strings kept one after another in one buffer, named by their place in it: the
//! read-ahead and the pending writes hold thousands of keys and values per call without
//! an allocation each.

/// Where a byte string is in an [`Arena`]: start and end.
pub type Span = (u32, u32);

/// Byte strings in one buffer.
#[derive(Debug, Default)]
pub struct Arena {
    bytes: Vec<u8>,
}

impl Arena {
    /// Keeps `b`; returns where it is.
    pub fn push(&mut self, b: &[u8]) -> Span {
        let start = self.bytes.len() as u32;
        self.bytes.extend_from_slice(b);
        (start, self.bytes.len() as u32)
    }

    /// The byte string at `span`.
    pub fn get(&self, (start, end): Span) -> &[u8] {
        &self.bytes[start as usize..end as usize]
    }

    /// Bytes kept.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Forgets every byte string (keeping the buffer).
    pub fn clear(&mut self) {
        self.bytes.clear();
    }
}
