//! TLS for the server's API: a listener that hands axum connections whose handshake is
//! done, from a certificate chain and key in PEM files.
//!
//! Handshakes run as tasks of their own, so a client that connects and never speaks
//! holds only its own task (until [`HANDSHAKE_TIMEOUT`]), never the accepting of others;
//! at most [`MAX_CONNECTIONS`](super::http::MAX_CONNECTIONS) run at once (more
//! connections wait, unaccepted, in the socket's backlog).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::server::TlsStream;

/// Longest a client may take to complete its handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshakes completed and not yet taken by the server.
const READY: usize = 64;

/// The server's TLS configuration from `cert` (a PEM chain, leaf first) and `key` (a
/// PEM private key).
pub fn server_config(cert: &Path, key_file: &Path) -> Result<Arc<ServerConfig>> {
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| anyhow::anyhow!("{}: not a PEM certificate chain: {e}", cert.display()))?;
    if certs.is_empty() {
        anyhow::bail!("{}: no certificate in it", cert.display());
    }
    let key = PrivateKeyDer::from_pem_file(key_file)
        .map_err(|e| anyhow::anyhow!("{}: not a PEM private key: {e}", key_file.display()))?;
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .with_context(|| {
            format!(
                "{} and {} are not a certificate and its key",
                cert.display(),
                key_file.display()
            )
        })?;
    Ok(Arc::new(config))
}

/// Accepts TCP connections and completes their TLS handshakes concurrently.
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    /// Starts accepting on `listener` (on the current Tokio runtime).
    pub fn new(listener: TcpListener, config: Arc<ServerConfig>) -> Result<TlsListener> {
        let local = listener.local_addr()?;
        let (tx, ready) = mpsc::channel(READY);
        let acceptor = TlsAcceptor::from(config);
        let handshakes = Arc::new(tokio::sync::Semaphore::new(super::http::MAX_CONNECTIONS));
        tokio::spawn(async move {
            loop {
                let Ok(slot) = handshakes.clone().acquire_owned().await else {
                    return;
                };
                let (tcp, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of file descriptors and the like: wait, as axum does.
                        tracing::warn!("accepting a connection: {e}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                if tx.is_closed() {
                    return;
                }
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp));
                    let done = handshake.await;
                    drop(slot);
                    match done {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!("TLS handshake with {peer}: {e}"),
                        Err(_) => tracing::debug!("TLS handshake with {peer}: timed out"),
                    }
                });
            }
        });
        Ok(TlsListener { ready, local })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(accepted) => accepted,
            // The accepting task is gone (its runtime is shutting down): never again.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
