//! Tests of the heap keyed state backend.

use super::*;
use crate::state::key_groups::{DEFAULT_MAX_PARALLELISM, key_group_of, key_groups_of_subtask};
use sluice_codec::EntryReader;

fn backend() -> KeyedStateBackend {
    KeyedStateBackend::new(DEFAULT_MAX_PARALLELISM, 0..DEFAULT_MAX_PARALLELISM)
}

fn value(name: &str) -> StateDescriptor {
    StateDescriptor {
        name: name.into(),
        kind: StateKind::Value,
        ttl_ms: None,
    }
}

/// The bytes of every entry, counted from scratch.
fn counted(b: &KeyedStateBackend) -> u64 {
    b.snapshot(i64::MIN)
        .key_groups()
        .flat_map(|(_, es)| es)
        .map(|(k, e)| entry_bytes(k.len(), e.value.len()))
        .sum()
}

#[test]
fn the_bytes_held_follow_every_change() {
    let mut b = backend();
    let v = b.declare(value("v")).unwrap();
    let l = b
        .declare(StateDescriptor {
            name: "l".into(),
            kind: StateKind::List,
            ttl_ms: None,
        })
        .unwrap();
    for i in 0..300u32 {
        b.put(v, &i.to_le_bytes(), b"", &vec![1; i as usize % 7], 0)
            .unwrap();
        b.append(l, b"k", &i.to_le_bytes(), 0).unwrap();
    }
    assert_eq!(b.bytes(), counted(&b));
    b.put(v, &7u32.to_le_bytes(), b"", b"a longer value", 0)
        .unwrap();
    b.delete(v, &8u32.to_le_bytes(), b"").unwrap();
    b.delete(v, b"never written", b"").unwrap();
    b.clear(l, b"k").unwrap();
    assert_eq!(b.bytes(), counted(&b));
    let mut restored = backend();
    restored.restore(&b.snapshot(0)).unwrap();
    assert_eq!(restored.bytes(), b.bytes());
    // Restored into a backend that already has state: merged entry by entry.
    restored.restore(&b.snapshot(0)).unwrap();
    assert_eq!(restored.bytes(), counted(&restored));
}

#[test]
fn ttl_cleanup_goes_round_in_steps_and_snapshots_leave_expired_entries_out() {
    let mut b = backend();
    let t = b
        .declare(StateDescriptor {
            name: "t".into(),
            kind: StateKind::Value,
            ttl_ms: Some(10),
        })
        .unwrap();
    let keep = b.declare(value("keep")).unwrap();
    for i in 0..1000u32 {
        b.put(t, &i.to_le_bytes(), b"", b"x", 0).unwrap();
        b.put(keep, &i.to_le_bytes(), b"", b"y", 0).unwrap();
    }
    // At 5 nothing has expired; at 20 the TTL state has, and a snapshot then leaves
    // it out, while the entries are still in memory.
    assert_eq!(b.snapshot(5).len(), 2000);
    let live: usize = b.snapshot(20).key_groups().map(|(_, es)| es.count()).sum();
    assert_eq!(live, 1000);
    let mut removed = 0;
    for _ in 0..100 {
        let n = b.expire_some(20, 50);
        assert!(n <= 50);
        removed += n;
    }
    assert_eq!(removed, 1000);
    assert_eq!(b.len(), 1000);
    assert_eq!(b.bytes(), counted(&b));
    // A state declared again without its TTL keeps its entries.
    let mut lost = backend();
    let l = lost
        .declare(StateDescriptor {
            name: "l".into(),
            kind: StateKind::Value,
            ttl_ms: Some(10),
        })
        .unwrap();
    lost.put(l, b"k", b"", b"v", 0).unwrap();
    lost.declare(value("l")).unwrap();
    assert_eq!(lost.expire_some(1000, 10), 0);
    assert_eq!(lost.len(), 1);
    // Without TTL states nothing is looked at.
    let mut plain = backend();
    let p = plain.declare(value("p")).unwrap();
    plain.put(p, b"k", b"", b"v", 0).unwrap();
    assert_eq!(plain.expire_some(i64::MAX, usize::MAX), 0);
}

