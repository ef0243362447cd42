//! `storagelock.v1.LockService`: the unary operations (the same ones the HTTP routes call) and
//! the session stream.
//!
//! # Sessions
//!
//! The stream is the session. The client's first message opens it with a TTL (100 ms – 10 min);
//! each acquire on it holds the lock with that lease under an owner id of its own (so the
//! session is not reentrant: a second acquire of a name it holds waits like anyone's), the
//! server renews the session's locks every TTL/3 while the client pings at least once per TTL,
//! and answers each acquire and release on the stream. A pong is sent only after a renewal round
//! that started at most TTL/3 earlier and confirmed every lock (a lock a round could not confirm
//! is reported `Lost` first, on the same ordered stream) — so a pong proves the storage keeps
//! every remaining hold for at least 2/3 TTL after the ping was sent, which is what clients
//! count their local deadlines on. A renewal the storage refuses or does not answer ends that
//! hold right away: `Lost` (fail-closed; the lease runs out on its own).
//!
//! How a session ends decides what happens to its locks:
//! * the client closes the stream — it let go: released at once;
//! * no ping within a TTL — released at once (the client's own deadline has passed);
//! * the connection breaks — the client may not know yet: released at the last ping + TTL;
//! * the server shuts down (SIGTERM) — every lock is reported `Lost` and left to its lease (no
//!   release a client could race), and the stream ends so the shutdown can finish.
//!
//! Acquires waiting when the session ends are cancelled, and a grant that lands afterwards is
//! released.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use storage_lock_core::{HolderInfo, OwnerId};
use storage_lock_proto::v1 as pb;
use storage_lock_proto::v1::lock_service_server::LockService as GrpcService;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use storage_lock_wire::{millis, rfc3339};

use crate::error::{ErrorKind, ServiceError};
use crate::service::{self, Caller, LockService, LockView};

/// How long the first message (`Open`) may take.
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);
/// The shortest session TTL.
const MIN_TTL_MS: u64 = 100;

pub(crate) struct Grpc {
    pub(crate) svc: Arc<LockService>,
}

impl From<ServiceError> for Status {
    fn from(e: ServiceError) -> Self {
        // The one mapping of error kinds to gRPC codes (HTTP's is `ErrorKind::http_status`).
        let code = match e.kind() {
            ErrorKind::Busy => tonic::Code::Aborted,
            ErrorKind::Lost | ErrorKind::Unprocessable => tonic::Code::FailedPrecondition,
            ErrorKind::Unauthenticated => tonic::Code::Unauthenticated,
            ErrorKind::Forbidden => tonic::Code::PermissionDenied,
            ErrorKind::Unavailable => tonic::Code::Unavailable,
            ErrorKind::NotFound => tonic::Code::NotFound,
            ErrorKind::MethodNotAllowed => tonic::Code::Unimplemented,
            ErrorKind::BadInput | ErrorKind::TooLarge | ErrorKind::UnsupportedMedia => {
                tonic::Code::InvalidArgument
            }
            ErrorKind::Internal => tonic::Code::Internal,
        };
        let message = match e.lost_reason() {
            Some(why) => format!("{}: {}", e.code(), why.code()),
            None => e.message().to_owned(),
        };
        let mut status = Status::new(code, message);
        status.metadata_mut().insert(
            "x-error-code",
            tonic::metadata::MetadataValue::from_static(e.code()),
        );
        status
    }
}

fn holder_in(h: pb::Holder) -> HolderInfo {
    HolderInfo {
        host: h.host,
        pid: h.pid,
        note: h.note,
    }
}

fn holder_out(h: &HolderInfo) -> pb::Holder {
    pb::Holder {
        host: h.host.clone(),
        pid: h.pid,
        note: h.note.clone(),
    }
}

fn info_out(v: LockView) -> pb::LockInfo {
    pb::LockInfo {
        name: v.name,
        state: v.state.as_str().to_owned(),
        fencing_token: v.fencing,
        holder: v.holder.as_deref().map(holder_out),
        acquired_at: v.acquired_at.map(rfc3339),
        expires_at: v.expires_at.map(rfc3339),
        expires_in_ms: v.expires_in.map(millis),
        revision: v.revision,
    }
}

impl Grpc {
    fn caller<T>(&self, req: &Request<T>) -> Result<Caller, Status> {
        let value = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        let peer = req
            .extensions()
            .get::<axum::extract::ConnectInfo<crate::listen::Peer>>()
            .map(|c| c.0.0.ip())
            .or_else(|| req.remote_addr().map(|a| a.ip()));
        Ok(Caller::from_authorization(&self.svc, value)?.connected_from(peer))
    }
}

