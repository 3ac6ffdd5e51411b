//! The HTTP API of a server (JSON; see the README for each route with curl).
//!
//! The routes are described in OpenAPI 3.0 in `openapi.json` (served at
//! `/openapi.json`). Every route but `/health` and that needs `Authorization: Bearer TOKEN`; a request sees only
//! its tenant's jobs, plugins and metrics. Work that blocks (compiling a plugin, waiting
//! for a savepoint) runs off the async threads.

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::io::Read;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::task::{Context as TaskContext, Poll, ready};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use anyhow::{Context, Result};
use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use serde::Deserialize;
use serde_json::json;

use super::{ApiError, ErrorKind, Server};
use crate::tenant::TenantConfig;

impl ErrorKind {
    fn status(self) -> StatusCode {
        match self {
            ErrorKind::BadRequest => StatusCode::BAD_REQUEST,
            ErrorKind::Unauthorized => StatusCode::UNAUTHORIZED,
            ErrorKind::Forbidden => StatusCode::FORBIDDEN,
            ErrorKind::NotFound => StatusCode::NOT_FOUND,
            ErrorKind::Conflict => StatusCode::CONFLICT,
            ErrorKind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorKind::Quota => StatusCode::TOO_MANY_REQUESTS,
            ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response =
            (self.kind.status(), Json(json!({ "error": self.message }))).into_response();
        if self.kind == ErrorKind::Unauthorized {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"sluice\""),
            );
        }
        response
    }
}

/// The tenant a request authenticated as.
struct Tenant(TenantConfig);

impl FromRequestParts<Arc<Server>> for Tenant {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        server: &Arc<Server>,
    ) -> Result<Self, Self::Rejection> {
        let token = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or_else(|| {
                ApiError::new(
                    ErrorKind::Unauthorized,
                    "no bearer token: send `Authorization: Bearer TOKEN`",
                )
            })?;
        server
            .authenticate(token.trim())
            .cloned()
            .map(Tenant)
            .ok_or_else(|| ApiError::new(ErrorKind::Unauthorized, "the token is not valid"))
    }
}

/// Runs blocking server work on tokio's blocking pool.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
        Err(ApiError::internal(anyhow::anyhow!(
            "a request handler failed: {e}"
        )))
    })
}

fn body(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|e| {
        let kind = if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ErrorKind::TooLarge
        } else {
            ErrorKind::BadRequest
        };
        ApiError::new(
            kind,
            format!("cannot read the request body: {}", e.body_text()),
        )
    })
}

/// The routes.
pub fn router(server: Arc<Server>) -> axum::Router {
    let limit = server.host.server.max_upload_bytes;
    axum::Router::new()
        .route("/", get(dashboard))
        .route("/health", get(health))
        .route("/openapi.json", get(openapi))
        .route("/metrics", get(metrics))
        .route("/plugins", get(list_plugins).post(upload_plugin))
        .route("/plugins/{key}", delete(delete_plugin))
        .route("/jobs", get(list_jobs).post(submit))
        .route("/jobs/{id}", get(job_detail).delete(delete_job))
        .route("/jobs/{id}/output", get(job_output))
        .route("/jobs/{id}/logs", get(job_logs))
        .route("/jobs/{id}/cancel", post(cancel))
        .route("/jobs/{id}/stop", post(stop))
        .route("/jobs/{id}/savepoint", post(savepoint))
        .route("/jobs/{id}/start", post(start))
        .fallback(|| async { ApiError::new(ErrorKind::NotFound, "no such route") })
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::middleware::from_fn(move |request, next| {
            refuse_large_bodies(limit, request, next)
        }))
        .with_state(server)
}

/// Refuses a body whose `Content-Length` is over the limit before reading any of it. A
/// client that waits for `100 Continue` before sending a large body (as `sluice` and
/// curl do) then reads the refusal, where a server that read up to the limit and
/// closed the connection would leave it with a broken upload and no answer.
async fn refuse_large_bodies(
    limit: usize,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let length = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    match length {
        Some(length) if length > limit as u64 => ApiError::new(
            ErrorKind::TooLarge,
            format!(
                "the request body is {length} bytes, over the server's limit of {limit} \
                 (max_upload_mb)"
            ),
        )
        .into_response(),
        _ => next.run(request).await,
    }
}

/// The web dashboard: one page whose script logs in with a tenant's token and reads the
/// same API as the client (embedded in the binary; nothing comes from elsewhere).
const DASHBOARD: &str = include_str!("dashboard.html");

