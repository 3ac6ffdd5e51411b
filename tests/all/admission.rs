//! Admission: every knob of a job file has a range that validation holds it to, and a
//! server holds each tenant to its quotas of subtasks (threads) and disk, refusing with
//! the limit and the tenant named.

use std::path::Path;
use std::time::Duration;

use sluice::server::model::JobState;
use sluice_tests::plugins::{COUNT, TOKENIZE};
use sluice_tests::{TestJob, test_dir, throttled_wordcount, write_job};

use crate::cli::{outcome, sluice};
use crate::server::{ServerProcess, error_of, host_config, wait_for};

/// A small valid job: a generator, `tokenize`, a keyed `count` and a file sink, with
/// lines added to the source, `tokenize`, `count` and (after the sink's) the file's end.
fn job(source: &str, tokenize: &str, count: &str, tail: &str) -> String {
    format!(
        r#"
name = "knobs"
max_parallelism = 1024
[source]
type = "generator"
records = 10
{source}
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
{tokenize}
[[operator]]
name = "count"
plugin = "{COUNT}"
key_by = "key"
{count}
[sink]
type = "file"
path = "out.txt"
{tail}
"#
    )
}

/// Loads `text` as a job file and returns the error it is refused with.
fn refusal(dir: &Path, text: &str) -> String {
    let path = write_job(dir, text);
    match TestJob::load(&path) {
        Ok(_) => panic!("the job was accepted:\n{text}"),
        Err(e) => format!("{e:#}"),
    }
}

