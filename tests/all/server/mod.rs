//! `sluice serve` driven over real HTTP on loopback: submission, progress, savepoints,
//! resume, cancel, validation, quotas, tenant isolation, a server killed mid-job, a job
//! quarantined after it was resumed into crashes, output streamed, and ended jobs'
//! memory released.

use std::path::Path;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice::server::client::Client;
use sluice::server::model::{ClusterStatus, JobState};
use sluice_tests::plugins::{COUNT, TEST_WRONG_VERSION, TOKENIZE};
use sluice_tests::{scratch_root, test_dir, throttled_wordcount, write_job};

mod harness;
mod upgrade;

pub(crate) use harness::*;

#[test]
fn a_tenant_submits_watches_stops_resumes_and_cancels_jobs() {
    let dir = test_dir("server-lifecycle");
    let server = ServerProcess::start(&host_config(&dir, ""));
    let a = server.client(Some("token-a"));
    let job_text = throttled_wordcount(1, 3000, 1500.0);
    let job_path = write_job(&dir, &job_text);

    let submitted = a.submit(&job_path).unwrap();
    let id = submitted.id.clone();
    assert_eq!(submitted.state, JobState::Running);
    // Progress is visible while it runs.
    wait_for("records and a checkpoint", Duration::from_secs(30), || {
        let s = a.status(&id).unwrap();
        s.records_read > 0 && s.checkpoints.completed > 0
    });
    let stopped = a.stop(&id, false).unwrap();
    assert_eq!(stopped.state, JobState::Stopped, "{stopped:?}");
    let detail = a.status(&id).unwrap();
    let savepoint = detail.savepoint.clone().unwrap();
    assert!(savepoint.starts_with("savepoint-"), "{detail:?}");
    let read_before = detail.records_read;
    assert!(
        read_before < 3000,
        "the job ended before the stop: {detail:?}"
    );
    // Stopping again is a conflict, not a crash.
    assert!(error_of(a.stop(&id, false)).contains("409"), "stop twice");

    // Resume from the savepoint: the output equals a run without interruption.
    let started = a.start(&id, Some(&savepoint)).unwrap();
    assert_eq!(started.state, JobState::Running);
    wait_for("the job to finish", Duration::from_secs(60), || {
        state(&a, &id) == JobState::Finished
    });
    let output = String::from_utf8(a.output(&id, None).unwrap()).unwrap();
    assert_eq!(output, failure_free_output(&job_text));
    // The job's own log lines, across both runs.
    let logs = String::from_utf8(a.logs(&id).unwrap()).unwrap();
    assert!(logs.contains("INFO completed savepoint"), "{logs}");
    assert!(
        logs.contains("INFO job ended") && logs.contains("state=finished"),
        "{logs}"
    );
    let list = a.list().unwrap();
    assert_eq!(list.jobs.len(), 1, "{list:?}");
    assert_eq!(list.jobs[0].job.state, JobState::Finished);
    // The counts add up over both runs: every record read once.
    assert_eq!(list.jobs[0].records_read, 3000, "{list:?}");

    // Cancel: the job ends as cancelled, and can be started again from its checkpoint.
    let id2 = a.submit(&job_path).unwrap().id;
    assert_ne!(id, id2);
    let cancelled = a.cancel(&id2).unwrap();
    assert_eq!(cancelled.state, JobState::Cancelled, "{cancelled:?}");
    assert!(error_of(a.cancel(&id2)).contains("it is cancelled"));

    // Metrics in Prometheus' format, for this tenant's jobs.
    let (status, metrics) = a.request("GET", "/metrics", None).unwrap();
    let metrics = String::from_utf8(metrics).unwrap();
    assert_eq!(status, 200);
    assert!(
        metrics.contains(&format!(
            "sluice_operator_records_in_total{{tenant=\"a\",job=\"{id}\",operator=\"count\",subtask=\"0\"}}"
        )),
        "{metrics}"
    );
    // OpenMetrics (`prometheus-client`): a counter's family is named without `_total`.
    assert!(
        metrics.contains("# TYPE sluice_checkpoints_completed counter"),
        "{metrics}"
    );
    assert!(metrics.trim_end().ends_with("# EOF"), "{metrics}");
    // Checkpoint durations as histograms.
    assert!(
        metrics.contains("# TYPE sluice_checkpoint_duration_seconds histogram")
            && metrics.contains(&format!(
                "sluice_checkpoint_duration_seconds_bucket{{le=\"+Inf\",tenant=\"a\",job=\"{id}\"}}"
            )),
        "{metrics}"
    );

    // The history survives the server: a server started again shows the finished
    // job's checkpoints of both runs, the savepoint between them among them.
    let before = a.status(&id).unwrap().checkpoints;
    assert!(
        before
            .last
            .iter()
            .any(|c| c.name.as_deref() == Some(savepoint.as_str())),
        "{before:?}"
    );
    server.terminate();
    let server = ServerProcess::start(&host_config(&dir, ""));
    let a = server.client(Some("token-a"));
    assert_eq!(a.status(&id).unwrap().checkpoints, before);

    // Deleting: a plugin a job could still run is kept, a running job too; a job that
    // is not running goes with its folder, then its plugins may go.
    let dir_of = |id: &str| dir.join("registry/jobs").join(id);
    assert!(dir_of(&id2).is_dir());
    let plugins = a.plugins().unwrap();
    let count_sha = plugins
        .plugins
        .iter()
        .find(|p| p.name == "count.wasm")
        .map(|p| p.sha256.clone())
        .unwrap_or_else(|| panic!("{plugins:?}"));
    let e = error_of(a.delete_plugin("count.wasm"));
    assert!(
        e.contains("409") && e.contains(&format!("jobs {id2} use it")),
        "{e}"
    );
    let id3 = a.submit(&job_path).unwrap().id;
    let e = error_of(a.delete_job(&id3));
    assert!(e.contains("409") && e.contains("it is running"), "{e}");
    a.cancel(&id3).unwrap();
    for id in [&id, &id2, &id3] {
        assert_eq!(a.delete_job(id).unwrap().id, id.as_str());
        assert!(!dir_of(id).exists());
        assert!(error_of(a.status(id)).contains("404"));
    }
    assert_eq!(a.list().unwrap().jobs, []);
    let deleted = a.delete_plugin(&count_sha).unwrap();
    assert_eq!(deleted.name, "count.wasm");
    assert!(error_of(a.delete_plugin(&count_sha)).contains("404"));
    server.terminate();
}

