//! [`Proxy`]: a loopback TCP proxy that can cut every connection on demand, to test what a
//! backend does when its server becomes unreachable and comes back.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::AbortHandle;

/// Forwards `127.0.0.1:<port>` to a target; [`Proxy::cut`] drops all connections and refuses
/// new ones until [`Proxy::restore`].
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    state: Arc<State>,
    accept: AbortHandle,
}

#[derive(Debug, Default)]
struct State {
    down: AtomicBool,
    pumps: Mutex<Vec<AbortHandle>>,
}

impl Proxy {
    /// Starts forwarding to `target`.
    pub async fn start(target: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(State::default());
        let st = state.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                if st.down.load(Ordering::SeqCst) {
                    continue; // dropped: the client sees the connection closed
                }
                let pump = tokio::spawn(async move {
                    if let Ok(mut server) = TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                st.pumps.lock().unwrap().push(pump.abort_handle());
            }
        })
        .abort_handle();
        Ok(Self {
            addr,
            state,
            accept,
        })
    }

    /// The address clients should connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Drops every live connection and refuses new ones.
    pub fn cut(&self) {
        self.state.down.store(true, Ordering::SeqCst);
        for pump in self.state.pumps.lock().unwrap().drain(..) {
            pump.abort();
        }
    }

    /// Accepts connections again.
    pub fn restore(&self) {
        self.state.down.store(false, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.accept.abort();
    }
}