#[test]
fn absurd_knobs_are_refused_with_the_file_field_value_and_range_named() {
    let dir = test_dir("admission-knobs");
    let path = dir.join("job.toml").display().to_string();
    let cases = [
        (
            job("", "", "", "[runtime]\nchannel_capacity = 1000000000"),
            "[runtime]: `channel_capacity` = 1000000000 is out of range: it must be between 1 and 1024",
        ),
        (
            job("parallelism = 30000", "", "", ""),
            "source 'source': `parallelism` = 30000 is out of range: it must be between 1 and 1024",
        ),
        (
            job("", "", "parallelism = 5000", ""),
            "operator #2 'count': `parallelism` = 5000 is out of range",
        ),
        (
            job("", "", "", "parallelism = 2000"),
            "sink 'sink': `parallelism` = 2000 is out of range",
        ),
        (
            job("", "", "", "[runtime]\nbuffer_bytes = 10000000000"),
            "`buffer_bytes` = 10000000000 is out of range: it must be between 1 and 4194304",
        ),
        (
            job("", "", "", "[runtime]\nbuffer_timeout_ms = 100000000"),
            "`buffer_timeout_ms` = 100000000 is out of range",
        ),
        (
            job("", "", "", "[runtime]\nbatch_size = 10000000"),
            "`batch_size` = 10000000 is out of range",
        ),
        (
            job("words_per_record = 1000000", "", "", ""),
            "`words_per_record` = 1000000 is out of range",
        ),
        (
            // Beyond 2^32 the generator's arithmetic would overflow.
            job("vocabulary = 100000000000", "", "", ""),
            "`vocabulary` = 100000000000 is out of range",
        ),
        (job("rate = 0.0", "", "", ""), "`rate` = 0 is out of range"),
        (
            job("", "", "", "").replace("records = 10", "records = 1000000000000000"),
            "`records` = 1000000000000000 is out of range",
        ),
        (
            job("", "", "", "[checkpoint]\ninterval_ms = 1"),
            "[checkpoint]: `interval_ms` = 1 is out of range: it must be between 10 and 86400000 (or 0",
        ),
        (
            job(
                "",
                "",
                "",
                "[checkpoint]\ninterval_ms = 100\nretain = 1000000",
            ),
            "[checkpoint]: `retain` = 1000000 is out of range",
        ),
        (
            job(
                "",
                "",
                "",
                "[checkpoint]\ninterval_ms = 100\nmax_concurrent = 0",
            ),
            "[checkpoint]: `max_concurrent` = 0 is out of range",
        ),
        (
            job(
                "",
                "",
                "",
                "[checkpoint]\ninterval_ms = 100\ntimeout_ms = 100000000000",
            ),
            "[checkpoint]: `timeout_ms` = 100000000000 is out of range",
        ),
        (
            job(
                "",
                "",
                "",
                "[restart]\nstrategy = \"fixed-delay\"\ndelay_ms = 10000000000",
            ),
            "[restart]: `delay_ms` = 10000000000 is out of range",
        ),
        (
            job(
                "",
                "",
                "",
                "[restart]\nstrategy = \"exponential\"\nmultiplier = 1000.0",
            ),
            "[restart]: `multiplier` = 1000 is out of range",
        ),
        (
            job(
                "",
                "",
                "",
                "[restart]\nstrategy = \"fixed-delay\"\nattempts = 4000000000",
            ),
            "[restart]: `attempts` = 4000000000 is out of range",
        ),
        (
            job("", "", "", "").replace("max_parallelism = 1024", "max_parallelism = 100000"),
            "`max_parallelism` = 100000 is out of range: it must be between 1 and 32768",
        ),
    ];
    for (text, expected) in &cases {
        let err = refusal(&dir, text);
        assert!(
            err.contains(&path) && err.contains(expected),
            "expected {expected:?} in:\n{err}"
        );
    }

    // Knobs within range, but together more than a host should give one job.
    let wide = |p: u32| format!("parallelism = {p}");
    let sized = [
        (
            // 4 MiB buffers, 1024 of them per channel.
            job(
                "",
                "",
                "",
                "[runtime]\nbuffer_bytes = 4194304\nchannel_capacity = 1024",
            ),
            "[runtime]: a channel could hold",
        ),
        (
            // Source batches of 65,536 lines of 1024 words, 8 per channel.
            job(
                "words_per_record = 1024",
                "",
                "",
                "[runtime]\nbatch_size = 65536",
            ),
            "[runtime]: a channel could hold",
        ),
        (
            // 64 × 64 keyed channels of 64 buffers of 32 KiB: 8.7 GB.
            job(
                &wide(64),
                &wide(64),
                &wide(64),
                "parallelism = 64\n[runtime]\nchannel_capacity = 64",
            ),
            "[runtime]: the job's 4096 channels could hold",
        ),
        (
            job(&wide(512), &wide(512), &wide(512), &wide(512)),
            "the job has 262144 channels between its tasks, more than the 65536",
        ),
        (
            // Five chains of 1024 subtasks: 5120 threads.
            job(
                &wide(1024),
                &wide(1024),
                &format!(
                    "parallelism = 1024\n[[operator]]\nname = \"count2\"\nplugin = \"{COUNT}\"\n\
                     key_by = \"key\"\nparallelism = 1024\n[[operator]]\nname = \"count3\"\n\
                     plugin = \"{COUNT}\"\nkey_by = \"key\"\nparallelism = 1024"
                ),
                "parallelism = 1024\npartition = \"rebalance\"",
            ),
            "the job has 5120 subtasks (threads), more than the 4096",
        ),
    ];
    for (text, expected) in &sized {
        let err = refusal(&dir, text);
        assert!(
            err.contains(&path) && err.contains(expected),
            "expected {expected:?} in:\n{err}"
        );
    }

    // At the edges of their ranges, knobs are accepted.
    let edge = job(
        "words_per_record = 1024\nvocabulary = 1000000000\nrate = 1000000000.0",
        "",
        "parallelism = 4",
        "[runtime]\nbatch_size = 512\nbuffer_timeout_ms = 60000\nchannel_capacity = 8\n\
         [checkpoint]\ninterval_ms = 86400000\nretain = 100\nmax_concurrent = 16",
    );
    TestJob::load(&write_job(&dir, &edge)).unwrap();

    // `sluice validate` says the same, and the process exits cleanly (no abort).
    let path = write_job(&dir, &cases[0].0);
    let (code, _, stderr) = outcome(&sluice(&["validate", path.to_str().unwrap()]));
    assert_eq!(code, Some(65), "{stderr}");
    assert!(stderr.contains(cases[0].1), "{stderr}");
}

