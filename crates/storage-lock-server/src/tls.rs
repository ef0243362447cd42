//! TLS for the lock server: HTTPS and gRPC over TLS on one port, optionally with client
//! certificates (mutual TLS).
//!
//! [`TlsConfig::from_pem_files`] reads a certificate chain and its private key (PEM) and, for
//! mutual TLS, the CA that client certificates must chain to; [`crate::Server::serve_tls`]
//! serves with it. The crypto provider is rustls's `ring` provider, named explicitly (a process
//! may link several providers; none is installed globally). ALPN offers `h2` and `http/1.1`, so
//! gRPC (HTTP/2) and HTTP/1.1 clients share the port as they do without TLS.
//!
//! Handshakes run in tasks of their own, each limited to [`HANDSHAKE_TIMEOUT`]: a client that
//! connects and never finishes its handshake holds one task for ten seconds, never the accept
//! loop. A failed handshake is logged at debug level and dropped.

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig};
use tokio_rustls::server::TlsStream;

/// How long a client may take to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a TLS configuration could not be built. Messages name the file, never key material.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A file could not be read or holds no usable PEM item of the expected kind.
    #[error("{what} {path}: {reason}")]
    Pem {
        /// What the file should hold ("certificate", "private key", "client CA").
        what: &'static str,
        /// The file.
        path: String,
        /// Why it is unusable.
        reason: String,
    },
    /// rustls refused the combination (e.g. the key does not match the certificate).
    #[error("TLS configuration: {0}")]
    Config(String),
}

/// A server TLS configuration (certificate chain, key, optional client CA), cheap to clone.
#[derive(Clone)]
pub struct TlsConfig {
    config: Arc<ServerConfig>,
    mutual: bool,
}

impl std::fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConfig")
            .field("client_certificates_required", &self.mutual)
            .finish_non_exhaustive()
    }
}

fn pem_error(what: &'static str, path: &Path, reason: impl ToString) -> TlsError {
    TlsError::Pem {
        what,
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

fn certificates(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem_error(what, path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(what, path, e))?;
    if certs.is_empty() {
        return Err(pem_error(what, path, "no CERTIFICATE in it"));
    }
    Ok(certs)
}

impl TlsConfig {
    /// Reads the server's certificate chain (`cert`, PEM, leaf first) and private key (`key`,
    /// PEM: PKCS#8, PKCS#1 or SEC1), and with `client_ca` requires every client to present a
    /// certificate that chains to one of the CA certificates in that PEM file.
    ///
    /// # Errors
    /// [`TlsError::Pem`] for a missing or unreadable file or one without the expected item;
    /// [`TlsError::Config`] if rustls refuses them (a key that does not match the certificate).
    ///
    /// # Examples
    /// ```no_run
    /// let tls = storage_lock_server::TlsConfig::from_pem_files(
    ///     "/etc/storage-lock/cert.pem".as_ref(),
    ///     "/etc/storage-lock/key.pem".as_ref(),
    ///     None,
    /// )?;
    /// # Ok::<(), storage_lock_server::TlsError>(())
    /// ```
    pub fn from_pem_files(
        cert: &Path,
        key: &Path,
        client_ca: Option<&Path>,
    ) -> Result<Self, TlsError> {
        let chain = certificates("certificate", cert)?;
        let private =
            PrivateKeyDer::from_pem_file(key).map_err(|e| pem_error("private key", key, e))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?;
        let builder = match client_ca {
            Some(path) => {
                let mut roots = RootCertStore::empty();
                for ca in certificates("client CA", path)? {
                    roots.add(ca).map_err(|e| pem_error("client CA", path, e))?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .map_err(|e| TlsError::Config(e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config = builder
            .with_single_cert(chain, private)
            .map_err(|e| TlsError::Config(e.to_string()))?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Self {
            config: Arc::new(config),
            mutual: client_ca.is_some(),
        })
    }

    /// Whether clients must present a certificate.
    pub fn requires_client_certificates(&self) -> bool {
        self.mutual
    }
}

/// A TCP listener that hands out TLS streams whose handshake completed (an axum
/// [`axum::serve::Listener`]).
pub(crate) struct TlsListener {
    local: SocketAddr,
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    accept_loop: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    pub(crate) fn new(listener: TcpListener, tls: &TlsConfig) -> io::Result<Self> {
        let local = listener.local_addr()?;
        let acceptor = TlsAcceptor::from(tls.config.clone());
        let (tx, ready) = mpsc::channel(64);
        let accept_loop = tokio::spawn(async move {
            loop {
                let (tcp, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // As axum's own listener does: out of descriptors and the like pass.
                        tracing::debug!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                if let Err(e) = tcp.set_nodelay(true) {
                    tracing::debug!(error = %e, "TCP_NODELAY not set");
                }
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            let _ = tx.send((stream, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(Self {
            local,
            ready,
            accept_loop,
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accept_loop.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(accepted) => accepted,
            // The accept loop never ends on its own; if it did, accept nothing more.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}
