//! Worker processes: a tenant's jobs on a server (or in a `sluice run` of several
//! tenants' jobs) run in a process of its own, so that a failure the in-process limits
//! miss — an abort, an allocation past the process's memory limit — kills that tenant's
//! worker only. The other tenant's job completes
//! exactly once without a restart, the server answers throughout, and the victim's job
//! restarts from its checkpoints and then, crashing again, is quarantined.

use std::time::Duration;

use sluice::server::model::JobState;
use sluice_tests::plugins::{COUNT, TEST_HOG, TOKENIZE};
use sluice_tests::{test_dir, throttled_wordcount, write_job};

use crate::server::{ServerProcess, error_of, failure_free_output, host_config_with, wait_for};

/// Tenant `a`'s crashing job: checkpoints often and restarts quickly, many times.
fn restarting(text: &str) -> String {
    format!("{text}\n[restart]\nstrategy = \"fixed-delay\"\nattempts = 20\ndelay_ms = 50\n")
}

/// Starts tenant `b`'s job (the bystander), runs `attack` against tenant `a`, and checks
/// that `a`'s job ends quarantined for `cause` while `b`'s completes exactly once with no
/// restart.
fn bystander_survives(
    name: &str,
    server_env: &[(&str, &str)],
    extra_a: &str,
    attack: &str,
    cause: &str,
) {
    let dir = test_dir(name);
    let config = host_config_with(&dir, "", extra_a);
    let server = ServerProcess::start_with(&config, server_env);
    let (a, b) = (
        server.client(Some("token-a")),
        server.client(Some("token-b")),
    );
    let bystander = throttled_wordcount(1, 6000, 1500.0);
    let b_dir = dir.join("b");
    std::fs::create_dir_all(&b_dir).unwrap();
    let b_id = b.submit(&write_job(&b_dir, &bystander)).unwrap().id;
    let a_id = a.submit(&write_job(&dir, attack)).unwrap().id;

    // The server answers throughout: each poll is a request.
    wait_for(
        "the attacker's job to be quarantined",
        Duration::from_secs(90),
        || {
            let s = a.status(&a_id).unwrap();
            assert!(
                matches!(s.job.state, JobState::Running | JobState::Quarantined),
                "{s:?}"
            );
            s.job.state == JobState::Quarantined
        },
    );
    let detail = a.status(&a_id).unwrap();
    let why = detail.last_failure.clone().unwrap_or_default();
    assert!(
        why.contains("the worker process of tenant 'a'") && why.contains(cause),
        "{why}"
    );
    assert!(why.contains("quarantined"), "{why}");
    // It restarted after each death before it was quarantined.
    assert!(detail.restarts >= 2, "{detail:?}");
    assert!(
        detail.failures_by_kind.get("worker").copied().unwrap_or(0) >= 3,
        "{detail:?}"
    );
    // Submitting it again does not evade the quarantine.
    let again = error_of(a.submit(&write_job(&dir, attack)));
    assert!(again.contains("quarantined"), "{again}");

    wait_for("the bystander to finish", Duration::from_secs(90), || {
        b.status(&b_id).unwrap().job.state == JobState::Finished
    });
    let detail = b.status(&b_id).unwrap();
    assert_eq!(detail.restarts, 0, "{detail:?}");
    assert!(detail.failures_by_kind.is_empty(), "{detail:?}");
    let output = String::from_utf8(b.output(&b_id, None).unwrap()).unwrap();
    assert_eq!(output, failure_free_output(&bystander));
}

#[test]
fn a_worker_that_aborts_takes_down_only_its_tenants_job_which_restarts_then_quarantines() {
    bystander_survives(
        "worker-abort",
        &[("FAILPOINTS", "worker::report=return(a)")],
        "",
        &restarting(&throttled_wordcount(1, 1_000_000, 2000.0)),
        "SIGABRT",
    );
}

