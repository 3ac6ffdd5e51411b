//! The `sluice` command as a user runs it.

use std::path::Path;
use std::process::{Command, Output};

use sluice_tests::plugins::{COUNT, TEST_HOG, TOKENIZE};
use sluice_tests::{sample_text, scratch_root, test_dir, write_job};

/// Runs `sluice` with `args` and a compile cache in `cache`.
pub fn sluice_with_cache(args: &[&str], cache: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice-test-cli"))
        .args(args)
        .env("SLUICE_CACHE_DIR", cache)
        .env_remove("SLUICE_LOG")
        .output()
        .expect("running sluice")
}

/// Runs `sluice` with `args` and the shared compile cache.
pub fn sluice(args: &[&str]) -> Output {
    sluice_with_cache(args, &scratch_root().join("cache"))
}

/// `(exit code, stdout, stderr)`.
pub fn outcome(o: &Output) -> (Option<i32>, String, String) {
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn run_prints_a_summary_and_where_the_output_went() {
    let dir = test_dir("cli-run");
    std::fs::write(dir.join("in.txt"), sample_text(3, 200)).unwrap();
    let job = write_job(
        &dir,
        &format!(
            r#"
name = "cli"
[source]
type = "file"
path = "in.txt"
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
[[operator]]
name = "count"
plugin = "{COUNT}"
key_by = "key"
[sink]
type = "file"
path = "out/counts.tsv"
format = "key-value"
"#
        ),
    );
    let (code, _, stderr) = outcome(&sluice(&["run", job.to_str().unwrap()]));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("job 'cli' finished"), "{stderr}");
    assert!(stderr.contains("output written to"), "{stderr}");
    assert!(stderr.contains("counts.tsv"), "{stderr}");
    assert!(stderr.contains("tokenize (1)"), "{stderr}");
    assert!(dir.join("out/counts.tsv").exists());
}

#[test]
fn validate_describes_tasks_and_plugins() {
    let dir = test_dir("cli-validate");
    let job = write_job(
        &dir,
        &format!(
            r#"
name = "v"
[source]
type = "generator"
records = 10
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
[[operator]]
name = "count"
plugin = "{COUNT}"
parallelism = 3
key_by = "key"
[sink]
type = "stdout"
"#
        ),
    );
    let (code, stdout, stderr) = outcome(&sluice(&["validate", job.to_str().unwrap()]));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains("job 'v' (tenant 'default') is valid"),
        "{stdout}"
    );
    assert!(stdout.contains("task 0: source -> tokenize x1"), "{stdout}");
    assert!(
        stdout.contains("task 1: count x3\n    <- task 0 'tokenize' (hash) into count input 0"),
        "{stdout}"
    );
    assert!(
        stdout.contains("task 2: sink x1\n    <- task 1 'count' (rebalance) into sink input 0"),
        "{stdout}"
    );
    assert!(
        stdout.contains("sluice:operator/stream-operator@0.3.0"),
        "{stdout}"
    );
}

/// `validate` opens each operator with its config: what `open` refuses is reported, and
/// the command fails, before anything runs.
#[test]
fn validate_reports_what_an_operators_open_refuses() {
    let dir = test_dir("cli-validate-open");
    let job = |tokenize_config: &str, key_by: &str| {
        write_job(
            &dir,
            &format!(
                r#"
name = "v"
[source]
type = "generator"
records = 10
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
config = {{ {tokenize_config} }}
[[operator]]
name = "count"
plugin = "{COUNT}"
{key_by}
[sink]
type = "file"
path = "out/counts.tsv"
"#
            ),
        )
    };
    for ((config, key_by), expected) in [
        (
            ("min-length = \"three\"", "key_by = \"key\""),
            "operator 'tokenize' (subtask 1/1) of job 'v' (tenant 'default'): `open` with the \
             job's config: invalid configuration: config `min-length` = \"three\"",
        ),
        (
            ("", ""),
            "operator 'count' (subtask 1/1) of job 'v' (tenant 'default'): `open` with the \
             job's config: invalid configuration: count needs keyed input",
        ),
    ] {
        let path = job(config, key_by);
        let (code, stdout, stderr) = outcome(&sluice(&["validate", path.to_str().unwrap()]));
        assert_eq!(code, Some(65), "{stdout}{stderr}");
        assert!(stderr.contains(expected), "{stderr}");
        assert!(!stdout.contains("is valid"), "{stdout}");
        // Nothing ran: no output, no checkpoint.
        assert!(!dir.join("out").exists());
    }
}

