//! [`SessionLock`]: locks held by a gRPC session (feature `grpc`).
//!
//! One bidirectional stream is the session. The server renews the session's locks while this
//! client pings, and releases all of them when the stream ends — when this process exits or is
//! killed, within the session TTL at the latest. No renewal traffic per lock leaves the client:
//! a handle's watchdog only checks, by a ping round trip, that the session is alive and that the
//! server has not reported the lock `Lost`.
//!
//! **Local deadline.** The server answers a ping only after a renewal round that started at most
//! TTL/3 earlier and confirmed every lock of the session (a lock it could not confirm is
//! reported `Lost` first, on the same ordered stream); each renewal extends the hold by one TTL.
//! So after a pong the storage keeps the hold for at least `ping sent + 2/3 TTL`. Handles count
//! exactly that (minus the safety margin) from the instant before each ping was sent — whatever
//! lease `try_renew` asks for — and check every TTL/6. A client paused past it finds its handle
//! lost. One acquire request waits at most TTL/3 on the server (longer waits are several
//! requests), so a fresh grant's deadline is never spent waiting.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use storage_lock_core::clock::BootInstant;
use storage_lock_core::contract::validate_name;
use storage_lock_core::hold::{HoldGrant, HoldIo};
use storage_lock_core::{
    AcquireOptions, DistributedLock, LockError, LockHandle, ProviderInfo, StorageError, Wait,
};
use storage_lock_proto::v1 as pb;
use storage_lock_proto::v1::lock_service_client::LockServiceClient;
use tokio::sync::{mpsc, oneshot};
use tonic::transport::Channel;

const NAME: &str = "remote-session";
/// The longest one acquire request of the session waits (the server's cap).
const MAX_WAIT: Duration = Duration::from_secs(30);
/// How long a ping or a release may take before it counts as unanswered.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// An answer to one request of the session.
enum Reply {
    Acquired { fencing: u64, expires_in_ms: u64 },
    Busy,
    Released,
    Error { code: String, message: String },
}

/// The session's state, shared with the task that reads the server's events.
struct Shared {
    next_id: AtomicU64,
    pending: Mutex<HashMap<u64, oneshot::Sender<Reply>>>,
    pings: Mutex<HashMap<u64, oneshot::Sender<()>>>,
    /// Holds the server reported lost: (name, fencing token).
    lost: Mutex<HashSet<(String, u64)>>,
    closed: AtomicBool,
}

/// The sending half: while it lives (in a [`SessionLock`] clone or a handle) the session does;
/// when it drops, the stream ends and the server releases the session's locks.
struct Inner {
    tx: mpsc::Sender<pb::SessionRequest>,
    ttl: Duration,
    shared: Arc<Shared>,
}

/// Locks held by one gRPC session with a lock server (see the module docs).
///
/// Cheap to clone; the session ends when the last clone and every handle are dropped, or with
/// the process.
#[derive(Clone)]
pub struct SessionLock {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SessionLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionLock")
            .field("ttl", &self.inner.ttl)
            .finish_non_exhaustive()
    }
}

fn request(kind: pb::session_request::Kind) -> pb::SessionRequest {
    pb::SessionRequest { kind: Some(kind) }
}

fn unavailable(reason: impl Into<String>) -> LockError {
    LockError::Storage(StorageError::backend(NAME, "session", reason.into()))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    fn is_lost(&self, name: &str, fencing: u64) -> bool {
        self.closed.load(Ordering::Acquire)
            || lock(&self.lost).contains(&(name.to_owned(), fencing))
    }
}

impl Inner {
    fn id(&self) -> u64 {
        self.shared.id()
    }

    fn is_lost(&self, name: &str, fencing: u64) -> bool {
        self.shared.is_lost(name, fencing)
    }

