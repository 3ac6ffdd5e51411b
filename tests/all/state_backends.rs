//! The `rocksdb` state backend end to end: the same output as the heap backend, exactly
//! once through SIGKILLs, incremental checkpoints, and a job moving between backends and
//! parallelisms through savepoints and checkpoints.

use std::collections::BTreeSet;
use std::path::Path;
use std::thread;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crossbeam_channel::unbounded;
use sluice::job::{JobControl, JobOutcome, RestorePoint};
use sluice_tests::plugins::WINDOW;
use sluice_tests::{
    TestJob, final_counts, final_counts_any_order, killable_windows, run_job, test_dir,
    throttled_wordcount, write_job,
};

use crate::checkpoints::{Delays, run_with_kills, sorted_lines};

/// The killable word count with its keyed state in `backend`.
fn wordcount_in(backend: &str, count_parallelism: u32, records: u64, rate: f64) -> String {
    format!(
        "{}[state]\nbackend = \"{backend}\"\nmemory_mb = 16\n",
        throttled_wordcount(count_parallelism, records, rate)
    )
}

/// The committed output of the job run once without failures, on the heap.
fn reference(records: u64) -> String {
    let dir = test_dir("rocksdb-reference");
    let job = write_job(&dir, &wordcount_in("heap", 1, records, 1e9));
    run_job(&job).unwrap();
    std::fs::read_to_string(dir.join("out/counts.tsv")).unwrap()
}

/// Shared table files named by the checkpoints in `checkpoints`, per checkpoint folder.
fn shared_files_by_checkpoint(checkpoints: &Path) -> Vec<(String, BTreeSet<String>)> {
    let mut folders: Vec<_> = std::fs::read_dir(checkpoints)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("_metadata").exists())
        .collect();
    folders.sort();
    folders
        .iter()
        .map(|f| {
            let metadata: serde_json::Value =
                serde_json::from_slice(&std::fs::read(f.join("_metadata")).unwrap()).unwrap();
            let names = metadata["operators"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|o| o["subtasks"].as_array().unwrap().clone())
                .flat_map(|s| s["shared"].as_array().cloned().unwrap_or_default())
                .map(|pair| pair[0].as_str().unwrap().to_string())
                .collect();
            let folder = f.file_name().unwrap().to_string_lossy().into_owned();
            (folder, names)
        })
        .collect()
}