/// An operator that declares keyed state on unkeyed input fails in `open` whatever it
/// says: the job fails at once, with the fix named, instead of restarting in vain.
#[test]
fn keyed_state_on_unkeyed_input_fails_the_job_without_restarts() {
    let dir = test_dir("cli-unkeyed-state");
    let job = write_job(
        &dir,
        &format!(
            r#"
name = "unkeyed"
[source]
type = "generator"
records = 10
[[operator]]
name = "hog"
plugin = "{TEST_HOG}"
[sink]
type = "stdout"
[restart]
strategy = "fixed-delay"
attempts = 3
delay_ms = 10
"#
        ),
    );
    let (code, _, stderr) = outcome(&sluice(&["run", "--quiet", job.to_str().unwrap()]));
    // A configuration its operator refuses is a bad job file, here as in `validate`.
    assert_eq!(code, Some(65), "{stderr}");
    assert!(!stderr.contains("restarting"), "{stderr}");
    // Printed once: the final error, not also a log line of the task.
    assert_eq!(
        stderr.matches("it declared keyed state").count(),
        1,
        "{stderr}"
    );
    assert!(
        stderr.contains("invalid configuration")
            && stderr.contains("it declared keyed state")
            && stderr.contains("set `key_by` for this operator"),
        "{stderr}"
    );
}

/// `sluice new --lang python|js`: each template makes an operator whose native tests
/// pass (pytest, `node --test`); a Python one builds with the checkout's script and runs
/// its job file.
#[test]
fn new_python_and_javascript_plugins_from_every_template_test_and_run() {
    if sluice_tests::Language::Python.plugin("count").is_none() {
        return; // without the Python tools (scripts/test.sh installs them)
    }
    let dir = test_dir("cli-new-guest");
    let checkout = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let run = |program: &str, args: &[&str], root: &Path, env: &[(&str, String)]| {
        let out = Command::new(program)
            .args(args)
            .current_dir(root)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}: {program} {args:?}: {}{}",
            root.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let sdk_path = [(
        "PYTHONPATH",
        checkout.join("sdk-python").display().to_string(),
    )];
    for template in ["map", "filter", "keyed", "window"] {
        for lang in ["python", "js"] {
            let name = format!("{lang}-{template}");
            let args = [
                "new",
                &name,
                "--lang",
                lang,
                "--template",
                template,
                "--dir",
            ];
            let (code, stdout, stderr) =
                outcome(&sluice(&[&args[..], &[dir.to_str().unwrap()]].concat()));
            assert_eq!(code, Some(0), "{stdout}{stderr}");
            let root = dir.join(&name);
            match lang {
                "python" => run("python3", &["-m", "pytest", "-q"], &root, &sdk_path),
                _ => {
                    run(
                        "npm",
                        &["install", "--silent", "--no-audit", "--no-fund"],
                        &root,
                        &[],
                    );
                    run("npm", &["test", "--silent"], &root, &[]);
                }
            }
        }
    }
    let root = dir.join("python-keyed");
    let script = checkout.join("scripts/build-python-plugin.sh");
    run(
        script.to_str().unwrap(),
        &["python_keyed.py", "python_keyed.wasm"],
        &root,
        &[],
    );
    let job = root.join("job.toml");
    let (code, _, stderr) = outcome(&sluice(&["run", "--quiet", job.to_str().unwrap()]));
    assert_eq!(code, Some(0), "{stderr}");
    let output = std::fs::read_to_string(root.join("out/python-keyed.txt")).unwrap();
    assert_eq!(output.lines().count(), 1000, "a count per generated word");
}

