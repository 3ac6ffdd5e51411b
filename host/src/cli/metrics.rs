//! `sluice run --metrics ADDR`: the run's jobs' metrics at `http://ADDR/metrics` while
//! they run, encoded as a server's `/metrics` encodes its jobs'
//! ([`crate::server::jobs_metrics`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread;

use anyhow::{Context, Result};
use axum::http::header::CONTENT_TYPE;
use axum::routing::get;

use crate::job::JobMonitor;
use crate::server::{JobSample, jobs_metrics};

/// A job of the run, as its metrics label it.
pub(super) struct Scraped {
    pub(super) tenant: String,
    pub(super) job: String,
    pub(super) monitor: Arc<JobMonitor>,
}

/// The endpoint, answering while it lives.
pub(super) struct MetricsEndpoint {
    /// Where it listens (the port chosen when `ADDR` asked for port 0).
    pub(super) address: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<thread::JoinHandle<Result<()>>>,
}

/// Starts answering `GET /metrics` at `address` with the metrics of `jobs`.
pub(super) fn serve(address: &str, jobs: Vec<Scraped>) -> Result<MetricsEndpoint> {
    let listener = std::net::TcpListener::bind(address)
        .with_context(|| format!("--metrics {address}: cannot listen there"))?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .context("starting the metrics endpoint")?;
    let jobs = Arc::new(jobs);
    let app = axum::Router::new().route(
        "/metrics",
        get(move || {
            let jobs = jobs.clone();
            async move { respond(&jobs) }
        }),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let thread = thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener)?;
                axum::serve(listener, app)
                    .with_graceful_shutdown(async move {
                        let _ = stopped.await;
                    })
                    .await
                    .context("serving metrics")
            })
        })
        .context("starting the metrics thread")?;
    Ok(MetricsEndpoint {
        address: bound,
        stop: Some(stop),
        thread: Some(thread),
    })
}

/// The answer to a scrape.
fn respond(jobs: &[Scraped]) -> impl axum::response::IntoResponse + use<> {
    let samples: Vec<JobSample<'_>> = jobs
        .iter()
        .map(|j| JobSample {
            tenant: &j.tenant,
            job: &j.job,
            earlier_restarts: 0,
            monitor: &j.monitor,
        })
        .collect();
    (
        [(
            CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        jobs_metrics(&samples),
    )
}

impl Drop for MetricsEndpoint {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(Ok(Err(e))) = self.thread.take().map(thread::JoinHandle::join) {
            tracing::warn!("metrics endpoint: {e:#}");
        }
    }
}