#[tonic::async_trait]
impl GrpcService for Grpc {
    async fn acquire(
        &self,
        req: Request<pb::AcquireRequest>,
    ) -> Result<Response<pb::Hold>, Status> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let owner = (!r.owner.is_empty())
            .then(|| service::parse_owner(&r.owner))
            .transpose()?;
        let a = service::Acquire {
            lease: Duration::from_millis(r.lease_ms),
            wait: Duration::from_millis(r.wait_ms),
            owner,
            note: r.note,
            holder: r.holder.map(holder_in),
        };
        let g = self.svc.acquire(&caller, &r.name, a).await?;
        Ok(Response::new(pb::Hold {
            name: r.name,
            owner: g.owner.to_string(),
            fencing_token: g.fencing,
            lease_ms: millis(g.lease),
            expires_in_ms: millis(g.expires_in),
            expires_at: rfc3339(g.expires_at),
        }))
    }

    async fn renew(&self, req: Request<pb::RenewRequest>) -> Result<Response<pb::Renewed>, Status> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let owner = service::parse_owner(&r.owner)?;
        let done = self
            .svc
            .renew(&caller, &r.name, owner, Duration::from_millis(r.lease_ms))
            .await?;
        Ok(Response::new(pb::Renewed {
            name: r.name,
            lease_ms: millis(done.lease),
            expires_in_ms: millis(done.lease),
            expires_at: rfc3339(done.expires_at),
        }))
    }

    async fn release(
        &self,
        req: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let owner = service::parse_owner(&r.owner)?;
        let fencing_token = self.svc.release(&caller, &r.name, owner).await?;
        Ok(Response::new(pb::ReleaseResponse {
            released: fencing_token.is_some(),
            fencing_token,
        }))
    }

    async fn force_release(
        &self,
        req: Request<pb::ForceReleaseRequest>,
    ) -> Result<Response<pb::ForceReleaseResponse>, Status> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let f = service::ForceRelease {
            expected: r.expected_fencing_token,
            reason: r.reason,
        };
        let ended = self.svc.force_release(&caller, &r.name, f).await?;
        Ok(Response::new(pb::ForceReleaseResponse {
            released: ended.is_some(),
            fencing_token: ended.as_ref().map(|e| e.fencing),
            holder: ended
                .as_ref()
                .and_then(|e| e.holder.as_deref())
                .map(holder_out),
        }))
    }

    async fn get(&self, req: Request<pb::GetRequest>) -> Result<Response<pb::LockInfo>, Status> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let read = service::Read {
            wait: Duration::from_millis(r.wait_ms),
            while_held: r.while_held,
        };
        Ok(Response::new(info_out(
            self.svc.get(&caller, &r.name, read).await?,
        )))
    }

    async fn list(&self, req: Request<pb::ListRequest>) -> Result<Response<pb::LockList>, Status> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let list = service::List {
            prefix: r.prefix,
            cursor: r.cursor,
            limit: Some(if r.limit == 0 {
                storage_lock_wire::DEFAULT_PAGE
            } else {
                usize::try_from(r.limit).unwrap_or(usize::MAX)
            }),
        };
        let page = self.svc.list(&caller, list).await?;
        Ok(Response::new(pb::LockList {
            locks: page.locks.into_iter().map(info_out).collect(),
            next_cursor: page.next_cursor,
        }))
    }

    type SessionStream = ReceiverStream<Result<pb::SessionEvent, Status>>;

    async fn session(
        &self,
        req: Request<tonic::Streaming<pb::SessionRequest>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        let caller = self.caller(&req)?;
        let inbound = req.into_inner();
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(Session::run(self.svc.clone(), caller, inbound, tx));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

type Events = mpsc::Sender<Result<pb::SessionEvent, Status>>;

/// The longest session TTL: 10 minutes (a half-open connection keeps its locks up to a TTL).
const MAX_TTL_MS: u64 = 600_000;
/// Acquires one session may have waiting at once.
const MAX_ACQUIRING: usize = 64;

/// One hold of the session: each acquire has an owner of its own, so a second acquire of a
/// name the session holds waits like anyone else's (not reentrant) and gets its own token.
struct Held {
    owner: OwnerId,
    fencing: u64,
}

/// One session's state, owned by its task.
struct Session {
    svc: Arc<LockService>,
    caller: Caller,
    ttl: Duration,
    holder: Option<HolderInfo>,
    held: HashMap<String, Held>,
    out: Events,
    /// When the last renewal round that confirmed every held lock *started*: a pong is sent only
    /// if it started at most TTL/3 ago, so a pong proves the storage keeps every hold of the
    /// session for at least 2/3 TTL after the ping was sent (what the client counts on).
    last_round: tokio::time::Instant,
}

/// What a finished acquire of the session reports back to the session task.
struct Finished {
    request_id: u64,
    name: String,
    owner: OwnerId,
    result: Result<service::Granted, ServiceError>,
}

fn event(kind: pb::session_event::Kind) -> Result<pb::SessionEvent, Status> {
    Ok(pb::SessionEvent { kind: Some(kind) })
}

/// Why a session ended, which decides what happens to its locks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// The client closed the stream: it let go of everything; release at once.
    Closed,
    /// No ping within the TTL: the client may believe it holds until its last ping + 2/3 TTL,
    /// which has passed; release at once.
    Silent,
    /// The connection broke: the client may still believe it holds its locks until its last
    /// ping + 2/3 TTL; release no earlier than the last ping + TTL.
    Broken,
    /// The server is shutting down: tell the client its locks are lost, stop renewing, and
    /// leave the holds to their leases (no release the client could race).
    Shutdown,
}