#[test]
fn a_worker_past_its_memory_limit_dies_alone_and_its_job_is_quarantined() {
    // 16 KiB of keyed state per value, a hundred per record: the state limits allow it
    // (4 GiB), the worker's memory (256 MiB) does not.
    let attack = restarting(&format!(
        r#"
name = "bomb"
[source]
type = "generator"
records = 1000000
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
config = {{ hog = "values" }}
[sink]
type = "file"
path = "out.txt"
[checkpoint]
interval_ms = 100
dir = "checkpoints"
"#
    ));
    bystander_survives(
        "worker-memory",
        &[],
        "process_memory_mb = 256\nstate_mb = 4096\ntenant_state_mb = 4096",
        &attack,
        "died",
    );
}

/// The processes whose parent is `pid`.
pub(crate) fn children(pid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        // `pid (comm) state ppid …`: comm may hold spaces, so read after its `)`.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid == Some(pid) {
            found.push(child);
        }
    }
    found
}

/// A line of `/proc/PID/FILE` that starts with `key`.
fn proc_line(pid: u32, file: &str, key: &str) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/{file}"))
        .unwrap()
        .lines()
        .find(|l| l.starts_with(key))
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/{file}"))
        .to_string()
}

#[test]
fn a_tenants_jobs_run_in_one_worker_under_its_limits_which_ends_with_its_last_job() {
    let dir = test_dir("worker-limits");
    let config = host_config_with(&dir, "", "process_memory_mb = 3000\nopen_files = 500");
    let server = ServerProcess::start(&config);
    let a = server.client(Some("token-a"));
    let text = throttled_wordcount(1, 1_000_000, 1000.0);
    let first = a.submit(&write_job(&dir, &text)).unwrap().id;
    let second_dir = dir.join("second");
    std::fs::create_dir_all(&second_dir).unwrap();
    let second = a.submit(&write_job(&second_dir, &text)).unwrap().id;
    for id in [&first, &second] {
        wait_for("the job to read", Duration::from_secs(30), || {
            a.status(id).unwrap().records_read > 0
        });
    }
    // One worker for the tenant's two jobs, and nothing of theirs in the server.
    let workers = children(server.pid());
    assert_eq!(workers.len(), 1, "{workers:?}");
    let worker = workers[0];
    let cmdline = std::fs::read_to_string(format!("/proc/{worker}/cmdline")).unwrap();
    assert!(cmdline.contains("worker\0--host-config"), "{cmdline:?}");
    assert!(cmdline.ends_with("--tenant\0a\0"), "{cmdline:?}");
    let server_threads = std::fs::read_dir(format!("/proc/{}/task", server.pid()))
        .unwrap()
        .flatten()
        .map(|t| std::fs::read_to_string(t.path().join("comm")).unwrap())
        .collect::<Vec<_>>();
    assert!(
        !server_threads
            .iter()
            .any(|t| t.starts_with("source") || t.starts_with("tokenize")),
        "{server_threads:?}"
    );
    // Its limits: memory and files from the tenant's quotas, no core files, no new
    // privileges, and a system-call filter.
    let data = proc_line(worker, "limits", "Max data size");
    assert!(data.contains(&(3000u64 << 20).to_string()), "{data}");
    let files = proc_line(worker, "limits", "Max open files");
    assert!(files.split_whitespace().any(|w| w == "500"), "{files}");
    let core = proc_line(worker, "limits", "Max core file size");
    assert!(core.split_whitespace().nth(4) == Some("0"), "{core}");
    assert_eq!(proc_line(worker, "status", "NoNewPrivs"), "NoNewPrivs:\t1");
    assert_eq!(proc_line(worker, "status", "Seccomp:"), "Seccomp:\t2");
    let adj = std::fs::read_to_string(format!("/proc/{worker}/oom_score_adj")).unwrap();
    assert_eq!(adj.trim(), "500");

    // The worker lives while one of its jobs runs, and ends with the last.
    a.cancel(&first).unwrap();
    assert_eq!(a.status(&second).unwrap().job.state, JobState::Running);
    assert_eq!(children(server.pid()), vec![worker]);
    a.cancel(&second).unwrap();
    wait_for("the worker to exit", Duration::from_secs(30), || {
        children(server.pid()).is_empty()
    });
}

