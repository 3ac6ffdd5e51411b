//! A server answering its API on a socket (HTTP, or HTTPS with `tls_cert` and
//! `tls_key`), on threads of its own.

use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use anyhow::{Context, Result};

use super::Server;
use super::api::router;

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