#[test]
fn a_server_refuses_absurd_knobs_and_jobs_past_the_tenants_subtask_quota() {
    let dir = test_dir("admission-subtasks");
    let server = ServerProcess::start(&host_config(&dir, "max_subtasks = 4"));
    let a = server.client(Some("token-a"));

    // Knobs out of range: 400, with the field named, and nothing stored.
    let absurd = throttled_wordcount(1, 100, 100.0)
        .replace("batch_size = 200", "channel_capacity = 1000000000");
    let e = error_of(a.submit(&write_job(&dir, &absurd)));
    assert!(
        e.contains("400")
            && e.contains("job.toml: [runtime]: `channel_capacity` = 1000000000 is out of range"),
        "{e}"
    );
    assert_eq!(a.list().unwrap().jobs, []);

    // source -> tokenize (1), count (4), sink (1): 6 subtasks, past the quota of 4.
    let wide = write_job(&dir, &throttled_wordcount(4, 100_000, 500.0));
    let e = error_of(a.submit(&wide));
    assert!(
        e.contains("429")
            && e.contains("needs 6 subtasks (threads), but tenant 'a' has 0 of its 4 in use")
            && e.contains("max_subtasks"),
        "{e}"
    );
    // 1 + 2 + 1 fits, once.
    let narrow = write_job(&dir, &throttled_wordcount(2, 100_000, 500.0));
    let first = a.submit(&narrow).unwrap().id;
    let e = error_of(a.submit(&narrow));
    assert!(
        e.contains("429") && e.contains("tenant 'a' has 4 of its 4 in use (max_subtasks)"),
        "{e}"
    );
    // A start is charged too.
    a.cancel(&first).unwrap();
    let second = a.submit(&narrow).unwrap().id;
    let e = error_of(a.start(&first, None));
    assert!(e.contains("429") && e.contains("max_subtasks"), "{e}");
    // Another tenant has its own quota.
    let b = server.client(Some("token-b"));
    let other = b.submit(&wide).unwrap().id;
    b.cancel(&other).unwrap();
    a.cancel(&second).unwrap();
}

#[test]
fn a_tenant_past_its_disk_quota_has_its_jobs_failed_and_new_ones_refused() {
    let dir = test_dir("admission-disk");
    let server = ServerProcess::start(&host_config(&dir, "max_disk_mb = 1"));
    let a = server.client(Some("token-a"));
    // ~120,000 output lines a second, committed every 100 ms: past 1 MiB in seconds.
    let id = a
        .submit(&write_job(
            &dir,
            &throttled_wordcount(1, 10_000_000, 20_000.0),
        ))
        .unwrap()
        .id;
    wait_for("the quota to fail the job", Duration::from_secs(60), || {
        a.status(&id).unwrap().job.state == JobState::Failed
    });
    let detail = a.status(&id).unwrap();
    let failure = detail.last_failure.as_deref().unwrap_or_default();
    assert!(
        failure.contains("tenant 'a' takes") && failure.contains("(max_disk_mb)"),
        "{detail:?}"
    );
    // Nothing more is admitted while the tenant is over its quota.
    let e = error_of(a.submit(&write_job(&dir, &throttled_wordcount(1, 10, 100.0))));
    assert!(
        e.contains("429") && e.contains("tenant 'a'") && e.contains("max_disk_mb"),
        "{e}"
    );
    let e = error_of(a.start(&id, None));
    assert!(e.contains("429") && e.contains("max_disk_mb"), "{e}");
    // Other tenants are not held to a's quota.
    let b = server.client(Some("token-b"));
    let other = b
        .submit(&write_job(&dir, &throttled_wordcount(1, 10, 100.0)))
        .unwrap();
    assert_eq!(other.state, JobState::Running, "{other:?}");
}

