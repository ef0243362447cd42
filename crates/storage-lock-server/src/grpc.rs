//! `storagelock.v1.LockService`: the unary operations (the same ones the HTTP routes call) and
//! the session stream.
//!
//! # Sessions
//!
//! The stream is the session. The client's first message opens it with a TTL; the server then
//! holds the session's locks with that lease under one owner id of its own, renews them every
//! TTL/3 while the client pings at least once per TTL, and answers each acquire and release on
//! the stream. The session ends when the client closes the stream, the connection breaks, or
//! no ping arrives within a TTL — then the server releases all its locks at once. A renewal the
//! storage refuses or does not answer ends that lock's hold right away: the server sends `Lost`
//! (fail-closed; the lock's lease then runs out on its own if the storage did not hear of it).
//! Acquires waiting when the session ends are cancelled, and a grant that lands afterwards is
//! released.
//!
//! On a graceful server shutdown, sessions end with the connections: their locks are released.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use storage_lock_core::OwnerId;
use storage_lock_proto::v1 as pb;
use storage_lock_proto::v1::lock_service_server::LockService;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::api::{
    AcquireBody, AppState, Caller, ForceReleaseBody, GetQuery, Holder, ListQuery, LockInfo,
    ReleaseBody, RenewBody, WhileState,
};
use crate::error::ApiError;

/// How long the first message (`Open`) may take.
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);
/// The shortest session TTL.
const MIN_TTL_MS: u64 = 100;

pub(crate) struct Grpc {
    pub(crate) st: Arc<AppState>,
}

impl From<ApiError> for Status {
    fn from(e: ApiError) -> Self {
        let code = match e.status() {
            StatusCode::CONFLICT => tonic::Code::Aborted,
            StatusCode::GONE => tonic::Code::FailedPrecondition,
            StatusCode::UNAUTHORIZED => tonic::Code::Unauthenticated,
            StatusCode::FORBIDDEN => tonic::Code::PermissionDenied,
            StatusCode::SERVICE_UNAVAILABLE => tonic::Code::Unavailable,
            StatusCode::NOT_FOUND => tonic::Code::NotFound,
            s if s.is_client_error() => tonic::Code::InvalidArgument,
            _ => tonic::Code::Internal,
        };
        let body = e.body();
        let message = match &body.reason {
            Some(reason) => format!("{}: {reason}", body.error),
            None => body.message.clone(),
        };
        let mut status = Status::new(code, message);
        if let Ok(v) = body.error.parse() {
            status.metadata_mut().insert("x-error-code", v);
        }
        status
    }
}

fn holder_in(h: pb::Holder) -> Holder {
    Holder {
        host: h.host,
        pid: h.pid,
        note: h.note,
    }
}

fn holder_out(h: Holder) -> pb::Holder {
    pb::Holder {
        host: h.host,
        pid: h.pid,
        note: h.note,
    }
}

fn info_out(i: LockInfo) -> pb::LockInfo {
    pb::LockInfo {
        name: i.name,
        state: serde_json::to_value(i.state)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default(),
        fencing_token: i.fencing_token,
        holder: i.holder.map(holder_out),
        acquired_at: i.acquired_at,
        expires_at: i.expires_at,
        expires_in_ms: i.expires_in_ms,
        revision: i.revision,
    }
}

impl Grpc {
    fn caller<T>(&self, req: &Request<T>) -> Result<Caller, Status> {
        let value = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        Ok(Caller::from_authorization(&self.st, value)?)
    }
}

