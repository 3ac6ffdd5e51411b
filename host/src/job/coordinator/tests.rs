use super::*;

fn settings(interval_ms: u64, pause_ms: u64, max: usize) -> CheckpointSettings {
    CheckpointSettings {
        interval: Duration::from_millis(interval_ms),
        timeout: Duration::from_secs(10),
        min_pause: Duration::from_millis(pause_ms),
        max_concurrent: max,
        retain: 1,
        mode: CheckpointingMode::ExactlyOnce,
        dir: PathBuf::new(),
        phase: None,
    }
}

#[test]
fn next_trigger_respects_interval_pause_concurrency_and_sources() {
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let s = settings(100, 0, 1);
    assert_eq!(
        next_trigger(&s, None, None, 0, true, false, t0),
        Some(t0 + ms(100))
    );
    assert_eq!(
        next_trigger(&s, Some(t0 + ms(100)), None, 0, true, false, t0),
        Some(t0 + ms(200))
    );
    // One in flight is the maximum.
    assert_eq!(next_trigger(&s, Some(t0), None, 1, true, false, t0), None);
    // Sources finished: no more periodic checkpoints.
    assert_eq!(next_trigger(&s, Some(t0), None, 0, false, false, t0), None);
    // Interval zero: periodic checkpoints off.
    assert_eq!(
        next_trigger(&settings(0, 0, 1), None, None, 0, true, false, t0),
        None
    );
    // The minimum pause counts from the last completion.
    let p = settings(100, 500, 1);
    assert_eq!(
        next_trigger(&p, Some(t0), Some(t0 + ms(50)), 0, true, false, t0),
        Some(t0 + ms(550))
    );
    assert_eq!(
        next_trigger(&settings(100, 0, 2), Some(t0), None, 1, true, false, t0),
        Some(t0 + ms(100))
    );
    // Every source's input ended: the final checkpoint is due at once, also with
    // periodic checkpoints off, and again shortly after an aborted one.
    assert_eq!(
        next_trigger(&settings(0, 0, 1), None, None, 0, true, true, t0),
        Some(t0)
    );
    assert_eq!(
        next_trigger(&s, Some(t0), None, 0, true, true, t0),
        Some(t0 + FINAL_RETRY)
    );
    assert_eq!(next_trigger(&s, Some(t0), None, 1, true, true, t0), None);
}

#[test]
fn checkpoints_on_a_phase_fall_on_it_whatever_their_lateness_and_pause() {
    let ms = Duration::from_millis;
    let s = CheckpointSettings {
        phase: Some(ms(30)),
        ..settings(100, 0, 1)
    };
    let now = Instant::now() + ms(1_000);
    // 1,000,055 ms is 25 ms past 1,000,030, the last moment 30 ms past a multiple of 100.
    let t0 = on_phase(&s, now, 1_000_055);
    assert_eq!(t0, now - ms(25));
    assert_eq!(on_phase(&s, now, 1_000_030), now);
    assert_eq!(
        on_phase(&settings(100, 0, 1), now, 1_000_055),
        now,
        "no phase"
    );
    // The first slot after the start, then every interval, a late trigger or not.
    assert_eq!(
        next_trigger(&s, None, None, 0, true, false, t0),
        Some(t0 + ms(100))
    );
    assert_eq!(
        next_trigger(&s, Some(t0 + ms(100)), None, 0, true, false, t0),
        Some(t0 + ms(200))
    );
    assert_eq!(
        next_trigger(&s, Some(t0 + ms(107)), None, 0, true, false, t0),
        Some(t0 + ms(200)),
        "a trigger 7 ms late does not move the next"
    );
    // A pause that reaches past a slot moves the trigger to the slot after it.
    let p = CheckpointSettings {
        min_pause: ms(50),
        ..s.clone()
    };
    assert_eq!(
        next_trigger(
            &p,
            Some(t0 + ms(100)),
            Some(t0 + ms(190)),
            0,
            true,
            false,
            t0
        ),
        Some(t0 + ms(300))
    );
    // The final checkpoint does not wait for the phase.
    assert_eq!(next_trigger(&s, None, None, 0, true, true, t0), Some(t0));
}

fn ack(id: u64, subtask: u32) -> Acknowledgement {
    Acknowledgement {
        id,
        task: TaskId { vertex: 0, subtask },
        source_position: None,
        finished: false,
        folder: PathBuf::new(),
        handles: vec![],
        sync_duration: Duration::ZERO,
        async_duration: Duration::ZERO,
        bytes: 0,
        files: 0,
        full_bytes: 0,
        sink_records: 0,
    }
}

#[test]
fn a_checkpoint_completes_with_the_last_expected_acknowledgement() {
    let tasks = (0..3).map(|subtask| TaskId { vertex: 0, subtask });
    let mut p = PendingCheckpoint::new(1, CheckpointKind::Checkpoint, tasks);
    assert_eq!(p.acknowledge(ack(1, 2)), AckOutcome::Waiting);
    assert_eq!(p.acknowledge(ack(1, 2)), AckOutcome::Unexpected);
    assert_eq!(p.acknowledge(ack(1, 0)), AckOutcome::Waiting);
    assert!(p.is_waiting_for(TaskId {
        vertex: 0,
        subtask: 1
    }));
    assert_eq!(p.acknowledge(ack(1, 7)), AckOutcome::Unexpected);
    assert_eq!(p.acknowledge(ack(1, 1)), AckOutcome::Complete);
}

#[test]
fn a_checkpoint_in_flight_shows_who_acknowledged_and_what_they_wrote() {
    let tasks = (0..3).map(|subtask| TaskId { vertex: 0, subtask });
    let mut p = PendingCheckpoint::new(4, CheckpointKind::Checkpoint, tasks);
    let progress = p.progress();
    assert_eq!(
        (
            progress.id,
            progress.acknowledged,
            progress.tasks,
            progress.bytes
        ),
        (4, 0, 3, 0)
    );
    p.acknowledge(Acknowledgement {
        bytes: 100,
        ..ack(4, 2)
    });
    p.acknowledge(Acknowledgement {
        bytes: 20,
        ..ack(4, 2)
    });
    p.acknowledge(Acknowledgement {
        bytes: 5,
        ..ack(4, 0)
    });
    let progress = p.progress();
    assert_eq!(
        (progress.acknowledged, progress.tasks, progress.bytes),
        (2, 3, 105)
    );
    assert_eq!(progress.kind, SnapshotKind::Checkpoint);
    let savepoint = PendingCheckpoint::new(
        5,
        CheckpointKind::Savepoint {
            stop: true,
            drain: false,
        },
        [],
    );
    assert_eq!(savepoint.progress().kind, SnapshotKind::Savepoint);
}

#[test]
fn a_completed_checkpoint_subsumes_older_checkpoints_but_no_savepoint() {
    let pending: BTreeMap<u64, PendingCheckpoint> = [
        (3, CheckpointKind::Checkpoint),
        (
            4,
            CheckpointKind::Savepoint {
                stop: false,
                drain: false,
            },
        ),
        (5, CheckpointKind::Checkpoint),
        (7, CheckpointKind::Checkpoint),
    ]
    .into_iter()
    .map(|(id, kind)| (id, PendingCheckpoint::new(id, kind, [])))
    .collect();
    assert_eq!(subsumed_by(&pending, 6), [3, 5]);
    assert_eq!(subsumed_by(&pending, 3), Vec::<u64>::new());
}