/// `sluice new`: each template makes a crate whose harness tests pass, which builds as
/// a component, passes `validate` and runs its job file.
#[test]
fn new_plugins_from_every_template_test_build_and_run() {
    let dir = test_dir("cli-new");
    // One target folder for all of them: the SDK's dependencies build once.
    let target = scratch_root().join("new-plugins-target");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    for template in ["map", "filter", "keyed", "window"] {
        let name = format!("my-{template}");
        let args = [
            "new",
            &name,
            "--template",
            template,
            "--dir",
            dir.to_str().unwrap(),
        ];
        let (code, stdout, stderr) = outcome(&sluice(&args));
        assert_eq!(code, Some(0), "{stdout}{stderr}");
        let root = dir.join(&name);
        // Built as the project's own plugins are: more inlining for the Wasm target.
        let config = std::fs::read_to_string(root.join(".cargo/config.toml")).unwrap();
        assert!(
            config.contains("[target.wasm32-wasip2]") && config.contains("inline-threshold"),
            "{config}"
        );
        for build in [
            &["test", "--release", "--quiet"][..],
            &["build", "--release", "--quiet", "--target", "wasm32-wasip2"],
        ] {
            let out = Command::new(&cargo)
                .args(build)
                .current_dir(&root)
                .env("CARGO_TARGET_DIR", &target)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{template}: cargo {build:?}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        // Where its job file looks for it.
        let wasm = format!("wasm32-wasip2/release/my_{template}.wasm");
        std::fs::create_dir_all(root.join("target/wasm32-wasip2/release")).unwrap();
        std::fs::copy(target.join(&wasm), root.join("target").join(&wasm)).unwrap();
        let job = root.join("job.toml");
        let (code, stdout, stderr) = outcome(&sluice(&["validate", job.to_str().unwrap()]));
        assert_eq!(code, Some(0), "{template}: {stdout}{stderr}");
        let (code, _, stderr) = outcome(&sluice(&["run", "--quiet", job.to_str().unwrap()]));
        assert_eq!(code, Some(0), "{template}: {stderr}");
        let output = std::fs::read_to_string(root.join(format!("out/{name}.txt"))).unwrap();
        assert!(!output.is_empty(), "{template}: no output");
        // It declares its config keys.
        let (_, stdout, _) = outcome(&sluice(&[
            "inspect",
            root.join("target").join(&wasm).to_str().unwrap(),
        ]));
        assert!(stdout.contains("config:    "), "{stdout}");
        assert!(!stdout.contains("not declared"), "{stdout}");
    }
    // An existing folder is never written over.
    let (code, _, stderr) = outcome(&sluice(&["new", "my-map", "--dir", dir.to_str().unwrap()]));
    assert_eq!(code, Some(1));
    assert!(stderr.contains("exists already"), "{stderr}");
    let (code, _, stderr) = outcome(&sluice(&["new", "9lives", "--dir", dir.to_str().unwrap()]));
    assert_eq!(code, Some(1));
    assert!(stderr.contains("is not a plugin name"), "{stderr}");
}

/// On a terminal, a job whose input size is known shows a bar with its percentage and
/// ETA, and rates; with a stdout sink nothing is drawn between its lines.
#[test]
fn progress_is_a_bar_on_a_terminal_and_never_mixed_into_stdout() {
    let dir = test_dir("cli-progress");
    let job = |sink: &str| {
        format!(
            r#"
name = "progress"
[source]
type = "generator"
records = 4000
rate = 4000.0
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
[sink]
{sink}
"#
        )
    };
    // `script` gives the command a terminal, and copies what it draws.
    let on_terminal = |job: &Path| {
        let command = format!(
            "{} run {}",
            env!("CARGO_BIN_EXE_sluice-test-cli"),
            job.display()
        );
        let out = Command::new("script")
            .args(["-qec", &command, "/dev/null"])
            .env("SLUICE_CACHE_DIR", scratch_root().join("cache"))
            .output()
            .expect("`script` (util-linux) runs a command on a terminal");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let file_job = write_job(&dir, &job("type = \"file\"\npath = \"out/words.txt\""));
    let drawn = on_terminal(&file_job);
    assert!(
        drawn.contains("progress [") && drawn.contains("% eta") && drawn.contains("/s)"),
        "{drawn}"
    );
    let stdout_job = write_job(&dir, &job("type = \"stdout\""));
    let drawn = on_terminal(&stdout_job);
    assert!(
        !drawn.contains("% eta") && !drawn.contains("/s)"),
        "{drawn}"
    );
}

#[test]
fn inspect_shows_the_interface_and_the_second_load_uses_the_cache() {
    let cache = test_dir("cli-cache");
    let (code, stdout, stderr) = outcome(&sluice_with_cache(&["inspect", COUNT], &cache));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains("exports:   sluice:operator/stream-operator@0.3.0"),
        "{stdout}"
    );
    assert!(
        stdout.contains("calls:     open, process, process-watermark, on-timers"),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "types:     timestamp, records, output, opened, processed, snapshot-output, \
             batch-watermark, error, open-context"
        ),
        "{stdout}"
    );
    // Declared with the SDK's `config_keys!`.
    assert!(stdout.contains("config:    format, emit\n"), "{stdout}");
    assert!(
        stdout.contains("imports:") && stdout.contains("sluice:operator/runtime@0.3.0"),
        "{stdout}"
    );
    assert!(stdout.contains("compiled:  Compiled"), "{stdout}");
    let (_, stdout, _) = outcome(&sluice_with_cache(&["inspect", COUNT], &cache));
    assert!(
        stdout.contains("compiled:  Disk"),
        "second run compiled again: {stdout}"
    );
    // Artifacts are native code: from a folder others may write, none is loaded.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o777)).unwrap();
    let (code, stdout, stderr) = outcome(&sluice_with_cache(&["inspect", COUNT], &cache));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("compiled:  Compiled"), "{stdout}");
    assert!(stderr.contains("may be written by others"), "{stderr}");
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o700)).unwrap();
    let (_, stdout, _) = outcome(&sluice_with_cache(&["inspect", COUNT], &cache));
    assert!(stdout.contains("compiled:  Disk"), "{stdout}");
}