async fn dashboard() -> Response {
    let policy = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                  connect-src 'self'; img-src 'self' data:; form-action 'none'; frame-ancestors 'none'";
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CONTENT_SECURITY_POLICY, policy),
        ],
        DASHBOARD,
    )
        .into_response()
}

async fn health() -> Json<serde_json::Value> {
    Json(json!({ "status": "ok" }))
}

/// The API described in OpenAPI 3.0.
const OPENAPI: &str = include_str!("openapi.json");

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

async fn metrics(State(server): State<Arc<Server>>, Tenant(t): Tenant) -> Response {
    let text = server.metrics(&t);
    let content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8";
    ([(header::CONTENT_TYPE, content_type)], text).into_response()
}

async fn list_plugins(
    State(server): State<Arc<Server>>,
    Tenant(t): Tenant,
) -> Json<serde_json::Value> {
    Json(json!({ "plugins": server.list_plugins(&t) }))
}

#[derive(Deserialize)]
struct UploadQuery {
    name: Option<String>,
}

async fn upload_plugin(
    State(server): State<Arc<Server>>,
    Tenant(t): Tenant,
    Query(q): Query<UploadQuery>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<serde_json::Value>), ApiError> {
    let bytes = body(bytes)?;
    let name = q.name.unwrap_or_else(|| "plugin.wasm".into());
    let entry = blocking(move || server.upload_plugin(&t, &name, &bytes)).await?;
    Ok((StatusCode::CREATED, Json(json!(entry))))
}

async fn list_jobs(
    State(server): State<Arc<Server>>,
    Tenant(t): Tenant,
) -> Json<serde_json::Value> {
    Json(json!({ "jobs": server.list_jobs(&t) }))
}

async fn submit(
    State(server): State<Arc<Server>>,
    Tenant(t): Tenant,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<serde_json::Value>), ApiError> {
    let bytes = body(bytes)?;
    let text = String::from_utf8(bytes.to_vec())
        .map_err(|_| ApiError::bad("the job file must be UTF-8 text (TOML)"))?;
    let job = blocking(move || server.submit(&t, &text)).await?;
    Ok((StatusCode::CREATED, Json(json!(job))))
}

async fn job_detail(
    State(server): State<Arc<Server>>,
    Tenant(t): Tenant,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    Ok(Json(json!(server.job_detail(&t, &id)?)))
}

/// Streams the output files: the server holds a chunk or so of them at a time, however
/// large they are.
/// `?file=`: one of a job's output files.
#[derive(Deserialize)]
struct OutputQuery {
    file: Option<String>,
}

async fn job_output(
    State(server): State<Arc<Server>>,
    Tenant(t): Tenant,
    Path(id): Path<String>,
    Query(q): Query<OutputQuery>,
) -> Result<Response, ApiError> {
    let files = blocking(move || server.job_output(&t, &id, q.file.as_deref())).await?;
    let body = Body::from_stream(FileChunks::new(files));
    Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], body).into_response())
}

async fn job_logs(
    State(server): State<Arc<Server>>,
    Tenant(t): Tenant,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let text = blocking(move || server.job_logs(&t, &id)).await?;
    Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response())
}

/// Bytes read from a file per chunk of a streamed answer.
const CHUNK_BYTES: usize = 64 << 10;

/// Files read one after the other in chunks, each chunk on the blocking pool: a stream
/// for a response body. A slow client holds no thread between chunks.
struct FileChunks {
    /// The reader, while no read is under way.
    reader: Option<FileReader>,
    /// The read under way, which hands the reader back with its chunk.
    reading: Option<tokio::task::JoinHandle<(FileReader, std::io::Result<Option<Bytes>>)>>,
}

/// The files still to read, and the one being read.
struct FileReader {
    files: VecDeque<PathBuf>,
    current: Option<File>,
}

impl FileReader {
    /// The next chunk, or `None` at the end of the last file. A file that vanished since
    /// it was listed is skipped.
    fn next_chunk(&mut self) -> std::io::Result<Option<Bytes>> {
        loop {
            let file = match &mut self.current {
                Some(file) => file,
                None => match self.files.pop_front() {
                    None => return Ok(None),
                    Some(path) => match File::open(&path) {
                        Ok(file) => self.current.insert(file),
                        Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                        Err(e) => return Err(e),
                    },
                },
            };
            let mut chunk = vec![0; CHUNK_BYTES];
            let n = file.read(&mut chunk)?;
            if n == 0 {
                self.current = None;
                continue;
            }
            chunk.truncate(n);
            return Ok(Some(Bytes::from(chunk)));
        }
    }
}

