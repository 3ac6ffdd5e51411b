//! A server answering its API on a socket (HTTP, or HTTPS with `tls_cert` and
//! `tls_key`), on threads of its own.
//!
//! Clients are bounded: at most [`MAX_CONNECTIONS`] are served at once (more wait in the
//! socket's backlog, unaccepted, so clients cannot take the file descriptors the jobs'
//! sinks and checkpoints need), and one that does not send a request's head within
//! [`HEADER_TIMEOUT`] — a slow client, or a kept-alive connection left idle — is closed.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use anyhow::{Context, Result};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::sync::Semaphore;

use super::Server;
use super::api::router;

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 256;

/// Longest a client may take to send a request's head (from when the server waits for
/// it: a kept-alive connection's next request too).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest a stopping server waits for the requests in progress.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

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
    if !https && !bound.ip().is_loopback() {
        tracing::warn!(
            "serving plain HTTP on {bound}, beyond this machine: tenants' bearer tokens, job \
             files and output cross the network in the clear (set tls_cert and tls_key in \
             [server], or listen on a loopback address behind a proxy that speaks TLS)"
        );
    }
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
                        let listener = super::tls::TlsListener::new(listener, config)?;
                        serve_bounded(listener, app, stopped).await;
                    }
                    None => serve_bounded(listener, app, stopped).await,
                }
                Ok(())
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

/// Serves `app` to the connections `listener` accepts, [`MAX_CONNECTIONS`] at a time,
/// each under [`HEADER_TIMEOUT`], until `stopped`; then lets the requests in progress end
/// (at most [`DRAIN_TIMEOUT`]).
async fn serve_bounded<L>(mut listener: L, app: Router, stopped: impl Future<Output = ()>)
where
    L: axum::serve::Listener<Addr = SocketAddr>,
{
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let graceful = GracefulShutdown::new();
    let mut stopped = std::pin::pin!(stopped);
    loop {
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => slot.expect("the semaphore is never closed"),
            () = &mut stopped => break,
        };
        let (io, peer) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut stopped => break,
        };
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_TIMEOUT)
            .serve_connection(TokioIo::new(io), TowerToHyperService::new(app.clone()));
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("connection from {peer}: {e}");
            }
            drop(slot);
        });
    }
    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(DRAIN_TIMEOUT) => {
            tracing::warn!("stopping the HTTP server with requests still in progress");
        }
    }
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

    /// Stops the jobs so that they resume when a server opens the registry again
    /// (waiting at most `timeout` for their savepoints), then stops answering. Meanwhile
    /// `/readyz` answers 503 and no job is submitted or started.
    pub fn shutdown(mut self, timeout: Duration) -> Result<()> {
        self.server.shutdown(timeout);
        self.stop_http()
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