#[test]
fn stdout_sink_writes_records_to_stdout() {
    let dir = test_dir("cli-stdout");
    std::fs::write(dir.join("in.txt"), "b a\nb\nb\n").unwrap();
    let job = write_job(
        &dir,
        &format!(
            r#"
name = "s"
[source]
type = "file"
path = "in.txt"
[[operator]]
name = "count"
plugin = "{COUNT}"
key_by = "value"
[sink]
type = "stdout"
format = "key-value"
"#
        ),
    );
    let (code, stdout, stderr) = outcome(&sluice(&["run", "--quiet", job.to_str().unwrap()]));
    assert_eq!(code, Some(0), "{stderr}");
    let mut lines: Vec<&str> = stdout.lines().collect();
    lines.sort();
    assert_eq!(lines, ["b\t1", "b\t2", "b a\t1"]);
}

#[test]
fn several_jobs_run_side_by_side_and_a_failing_one_fails_only_itself() {
    let dir = test_dir("cli-several");
    std::fs::write(dir.join("in.txt"), "a b\nb c\n").unwrap();
    let good = |name: &str| {
        format!(
            r#"
name = "{name}"
tenant = "good"
[source]
type = "file"
path = "in.txt"
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
[[operator]]
name = "count"
plugin = "{COUNT}"
key_by = "key"
[sink]
type = "file"
path = "{name}.tsv"
format = "key-value"
"#
        )
    };
    std::fs::write(dir.join("one.toml"), good("one")).unwrap();
    std::fs::write(dir.join("two.toml"), good("two")).unwrap();
    let bad = good("bad")
        .replace(r#"tenant = "good""#, r#"tenant = "shady""#)
        .replace(
            &format!(r#"plugin = "{COUNT}""#),
            &format!(r#"plugin = "{}""#, sluice_tests::plugins::TEST_MISBEHAVE),
        )
        .replace(
            r#"key_by = "key""#,
            r#"key_by = "key"
config = { behavior = "error-in-process" }"#,
        );
    std::fs::write(dir.join("bad.toml"), bad).unwrap();
    std::fs::write(
        dir.join("host.toml"),
        "jobs = [\"two.toml\", \"bad.toml\"]\n[tenant.good]\nmax_instances = 4\n",
    )
    .unwrap();
    let one = dir.join("one.toml");
    let host = dir.join("host.toml");
    let (code, _, stderr) = outcome(&sluice(&[
        "run",
        one.to_str().unwrap(),
        "--host-config",
        host.to_str().unwrap(),
    ]));
    // The status of the job that failed.
    assert_eq!(code, Some(70), "{stderr}");
    assert!(stderr.contains("error: job 'bad'"), "{stderr}");
    assert!(stderr.contains("deliberate error in process"), "{stderr}");
    assert!(stderr.contains("job 'one' finished"), "{stderr}");
    assert!(stderr.contains("job 'two' finished"), "{stderr}");
    for name in ["one", "two"] {
        let out = std::fs::read_to_string(dir.join(format!("{name}.tsv"))).unwrap();
        let mut lines: Vec<&str> = out.lines().collect();
        lines.sort();
        assert_eq!(lines, ["a\t1", "b\t1", "b\t2", "c\t1"], "{name}");
    }
    assert!(!dir.join("bad.tsv").exists());
    // The per-tenant table.
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with("good") && l.contains(" 2 ")),
        "{stderr}"
    );
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with("shady") && l.contains("error=1")),
        "{stderr}"
    );
}