    /// Sends `kind` as request `id` and waits for its reply. If this future is dropped, the
    /// request is forgotten: a grant that answers it later is released by the reader.
    async fn call(&self, id: u64, kind: pb::session_request::Kind) -> Result<Reply, LockError> {
        struct Forget<'a>(&'a Shared, u64);
        impl Drop for Forget<'_> {
            fn drop(&mut self) {
                lock(&self.0.pending).remove(&self.1);
            }
        }
        let (tx, rx) = oneshot::channel();
        lock(&self.shared.pending).insert(id, tx);
        let _forget = Forget(&self.shared, id);
        if self.shared.closed.load(Ordering::Acquire) || self.tx.send(request(kind)).await.is_err()
        {
            return Err(unavailable("the session has ended"));
        }
        rx.await.map_err(|_| unavailable("the session has ended"))
    }

    /// A ping round trip: `true` if the server answered (everything it sent before — `Lost`
    /// included — has been processed then).
    async fn ping(&self) -> bool {
        let seq = self.id();
        let (tx, rx) = oneshot::channel();
        lock(&self.shared.pings).insert(seq, tx);
        let sent = self
            .tx
            .send(request(pb::session_request::Kind::Ping(pb::Ping { seq })))
            .await
            .is_ok();
        let answered = sent && matches!(tokio::time::timeout(ANSWER_TIMEOUT, rx).await, Ok(Ok(())));
        if !answered {
            lock(&self.shared.pings).remove(&seq);
        }
        answered
    }
}

impl Shared {
    /// Dispatches the server's events until the stream ends; then the session is over. Holds
    /// only a weak sender, so that it never keeps the session alive.
    async fn read(
        self: Arc<Self>,
        mut events: tonic::Streaming<pb::SessionEvent>,
        tx: mpsc::WeakSender<pb::SessionRequest>,
    ) {
        use pb::session_event::Kind;
        while let Ok(Some(ev)) = events.message().await {
            let (id, reply) = match ev.kind {
                Some(Kind::Pong(p)) => {
                    if let Some(tx) = lock(&self.pings).remove(&p.seq) {
                        let _ = tx.send(());
                    }
                    continue;
                }
                Some(Kind::Lost(l)) => {
                    tracing::warn!(name = %l.name, reason = %l.reason, "session lock lost");
                    lock(&self.lost).insert((l.name, l.fencing_token));
                    continue;
                }
                Some(Kind::Acquired(a)) => {
                    let reply = Reply::Acquired {
                        fencing: a.fencing_token,
                        expires_in_ms: a.expires_in_ms,
                    };
                    // Nobody waits any more (the acquire future was dropped): release it.
                    if !lock(&self.pending).contains_key(&a.request_id) {
                        let id = self.id();
                        let Some(tx) = tx.upgrade() else { continue };
                        let _ = tx
                            .send(request(pb::session_request::Kind::Release(
                                pb::SessionRelease {
                                    request_id: id,
                                    name: a.name,
                                },
                            )))
                            .await;
                        continue;
                    }
                    (a.request_id, reply)
                }
                Some(Kind::Busy(b)) => (b.request_id, Reply::Busy),
                Some(Kind::Released(r)) => (r.request_id, Reply::Released),
                Some(Kind::Error(e)) => (
                    e.request_id,
                    Reply::Error {
                        code: e.code,
                        message: e.message,
                    },
                ),
                Some(Kind::Opened(_)) | None => continue,
            };
            if let Some(tx) = lock(&self.pending).remove(&id) {
                let _ = tx.send(reply);
            }
        }
        self.closed.store(true, Ordering::Release);
        lock(&self.pending).clear();
        lock(&self.pings).clear();
    }
}

