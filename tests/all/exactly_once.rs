//! Exactly-once with no exceptions: where a run starts (fresh, resumed, rewound), which
//! checkpoints a restart may restore, stable ids, the final checkpoint, savepoints
//! without stopping. Each test is named after the promise it keeps.

use std::fs;
use std::path::Path;
use std::process::Output;
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::unbounded;
use sluice::job::{JobControl, JobOutcome, RestorePoint, RunOptions};
use sluice_tests::plugins::{COUNT, TEST_MISBEHAVE, TOKENIZE};
use sluice_tests::{
    TestJob, expected_word_counts, final_counts, final_counts_any_order, sample_text, test_dir,
    throttled_wordcount, write_job,
};

use crate::checkpoints::spawn_sluice;
use crate::cli::sluice;

/// A word count from `source` with a test-misbehave operator between tokenize and
/// count, checkpointing every `interval_ms`.
fn wordcount_over_file(source: &str, misbehave: &str, interval_ms: u64) -> String {
    let checkpoint = format!("[checkpoint]\ninterval_ms = {interval_ms}\ndir = \"checkpoints\"");
    wordcount(source, misbehave, &checkpoint)
}

fn wordcount(source: &str, misbehave: &str, checkpoint: &str) -> String {
    format!(
        r#"
name = "lines"
{source}
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
[[operator]]
name = "suspect"
plugin = "{TEST_MISBEHAVE}"
config = {{ {misbehave} }}
[[operator]]
name = "count"
plugin = "{COUNT}"
parallelism = 2
key_by = "key"
[sink]
type = "file"
path = "out/counts.tsv"
format = "key-value"
{checkpoint}
[restart]
strategy = "fixed-delay"
attempts = 3
delay_ms = 10
[runtime]
batch_size = 50
"#
    )
}

const FILE_SOURCE: &str = "[source]\ntype = \"file\"\npath = \"input.txt\"";
/// About two seconds of generated lines.
const SLOW_SOURCE: &str = "[source]\ntype = \"generator\"\nrecords = 3000\nwords_per_record = 4\n\
                           vocabulary = 80\nrate = 1500.0";

/// The final counts of `job_text` run without failures, in a folder of its own.
fn reference_counts(name: &str, job_text: &str) -> std::collections::BTreeMap<String, u64> {
    let dir = test_dir(name);
    let job = write_job(&dir, job_text);
    TestJob::load(&job)
        .unwrap()
        .run(RestorePoint::Fresh)
        .unwrap();
    final_counts_any_order(&fs::read_to_string(dir.join("out/counts.tsv")).unwrap()).unwrap()
}

/// Runs `test_job` and stops it with a savepoint after `after`; returns the savepoint.
fn stop_after(test_job: &TestJob, after: Duration) -> std::path::PathBuf {
    let (reply, answer) = unbounded();
    let control = test_job.control.clone();
    let stopper = thread::spawn(move || {
        thread::sleep(after);
        control
            .send(JobControl::StopWithSavepoint {
                drain: false,
                reply,
            })
            .unwrap();
        answer.recv().unwrap()
    });
    let report = test_job.run(RestorePoint::Fresh).unwrap();
    let savepoint = stopper.join().unwrap().expect("the savepoint succeeds");
    assert!(
        matches!(report.outcome, JobOutcome::Stopped { .. }),
        "{:?}",
        report.outcome
    );
    savepoint
}

fn options(restore: RestorePoint) -> RunOptions {
    RunOptions::from(restore)
}