/// Counts an open session in `storage_lock_grpc_sessions` while it lives (and once in
/// `storage_lock_grpc_sessions_total`), however the session ends.
struct OpenSession;

impl OpenSession {
    fn count() -> Self {
        metrics::counter!("storage_lock_grpc_sessions_total").increment(1);
        metrics::gauge!("storage_lock_grpc_sessions").increment(1.0);
        Self
    }
}

impl Drop for OpenSession {
    fn drop(&mut self) {
        metrics::gauge!("storage_lock_grpc_sessions").decrement(1.0);
    }
}

impl Session {
    async fn run(
        svc: Arc<LockService>,
        caller: Caller,
        mut inbound: tonic::Streaming<pb::SessionRequest>,
        out: Events,
    ) {
        use pb::session_request::Kind;
        let open = match tokio::time::timeout(OPEN_TIMEOUT, inbound.message()).await {
            Ok(Ok(Some(pb::SessionRequest {
                kind: Some(Kind::Open(open)),
            }))) => open,
            _ => {
                let _ = out
                    .send(Err(Status::invalid_argument(
                        "the first message of a session must be Open",
                    )))
                    .await;
                return;
            }
        };
        if !(MIN_TTL_MS..=MAX_TTL_MS).contains(&open.ttl_ms) {
            let _ = out
                .send(Err(Status::invalid_argument(format!(
                    "ttl_ms must be {MIN_TTL_MS}..={MAX_TTL_MS}"
                ))))
                .await;
            return;
        }
        let ttl = Duration::from_millis(open.ttl_ms);
        let mut s = Session {
            svc,
            caller,
            ttl,
            holder: open.holder.map(holder_in),
            held: HashMap::new(),
            out,
            last_round: tokio::time::Instant::now(),
        };
        // Declared after `s`, so dropped before it: the gauge is down before the client sees
        // the stream end (`s` holds the sender).
        let _open = OpenSession::count();
        s.send(pb::session_event::Kind::Opened(pb::Opened {
            ttl_ms: open.ttl_ms,
        }))
        .await;
        // Unbounded: an acquire that finishes must never be lost in a full channel.
        let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Finished>();
        let mut acquiring = JoinSet::new();
        let mut last_ping = tokio::time::Instant::now();
        let mut tick = tokio::time::interval(ttl / 3);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await; // the first tick is immediate
        let shutdown = s.svc.shutdown.clone();
        let end = loop {
            tokio::select! {
                msg = inbound.message() => match msg {
                    Ok(Some(pb::SessionRequest { kind: Some(kind) })) => match kind {
                        Kind::Ping(p) => {
                            last_ping = tokio::time::Instant::now();
                            if s.last_round.elapsed() > ttl / 3 {
                                s.renew_all().await; // a pong must not outrun the renewals
                            }
                            s.send(pb::session_event::Kind::Pong(pb::Pong { seq: p.seq })).await;
                        }
                        Kind::Acquire(a) if acquiring.len() >= MAX_ACQUIRING => {
                            s.error(a.request_id, "invalid_options", "too many acquires waiting in this session").await;
                        }
                        Kind::Acquire(a) => {
                            let owner = OwnerId::random();
                            let req = service::Acquire {
                                lease: s.ttl,
                                wait: Duration::from_millis(a.wait_ms),
                                owner: Some(owner),
                                note: a.note,
                                holder: s.holder.clone(),
                            };
                            let (svc, caller, done) = (s.svc.clone(), s.caller.clone(), done_tx.clone());
                            acquiring.spawn(async move {
                                let result = svc.acquire(&caller, &a.name, req).await;
                                let _ = done.send(Finished { request_id: a.request_id, name: a.name, owner, result });
                            });
                        }
                        Kind::Release(r) => s.release(r).await,
                        Kind::Open(_) => {
                            s.error(0, "invalid_options", "the session is already open").await;
                        }
                    },
                    Ok(Some(pb::SessionRequest { kind: None })) => {}
                    Ok(None) => break End::Closed,
                    Err(_) => break End::Broken,
                },
                Some(done) = done_rx.recv() => s.finished(done).await,
                Some(_) = acquiring.join_next(), if !acquiring.is_empty() => {}
                _ = tick.tick() => {
                    if last_ping.elapsed() > ttl {
                        break End::Silent;
                    }
                    s.renew_all().await;
                }
                () = shutdown.cancelled() => break End::Shutdown,
            }
        };
        // Cancel waiting acquires (a grant that lands after this is released by the engine),
        // then collect grants that finished meanwhile.
        acquiring.shutdown().await;
        done_rx.close();
        while let Ok(done) = done_rx.try_recv() {
            if let Ok(g) = done.result {
                s.held.insert(
                    done.name,
                    Held {
                        owner: done.owner,
                        fencing: g.fencing,
                    },
                );
            }
        }
        tracing::debug!(locks = s.held.len(), end = ?end, "session ended");
        match end {
            End::Shutdown => {
                let held: Vec<(String, u64)> =
                    s.held.drain().map(|(name, h)| (name, h.fencing)).collect();
                for (name, fencing_token) in held {
                    s.send(pb::session_event::Kind::Lost(pb::Lost {
                        name,
                        fencing_token,
                        reason: "server_shutdown".into(),
                    }))
                    .await;
                }
                return;
            }
            End::Broken => tokio::time::sleep_until(last_ping + ttl).await,
            End::Closed | End::Silent => {}
        }
        for (name, h) in std::mem::take(&mut s.held) {
            if let Err(e) = s.svc.release(&s.caller, &name, h.owner).await {
                tracing::warn!(error = %e.message(), "release at the end of a session failed");
            }
        }
    }

