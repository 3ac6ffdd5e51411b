//! The HTTP API of a server (JSON; `docs/server.md` shows each
//! route with curl).
//!
//! Every route is declared once, by a handler's `#[utoipa::path]`, and registered with
//! `routes!` in [`routes`]: the router and the OpenAPI document (served at
//! `/v1/openapi.json`) both come from that table, and the answers' types from
//! [`super::model`]. The API is under `/v1`; its unprefixed paths of before are served by
//! the same handlers and documented as deprecated. Every route but the dashboard, the
//! probes and the document needs `Authorization: Bearer TOKEN`; a request sees only its
//! tenant's jobs, plugins and metrics. Work that blocks (compiling a plugin, stopping a
//! job) runs off the async threads.

use std::collections::VecDeque;
use std::fs::File;
use std::io::Read;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::task::{Context as TaskContext, Poll, ready};
use std::time::Duration;

use anyhow::Result;
use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use utoipa::OpenApi;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::openapi::{Deprecated, OpenApi as OpenApiDocument};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::blocking::blocking;
use super::model::{
    ErrorBody, JobDetail, JobList, JobSummary, Plugin, PluginList, Probe, ProbeStatus,
    SavepointStatus, SavepointTaken, SavepointTriggered, TenantInfo, TriggerStatus,
};
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
            ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: self.message,
        };
        let mut response = (self.kind.status(), Json(body)).into_response();
        if self.kind == ErrorKind::Unauthorized {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"sluice\""),
            );
        }
        response
    }
}

/// The tenant a request authenticated as, once the server is ready.
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
        let tenant = server
            .authenticate(token.trim())
            .cloned()
            .ok_or_else(|| ApiError::new(ErrorKind::Unauthorized, "the token is not valid"))?;
        // Before its jobs are resumed, quotas would count too few and lists show too few.
        if server.readiness() == ProbeStatus::Starting {
            return Err(ApiError::new(
                ErrorKind::Unavailable,
                "the server is starting: it is resuming the jobs of its registry (GET /readyz \
                 answers 200 once it is done)",
            ));
        }
        Ok(Tenant(tenant))
    }
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

/// The document's frame: what the API is, and how a tenant authenticates.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Sluice server",
        description = "A multi-tenant job service running stream jobs whose operators are \
            sandboxed WebAssembly components. The API is under /v1; its unprefixed paths \
            answer the same but are deprecated. Every route but the dashboard, the probes \
            and this document needs a tenant's bearer token; a tenant sees only its own \
            jobs, plugins, logs and metrics (another tenant's job is 404). Errors are JSON \
            objects with one field, error. A time comes as milliseconds since the Unix \
            epoch (NAME_ms) and as the same instant in RFC 3339 (NAME)."
    ),
    modifiers(&BearerToken),
    security(("bearer" = [])),
    tags(
        (name = "jobs", description = "Submitting, watching and controlling jobs"),
        (name = "savepoints", description = "Savepoints of running jobs"),
        (name = "plugins", description = "Uploaded operator components"),
        (name = "server", description = "Probes, metrics, the dashboard and this document")
    )
)]
struct ApiDoc;

/// Declares the bearer token scheme the document's `security` names.
struct BearerToken;

impl utoipa::Modify for BearerToken {
    fn modify(&self, openapi: &mut OpenApiDocument) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)),
        );
    }
}

/// The API's routes, each served at `/v1` + its path.
fn api() -> OpenApiRouter<Arc<Server>> {
    OpenApiRouter::new()
        .routes(routes!(openapi_document))
        .routes(routes!(metrics))
        .routes(routes!(tenant_info))
        .routes(routes!(list_plugins, upload_plugin))
        .routes(routes!(delete_plugin))
        .routes(routes!(list_jobs, submit))
        .routes(routes!(job_detail, delete_job))
        .routes(routes!(job_output))
        .routes(routes!(job_logs))
        .routes(routes!(cancel))
        .routes(routes!(stop))
        .routes(routes!(savepoint))
        .routes(routes!(trigger_savepoint))
        .routes(routes!(savepoint_status))
        .routes(routes!(start))
}

