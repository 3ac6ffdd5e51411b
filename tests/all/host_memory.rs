//! What a guest makes the host hold is bounded: keyed state, timers and counter names are
//! charged to the instance and its tenant as each call's effects are applied, and a
//! breach fails the task with the limit and the tenant named, while another tenant's job
//! runs on unharmed. State TTL really drops entries; timers that fire again at once are
//! cut; guest strings are cut before the host keeps them.

use std::path::Path;
use std::thread;

use sluice::job::{JobOutcome, RestorePoint};
use sluice_tests::plugins::{TEST_HOG, TOKENIZE};
use sluice_tests::{
    TestJob, acme_host, expected_word_counts, file_wordcount, final_counts, sample_text, test_dir,
    write_job,
};

/// `generator -> tokenize -> hog(config) -> file` of tenant `acme`, without restarts.
fn hog_job(dir: &Path, config: &str, records: u64) -> std::path::PathBuf {
    write_job(
        dir,
        &format!(
            r#"
name = "hog"
tenant = "acme"
[source]
type = "generator"
records = {records}
words_per_record = 6
vocabulary = 50
seed = 3
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
[[operator]]
name = "hog"
plugin = "{TEST_HOG}"
key_by = "key"
config = {{ {config} }}
[sink]
type = "file"
path = "out.txt"
[restart]
strategy = "none"
"#
        ),
    )
}

/// Runs the hog job under `limits` and returns how it failed.
fn failure(name: &str, config: &str, limits: &str) -> String {
    let dir = test_dir(name);
    let host = acme_host(&dir, limits);
    let job = hog_job(&dir, config, 1_000_000);
    let err = TestJob::load_with(&job, &host)
        .unwrap()
        .run(RestorePoint::Fresh)
        .expect_err("the hog should fail");
    let err = format!("{err:#}");
    assert!(
        err.contains("operator 'hog' (subtask 1/1) of job 'hog' (tenant 'acme')"),
        "{err}"
    );
    err
}

#[test]
fn every_kind_of_host_memory_is_capped_per_instance() {
    let cases = [
        (
            r#"hog = "keys""#,
            "state_mb = 4",
            "keyed state limit exceeded: the instance holds 4.0 MiB of keyed state (limit 4.0 MiB per instance, `state_mb`)",
        ),
        (
            r#"hog = "values", per-record = 1"#,
            "state_mb = 16",
            "keyed state limit exceeded",
        ),
        (
            r#"hog = "list""#,
            "state_mb = 4",
            "keyed state limit exceeded",
        ),
        (
            r#"hog = "timers""#,
            "timers = 20000",
            "timer limit exceeded: the instance holds 20",
        ),
        (
            r#"hog = "timer-keys", line-bytes = 8192, per-record = 1"#,
            "state_mb = 4",
            "keyed state limit exceeded: the instance holds 4.0 MiB",
        ),
        (
            r#"hog = "timer-keys", line-bytes = 20000, per-record = 1"#,
            "",
            "a timer key of 20000 bytes is longer than the limit of 16384 bytes (`guest_string_kb`)",
        ),
        (
            r#"hog = "counters""#,
            "counters = 100",
            "counter 'c101' would be counter number 101",
        ),
    ];
    for (config, limits, expected) in cases {
        let err = failure("hog-instance", config, limits);
        assert!(
            err.contains("failed in `process`: exceeded a limit: "),
            "{err}"
        );
        assert!(err.contains(expected), "{config}: {err}");
    }
}

