//! Which downstream subtask(s) a record goes to.

use anyhow::{Result, bail};
use sluice_codec::RecordRef;

use crate::state::key_groups::subtask_for_key;

/// Where a record's key comes from when a stream is partitioned by key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySelector {
    /// The key the upstream operator set on the record.
    RecordKey,
    /// The whole value.
    Value,
    /// Field `index` (0-based) of the UTF-8 value split by `separator`.
    Field {
        /// Field index.
        index: usize,
        /// Separator between fields.
        separator: String,
    },
}

impl KeySelector {
    /// The key of `record`, or an error saying why it has none.
    pub fn key<'a>(&self, record: &RecordRef<'a>) -> Result<&'a [u8]> {
        match self {
            KeySelector::RecordKey => match record.key {
                Some(k) => Ok(k),
                None => bail!(
                    "record has no key, but the stream is partitioned by the record key \
                     (the upstream operator must set one, or use key_by = \"value\" or a field)"
                ),
            },
            KeySelector::Value => Ok(record.value),
            KeySelector::Field { index, separator } => {
                let value = std::str::from_utf8(record.value).map_err(|_| {
                    anyhow::anyhow!("cannot take field {index} of a value that is not UTF-8")
                })?;
                match field_of(record.value, separator, *index) {
                    Some(field) => Ok(field),
                    None => bail!(
                        "record {value:?} has no field {index} (fields separated by {separator:?})"
                    ),
                }
            }
        }
    }

    /// True when the selected key is already the record's key (no re-encoding needed).
    pub fn is_record_key(&self) -> bool {
        matches!(self, KeySelector::RecordKey)
    }
}

/// Field `index` (from 0) of `value` split by `separator`, as `str::split` gives it for
/// text: the separator's bytes never occur inside another character's encoding in UTF-8,
/// so splitting the bytes splits the text. A one-byte separator (always ASCII) is found
/// without a searcher; an empty one splits nothing.
pub fn field_of<'a>(value: &'a [u8], separator: &str, index: usize) -> Option<&'a [u8]> {
    let find = |haystack: &[u8], needle: &[u8]| {
        haystack
            .windows(needle.len())
            .position(|window| window == needle)
    };
    match separator.as_bytes() {
        [] => (index == 0).then_some(value),
        &[separator] => value.split(|&b| b == separator).nth(index),
        separator => {
            let mut rest = value;
            for _ in 0..index {
                let at = find(rest, separator)?;
                rest = &rest[at + separator.len()..];
            }
            Some(find(rest, separator).map_or(rest, |at| &rest[..at]))
        }
    }
}

/// How records are spread over the subtasks of the downstream operator (Flink's
/// partitioners).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Partitioner {
    /// Subtask *i* sends to subtask *i* (equal parallelism).
    Forward,
    /// By key: the key's key group decides the subtask, so the same key always reaches
    /// the same subtask for a given parallelism and max parallelism.
    Hash {
        /// Where the key comes from.
        key: KeySelector,
        /// Number of key groups.
        max_parallelism: u32,
    },
    /// Round-robin over all subtasks.
    Rebalance,
    /// Every record to every subtask.
    Broadcast,
}

impl Partitioner {
    /// A short name for logs and `validate`.
    pub fn name(&self) -> &'static str {
        match self {
            Partitioner::Forward => "forward",
            Partitioner::Hash { .. } => "hash",
            Partitioner::Rebalance => "rebalance",
            Partitioner::Broadcast => "broadcast",
        }
    }
}

/// The subtask a keyed record goes to.
pub fn hash_target(key: &[u8], parallelism: u32, max_parallelism: u32) -> usize {
    subtask_for_key(key, parallelism, max_parallelism) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec<'a>(key: Option<&'a [u8]>, value: &'a [u8]) -> RecordRef<'a> {
        RecordRef::new(key, value, None)
    }

    #[test]
    fn selects_keys() {
        let r = rec(Some(b"k"), b"a,b,c");
        assert_eq!(KeySelector::RecordKey.key(&r).unwrap(), b"k");
        assert_eq!(KeySelector::Value.key(&r).unwrap(), b"a,b,c");
        let field = KeySelector::Field {
            index: 1,
            separator: ",".into(),
        };
        assert_eq!(field.key(&r).unwrap(), b"b");
        let missing = KeySelector::Field {
            index: 5,
            separator: ",".into(),
        };
        assert!(
            missing
                .key(&r)
                .unwrap_err()
                .to_string()
                .contains("no field 5")
        );
        let err = KeySelector::RecordKey.key(&rec(None, b"v")).unwrap_err();
        assert!(err.to_string().contains("record has no key"));
    }

    /// A field is what `str::split` gives, whatever the separator and the text.
    #[test]
    fn fields_are_split_as_text_splits() {
        let values = [
            "a,b,c",
            ",,",
            "",
            "wörld,日本,x",
            "a::b:::c",
            "x\ty\t",
            "é,é",
            "a→b→→c",
        ];
        for separator in [",", ":", "::", "\t", "→", "é", ", "] {
            for value in values {
                for index in 0..5 {
                    let selector = KeySelector::Field {
                        index,
                        separator: separator.into(),
                    };
                    let got = selector.key(&rec(None, value.as_bytes())).ok();
                    let want = value.split(separator).nth(index).map(str::as_bytes);
                    assert_eq!(got, want, "{value:?} split by {separator:?}, field {index}");
                }
            }
        }
    }

    #[test]
    fn same_key_same_subtask_for_each_parallelism() {
        for p in [1, 2, 3, 4, 7] {
            let t = hash_target(b"word", p, 128);
            assert!(t < p as usize);
            assert_eq!(t, hash_target(b"word", p, 128));
        }
    }
}