/// Every route the server serves, with its description: the table both the router and
/// the OpenAPI document are made from (nothing is routed past it but the fallback).
fn routes() -> OpenApiRouter<Arc<Server>> {
    let mut unversioned = api();
    for item in unversioned.get_openapi_mut().paths.paths.values_mut() {
        let operations = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.options,
            &mut item.head,
            &mut item.patch,
            &mut item.trace,
        ];
        for operation in operations.into_iter().flatten() {
            operation.deprecated = Some(Deprecated::True);
            // (Operation ids are unique: they stay with the `/v1` paths.)
            operation.operation_id = None;
        }
    }
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(dashboard))
        .routes(routes!(health))
        .routes(routes!(livez))
        .routes(routes!(readyz))
        .nest("/v1", api())
        .merge(unversioned)
}

/// The API described in OpenAPI 3.1, generated from the route table and the answers'
/// types.
pub fn openapi() -> OpenApiDocument {
    routes().into_openapi()
}

/// The routes, on `server`.
pub fn router(server: Arc<Server>) -> axum::Router {
    let limit = server.host.server.max_upload_bytes;
    let (router, _) = routes().split_for_parts();
    router
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

/// The dashboard's page as sent: with its chart library ([uPlot](vendor/README.md))
/// inlined, so that the page needs nothing from elsewhere.
fn dashboard_page() -> &'static str {
    static PAGE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PAGE.get_or_init(|| {
        let uplot = format!(
            "<style>{}</style>\n<script>{}</script>",
            include_str!("vendor/uPlot.min.css"),
            include_str!("vendor/uPlot.iife.min.js")
        );
        DASHBOARD.replacen("<!-- uPlot -->", &uplot, 1)
    })
}

#[utoipa::path(get, path = "/", tag = "server", security(),
    responses((status = 200, description = "The dashboard's page", body = String, content_type = "text/html")))]
async fn dashboard() -> Response {
    let policy = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                  connect-src 'self'; img-src 'self' data:; form-action 'none'; frame-ancestors 'none'";
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CONTENT_SECURITY_POLICY, policy),
        ],
        dashboard_page(),
    )
        .into_response()
}

#[utoipa::path(get, path = "/health", tag = "server", security(),
    responses((status = 200, description = "The process answers (as `/livez`)", body = Probe)))]
async fn health() -> Json<Probe> {
    Json(Probe {
        status: ProbeStatus::Ok,
    })
}

#[utoipa::path(get, path = "/livez", tag = "server", security(),
    responses((status = 200, description = "The process answers", body = Probe)))]
async fn livez() -> Json<Probe> {
    Json(Probe {
        status: ProbeStatus::Ok,
    })
}

#[utoipa::path(get, path = "/readyz", tag = "server", security(),
    responses(
        (status = 200, description = "It resumed its jobs and accepts requests", body = Probe),
        (status = 503, description = "It is starting (resuming its jobs) or shutting down", body = Probe),
    ))]
async fn readyz(State(server): State<Arc<Server>>) -> (StatusCode, Json<Probe>) {
    let status = server.readiness();
    let code = match status {
        ProbeStatus::Ready => StatusCode::OK,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    };
    (code, Json(Probe { status }))
}

/// The document, written once.
static OPENAPI_JSON: LazyLock<String> = LazyLock::new(|| {
    openapi().to_pretty_json().unwrap_or_else(|e| {
        let error = ErrorBody {
            error: format!("cannot write the OpenAPI document: {e}"),
        };
        serde_json::to_string(&error).unwrap_or_default()
    })
});

#[utoipa::path(get, path = "/openapi.json", tag = "server", security(),
    responses((status = 200, description = "This document (OpenAPI 3.1)", body = Object)))]
async fn openapi_document() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        OPENAPI_JSON.as_str(),
    )
        .into_response()
}

#[utoipa::path(get, path = "/metrics", tag = "server",
    responses(
        (status = 200, description = "The tenant's metrics (OpenMetrics text)", body = String,
            content_type = "application/openmetrics-text"),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 429, description = "The tenant has 8 requests in progress already", body = ErrorBody),
        (status = 503, description = "The server is starting", body = ErrorBody),
    ))]