#[test]
fn a_tenants_instances_share_its_limit_and_another_tenant_is_unharmed() {
    let dir = test_dir("hog-neighbour");
    let text = sample_text(17, 20_000);
    std::fs::write(dir.join("in.txt"), &text).unwrap();
    let neighbour = write_job(&dir, &file_wordcount("quiet", "quiet", 2));
    let host_config = acme_host(&dir, "state_mb = 1024\ntenant_state_mb = 8");
    let quiet = {
        let host_config = host_config.clone();
        thread::spawn(move || {
            TestJob::load_with(&neighbour, &host_config)
                .unwrap()
                .run(RestorePoint::Fresh)
                .unwrap()
        })
    };
    // Two hogs of tenant acme, in parallel subtasks: together past the tenant's 8 MiB.
    let hog_dir = test_dir("hog-tenant");
    let hog = hog_job(&hog_dir, r#"hog = "keys""#, 1_000_000);
    let text_of = std::fs::read_to_string(&hog).unwrap();
    std::fs::write(
        &hog,
        text_of.replace("key_by = \"key\"", "key_by = \"key\"\nparallelism = 2"),
    )
    .unwrap();
    let err = format!(
        "{:#}",
        TestJob::load_with(&hog, &host_config)
            .unwrap()
            .run(RestorePoint::Fresh)
            .unwrap_err()
    );
    assert!(
        err.contains("keyed state limit exceeded: tenant 'acme' holds"),
        "{err}"
    );
    assert!(err.contains("(limit 8.0 MiB, `tenant_state_mb`)"), "{err}");
    let report = quiet.join().unwrap();
    assert_eq!(report.outcome, JobOutcome::Finished);
    let output = sluice_tests::read_sink_output(&dir.join("counts.tsv"), 1);
    assert_eq!(
        final_counts(&output).unwrap(),
        expected_word_counts(&text, 1)
    );
}

#[test]
fn state_ttl_drops_entries_so_a_small_limit_holds() {
    // 180,000 words × 10 entries of about 200 bytes: about 350 MiB written over the run,
    // with a 1 ms TTL, under a limit of 4 MiB.
    let dir = test_dir("hog-ttl");
    let host = acme_host(&dir, "state_mb = 4");
    let job = hog_job(&dir, r#"hog = "ttl", per-record = 10"#, 30_000);
    let text = std::fs::read_to_string(&job).unwrap();
    // Small batches: what one call writes is fresh, so it all counts until a later call.
    std::fs::write(
        &job,
        format!("{text}[runtime]\nbatch_size = 16\nbuffer_bytes = 2048\n"),
    )
    .unwrap();
    let report = TestJob::load_with(&job, &host)
        .unwrap()
        .run(RestorePoint::Fresh)
        .unwrap();
    assert_eq!(
        report.outcome,
        JobOutcome::Finished,
        "{:?}",
        report.failures
    );
}

#[test]
fn timers_that_are_due_again_at_once_are_cut() {
    let err = failure("hog-timer-loop", r#"hog = "timer-loop""#, "");
    assert!(
        err.contains("failed in `on-timers`: exceeded a limit: 1000 rounds of `on-timers`"),
        "{err}"
    );
}

#[test]
fn guest_strings_are_cut_before_the_host_keeps_them() {
    let err = failure(
        "hog-fail-string",
        r#"hog = "fail", line-bytes = 10000000"#,
        "guest_string_kb = 1",
    );
    assert!(err.len() < 4096, "{} bytes kept", err.len());
    assert!(err.contains("(9998976 more bytes cut)"), "{err}");
}

/// Runs the hog job (`config`, with checkpoints) under `limits` in a `sluice run`
/// process of its own until a limit stops it; returns the process's peak resident
/// memory in bytes.
fn peak_rss_of_run(name: &str, config: &str, limits: &str, ends: &str) -> u64 {
    let dir = test_dir(name);
    std::fs::write(dir.join("host.toml"), format!("[tenant.acme]\n{limits}\n")).unwrap();
    let text = std::fs::read_to_string(hog_job(&dir, config, 100_000_000)).unwrap()
        + "[checkpoint]\ninterval_ms = 200\ndir = \"checkpoints\"\n";
    let job = write_job(&dir, &text);
    // Reaped by `wait4` below, for its resource usage.
    #[allow(clippy::zombie_processes)]
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_sluice-test-cli"))
        .args(["run", "--fresh", "--host-config"])
        .arg(dir.join("host.toml"))
        .arg(&job)
        .env(
            "SLUICE_CACHE_DIR",
            sluice_tests::scratch_root().join("cache"),
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value for wait4 to fill in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: wait4 on our own child's pid, with pointers to live locals.
    let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(waited, pid);
    let mut stderr = String::new();
    use std::io::Read;
    child.stderr.unwrap().read_to_string(&mut stderr).unwrap();
    assert!(stderr.contains(ends), "{name}: {stderr}");
    usage.ru_maxrss as u64 * 1024
}

#[test]
fn the_host_memory_a_guest_causes_is_within_half_again_of_what_it_is_charged() {
    // What is charged: its keyed state, timers and counter names (`state_mb`), and its
    // linear memory (`memory_mb`, for each of the job's two instances). A run that holds
    // nothing of its own gives the process's base.
    const STATE_MB: u64 = 128;
    const MEMORY_MB: u64 = 32;
    let limits = format!("state_mb = {STATE_MB}\nmemory_mb = {MEMORY_MB}\ntimers = 100000000");
    let base = peak_rss_of_run(
        "rss-base",
        r#"hog = "fail", line-bytes = 10"#,
        &limits,
        "yyyyyyyyyy",
    );
    let charged = (STATE_MB + 2 * MEMORY_MB) << 20;
    for (name, config) in [
        ("rss-list", r#"hog = "list", per-record = 10"#),
        ("rss-timers", r#"hog = "timers", per-record = 10"#),
    ] {
        let rss = peak_rss_of_run(name, config, &limits, "keyed state limit exceeded");
        let caused = rss.saturating_sub(base);
        println!(
            "{name}: peak RSS {} MiB, {} MiB over the base, charged at most {} MiB",
            rss >> 20,
            caused >> 20,
            charged >> 20
        );
        assert!(
            caused * 2 <= charged * 3,
            "{name}: the guest made the host hold {} MiB, more than 1.5x the {} MiB charged",
            caused >> 20,
            charged >> 20
        );
    }
}
