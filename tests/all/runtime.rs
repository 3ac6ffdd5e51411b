//! The task runtime with real components: lifecycle order, cancellation of a stuck call,
//! call deadlines, idle CPU, backpressure.

use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use sluice::job::{JobControl, JobOutcome, RestorePoint};
use sluice::wasm::SandboxLimits;
use sluice_tests::plugins::{COUNT, TEST_MISBEHAVE, TEST_RECORDER, TOKENIZE};
use sluice_tests::{TestJob, run_job, scratch_root, test_dir, write_job};

#[test]
fn lifecycle_calls_reach_a_wasm_operator_in_order() {
    let dir = test_dir("lifecycle");
    std::fs::write(dir.join("in.txt"), "a\nb\nc\n").unwrap();
    let job = write_job(
        &dir,
        &format!(
            r#"
name = "lifecycle"
[source]
type = "file"
path = "in.txt"
[[operator]]
name = "recorder"
plugin = "{TEST_RECORDER}"
[sink]
type = "file"
path = "out.txt"
format = "key-value"
"#
        ),
    );
    run_job(&job).unwrap();
    let out = std::fs::read_to_string(dir.join("out.txt")).unwrap();
    let calls = out.lines().find_map(|l| l.strip_prefix("calls\t")).unwrap();
    // End of a bounded input: event time advances to the end, then `finish`.
    assert_eq!(
        calls,
        format!(
            "0:open(restored=none,attempt=0),process(3),watermark({}),finish",
            i64::MAX
        )
    );
}

fn spin_job(dir: &std::path::Path) -> std::path::PathBuf {
    write_job(
        dir,
        &format!(
            r#"
name = "stuck"
[source]
type = "generator"
records = 100
[[operator]]
name = "spin"
plugin = "{TEST_MISBEHAVE}"
config = {{ behavior = "loop-in-process" }}
[sink]
type = "file"
path = "out.txt"
"#
        ),
    )
}

#[test]
fn cancel_interrupts_an_operator_stuck_in_a_loop() {
    let dir = test_dir("cancel");
    let job = TestJob::load(&spin_job(&dir)).unwrap();
    let control = job.control.clone();
    let canceller = thread::spawn(move || {
        thread::sleep(Duration::from_millis(300));
        let sent = Instant::now();
        control.send(JobControl::Cancel).unwrap();
        sent
    });
    let report = job.run(RestorePoint::Fresh).unwrap();
    let cancelled_at = canceller.join().unwrap();
    assert_eq!(report.outcome, JobOutcome::Cancelled);
    // Epoch interruption ends the call within a few ticks, not when the loop ends.
    assert!(
        cancelled_at.elapsed() < Duration::from_secs(5),
        "took {:?}",
        cancelled_at.elapsed()
    );
    let note = report.interrupted.join("\n");
    assert!(
        note.contains("operator 'spin' (subtask 1/1) of job 'stuck'") && note.contains("`process`"),
        "{note}"
    );
    assert!(note.contains("cancelled"), "{note}");
}

#[test]
fn a_call_past_its_deadline_fails_naming_the_operator() {
    let dir = test_dir("deadline");
    let mut job = TestJob::load(&spin_job(&dir)).unwrap();
    job.job = job.job.with_limits(SandboxLimits {
        call_deadline: Some(Duration::from_millis(300)),
        ..SandboxLimits::default()
    });
    let err = format!("{:#}", job.run(RestorePoint::Fresh).unwrap_err());
    assert!(
        err.contains("operator 'spin' (subtask 1/1) of job 'stuck'"),
        "{err}"
    );
    assert!(
        err.contains("failed in `process`: trapped (deadline)"),
        "{err}"
    );
    assert!(err.contains("300ms"), "{err}");
}