#[test]
fn malformed_keys_in_a_checkpoint_are_an_error() {
    let entry = Entry {
        value: Value::from(&b"v"[..]),
        written_at: 0,
    };
    let good = {
        let mut k = Vec::new();
        compose(&mut k, 0, b"key", b"");
        k
    };
    for bad in [vec![0, 0], vec![0, 0, 0, 0, 0, 0, 0, 9, 1], {
        let mut k = good.clone();
        k[3] = 7; // an undeclared state
        k
    }] {
        let err = KeyedStateSnapshot::from_parts(
            vec![value("v")],
            0,
            vec![vec![(good.clone(), entry.clone()), (bad, entry.clone())]],
        )
        .unwrap_err();
        assert!(err.contains("malformed state key"), "{err}");
    }
    let ok = KeyedStateSnapshot::from_parts(vec![value("v")], 0, vec![vec![(good, entry)]]);
    assert_eq!(ok.unwrap().len(), 1);
}

#[test]
fn put_get_delete() {
    let mut b = backend();
    let s = b.declare(value("count")).unwrap();
    assert_eq!(b.get(s, b"k", b"", 0).unwrap(), None);
    b.put(s, b"k", b"", b"1", 0).unwrap();
    assert_eq!(&*b.get(s, b"k", b"", 0).unwrap().unwrap(), b"1");
    b.delete(s, b"k", b"").unwrap();
    assert_eq!(b.get(s, b"k", b"", 0).unwrap(), None);
}

#[test]
fn an_update_after_a_snapshot_does_not_change_the_snapshot() {
    let mut b = backend();
    let s = b.declare(value("v")).unwrap();
    b.put(s, b"k", b"", b"aaaa", 0).unwrap();
    // Same length, not shared: updated in place.
    b.put(s, b"k", b"", b"bbbb", 1).unwrap();
    let snap = b.snapshot(0);
    b.put(s, b"k", b"", b"cccc", 2).unwrap();
    let old: Vec<_> = snap
        .key_groups()
        .flat_map(|(_, es)| es)
        .map(|(_, e)| (e.value.to_vec(), e.written_at))
        .collect();
    assert_eq!(old, vec![(b"bbbb".to_vec(), 1)]);
    assert_eq!(&*b.get(s, b"k", b"", 2).unwrap().unwrap(), b"cccc");
}

#[test]
fn values_short_and_long_survive_overwrites_and_snapshots() {
    let mut b = backend();
    let s = b.declare(value("v")).unwrap();
    let long = |c: u8| vec![c; 100];
    let short = |c: u8| vec![c; 3];
    // Short to long to short, each read back; the bytes held follow.
    for v in [short(1), long(2), short(3), vec![], long(4), long(5)] {
        b.put(s, b"k", b"", &v, 0).unwrap();
        assert_eq!(b.get(s, b"k", b"", 0).unwrap(), Some(v.clone()));
        assert_eq!(counted(&b), b.bytes());
    }
    // A snapshot keeps what it saw, short or long, whatever is written after it.
    b.put(s, b"short", b"", &short(6), 0).unwrap();
    let snap = b.snapshot(0);
    b.put(s, b"k", b"", &long(7), 0).unwrap();
    b.put(s, b"short", b"", &short(8), 0).unwrap();
    let mut seen: Vec<Vec<u8>> = snap
        .key_groups()
        .flat_map(|(_, es)| es)
        .map(|(_, e)| e.value.to_vec())
        .collect();
    seen.sort();
    assert_eq!(seen, vec![long(5), short(6)]);
    assert_eq!(b.get(s, b"k", b"", 0).unwrap(), Some(long(7)));
    assert_eq!(b.get(s, b"short", b"", 0).unwrap(), Some(short(8)));
}

