use super::*;
use crate::state::key_groups::{key_group_of, key_groups_of_subtask};
use crate::state::{KeyedSnapshot, KeyedState};
use crate::timers::TimerQueues;
use std::collections::BTreeMap;

fn config(dir: &Path, shared: Option<&Path>) -> LsmConfig {
    LsmConfig {
        dir: dir.to_path_buf(),
        memory_bytes: MIN_MEMORY_BYTES,
        shared: shared.map(SharedFolder::of),
    }
}

fn descriptor(name: &str, kind: StateKind, ttl_ms: Option<u64>) -> StateDescriptor {
    StateDescriptor {
        name: name.into(),
        kind,
        ttl_ms,
    }
}

/// A small deterministic generator (xorshift), so a failure repeats.
struct Rng(u64);

impl Rng {
    fn next(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Every live entry, as `(state, key) → entries` read through the backend's own calls.
fn contents(state: &mut KeyedState, keys: u64) -> BTreeMap<(u32, Vec<u8>), Vec<u8>> {
    let mut out = BTreeMap::new();
    for s in 0..state.descriptors().len() as u32 {
        for k in 0..keys {
            let key = format!("key-{k}").into_bytes();
            if !state.key_groups().contains(&key_group_of(&key, 128)) {
                continue;
            }
            let entries = state.entries(s, &key, 0).unwrap();
            if !entries.is_empty() {
                out.insert((s, key), entries);
            }
        }
    }
    out
}

/// The same random calls on both backends leave the same state, read the same way.
fn run_calls(heap: &mut KeyedState, lsm: &mut KeyedState, seed: u64, calls: usize, keys: u64) {
    let mut rng = Rng(seed);
    for state in [heap as &mut KeyedState, lsm] {
        state
            .declare(descriptor("value", StateKind::Value, None))
            .unwrap();
        state
            .declare(descriptor("list", StateKind::List, None))
            .unwrap();
        state
            .declare(descriptor("map", StateKind::Map, None))
            .unwrap();
    }
    for _ in 0..calls {
        let key = format!("key-{}", rng.next(keys)).into_bytes();
        let value = rng.next(1000).to_string().into_bytes();
        let user_key = format!("u{}", rng.next(5)).into_bytes();
        let op = rng.next(13);
        if op >= 10 {
            // Reads, as a call makes them: after the effects so far are committed and the
            // keys of a batch (this key among others) read ahead, or with writes pending.
            if op == 10 {
                let mut batch = sluice_codec::BatchWriter::new();
                for k in [key.clone(), format!("key-{}", rng.next(keys)).into_bytes()] {
                    batch.push(Some(&k), b"", None);
                }
                for state in [&mut *heap, &mut *lsm] {
                    state.commit().unwrap();
                    state.prefetch(batch.as_bytes()).unwrap();
                }
            }
            let read = |s: &KeyedState| s.get(0, &key, b"", 1).ok();
            assert_eq!(read(heap), read(lsm), "key {key:?}");
            continue;
        }
        for state in [&mut *heap, &mut *lsm] {
            let owned = state
                .key_groups()
                .contains(&key_group_of(&key, state.max_parallelism()));
            let result = match op {
                0..=3 => state.put(0, &key, b"", &value, 1),
                4 => state.delete(0, &key, b""),
                5 | 6 => state.append(1, &key, &value, 1),
                7 => state.put(2, &key, &user_key, &value, 1),
                8 => state.delete(2, &key, &user_key),
                _ => state.clear(if value[0].is_multiple_of(2) { 1 } else { 2 }, &key),
            };
            assert_eq!(result.is_ok(), owned, "{result:?}");
        }
    }
}

#[test]
fn the_lsm_backend_answers_every_call_as_the_heap_backend_does() {
    let dir = tempfile::tempdir().unwrap();
    let groups = key_groups_of_subtask(1, 2, 128);
    let mut heap = KeyedState::heap(128, groups.clone());
    let mut lsm = KeyedState::lsm(config(&dir.path().join("db"), None), 128, groups).unwrap();
    run_calls(&mut heap, &mut lsm, 7, 5_000, 200);
    let expected = contents(&mut heap, 200);
    assert!(expected.len() > 100, "{}", expected.len());
    assert_eq!(contents(&mut lsm, 200), expected);
    let owned = (0..200)
        .map(|k| format!("key-{k}").into_bytes())
        .filter(|k| lsm.key_groups().contains(&key_group_of(k, 128)))
        .collect::<Vec<_>>();
    let present = owned
        .iter()
        .filter(|k| heap.get(0, k, b"", 0).unwrap().is_some())
        .count();
    assert!(present > 10, "{present}");
    for k in &owned {
        assert_eq!(
            lsm.get(0, k, b"", 0).unwrap(),
            heap.get(0, k, b"", 0).unwrap()
        );
    }
    // A key of another subtask's key groups is refused, naming them.
    let foreign = (0..200)
        .map(|k| format!("key-{k}").into_bytes())
        .find(|k| !lsm.key_groups().contains(&key_group_of(k, 128)))
        .unwrap();
    let err = lsm.put(0, &foreign, b"", b"1", 0).unwrap_err();
    assert!(
        err.to_string().contains("subtask owns key groups 64..128"),
        "{err}"
    );
    // Appending is for list states only.
    let err = lsm.append(0, &owned[0], b"x", 0).unwrap_err();
    assert!(err.to_string().contains("cannot append"), "{err}");
}

#[test]
fn entries_past_their_ttl_read_as_absent() {
    let dir = tempfile::tempdir().unwrap();
    let mut lsm = KeyedState::lsm(config(dir.path(), None), 128, 0..128).unwrap();
    let s = lsm
        .declare(descriptor("seen", StateKind::Value, Some(100)))
        .unwrap();
    lsm.put(s, b"k", b"", b"1", 1_000).unwrap();
    assert_eq!(lsm.get(s, b"k", b"", 1_099).unwrap(), Some(b"1".to_vec()));
    assert_eq!(lsm.get(s, b"k", b"", 1_100).unwrap(), None);
    assert!(lsm.entries(s, b"k", 1_100).unwrap().is_empty());
}

/// Uploads `snapshot` as a checkpoint would, and reads back its manifest as a restore
/// from the checkpoint storage `storage` would.
fn checkpoint(snapshot: KeyedSnapshot, storage: &Path) -> LsmFiles {
    let KeyedSnapshot::Lsm(local) = snapshot else {
        panic!("not an LSM snapshot")
    };
    let mut files = local.upload().unwrap();
    files.shared = Some(SharedFolder::of(storage));
    files
}

#[test]
fn a_checkpoint_copies_only_the_files_the_last_one_did_not_and_restores_whole() {
    let root = tempfile::tempdir().unwrap();
    let storage = root.path().join("checkpoints");
    let groups = 0..128;
    let mut heap = KeyedState::heap(128, groups.clone());
    let mut lsm = KeyedState::lsm(
        config(&root.path().join("work"), Some(&storage)),
        128,
        groups.clone(),
    )
    .unwrap();
    run_calls(&mut heap, &mut lsm, 11, 3_000, 300);
    let first = checkpoint(lsm.snapshot(1, 0).unwrap(), &storage);
    let tables = |f: &LsmFiles| {
        f.shared_files()
            .map(|(n, _)| n.to_string())
            .collect::<Vec<_>>()
    };
    assert!(!tables(&first).is_empty());
    assert_eq!(first.copied_files as usize, tables(&first).len());
    // No change: the next checkpoint copies nothing new.
    let second = checkpoint(lsm.snapshot(2, 0).unwrap(), &storage);
    assert_eq!(tables(&second), tables(&first));
    assert_eq!((second.copied_files, second.copied), (0, 0));
    // A few changes: one new table, the old ones named again.
    lsm.put(0, b"key-1", b"", b"changed", 5).unwrap();
    heap.put(0, b"key-1", b"", b"changed", 5).unwrap();
    let third = checkpoint(lsm.snapshot(3, 0).unwrap(), &storage);
    let new: Vec<_> = tables(&third)
        .into_iter()
        .filter(|t| !tables(&first).contains(t))
        .collect();
    assert_eq!(new.len(), 1, "{new:?}");
    assert_eq!(third.copied_files, 1);
    assert_eq!(
        std::fs::read_dir(storage.join("shared")).unwrap().count(),
        tables(&first).len() + 1
    );
    // Restored whole into a new instance: the same state, its tables linked.
    let mut restored = KeyedState::lsm(
        config(&root.path().join("work2"), Some(&storage)),
        128,
        groups,
    )
    .unwrap();
    restored
        .restore(&[KeyedSnapshot::Files(third.clone())], TimerQueues::new())
        .unwrap();
    assert_eq!(contents(&mut restored, 300), contents(&mut heap, 300));
    // And it names the restored tables again instead of copying them.
    let fourth = checkpoint(restored.snapshot(4, 0).unwrap(), &storage);
    assert_eq!(tables(&fourth), tables(&third));
    assert_eq!(fourth.copied_files, 0);
}

#[test]
fn a_checkpoints_files_hold_the_state_at_its_barrier_however_much_is_written_after() {
    let root = tempfile::tempdir().unwrap();
    let storage = root.path().join("checkpoints");
    let mut lsm = LsmBackend::open(
        config(&root.path().join("work"), Some(&storage)),
        128,
        0..128,
    )
    .unwrap();
    let s = lsm
        .declare(descriptor("value", StateKind::Value, None))
        .unwrap();
    let key = |i: u64| format!("key-{i}").into_bytes();
    for i in 0..1_000 {
        lsm.put(s, &key(i), b"", b"before", 0).unwrap();
    }
    lsm.commit().unwrap();
    // The link is held back until the writer below has had every chance to flush
    // something written after the barrier.
    let gate = lsm.gate.clone();
    gate.hold(true);
    let snapshot = lsm.snapshot(1, 0).unwrap();
    // After the barrier, the same keys and new ones, enough to switch the memtable of the
    // least budget many times over, while the checkpoint's files are not yet linked.
    let writer = std::thread::spawn(move || {
        for round in 0..100u64 {
            for i in 0..2_000 {
                let value = format!("after-{round}");
                lsm.put(s, &key(i + round * 1_000), b"", value.as_bytes(), 0)
                    .unwrap();
            }
            lsm.commit().unwrap();
        }
    });
    // Until the writer waits for the link (or, were nothing holding it back, is done).
    while gate.waiting() == 0 && !writer.is_finished() {
        std::thread::yield_now();
    }
    gate.hold(false);
    let files = checkpoint(KeyedSnapshot::Lsm(snapshot), &storage);
    writer.join().unwrap();
    let mut restored = KeyedState::lsm(
        config(&root.path().join("restored"), Some(&storage)),
        128,
        0..128,
    )
    .unwrap();
    restored
        .restore(&[KeyedSnapshot::Files(files)], TimerQueues::new())
        .unwrap();
    for i in 0..1_000 {
        assert_eq!(
            restored.get(s, &key(i), b"", 0).unwrap().as_deref(),
            Some(b"before".as_slice()),
            "key {i}"
        );
    }
    assert_eq!(restored.get(s, &key(50_000), b"", 0).unwrap(), None);
}

#[test]
fn lsm_and_heap_state_restore_into_each_other_at_another_parallelism() {
    let root = tempfile::tempdir().unwrap();
    let storage = root.path().join("checkpoints");
    let mut heap = KeyedState::heap(128, 0..128);
    let mut lsm = KeyedState::lsm(
        config(&root.path().join("work"), Some(&storage)),
        128,
        0..128,
    )
    .unwrap();
    run_calls(&mut heap, &mut lsm, 23, 3_000, 300);
    let files = checkpoint(lsm.snapshot(1, 0).unwrap(), &storage);
    let heap_snapshot = heap.snapshot(1, 0).unwrap();
    let all = contents(&mut heap, 300);
    for subtask in 0..3 {
        let groups = key_groups_of_subtask(subtask, 3, 128);
        let mine = |m: &BTreeMap<(u32, Vec<u8>), Vec<u8>>| {
            m.iter()
                .filter(|((_, k), _)| groups.contains(&key_group_of(k, 128)))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<BTreeMap<_, _>>()
        };
        // LSM checkpoint into the heap backend.
        let mut into_heap = KeyedState::heap(128, groups.clone());
        into_heap
            .restore(&[KeyedSnapshot::Files(files.clone())], TimerQueues::new())
            .unwrap();
        assert_eq!(
            contents(&mut into_heap, 300),
            mine(&all),
            "subtask {subtask}"
        );
        // Heap snapshot into the LSM backend.
        let mut into_lsm = KeyedState::lsm(
            config(&root.path().join(format!("into-{subtask}")), None),
            128,
            groups.clone(),
        )
        .unwrap();
        into_lsm
            .restore(std::slice::from_ref(&heap_snapshot), TimerQueues::new())
            .unwrap();
        assert_eq!(
            contents(&mut into_lsm, 300),
            mine(&all),
            "subtask {subtask}"
        );
        // LSM checkpoint into an LSM backend of other key groups: read by range.
        let mut rescaled = KeyedState::lsm(
            config(&root.path().join(format!("rescaled-{subtask}")), None),
            128,
            groups.clone(),
        )
        .unwrap();
        rescaled
            .restore(&[KeyedSnapshot::Files(files.clone())], TimerQueues::new())
            .unwrap();
        assert_eq!(
            contents(&mut rescaled, 300),
            mine(&all),
            "subtask {subtask}"
        );
    }
}

#[test]
fn a_restore_names_a_missing_or_truncated_table_file() {
    let root = tempfile::tempdir().unwrap();
    let storage = root.path().join("checkpoints");
    let mut lsm = KeyedState::lsm(
        config(&root.path().join("work"), Some(&storage)),
        128,
        0..128,
    )
    .unwrap();
    let s = lsm
        .declare(descriptor("v", StateKind::Value, None))
        .unwrap();
    lsm.put(s, b"k", b"", b"1", 0).unwrap();
    let files = checkpoint(lsm.snapshot(1, 0).unwrap(), &storage);
    let (table, _) = files.shared_files().next().unwrap();
    let path = storage.join("shared").join(table);
    std::fs::write(&path, b"short").unwrap();
    let mut restored =
        KeyedState::lsm(config(&root.path().join("again"), None), 128, 0..128).unwrap();
    let err = restored
        .restore(&[KeyedSnapshot::Files(files.clone())], TimerQueues::new())
        .unwrap_err();
    assert!(format!("{err:#}").contains(table), "{err:#}");
    std::fs::remove_file(&path).unwrap();
    let mut restored =
        KeyedState::lsm(config(&root.path().join("again2"), None), 128, 0..128).unwrap();
    let err = restored
        .restore(&[KeyedSnapshot::Files(files)], TimerQueues::new())
        .unwrap_err();
    assert!(format!("{err:#}").contains("is missing"), "{err:#}");
}

#[test]
fn compaction_drops_entries_past_their_ttl() {
    let dir = tempfile::tempdir().unwrap();
    let mut lsm = LsmBackend::open(config(dir.path(), None), 128, 0..128).unwrap();
    let short = lsm
        .declare(descriptor("short", StateKind::Value, Some(60_000)))
        .unwrap();
    let forever = lsm
        .declare(descriptor("forever", StateKind::Value, None))
        .unwrap();
    let now = crate::timers::now_millis();
    for i in 0..100u32 {
        let key = i.to_be_bytes();
        // Written two minutes ago: past the one-minute TTL.
        lsm.put(short, &key, b"", b"old", now - 120_000).unwrap();
        lsm.put(forever, &key, b"", b"kept", now - 120_000).unwrap();
    }
    lsm.commit().unwrap();
    lsm.store.db.flush().unwrap();
    let stored = |lsm: &LsmBackend| lsm.store.db.iterator(IteratorMode::Start).count();
    assert_eq!(stored(&lsm), 200);
    lsm.store.db.compact_range::<&[u8], &[u8]>(None, None);
    // The expired entries are gone from the files, not only hidden from reads.
    assert_eq!(stored(&lsm), 100);
    assert_eq!(
        lsm.get(forever, &7u32.to_be_bytes(), b"", now).unwrap(),
        Some(b"kept".to_vec())
    );
}

#[test]
fn a_list_whose_only_element_has_the_empty_user_key_goes_on_as_on_the_heap() {
    let dir = tempfile::tempdir().unwrap();
    let mut heap = KeyedState::heap(128, 0..128);
    let mut lsm = KeyedState::lsm(config(dir.path(), None), 128, 0..128).unwrap();
    for state in [&mut heap, &mut lsm] {
        let s = state
            .declare(descriptor("list", StateKind::List, None))
            .unwrap();
        state.put(s, b"k", b"", b"first", 0).unwrap();
        state.append(s, b"k", b"second", 0).unwrap();
        state.append(s, b"k", b"third", 0).unwrap();
    }
    assert_eq!(
        lsm.entries(0, b"k", 0).unwrap(),
        heap.entries(0, b"k", 0).unwrap()
    );
}

/// Every timer of `timers`, in the order the heap's queues keep them.
fn all_timers(timers: &TimerQueues) -> Vec<(TimeDomain, i64, Vec<u8>)> {
    [TimeDomain::EventTime, TimeDomain::ProcessingTime]
        .into_iter()
        .flat_map(|d| timers.iter(d).map(move |(t, k)| (d, t, k.to_vec())))
        .collect()
}

/// Takes the timers of `domain` due at `time` out of the database, `chunk` at a time;
/// `None` when none is due, as the heap's `pop_due`.
fn pop_due(lsm: &mut LsmBackend, domain: TimeDomain, time: i64, chunk: usize) -> Option<Vec<u8>> {
    let mut out = TimerWriter::new();
    while lsm.pop_due_timers(&mut out, domain, time, chunk).unwrap() == chunk {}
    (!out.is_empty()).then(|| out.into_bytes())
}

/// Fires every timer of `lsm` (all due at the end of time), as the heap's queues would.
fn fire_all(lsm: &mut LsmBackend) -> TimerQueues {
    let mut out = TimerQueues::new();
    for domain in [TimeDomain::EventTime, TimeDomain::ProcessingTime] {
        if let Some(due) = pop_due(lsm, domain, i64::MAX, 1000) {
            for t in sluice_codec::TimerReader::new(&due) {
                let t = t.unwrap();
                out.register(domain, t.timestamp, t.key);
            }
        }
        assert_eq!(lsm.next_timer(domain).unwrap(), None);
    }
    out
}

/// An instance's timers in two tiers — the earliest on the heap within a bound, the rest
/// in the database — answer as the heap's queues alone: random timers over times far
/// apart make the heap give its later ones to the database again and again, and firing
/// empties the database so the heap takes the next ones.
/// Takes an instance's timers of `domain` due at `time`, `chunk` at a time, as the chain
/// fires them; `None` when none is due.
fn fire(
    state: &mut crate::chain::OperatorState,
    domain: TimeDomain,
    time: i64,
    chunk: usize,
) -> Option<Vec<u8>> {
    let mut all: Option<Vec<u8>> = None;
    while let Some((bytes, n)) = state.pop_due_timers(domain, time, chunk).unwrap() {
        assert!(n <= chunk);
        all.get_or_insert_default().extend_from_slice(&bytes);
        if n < chunk {
            break;
        }
    }
    all
}

#[test]
fn an_instances_timers_on_the_heap_and_in_the_database_fire_as_the_heaps_alone() {
    use crate::chain::OperatorState;
    let root = tempfile::tempdir().unwrap();
    let lsm = KeyedState::lsm(config(&root.path().join("work"), None), 128, 0..128).unwrap();
    let mut state = OperatorState::new(Some(lsm));
    let mut model = TimerQueues::new();
    let mut rng = Rng(97);
    let (mut spilled, mut taken_back) = (0, 0);
    let mut now = [i64::MIN; 2];
    for step in 0..60_000 {
        let domain = if rng.next(4) == 0 {
            TimeDomain::ProcessingTime
        } else {
            TimeDomain::EventTime
        };
        let slot = timers::slot(domain);
        let key = format!("key-{}", rng.next(5_000)).into_bytes();
        let base = now[slot].max(0);
        let time = base + rng.next(20_000) as i64;
        // Now and then time jumps past every timer: the database empties.
        let op = if step % 10_000 == 9_999 {
            9
        } else {
            rng.next(10)
        };
        match op {
            0..=6 => {
                state.register_timer(domain, time, &key).unwrap();
                model.register(domain, time, &key);
            }
            7 => {
                state.delete_timer(domain, time, &key).unwrap();
                model.delete(domain, time, &key);
            }
            _ => {
                if op == 9 && step % 10_000 == 9_999 {
                    now[slot] = base + 25_000;
                    let chunk = 1 + rng.next(3_000) as usize;
                    let fired = fire(&mut state, domain, now[slot], chunk);
                    assert_eq!(fired, model.pop_due(domain, now[slot]), "step {step}");
                } else if rng.next(40) == 0 {
                    now[slot] = base + rng.next(300) as i64;
                    let chunk = 1 + rng.next(50) as usize;
                    assert_eq!(
                        fire(&mut state, domain, now[slot], chunk),
                        model.pop_due(domain, now[slot]),
                        "step {step}"
                    );
                }
            }
        }
        let KeyedState::Lsm(b) = state.keyed.as_mut().unwrap() else {
            unreachable!()
        };
        if b.near_until(domain) < i64::MAX {
            spilled += 1;
        } else if spilled > 0 && model.len_of(domain) > 0 {
            taken_back += 1;
        }
        for d in [TimeDomain::EventTime, TimeDomain::ProcessingTime] {
            assert_eq!(state.next_timer(d).unwrap(), model.next(d), "step {step}");
        }
    }
    assert!(
        spilled > 10_000,
        "the database held timers for {spilled} steps only"
    );
    assert!(
        taken_back > 1_000,
        "the heap took timers back for {taken_back} steps only"
    );
    for d in [TimeDomain::EventTime, TimeDomain::ProcessingTime] {
        assert_eq!(
            fire(&mut state, d, i64::MAX, 4096),
            model.pop_due(d, i64::MAX)
        );
        let KeyedState::Lsm(b) = state.keyed.as_mut().unwrap() else {
            unreachable!()
        };
        b.raise_near_until(d).unwrap();
        assert_eq!(
            b.near_until(d),
            i64::MAX,
            "an empty database gives the heap all"
        );
    }
}

/// Random timers registered, deleted and fired in both, with state written between them
/// and memtables switched by checkpoints: fired in the same order, next the same.
#[test]
fn timers_in_the_database_fire_as_the_heaps_do() {
    let root = tempfile::tempdir().unwrap();
    let storage = root.path().join("checkpoints");
    let groups = key_groups_of_subtask(1, 2, 128);
    let mut lsm = LsmBackend::open(
        config(&root.path().join("work"), Some(&storage)),
        128,
        groups.clone(),
    )
    .unwrap();
    let value = lsm
        .declare(descriptor("value", StateKind::Value, None))
        .unwrap();
    let mut heap = TimerQueues::new();
    let mut rng = Rng(31);
    let keys: Vec<Vec<u8>> = (0..400)
        .map(|k| format!("key-{k}").into_bytes())
        .filter(|k| groups.contains(&key_group_of(k, 128)))
        .collect();
    let (mut event_time, mut processing_time) = (i64::MIN, -50);
    let mut fired = 0;
    for step in 0..20_000 {
        let key = &keys[rng.next(keys.len() as u64) as usize];
        let domain = if rng.next(3) == 0 {
            TimeDomain::ProcessingTime
        } else {
            TimeDomain::EventTime
        };
        let time = rng.next(200) as i64 - 50;
        match rng.next(20) {
            0..=10 => {
                lsm.register_timer(domain, time, key).unwrap();
                heap.register(domain, time, key);
            }
            11..=13 => {
                lsm.delete_timer(domain, time, key).unwrap();
                heap.delete(domain, time, key);
            }
            14 => {
                // The head, deleted: next must be found again.
                if let Some(next) = heap.next(domain) {
                    let head = heap.iter(domain).next().map(|(_, k)| k.to_vec()).unwrap();
                    lsm.delete_timer(domain, next, &head).unwrap();
                    heap.delete(domain, next, &head);
                }
            }
            15 | 16 => {
                let now = match domain {
                    TimeDomain::EventTime => &mut event_time,
                    TimeDomain::ProcessingTime => &mut processing_time,
                };
                *now = (*now).max(time - 20);
                let expected = heap.pop_due(domain, *now);
                fired += expected.as_ref().map_or(0, |e| e.len());
                let chunk = 1 + rng.next(40) as usize;
                assert_eq!(
                    pop_due(&mut lsm, domain, *now, chunk),
                    expected,
                    "step {step}"
                );
            }
            17 => lsm.put(value, key, b"", b"v", 0).unwrap(),
            18 => lsm.commit().unwrap(),
            _ if step % 500 == 19 => {
                let _ = checkpoint(KeyedSnapshot::Lsm(lsm.snapshot(step, 0).unwrap()), &storage);
            }
            _ => {}
        }
        for d in [TimeDomain::EventTime, TimeDomain::ProcessingTime] {
            assert_eq!(lsm.next_timer(d).unwrap(), heap.next(d), "step {step}");
        }
    }
    assert!(fired > 10_000, "{fired} bytes of timers fired");
    assert!(heap.len() > 100, "{} timers left", heap.len());
    assert_eq!(all_timers(&fire_all(&mut lsm)), all_timers(&heap));
}

/// Timers kept in the database go with its checkpoints and savepoints: restored whole,
/// rescaled by key group into either backend, from the heap's layout into the database,
/// and written into a savepoint in the heap's layout.
#[test]
fn timers_in_the_database_restore_rescale_and_go_into_savepoints() {
    let root = tempfile::tempdir().unwrap();
    let storage = root.path().join("checkpoints");
    let mut lsm = KeyedState::lsm(
        config(&root.path().join("work"), Some(&storage)),
        128,
        0..128,
    )
    .unwrap();
    let KeyedState::Lsm(b) = &mut lsm else {
        unreachable!()
    };
    let value = b
        .declare(descriptor("value", StateKind::Value, None))
        .unwrap();
    let mut timers = TimerQueues::new();
    for k in 0..500 {
        let key = format!("key-{k}").into_bytes();
        let domain = if k % 4 == 0 {
            TimeDomain::ProcessingTime
        } else {
            TimeDomain::EventTime
        };
        b.register_timer(domain, k % 37 - 10, &key).unwrap();
        b.register_timer(domain, 1_000 + k, &key).unwrap();
        timers.register(domain, k % 37 - 10, &key);
        timers.register(domain, 1_000 + k, &key);
        b.put(value, &key, b"", b"v", 0).unwrap();
    }
    let local = lsm.snapshot(1, 0).unwrap();
    // A savepoint: the entries and the timers in the heap's layout.
    let mut savepoint = Vec::new();
    let snapshot = crate::checkpoint::OperatorSnapshot {
        operator: "op".into(),
        state: Vec::new(),
        keyed: Some(local.clone()),
        timers: TimerQueues::new(),
        watermark: 0,
    };
    crate::checkpoint::format::write_operator_state(&mut savepoint, &snapshot).unwrap();
    let read = crate::checkpoint::format::read_operator_state(&savepoint[..]).unwrap();
    assert_eq!(all_timers(&read.timers), all_timers(&timers));
    let Some(KeyedSnapshot::Heap(entries)) = &read.keyed else {
        panic!("a savepoint holds entries")
    };
    assert_eq!(
        entries.key_groups().map(|(_, e)| e.count()).sum::<usize>(),
        500
    );
    let files = checkpoint(local, &storage);
    let mine = |groups: &Range<u32>| {
        let mut t = TimerQueues::new();
        for (d, time, key) in all_timers(&timers) {
            if groups.contains(&key_group_of(&key, 128)) {
                t.register(d, time, &key);
            }
        }
        all_timers(&t)
    };
    let fired = |state: KeyedState| match state {
        KeyedState::Lsm(mut b) => all_timers(&fire_all(&mut b)),
        KeyedState::Heap(_) => panic!("not an LSM backend"),
    };
    // Whole, its files reopened.
    let mut whole = KeyedState::lsm(
        config(&root.path().join("whole"), Some(&storage)),
        128,
        0..128,
    )
    .unwrap();
    let left = whole
        .restore(&[KeyedSnapshot::Files(files.clone())], TimerQueues::new())
        .unwrap();
    assert!(left.is_empty(), "the database keeps them");
    assert_eq!(fired(whole), all_timers(&timers));
    for subtask in 0..3 {
        let groups = key_groups_of_subtask(subtask, 3, 128);
        // Into the heap backend: its timers come back to be kept on the heap.
        let mut heap = KeyedState::heap(128, groups.clone());
        let kept = heap
            .restore(&[KeyedSnapshot::Files(files.clone())], TimerQueues::new())
            .unwrap();
        assert_eq!(all_timers(&kept), mine(&groups), "subtask {subtask}");
        assert_eq!(contents(&mut heap, 500).len(), mine(&groups).len() / 2);
        // Into an LSM backend of other key groups.
        let mut rescaled = KeyedState::lsm(
            config(&root.path().join(format!("rescaled-{subtask}")), None),
            128,
            groups.clone(),
        )
        .unwrap();
        let left = rescaled
            .restore(&[KeyedSnapshot::Files(files.clone())], TimerQueues::new())
            .unwrap();
        assert!(left.is_empty());
        assert_eq!(fired(rescaled), mine(&groups), "subtask {subtask}");
        // The heap's timers (a heap checkpoint's, or a savepoint's) into the database.
        let mut from_heap = KeyedState::lsm(
            config(&root.path().join(format!("from-heap-{subtask}")), None),
            128,
            groups.clone(),
        )
        .unwrap();
        let mut given = TimerQueues::new();
        for (d, time, key) in mine(&groups) {
            given.register(d, time, &key);
        }
        let left = from_heap.restore(&[], given).unwrap();
        assert!(left.is_empty());
        assert_eq!(fired(from_heap), mine(&groups), "subtask {subtask}");
    }
}