/// CPU time (user + system) a child used, from `wait4`.
fn run_child_measuring_cpu(cmd: &mut Command) -> (Duration, Duration, i32) {
    let start = Instant::now();
    // Waited for below with wait4, which also reports the child's CPU time.
    #[expect(clippy::zombie_processes, reason = "reaped by wait4")]
    let child = cmd.spawn().expect("spawning sluice");
    let mut status = 0;
    // SAFETY: `rusage` is plain data that wait4 fills; `status` is a valid pointer; the
    // pid is our own child, which we wait for exactly once.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::wait4(child.id() as i32, &mut status, 0, &mut usage);
        usage
    };
    let wall = start.elapsed();
    let tv = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64)
    };
    (
        wall,
        tv(usage.ru_utime) + tv(usage.ru_stime),
        libc::WEXITSTATUS(status),
    )
}

#[test]
fn an_idle_job_uses_almost_no_cpu() {
    let dir = test_dir("idle");
    // Six records at two per second: the job idles ~3 s between records.
    let job = write_job(
        &dir,
        &format!(
            r#"
name = "idle"
[source]
type = "generator"
records = 6
rate = 2.0
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
[[operator]]
name = "count"
plugin = "{COUNT}"
parallelism = 2
key_by = "key"
[sink]
type = "file"
path = "out.txt"
"#
        ),
    );
    let (wall, cpu, code) = run_child_measuring_cpu(
        Command::new(env!("CARGO_BIN_EXE_sluice-test-cli"))
            .args(["run", "--quiet", job.to_str().unwrap()])
            .env("SLUICE_CACHE_DIR", scratch_root().join("cache")),
    );
    assert_eq!(code, 0);
    assert!(
        wall >= Duration::from_millis(2400),
        "the job did not idle: {wall:?}"
    );
    // A task that spun while waiting would use a whole core (cpu ≈ wall).
    let share = cpu.as_secs_f64() / wall.as_secs_f64();
    assert!(
        share < 0.15,
        "used {cpu:?} CPU in {wall:?} ({:.0}%)",
        share * 100.0
    );
}

#[test]
fn backpressure_bounds_the_records_in_flight_behind_a_slow_operator() {
    let dir = test_dir("backpressure");
    let job = write_job(
        &dir,
        &format!(
            r#"
name = "slow"
[source]
type = "generator"
records = 1000
words_per_record = 4
[[operator]]
name = "slow"
plugin = "{TEST_MISBEHAVE}"
partition = "rebalance"
config = {{ behavior = "slow-process", delay-ms = 2 }}
[sink]
type = "file"
path = "out.txt"
[runtime]
buffer_bytes = 256
channel_capacity = 2
buffer_timeout_ms = 10
"#
        ),
    );
    let job = TestJob::load(&job).unwrap();
    let monitor = job.monitor.clone();
    let sampler = thread::spawn(move || {
        let mut max_in_flight = 0u64;
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            let tasks = monitor.tasks();
            // Two tasks: the generator, and the slow operator chained with the sink.
            if tasks.len() == 2 {
                let sent = tasks[0].records_out;
                let received = tasks[1].records_in;
                max_in_flight = max_in_flight.max(sent.saturating_sub(received));
                if received >= 1000 {
                    break;
                }
            }
            thread::sleep(Duration::from_millis(1));
        }
        max_in_flight
    });
    let report = job.run(RestorePoint::Fresh).unwrap();
    let max_in_flight = sampler.join().unwrap();
    let lines = std::fs::read_to_string(dir.join("out.txt"))
        .unwrap()
        .lines()
        .count();
    assert_eq!(lines, 1000);
    // Two buffers in the channel, one blocked sender, one being handed over; a 256-byte
    // buffer holds at most ~12 of these records. Without backpressure all 1000 would be
    // in flight at once.
    assert!(max_in_flight <= 60, "{max_in_flight} records in flight");
    assert!(max_in_flight > 0);
    let source = &report.tasks[0];
    assert!(
        source.backpressured > Duration::from_millis(200),
        "{source:?}"
    );
}