#[test]
fn rocksdb_state_gives_the_heaps_output_at_parallelism_1_and_3() {
    let reference = reference(5_000);
    for parallelism in [1, 3] {
        let dir = test_dir("rocksdb-wordcount");
        let job = write_job(&dir, &wordcount_in("rocksdb", parallelism, 5_000, 1e9));
        let report = run_job(&job).unwrap();
        assert_eq!(
            report.outcome,
            JobOutcome::Finished,
            "{:?}",
            report.failures
        );
        let output = std::fs::read_to_string(dir.join("out/counts.tsv")).unwrap();
        assert_eq!(
            sorted_lines(&output),
            sorted_lines(&reference),
            "parallelism {parallelism}"
        );
        // The checkpoints keep table files in the shared folder; the tasks' databases
        // are gone with the tasks.
        let checkpoints = dir.join("checkpoints");
        let named = shared_files_by_checkpoint(&checkpoints);
        assert!(named.iter().all(|(_, n)| !n.is_empty()), "{named:?}");
        let present: BTreeSet<String> = std::fs::read_dir(checkpoints.join("shared"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        let all: BTreeSet<String> = named.iter().flat_map(|(_, n)| n).cloned().collect();
        assert_eq!(present, all, "shared files no retained checkpoint names");
        let working = checkpoints.join("_working");
        let left = std::fs::read_dir(&working).map_or(0, |d| d.count());
        assert_eq!(left, 0, "state databases left in {}", working.display());
    }
}

#[test]
fn killed_rocksdb_runs_commit_exactly_the_failure_free_output() {
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    eprintln!("kill test seed {seed}");
    let mut delays = Delays(seed);
    let reference = reference(40_000);
    let dir = test_dir("rocksdb-kill");
    let job = write_job(&dir, &wordcount_in("rocksdb", 2, 40_000, 10_000.0));
    let (output, killed, restored) = run_with_kills(&dir, &job, 4, &mut delays);
    assert!(killed >= 3, "only {killed} runs were killed (seed {seed})");
    assert!(restored >= 2, "only {restored} restores (seed {seed})");
    assert_eq!(
        final_counts_any_order(&output).unwrap(),
        final_counts(&reference).unwrap()
    );
    assert!(
        sorted_lines(&output) == sorted_lines(&reference),
        "output differs from the failure-free run (seed {seed})"
    );
}

/// Runs `job` (from `from`) until a savepoint taken after `after`; returns the savepoint.
fn stop_with_savepoint(job: &Path, from: RestorePoint, after: Duration) -> std::path::PathBuf {
    let run = TestJob::load(job).unwrap();
    let control = run.control.clone();
    let stopper = thread::spawn(move || {
        thread::sleep(after);
        let (reply, answer) = unbounded();
        control
            .send(JobControl::StopWithSavepoint {
                drain: false,
                reply,
            })
            .unwrap();
        answer.recv().unwrap()
    });
    let report = run.run(from).unwrap();
    let savepoint = stopper.join().unwrap().unwrap();
    assert_eq!(
        report.outcome,
        JobOutcome::Stopped {
            savepoint: savepoint.clone()
        },
        "{:?}",
        report.failures
    );
    savepoint
}

#[test]
fn a_job_moves_between_backends_and_parallelisms_through_savepoints_and_checkpoints() {
    let records = 20_000;
    let reference = reference(records);
    let dir = test_dir("rocksdb-moves");
    let job = write_job(&dir, &wordcount_in("heap", 2, records, 8_000.0));
    let lines = || {
        std::fs::read_to_string(dir.join("out/counts.tsv"))
            .unwrap()
            .lines()
            .count()
    };
    // Heap at parallelism 2 → savepoint → rocksdb at 3.
    let savepoint = stop_with_savepoint(&job, RestorePoint::Fresh, Duration::from_millis(600));
    let first = lines();
    std::fs::write(&job, wordcount_in("rocksdb", 3, records, 8_000.0)).unwrap();
    // rocksdb at 3 → savepoint (entries, self-contained) → heap at 1.
    let savepoint = stop_with_savepoint(
        &job,
        RestorePoint::Path(savepoint),
        Duration::from_millis(600),
    );
    let second = lines();
    assert!(first < second, "{first} then {second} lines");
    std::fs::write(&job, wordcount_in("heap", 1, records, 8_000.0)).unwrap();
    let savepoint = stop_with_savepoint(
        &job,
        RestorePoint::Path(savepoint),
        Duration::from_millis(600),
    );
    // heap → rocksdb at 2, stopped after its checkpoints …
    std::fs::write(&job, wordcount_in("rocksdb", 2, records, 8_000.0)).unwrap();
    let run = TestJob::load(&job).unwrap();
    let control = run.control.clone();
    let checkpoints = dir.join("checkpoints");
    let earlier: BTreeSet<String> = shared_files_by_checkpoint(&checkpoints)
        .into_iter()
        .map(|(folder, _)| folder)
        .collect();
    let canceller = thread::spawn(move || {
        // Cancelled once a rocksdb checkpoint of this run is complete.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !shared_files_by_checkpoint(&checkpoints)
            .iter()
            .any(|(folder, n)| !earlier.contains(folder) && !n.is_empty())
        {
            assert!(
                std::time::Instant::now() < deadline,
                "no rocksdb checkpoint"
            );
            thread::sleep(Duration::from_millis(10));
        }
        control.send(JobControl::Cancel).unwrap();
    });
    let report = run.run(RestorePoint::Path(savepoint)).unwrap();
    canceller.join().unwrap();
    assert_eq!(
        report.outcome,
        JobOutcome::Cancelled,
        "{:?}",
        report.failures
    );
    // … and its latest checkpoint (files, not entries) restored at parallelism 3, on the
    // heap, to the end.
    std::fs::write(&job, wordcount_in("heap", 3, records, 1e9)).unwrap();
    let last = TestJob::load(&job).unwrap();
    let report = last.run(RestorePoint::Latest).unwrap();
    assert_eq!(
        report.outcome,
        JobOutcome::Finished,
        "{:?}",
        report.failures
    );
    let output = std::fs::read_to_string(dir.join("out/counts.tsv")).unwrap();
    assert_eq!(sorted_lines(&output), sorted_lines(&reference));
}

#[test]
fn a_rocksdb_job_runs_in_its_tenants_worker_under_its_limits() {
    use crate::server::{ServerProcess, host_config, state, wait_for};
    use sluice::server::model::JobState;
    let dir = test_dir("rocksdb-server");
    // The tenant's default backend: the job file does not say.
    let server = ServerProcess::start(&host_config(&dir, "state_backend = \"rocksdb\""));
    let a = server.client(Some("token-a"));
    let text = throttled_wordcount(2, 3_000, 3_000.0);
    let id = a.submit(&write_job(&dir, &text)).unwrap().id;
    // Its count operator's state, as of its last checkpoint: the database's memory
    // budget (the default 64 MiB) and its files.
    wait_for("a checkpoint", Duration::from_secs(30), || {
        let detail = a.status(&id).unwrap();
        let counts: Vec<_> = detail
            .tasks
            .iter()
            .flat_map(|t| &t.operators)
            .filter(|o| o.operator == "count")
            .collect();
        detail.checkpoints.completed > 0
            && counts.len() == 2
            && counts
                .iter()
                .all(|o| o.state_memory_bytes == 64 << 20 && o.state_disk_bytes > 0)
    });
    // A stop takes a savepoint (entries) of the RocksDB state; the job resumes from it.
    let stopped = a.stop(&id, false).unwrap();
    assert_eq!(stopped.state, JobState::Stopped, "{stopped:?}");
    let savepoint = a.status(&id).unwrap().savepoint.unwrap();
    a.start(&id, Some(&savepoint)).unwrap();
    wait_for("the job to finish", Duration::from_secs(60), || {
        state(&a, &id) == JobState::Finished
    });
    let detail = a.status(&id).unwrap();
    let last = &detail.checkpoints.last[0];
    assert!(
        last.full_bytes >= last.bytes && last.full_bytes > 0,
        "{last:?}"
    );
    let output = String::from_utf8(a.output(&id, None).unwrap()).unwrap();
    let records = 3_000;
    let reference = {
        let dir = test_dir("rocksdb-server-reference");
        let job = write_job(&dir, &throttled_wordcount(1, records, 1e9));
        run_job(&job).unwrap();
        std::fs::read_to_string(dir.join("out/counts.tsv")).unwrap()
    };
    assert_eq!(sorted_lines(&output), sorted_lines(&reference));
}

#[test]
fn a_rocksdb_job_without_checkpoints_keeps_its_databases_in_its_folder_on_a_server() {
    use crate::server::{ServerProcess, error_of, host_config, state, wait_for};
    use sluice::server::model::JobState;
    let dir = test_dir("rocksdb-server-no-checkpoints");
    let server = ServerProcess::start(&host_config(&dir, "state_backend = \"rocksdb\""));
    let a = server.client(Some("token-a"));
    let text = throttled_wordcount(1, 6_000, 3_000.0);
    let text = text.replace(
        "[checkpoint]\ninterval_ms = 100\ndir = \"checkpoints\"\n",
        "",
    );
    assert!(!text.contains("[checkpoint]"), "{text}");
    // Where they go is the server's to choose: in the job's folder, so that they count
    // against the tenant's disk quota.
    let elsewhere = format!("{text}[state]\ndir = \"/tmp\"\n");
    let e = error_of(a.submit(&write_job(&dir, &elsewhere)));
    assert!(e.contains("`dir` is the server's to choose"), "{e}");
    let id = a.submit(&write_job(&dir, &text)).unwrap().id;
    let folder = dir.join("registry/jobs").join(&id).join("state");
    let databases = || {
        std::fs::read_dir(&folder)
            .map(|d| d.flatten().count())
            .unwrap_or(0)
    };
    wait_for(
        "the count operator's database in the job's folder",
        Duration::from_secs(30),
        || databases() == 1 || state(&a, &id) != JobState::Running,
    );
    assert_eq!(databases(), 1, "{:?}", a.status(&id).unwrap().job);
    wait_for("the job to finish", Duration::from_secs(60), || {
        state(&a, &id) == JobState::Finished
    });
    // Deleted with the run.
    assert_eq!(databases(), 0);
}

/// Windows over more keys than the `rocksdb` backend keeps timers for in memory (its
/// least budget, 8 MiB, keeps about 2,000), so most are in its database: sliding windows
/// with allowed lateness (several timers per key, late records firing windows again) and
/// session windows (timers deleted as sessions merge) give the model's results at
/// parallelism 1 and 3.
#[test]
fn windows_with_their_timers_in_rocksdb_match_the_model() {
    use crate::event_time::{check_job, window_config, window_job_with};
    use sluice_tests::windows::{Aggregate, Kind, mixed_events};
    let cases = [
        (
            Kind::Sliding {
                size: 6_000,
                slide: 2_000,
            },
            Aggregate::Count,
            3_000,
            mixed_events(30_000, 3_000, 5, 1000, 23, 5),
        ),
        (
            Kind::Session { gap: 3_000 },
            Aggregate::Min,
            0,
            mixed_events(40_000, 10_000, 1, 1000, 31, 13),
        ),
    ];
    for (kind, aggregate, lateness, events) in cases {
        for parallelism in [1, 3] {
            let config = window_config(kind, aggregate, lateness);
            let job = window_job_with(&config, parallelism, 16, WINDOW, false)
                + "[state]\nbackend = \"rocksdb\"\nmemory_mb = 8\n";
            let want = check_job(
                "rocksdb-windows",
                &events,
                &job,
                (kind, aggregate, lateness),
            );
            assert!(!want.lines.is_empty());
        }
    }
}

/// The killable window job (a timer per key and window, more than the `rocksdb` backend
/// keeps in memory) over 30,000 events with its state in `backend`.
fn windows_in(backend: &str, parallelism: u32, rate: f64) -> String {
    killable_windows(parallelism, 30_000, Some(rate), backend)
}

/// Timers kept in RocksDB survive SIGKILLs (restored from the database's checkpointed
/// files) and move with the job between backends and parallelisms through savepoints:
/// the windows fired are exactly the failure-free run's on the heap.
#[test]
fn windows_keep_their_timers_through_kills_and_moves_between_backends() {
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    eprintln!("rocksdb windows kill test seed {seed}");
    let reference_dir = test_dir("rocksdb-windows-reference");
    run_job(&write_job(&reference_dir, &windows_in("heap", 1, 1e9))).unwrap();
    let reference = std::fs::read_to_string(reference_dir.join("out/counts.tsv")).unwrap();
    assert!(reference.lines().count() > 1000, "{reference}");

    let dir = test_dir("rocksdb-windows-kill");
    let job = write_job(&dir, &windows_in("rocksdb", 2, 10_000.0));
    let (output, killed, restored) = run_with_kills(&dir, &job, 4, &mut Delays(seed));
    assert!(killed >= 3, "only {killed} runs were killed (seed {seed})");
    assert!(restored >= 2, "only {restored} restores (seed {seed})");
    assert!(
        sorted_lines(&output) == sorted_lines(&reference),
        "windows differ from the failure-free run (seed {seed})"
    );

    // Heap at 2 → savepoint → rocksdb at 3 → savepoint → heap at 1 → savepoint →
    // rocksdb at 2, to the end.
    let dir = test_dir("rocksdb-windows-moves");
    let job = write_job(&dir, &windows_in("heap", 2, 8_000.0));
    let mut from = RestorePoint::Fresh;
    for (backend, parallelism) in [("rocksdb", 3), ("heap", 1)] {
        let savepoint = stop_with_savepoint(&job, from, Duration::from_millis(700));
        std::fs::write(&job, windows_in(backend, parallelism, 8_000.0)).unwrap();
        from = RestorePoint::Path(savepoint);
    }
    let savepoint = stop_with_savepoint(&job, from, Duration::from_millis(700));
    std::fs::write(&job, windows_in("rocksdb", 2, 1e9)).unwrap();
    let report = TestJob::load(&job)
        .unwrap()
        .run(RestorePoint::Path(savepoint))
        .unwrap();
    assert_eq!(
        report.outcome,
        JobOutcome::Finished,
        "{:?}",
        report.failures
    );
    let output = std::fs::read_to_string(dir.join("out/counts.tsv")).unwrap();
    assert!(
        sorted_lines(&output) == sorted_lines(&reference),
        "windows differ after moving between backends"
    );
}
