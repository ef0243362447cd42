//! The HTTP JSON API `/v1`: a thin adapter over [`LockService`]. Each handler reads its wire
//! types ([`storage_lock_wire`]: the OpenAPI document is generated from them), calls the
//! service, and writes its answer back; errors are [`ServiceError`]'s one HTTP mapping.
//!
//! **Fencing tokens are JSON strings** of decimal digits (`"fencing_token": "42"`): they are
//! `u64` and JavaScript numbers lose integers above 2^53. Owners are 32 hex digits (128 bits),
//! the secret that renews and releases; they are never shown in lists or reads.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use storage_lock_wire::{
    AcquireBody, ErrorBody, EventsQuery, ForceReleaseBody, ForceReleased, GetQuery, Hold,
    ListQuery, LockEventInfo, LockEvents, LockInfo, LockList, LockParts, ReleaseBody, Released,
    RenewBody, Renewed, SemaphoreLimit, SemaphoreLimitBody, SlotInfo, SlotsInfo, StorageInfo,
    SweepBody, Swept, WaiterInfo, WhileState, millis, rfc3339,
};

use crate::error::{ErrorKind, ServiceError};
use crate::service::{self, Caller, LockService, LockView};

type Shared = State<Arc<LockService>>;

/// The caller, from the `Authorization: Bearer …` header (anyone when the server has no auth),
/// and where it connected from (when the server was started by [`crate::Server::serve`]).
impl FromRequestParts<Arc<LockService>> for Caller {
    type Rejection = ServiceError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<LockService>,
    ) -> Result<Self, Self::Rejection> {
        let value = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let peer = parts
            .extensions
            .get::<axum::extract::ConnectInfo<crate::listen::Peer>>()
            .map(|c| c.0.0.ip());
        Ok(Self::from_authorization(state, value)?.connected_from(peer))
    }
}

/// The lock name of the path (validated by the operation).
fn path_name(path: Result<Path<String>, PathRejection>) -> Result<String, ServiceError> {
    Ok(path?.0)
}

/// A JSON **object** body (serde would also read a struct from an array), with every failure
/// answered by [`ServiceError`]: 415 without a JSON content type, 413 over the size limit, 400
/// otherwise.
pub(crate) struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> axum::extract::FromRequest<S> for JsonBody<T> {
    type Rejection = ServiceError;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, ServiceError> {
        let Json(value) = Json::<serde_json::Value>::from_request(req, state)
            .await
            .map_err(ServiceError::from)?;
        if !value.is_object() {
            return Err(ServiceError::bad_request(
                "invalid_body",
                "the body must be a JSON object",
            ));
        }
        serde_json::from_value(value)
            .map(JsonBody)
            .map_err(|e| ServiceError::bad_request("invalid_body", format!("invalid body: {e}")))
    }
}

/// The wire form of a lock view.
pub(crate) fn info(v: LockView) -> LockInfo {
    LockInfo {
        name: v.name,
        state: v.state,
        fencing_token: v.fencing,
        holder: v.holder.as_deref().map(Into::into),
        acquired_at: v.acquired_at.map(rfc3339),
        expires_at: v.expires_at.map(rfc3339),
        expires_in_ms: v.expires_in.map(millis),
        revision: v.revision,
    }
}

/// Acquire a lock, waiting up to `wait_ms` while another owner holds it.
///
/// Cancel safety: a client that disconnects while waiting cancels the wait, and a grant that
/// lands after the disconnect is released. A grant whose *answer* is lost stays held until its
/// lease ends — retry with the same `owner` to get it back.
#[utoipa::path(
    post, path = "/v1/locks/{name}/acquire", tag = "locks",
    params(("name" = String, Path, description = "The lock name (`/` as `%2F`)")),
    request_body = AcquireBody,
    responses(
        (status = 200, description = "Granted (or already held by this owner)", body = Hold),
        (status = 400, description = "Bad input; nothing held", body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 409, description = "Held by another owner; see Retry-After", body = ErrorBody,
            headers(("Retry-After" = u64, description = "Seconds until the hold ends unless renewed"))),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody),
        (status = 422, description = "The lock's fencing token reached the storage's bound: use another name; nothing held", body = ErrorBody),
        (status = 503, description = "The storage cannot be reached", body = ErrorBody),
    )
)]
pub(crate) async fn acquire(
    State(svc): Shared,
    caller: Caller,
    path: Result<Path<String>, PathRejection>,
    JsonBody(b): JsonBody<AcquireBody>,
) -> Result<Json<Hold>, ServiceError> {
    let name = path_name(path)?;
    let owner = b.owner.as_deref().map(service::parse_owner).transpose()?;
    let r = service::Acquire {
        lease: Duration::from_millis(b.lease_ms),
        wait: Duration::from_millis(b.wait_ms),
        owner,
        note: b.note,
        holder: b.holder.map(Into::into),
    };
    let g = svc.acquire(&caller, &name, r).await?;
    Ok(Json(Hold {
        name,
        owner: g.owner.to_string(),
        fencing_token: g.fencing,
        lease_ms: millis(g.lease),
        expires_in_ms: millis(g.expires_in),
        expires_at: rfc3339(g.expires_at),
    }))
}