#[test]
fn requests_without_a_valid_token_or_for_another_tenant_leak_nothing() {
    let dir = test_dir("server-auth");
    let server = ServerProcess::start(&host_config(&dir, ""));
    let a = server.client(Some("token-a"));
    let id = a
        .submit(&write_job(&dir, &throttled_wordcount(1, 100_000, 500.0)))
        .unwrap()
        .id;

    // Health and the API description need no token; every other documented route
    // exists and refuses a request without one.
    let anonymous = server.client(None);
    let (status, _) = anonymous.request("GET", "/health", None).unwrap();
    assert_eq!(status, 200);
    let (status, doc) = anonymous.request("GET", "/openapi.json", None).unwrap();
    assert_eq!(status, 200);
    let doc: Value = serde_json::from_slice(&doc).unwrap();
    let paths = doc["paths"].as_object().unwrap();
    assert!(paths.len() >= 10, "{doc}");
    for (path, methods) in paths {
        for method in methods.as_object().unwrap().keys() {
            let method = method.to_uppercase();
            let (status, body) = anonymous
                .request(&method, &path.replace("{id}", &id), None)
                .unwrap();
            let open = methods[method.to_lowercase()]["security"] == serde_json::json!([]);
            let expected = if open { 200 } else { 401 };
            assert_eq!(
                status,
                expected,
                "{method} {path}: {}",
                String::from_utf8_lossy(&body)
            );
        }
    }
    for client in [server.client(None), server.client(Some("token-x"))] {
        for (method, path) in [
            ("GET", "/jobs".to_string()),
            ("GET", format!("/jobs/{id}")),
            ("GET", format!("/jobs/{id}/logs")),
            ("POST", format!("/jobs/{id}/cancel")),
            ("GET", "/plugins".to_string()),
            ("GET", "/metrics".to_string()),
        ] {
            let (status, body) = client.request(method, &path, None).unwrap();
            let body = String::from_utf8(body).unwrap();
            assert_eq!(status, 401, "{method} {path}: {body}");
            assert!(!body.contains(&id) && !body.contains("killable"), "{body}");
        }
    }

    // Tenant b sees no job, cannot control a's, and a's job is "not found" to it.
    let b = server.client(Some("token-b"));
    assert_eq!(b.list().unwrap().jobs, []);
    for e in [
        error_of(b.status(&id)),
        error_of(b.cancel(&id)),
        error_of(b.stop(&id, false)),
        error_of(b.start(&id, None)),
        error_of(b.trigger_savepoint(&id)),
    ] {
        assert!(e.contains(": 404: no job"), "{e}");
    }
    assert!(b.output(&id, None).unwrap_err().to_string().contains("404"));
    assert!(b.logs(&id).unwrap_err().to_string().contains("404"));
    assert_eq!(b.request("GET", "/plugins", None).unwrap().0, 200);
    let plugins: Value =
        serde_json::from_slice(&b.request("GET", "/plugins", None).unwrap().1).unwrap();
    assert_eq!(plugins["plugins"], serde_json::json!([]));
    let metrics = String::from_utf8(b.request("GET", "/metrics", None).unwrap().1).unwrap();
    assert!(!metrics.contains(&id), "{metrics}");

    // A job file naming another tenant is refused.
    let other = throttled_wordcount(1, 10, 100.0)
        .replace("name = \"killable\"", "name = \"x\"\ntenant = \"a\"");
    let e = error_of(b.submit(&write_job(&dir, &other)));
    assert!(e.contains("403") && e.contains("names tenant 'a'"), "{e}");
    assert_eq!(state(&a, &id), JobState::Running);
    a.cancel(&id).unwrap();
}

#[test]
fn bad_submissions_get_clear_errors_and_leave_nothing_behind() {
    let dir = test_dir("server-validation");
    let server = ServerProcess::start(&host_config(
        &dir,
        "max_jobs = 1\nmax_plugin_mb = 1\nmax_instances = 3",
    ));
    let a = server.client(Some("token-a"));
    let registry = dir.join("registry");
    let jobs_on_disk = || std::fs::read_dir(registry.join("jobs")).unwrap().count();

    // Not a component: named in the error, not stored.
    let junk = dir.join("junk.wasm");
    std::fs::write(&junk, b"this is not wasm").unwrap();
    let e = format!("{:#}", a.upload_plugin(&junk).unwrap_err());
    assert!(e.contains("400") && e.contains("junk.wasm"), "{e}");
    assert_eq!(
        a.request("GET", "/plugins", None).map(|r| r.0).unwrap(),
        200
    );
    // Too large for the server's upload limit (8 MiB) or the tenant's plugin quota (1 MiB).
    let big = dir.join("big.wasm");
    std::fs::write(&big, vec![0u8; 9 << 20]).unwrap();
    // Refused before the body is sent: an answer every time, never a broken upload.
    for _ in 0..5 {
        let e = format!("{:#}", a.upload_plugin(&big).unwrap_err());
        assert!(e.contains("413") && e.contains("max_upload_mb"), "{e}");
    }
    std::fs::write(&big, vec![0u8; 2 << 20]).unwrap();
    let e = format!("{:#}", a.upload_plugin(&big).unwrap_err());
    assert!(e.contains("429") && e.contains("max_plugin_mb"), "{e}");

    // A component of another WIT version: refused with the versions named.
    let e = format!(
        "{:#}",
        a.upload_plugin(Path::new(TEST_WRONG_VERSION)).unwrap_err()
    );
    assert!(e.contains("400") && e.contains("0.1.0"), "{e}");
    // Job files name uploaded plugins by name (or by content hash).
    a.upload_plugin(Path::new(TOKENIZE)).unwrap();
    let base = throttled_wordcount(1, 10, 100.0).replace(TOKENIZE, "tokenize.wasm");
    let cases = [
        (
            "name = \"x\"\n[source\n".to_string(),
            "400",
            "job.toml: TOML parse error",
        ),
        (
            base.replace(COUNT, "missing.wasm"),
            "400",
            "operator 'count': plugin \"missing.wasm\" was not uploaded by tenant 'a'",
        ),
        (
            base.replace(
                "type = \"generator\"",
                "type = \"file\"\npath = \"/etc/passwd\"",
            ),
            "400",
            "only generator and kafka sources run on a server",
        ),
        (
            base.replace(
                "type = \"file\"\npath = \"out/counts.tsv\"",
                "type = \"stdout\"",
            ),
            "400",
            "a server job writes to a file sink",
        ),
    ];
    for (text, status, message) in cases {
        // Sent as they are (the client would upload the plugins they name).
        let (code, body) = a.request("POST", "/jobs", Some(text.as_bytes())).unwrap();
        let body = String::from_utf8(body).unwrap();
        assert_eq!(code.to_string(), status, "{body}");
        assert!(body.contains(&message.replace('"', "\\\"")), "{body}");
    }
    assert_eq!(a.list().unwrap().jobs, []);
    assert_eq!(jobs_on_disk(), 0);

    // Quota: at most 3 operator instances (this job has 1 + 4).
    let wide = write_job(&dir, &throttled_wordcount(4, 100, 500.0));
    let e = error_of(a.submit(&wide));
    assert!(
        e.contains("429")
            && e.contains("needs 5 operator instances")
            && e.contains("max_instances"),
        "{e}"
    );
    // Quota: one running job at a time.
    let long = write_job(&dir, &throttled_wordcount(1, 100_000, 500.0));
    let id = a.submit(&long).unwrap().id;
    let e = error_of(a.submit(&long));
    assert!(e.contains("429") && e.contains("max_jobs"), "{e}");
    assert_eq!(jobs_on_disk(), 1);
    a.cancel(&id).unwrap();
    // Unknown routes and ids are JSON errors too.
    let (status, body) = a.request("GET", "/nope", None).unwrap();
    assert_eq!(status, 404);
    assert!(String::from_utf8(body).unwrap().contains("\"error\""));
}