async fn metrics(
    State(server): State<Arc<Server>>,
    Tenant(t): Tenant,
) -> Result<Response, ApiError> {
    // Off the async workers: a tenant's metrics grow with its jobs' counters.
    let text = blocking(&server.clone(), &t.clone(), move || Ok(server.metrics(&t))).await?;
    let content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8";
    Ok(([(header::CONTENT_TYPE, content_type)], text).into_response())
}

#[utoipa::path(get, path = "/tenant", tag = "server",
    responses(
        (status = 200, description = "The tenant the token logs in as, and its quotas", body = TenantInfo),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
    ))]
async fn tenant_info(State(server): State<Arc<Server>>, Tenant(t): Tenant) -> Json<TenantInfo> {
    Json(TenantInfo {
        tenant: t.name.clone(),
        max_jobs: t.max_jobs,
        slots: t.slots.unwrap_or(server.host.server.slots),
        max_subtasks: t.max_subtasks,
        max_disk_bytes: t.max_disk_bytes,
    })
}

#[utoipa::path(get, path = "/plugins", tag = "plugins",
    responses(
        (status = 200, description = "The tenant's plugins, newest first", body = PluginList),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 503, description = "The server is starting", body = ErrorBody),
    ))]
async fn list_plugins(State(server): State<Arc<Server>>, Tenant(t): Tenant) -> Json<PluginList> {
    Json(server.plugins(&t))
}

/// `?name=`: the name a plugin is uploaded under.
#[derive(Deserialize)]
struct UploadQuery {
    name: Option<String>,
}

#[utoipa::path(post, path = "/plugins", tag = "plugins", params(("name" = Option<String>, Query, description = "A file name ending in `.wasm` (default `plugin.wasm`); job files may name the plugin by it")),
    request_body(content = Vec<u8>, description = "The component's bytes", content_type = "application/wasm"),
    responses(
        (status = 201, description = "Checked and stored (the same bytes again only rename it)", body = Plugin),
        (status = 400, description = "Not a component this host runs, or a bad name", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 413, description = "Larger than the server accepts (max_upload_mb)", body = ErrorBody),
        (status = 429, description = "Past the tenant's plugin or disk quota", body = ErrorBody),
        (status = 503, description = "The server is starting", body = ErrorBody),
    ))]
async fn upload_plugin(
    State(server): State<Arc<Server>>,
    Tenant(t): Tenant,
    Query(q): Query<UploadQuery>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<Plugin>), ApiError> {
    let bytes = body(bytes)?;
    let name = q.name.unwrap_or_else(|| "plugin.wasm".into());
    let plugin = blocking(&server.clone(), &t.clone(), move || {
        server.upload_plugin(&t, &name, &bytes)
    })
    .await?;
    Ok((StatusCode::CREATED, Json(plugin)))
}

#[utoipa::path(delete, path = "/plugins/{key}", tag = "plugins",
    params(("key" = String, Path, description = "The plugin's SHA-256, or the name it was uploaded under")),
    responses(
        (status = 200, description = "Deleted: what it was", body = Plugin),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 404, description = "No such plugin of the tenant", body = ErrorBody),
        (status = 409, description = "A job that could run uses it", body = ErrorBody),
        (status = 503, description = "The server is starting", body = ErrorBody),
    ))]
async fn delete_plugin(
    State(server): State<Arc<Server>>,
    Tenant(t): Tenant,
    Path(key): Path<String>,
) -> Result<Json<Plugin>, ApiError> {
    Ok(Json(
        blocking(&server.clone(), &t.clone(), move || {
            server.delete_plugin(&t, &key)
        })
        .await?,
    ))
}

#[utoipa::path(get, path = "/jobs", tag = "jobs",
    responses(
        (status = 200, description = "The tenant's jobs, oldest first", body = JobList),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 503, description = "The server is starting", body = ErrorBody),
    ))]
async fn list_jobs(State(server): State<Arc<Server>>, Tenant(t): Tenant) -> Json<JobList> {
    Json(server.list_jobs(&t))
}