impl SessionLock {
    /// Opens a session with the server at `url` (`http(s)://HOST:PORT[?token=…]`, with the TLS
    /// options of [`crate::RemoteStorage::connect`]; the token also
    /// from `STORAGE_LOCK_TOKEN`), whose locks last `ttl` past the last sign of life.
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] for a TTL under 100 ms; [`LockError::Storage`] if the URL
    /// is malformed, the server cannot be reached or refuses the session.
    pub async fn open(url: &str, ttl: Duration) -> Result<Self, LockError> {
        if ttl < Duration::from_millis(100) {
            return Err(LockError::InvalidOptions {
                option: "ttl",
                reason: "a session TTL is at least 100 ms".into(),
            });
        }
        let endpoint = crate::parse_url(url)?;
        let mut channel = Channel::from_shared(endpoint.base.clone())
            .map_err(|e| StorageError::config(NAME, e.to_string()))?;
        if endpoint.is_tls() {
            let (ca, identity) = endpoint.read_tls()?;
            let mut tls = tonic::transport::ClientTlsConfig::new().with_native_roots();
            if let Some(ca) = ca {
                tls = tls.ca_certificate(tonic::transport::Certificate::from_pem(ca));
            }
            if let Some(pem) = identity {
                // One PEM with the chain and the key: tonic takes them apart.
                tls = tls.identity(tonic::transport::Identity::from_pem(&pem, &pem));
            }
            channel = channel
                .tls_config(tls)
                .map_err(|e| StorageError::config(NAME, format!("TLS: {e}")))?;
        }
        let token = endpoint.token;
        let channel = channel
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true)
            .connect()
            .await
            .map_err(|e| StorageError::backend(NAME, "connect", e))?;
        let (tx, rx) = mpsc::channel(256);
        tx.send(request(pb::session_request::Kind::Open(pb::Open {
            ttl_ms: u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX),
            holder: None,
        })))
        .await
        .map_err(|_| unavailable("the session could not start"))?;
        let mut req = tonic::Request::new(
            tonic::codegen::tokio_stream::wrappers::ReceiverStream::new(rx),
        );
        if let Some(token) = token {
            let value = format!("Bearer {token}")
                .parse()
                .map_err(|_| StorageError::config(NAME, "the token is not a valid header value"))?;
            req.metadata_mut().insert("authorization", value);
        }
        let mut events = LockServiceClient::new(channel)
            .session(req)
            .await
            .map_err(|s| unavailable(format!("the server refused the session: {}", s.message())))?
            .into_inner();
        match events.message().await {
            Ok(Some(pb::SessionEvent {
                kind: Some(pb::session_event::Kind::Opened(_)),
            })) => {}
            Ok(_) => return Err(unavailable("the server did not open the session")),
            Err(s) => {
                return Err(unavailable(format!(
                    "the server refused the session: {}",
                    s.message()
                )));
            }
        }
        let shared = Arc::new(Shared {
            next_id: AtomicU64::new(1),
            pending: Mutex::new(HashMap::new()),
            pings: Mutex::new(HashMap::new()),
            lost: Mutex::new(HashSet::new()),
            closed: AtomicBool::new(false),
        });
        tokio::spawn(shared.clone().read(events, tx.downgrade()));
        let inner = Arc::new(Inner { tx, ttl, shared });
        // Keep the session alive while it exists, handles or not.
        let weak = Arc::downgrade(&inner);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(ttl / 3).await;
                let Some(inner) = weak.upgrade() else { break };
                if inner.shared.closed.load(Ordering::Acquire) {
                    break;
                }
                // An unanswered ping is retried at the next period; handles fail closed meanwhile.
                inner.ping().await;
            }
        });
        Ok(Self { inner })
    }

    /// The session's TTL.
    pub fn ttl(&self) -> Duration {
        self.inner.ttl
    }
}

/// One hold of the session, for the handle runtime.
struct SessionHold {
    inner: Arc<Inner>,
    name: String,
    fencing: u64,
}

#[async_trait]
impl HoldIo for SessionHold {
    /// A pong vouches for 2/3 TTL from the ping (see the module docs), whatever lease is asked.
    fn vouched_lease(&self) -> Option<Duration> {
        Some(self.inner.ttl * 2 / 3)
    }