fn run_cli(job: &Path, args: &[&str]) -> Output {
    let mut all = vec!["run", "--quiet", job.to_str().unwrap()];
    all.extend_from_slice(args);
    sluice(&all)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn a_rerun_refuses_to_take_over_committed_output_and_fresh_moves_it_aside() {
    let dir = test_dir("rerun");
    fs::write(dir.join("input.txt"), sample_text(1, 300)).unwrap();
    let job = write_job(
        &dir,
        &wordcount_over_file(FILE_SOURCE, "behavior = \"none\"", 20),
    );
    let first = run_cli(&job, &[]);
    assert!(first.status.success(), "{}", stderr(&first));
    let committed = fs::read(dir.join("out/counts.tsv")).unwrap();

    let again = run_cli(&job, &[]);
    // Refused.
    assert_eq!(again.status.code(), Some(75));
    let err = stderr(&again);
    assert!(err.contains("--from-checkpoint latest"), "{err}");
    assert!(err.contains("--fresh"), "{err}");
    assert!(err.contains("counts.tsv"), "{err}");
    assert_eq!(fs::read(dir.join("out/counts.tsv")).unwrap(), committed);

    let fresh = run_cli(&job, &["--fresh"]);
    assert!(fresh.status.success(), "{}", stderr(&fresh));
    assert_eq!(fs::read(dir.join("out/counts.tsv.1")).unwrap(), committed);
    assert!(dir.join("checkpoints.1").is_dir());
    // The same counts again (two count subtasks may interleave their lines otherwise).
    let again = fs::read_to_string(dir.join("out/counts.tsv")).unwrap();
    assert_eq!(
        final_counts_any_order(&again).unwrap(),
        final_counts_any_order(&String::from_utf8(committed).unwrap()).unwrap()
    );
}

#[test]
fn a_job_that_fails_in_open_leaves_an_existing_file_at_its_sink_path_alone() {
    let dir = test_dir("open-fails");
    fs::write(dir.join("input.txt"), sample_text(2, 50)).unwrap();
    fs::create_dir_all(dir.join("out")).unwrap();
    fs::write(dir.join("out/counts.tsv"), "someone's data\n").unwrap();
    let job = write_job(
        &dir,
        &wordcount_over_file(FILE_SOURCE, "behavior = \"error-in-open\"", 20),
    );
    for _ in 0..3 {
        let run = run_cli(&job, &[]);
        // Refused: the output was there before.
        assert_eq!(run.status.code(), Some(75), "{}", stderr(&run));
        assert_eq!(
            fs::read_to_string(dir.join("out/counts.tsv")).unwrap(),
            "someone's data\n"
        );
    }
    // Without checkpoints too.
    fs::write(
        &job,
        wordcount(FILE_SOURCE, "behavior = \"error-in-open\"", ""),
    )
    .unwrap();
    let run = run_cli(&job, &[]);
    assert_eq!(run.status.code(), Some(75), "{}", stderr(&run));
    assert_eq!(
        fs::read_to_string(dir.join("out/counts.tsv")).unwrap(),
        "someone's data\n"
    );
}

/// Runs the throttled word count in a `sluice run` process, takes a savepoint with
/// `sluice savepoint` while it runs, and lets it finish. Returns the savepoint and the
/// finished output.
fn run_with_savepoint_midway(dir: &Path, job: &Path) -> (String, String) {
    let child = spawn_sluice(job, &[]);
    let started = Instant::now();
    let savepoint = loop {
        let out = sluice(&["savepoint", job.to_str().unwrap()]);
        if out.status.success() {
            break String::from_utf8(out.stdout).unwrap().trim().to_string();
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no savepoint: {}",
            stderr(&out)
        );
        thread::sleep(Duration::from_millis(100));
    };
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        Path::new(&savepoint).join("_metadata").exists(),
        "{savepoint}"
    );
    let output = fs::read_to_string(dir.join("out/counts.tsv")).unwrap();
    (savepoint, output)
}