#[utoipa::path(post, path = "/jobs", tag = "jobs",
    request_body(content = String, description = "A job file (TOML) naming uploaded plugins by name or as sha256:HEX",
        content_type = "application/toml"),
    responses(
        (status = 201, description = "Stored and started", body = JobSummary),
        (status = 400, description = "The job file is not valid: the error names the line and key", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 403, description = "It names another tenant, or Kafka outside the tenant's grant", body = ErrorBody),
        (status = 409, description = "The server is shutting down", body = ErrorBody),
        (status = 413, description = "Larger than the server accepts (max_upload_mb)", body = ErrorBody),
        (status = 429, description = "Past one of the tenant's quotas, named", body = ErrorBody),
        (status = 503, description = "The server is starting", body = ErrorBody),
    ))]
async fn submit(
    State(server): State<Arc<Server>>,
    Tenant(t): Tenant,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<JobSummary>), ApiError> {
    let bytes = body(bytes)?;
    let text = String::from_utf8(bytes.to_vec())
        .map_err(|_| ApiError::bad("the job file must be UTF-8 text (TOML)"))?;
    let job = blocking(&server.clone(), &t.clone(), move || {
        server.submit(&t, &text)
    })
    .await?;
    Ok((StatusCode::CREATED, Json(job)))
}

#[utoipa::path(get, path = "/jobs/{id}", tag = "jobs",
    params(("id" = String, Path, description = "A job id, as `POST /v1/jobs` answered")),
    responses(
        (status = 200, description = "Everything about the job", body = JobDetail),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 404, description = "No such job of the tenant", body = ErrorBody),
        (status = 429, description = "The tenant has 8 requests in progress already", body = ErrorBody),
        (status = 503, description = "The server is starting", body = ErrorBody),
    ))]
async fn job_detail(
    State(server): State<Arc<Server>>,
    Tenant(t): Tenant,
    Path(id): Path<String>,
) -> Result<Json<JobDetail>, ApiError> {
    // Off the async workers: a job's detail grows with its tasks and counters.
    Ok(Json(
        blocking(&server.clone(), &t.clone(), move || {
            server.job_detail(&t, &id)
        })
        .await?,
    ))
}

#[utoipa::path(delete, path = "/jobs/{id}", tag = "jobs",
    params(("id" = String, Path, description = "A job id")),
    responses(
        (status = 200, description = "Deleted with its folder (checkpoints, output, logs): what it was", body = JobSummary),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 404, description = "No such job of the tenant", body = ErrorBody),
        (status = 409, description = "It is running", body = ErrorBody),
        (status = 503, description = "The server is starting", body = ErrorBody),
    ))]
async fn delete_job(
    State(server): State<Arc<Server>>,
    Tenant(t): Tenant,
    Path(id): Path<String>,
) -> Result<Json<JobSummary>, ApiError> {
    Ok(Json(
        blocking(&server.clone(), &t.clone(), move || server.delete(&t, &id)).await?,
    ))
}

/// `?file=`: one of a job's output files.
#[derive(Deserialize)]
struct OutputQuery {
    file: Option<String>,
}

/// Streams the output files: the server holds a chunk or so of them at a time, however
/// large they are.
#[utoipa::path(get, path = "/jobs/{id}/output", tag = "jobs",
    params(
        ("id" = String, Path, description = "A job id"),
        ("file" = Option<String>, Query, description = "One of the files its `output` lists (e.g. `output/late.tsv`); all of them one after the other without it"),
    ),
    responses(
        (status = 200, description = "The committed output", body = String, content_type = "text/plain"),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 404, description = "No such job of the tenant, or no such output file", body = ErrorBody),
        (status = 503, description = "The server is starting", body = ErrorBody),
    ))]
async fn job_output(
    State(server): State<Arc<Server>>,
    Tenant(t): Tenant,
    Path(id): Path<String>,
    Query(q): Query<OutputQuery>,
) -> Result<Response, ApiError> {
    let files = blocking(&server.clone(), &t.clone(), move || {
        server.job_output(&t, &id, q.file.as_deref())
    })
    .await?;
    let body = Body::from_stream(FileChunks::new(files));
    Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], body).into_response())
}

#[utoipa::path(get, path = "/jobs/{id}/logs", tag = "jobs",
    params(("id" = String, Path, description = "A job id")),
    responses(
        (status = 200, description = "Its last 1,000 log lines, oldest first", body = String, content_type = "text/plain"),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 404, description = "No such job of the tenant", body = ErrorBody),
        (status = 503, description = "The server is starting", body = ErrorBody),
    ))]
