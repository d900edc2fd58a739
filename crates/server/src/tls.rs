//! Native TLS (`serve --tls-cert --tls-key`): rustls with the `ring` provider, for brokers
//! that agents and printers reach over the internet without a reverse proxy in front.
//!
//! Handshakes run in tasks of their own, so one slow or silent client (a port scanner, a
//! printer on a bad link) cannot hold up the connections behind it; a handshake that has
//! not finished within [`HANDSHAKE_TIMEOUT`] is dropped.

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// A handshake not done within this long is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the certificate or key could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read the TLS certificate chain {path}: {reason}")]
    Certificate { path: String, reason: String },
    #[error("{path} holds no certificate (expected PEM \"BEGIN CERTIFICATE\" blocks)")]
    NoCertificate { path: String },
    #[error("cannot read the TLS private key {path}: {reason}")]
    Key { path: String, reason: String },
    #[error("the TLS certificate and key do not go together: {0}")]
    Mismatch(String),
}

/// A loaded certificate chain and key.
#[derive(Clone)]
pub struct Tls {
    config: Arc<ServerConfig>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key stays out of debug output.
        f.write_str("Tls { .. }")
    }
}

impl Tls {
    /// Reads a PEM certificate chain (leaf first) and a PEM private key (PKCS#8, PKCS#1
    /// or SEC1).
    pub fn from_pem_files(cert: &Path, key: &Path) -> Result<Tls, TlsError> {
        let cert_path = cert.display().to_string();
        let chain = CertificateDer::pem_file_iter(cert)
            .and_then(|it| it.collect::<Result<Vec<_>, _>>())
            .map_err(|e| TlsError::Certificate { path: cert_path.clone(), reason: e.to_string() })?;
        if chain.is_empty() {
            return Err(TlsError::NoCertificate { path: cert_path });
        }
        let key = PrivateKeyDer::from_pem_file(key)
            .map_err(|e| TlsError::Key { path: key.display().to_string(), reason: e.to_string() })?;
        let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Mismatch(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(|e| TlsError::Mismatch(e.to_string()))?;
        // HTTP/1.1 only: the server speaks no HTTP/2.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Tls { config: Arc::new(config) })
    }
}

/// A TCP listener whose connections are TLS streams, for `axum::serve`.
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    pub fn new(listener: TcpListener, tls: &Tls) -> io::Result<TlsListener> {
        let local = listener.local_addr()?;
        let acceptor = TlsAcceptor::from(tls.config.clone());
        let (tx, ready) = mpsc::channel(64);
        tokio::spawn(accept_loop(listener, acceptor, tx));
        Ok(TlsListener { ready, local })
    }
}

async fn accept_loop(
    mut listener: TcpListener,
    acceptor: TlsAcceptor,
    tx: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    loop {
        let (tcp, addr) = tokio::select! {
            // The server stopped taking connections (graceful shutdown): stop accepting.
            () = tx.closed() => return,
            accepted = axum::serve::Listener::accept(&mut listener) => accepted,
        };
        let (acceptor, tx) = (acceptor.clone(), tx.clone());
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => {
                    let _ = tx.send((stream, addr)).await;
                }
                Ok(Err(e)) => tracing::debug!(peer = %addr, error = %e, "TLS handshake failed"),
                Err(_) => tracing::debug!(peer = %addr, "TLS handshake timed out"),
            }
        });
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(conn) => conn,
            // The accept loop only ends once this listener is gone; never resolve.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}
