//! Running `sluice serve` from a test: the server process, a host configuration with two
//! tenants, and the waits and errors every server test reads.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use sluice::server::client::Client;
use sluice::server::model::JobState;
use sluice::server::token_sha256;
use sluice_tests::{run_job, scratch_root, test_dir, write_job};

/// A `sluice serve` child process; killed when dropped.
pub(crate) struct ServerProcess {
    child: Child,
    pub(crate) url: String,
}

impl ServerProcess {
    /// Starts a server with `host_config`; returns once it resumed its jobs and
    /// answers.
    pub(crate) fn start(host_config: &Path) -> ServerProcess {
        Self::start_with(host_config, &[])
    }

    /// [`ServerProcess::start`] with these environment variables (e.g. `FAILPOINTS`,
    /// which its worker processes inherit).
    pub(crate) fn start_with(host_config: &Path, env: &[(&str, &str)]) -> ServerProcess {
        let mut child = Command::new(env!("CARGO_BIN_EXE_sluice-test-cli"))
            .args(["serve", "--host-config"])
            .arg(host_config)
            .env("SLUICE_CACHE_DIR", scratch_root().join("cache"))
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawning sluice serve");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let url = line
            .trim()
            .strip_prefix("sluice: serving ")
            .unwrap_or_else(|| panic!("unexpected first line from the server: {line:?}"))
            .to_string();
        // It answers from then on, and is ready once it resumed its jobs.
        line.clear();
        stdout.read_line(&mut line).unwrap();
        assert_eq!(
            line, "sluice: ready\n",
            "unexpected second line from the server"
        );
        ServerProcess { child, url }
    }

    /// A client of it, with `token`.
    pub(crate) fn client(&self, token: Option<&str>) -> Client {
        Client::new(&self.url, token.map(str::to_string))
    }

    /// Its process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL: no chance to stop anything cleanly.
    pub(crate) fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM, and wait for the clean exit.
    pub(crate) fn terminate(mut self) {
        // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().unwrap();
        assert!(status.success(), "sluice serve exited with {status}");
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A host configuration with tenants `a` (token `token-a`) and `b` (`token-b`).
pub(crate) fn host_config(dir: &Path, extra_a: &str) -> PathBuf {
    host_config_with(dir, "", extra_a)
}

/// [`host_config`] with `extra_server` in its `[server]` table.
pub(crate) fn host_config_with(dir: &Path, extra_server: &str, extra_a: &str) -> PathBuf {
    let path = dir.join("host.toml");
    let text = format!(
        r#"
[server]
address = "127.0.0.1:0"
dir = "registry"
max_upload_mb = 8
{extra_server}
[tenant.a]
token_sha256 = "{}"
{extra_a}
[tenant.b]
token_sha256 = "{}"
"#,
        hex(&token_sha256("token-a")),
        hex(&token_sha256("token-b"))
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// The output of the same job run to its end in this process, without failures.
pub(crate) fn failure_free_output(job: &str) -> String {
    let dir = test_dir("server-reference");
    let path = write_job(&dir, &job.replace("\nrate = ", "\n# rate = "));
    run_job(&path).unwrap();
    std::fs::read_to_string(dir.join("out/counts.tsv")).unwrap()
}

/// Polls `done` until it holds; fails the test after `timeout`.
pub(crate) fn wait_for(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(20));
    }
}

pub(crate) fn state(client: &Client, id: &str) -> JobState {
    client.status(id).unwrap().job.state
}

/// The error of a request that should fail, with its causes.
pub(crate) fn error_of<T: std::fmt::Debug>(result: anyhow::Result<T>) -> String {
    format!("{:#}", result.expect_err("the request should fail"))
}