/// Extend a hold to `lease_ms` from now.
#[utoipa::path(
    post, path = "/v1/locks/{name}/renew", tag = "locks",
    params(("name" = String, Path, description = "The lock name (`/` as `%2F`)")),
    request_body = RenewBody,
    responses(
        (status = 200, description = "Renewed", body = Renewed),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody),
        (status = 410, description = "Not held by this owner; `reason` says why", body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody),
        (status = 503, body = ErrorBody),
    )
)]
pub(crate) async fn renew(
    State(svc): Shared,
    caller: Caller,
    path: Result<Path<String>, PathRejection>,
    JsonBody(b): JsonBody<RenewBody>,
) -> Result<Json<Renewed>, ServiceError> {
    let name = path_name(path)?;
    let owner = service::parse_owner(&b.owner)?;
    let r = svc
        .renew(&caller, &name, owner, Duration::from_millis(b.lease_ms))
        .await?;
    Ok(Json(Renewed {
        name,
        lease_ms: millis(r.lease),
        expires_in_ms: millis(r.lease),
        expires_at: rfc3339(r.expires_at),
    }))
}

/// Release a hold (safe to retry: a second release answers `released: false`); the answer
/// names the fencing token of the hold it ended.
#[utoipa::path(
    post, path = "/v1/locks/{name}/release", tag = "locks",
    params(("name" = String, Path, description = "The lock name (`/` as `%2F`)")),
    request_body = ReleaseBody,
    responses(
        (status = 200, body = Released),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 415, body = ErrorBody), (status = 503, body = ErrorBody),
    )
)]
pub(crate) async fn release(
    State(svc): Shared,
    caller: Caller,
    path: Result<Path<String>, PathRejection>,
    JsonBody(b): JsonBody<ReleaseBody>,
) -> Result<Json<Released>, ServiceError> {
    let name = path_name(path)?;
    let owner = service::parse_owner(&b.owner)?;
    let fencing_token = svc.release(&caller, &name, owner).await?;
    Ok(Json(Released {
        released: fencing_token.is_some(),
        fencing_token,
    }))
}

/// What the lock kinds keep beside `name`: a semaphore's permits held, a reader-writer lock's
/// readers, a fair lock's queued waiters (each absent when no such kind uses the name).
#[utoipa::path(
    get, path = "/v1/locks/{name}/parts", tag = "kinds",
    params(("name" = String, Path, description = "The name (`/` as `%2F`; at most 255 bytes)", max_length = 255)),
    responses(
        (status = 200, body = LockParts),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 503, body = ErrorBody),
    )
)]
pub(crate) async fn parts(
    State(svc): Shared,
    caller: Caller,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<LockParts>, ServiceError> {
    let name = path_name(path)?;
    let p = svc.parts(&caller, &name).await?;
    let slots = |(limit, held): (u64, Vec<(u32, LockView)>)| SlotsInfo {
        limit,
        held: held
            .into_iter()
            .map(|(slot, v)| SlotInfo {
                slot,
                lock: info(v),
            })
            .collect(),
    };
    Ok(Json(LockParts {
        name,
        semaphore: p.semaphore.map(slots),
        readers: p.readers.map(slots),
        queue: p
            .queue
            .into_iter()
            .map(|(ticket, v)| WaiterInfo {
                ticket,
                lock: info(v),
            })
            .collect(),
    }))
}

/// The stored number of permits of the semaphore `name` (absent: none stored yet). A
/// semaphore's or a reader-writer lock's client reads it to check that it agrees.
#[utoipa::path(
    get, path = "/v1/locks/{name}/semaphore-limit", tag = "kinds",
    params(("name" = String, Path, description = "The semaphore's name (`/` as `%2F`; at most 255 bytes)", max_length = 255)),
    responses(
        (status = 200, body = SemaphoreLimit),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 503, body = ErrorBody),
    )
)]
pub(crate) async fn semaphore_limit(
    State(svc): Shared,
    caller: Caller,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<SemaphoreLimit>, ServiceError> {
    let name = path_name(path)?;
    let permits = svc.semaphore_limit(&caller, &name, None).await?;
    Ok(Json(SemaphoreLimit { permits }))
}

/// Write the number of permits of the semaphore `name` unless one is stored, and answer the
/// stored one: the first party of a name decides, every later one must agree (a client whose
/// number differs refuses to take a permit). Safe to retry.
#[utoipa::path(
    put, path = "/v1/locks/{name}/semaphore-limit", tag = "kinds",
    params(("name" = String, Path, description = "The semaphore's name (`/` as `%2F`)")),
    request_body = SemaphoreLimitBody,
    responses(
        (status = 200, body = SemaphoreLimit),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 415, body = ErrorBody), (status = 503, body = ErrorBody),
    )
)]
pub(crate) async fn set_semaphore_limit(
    State(svc): Shared,
    caller: Caller,
    path: Result<Path<String>, PathRejection>,
    JsonBody(b): JsonBody<SemaphoreLimitBody>,
) -> Result<Json<SemaphoreLimit>, ServiceError> {
    let name = path_name(path)?;
    let permits = svc.semaphore_limit(&caller, &name, Some(b.permits)).await?;
    Ok(Json(SemaphoreLimit { permits }))
}

