//! A bounded load test of `sluice serve` on loopback: concurrent job submissions, then
//! concurrent status polls and listings while those jobs run. Prints latency percentiles
//! per kind of request, against `GET /health` (routing and HTTP alone) as the baseline.
//!
//! `cargo bench -p sluice-tests --bench server`
//! (`SLUICE_BENCH_CLIENTS`, default 8; `SLUICE_BENCH_REQUESTS` per client, default 200)

use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use sluice::server::client::Client;
use sluice::server::model::JobState;
use sluice::server::{Server, serve, token_sha256};
use sluice::tenant::HostConfig;
use sluice_tests::plugins::{COUNT, TOKENIZE};
use sluice_tests::{engine, test_dir};

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn percentiles(mut times: Vec<Duration>) -> [Duration; 4] {
    times.sort();
    let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    [at(0.5), at(0.9), at(0.99), *times.last().unwrap()]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Runs `requests` calls of `f` on each of `clients` threads; returns every latency.
fn load(
    url: &str,
    clients: usize,
    requests: usize,
    f: impl Fn(&Client, usize) + Sync,
) -> Vec<Duration> {
    thread::scope(|s| {
        let handles: Vec<_> = (0..clients)
            .map(|c| {
                let f = &f;
                s.spawn(move || {
                    let client = Client::new(url, Some("token".into()));
                    (0..requests)
                        .map(|i| {
                            let start = Instant::now();
                            f(&client, c * requests + i);
                            start.elapsed()
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    })
}

fn main() {
    let clients = env("SLUICE_BENCH_CLIENTS", 8);
    let requests = env("SLUICE_BENCH_REQUESTS", 200);
    let dir = test_dir("bench-server");
    let config = dir.join("host.toml");
    let hash: String = token_sha256("token")
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    std::fs::write(
        &config,
        format!(
            "[server]\ndir = \"registry\"\n[tenant.t]\ntoken_sha256 = \"{hash}\"\nmax_jobs = 100000\nmax_instances = 100000\n"
        ),
    )
    .unwrap();
    let host = HostConfig::load(&config).unwrap();
    let server = Server::open(host, engine()).unwrap();
    let running = serve(server, "127.0.0.1:0").unwrap();
    let url = format!("http://{}", running.address());

    let admin = Client::new(&url, Some("token".into()));
    admin.upload_plugin(std::path::Path::new(TOKENIZE)).unwrap();
    admin.upload_plugin(std::path::Path::new(COUNT)).unwrap();
    let job = r#"
name = "small"
[source]
type = "generator"
records = 2000
rate = 1000.0
[[operator]]
name = "tokenize"
plugin = "tokenize.wasm"
[[operator]]
name = "count"
plugin = "count.wasm"
key_by = "key"
[sink]
type = "file"
path = "counts.tsv"
[checkpoint]
interval_ms = 500
"#;
    let submissions = (clients * 4).min(64);
    println!(
        "server load on loopback: {clients} clients; {submissions} submissions, then {} polls",
        clients * requests
    );
    let health = load(&url, clients, requests, |c, _| {
        let (status, _) = c.request("GET", "/health", None).unwrap();
        assert_eq!(status, 200);
    });
    let per_client = submissions.div_ceil(clients);
    let submit = load(&url, clients, per_client, |c, _| {
        let (status, body) = c.request("POST", "/jobs", Some(job.as_bytes())).unwrap();
        assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    });
    let ids: Vec<String> = admin
        .list()
        .unwrap()
        .jobs
        .into_iter()
        .map(|j| j.job.id)
        .collect();
    let ids = Arc::new(ids);
    let status = load(&url, clients, requests, |c, i| {
        c.status(&ids[i % ids.len()]).unwrap();
    });
    let list = load(&url, clients, requests / 4, |c, _| {
        c.list().unwrap();
    });
    let running_jobs = admin
        .list()
        .unwrap()
        .jobs
        .iter()
        .filter(|j| j.job.state == JobState::Running)
        .count();
    let base = percentiles(health.clone())[0];
    println!(
        "{:<28} {:>7} {:>9} {:>9} {:>9} {:>9} {:>12}",
        "request", "count", "p50 ms", "p90 ms", "p99 ms", "max ms", "p50/health"
    );
    for (name, times) in [
        ("GET /health (baseline)", health),
        ("POST /jobs (submit)", submit),
        ("GET /jobs/ID (status)", status),
        (&*format!("GET /jobs ({} jobs)", ids.len()), list),
    ] {
        let n = times.len();
        let [p50, p90, p99, max] = percentiles(times);
        println!(
            "{name:<28} {n:>7} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>12.1}",
            ms(p50),
            ms(p90),
            ms(p99),
            ms(max),
            p50.as_secs_f64() / base.as_secs_f64()
        );
    }
    println!(
        "({running_jobs} of {} jobs still running during the polls)",
        ids.len()
    );
    running.shutdown(Duration::from_secs(60)).unwrap();
}
