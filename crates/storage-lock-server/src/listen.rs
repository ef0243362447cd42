//! The listeners the server serves on, and the peer address axum learns from each: plain TCP
//! with `TCP_NODELAY` ([`NoDelay`]) and TLS (`crate::tls::TlsListener`).

/// The address a connection came from, for any listener the server serves on (axum knows it
/// only for its own TCP listener).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peer(pub(crate) std::net::SocketAddr);

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, NoDelay>> for Peer {
    fn connect_info(stream: axum::serve::IncomingStream<'_, NoDelay>) -> Self {
        Self(*stream.remote_addr())
    }
}

impl
    axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, crate::tls::TlsListener>>
    for Peer
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, crate::tls::TlsListener>) -> Self {
        Self(*stream.remote_addr())
    }
}

/// The plain listener of [`crate::Server::serve`]: TCP with `TCP_NODELAY` set on every
/// connection (small request and response writes must not wait for delayed ACKs).
pub(crate) struct NoDelay(pub(crate) tokio::net::TcpListener);

impl axum::serve::Listener for NoDelay {
    type Io = tokio::net::TcpStream;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let (tcp, addr) = axum::serve::Listener::accept(&mut self.0).await;
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY not set");
        }
        (tcp, addr)
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.0.local_addr()
    }
}