#[test]
fn tenant_limits_are_enforced_before_a_job_starts() {
    let dir = test_dir("cli-tenant-limits");
    std::fs::write(dir.join("in.txt"), "x\n").unwrap();
    let job = write_job(
        &dir,
        &format!(
            r#"
name = "wide"
tenant = "small"
[source]
type = "file"
path = "in.txt"
[[operator]]
name = "count"
plugin = "{COUNT}"
parallelism = 3
key_by = "value"
[sink]
type = "stdout"
"#
        ),
    );
    std::fs::write(dir.join("host.toml"), "[tenant.small]\nmax_instances = 2\n").unwrap();
    let host = dir.join("host.toml");
    let (code, _, stderr) = outcome(&sluice(&[
        "run",
        job.to_str().unwrap(),
        "--host-config",
        host.to_str().unwrap(),
    ]));
    assert_eq!(code, Some(75), "{stderr}");
    assert!(
        stderr.contains(
            "job 'wide' needs 3 operator instances, but tenant 'small' has 0 of its 2 in use"
        ),
        "{stderr}"
    );
    std::fs::write(
        dir.join("host.toml"),
        "strict_tenants = true\n[tenant.other]\n",
    )
    .unwrap();
    let (code, _, stderr) = outcome(&sluice(&[
        "run",
        job.to_str().unwrap(),
        "--host-config",
        host.to_str().unwrap(),
    ]));
    assert_eq!(code, Some(65), "{stderr}");
    assert!(
        stderr.contains("tenant 'small' is not configured in"),
        "{stderr}"
    );
    assert!(stderr.contains("host.toml"), "{stderr}");
}