#[test]
fn states_and_keys_do_not_overlap() {
    let mut b = backend();
    let a = b.declare(value("a")).unwrap();
    let c = b.declare(value("c")).unwrap();
    // "ab" + "" must not collide with "a" + "b".
    b.put(a, b"ab", b"", b"1", 0).unwrap();
    b.put(a, b"a", b"b", b"2", 0).unwrap();
    b.put(c, b"ab", b"", b"3", 0).unwrap();
    assert_eq!(&*b.get(a, b"ab", b"", 0).unwrap().unwrap(), b"1");
    assert_eq!(&*b.get(a, b"a", b"b", 0).unwrap().unwrap(), b"2");
    assert_eq!(&*b.get(c, b"ab", b"", 0).unwrap().unwrap(), b"3");
    b.clear(a, b"a").unwrap();
    assert_eq!(b.get(a, b"a", b"b", 0).unwrap(), None);
    assert!(b.get(a, b"ab", b"", 0).unwrap().is_some());
}

#[test]
fn redeclaring_returns_the_same_id_and_rejects_another_kind() {
    let mut b = backend();
    let id = b.declare(value("x")).unwrap();
    assert_eq!(b.declare(value("x")).unwrap(), id);
    let err = b
        .declare(StateDescriptor {
            kind: StateKind::Map,
            ..value("x")
        })
        .unwrap_err();
    assert!(err.contains("declared as Map"), "{err}");
}

#[test]
fn list_append_keeps_order_beyond_255_elements() {
    let mut b = backend();
    let l = b
        .declare(StateDescriptor {
            kind: StateKind::List,
            ..value("l")
        })
        .unwrap();
    for i in 0..300u32 {
        b.append(l, b"k", &i.to_le_bytes(), 0).unwrap();
    }
    let bytes = b.entries(l, b"k", 0).unwrap();
    let got: Vec<u32> = EntryReader::new(&bytes)
        .map(|e| u32::from_le_bytes(e.unwrap().1.try_into().unwrap()))
        .collect();
    assert_eq!(got, (0..300).collect::<Vec<_>>());
    let v = b.declare(value("v")).unwrap();
    assert!(matches!(
        b.append(v, b"k", b"x", 0),
        Err(StateError::WrongKind { .. })
    ));
}

#[test]
fn ttl_hides_and_expires_old_entries() {
    let mut b = backend();
    let s = b
        .declare(StateDescriptor {
            ttl_ms: Some(100),
            ..value("t")
        })
        .unwrap();
    b.put(s, b"k", b"", b"v", 1000).unwrap();
    assert!(b.get(s, b"k", b"", 1099).unwrap().is_some());
    assert!(b.get(s, b"k", b"", 1100).unwrap().is_none());
    assert_eq!(b.expire(1100), 1);
    assert!(b.is_empty());
}

#[test]
fn snapshot_is_isolated_from_later_writes() {
    let mut b = backend();
    let s = b.declare(value("count")).unwrap();
    for i in 0..1000u32 {
        b.put(s, &i.to_le_bytes(), b"", b"old", 0).unwrap();
    }
    let snap = b.snapshot(0);
    for i in 0..1000u32 {
        b.put(s, &i.to_le_bytes(), b"", b"new", 0).unwrap();
    }
    b.put(s, b"extra", b"", b"x", 0).unwrap();
    assert_eq!(snap.len(), 1000);
    assert!(
        snap.key_groups()
            .flat_map(|(_, es)| es)
            .all(|(_, e)| &*e.value == b"old")
    );
}

#[test]
fn foreign_keys_are_rejected() {
    let range = key_groups_of_subtask(0, 2, DEFAULT_MAX_PARALLELISM);
    let mut b = KeyedStateBackend::new(DEFAULT_MAX_PARALLELISM, range);
    let s = b.declare(value("v")).unwrap();
    let foreign = (0u32..)
        .map(|i| i.to_le_bytes())
        .find(|k| key_group_of(k, DEFAULT_MAX_PARALLELISM) >= 64)
        .unwrap();
    let err = b.put(s, &foreign, b"", b"x", 0).unwrap_err();
    assert!(matches!(err, StateError::ForeignKey { .. }));
    assert!(err.to_string().contains("key groups 0..64"));
}