#[test]
fn restoring_an_older_savepoint_is_refused_unless_rewinding_which_keeps_the_output() {
    let dir = test_dir("rewind");
    let job = write_job(&dir, &throttled_wordcount(2, 6_000, 6_000.0));
    let (savepoint, finished) = run_with_savepoint_midway(&dir, &job);
    let totals: u64 = final_counts_any_order(&finished).unwrap().values().sum();
    assert_eq!(totals, 6_000 * 6);

    let refused = run_cli(&job, &["--from-checkpoint", &savepoint]);
    assert_eq!(refused.status.code(), Some(75), "{}", stderr(&refused));
    assert!(
        stderr(&refused).contains("--allow-rewind"),
        "{}",
        stderr(&refused)
    );
    assert_eq!(
        fs::read_to_string(dir.join("out/counts.tsv")).unwrap(),
        finished
    );

    let rewound = run_cli(&job, &["--from-checkpoint", &savepoint, "--allow-rewind"]);
    assert!(rewound.status.success(), "{}", stderr(&rewound));
    assert_eq!(
        fs::read_to_string(dir.join("out/counts.tsv.1")).unwrap(),
        finished
    );
    // The rewound timeline ends where the first one did: same lines, maybe interleaved
    // otherwise across the two count subtasks.
    let again = fs::read_to_string(dir.join("out/counts.tsv")).unwrap();
    assert_eq!(
        crate::checkpoints::sorted_lines(&again),
        crate::checkpoints::sorted_lines(&finished)
    );
}

#[test]
fn a_restart_restores_only_the_checkpoints_of_its_own_run() {
    let dir = test_dir("lineage");
    let healthy = wordcount_over_file(SLOW_SOURCE, "behavior = \"none\"", 20);
    let expected = reference_counts("lineage-reference", &healthy);
    let job = write_job(&dir, &healthy);
    // Run 1, stopped with a savepoint early, then resumed to the end (run 2).
    let savepoint = stop_after(&TestJob::load(&job).unwrap(), Duration::from_millis(400));
    TestJob::load(&job)
        .unwrap()
        .run(RestorePoint::Path(savepoint.clone()))
        .unwrap();
    // Run 3 goes back to the savepoint and fails once before its first checkpoint: the
    // restart must restore the savepoint, not run 2's newer checkpoints.
    fs::write(
        &job,
        wordcount_over_file(
            SLOW_SOURCE,
            "behavior = \"error-in-process\", after = 1, attempts = \"0\"",
            20,
        ),
    )
    .unwrap();
    let report = TestJob::load(&job)
        .unwrap()
        .run_with(RunOptions {
            allow_rewind: true,
            ..options(RestorePoint::Path(savepoint))
        })
        .unwrap();
    assert_eq!(report.outcome, JobOutcome::Finished);
    assert_eq!(report.restarts, 1, "{:?}", report.failures);
    let output = fs::read_to_string(dir.join("out/counts.tsv")).unwrap();
    assert_eq!(final_counts_any_order(&output).unwrap(), expected);
}

#[test]
fn renamed_sources_are_not_silently_restarted_and_ids_keep_state_across_renames() {
    let dir = test_dir("ids");
    let named = |name: &str, id: &str| {
        wordcount_over_file(
            &format!("{SLOW_SOURCE}\nname = \"{name}\"{id}"),
            "behavior = \"none\"",
            20,
        )
    };
    let expected = reference_counts("ids-reference", &named("clicks", ""));
    let job = write_job(&dir, &named("clicks", ""));
    let savepoint = stop_after(&TestJob::load(&job).unwrap(), Duration::from_millis(400));

    // Renamed without an id: its position would be lost while the counts are restored.
    fs::write(&job, named("clicks-v2", "")).unwrap();
    let err = format!(
        "{:#}",
        TestJob::load(&job)
            .unwrap()
            .run(RestorePoint::Path(savepoint.clone()))
            .unwrap_err()
    );
    assert!(err.contains("source 'clicks'"), "{err}");
    assert!(err.contains("--allow-non-restored-state"), "{err}");
    assert!(err.contains("id = "), "{err}");

    // Renamed with the old id: restored exactly.
    fs::write(&job, named("clicks-v2", "\nid = \"clicks\"")).unwrap();
    TestJob::load(&job)
        .unwrap()
        .run(RestorePoint::Path(savepoint))
        .unwrap();
    let output = fs::read_to_string(dir.join("out/counts.tsv")).unwrap();
    assert_eq!(final_counts_any_order(&output).unwrap(), expected);
}