/// Admin: free a lock whoever holds it. The fencing token still moves forward (the next hold's
/// is greater); the evicted holder learns at its next renewal (`410`, `force_released`).
#[utoipa::path(
    post, path = "/v1/locks/{name}/force-release", tag = "admin",
    params(("name" = String, Path, description = "The lock name (`/` as `%2F`)")),
    request_body = ForceReleaseBody,
    responses(
        (status = 200, body = ForceReleased),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, description = "Not an admin of this name", body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody),
        (status = 503, body = ErrorBody),
    )
)]
pub(crate) async fn force_release(
    State(svc): Shared,
    caller: Caller,
    path: Result<Path<String>, PathRejection>,
    JsonBody(b): JsonBody<ForceReleaseBody>,
) -> Result<Json<ForceReleased>, ServiceError> {
    let name = path_name(path)?;
    let r = service::ForceRelease {
        expected: b.expected_fencing_token,
        reason: b.reason,
    };
    let ended = svc.force_release(&caller, &name, r).await?;
    Ok(Json(ForceReleased {
        released: ended.is_some(),
        fencing_token: ended.as_ref().map(|e| e.fencing),
        holder: ended
            .as_ref()
            .and_then(|e| e.holder.as_deref())
            .map(Into::into),
    }))
}

/// The recent events of one lock **seen by this server process**: acquisitions, contention,
/// releases, losses and force-releases with who did them and why (renewals are left out). Each
/// replica keeps its own bounded history from its start; an event made through another replica
/// is in that replica's history, and a restart starts over.
#[utoipa::path(
    get, path = "/v1/locks/{name}/events", tag = "locks",
    params(("name" = String, Path, description = "The lock name (`/` as `%2F`)"), EventsQuery),
    responses(
        (status = 200, body = LockEvents),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody),
    )
)]
pub(crate) async fn events(
    State(svc): Shared,
    caller: Caller,
    path: Result<Path<String>, PathRejection>,
    q: Result<Query<EventsQuery>, QueryRejection>,
) -> Result<Json<LockEvents>, ServiceError> {
    let name = path_name(path)?;
    let Query(q) = q?;
    let h = svc.events(&caller, &name, q.limit)?;
    Ok(Json(LockEvents {
        name,
        events: h
            .events
            .into_iter()
            .map(|e| LockEventInfo {
                at: rfc3339(e.at),
                kind: e.kind.into(),
                fencing_token: e.fencing,
                by: e.admin.as_ref().map(|a| a.by.clone()),
                reason: e.admin.and_then(|a| a.reason.clone()),
            })
            .collect(),
        recorded_since: rfc3339(h.recorded_since),
        kept_at_most: h.kept_at_most,
        missed: h.missed,
    }))
}