#[test]
fn a_killed_server_resumes_every_tenants_jobs_without_loss_or_duplicates() {
    let dir = test_dir("server-kill");
    let config = host_config(&dir, "");
    let server = ServerProcess::start(&config);
    let texts = [
        throttled_wordcount(1, 2400, 800.0),
        throttled_wordcount(1, 2400, 800.0),
    ];
    let mut jobs = Vec::new();
    for (token, text) in ["token-a", "token-b"].into_iter().zip(&texts) {
        let client = server.client(Some(token));
        let job_dir = dir.join(token);
        std::fs::create_dir_all(&job_dir).unwrap();
        let id = client.submit(&write_job(&job_dir, text)).unwrap().id;
        jobs.push((token, id));
    }
    // Kill it once both jobs have committed something, but before they end.
    for (token, id) in &jobs {
        let client = server.client(Some(token));
        wait_for("a checkpoint", Duration::from_secs(30), || {
            client.status(id).unwrap().checkpoints.completed >= 2
        });
    }
    for (token, id) in &jobs {
        let s = server.client(Some(token)).status(id).unwrap();
        assert_eq!(s.job.state, JobState::Running, "{s:?}");
        assert!(s.records_read < 2400, "{s:?}");
    }
    server.kill();

    let server = ServerProcess::start(&config);
    for ((token, id), text) in jobs.iter().zip(&texts) {
        let client = server.client(Some(token));
        wait_for("the resumed job to finish", Duration::from_secs(60), || {
            state(&client, id) == JobState::Finished
        });
        let output = String::from_utf8(client.output(id, None).unwrap()).unwrap();
        assert_eq!(output, failure_free_output(text), "job {id} of {token}");
    }
}

#[test]
fn a_savepoint_without_stopping_leaves_the_job_running_and_can_be_rewound_to() {
    let dir = test_dir("server-savepoint");
    let server = ServerProcess::start(&host_config(&dir, ""));
    let a = server.client(Some("token-a"));
    let job_text = throttled_wordcount(1, 3000, 1500.0);
    let id = a.submit(&write_job(&dir, &job_text)).unwrap().id;
    wait_for("a checkpoint", Duration::from_secs(30), || {
        a.status(&id).unwrap().checkpoints.completed > 0
    });
    let taken = a.savepoint(&id).unwrap();
    let savepoint = taken.savepoint;
    assert!(savepoint.starts_with("savepoint-"), "{savepoint}");
    // The job goes on: it commits more checkpoints after the savepoint.
    assert_eq!(state(&a, &id), JobState::Running);
    let completed = a.status(&id).unwrap().checkpoints.completed;
    wait_for("a later checkpoint", Duration::from_secs(30), || {
        a.status(&id).unwrap().checkpoints.completed > completed + 1
    });
    assert_eq!(a.stop(&id, false).unwrap().state, JobState::Stopped);
    assert!(error_of(a.savepoint(&id)).contains("409"), "not running");

    // The savepoint is older than the committed output: starting from it is refused,
    // unless rewinding, which keeps the output aside and runs to the failure-free end.
    let refused = error_of(a.start(&id, Some(&savepoint)));
    assert!(refused.contains("allow_rewind"), "{refused}");
    assert_eq!(state(&a, &id), JobState::Stopped);
    let path = format!("/jobs/{id}/start?savepoint={savepoint}&allow_rewind=true");
    let (status, body) = a.request("POST", &path, None).unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    wait_for("the rewound job to finish", Duration::from_secs(60), || {
        state(&a, &id) == JobState::Finished
    });
    let output = String::from_utf8(a.output(&id, None).unwrap()).unwrap();
    assert_eq!(output, failure_free_output(&job_text));
    server.terminate();
}

/// The record of job `id` in the registry under `dir`.
fn record_on_disk(dir: &Path, id: &str) -> Value {
    let path = dir.join("registry/jobs").join(id).join("record.json");
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

#[test]
fn a_job_resumed_into_crashes_again_and_again_is_quarantined() {
    let dir = test_dir("server-quarantine");
    let config = host_config(&dir, "");
    // Checkpoints too rare to complete: every crash of the server finds it where it was.
    let text = throttled_wordcount(1, 1_000_000, 500.0)
        .replace("interval_ms = 100", "interval_ms = 3600000");
    let mut server = ServerProcess::start(&config);
    let id = server
        .client(Some("token-a"))
        .submit(&write_job(&dir, &text))
        .unwrap()
        .id;
    // Each server is killed while the job runs; the next one resumes it, counting on
    // disk before it launches it.
    for resumed in 0..3 {
        let a = server.client(Some("token-a"));
        wait_for("the job to read", Duration::from_secs(30), || {
            a.status(&id).unwrap().records_read > 0
        });
        assert_eq!(record_on_disk(&dir, &id)["recoveries"], resumed);
        server.kill();
        server = ServerProcess::start(&config);
        assert_eq!(
            state(&server.client(Some("token-a")), &id),
            JobState::Running
        );
        assert_eq!(record_on_disk(&dir, &id)["recoveries"], resumed + 1);
    }
    server.kill();

    // The fourth server does not launch it.
    let server = ServerProcess::start(&config);
    let a = server.client(Some("token-a"));
    let detail = a.status(&id).unwrap();
    assert_eq!(detail.job.state, JobState::Quarantined, "{detail:?}");
    assert!(!detail.job.running, "{detail:?}");
    let why = detail.last_failure.as_deref().unwrap();
    assert!(why.contains("quarantined after 3 server restarts"), "{why}");
    assert_eq!(record_on_disk(&dir, &id)["state"], "quarantined");

    // A person starting it takes it out of quarantine.
    assert_eq!(a.start(&id, None).unwrap().state, JobState::Running);
    assert_eq!(record_on_disk(&dir, &id)["recoveries"], 0);
    wait_for("the job to read", Duration::from_secs(30), || {
        a.status(&id).unwrap().records_read > 0
    });
    // A clean stop of the server is no crash: the job stays running, and the next server
    // that resumes it and stops cleanly leaves its count at 0.
    server.terminate();
    let server = ServerProcess::start(&config);
    assert_eq!(record_on_disk(&dir, &id)["recoveries"], 1);
    let a = server.client(Some("token-a"));
    wait_for("the job to read", Duration::from_secs(30), || {
        a.status(&id).unwrap().records_read > 0
    });
    server.terminate();
    let record = record_on_disk(&dir, &id);
    assert_eq!(record["state"], "running", "{record}");
    assert_eq!(record["recoveries"], 0, "{record}");
}

/// The peak resident memory of process `pid`, in bytes (`VmHWM`).
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb << 10
}