#[test]
fn a_closed_stdout_ends_a_command_quietly() {
    // `sluice inspect X | head -1`: the reader is gone before the command writes.
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice-test-cli"))
        .args(["inspect", COUNT])
        .env("SLUICE_CACHE_DIR", scratch_root().join("cache"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(out.status.code(), Some(0), "{stderr}");
}

#[test]
fn a_client_command_without_a_server_says_where_it_looked() {
    let (code, _, stderr) = outcome(&sluice(&["list", "--server", "http://127.0.0.1:9"]));
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("--token TOKEN") && stderr.contains("SLUICE_TOKEN"),
        "{stderr}"
    );
    let (code, _, stderr) = outcome(&sluice(&[
        "list",
        "--server",
        "http://127.0.0.1:9",
        "--token",
        "t",
    ]));
    assert_eq!(code, Some(69));
    assert!(
        stderr.contains("http://127.0.0.1:9/v1/jobs") && stderr.contains("SLUICE_SERVER"),
        "{stderr}"
    );
}

/// `--json` prints one JSON document on stdout with the facts the text shows: for
/// `validate` (also when the job is not valid), `inspect` and `run`.
#[test]
fn validate_inspect_and_run_print_json_for_programs() {
    let dir = test_dir("cli-json");
    let job = write_job(
        &dir,
        &format!(
            r#"
name = "j"
[source]
type = "generator"
records = 500
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
path = "out/counts.tsv"
[checkpoint]
interval_ms = 50
dir = "checkpoints"
"#
        ),
    );
    let job = job.to_str().unwrap();
    let json = |args: &[&str], status: i32| -> serde_json::Value {
        let (code, stdout, stderr) = outcome(&sluice(args));
        assert_eq!(code, Some(status), "{args:?}: {stdout}{stderr}");
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{args:?}: {e}: {stdout}"))
    };

    let v = json(&["validate", job, "--json"], 0);
    assert_eq!(v["valid"], true, "{v:#}");
    assert_eq!((&v["job"], &v["tenant"]), (&"j".into(), &"default".into()));
    assert_eq!(v["tasks"][0]["name"], "source -> tokenize", "{v:#}");
    let count = &v["tasks"][1];
    assert_eq!(
        (&count["name"], &count["parallelism"]),
        (&"count".into(), &2.into())
    );
    let input = &count["inputs"][0];
    assert_eq!(
        (
            &input["from_task"],
            &input["from"],
            &input["partitioner"],
            &input["into"]
        ),
        (
            &0.into(),
            &"tokenize".into(),
            &"hash".into(),
            &"count".into()
        )
    );
    assert_eq!(v["operators"][1]["operator"], "count", "{v:#}");
    assert_eq!(v["operators"][1]["plugin"], COUNT, "{v:#}");
    assert_eq!(v["checkpoint"]["interval_ms"], 50, "{v:#}");
    assert_eq!(v["checkpoint"]["mode"], "exactly-once", "{v:#}");

    let bad = write_job(
        &test_dir("cli-json-bad"),
        "name = \"j\"\n[source]\ntype = \"generator\"\nrecords = -1\n",
    );
    let v = json(&["validate", bad.to_str().unwrap(), "--json"], 65);
    assert_eq!(v["valid"], false, "{v:#}");
    assert!(v["error"].as_str().unwrap().contains("records"), "{v:#}");

    let v = json(&["inspect", COUNT, "--json"], 0);
    assert_eq!(
        v["exports"], "sluice:operator/stream-operator@0.3.0",
        "{v:#}"
    );
    assert_eq!(
        v["config_keys"],
        serde_json::json!(["format", "emit"]),
        "{v:#}"
    );
    assert!(
        v["calls"].as_array().unwrap().contains(&"open".into()),
        "{v:#}"
    );
    assert_eq!(v["sha256"].as_str().unwrap().len(), 64, "{v:#}");
    assert!(v["size"].as_u64().unwrap() > 0, "{v:#}");

    let v = json(&["run", job, "--json"], 0);
    assert_eq!(v["exit_code"], 0, "{v:#}");
    let run = &v["jobs"][0];
    assert_eq!(
        (&run["job"], &run["outcome"]),
        (&"j".into(), &"finished".into())
    );
    assert_eq!(run["records_read"], 500, "{v:#}");
    assert!(run["records_written"].as_u64().unwrap() > 500, "{v:#}");
    assert!(
        run["checkpoints"]["completed"].as_u64().unwrap() >= 1,
        "{v:#}"
    );
    let output = dir.join("out/counts.tsv");
    assert_eq!(run["outputs"][0]["path"], output.to_str().unwrap(), "{v:#}");
    let operators: Vec<&str> = run["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["operators"].as_array().unwrap())
        .map(|o| o["operator"].as_str().unwrap())
        .collect();
    assert_eq!(operators, ["tokenize", "count", "count", "sink"], "{v:#}");
    assert_eq!(v["tenants"][0]["tenant"], "default", "{v:#}");
    assert_eq!(v["tenants"][0]["records_read"], 500, "{v:#}");

    // Run again: refused, and the document says so.
    let v = json(&["run", job, "--json"], 75);
    assert_eq!(v["exit_code"], 75, "{v:#}");
    assert_eq!(v["jobs"][0]["outcome"], "refused", "{v:#}");
    assert!(
        v["jobs"][0]["error"]
            .as_str()
            .unwrap()
            .contains("has run before"),
        "{v:#}"
    );

    // A stdout sink would mix its records into the document.
    let to_stdout = write_job(
        &test_dir("cli-json-stdout"),
        &format!(
            "name = \"s\"\n[source]\ntype = \"generator\"\nrecords = 1\n[[operator]]\n\
             name = \"tokenize\"\nplugin = \"{TOKENIZE}\"\n[sink]\ntype = \"stdout\"\n"
        ),
    );
    let (code, stdout, stderr) = outcome(&sluice(&["run", to_stdout.to_str().unwrap(), "--json"]));
    assert_eq!(code, Some(2), "{stdout}{stderr}");
    assert!(
        stderr.contains("--json prints the summary on stdout"),
        "{stderr}"
    );
}

/// The commands `sluice --help` lists (but `help`).
fn commands() -> Vec<String> {
    let (code, help, _) = outcome(&sluice(&["--help"]));
    assert_eq!(code, Some(0));
    let commands: Vec<String> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect();
    assert!(commands.len() > 10, "{help}");
    commands
}

#[test]
fn completions_and_the_manual_know_every_command() {
    let commands = commands();
    let (code, bash, stderr) = outcome(&sluice(&["completions", "bash"]));
    assert_eq!(code, Some(0), "{stderr}");
    for command in &commands {
        assert!(bash.contains(command.as_str()), "{command} not in:\n{bash}");
    }
    for shell in ["zsh", "fish", "elvish", "powershell"] {
        let (code, script, stderr) = outcome(&sluice(&["completions", shell]));
        assert_eq!(code, Some(0), "{shell}: {stderr}");
        assert!(script.contains("delete-plugin"), "{shell}: {script}");
    }

    let (code, page, stderr) = outcome(&sluice(&["man"]));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        page.starts_with(".ie") && page.contains(".TH sluice 1"),
        "{page}"
    );
    // roff writes a hyphen as `\-`.
    let text = page.replace("\\-", "-");
    for command in &commands {
        assert!(
            text.contains(&format!("sluice-{command}(1)")),
            "{command} not in:\n{page}"
        );
    }
    assert!(
        text.contains(".SH \"EXIT STATUS\"") && text.contains("\\fB75\\fR"),
        "{page}"
    );

    let dir = test_dir("cli-man");
    let (code, _, stderr) = outcome(&sluice(&["man", "--dir", dir.to_str().unwrap()]));
    assert_eq!(code, Some(0), "{stderr}");
    assert!(dir.join("sluice.1").is_file());
    for command in &commands {
        let page = std::fs::read_to_string(dir.join(format!("sluice-{command}.1")))
            .unwrap_or_else(|e| panic!("sluice-{command}.1: {e}"));
        assert!(page.contains(".TH sluice-"), "{page}");
    }
}

/// Every `--host-config` also reads `SLUICE_HOST_CONFIG`.
#[test]
fn the_host_configuration_can_come_from_sluice_host_config() {
    let dir = test_dir("cli-host-env");
    let job = write_job(
        &dir,
        &format!(
            "name = \"e\"\ntenant = \"e\"\n[source]\ntype = \"generator\"\nrecords = 1\n\
             [[operator]]\n\
             name = \"tokenize\"\nplugin = \"{TOKENIZE}\"\n[sink]\ntype = \"stdout\"\n"
        ),
    );
    let host = dir.join("strict.toml");
    std::fs::write(&host, "strict_tenants = true\n[tenant.other]\n").unwrap();
    let validate = |env: Option<&Path>| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_sluice-test-cli"));
        command
            .args(["validate", job.to_str().unwrap()])
            .env("SLUICE_CACHE_DIR", scratch_root().join("cache"))
            .env_remove("SLUICE_HOST_CONFIG");
        if let Some(host) = env {
            command.env("SLUICE_HOST_CONFIG", host);
        }
        outcome(&command.output().unwrap())
    };
    let (code, _, stderr) = validate(None);
    assert_eq!(code, Some(0), "{stderr}");
    let (code, _, stderr) = validate(Some(&host));
    assert_eq!(code, Some(65), "{stderr}");
    assert!(
        stderr.contains("tenant 'e' is not configured in") && stderr.contains("strict.toml"),
        "{stderr}"
    );
    // Shown in each command's help.
    for command in ["run", "validate", "serve", "status"] {
        let (_, help, _) = outcome(&sluice(&[command, "--help"]));
        assert!(help.contains("SLUICE_HOST_CONFIG"), "{command}: {help}");
    }
}