impl FileChunks {
    fn new(files: Vec<PathBuf>) -> Self {
        FileChunks {
            reader: Some(FileReader {
                files: files.into(),
                current: None,
            }),
            reading: None,
        }
    }
}

impl futures_core::Stream for FileChunks {
    type Item = std::io::Result<Bytes>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<Self::Item>> {
        loop {
            if let Some(reading) = &mut self.reading {
                let done = ready!(Pin::new(reading).poll(cx));
                self.reading = None;
                let (reader, chunk) = done.map_err(std::io::Error::other)?;
                if let Ok(Some(_)) = &chunk {
                    self.reader = Some(reader);
                }
                // After an error or the end, the reader is gone: the stream ends.
                return Poll::Ready(chunk.transpose());
            }
            let Some(mut reader) = self.reader.take() else {
                return Poll::Ready(None);
            };
            self.reading = Some(tokio::task::spawn_blocking(move || {
                let chunk = reader.next_chunk();
                (reader, chunk)
            }));
        }
    }
}

async fn delete_job(
    State(server): State<Arc<Server>>,
    Tenant(t): Tenant,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    Ok(Json(json!(blocking(move || server.delete(&t, &id)).await?)))
}

async fn delete_plugin(
    State(server): State<Arc<Server>>,
    Tenant(t): Tenant,
    Path(key): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    Ok(Json(json!(
        blocking(move || server.delete_plugin(&t, &key)).await?
    )))
}

async fn cancel(
    State(server): State<Arc<Server>>,
    Tenant(t): Tenant,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    Ok(Json(json!(blocking(move || server.cancel(&t, &id)).await?)))
}

#[derive(Deserialize)]
struct StopQuery {
    #[serde(default)]
    drain: bool,
}

async fn stop(
    State(server): State<Arc<Server>>,
    Tenant(t): Tenant,
    Path(id): Path<String>,
    Query(q): Query<StopQuery>,
) -> Result<Json<serde_json::Value>, ApiError> {
    Ok(Json(json!(
        blocking(move || server.stop(&t, &id, q.drain)).await?
    )))
}

async fn savepoint(
    State(server): State<Arc<Server>>,
    Tenant(t): Tenant,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    Ok(Json(json!(
        blocking(move || server.savepoint(&t, &id)).await?
    )))
}

#[derive(Deserialize)]
struct StartQuery {
    savepoint: Option<String>,
    #[serde(default)]
    allow_rewind: bool,
}

async fn start(
    State(server): State<Arc<Server>>,
    Tenant(t): Tenant,
    Path(id): Path<String>,
    Query(q): Query<StartQuery>,
) -> Result<Json<serde_json::Value>, ApiError> {
    Ok(Json(json!(
        blocking(move || server.start(&t, &id, q.savepoint.as_deref(), q.allow_rewind)).await?
    )))
}

/// A server answering on a socket, on threads of its own.
pub struct RunningServer {
    address: SocketAddr,
    https: bool,
    server: Arc<Server>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<Result<()>>>,
}

/// Serves `server`'s API on `address` (`127.0.0.1:0` picks a free port).
pub fn serve(server: Arc<Server>, address: &str) -> Result<RunningServer> {
    let listener = std::net::TcpListener::bind(address)
        .with_context(|| format!("cannot listen on {address}"))?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("http")
        .enable_io()
        .enable_time()
        .build()
        .context("starting the HTTP runtime")?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let tls = match &server.host.server.tls {
        Some((cert, key)) => Some(super::tls::server_config(cert, key)?),
        None => None,
    };
    let https = tls.is_some();
    let app = router(server.clone());
    let thread = thread::Builder::new()
        .name("http server".into())
        .spawn(move || {
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener)?;
                let stopped = async move {
                    let _ = stopped.await;
                };
                match tls {
                    Some(config) => {
                        axum::serve(super::tls::TlsListener::new(listener, config)?, app)
                            .with_graceful_shutdown(stopped)
                            .await
                            .context("serving HTTPS")
                    }
                    None => axum::serve(listener, app)
                        .with_graceful_shutdown(stopped)
                        .await
                        .context("serving HTTP"),
                }
            })
        })?;
    Ok(RunningServer {
        address: bound,
        https,
        server,
        stop: Some(stop),
        thread: Some(thread),
    })
}