#[test]
fn a_large_output_is_streamed_byte_for_byte_without_being_held_in_memory() {
    let dir = test_dir("server-output");
    let config = host_config(&dir, "");
    // A finished job with 48 MiB of output in two files, written into the registry as a
    // server leaves it.
    let id = "0123456789abcdef";
    let job_dir = dir.join("registry/jobs").join(id);
    std::fs::create_dir_all(job_dir.join("output")).unwrap();
    let mut expected = Vec::new();
    for (file, lines) in [("out-0.txt", 1_000_000u64), ("out-1.txt", 1_000_000)] {
        let start = expected.len();
        for i in 0..lines {
            expected.extend_from_slice(format!("{file} line {i:>10}\n").as_bytes());
        }
        std::fs::write(job_dir.join("output").join(file), &expected[start..]).unwrap();
    }
    assert!(expected.len() > 48 << 20, "{}", expected.len());
    let record = serde_json::json!({
        "id": id, "tenant": "a", "name": "big", "state": "finished", "submitted_ms": 0,
        "plugins": {}, "output": ["output/out-0.txt", "output/out-1.txt"],
        "savepoint": null, "failure": null, "restarts": 0,
    });
    std::fs::write(job_dir.join("record.json"), record.to_string()).unwrap();

    let server = ServerProcess::start(&config);
    let a = server.client(Some("token-a"));
    assert_eq!(state(&a, id), JobState::Finished);
    let before = peak_rss(server.pid());
    let output = a.output(id, None).unwrap();
    let after = peak_rss(server.pid());
    assert!(
        output == expected,
        "the output differs ({} bytes)",
        output.len()
    );
    // Held whole, the output alone would raise the peak by 50 MB.
    assert!(
        after - before < 16 << 20,
        "serving {} bytes raised the server's peak memory from {before} to {after}",
        expected.len()
    );
    // One file of several (one sink's of a job with several sinks), or none that exists.
    let second = a.output(id, Some("output/out-1.txt")).unwrap();
    assert!(
        second == expected[expected.len() / 2..],
        "output/out-1.txt differs ({} bytes)",
        second.len()
    );
    let missing = error_of_bytes(a.output(id, Some("record.json")));
    assert!(
        missing.contains("404") && missing.contains("has no output file"),
        "{missing}"
    );
}

fn error_of_bytes(result: anyhow::Result<Vec<u8>>) -> String {
    format!("{:#}", result.unwrap_err())
}

#[test]
fn an_ended_jobs_logs_leave_memory_for_its_folder_and_are_still_served() {
    let dir = test_dir("server-forget");
    let config = host_config_with(&dir, "keep_ended_jobs = 0", "");
    let server = ServerProcess::start(&config);
    let a = server.client(Some("token-a"));
    let id = a
        .submit(&write_job(&dir, &throttled_wordcount(1, 300, 3000.0)))
        .unwrap()
        .id;
    wait_for("the job to finish", Duration::from_secs(30), || {
        state(&a, &id) == JobState::Finished
    });
    let logs_file = dir.join("registry/jobs").join(&id).join("logs.txt");
    wait_for(
        "its log lines to leave memory",
        Duration::from_secs(30),
        || logs_file.exists(),
    );
    let logs = String::from_utf8(a.logs(&id).unwrap()).unwrap();
    assert!(
        logs.contains("INFO job ended") && logs.contains("state=finished"),
        "{logs}"
    );
    // Its counts are kept in its record.
    let detail = a.status(&id).unwrap();
    assert_eq!(detail.records_read, 300, "{detail:?}");
    assert_eq!(a.list().unwrap().jobs[0].records_read, 300);
    server.terminate();
}

/// The client commands print for people (`--json` for programs): a submitted job in one
/// line, its status in a few, its log lines followed until it ends, the tenant's metrics.
#[test]
fn the_client_commands_print_for_people() {
    let dir = test_dir("server-client-cli");
    let server = ServerProcess::start(&host_config(&dir, ""));
    let job = write_job(&dir, &throttled_wordcount(1, 600, 1000.0));
    let cli = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_sluice-test-cli"))
            .args(args)
            .env("SLUICE_SERVER", &server.url)
            .env("SLUICE_TOKEN", "token-a")
            .env("SLUICE_CACHE_DIR", scratch_root().join("cache"))
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{args:?}: {stdout}{stderr}");
        // No colour codes where there is no terminal.
        assert!(!stderr.contains('\u{1b}'), "{stderr}");
        stdout
    };
    let submitted = cli(&["submit", job.to_str().unwrap()]);
    let id = submitted
        .strip_prefix("job ")
        .and_then(|s| s.split_once(' '))
        .map(|(id, rest)| {
            assert_eq!(rest, "'killable': running\n", "{submitted}");
            id.to_string()
        })
        .unwrap_or_else(|| panic!("{submitted}"));
    // Followed, the log ends when the job does, with its last lines.
    let logs = cli(&["logs", &id, "--follow"]);
    assert!(logs.contains("completed checkpoint"), "{logs}");
    assert_eq!(
        state(&server.client(Some("token-a")), &id),
        JobState::Finished
    );
    let status = cli(&["status", &id]);
    assert!(
        status.starts_with(&format!("job {id} 'killable': finished\n")),
        "{status}"
    );
    assert!(status.contains("records read 600, written"), "{status}");
    assert!(status.contains("checkpoints: "), "{status}");
    let json: Value = serde_json::from_str(&cli(&["status", &id, "--json"])).unwrap();
    assert_eq!(json["state"], "finished");
    let list = cli(&["list"]);
    assert!(list.contains(&id) && list.contains("finished"), "{list}");
    let metrics = cli(&["metrics"]);
    assert!(
        metrics.contains("sluice_jobs{tenant=\"a\",state=\"finished\"} 1"),
        "{metrics}"
    );
    // The same for programs: families of samples.
    let json: Value = serde_json::from_str(&cli(&["metrics", "--json"])).unwrap();
    let jobs = json["families"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "sluice_jobs")
        .unwrap_or_else(|| panic!("{json:#}"));
    assert_eq!(jobs["type"], "gauge", "{jobs:#}");
    assert!(
        jobs["samples"].as_array().unwrap().iter().any(|s| {
            s["labels"]["state"] == "finished" && s["labels"]["tenant"] == "a" && s["value"] == 1.0
        }),
        "{jobs:#}"
    );
}