#[test]
fn an_upload_that_compiles_past_the_deadline_is_refused_apart_from_the_server() {
    let dir = test_dir("worker-compile");
    let config = host_config_with(&dir, "compile_deadline_ms = 1", "");
    // An empty compile cache: the plugin really compiles (hundreds of milliseconds).
    let cache = dir.join("cache");
    let server =
        ServerProcess::start_with(&config, &[("SLUICE_CACHE_DIR", cache.to_str().unwrap())]);
    let a = server.client(Some("token-a"));
    let e = error_of(a.upload_plugin(std::path::Path::new(COUNT)));
    assert!(
        e.contains("400") && e.contains("count.wasm: compiling it took longer than 1 ms"),
        "{e}"
    );
    assert!(a.plugins().unwrap().plugins.is_empty());
    // Not a component at all: refused with the reason, which names the file.
    let bad = dir.join("bad.wasm");
    std::fs::write(&bad, b"not wasm").unwrap();
    let e = error_of(a.upload_plugin(&bad));
    assert!(
        e.contains("400") && e.contains("bad.wasm is not a WebAssembly file"),
        "{e}"
    );
    assert!(!e.contains(".incoming"), "{e}");
    // The server answers, and compiles nothing itself: its compile cache is as empty as
    // before.
    assert!(
        server
            .client(Some("token-b"))
            .plugins()
            .unwrap()
            .plugins
            .is_empty()
    );
    let cached = std::fs::read_dir(&cache).map_or(0, |d| d.count());
    assert_eq!(cached, 0);
    // Each refusal cost a compile: after 20 in 10 minutes, uploads are refused unseen.
    for _ in 2..20 {
        assert!(error_of(a.upload_plugin(&bad)).contains("400"));
    }
    let e = error_of(a.upload_plugin(&bad));
    assert!(
        e.contains("429") && e.contains("tenant 'a' had 20 plugin uploads refused"),
        "{e}"
    );
    let e = error_of(server.client(Some("token-b")).upload_plugin(&bad));
    assert!(e.contains("400"), "{e}");
}

#[test]
fn a_worker_that_stops_answering_is_killed_and_its_job_resumes_exactly_once() {
    let dir = test_dir("worker-silent");
    let config = host_config_with(&dir, "worker_timeout_ms = 1000", "");
    let server = ServerProcess::start(&config);
    let (a, b) = (
        server.client(Some("token-a")),
        server.client(Some("token-b")),
    );
    let text = throttled_wordcount(1, 3000, 1000.0);
    let b_dir = dir.join("b");
    std::fs::create_dir_all(&b_dir).unwrap();
    let b_id = b.submit(&write_job(&b_dir, &text)).unwrap().id;
    let a_id = a.submit(&write_job(&dir, &text)).unwrap().id;
    wait_for("a checkpoint of a's job", Duration::from_secs(30), || {
        a.status(&a_id).unwrap().checkpoints.completed >= 1
    });
    // Freeze a's worker (the one whose command line names tenant a).
    let frozen = children(server.pid())
        .into_iter()
        .find(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.ends_with("--tenant\0a\0"))
        })
        .expect("a's worker");
    // SAFETY: kill(2) on a child of the server this test started.
    unsafe { libc::kill(frozen as i32, libc::SIGSTOP) };
    wait_for("a's job to finish", Duration::from_secs(60), || {
        a.status(&a_id).unwrap().job.state == JobState::Finished
    });
    let detail = a.status(&a_id).unwrap();
    assert_eq!(
        detail.failures_by_kind.get("worker"),
        Some(&1),
        "{detail:?}"
    );
    assert_eq!(detail.restarts, 1, "{detail:?}");
    let expected = failure_free_output(&text);
    let output = String::from_utf8(a.output(&a_id, None).unwrap()).unwrap();
    assert_eq!(output, expected);
    // The frozen worker is gone, killed.
    assert!(
        !std::path::Path::new(&format!("/proc/{frozen}")).exists() || {
            let stat = std::fs::read_to_string(format!("/proc/{frozen}/stat")).unwrap_or_default();
            stat.contains(") Z ")
        }
    );
    wait_for("b's job to finish", Duration::from_secs(60), || {
        b.status(&b_id).unwrap().job.state == JobState::Finished
    });
    let detail = b.status(&b_id).unwrap();
    assert_eq!(detail.restarts, 0, "{detail:?}");
    assert_eq!(
        String::from_utf8(b.output(&b_id, None).unwrap()).unwrap(),
        expected
    );
}