    async fn send(&self, kind: pb::session_event::Kind) {
        let _ = self.out.send(event(kind)).await;
    }

    async fn error(&self, request_id: u64, code: &str, message: &str) {
        self.send(pb::session_event::Kind::Error(pb::Error {
            request_id,
            code: code.into(),
            message: message.into(),
        }))
        .await;
    }

    async fn finished(&mut self, done: Finished) {
        use pb::session_event::Kind;
        let kind = match done.result {
            Ok(g) => {
                self.held.insert(
                    done.name.clone(),
                    Held {
                        owner: done.owner,
                        fencing: g.fencing,
                    },
                );
                Kind::Acquired(pb::Acquired {
                    request_id: done.request_id,
                    name: done.name,
                    fencing_token: g.fencing,
                    expires_in_ms: millis(g.expires_in),
                })
            }
            Err(e) => match e.busy_detail() {
                Some(busy) => Kind::Busy(pb::Busy {
                    request_id: done.request_id,
                    name: done.name,
                    holder: busy.holder.as_deref().map(holder_out),
                    expires_in_ms: Some(millis(busy.left)),
                }),
                None => Kind::Error(pb::Error {
                    request_id: done.request_id,
                    code: e.code().to_owned(),
                    message: e.message().to_owned(),
                }),
            },
        };
        self.send(kind).await;
    }

    async fn release(&mut self, r: pb::SessionRelease) {
        use pb::session_event::Kind;
        let released = match self.held.remove(&r.name) {
            Some(h) => match self.svc.release(&self.caller, &r.name, h.owner).await {
                Ok(fencing) => fencing,
                Err(e) => {
                    self.error(r.request_id, e.code(), e.message()).await;
                    return;
                }
            },
            None => None,
        };
        self.send(Kind::Released(pb::Released {
            request_id: r.request_id,
            name: r.name,
            released: released.is_some(),
            fencing_token: released,
        }))
        .await;
    }

    /// Renews every held lock; a lock whose renewal is not confirmed is dropped and reported
    /// `Lost` at once.
    async fn renew_all(&mut self) {
        let started = tokio::time::Instant::now();
        let names: Vec<(String, OwnerId, u64)> = self
            .held
            .iter()
            .map(|(n, h)| (n.clone(), h.owner, h.fencing))
            .collect();
        for (name, owner, fencing) in names {
            let reason = match self.svc.renew(&self.caller, &name, owner, self.ttl).await {
                Ok(_) => continue,
                Err(e) => e
                    .lost_reason()
                    .map_or("unconfirmed", storage_lock_core::HoldGone::code)
                    .to_owned(),
            };
            self.held.remove(&name);
            self.send(pb::session_event::Kind::Lost(pb::Lost {
                name,
                fencing_token: fencing,
                reason,
            }))
            .await;
        }
        self.last_round = started;
    }
}