/// `sluice submit` reports what the server finds wrong with a job file by the file's path
/// and its own line numbers, and a plugin named by a path that is no file as missing,
/// with where it was looked for.
#[test]
fn submit_errors_name_the_users_file_its_lines_and_a_missing_plugin() {
    let dir = test_dir("server-submit-errors");
    let server = ServerProcess::start(&host_config(&dir, ""));
    let submit = |job: &Path| {
        let out = Command::new(env!("CARGO_BIN_EXE_sluice-test-cli"))
            .arg("submit")
            .arg(job)
            .env("SLUICE_SERVER", &server.url)
            .env("SLUICE_TOKEN", "token-a")
            .env("SLUICE_CACHE_DIR", scratch_root().join("cache"))
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // Comments, blank lines and a key of the wrong table, as people write files.
    let text = format!(
        "# word count\n\n{}",
        throttled_wordcount(1, 600, 1000.0)
            .replace("seed = 5\n", "seed = 5\n\n# how long\nbatch_size = 3\n")
    );
    let line = text
        .lines()
        .position(|l| l.starts_with("batch_size = 3"))
        .unwrap()
        + 1;
    let job = dir.join("my-job.toml");
    std::fs::write(&job, &text).unwrap();
    let said = submit(&job);
    assert!(
        said.contains(&format!("error: {}: in `source.batch_size`", job.display()))
            && said.contains(&format!("line {line}"))
            && said.matches("job.toml").count() == said.matches("my-job.toml").count(),
        "line {line}: {said}"
    );
    // A plugin path that is no file.
    let missing = dir.join("plugins").join("nope.wasm");
    std::fs::write(
        &job,
        throttled_wordcount(1, 600, 1000.0).replacen(
            &format!("plugin = \"{TOKENIZE}\""),
            "plugin = \"plugins/nope.wasm\"",
            1,
        ),
    )
    .unwrap();
    let said = submit(&job);
    assert!(
        said.contains(&format!("{} does not exist", missing.display())),
        "{said}"
    );
}

/// A job whose restart strategy allows one restart, and that fails in every attempt,
/// restarted once: its status says so, as the API and the CLI show it.
#[test]
fn a_job_that_restarted_once_shows_one_restart() {
    let dir = test_dir("server-restarts");
    let server = ServerProcess::start(&host_config(&dir, ""));
    let client = server.client(Some("token-a"));
    let job = write_job(
        &dir,
        &format!(
            "name = \"twice\"\n[source]\ntype = \"generator\"\nrecords = 100\n\
             [[operator]]\nname = \"misbehave\"\nplugin = \"{}\"\n\
             config = {{ behavior = \"error-in-process\", after = 5 }}\n\
             [sink]\ntype = \"file\"\npath = \"out.txt\"\n\
             [restart]\nstrategy = \"fixed-delay\"\nattempts = 1\ndelay_ms = 10\n",
            sluice_tests::plugins::TEST_MISBEHAVE
        ),
    );
    let id = client.submit(&job).unwrap().id;
    wait_for("the job to fail", Duration::from_secs(60), || {
        client.status(&id).unwrap().job.state == JobState::Failed
    });
    let status = client.status(&id).unwrap();
    assert_eq!(status.restarts, 1, "{status:?}");
    let shown = Command::new(env!("CARGO_BIN_EXE_sluice-test-cli"))
        .args(["status", &id])
        .env("SLUICE_SERVER", &server.url)
        .env("SLUICE_TOKEN", "token-a")
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.contains("restarts 1\n"), "{shown}");
}

/// A path in a job file that leads out of the job's folder on the server (absolute, or
/// up through `..`) is refused with the path named, not quietly moved inside.
#[test]
fn paths_out_of_a_jobs_folder_are_refused_by_name() {
    let dir = test_dir("server-confined-paths");
    let server = ServerProcess::start(&host_config(&dir, ""));
    let client = server.client(Some("token-a"));
    let job = throttled_wordcount(1, 600, 1000.0);
    for (from, to, refused) in [
        (
            "path = \"out/counts.tsv\"",
            "path = \"/tmp/owned.tsv\"",
            "sink #1: path \"/tmp/owned.tsv\" is outside the job's output folder",
        ),
        (
            "path = \"out/counts.tsv\"",
            "path = \"out/../../../owned.tsv\"",
            "sink #1: path \"out/../../../owned.tsv\" is outside the job's output folder",
        ),
        (
            "dir = \"checkpoints\"",
            "dir = \"/tmp/elsewhere\"",
            "[checkpoint]: dir \"/tmp/elsewhere\" is outside the job's folder",
        ),
    ] {
        let path = write_job(&dir, &job.replacen(from, to, 1));
        let e = error_of(client.submit(&path));
        assert!(e.contains("403") && e.contains(refused), "{e}");
    }
    assert_eq!(client.list().unwrap().jobs, []);
}

