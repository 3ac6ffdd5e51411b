//! Key groups: the unit in which keyed state is assigned to subtasks.
//!
//! A key hashes to one of `max_parallelism` key groups; each subtask owns a contiguous
//! range of key groups. Changing the parallelism moves whole key groups between subtasks,
//! so keyed state can be redistributed without rehashing a single key. The assignment
//! follows Flink's `KeyGroupRangeAssignment`, so the same key lands on the same subtask
//! for the same `(parallelism, max_parallelism)`.

use std::ops::Range;

/// Default number of key groups (Flink's default for small parallelism).
pub const DEFAULT_MAX_PARALLELISM: u32 = crate::spec::limits::MAX_PARALLELISM.default;

/// The key group of `key`. The hash is defined here (not `std`'s, which may change
/// between Rust releases), so assignments are stable across runs, builds and hosts.
pub fn key_group_of(key: &[u8], max_parallelism: u32) -> u32 {
    (stable_hash(key) % u64::from(max_parallelism)) as u32
}

/// The subtask that owns `key_group` at `parallelism`.
pub fn subtask_for_key_group(key_group: u32, parallelism: u32, max_parallelism: u32) -> u32 {
    (u64::from(key_group) * u64::from(parallelism) / u64::from(max_parallelism)) as u32
}

/// The subtask that owns `key`.
pub fn subtask_for_key(key: &[u8], parallelism: u32, max_parallelism: u32) -> u32 {
    subtask_for_key_group(
        key_group_of(key, max_parallelism),
        parallelism,
        max_parallelism,
    )
}

/// The key groups owned by `subtask`: the inverse of [`subtask_for_key_group`].
pub fn key_groups_of_subtask(subtask: u32, parallelism: u32, max_parallelism: u32) -> Range<u32> {
    let (p, m) = (u64::from(parallelism), u64::from(max_parallelism));
    let start = (u64::from(subtask) * m).div_ceil(p);
    let end = ((u64::from(subtask) + 1) * m).div_ceil(p);
    start as u32..end as u32
}

/// FNV-1a over the bytes, finished with murmur3's avalanche step so that keys differing
/// only in their last byte still spread over all key groups.
fn stable_hash(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_partition_all_key_groups_and_invert_the_assignment() {
        for max in [1, 7, 128, 1000] {
            for par in 1..=max.min(40) {
                let mut next = 0;
                for subtask in 0..par {
                    let range = key_groups_of_subtask(subtask, par, max);
                    assert_eq!(range.start, next, "max {max} par {par}");
                    for kg in range.clone() {
                        assert_eq!(subtask_for_key_group(kg, par, max), subtask);
                    }
                    next = range.end;
                }
                assert_eq!(next, max);
            }
        }
    }

    #[test]
    fn hash_is_stable_across_runs() {
        // Pinned values: changing the hash would silently move every key of every
        // existing checkpoint to another key group.
        assert_eq!(key_group_of(b"", 128), 38);
        assert_eq!(key_group_of(b"hello", 128), 68);
        assert_eq!(key_group_of(b"world", 32768), 23957);
    }

    #[test]
    fn keys_spread_over_key_groups() {
        let mut seen = vec![0u32; 128];
        for i in 0..12_800u32 {
            seen[key_group_of(format!("word{i}").as_bytes(), 128) as usize] += 1;
        }
        assert!(seen.iter().all(|&n| (50..150).contains(&n)), "{seen:?}");
    }
}