/// `sluice run` with jobs of two tenants runs each tenant's in a worker process of its
/// own: tenant `a`'s worker aborts after every checkpoint, and its job restarts and is
/// then quarantined, while tenant `b`'s job, in the same run, finishes exactly once
/// without a restart.
#[test]
fn a_run_of_two_tenants_loses_only_the_crashing_tenants_job() {
    let dir = test_dir("run-workers");
    let tenant = |tenant: &str, text: &str| {
        text.replacen(
            "name = \"killable\"",
            &format!("name = \"{tenant}-job\"\ntenant = \"{tenant}\""),
            1,
        )
    };
    let attack = tenant("a", &restarting(&throttled_wordcount(1, 1_000_000, 2000.0)));
    let bystander = throttled_wordcount(1, 6000, 1500.0);
    let (a_dir, b_dir) = (dir.join("a"), dir.join("b"));
    std::fs::create_dir_all(&a_dir).unwrap();
    std::fs::create_dir_all(&b_dir).unwrap();
    let a_job = write_job(&a_dir, &attack);
    let b_job = write_job(&b_dir, &tenant("b", &bystander));
    let host = dir.join("host.toml");
    std::fs::write(&host, "[tenant.a]\n[tenant.b]\n").unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_sluice-test-cli"))
        .args(["--log", "info", "run", "--json", "--host-config"])
        .args([&host, &a_job, &b_job])
        .env(
            "SLUICE_CACHE_DIR",
            sluice_tests::scratch_root().join("cache"),
        )
        .env("FAILPOINTS", "worker::report=return(a)")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let summary: serde_json::Value =
        serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}: {stderr}"));
    // One worker per tenant, then new ones for `a`'s restarts.
    assert!(
        stderr.contains("worker process started tenant=b"),
        "{stderr}"
    );
    assert!(
        stderr.contains("worker process started tenant=a"),
        "{stderr}"
    );
    let job = |name: &str| {
        summary["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|j| j["job"] == name)
            .unwrap_or_else(|| panic!("no {name} in {summary}"))
            .clone()
    };
    let (a, b) = (job("a-job"), job("b-job"));
    assert_eq!(a["outcome"], "failed", "{a}");
    let why = a["error"].as_str().unwrap();
    assert!(
        why.contains("the worker process of tenant 'a'") && why.contains("SIGABRT"),
        "{why}"
    );
    assert!(why.contains("quarantined"), "{why}");
    assert!(a["restarts"].as_u64().unwrap() >= 2, "{a}");
    assert!(a["failures"]["worker"].as_u64().unwrap() >= 3, "{a}");
    // The run exits with the failed job's status.
    assert_eq!(output.status.code(), Some(70), "{stderr}");

    assert_eq!(b["outcome"], "finished", "{b}");
    assert_eq!(b["restarts"], 0, "{b}");
    assert_eq!(b["records_read"], 6000, "{b}");
    let counts = std::fs::read_to_string(b_dir.join("out/counts.tsv")).unwrap();
    assert_eq!(counts, failure_free_output(&bystander));
}