/// With `tls_cert` and `tls_key` the server speaks HTTPS only: a client that trusts its
/// certificate (`--ca-cert`) works, one that does not, or speaks plain HTTP, gets nothing.
#[test]
fn the_server_serves_https_to_clients_that_trust_its_certificate() {
    let dir = test_dir("server-tls");
    let certified =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string(), "localhost".into()])
            .unwrap();
    std::fs::write(dir.join("cert.pem"), certified.cert.pem()).unwrap();
    std::fs::write(dir.join("key.pem"), certified.signing_key.serialize_pem()).unwrap();
    let config = host_config_with(&dir, "tls_cert = \"cert.pem\"\ntls_key = \"key.pem\"", "");
    let server = ServerProcess::start(&config);
    assert!(
        server.url.starts_with("https://127.0.0.1:"),
        "{}",
        server.url
    );
    let pem = certified.cert.pem();
    let trusting = server
        .client(Some("token-a"))
        .with_ca_cert(pem.as_bytes())
        .unwrap();
    assert_eq!(trusting.list().unwrap().jobs, []);
    // Not trusting the certificate: no answer.
    let e = format!("{:#}", server.client(Some("token-a")).list().unwrap_err());
    assert!(e.to_lowercase().contains("certificate"), "{e}");
    // Plain HTTP to the TLS port: no answer either.
    let plain = Client::new(
        &server.url.replace("https://", "http://"),
        Some("token-a".into()),
    );
    assert!(plain.list().is_err());
    // The command line takes the certificate too.
    let out = Command::new(env!("CARGO_BIN_EXE_sluice-test-cli"))
        .args([
            "list",
            "--server",
            &server.url,
            "--token",
            "token-a",
            "--ca-cert",
        ])
        .arg(dir.join("cert.pem"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.starts_with("id "), "{stdout}");
    // A certificate without its key is refused at start, with the reason.
    let config = host_config_with(&dir, "tls_cert = \"cert.pem\"", "");
    let out = Command::new(env!("CARGO_BIN_EXE_sluice-test-cli"))
        .args(["serve", "--host-config"])
        .arg(&config)
        .output()
        .unwrap();
    // A bad host file.
    assert_eq!(out.status.code(), Some(65));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("`tls_cert` and `tls_key` go together"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A Kafka grant bounds what a server job may ask, before any broker is asked: a
/// pattern source of a tenant that may read nothing, a buffer beyond the bounds, a
/// property outside the tuning ones.
#[test]
fn a_kafka_grant_refuses_what_it_does_not_allow_at_submission() {
    let dir = test_dir("server-kafka-grant");
    let grant = "[tenant.a.kafka]\nbootstrap = \"127.0.0.1:9\"\nwrite = [\"a\\\\..*\"]\n";
    let server = ServerProcess::start(&host_config(&dir, grant));
    let a = server.client(Some("token-a"));
    let job = |source: &str| {
        format!(
            "name = \"g\"\n[source]\ntype = \"kafka\"\nbounded = true\n{source}\n\
             [[operator]]\nname = \"tokenize\"\nplugin = \"{TOKENIZE}\"\n\
             [sink]\ntype = \"kafka\"\ntopic = \"a.out\"\n[checkpoint]\ninterval_ms = 100\n"
        )
    };
    for (source, reason) in [
        (
            "topics = { pattern = \".*\" }",
            "the grant lets the tenant read no topic",
        ),
        ("topics = \"a.in\"", "topic \"a.in\" may not be read"),
    ] {
        let path = write_job(&dir, &job(source));
        let e = error_of(a.submit(&path));
        assert!(e.contains("403") && e.contains(reason), "{e}");
    }
    // Within `write`, but its properties are refused before anything runs.
    let sink_job = |props: &str| {
        format!(
            "name = \"g\"\n[source]\ntype = \"generator\"\nrecords = 10\n\
             [[operator]]\nname = \"tokenize\"\nplugin = \"{TOKENIZE}\"\n\
             [sink]\ntype = \"kafka\"\ntopic = \"a.out\"\nproperties = {{ {props} }}\n\
             [checkpoint]\ninterval_ms = 100\n"
        )
    };
    for (props, reason) in [
        (
            "\"batch.size\" = \"100000000000\"",
            "\"batch.size\" = \"100000000000\" must be a whole number from 1 to",
        ),
        (
            "\"plugin.library.paths\" = \"/tmp/evil.so\"",
            "\"plugin.library.paths\" is not one a server job may set",
        ),
        (
            "\"compression.type\" = \"brotli\"",
            "must be one of none, gzip",
        ),
    ] {
        let path = write_job(&dir, &sink_job(props));
        let e = error_of(a.submit(&path));
        assert!(e.contains("403") && e.contains(reason), "{e}");
    }
    assert_eq!(a.list().unwrap().jobs, []);
}

/// The OpenAPI document is generated from the same table as the router: the server
/// serves it as the library builds it, every operation it describes is routed (at `/v1`
/// and, deprecated, unprefixed) to a handler rather than to the fallback, and no other
/// method is served on its paths.
#[test]
fn the_openapi_document_lists_exactly_the_routes_the_server_serves() {
    let dir = test_dir("server-openapi");
    let server = ServerProcess::start(&host_config(&dir, ""));
    let anonymous = server.client(None);
    let generated = serde_json::to_value(sluice::server::openapi()).unwrap();
    for path in ["/v1/openapi.json", "/openapi.json"] {
        let (status, doc) = anonymous.request("GET", path, None).unwrap();
        assert_eq!(status, 200, "{path}");
        let doc: Value = serde_json::from_slice(&doc).unwrap();
        assert_eq!(doc, generated, "{path} serves another document");
    }
    assert!(generated["openapi"].as_str().unwrap().starts_with("3.1"));
    // What the fallback answers, so that a route it serves can be told from a handler's.
    let fallback = |status: u16, body: &[u8]| {
        status == 404 && String::from_utf8_lossy(body).contains("no such route")
    };
    let (status, body) = anonymous.request("GET", "/v1/nope", None).unwrap();
    assert!(fallback(status, &body), "{status}");
    let paths = generated["paths"].as_object().unwrap();
    let mut served = 0;
    for (path, item) in paths {
        let concrete = path
            .replace("{id}", "0123456789abcdef")
            .replace("{request_id}", "r")
            .replace("{key}", "k.wasm");
        for method in ["GET", "POST", "DELETE"] {
            let (status, body) = anonymous.request(method, &concrete, None).unwrap();
            let body_text = String::from_utf8_lossy(&body);
            if item.get(method.to_lowercase()).is_some() {
                assert!(
                    !fallback(status, &body) && status != 405,
                    "{method} {path} is documented but not routed: {status} {body_text}"
                );
                served += 1;
            } else {
                assert_eq!(
                    status, 405,
                    "{method} {path} is routed but not documented: {body_text}"
                );
            }
        }
    }
    assert!(served > 2, "{generated}");
    for path in paths.keys() {
        assert!(
            path.starts_with("/v1/") || paths.contains_key(&format!("/v1{path}")) || {
                ["/", "/health", "/livez", "/readyz"].contains(&path.as_str())
            },
            "{path} is neither under /v1 nor the twin of a path there"
        );
    }
}

/// Every answer the client reads comes back as the server sent it: its type keeps every
/// field (none dropped, none renamed), the old unprefixed paths answer as `/v1` does, and
/// each time comes as epoch milliseconds and as the same instant in RFC 3339.
#[test]
fn a_client_reads_every_answer_as_the_server_sent_it() {
    use sluice::server::model::{ErrorBody, Probe, ProbeStatus, rfc3339};
    let dir = test_dir("server-round-trip");
    let server = ServerProcess::start(&host_config(&dir, ""));
    let a = server.client(Some("token-a"));
    let raw = |path: &str| -> Value {
        let (status, body) = a.request("GET", path, None).unwrap();
        assert_eq!(status, 200, "{path}: {}", String::from_utf8_lossy(&body));
        serde_json::from_slice(&body).unwrap()
    };
    // (`typed` is what the client read, written back.)
    let as_sent = |typed: Value, path: &str| {
        assert_eq!(typed, raw(path), "{path}");
        assert_eq!(
            raw(path),
            raw(&format!("/v1{path}")),
            "{path} and /v1{path}"
        );
    };
    let submitted = a
        .submit(&write_job(&dir, &throttled_wordcount(1, 300, 3000.0)))
        .unwrap();
    assert_eq!(submitted.submitted, rfc3339(submitted.submitted_ms as i64));
    let id = submitted.id.clone();
    wait_for("the job to finish", Duration::from_secs(30), || {
        state(&a, &id) == JobState::Finished
    });
    let trigger_refused = error_of(a.trigger_savepoint(&id));
    assert!(
        trigger_refused.contains("409") && trigger_refused.contains("it is finished"),
        "{trigger_refused}"
    );

    let detail = a.status(&id).unwrap();
    as_sent(
        serde_json::to_value(&detail).unwrap(),
        &format!("/jobs/{id}"),
    );
    assert_eq!(detail.cluster, ClusterStatus::Flag(false));
    assert!(!detail.checkpoints.last.is_empty(), "{detail:?}");
    for checkpoint in &detail.checkpoints.last {
        assert_eq!(checkpoint.triggered, rfc3339(checkpoint.triggered_ms));
    }
    let list = a.list().unwrap();
    as_sent(serde_json::to_value(&list).unwrap(), "/jobs");
    assert_eq!(list.jobs[0].job, detail.job);
    let plugins = a.plugins().unwrap();
    as_sent(serde_json::to_value(&plugins).unwrap(), "/plugins");
    assert_eq!(plugins.plugins.len(), 2, "{plugins:?}");
    for plugin in &plugins.plugins {
        assert_eq!(plugin.uploaded, rfc3339(plugin.uploaded_ms as i64));
    }
    for path in ["/health", "/livez", "/readyz"] {
        let probe: Probe = serde_json::from_value(raw(path)).unwrap();
        assert_eq!(serde_json::to_value(probe).unwrap(), raw(path), "{path}");
        let expected = if path == "/readyz" {
            ProbeStatus::Ready
        } else {
            ProbeStatus::Ok
        };
        assert_eq!(probe.status, expected, "{path}");
    }
    let (status, body) = a.request("GET", "/v1/jobs/nope", None).unwrap();
    assert_eq!(status, 404);
    let error: ErrorBody = serde_json::from_slice(&body).unwrap();
    assert_eq!(error.error, "no job 'nope'");
    assert_eq!(
        serde_json::to_value(&error).unwrap(),
        serde_json::from_slice::<Value>(&body).unwrap()
    );
    // Control answers: a summary, as the server sent it.
    let (status, body) = a
        .request("DELETE", &format!("/v1/jobs/{id}"), None)
        .unwrap();
    assert_eq!(status, 200);
    let deleted: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(deleted, serde_json::to_value(&detail.job).unwrap());
}

/// A savepoint triggered without waiting is in progress, then completed with the name of
/// a savepoint folder the job can start from; a job that does not checkpoint fails it
/// with the reason. The command line does the same, polling for it.
#[test]
fn a_triggered_savepoint_completes_with_its_location_or_fails_with_the_reason() {
    use sluice::server::model::TriggerStatus;
    let dir = test_dir("server-savepoint-trigger");
    let server = ServerProcess::start(&host_config(&dir, ""));
    let a = server.client(Some("token-a"));
    let id = a
        .submit(&write_job(&dir, &throttled_wordcount(1, 100_000, 500.0)))
        .unwrap()
        .id;
    wait_for("a checkpoint", Duration::from_secs(30), || {
        a.status(&id).unwrap().checkpoints.completed > 0
    });
    let (status, body) = a
        .request("POST", &format!("/v1/jobs/{id}/savepoints"), None)
        .unwrap();
    assert_eq!(status, 202, "{}", String::from_utf8_lossy(&body));
    let request: sluice::server::model::SavepointTriggered = serde_json::from_slice(&body).unwrap();
    let mut seen = Vec::new();
    let done = {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let status = a.savepoint_status(&id, &request.request_id).unwrap();
            seen.push(status.status);
            if status.status != TriggerStatus::InProgress {
                break status;
            }
            assert!(Instant::now() < deadline, "still in progress: {seen:?}");
            thread::sleep(Duration::from_millis(5));
        }
    };
    // Asked at once, it was in progress; then it completed.
    assert_eq!(seen[0], TriggerStatus::InProgress, "{seen:?}");
    assert_eq!(done.status, TriggerStatus::Completed, "{done:?}");
    assert_eq!(done.error, None);
    let location = done.location.clone().unwrap();
    let folder = dir
        .join("registry/jobs")
        .join(&id)
        .join("checkpoints")
        .join(&location);
    assert!(
        location.starts_with("savepoint-") && folder.is_dir(),
        "{}",
        folder.display()
    );
    // Asked again, it is still there, the same.
    assert_eq!(a.savepoint_status(&id, &request.request_id).unwrap(), done);
    let e = error_of(a.savepoint_status(&id, "no-such-request"));
    assert!(
        e.contains("404") && e.contains("no savepoint request"),
        "{e}"
    );
    // Through the old blocking route too, and the command line (which polls).
    assert!(
        a.savepoint(&id)
            .unwrap()
            .savepoint
            .starts_with("savepoint-")
    );
    let cli = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_sluice-test-cli"))
            .args(args)
            .args(["--server", &server.url, "--token", "token-a"])
            .env_remove("SLUICE_TOKEN")
            .output()
            .unwrap()
    };
    let out = cli(&["savepoint", &id]);
    let printed = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        out.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let folder = dir
        .join("registry/jobs")
        .join(&id)
        .join("checkpoints")
        .join(&printed);
    assert!(
        printed.starts_with("savepoint-") && folder.is_dir(),
        "{printed}"
    );
    // The job ran on; stopped, it starts from the triggered savepoint (with rewind: the
    // output went on after it).
    assert_eq!(state(&a, &id), JobState::Running);
    a.stop(&id, false).unwrap();
    let path = format!("/v1/jobs/{id}/start?savepoint={location}&allow_rewind=true");
    let (status, body) = a.request("POST", &path, None).unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    a.cancel(&id).unwrap();

    // A job that does not checkpoint: accepted, then failed with the job's reason.
    let text = throttled_wordcount(1, 100_000, 500.0).replace(
        "[checkpoint]\ninterval_ms = 100\ndir = \"checkpoints\"\n",
        "",
    );
    let id = a.submit(&write_job(&dir, &text)).unwrap().id;
    let request = a.trigger_savepoint(&id).unwrap().request_id;
    let mut failed = None;
    wait_for("the request to fail", Duration::from_secs(30), || {
        let status = a.savepoint_status(&id, &request).unwrap();
        assert_ne!(status.status, TriggerStatus::Completed, "{status:?}");
        failed = Some(status).filter(|s| s.status == TriggerStatus::Failed);
        failed.is_some()
    });
    let error = failed.unwrap().error.unwrap();
    assert!(
        error.contains(&format!("the savepoint of job '{id}' failed"))
            && error.contains("a savepoint needs a [checkpoint] table"),
        "{error}"
    );
    let e = error_of(a.savepoint(&id));
    assert!(
        e.contains("409") && e.contains("needs a [checkpoint] table"),
        "{e}"
    );
    let out = cli(&["savepoint", &id]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("a savepoint needs a [checkpoint] table"),
        "{stderr}"
    );
    a.cancel(&id).unwrap();
}