impl RunningServer {
    /// Where it listens.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Its base URL: `https://ADDRESS` when it serves TLS, else `http://ADDRESS`.
    pub fn url(&self) -> String {
        let scheme = if self.https { "https" } else { "http" };
        format!("{scheme}://{}", self.address)
    }

    /// The service behind it.
    pub fn server(&self) -> &Arc<Server> {
        &self.server
    }

    /// Stops answering, then stops the jobs so that they resume when a server opens the
    /// registry again (waiting at most `timeout` for their savepoints).
    pub fn shutdown(mut self, timeout: Duration) -> Result<()> {
        self.stop_http()?;
        self.server.shutdown(timeout);
        Ok(())
    }

    fn stop_http(&mut self) -> Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(result)) => result,
            Some(Err(_)) => anyhow::bail!("the HTTP server thread panicked"),
            None => Ok(()),
        }
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        let _ = self.stop_http();
    }
}

/// Labels of one sample.
type Labels = Vec<(String, String)>;

/// Histograms by labels, each made by [`duration_histogram`].
type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

/// A histogram's buckets, from 1 ms to about 65 s.
fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// One scrape's metric families, built with `prometheus-client` and encoded in the
/// OpenMetrics text format.
#[derive(Default)]
pub(super) struct Metrics {
    registry: Registry,
    counters: BTreeMap<String, Family<Labels, Counter<f64, AtomicU64>>>,
    gauges: BTreeMap<String, Family<Labels, Gauge<f64, AtomicU64>>>,
    histograms: BTreeMap<String, HistogramFamily>,
}

/// The labels of a sample, their values escaped as the text format wants (the encoder
/// writes them as they are, and operator and counter names come from tenants).
fn labels(labels: &[(&str, &str)]) -> Labels {
    labels
        .iter()
        .map(|(k, v)| {
            let v = v
                .replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n");
            (k.to_string(), v)
        })
        .collect()
}

impl Metrics {
    /// Adds a sample of counter `name` (ending in `_total`, as exposed) or of gauge
    /// `name`.
    pub(super) fn add(
        &mut self,
        name: &str,
        kind: &str,
        help: &str,
        sample: &[(&str, &str)],
        value: f64,
    ) {
        let registry = &mut self.registry;
        if kind == "counter" {
            // (OpenMetrics names a counter's family without the `_total` of its sample.)
            let family = name.strip_suffix("_total").unwrap_or(name);
            self.counters
                .entry(family.to_string())
                .or_insert_with(|| {
                    let f = Family::default();
                    registry.register(family, help, f.clone());
                    f
                })
                .get_or_create(&labels(sample))
                .inc_by(value);
        } else {
            self.gauges
                .entry(name.to_string())
                .or_insert_with(|| {
                    let f = Family::default();
                    registry.register(name, help, f.clone());
                    f
                })
                .get_or_create(&labels(sample))
                .set(value);
        }
    }

    /// Observes `seconds` in histogram `name` (buckets from 1 ms to about 65 s).
    pub(super) fn observe(
        &mut self,
        name: &str,
        help: &str,
        sample: &[(&str, &str)],
        seconds: f64,
    ) {
        let registry = &mut self.registry;
        self.histograms
            .entry(name.to_string())
            .or_insert_with(|| {
                let f = Family::new_with_constructor(duration_histogram as fn() -> Histogram);
                registry.register(name, help, f.clone());
                f
            })
            .get_or_create(&labels(sample))
            .observe(seconds);
    }

    pub(super) fn finish(self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_from_tenants_cannot_break_the_text_format() {
        let mut m = Metrics::default();
        let name = "op\"} 1\nsluice_jobs{tenant=\"victim\"";
        m.add("sluice_x_total", "counter", "x", &[("operator", name)], 2.0);
        let text = m.finish();
        let sample = text
            .lines()
            .find(|l| l.starts_with("sluice_x_total"))
            .unwrap();
        assert_eq!(
            sample,
            "sluice_x_total{operator=\"op\\\"} 1\\nsluice_jobs{tenant=\\\"victim\\\"\"} 2.0"
        );
        assert!(
            !text.lines().any(|l| l.starts_with("sluice_jobs")),
            "{text}"
        );
    }
}