async fn job_logs(
    State(server): State<Arc<Server>>,
    Tenant(t): Tenant,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let text = blocking(&server.clone(), &t.clone(), move || {
        server.job_logs(&t, &id)
    })
    .await?;
    Ok(([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response())
}

#[utoipa::path(post, path = "/jobs/{id}/cancel", tag = "jobs",
    params(("id" = String, Path, description = "A job id")),
    responses(
        (status = 200, description = "Cancelled (no savepoint)", body = JobSummary),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 404, description = "No such job of the tenant", body = ErrorBody),
        (status = 409, description = "It is not running", body = ErrorBody),
        (status = 503, description = "The server is starting", body = ErrorBody),
    ))]
async fn cancel(
    State(server): State<Arc<Server>>,
    Tenant(t): Tenant,
    Path(id): Path<String>,
) -> Result<Json<JobSummary>, ApiError> {
    Ok(Json(
        blocking(&server.clone(), &t.clone(), move || server.cancel(&t, &id)).await?,
    ))
}

/// `?drain=`: whether to fire all event-time timers first.
#[derive(Deserialize)]
struct StopQuery {
    #[serde(default)]
    drain: bool,
}

#[utoipa::path(post, path = "/jobs/{id}/stop", tag = "jobs",
    params(
        ("id" = String, Path, description = "A job id"),
        ("drain" = Option<bool>, Query, description = "Advance event time to the end before the savepoint (fires all timers and windows)"),
    ),
    responses(
        (status = 200, description = "Stopped with a savepoint (answered once it is written)", body = JobSummary),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 404, description = "No such job of the tenant", body = ErrorBody),
        (status = 409, description = "It is not running, or its savepoint failed", body = ErrorBody),
        (status = 503, description = "The server is starting", body = ErrorBody),
    ))]
async fn stop(
    State(server): State<Arc<Server>>,
    Tenant(t): Tenant,
    Path(id): Path<String>,
    Query(q): Query<StopQuery>,
) -> Result<Json<JobSummary>, ApiError> {
    Ok(Json(
        blocking(&server.clone(), &t.clone(), move || {
            server.stop(&t, &id, q.drain)
        })
        .await?,
    ))
}

/// How often a waiting `POST .../savepoint` looks at its request: at first soon (a
/// savepoint of a small job takes a few milliseconds), then less and less often.
const SAVEPOINT_POLL: (Duration, Duration) = (Duration::from_millis(1), Duration::from_millis(64));

/// Takes a savepoint as [`trigger_savepoint`] does, and answers once it is written. The
/// wait holds no thread: it looks at the request after 1 ms, then twice as long each
/// time, up to every 64 ms ([`SAVEPOINT_POLL`]).
#[utoipa::path(post, path = "/jobs/{id}/savepoint", tag = "savepoints",
    params(("id" = String, Path, description = "A job id")),
    responses(
        (status = 200, description = "Written, the job running on", body = SavepointTaken),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 404, description = "No such job of the tenant", body = ErrorBody),
        (status = 409, description = "It is not running, or the savepoint failed", body = ErrorBody),
        (status = 429, description = "It has as many savepoints in progress as it may", body = ErrorBody),
        (status = 503, description = "The server is starting", body = ErrorBody),
    ))]
async fn savepoint(
    State(server): State<Arc<Server>>,
    Tenant(t): Tenant,
    Path(id): Path<String>,
) -> Result<Json<SavepointTaken>, ApiError> {
    let request = server.trigger_savepoint(&t, &id)?.request_id;
    let (mut poll, longest) = SAVEPOINT_POLL;
    loop {
        let status = server.savepoint_status(&t, &id, &request)?;
        match (status.status, status.location, status.error) {
            (TriggerStatus::InProgress, ..) => {
                tokio::time::sleep(poll).await;
                poll = (poll * 2).min(longest);
            }
            (TriggerStatus::Completed, Some(savepoint), _) => {
                return Ok(Json(SavepointTaken { savepoint }));
            }
            (_, _, error) => {
                let message =
                    error.unwrap_or_else(|| format!("the savepoint of job '{id}' failed"));
                return Err(ApiError::new(ErrorKind::Conflict, message));
            }
        }
    }
}