/// `/livez` answers as soon as the server listens; `/readyz` and the API answer 503
/// until it resumed its registry's jobs, and `/readyz` again once it shuts down.
#[test]
fn the_server_is_live_at_once_ready_once_it_resumed_its_jobs_and_not_while_stopping() {
    use sluice::server::model::ProbeStatus;
    use sluice::server::{Server, serve};
    use sluice::tenant::HostConfig;
    let dir = test_dir("server-readiness");
    let host = HostConfig::load(&host_config(&dir, "")).unwrap();
    let server = Server::load(host, sluice_tests::engine()).unwrap();
    let running = serve(server.clone(), "127.0.0.1:0").unwrap();
    let a = Client::new(&running.url(), Some("token-a".into()));
    let probe = |path: &str| {
        let (status, body) = a.request("GET", path, None).unwrap();
        let probe: sluice::server::model::Probe = serde_json::from_slice(&body).unwrap();
        (status, probe.status)
    };
    assert_eq!(probe("/livez"), (200, ProbeStatus::Ok));
    assert_eq!(probe("/readyz"), (503, ProbeStatus::Starting));
    let e = error_of(a.list());
    assert!(e.contains("503") && e.contains("is starting"), "{e}");
    assert!(error_of(a.ready()).contains("503"));

    server.resume_jobs().unwrap();
    assert_eq!(probe("/readyz"), (200, ProbeStatus::Ready));
    assert_eq!(a.ready().unwrap().status, ProbeStatus::Ready);
    assert_eq!(a.list().unwrap().jobs, []);

    server.shutdown(Duration::from_secs(10));
    assert_eq!(probe("/readyz"), (503, ProbeStatus::ShuttingDown));
    assert_eq!(probe("/livez"), (200, ProbeStatus::Ok));
    let e = error_of(a.submit(&write_job(&dir, &throttled_wordcount(1, 10, 100.0))));
    assert!(e.contains("409") && e.contains("shutting down"), "{e}");
    running.shutdown(Duration::from_secs(10)).unwrap();
}