#[test]
fn restore_redistributes_by_key_group_and_maps_states_by_name() {
    let mut old = backend();
    let _unused = old.declare(value("first")).unwrap();
    let s = old.declare(value("count")).unwrap();
    for i in 0..500u32 {
        old.put(s, &i.to_le_bytes(), b"", &i.to_le_bytes(), 0)
            .unwrap();
    }
    let snap = old.snapshot(0);
    let mut total = 0;
    for subtask in 0..3 {
        let mut new = KeyedStateBackend::new(
            DEFAULT_MAX_PARALLELISM,
            key_groups_of_subtask(subtask, 3, DEFAULT_MAX_PARALLELISM),
        );
        // Declared in another order than before: ids differ, names match.
        let count = new.declare(value("count")).unwrap();
        new.restore(&snap).unwrap();
        for i in 0..500u32 {
            if let Ok(v) = new.get(count, &i.to_le_bytes(), b"", 0) {
                assert_eq!(&*v.unwrap(), &i.to_le_bytes());
                total += 1;
            }
        }
    }
    assert_eq!(total, 500);
}

#[test]
fn restored_state_is_shared_with_the_snapshot_until_written() {
    // Two subtasks' snapshots merged into one backend (a scale-in), same state ids.
    let mut snaps = Vec::new();
    for subtask in 0..2 {
        let mut old = KeyedStateBackend::new(
            DEFAULT_MAX_PARALLELISM,
            key_groups_of_subtask(subtask, 2, DEFAULT_MAX_PARALLELISM),
        );
        let s = old.declare(value("count")).unwrap();
        for i in 0..500u32 {
            let _ = old.put(s, &i.to_le_bytes(), b"", &[subtask as u8], 0);
        }
        snaps.push(old.snapshot(0));
    }
    let mut new = backend();
    for snap in &snaps {
        new.restore(snap).unwrap();
    }
    let s = new.declare(value("count")).unwrap();
    assert_eq!(new.snapshot(0).len(), 500);
    let owner = |i: u32| {
        let kg = key_group_of(&i.to_le_bytes(), DEFAULT_MAX_PARALLELISM);
        usize::from(!key_groups_of_subtask(0, 2, DEFAULT_MAX_PARALLELISM).contains(&kg))
    };
    for i in 0..500u32 {
        let v = new.get(s, &i.to_le_bytes(), b"", 0).unwrap().unwrap();
        assert_eq!(&*v, &[owner(i) as u8]);
        new.put(s, &i.to_le_bytes(), b"", b"new", 0).unwrap();
    }
    // Writing the restored backend leaves the snapshots it came from as they were.
    assert_eq!(
        snaps.iter().map(KeyedStateSnapshot::len).sum::<usize>(),
        500
    );
    for (subtask, snap) in snaps.iter().enumerate() {
        for (_, entries) in snap.key_groups() {
            for (_, e) in entries {
                assert_eq!(&*e.value, &[subtask as u8]);
            }
        }
    }
}

#[test]
fn the_ttl_queue_counts_as_state_so_writes_and_deletes_cannot_grow_it_unseen() {
    let mut b = backend();
    let t = b
        .declare(StateDescriptor {
            name: "t".into(),
            kind: StateKind::Value,
            ttl_ms: Some(86_400_000),
        })
        .unwrap();
    // Each key written and deleted at once: the maps hold nothing, but each write queued
    // its entry for the cleanup a day later.
    let long_key = [7u8; 100];
    for i in 0..10_000u32 {
        let key = [&i.to_le_bytes()[..], &long_key].concat();
        b.put(t, &key, b"", b"x", 0).unwrap();
        b.delete(t, &key, b"").unwrap();
    }
    assert_eq!(b.len(), 0);
    assert!(b.bytes() > 10_000 * 100, "{}", b.bytes());
    // Once their time comes, the cleanup drops them, and their bytes (1,000 per step).
    for _ in 0..10 {
        b.expire_some(86_400_001, 1000);
    }
    assert_eq!(b.bytes(), 0);
}