    /// Confirms the hold by a ping round trip (the server renews; see the module docs).
    async fn renew(&self, lease: Duration) -> Result<Option<SystemTime>, LockError> {
        if self.inner.is_lost(&self.name, self.fencing) {
            return Ok(None);
        }
        if !self.inner.ping().await {
            return Err(unavailable("the session did not answer a ping"));
        }
        Ok((!self.inner.is_lost(&self.name, self.fencing)).then(|| SystemTime::now() + lease))
    }

    async fn release(&self) -> Result<(), LockError> {
        if self.inner.is_lost(&self.name, self.fencing) {
            return Ok(());
        }
        let id = self.inner.id();
        let kind = pb::session_request::Kind::Release(pb::SessionRelease {
            request_id: id,
            name: self.name.clone(),
        });
        match tokio::time::timeout(ANSWER_TIMEOUT, self.inner.call(id, kind)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(unavailable("the release was not answered")),
        }
    }
}

#[async_trait]
impl DistributedLock for SessionLock {
    fn provider(&self) -> ProviderInfo {
        ProviderInfo {
            name: NAME.into(),
            process_local: false,
        }
    }

    /// Acquires `name` on the session. The session's TTL is the lease (`options.lease` and
    /// `options.auto_renew` are not used: the server renews while the session lives).
    async fn try_acquire(
        &self,
        name: &str,
        options: &AcquireOptions,
    ) -> Result<Option<LockHandle>, LockError> {
        validate_name(name)?;
        options.validate()?;
        let ttl = self.inner.ttl;
        let started = tokio::time::Instant::now();
        let deadline = match options.wait {
            Wait::Never => Some(started),
            Wait::For(d) => started.checked_add(d),
            Wait::Forever => None,
        };
        loop {
            let left = deadline.map(|d| d.saturating_duration_since(tokio::time::Instant::now()));
            // A grant after a long wait would reach a handle whose deadline (counted from the
            // request) had nearly passed: wait at most TTL/3 per request.
            let wait = left.unwrap_or(MAX_WAIT).min(MAX_WAIT).min(ttl / 3);
            let id = self.inner.id();
            let kind = pb::session_request::Kind::Acquire(pb::SessionAcquire {
                request_id: id,
                name: name.to_owned(),
                wait_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                note: options.note.clone(),
            });
            let sent_at = BootInstant::now();
            let cancel = options.cancel.clone().unwrap_or_default();
            let reply = tokio::select! {
                r = tokio::time::timeout(wait + ANSWER_TIMEOUT, self.inner.call(id, kind)) => {
                    r.map_err(|_| unavailable("the server did not answer the acquire"))??
                }
                // A grant answering this request is released by the reader.
                () = cancel.cancelled() => return Err(LockError::Cancelled),
            };
            match reply {
                Reply::Acquired {
                    fencing,
                    expires_in_ms,
                } => {
                    let held_for = ttl * 2 / 3;
                    let grant = HoldGrant::new(
                        name,
                        fencing,
                        held_for,
                        SystemTime::now() + Duration::from_millis(expires_in_ms),
                        sent_at,
                    )
                    .auto_renew(Some(ttl / 6));
                    let io = SessionHold {
                        inner: self.inner.clone(),
                        name: name.to_owned(),
                        fencing,
                    };
                    return Ok(Some(LockHandle::start(grant, io)));
                }
                Reply::Busy if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) => {
                    return Ok(None);
                }
                Reply::Busy => {}
                Reply::Released => return Err(unavailable("unexpected answer to an acquire")),
                Reply::Error { code, message } => {
                    return Err(match code.as_str() {
                        "invalid_name" => LockError::InvalidName {
                            name: name.chars().take(80).collect(),
                            reason: "refused by the server",
                        },
                        "unavailable" | "internal" => unavailable(format!("{code}: {message}")),
                        _ => LockError::Storage(StorageError::config(
                            NAME,
                            format!("{code}: {message}"),
                        )),
                    });
                }
            }
        }
    }
}