/// `sluice savepoint JOB.toml` stays the local command when the client's variables are
/// set for the other commands: only `--server` makes it a server's (the token and CA
/// variables once made clap demand `--server`).
#[test]
fn a_local_savepoint_stays_local_whatever_the_clients_variables_say() {
    let dir = test_dir("server-savepoint-local");
    let job = write_job(&dir, &throttled_wordcount(1, 10, 100.0));
    let out = Command::new(env!("CARGO_BIN_EXE_sluice-test-cli"))
        .args(["savepoint", job.to_str().unwrap()])
        .env("SLUICE_SERVER", "http://127.0.0.1:9")
        .env("SLUICE_TOKEN", "token-a")
        .env("SLUICE_CA_CERT", dir.join("no-such.pem"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // No `sluice run` runs it: the local command says so (not a usage error, nor a
    // request to the server).
    assert_eq!(out.status.code(), Some(69), "{stderr}");
    assert!(
        !stderr.contains("127.0.0.1:9") && !stderr.contains("--server"),
        "{stderr}"
    );
}

/// An operator stuck in one call stands out from a busy one: the job's detail, `sluice
/// status`, `/metrics` and the dashboard's data show the call and how long it has run.
#[test]
fn an_operator_stuck_in_one_call_shows_the_call_and_its_time() {
    let dir = test_dir("server-stuck-call");
    let server = ServerProcess::start(&host_config(&dir, ""));
    let a = server.client(Some("token-a"));
    // Each record takes 20 s of `process` (under the 30 s call deadline).
    let job = format!(
        r#"
name = "stuck"
[source]
type = "generator"
records = 5
[[operator]]
name = "slow"
plugin = "{}"
config = {{ behavior = "slow-process", delay-ms = 20000 }}
[sink]
type = "file"
path = "out.txt"
"#,
        sluice_tests::plugins::TEST_MISBEHAVE
    );
    let id = a.submit(&write_job(&dir, &job)).unwrap().id;
    let in_call = || {
        let detail = a.status(&id).unwrap();
        detail
            .tasks
            .iter()
            .flat_map(|t| &t.operators)
            .find(|o| o.operator == "slow")
            .and_then(|o| o.in_call.clone())
    };
    wait_for("a call of two seconds", Duration::from_secs(60), || {
        in_call().is_some_and(|c| c.running_ms >= 2000)
    });
    let call = in_call().unwrap();
    assert_eq!(call.call, "process");
    let status = status_text(&server, &id);
    assert!(
        status.contains("slow has been in one `process` call for "),
        "{status}"
    );
    let metrics = String::from_utf8(a.metrics().unwrap()).unwrap();
    let seconds: f64 = metrics
        .lines()
        .find(|l| l.starts_with("sluice_operator_call_seconds{") && l.contains("operator=\"slow\""))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(seconds >= 2.0, "{seconds}");
    a.cancel(&id).unwrap();
}

/// A job's exception history: each failed attempt with its time, attempt, kind and
/// error, newest first, kept across the job's restarts and a restart of the server, and
/// shown by `sluice status`.
#[test]
fn a_jobs_failures_are_kept_in_its_exception_history() {
    let dir = test_dir("server-exceptions");
    let config = host_config(&dir, "");
    let server = ServerProcess::start(&config);
    let a = server.client(Some("token-a"));
    // Fails in its first two attempts, then finishes.
    let job = sluice_tests::twice_failing_job();
    let id = a.submit(&write_job(&dir, &job)).unwrap().id;
    wait_for("the job to finish", Duration::from_secs(60), || {
        state(&a, &id) == JobState::Finished
    });
    let check = |client: &Client| {
        let detail = client.status(&id).unwrap();
        let attempts: Vec<u32> = detail.exceptions.iter().map(|e| e.attempt).collect();
        assert_eq!(attempts, [1, 0], "{:?}", detail.exceptions);
        for e in &detail.exceptions {
            assert_eq!(e.kind, "error");
            assert!(
                e.error.contains("operator 'flaky'")
                    && e.error.contains("deliberate error in process"),
                "{}",
                e.error
            );
            assert!(e.at.starts_with("20"), "{}", e.at);
        }
        assert!(detail.exceptions[0].at_ms >= detail.exceptions[1].at_ms);
        // Its sink committed each of the 50 records once, whatever the failed attempts
        // wrote before their checkpoints.
        assert_eq!(detail.records_committed, Some(50));
    };
    check(&a);
    let status = status_text(&server, &id);
    assert!(
        status.contains("failures, newest first (2 kept):")
            && status.contains(" attempt 1 (error): ")
            && status.contains(", committed 50; restarts 2"),
        "{status}"
    );
    // A server started again on the same registry still has them.
    server.terminate();
    let server = ServerProcess::start(&config);
    check(&server.client(Some("token-a")));
}

/// `sluice status ID` against `server`, as tenant `a`, as it prints it.
fn status_text(server: &ServerProcess, id: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice-test-cli"))
        .args(["status", id])
        .env("SLUICE_SERVER", &server.url)
        .env("SLUICE_TOKEN", "token-a")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}