#[test]
fn a_tenant_stores_at_most_its_quota_of_jobs_until_it_deletes_some() {
    let dir = test_dir("admission-stored");
    let server = ServerProcess::start(&host_config(&dir, "max_stored_jobs = 2"));
    let a = server.client(Some("token-a"));
    let job = write_job(&dir, &throttled_wordcount(1, 10, 1000.0));
    let first = a.submit(&job).unwrap().id;
    a.submit(&job).unwrap();
    let e = error_of(a.submit(&job));
    assert!(
        e.contains("429")
            && e.contains("tenant 'a' stores 2 jobs")
            && e.contains("max_stored_jobs"),
        "{e}"
    );
    // Another tenant's jobs are not held to a's quota.
    server.client(Some("token-b")).submit(&job).unwrap();
    // An ended job deleted makes room.
    wait_for("the first job to end", Duration::from_secs(30), || {
        !a.status(&first).unwrap().job.running
    });
    a.delete_job(&first).unwrap();
    assert_eq!(a.submit(&job).unwrap().state, JobState::Running);
}

#[test]
fn a_server_holds_jobs_to_the_task_slots_of_their_tenant_and_its_own() {
    let dir = test_dir("admission-slots");
    let server = ServerProcess::start(&crate::server::host_config_with(
        &dir,
        "slots = 4",
        "slots = 3",
    ));
    let (a, b) = (
        server.client(Some("token-a")),
        server.client(Some("token-b")),
    );
    let with_parallelism = |p: u32| write_job(&dir, &throttled_wordcount(p, 100_000, 500.0));

    // A job takes as many slots as its highest parallelism: 4 is past tenant a's 3.
    let e = error_of(a.submit(&with_parallelism(4)));
    assert!(
        e.contains("429")
            && e.contains(
                "job 'killable' needs 4 task slots (its highest parallelism), but tenant 'a' \
                 has 0 of its 3 in use (slots)"
            ),
        "{e}"
    );
    let first = a.submit(&with_parallelism(2)).unwrap().id;
    // Tenant b has the server's 4 as its own, but a holds 2 of them.
    let e = error_of(b.submit(&with_parallelism(3)));
    assert!(
        e.contains("429")
            && e.contains("needs 3 task slots (its highest parallelism), but the server has 2 of its 4 in use ([server] slots"),
        "{e}"
    );
    let second = b.submit(&with_parallelism(2)).unwrap().id;
    // Slots come back when a job ends.
    a.cancel(&first).unwrap();
    b.cancel(&second).unwrap();
    let third = b.submit(&with_parallelism(3)).unwrap().id;
    b.cancel(&third).unwrap();
}

#[test]
fn sluice_run_warns_of_a_parallelism_above_the_cores() {
    let dir = test_dir("admission-cores");
    let cores = std::thread::available_parallelism().unwrap().get();
    let job = write_job(&dir, &job_text(cores + 1));
    let (code, _, stderr) = outcome(&sluice(&["run", "--quiet", job.to_str().unwrap()]));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "warning: job 'knobs' ({}) runs {} subtasks of a task side by side on a machine \
             with {cores} cores",
            job.display(),
            cores + 1
        )),
        "{stderr}"
    );
    // At the core count, no warning.
    let job = write_job(&test_dir("admission-cores-at"), &job_text(cores));
    let (code, _, stderr) = outcome(&sluice(&["run", "--quiet", job.to_str().unwrap()]));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("warning"), "{stderr}");
}

/// [`job`] with `count` at `parallelism`.
fn job_text(parallelism: usize) -> String {
    job("", "", &format!("parallelism = {parallelism}"), "")
}