#[test]
fn two_operator_names_never_share_a_state_file() {
    let dir = test_dir("state-files");
    let text = sample_text(5, 400);
    fs::write(dir.join("input.txt"), &text).unwrap();
    let job = write_job(
        &dir,
        &wordcount_over_file(FILE_SOURCE, "behavior = \"none\"", 10)
            .replace("name = \"tokenize\"", "name = \"a.b\"")
            .replace("name = \"suspect\"", "name = \"a_b\""),
    );
    let report = TestJob::load(&job)
        .unwrap()
        .run(RestorePoint::Fresh)
        .unwrap();
    let last = report.checkpoints.completed.last().expect("a checkpoint");
    let files: Vec<String> = fs::read_dir(&last.path)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(files.contains(&"a_2eb-0.state".to_string()), "{files:?}");
    assert!(files.contains(&"a_5fb-0.state".to_string()), "{files:?}");
    // And the checkpoint restores (before, both names wrote one file and it was corrupt).
    sluice::checkpoint::load(&last.path).unwrap();
}

#[test]
fn the_tail_of_a_bounded_input_is_committed_by_a_final_checkpoint() {
    let dir = test_dir("final-checkpoint");
    let text = sample_text(6, 500);
    fs::write(dir.join("input.txt"), &text).unwrap();
    // Periodic checkpoints far apart: only the final one completes.
    let job = write_job(
        &dir,
        &wordcount_over_file(FILE_SOURCE, "behavior = \"none\"", 3_600_000),
    );
    let report = TestJob::load(&job)
        .unwrap()
        .run(RestorePoint::Fresh)
        .unwrap();
    assert_eq!(report.outcome, JobOutcome::Finished);
    assert_eq!(
        report.checkpoints.completed.len(),
        1,
        "{:?}",
        report.checkpoints
    );
    let output = fs::read_to_string(dir.join("out/counts.tsv")).unwrap();
    assert_eq!(
        final_counts(&output).unwrap(),
        expected_word_counts(&text, 1)
    );
    // The final checkpoint accounts for all of it: resuming from it changes nothing.
    let resumed = TestJob::load(&job)
        .unwrap()
        .run(RestorePoint::Latest)
        .unwrap();
    assert_eq!(resumed.outcome, JobOutcome::Finished);
    assert_eq!(
        fs::read_to_string(dir.join("out/counts.tsv")).unwrap(),
        output
    );
}

#[test]
fn stop_with_savepoint_works_after_a_source_finished_and_resumes_exactly() {
    let dir = test_dir("finished-source");
    let text = sample_text(7, 200);
    fs::write(dir.join("input.txt"), &text).unwrap();
    let sources = format!(
        "[[source]]\ntype = \"file\"\npath = \"input.txt\"\nname = \"file\"\n\n[{}\nname = \"slow\"",
        SLOW_SOURCE.replacen("[source]", "[source]]", 1)
    );
    let job_text = wordcount_over_file(&sources, "behavior = \"none\"", 50);
    let reference_dir = test_dir("finished-source-reference");
    fs::write(reference_dir.join("input.txt"), &text).unwrap();
    let reference = write_job(&reference_dir, &job_text);
    TestJob::load(&reference)
        .unwrap()
        .run(RestorePoint::Fresh)
        .unwrap();
    let expected =
        final_counts_any_order(&fs::read_to_string(reference_dir.join("out/counts.tsv")).unwrap())
            .unwrap();

    let job = write_job(&dir, &job_text);
    // The file source is done within milliseconds; the generator takes 2 s.
    let savepoint = stop_after(&TestJob::load(&job).unwrap(), Duration::from_millis(700));
    let resumed = TestJob::load(&job)
        .unwrap()
        .run(RestorePoint::Path(savepoint))
        .unwrap();
    assert_eq!(resumed.outcome, JobOutcome::Finished);
    let output = fs::read_to_string(dir.join("out/counts.tsv")).unwrap();
    assert_eq!(final_counts_any_order(&output).unwrap(), expected);
}

#[test]
fn savepoint_without_stopping_needs_a_running_job() {
    let dir = test_dir("savepoint-nothing-runs");
    let job = write_job(&dir, &throttled_wordcount(1, 100, 1000.0));
    let out = sluice(&["savepoint", job.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(69));
    assert!(
        stderr(&out).contains("no running job answers"),
        "{}",
        stderr(&out)
    );
}