#[utoipa::path(post, path = "/jobs/{id}/savepoints", tag = "savepoints",
    params(("id" = String, Path, description = "A job id")),
    responses(
        (status = 202, description = "Triggered: ask about it with its request id", body = SavepointTriggered),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 404, description = "No such job of the tenant", body = ErrorBody),
        (status = 409, description = "It is not running, or runs over several servers", body = ErrorBody),
        (status = 429, description = "It has as many savepoints in progress as it may (4)", body = ErrorBody),
        (status = 503, description = "The server is starting", body = ErrorBody),
    ))]
async fn trigger_savepoint(
    State(server): State<Arc<Server>>,
    Tenant(t): Tenant,
    Path(id): Path<String>,
) -> Result<(StatusCode, Json<SavepointTriggered>), ApiError> {
    Ok((
        StatusCode::ACCEPTED,
        Json(server.trigger_savepoint(&t, &id)?),
    ))
}

#[utoipa::path(get, path = "/jobs/{id}/savepoints/{request_id}", tag = "savepoints",
    params(
        ("id" = String, Path, description = "A job id"),
        ("request_id" = String, Path, description = "What `POST /v1/jobs/{id}/savepoints` answered"),
    ),
    responses(
        (status = 200, description = "Where the savepoint is", body = SavepointStatus),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 404, description = "No such job of the tenant, or no such request (any more)", body = ErrorBody),
        (status = 503, description = "The server is starting", body = ErrorBody),
    ))]
async fn savepoint_status(
    State(server): State<Arc<Server>>,
    Tenant(t): Tenant,
    Path((id, request)): Path<(String, String)>,
) -> Result<Json<SavepointStatus>, ApiError> {
    Ok(Json(server.savepoint_status(&t, &id, &request)?))
}

/// `?savepoint=&allow_rewind=`: where a start resumes from.
#[derive(Deserialize)]
struct StartQuery {
    savepoint: Option<String>,
    #[serde(default)]
    allow_rewind: bool,
}

#[utoipa::path(post, path = "/jobs/{id}/start", tag = "jobs",
    params(
        ("id" = String, Path, description = "A job id"),
        ("savepoint" = Option<String>, Query, description = "A savepoint's name (its `savepoint`, or a `name` of its checkpoints); its latest complete checkpoint or savepoint without it"),
        ("allow_rewind" = Option<bool>, Query, description = "Restore a savepoint older than the output already committed (which stays aside as a new file generation)"),
    ),
    request_body(content = Option<String>, description = "Optional: a job file to start it as instead (changed settings, parallelism or plugins: an upgrade from the savepoint), which replaces its job file once the start is accepted; secrets left masked (******) as `GET /v1/jobs/{id}` shows them keep their values. Empty: the job file it ran by.",
        content_type = "application/toml"),
    responses(
        (status = 200, description = "Started again", body = JobSummary),
        (status = 400, description = "The job file given is not valid: the error names the line and key", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 404, description = "No such job of the tenant, or no such savepoint", body = ErrorBody),
        (status = 409, description = "It is running or finished, the savepoint does not fit, or the server is shutting down", body = ErrorBody),
        (status = 429, description = "Past one of the tenant's quotas, named", body = ErrorBody),
        (status = 503, description = "The server is starting", body = ErrorBody),
    ))]
async fn start(
    State(server): State<Arc<Server>>,
    Tenant(t): Tenant,
    Path(id): Path<String>,
    Query(q): Query<StartQuery>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Json<JobSummary>, ApiError> {
    let bytes = body(bytes)?;
    let job_file = match bytes.is_empty() {
        true => None,
        false => Some(
            String::from_utf8(bytes.to_vec())
                .map_err(|_| ApiError::bad("the job file must be UTF-8 text (TOML)"))?,
        ),
    };
    Ok(Json(
        blocking(&server.clone(), &t.clone(), move || {
            server.start(
                &t,
                &id,
                q.savepoint.as_deref(),
                q.allow_rewind,
                job_file.as_deref(),
            )
        })
        .await?,
    ))
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

#[cfg(test)]
mod tests;