/// Whether `text` has an ANSI colour (SGR) sequence: `ESC [ digits;... m`.
fn has_colour(text: &str) -> bool {
    text.match_indices("\u{1b}[").any(|(at, _)| {
        let rest = &text[at + 2..];
        let params = rest
            .find(|c: char| !(c.is_ascii_digit() || c == ';'))
            .unwrap_or(rest.len());
        rest[params..].starts_with('m')
    })
}

/// `NO_COLOR` set to anything but nothing: no colour anywhere on a terminal (log lines,
/// progress line, summary); unset or empty, log lines are coloured there.
#[test]
fn no_color_turns_colours_off_on_a_terminal() {
    assert!(has_colour("a \u{1b}[2m b") && has_colour("\u{1b}[0;33mx"));
    assert!(!has_colour("\u{1b}[2K\u{1b}[1A plain"));
    let dir = test_dir("cli-no-color");
    let job = write_job(
        &dir,
        &format!(
            r#"
name = "colours"
[source]
type = "generator"
records = 2000
rate = 4000.0
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
[sink]
type = "file"
path = "out/words.txt"
"#
        ),
    );
    // Each run after the first moves the output aside, and logs a warning saying so.
    let (code, _, stderr) = outcome(&sluice(&["run", "--quiet", job.to_str().unwrap()]));
    assert_eq!(code, Some(0), "{stderr}");
    let on_terminal = |no_color: Option<&str>| {
        let command = format!(
            "{} run --fresh {}",
            env!("CARGO_BIN_EXE_sluice-test-cli"),
            job.display()
        );
        let mut script = Command::new("script");
        script
            .args(["-qec", &command, "/dev/null"])
            .env("SLUICE_CACHE_DIR", scratch_root().join("cache"))
            .env_remove("NO_COLOR");
        if let Some(value) = no_color {
            script.env("NO_COLOR", value);
        }
        let out = script
            .output()
            .expect("`script` (util-linux) runs a command on a terminal");
        let drawn = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{drawn}");
        assert!(
            drawn.contains("moved") && drawn.contains("aside"),
            "{drawn}"
        );
        assert!(drawn.contains("job 'colours' finished"), "{drawn}");
        drawn
    };
    let drawn = on_terminal(None);
    assert!(has_colour(&drawn), "no colour without NO_COLOR: {drawn:?}");
    let drawn = on_terminal(Some(""));
    assert!(has_colour(&drawn), "an empty NO_COLOR is unset: {drawn:?}");
    let drawn = on_terminal(Some("1"));
    assert!(!has_colour(&drawn), "colour with NO_COLOR=1: {drawn:?}");
}

