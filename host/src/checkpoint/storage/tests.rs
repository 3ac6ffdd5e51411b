use super::*;
use crate::checkpoint::assign_operator_state;
use crate::state::key_groups::key_groups_of_subtask;
use crate::state::lsm::LsmConfig;
use crate::state::{BackendKind, KeyedState, StateDescriptor, StateKind};
use crate::timers::TimerQueues;

fn storage(name: &str) -> CheckpointStorage {
    let dir = std::env::temp_dir().join(format!("sluice-storage-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    CheckpointStorage::new(dir).unwrap()
}

/// Writes a complete checkpoint `id` of a keyed operator `count` with parallelism
/// `parallelism`, where key `k<i>` has value `id`.
fn write_checkpoint(
    s: &CheckpointStorage,
    id: u64,
    kind: SnapshotKind,
    parallelism: u32,
) -> PathBuf {
    write_checkpoint_of(s, id, kind, parallelism, BackendKind::Heap)
}

/// [`write_checkpoint`] with keyed state in `backend`.
fn write_checkpoint_of(
    s: &CheckpointStorage,
    id: u64,
    kind: SnapshotKind,
    parallelism: u32,
    backend: BackendKind,
) -> PathBuf {
    let folder = s.folder(id, kind);
    let mut subtasks = Vec::new();
    for subtask in 0..parallelism {
        let groups = key_groups_of_subtask(subtask, parallelism, 128);
        let mut keyed = match backend {
            BackendKind::Heap => KeyedState::heap(128, groups),
            BackendKind::Rocksdb => {
                let config = LsmConfig {
                    dir: s.working().join(format!("{id}-{subtask}")),
                    memory_bytes: 8 << 20,
                    shared: Some(s.shared()),
                };
                KeyedState::lsm(config, 128, groups).unwrap()
            }
        };
        let state = keyed
            .declare(StateDescriptor {
                name: "count".into(),
                kind: StateKind::Value,
                ttl_ms: None,
            })
            .unwrap();
        for i in 0..100 {
            let _ = keyed.put(state, format!("k{i}").as_bytes(), b"", &id.to_le_bytes(), 0);
        }
        let snapshot = OperatorSnapshot {
            operator: "count".into(),
            state: Vec::new(),
            keyed: Some(keyed.snapshot(id, 0).unwrap()),
            timers: TimerQueues::new(),
            watermark: i64::MIN,
        };
        subtasks.push(
            s.write_operator_state(&folder, kind, &snapshot, subtask)
                .unwrap()
                .0,
        );
    }
    let metadata = CheckpointMetadata {
        format: FORMAT,
        id,
        kind,
        job: "j".into(),
        triggered_at: 0,
        completed_at: 0,
        max_parallelism: 128,
        sources: vec![SourceMeta {
            name: "source".into(),
            parallelism: 1,
            positions: vec![SourcePosition {
                subtask: 0,
                position: id.to_le_bytes().to_vec(),
            }],
        }],
        operators: vec![OperatorMeta {
            name: "count".into(),
            parallelism,
            subtasks,
        }],
        finished: Vec::new(),
        records_committed: Some(id),
    };
    s.commit(&folder, &metadata).unwrap();
    folder
}

fn value_of(c: &LoadedCheckpoint, subtask: u32, parallelism: u32, key: &str) -> Option<u64> {
    let restore = assign_operator_state(c, "count", subtask, parallelism, true, false).unwrap()?;
    let mut backend = KeyedState::heap(128, key_groups_of_subtask(subtask, parallelism, 128));
    backend.restore(&restore.keyed, TimerQueues::new()).unwrap();
    let v = backend.get(0, key.as_bytes(), b"", 0).ok()??;
    Some(u64::from_le_bytes((*v).try_into().unwrap()))
}

#[test]
fn the_newest_intact_checkpoint_is_restored_and_broken_ones_are_skipped() {
    let s = storage("latest");
    write_checkpoint(&s, 1, SnapshotKind::Checkpoint, 1);
    let two = write_checkpoint(&s, 2, SnapshotKind::Checkpoint, 1);
    let three = write_checkpoint(&s, 3, SnapshotKind::Checkpoint, 1);
    let four = write_checkpoint(&s, 4, SnapshotKind::Checkpoint, 1);
    assert_eq!(s.find_latest().unwrap().unwrap().metadata.id, 4);
    // 4: no metadata (the process died before the checkpoint completed).
    fs::remove_file(four.join(METADATA)).unwrap();
    // 3: a state file was truncated.
    let f = fs::OpenOptions::new()
        .write(true)
        .open(three.join("count-0.state"))
        .unwrap();
    f.set_len(10).unwrap();
    // 2 intact.
    let latest = s.find_latest().unwrap().unwrap();
    assert_eq!(latest.metadata.id, 2);
    assert_eq!(latest.path, two);
    // A flipped byte is found by the checksum.
    let mut bytes = fs::read(two.join("count-0.state")).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    fs::write(two.join("count-0.state"), bytes).unwrap();
    assert_eq!(s.find_latest().unwrap().unwrap().metadata.id, 1);
    let err = load(&two).unwrap_err();
    assert!(format!("{err:#}").contains("is corrupt"), "{err:#}");
    // Garbage metadata.
    fs::write(three.join(METADATA), "{not json").unwrap();
    assert!(format!("{:#}", load(&three).unwrap_err()).contains("is corrupt"));
    assert_eq!(s.next_id().unwrap(), 5);
}

#[test]
fn latest_stays_on_the_current_runs_timeline() {
    let s = storage("lineage");
    let savepoint = write_checkpoint(&s, 1, SnapshotKind::Savepoint, 1);
    write_checkpoint(&s, 2, SnapshotKind::Checkpoint, 1);
    write_checkpoint(&s, 3, SnapshotKind::Checkpoint, 1);
    // Written before lineages: all one run.
    assert_eq!(s.find_latest().unwrap().unwrap().metadata.id, 3);
    // A run that goes back to the savepoint: until it has a checkpoint of its own,
    // its latest is the savepoint, not the abandoned timeline's checkpoint 3.
    let lineage = s.begin_run(Some(&savepoint)).unwrap();
    assert_eq!(lineage.first_id, 4);
    assert_eq!(s.find_latest().unwrap().unwrap().path, savepoint);
    write_checkpoint(&s, 4, SnapshotKind::Checkpoint, 1);
    assert_eq!(s.find_latest().unwrap().unwrap().metadata.id, 4);
    // A fresh run has nothing to restore until it checkpoints.
    s.begin_run(None).unwrap();
    assert!(s.find_latest().unwrap().is_none());
}

#[test]
fn state_files_of_distinct_ids_are_distinct() {
    let names = ["a.b", "a_b", "a-b", "ab", "a b", "a/b", "á"];
    let files: BTreeSet<String> = names.iter().map(|n| state_file_name(n, 0)).collect();
    assert_eq!(files.len(), names.len(), "{files:?}");
    assert_eq!(state_file_name("a.b", 3), "a_2eb-3.state");
}

#[test]
fn retention_keeps_the_newest_complete_checkpoints_and_all_savepoints() {
    let s = storage("retain");
    for id in 1..=5 {
        write_checkpoint(&s, id, SnapshotKind::Checkpoint, 1);
    }
    write_checkpoint(&s, 2, SnapshotKind::Savepoint, 1);
    let incomplete_old = s
        .folder(3, SnapshotKind::Checkpoint)
        .with_file_name("chk-0000000000");
    fs::create_dir_all(&incomplete_old).unwrap();
    let incomplete_new = s.folder(6, SnapshotKind::Checkpoint);
    fs::create_dir_all(&incomplete_new).unwrap();
    // An aborted savepoint's folder, left by a late write: orphaned.
    fs::create_dir_all(s.folder(3, SnapshotKind::Savepoint)).unwrap();
    s.retain(2, None, &[]).unwrap();
    let left: Vec<(u64, SnapshotKind)> = s.folders().unwrap().iter().map(|f| (f.0, f.1)).collect();
    assert_eq!(
        left,
        vec![
            (2, SnapshotKind::Savepoint),
            (4, SnapshotKind::Checkpoint),
            (5, SnapshotKind::Checkpoint),
            // Newer than the newest complete one: may still be in flight.
            (6, SnapshotKind::Checkpoint),
        ]
    );
    // The run's starting point is kept however it is named: here through `..`.
    let start = s.folder(4, SnapshotKind::Checkpoint);
    let named_otherwise = s
        .dir()
        .join("..")
        .join(s.dir().file_name().unwrap())
        .join(start.file_name().unwrap());
    write_checkpoint(&s, 7, SnapshotKind::Checkpoint, 1);
    write_checkpoint(&s, 8, SnapshotKind::Checkpoint, 1);
    s.retain(1, Some(&named_otherwise), &[]).unwrap();
    assert!(start.exists(), "the protected start point was deleted");
    assert!(!s.folder(5, SnapshotKind::Checkpoint).exists());
}

/// A savepoint is not subsumed: a newer checkpoint may complete while it is still being
/// written, and retention must not take its folder (and the files already in it) away.
#[test]
fn retention_leaves_a_savepoint_in_flight_older_than_the_newest_checkpoint() {
    let s = storage("retain-in-flight");
    let savepoint = s.folder(3, SnapshotKind::Savepoint);
    fs::create_dir_all(&savepoint).unwrap();
    fs::write(savepoint.join("count-0.state"), b"written").unwrap();
    for id in 4..=6 {
        write_checkpoint(&s, id, SnapshotKind::Checkpoint, 1);
    }
    s.retain(1, None, &[3, 7]).unwrap();
    assert!(savepoint.join("count-0.state").exists());
    assert!(!s.folder(4, SnapshotKind::Checkpoint).exists());
    // Once it is no longer in flight (aborted and left behind), it goes.
    s.retain(1, None, &[]).unwrap();
    assert!(!savepoint.exists());
}

/// `_metadata` is never written over a state file that went missing or short.
#[test]
fn a_checkpoint_whose_state_file_went_missing_is_not_committed() {
    let s = storage("commit-missing");
    let folder = write_checkpoint(&s, 1, SnapshotKind::Savepoint, 2);
    let metadata: CheckpointMetadata =
        serde_json::from_slice(&fs::read(folder.join(METADATA)).unwrap()).unwrap();
    fs::remove_file(folder.join(METADATA)).unwrap();
    let file = folder.join(&metadata.operators[0].subtasks[1].file);
    fs::write(&file, b"short").unwrap();
    let err = format!("{:#}", s.commit(&folder, &metadata).unwrap_err());
    assert!(err.contains("holds 5 bytes"), "{err}");
    fs::remove_file(&file).unwrap();
    let err = format!("{:#}", s.commit(&folder, &metadata).unwrap_err());
    assert!(err.contains("count-1.state is missing"), "{err}");
    assert!(!folder.join(METADATA).exists());
}

#[test]
fn keyed_state_is_redistributed_when_the_parallelism_changes() {
    let s = storage("rescale");
    let folder = write_checkpoint(&s, 7, SnapshotKind::Checkpoint, 2);
    let c = load(&folder).unwrap();
    for new_parallelism in [1, 3, 5] {
        let mut found = 0;
        for i in 0..100 {
            let key = format!("k{i}");
            let owners: Vec<u32> = (0..new_parallelism)
                .filter(|&st| value_of(&c, st, new_parallelism, &key) == Some(7))
                .collect();
            assert!(owners.len() <= 1);
            found += owners.len();
        }
        assert_eq!(found, 100, "parallelism {new_parallelism}");
    }
    // A source cannot be rescaled.
    assert!(c.source_position("source", 0, 2).is_err());
    assert_eq!(
        c.source_position("source", 0, 1).unwrap(),
        Some(7u64.to_le_bytes().to_vec())
    );
    // An operator the checkpoint does not know starts empty.
    assert!(
        assign_operator_state(&c, "other", 0, 1, true, false)
            .unwrap()
            .is_none()
    );
}

#[test]
fn shared_state_files_live_while_a_retained_checkpoint_names_them() {
    let s = storage("shared");
    let shared_dir = s.shared().path().to_path_buf();
    let present = || -> BTreeSet<String> {
        fs::read_dir(&shared_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    };
    for id in 1..=4 {
        write_checkpoint_of(&s, id, SnapshotKind::Checkpoint, 2, BackendKind::Rocksdb);
        s.retain(2, None, &[]).unwrap();
    }
    let named = |ids: &[u64]| -> BTreeSet<String> {
        ids.iter()
            .flat_map(|id| shared_files_of(&s.folder(*id, SnapshotKind::Checkpoint)))
            .collect()
    };
    assert!(!named(&[3, 4]).is_empty());
    // The deleted checkpoints' files went with them; the retained ones' stayed.
    assert_eq!(present(), named(&[3, 4]));
    let latest = s.find_latest().unwrap().unwrap();
    assert_eq!(latest.metadata.id, 4);
    for (subtask, parallelism) in [(0, 1), (1, 2), (2, 3)] {
        assert_eq!(value_of(&latest, subtask, parallelism, "k7"), Some(4));
    }
    // A checkpoint whose shared file is gone is not restored.
    let gone = named(&[4]).into_iter().next().unwrap();
    fs::remove_file(shared_dir.join(&gone)).unwrap();
    let err = load(&s.folder(4, SnapshotKind::Checkpoint)).unwrap_err();
    assert!(format!("{err:#}").contains(&gone), "{err:#}");
    assert_eq!(s.find_latest().unwrap().unwrap().metadata.id, 3);
    // A savepoint of the same state is self-contained: it names no shared file.
    let savepoint = write_checkpoint_of(&s, 5, SnapshotKind::Savepoint, 2, BackendKind::Rocksdb);
    assert!(shared_files_of(&savepoint).is_empty());
    assert_eq!(value_of(&load(&savepoint).unwrap(), 0, 1, "k7"), Some(5));
    // A file no checkpoint names (an aborted checkpoint's) goes when a run starts.
    fs::write(shared_dir.join("orphan.sst"), b"x").unwrap();
    s.collect_shared_files().unwrap();
    let mut kept = named(&[3, 4]);
    kept.remove(&gone);
    assert_eq!(present(), kept);
}