#[tonic::async_trait]
impl LockService for Grpc {
    async fn acquire(
        &self,
        req: Request<pb::AcquireRequest>,
    ) -> Result<Response<pb::Hold>, Status> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let body = AcquireBody {
            lease_ms: r.lease_ms,
            wait_ms: r.wait_ms,
            owner: (!r.owner.is_empty()).then_some(r.owner),
            note: r.note,
            holder: r.holder.map(holder_in),
        };
        let h = self.st.acquire(&caller, r.name, body).await?;
        Ok(Response::new(pb::Hold {
            name: h.name,
            owner: h.owner,
            fencing_token: h.fencing_token,
            lease_ms: h.lease_ms,
            expires_in_ms: h.expires_in_ms,
            expires_at: h.expires_at,
        }))
    }

    async fn renew(&self, req: Request<pb::RenewRequest>) -> Result<Response<pb::Renewed>, Status> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let body = RenewBody {
            owner: r.owner,
            lease_ms: r.lease_ms,
        };
        let h = self.st.renew(&caller, r.name, body).await?;
        Ok(Response::new(pb::Renewed {
            name: h.name,
            lease_ms: h.lease_ms,
            expires_in_ms: h.expires_in_ms,
            expires_at: h.expires_at,
        }))
    }

    async fn release(
        &self,
        req: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let done = self
            .st
            .release(&caller, r.name, ReleaseBody { owner: r.owner })
            .await?;
        Ok(Response::new(pb::ReleaseResponse {
            released: done.released,
        }))
    }

    async fn force_release(
        &self,
        req: Request<pb::ForceReleaseRequest>,
    ) -> Result<Response<pb::ForceReleaseResponse>, Status> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let body = ForceReleaseBody {
            expected_fencing_token: r.expected_fencing_token,
            reason: r.reason,
        };
        let done = self.st.force_release(&caller, r.name, body).await?;
        Ok(Response::new(pb::ForceReleaseResponse {
            released: done.released,
            fencing_token: done.fencing_token,
            holder: done.holder.map(holder_out),
        }))
    }

    async fn get(&self, req: Request<pb::GetRequest>) -> Result<Response<pb::LockInfo>, Status> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let q = GetQuery {
            wait_ms: Some(r.wait_ms),
            while_: r.while_held.then_some(WhileState::Held),
        };
        Ok(Response::new(info_out(
            self.st.get(&caller, r.name, q).await?,
        )))
    }

    async fn list(&self, req: Request<pb::ListRequest>) -> Result<Response<pb::LockList>, Status> {
        let caller = self.caller(&req)?;
        let r = req.into_inner();
        let q = ListQuery {
            prefix: Some(r.prefix),
            cursor: r.cursor,
            limit: Some(if r.limit == 0 { 100 } else { r.limit as usize }),
        };
        let page = self.st.list(&caller, q).await?;
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
        tokio::spawn(Session::run(self.st.clone(), caller, inbound, tx));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

type Events = mpsc::Sender<Result<pb::SessionEvent, Status>>;

/// One session's state, owned by its task.
struct Session {
    st: Arc<AppState>,
    caller: Caller,
    owner_text: String,
    ttl_ms: u64,
    holder: Option<Holder>,
    /// Held locks: name → fencing token.
    held: HashMap<String, u64>,
    out: Events,
}

/// What a finished acquire of the session reports back to the session task.
struct Finished {
    request_id: u64,
    name: String,
    result: Result<(u64, u64), ApiError>,
}

fn event(kind: pb::session_event::Kind) -> Result<pb::SessionEvent, Status> {
    Ok(pb::SessionEvent { kind: Some(kind) })
}

impl Session {
    async fn run(
        st: Arc<AppState>,
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
        if open.ttl_ms < MIN_TTL_MS || open.ttl_ms > crate::MAX_LEASE_MS {
            let _ = out
                .send(Err(Status::invalid_argument(format!(
                    "ttl_ms must be {MIN_TTL_MS}..={}",
                    crate::MAX_LEASE_MS
                ))))
                .await;
            return;
        }
        let owner = OwnerId::random();
        let mut s = Session {
            st,
            caller,
            owner_text: format!("{:032x}", owner.as_u128()),
            ttl_ms: open.ttl_ms,
            holder: open.holder.map(holder_in),
            held: HashMap::new(),
            out,
        };
        let ttl = Duration::from_millis(open.ttl_ms);
        let _ = s
            .out
            .send(event(pb::session_event::Kind::Opened(pb::Opened {
                ttl_ms: open.ttl_ms,
            })))
            .await;
        let (done_tx, mut done_rx) = mpsc::channel::<Finished>(64);
        let mut acquiring = JoinSet::new();
        let mut last_ping = tokio::time::Instant::now();
        let mut tick = tokio::time::interval(ttl / 3);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await; // the first tick is immediate
        let why = loop {
            tokio::select! {
                msg = inbound.message() => match msg {
                    Ok(Some(pb::SessionRequest { kind: Some(kind) })) => match kind {
                        Kind::Ping(p) => {
                            last_ping = tokio::time::Instant::now();
                            s.send(pb::session_event::Kind::Pong(pb::Pong { seq: p.seq })).await;
                        }
                        Kind::Acquire(a) => {
                            let body = AcquireBody {
                                lease_ms: s.ttl_ms,
                                wait_ms: a.wait_ms,
                                owner: Some(s.owner_text.clone()),
                                note: a.note,
                                holder: s.holder.clone(),
                            };
                            let (st, caller, done) = (s.st.clone(), s.caller.clone(), done_tx.clone());
                            acquiring.spawn(async move {
                                let result = st
                                    .acquire(&caller, a.name.clone(), body)
                                    .await
                                    .map(|h| (h.fencing_token, h.expires_in_ms));
                                let _ = done.send(Finished { request_id: a.request_id, name: a.name, result }).await;
                            });
                        }
                        Kind::Release(r) => s.release(r).await,
                        Kind::Open(_) => {
                            s.send(pb::session_event::Kind::Error(pb::Error {
                                request_id: 0,
                                code: "invalid_options".into(),
                                message: "the session is already open".into(),
                            }))
                            .await;
                        }
                    },
                    Ok(Some(pb::SessionRequest { kind: None })) => {}
                    Ok(None) => break "closed by the client",
                    Err(_) => break "transport error",
                },
                Some(done) = done_rx.recv() => s.finished(done).await,
                _ = tick.tick() => {
                    if last_ping.elapsed() > ttl {
                        break "no ping within the TTL";
                    }
                    s.renew_all().await;
                }
            }
        };
        // Cancel waiting acquires (a grant that lands after this is released by the engine),
        // then release everything held, including grants still in the channel.
        acquiring.shutdown().await;
        done_rx.close();
        while let Ok(done) = done_rx.try_recv() {
            if let Ok((fencing, _)) = done.result {
                s.held.insert(done.name, fencing);
            }
        }
        tracing::debug!(locks = s.held.len(), why, "session ended");
        let held: Vec<String> = s.held.drain().map(|(name, _)| name).collect();
        for name in held {
            let body = ReleaseBody {
                owner: s.owner_text.clone(),
            };
            if let Err(e) = s.st.release(&s.caller, name, body).await {
                tracing::warn!(error = ?e, "release at the end of a session failed");
            }
        }
    }

    async fn send(&self, kind: pb::session_event::Kind) {
        let _ = self.out.send(event(kind)).await;
    }

    async fn finished(&mut self, done: Finished) {
        use pb::session_event::Kind;
        let kind = match done.result {
            Ok((fencing, expires_in_ms)) => {
                self.held.insert(done.name.clone(), fencing);
                Kind::Acquired(pb::Acquired {
                    request_id: done.request_id,
                    name: done.name,
                    fencing_token: fencing,
                    expires_in_ms,
                })
            }
            Err(e) if e.status() == StatusCode::CONFLICT => {
                let body = e.body();
                Kind::Busy(pb::Busy {
                    request_id: done.request_id,
                    name: done.name,
                    holder: body.holder.clone().map(holder_out),
                    expires_in_ms: body.expires_in_ms,
                })
            }
            Err(e) => {
                let body = e.body();
                Kind::Error(pb::Error {
                    request_id: done.request_id,
                    code: body.error.clone(),
                    message: body.message.clone(),
                })
            }
        };
        self.send(kind).await;
    }

    async fn release(&mut self, r: pb::SessionRelease) {
        use pb::session_event::Kind;
        let released = if self.held.remove(&r.name).is_some() {
            let body = ReleaseBody {
                owner: self.owner_text.clone(),
            };
            match self.st.release(&self.caller, r.name.clone(), body).await {
                Ok(done) => done.released,
                Err(e) => {
                    let body = e.body();
                    self.send(Kind::Error(pb::Error {
                        request_id: r.request_id,
                        code: body.error.clone(),
                        message: body.message.clone(),
                    }))
                    .await;
                    return;
                }
            }
        } else {
            false
        };
        self.send(Kind::Released(pb::Released {
            request_id: r.request_id,
            name: r.name,
            released,
        }))
        .await;
    }

    /// Renews every held lock; a lock whose renewal is not confirmed is dropped and reported
    /// `Lost` at once.
    async fn renew_all(&mut self) {
        let names: Vec<(String, u64)> = self.held.iter().map(|(n, f)| (n.clone(), *f)).collect();
        for (name, fencing) in names {
            let body = RenewBody {
                owner: self.owner_text.clone(),
                lease_ms: self.ttl_ms,
            };
            let reason = match self.st.renew(&self.caller, name.clone(), body).await {
                Ok(_) => continue,
                Err(e) => e
                    .body()
                    .reason
                    .clone()
                    .unwrap_or_else(|| "unconfirmed".to_owned()),
            };
            self.held.remove(&name);
            self.send(pb::session_event::Kind::Lost(pb::Lost {
                name,
                fencing_token: fencing,
                reason,
            }))
            .await;
        }
    }
}