/// `sluice run --metrics ADDR` serves the jobs' metrics while they run, named as a
/// server's.
#[test]
fn run_serves_its_jobs_metrics_while_they_run() {
    use std::io::BufRead;
    use std::time::{Duration, Instant};
    let dir = test_dir("cli-metrics");
    let job = write_job(
        &dir,
        &format!(
            r#"
name = "metered"
[source]
type = "generator"
records = 20000
rate = 4000.0
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
[sink]
type = "file"
path = "out/words.txt"
"#
        ),
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice-test-cli"))
        .args(["run", "--quiet", "--metrics", "127.0.0.1:0"])
        .arg(&job)
        .env("SLUICE_CACHE_DIR", scratch_root().join("cache"))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let (lines_tx, lines) = crossbeam_channel::unbounded();
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            let _ = lines_tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(120);
    let url = loop {
        let line = lines
            .recv_deadline(deadline)
            .expect("no `sluice: metrics at` line on stderr");
        if let Some(url) = line.strip_prefix("sluice: metrics at ") {
            break url.to_string();
        }
    };
    assert!(
        url.starts_with("http://127.0.0.1:") && url.ends_with("/metrics"),
        "{url}"
    );
    let records_in = |text: &str| -> f64 {
        text.lines()
            .filter(|l| l.starts_with("sluice_operator_records_in_total{"))
            .filter(|l| {
                l.contains("tenant=\"default\"")
                    && l.contains("job=\"metered\"")
                    && l.contains("operator=\"tokenize\"")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let mut last = String::new();
    loop {
        assert!(
            Instant::now() < deadline,
            "no records counted at {url}:\n{last}"
        );
        if let Ok(mut answer) = ureq::get(&url).call() {
            last = answer.body_mut().read_to_string().unwrap_or_default();
            if records_in(&last) > 0.0 {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        last.contains("# TYPE sluice_operator_records_in counter"),
        "{last}"
    );
    assert!(last.contains("sluice_job_restarts_total{"), "{last}");
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    // The endpoint ends with the jobs.
    assert!(ureq::get(&url).call().is_err());
}