/// Admin: delete the records of locks under `prefix` that have been free for `older_than_ms`,
/// after raising the fencing floor above their tokens (fencing stays monotonic per name).
#[utoipa::path(
    post, path = "/v1/sweep", tag = "admin",
    request_body = SweepBody,
    responses(
        (status = 200, body = Swept),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, description = "Not an admin of this prefix", body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 415, body = ErrorBody),
        (status = 503, body = ErrorBody),
    )
)]
pub(crate) async fn sweep(
    State(svc): Shared,
    caller: Caller,
    JsonBody(b): JsonBody<SweepBody>,
) -> Result<Json<Swept>, ServiceError> {
    let report = svc
        .sweep(&caller, &b.prefix, Duration::from_millis(b.older_than_ms))
        .await?;
    Ok(Json(Swept {
        deleted: report.deleted,
        fencing_floor: report.floor,
    }))
}

/// List locks by name prefix, in pages (only the names the caller may read).
#[utoipa::path(
    get, path = "/v1/locks", tag = "locks",
    params(ListQuery),
    responses(
        (status = 200, body = LockList),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 503, body = ErrorBody),
    )
)]
pub(crate) async fn list(
    State(svc): Shared,
    caller: Caller,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<LockList>, ServiceError> {
    let Query(q) = q?;
    let r = service::List {
        prefix: q.prefix.unwrap_or_default(),
        cursor: q.cursor,
        limit: q.limit,
    };
    let page = svc.list(&caller, r).await?;
    Ok(Json(LockList {
        locks: page.locks.into_iter().map(info).collect(),
        next_cursor: page.next_cursor,
    }))
}

/// Read one lock; with `wait_ms`, a blocking read that returns when the record changes (or,
/// with `while=held`, when the lock is free).
#[utoipa::path(
    get, path = "/v1/locks/{name}", tag = "locks",
    params(("name" = String, Path, description = "The lock name (`/` as `%2F`)"), GetQuery),
    responses(
        (status = 200, body = LockInfo),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody), (status = 503, body = ErrorBody),
    )
)]
pub(crate) async fn get(
    State(svc): Shared,
    caller: Caller,
    path: Result<Path<String>, PathRejection>,
    q: Result<Query<GetQuery>, QueryRejection>,
) -> Result<Json<LockInfo>, ServiceError> {
    let name = path_name(path)?;
    let Query(q) = q?;
    let r = service::Read {
        wait: Duration::from_millis(q.wait_ms.unwrap_or(0)),
        while_held: q.while_ == Some(WhileState::Held),
    };
    Ok(Json(info(svc.get(&caller, &name, r).await?)))
}

/// What the storage behind this server promises.
#[utoipa::path(
    get, path = "/v1/storage", tag = "locks",
    responses((status = 200, body = StorageInfo), (status = 401, body = ErrorBody), (status = 503, body = ErrorBody))
)]
pub(crate) async fn storage_info(
    State(svc): Shared,
    _caller: Caller,
) -> Result<Json<StorageInfo>, ServiceError> {
    let facts = svc.storage_facts().await?;
    let caps = facts.capabilities;
    Ok(Json(StorageInfo {
        backend: facts.backend,
        durability: match caps.durability {
            storage_lock_core::Durability::Durable => "durable",
            storage_lock_core::Durability::Volatile => "volatile",
            _ => "unverified",
        }
        .to_owned(),
        linearizable_cas: caps.linearizable_cas,
        server_local: caps.process_local,
        fencing_floor: facts.fencing_floor,
    }))
}

/// `GET /healthz`: the process is up.
pub(crate) async fn healthz() -> &'static str {
    "ok\n"
}

/// `GET /readyz`: the storage answers.
pub(crate) async fn readyz(State(svc): Shared) -> Response {
    match svc.ready().await {
        Ok(()) => (StatusCode::OK, "ready\n").into_response(),
        Err(e) => {
            tracing::warn!(error = %e.message(), "not ready");
            (StatusCode::SERVICE_UNAVAILABLE, "storage unreachable\n").into_response()
        }
    }
}

pub(crate) async fn not_found() -> ServiceError {
    ServiceError::new(ErrorKind::NotFound, "not_found", "no such route")
}

/// Unknown paths: a 404 with the error body; a lock name with a raw `/` gets told to send it
/// as `%2F` (a name is one path segment).
pub(crate) async fn fallback(uri: axum::http::Uri) -> ServiceError {
    let rest = uri.path().strip_prefix("/v1/locks/").unwrap_or_default();
    if rest.trim_end_matches('/').contains('/') {
        return ServiceError::new(
            ErrorKind::NotFound,
            "not_found",
            "no such route; a lock name is one path segment: send `/` in it as %2F",
        );
    }
    not_found().await
}

pub(crate) async fn method_not_allowed() -> ServiceError {
    ServiceError::new(
        ErrorKind::MethodNotAllowed,
        "method_not_allowed",
        "this route does not take that method",
    )
}
