//! What running each tenant's jobs in a worker process costs: the same jobs submitted to
//! two servers side by side, one with workers (the default) and one with
//! `[server] workers = false` (in the server's process), in alternating pairs. Prints
//! each job's median time from submission to `finished` on both, and their ratio.
//!
//! - words: `generator -> tokenize -> count -> file` (`WORDS` lines, default 2,000,000);
//! - events: `generator (events) -> window -> file`, 10 s tumbling sums over 1,000 keys
//!   (`EVENTS`, default 2,000,000);
//! - start: a job of one record: the time from submission to `finished` is mostly start
//!   and end, so the difference is what a worker adds to a job's start.
//!
//! `cargo bench -p sluice-tests --bench workers` (`RUNS` pairs, default 5)

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use std::io::{BufRead, BufReader};

use sluice::server::client::Client;
use sluice::server::model::JobState;
use sluice::server::token_sha256;
use sluice_tests::bench::env_or;
use sluice_tests::plugins::{COUNT, TOKENIZE, WINDOW};
use sluice_tests::{scratch_root, test_dir, write_job};

/// A `sluice serve` of its own registry; killed when dropped.
struct Served {
    child: Child,
    client: Client,
}

impl Served {
    fn start(dir: &Path, workers: bool) -> Served {
        let hash: String = token_sha256("token")
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let config = dir.join("host.toml");
        std::fs::write(
            &config,
            format!(
                "[server]\naddress = \"127.0.0.1:0\"\ndir = \"registry\"\nworkers = {workers}\n\
                 [tenant.t]\ntoken_sha256 = \"{hash}\"\nmax_jobs = 100000\n"
            ),
        )
        .unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_sluice-test-cli"))
            .args(["serve", "--host-config"])
            .arg(&config)
            .env("SLUICE_CACHE_DIR", scratch_root().join("cache"))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let url = line
            .trim()
            .strip_prefix("sluice: serving ")
            .unwrap()
            .to_string();
        line.clear();
        stdout.read_line(&mut line).unwrap();
        Served {
            child,
            client: Client::new(&url, Some("token".into())),
        }
    }

    /// Submits `job` and waits for it to finish; the time from submission to `finished`.
    fn time(&self, job: &Path) -> Duration {
        let start = Instant::now();
        let id = self.client.submit(job).unwrap().id;
        loop {
            let job = self.client.status(&id).unwrap().job;
            match job.state {
                JobState::Finished if !job.running => break,
                JobState::Finished | JobState::Running => {
                    std::thread::sleep(Duration::from_millis(2))
                }
                other => panic!("job {id} ended {other:?}"),
            }
        }
        let took = start.elapsed();
        self.client.delete_job(&id).unwrap();
        took
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn main() {
    let runs = env_or("RUNS", 5) as usize;
    let words = env_or("WORDS", 2_000_000);
    let events = env_or("EVENTS", 2_000_000);
    let dir = test_dir("bench-workers");
    let jobs = [
        (
            "words",
            format!(
                r#"
name = "words"
[source]
type = "generator"
records = {words}
vocabulary = 1000
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
[[operator]]
name = "count"
plugin = "{COUNT}"
key_by = "key"
config = {{ emit = "final" }}
[sink]
type = "file"
path = "out.tsv"
format = "key-value"
[checkpoint]
interval_ms = 1000
"#
            ),
        ),
        (
            "events",
            format!(
                r#"
name = "events"
[source]
type = "generator"
shape = "events"
records = {events}
keys = 1000
jitter_ms = 2000
timestamp = {{ field = 0 }}
out_of_orderness_ms = 2000
[[operator]]
name = "window"
plugin = "{WINDOW}"
key_by = {{ field = 1 }}
config = {{ kind = "tumbling", size-ms = 10000, aggregate = "sum" }}
[sink]
type = "file"
path = "out.tsv"
format = "key-value"
[checkpoint]
interval_ms = 1000
"#
            ),
        ),
        (
            "start",
            format!(
                r#"
name = "start"
[source]
type = "generator"
records = 1
[[operator]]
name = "tokenize"
plugin = "{TOKENIZE}"
[sink]
type = "file"
path = "out.tsv"
"#
            ),
        ),
    ];
    let in_process = Served::start(&test_dir("bench-workers-in-process"), false);
    let workers = Served::start(&test_dir("bench-workers-workers"), true);
    println!("server jobs in a worker process vs in the server's process, median of {runs} pairs");
    for (name, text) in &jobs {
        let job_dir = dir.join(name);
        std::fs::create_dir_all(&job_dir).unwrap();
        let path = write_job(&job_dir, text);
        // Once each, to compile and cache the plugins.
        in_process.time(&path);
        workers.time(&path);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            a.push(in_process.time(&path));
            b.push(workers.time(&path));
        }
        let (a, b) = (median(a), median(b));
        println!(
            "  {name:<7} in process {:>8.1} ms   in a worker {:>8.1} ms   worker/in-process {:.3}   difference {:+.1} ms",
            a.as_secs_f64() * 1e3,
            b.as_secs_f64() * 1e3,
            b.as_secs_f64() / a.as_secs_f64(),
            (b.as_secs_f64() - a.as_secs_f64()) * 1e3
        );
    }
}
