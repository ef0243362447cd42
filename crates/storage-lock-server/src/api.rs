//! The HTTP JSON API `/v1`: handlers, request and response types (the OpenAPI document is
//! generated from them).
//!
//! **Fencing tokens are JSON strings** of decimal digits (`"fencing_token": "42"`): they are
//! `u64` and JavaScript numbers lose integers above 2^53. Durations (`*_ms`) are numbers, all far
//! below 2^53. Owners are 32 hex digits (128 bits), the secret that renews and releases; they
//! are never shown in lists or reads.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::Json;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use storage_lock_core::{
    AcquireOptions, ChangeWait, HolderInfo, LockRecord, OwnerId, PageRequest, Storage, StorageExt,
    StorageLock, Stored, Timestamp, Version, Wait,
};
use utoipa::{IntoParams, ToSchema};

use crate::auth::{AuthHandle, Permission, Principal};
use crate::error::{ApiError, ErrorBody, ErrorKind};

/// The longest a request may wait (`wait_ms` of acquire and of a blocking read): 30 s.
pub const MAX_WAIT_MS: u64 = 30_000;
/// The longest lease a request may ask for: 1000 years of 365.25 days (the engine represents
/// expiries up to the year 9999; a lease is a bound on how long a crashed holder blocks others,
/// so keep yours short and renew).
pub const MAX_LEASE_MS: u64 = 31_557_600_000_000;
/// The longest note: 1 KiB.
pub const MAX_NOTE_BYTES: usize = 1024;
/// The largest page of `GET /v1/locks`.
pub const MAX_PAGE: usize = 1000;

/// Fencing tokens as JSON strings (u64 does not fit a JavaScript number).
mod token {
    use serde::{Deserialize, Deserializer, Serializer, de};

    fn parse<E: de::Error>(s: &str) -> Result<u64, E> {
        if s.is_empty() || s.len() > 20 || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(E::custom("a fencing token is a string of decimal digits"));
        }
        s.parse()
            .map_err(|_| E::custom("a fencing token is at most 18446744073709551615"))
    }

    pub(super) fn serialize<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(v)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        parse(&String::deserialize(d)?)
    }

    pub(super) mod opt {
        use super::*;

        pub(in super::super) fn serialize<S: Serializer>(
            v: &Option<u64>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            match v {
                Some(v) => s.collect_str(v),
                None => s.serialize_none(),
            }
        }

        pub(in super::super) fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<u64>, D::Error> {
            Option::<String>::deserialize(d)?
                .map(|s| parse(&s))
                .transpose()
        }
    }
}

/// What every handler shares.
pub(crate) struct AppState {
    pub locks: StorageLock,
    pub auth: Option<AuthHandle>,
    /// Cancelled when the server starts shutting down (ends gRPC sessions).
    pub shutdown: tokio_util::sync::CancellationToken,
    /// What the web page shows that the storage does not keep (events seen here).
    pub ui: Arc<crate::recorder::Recorder>,
    /// When `/metrics` last began counting the held locks (see `observe::count_held`).
    pub held_counted: std::sync::Mutex<Option<tokio::time::Instant>>,
}

pub(crate) type Shared = State<Arc<AppState>>;

pub(crate) use crate::wire::millis;

fn rfc3339(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

fn ts(t: Timestamp) -> Option<String> {
    t.to_system_time().map(rfc3339)
}

pub use crate::wire::Holder;

/// `POST /v1/locks/{name}/acquire`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AcquireBody {
    /// How long the hold lasts unless renewed.
    #[schema(minimum = 1, maximum = 31_557_600_000_000.0)]
    pub lease_ms: u64,
    /// How long to wait while another owner holds it (long poll); 0 = answer at once.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 30_000)]
    pub wait_ms: u64,
    /// Your owner id (32 hex digits, random, not all zero): send it to retry an acquire
    /// idempotently — while you hold the lock, the same hold and token come back. Chosen by the
    /// server if absent.
    #[schema(pattern = "^(?!0{32}$)[0-9a-fA-F]{32}$")]
    pub owner: Option<String>,
    /// A note shown to people (the command, the job id).
    #[schema(max_length = 1024)]
    pub note: Option<String>,
    /// Who holds it (host, pid); the server's own if absent.
    pub holder: Option<Holder>,
}

/// A hold: the answer to a granted acquire.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Hold {
    /// The lock name.
    pub name: String,
    /// The owner id: the secret that renews and releases this hold.
    pub owner: String,
    /// The fencing token (a decimal string; see the module docs).
    #[serde(with = "token")]
    #[schema(value_type = String, example = "42", pattern = "^[0-9]{1,20}$")]
    pub fencing_token: u64,
    /// The lease granted.
    pub lease_ms: u64,
    /// Time left when the server decided: count it from when you *sent* the request.
    pub expires_in_ms: u64,
    /// The expiry on the server's storage clock (informational; do not compare clocks).
    pub expires_at: String,
}

/// `POST /v1/locks/{name}/renew`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RenewBody {
    /// The owner id of the hold.
    #[schema(pattern = "^(?!0{32}$)[0-9a-fA-F]{32}$")]
    pub owner: String,
    /// The new lease, counted from now.
    #[schema(minimum = 1, maximum = 31_557_600_000_000.0)]
    pub lease_ms: u64,
}

/// A renewed hold.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Renewed {
    /// The lock name.
    pub name: String,
    /// The lease granted.
    pub lease_ms: u64,
    /// Time left when the server decided (= `lease_ms`).
    pub expires_in_ms: u64,
    /// The expiry on the server's storage clock (informational).
    pub expires_at: String,
}

/// `POST /v1/locks/{name}/release`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReleaseBody {
    /// The owner id of the hold.
    #[schema(pattern = "^(?!0{32}$)[0-9a-fA-F]{32}$")]
    pub owner: String,
}

/// The answer to a release.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Released {
    /// `false` if this owner held nothing (a retried release): safe to retry.
    pub released: bool,
}

/// `POST /v1/locks/{name}/force-release` (admin).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ForceReleaseBody {
    /// Release only the hold with this fencing token (a decimal string), so you never evict
    /// the next holder by mistake. Any holder if absent.
    #[serde(default, with = "token::opt")]
    #[schema(value_type = Option<String>, pattern = "^[0-9]{1,20}$")]
    pub expected_fencing_token: Option<u64>,
    /// Why (logged with who did it).
    #[schema(max_length = 1024)]
    pub reason: Option<String>,
}

/// The answer to a force-release.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ForceReleased {
    /// `false` if the lock was free or held under another fencing token.
    pub released: bool,
    /// The evicted hold's fencing token (a decimal string); the next hold's is greater.
    #[serde(with = "token::opt")]
    #[schema(value_type = Option<String>, pattern = "^[0-9]{1,20}$")]
    pub fencing_token: Option<u64>,
    /// Who held it.
    pub holder: Option<Holder>,
}

/// What a lock looks like now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum LockState {
    /// Held by an owner.
    Held,
    /// Released (or force-released); free.
    Released,
    /// The last hold's lease ran out; free.
    Expired,
    /// Never held (or swept); free.
    Free,
}

/// A lock as `GET` shows it (never its owner).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LockInfo {
    /// The lock name.
    pub name: String,
    /// Held or free, and why free.
    pub state: LockState,
    /// The last hold's fencing token (a decimal string); the next hold's is greater.
    #[serde(with = "token::opt")]
    #[schema(value_type = Option<String>, pattern = "^[0-9]{1,20}$")]
    pub fencing_token: Option<u64>,
    /// Who holds (or last held) it.
    pub holder: Option<Holder>,
    /// When the last hold began (storage clock, informational).
    pub acquired_at: Option<String>,
    /// When it ends or ended (storage clock, informational).
    pub expires_at: Option<String>,
    /// For a held lock: time left when the server read it.
    pub expires_in_ms: Option<u64>,
    /// Opaque; changes whenever the record does.
    pub revision: Option<String>,
}

/// A page of locks.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LockList {
    /// Locks in name order.
    pub locks: Vec<LockInfo>,
    /// Pass as `cursor` for the next page; absent on the last page.
    pub next_cursor: Option<String>,
}

/// `GET /v1/locks` query.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only names starting with this.
    pub prefix: Option<String>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
    /// At most this many (1–1000, default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
}

/// `GET /v1/locks/{name}` query.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct GetQuery {
    /// Blocking read: wait up to this long (≤ 30 000) for the record to change.
    #[param(minimum = 0, maximum = 30_000)]
    pub wait_ms: Option<u64>,
    /// With `wait_ms`: `held` waits only while the lock is held, i.e. returns at once if it is
    /// free and otherwise when the hold ends (released, expired, force-released).
    #[serde(rename = "while")]
    #[param(rename = "while")]
    pub while_: Option<WhileState>,
}

/// The condition of a blocking read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum WhileState {
    /// Wait while the lock is held.
    Held,
}

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

/// The caller, from the `Authorization: Bearer …` header (anyone when the server has no auth),
/// and where it connected from (when the server was started by [`crate::Server::serve`]).
#[derive(Clone)]
pub(crate) struct Caller(Option<Principal>, Option<std::net::IpAddr>);

impl FromRequestParts<Arc<AppState>> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &Arc<AppState>,
    ) -> Result<Self, Self::Rejection> {
        let value = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        let peer = parts
            .extensions
            .get::<axum::extract::ConnectInfo<Peer>>()
            .map(|c| c.0.0.ip());
        Ok(Self::from_authorization(state, value)?.connected_from(peer))
    }
}

impl Caller {
    /// The caller an `Authorization` value (`Bearer <token>`) names: 401 if the server has
    /// auth and the value is missing or not a known token.
    pub(crate) fn from_authorization(
        state: &AppState,
        value: Option<&str>,
    ) -> Result<Self, ApiError> {
        let Some(auth) = state.auth.as_ref().map(AuthHandle::current) else {
            return Ok(Self(None, None));
        };
        // The scheme is case-insensitive (RFC 7235).
        let token = value
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, t)| t.trim());
        match token.and_then(|t| auth.authenticate(t)) {
            Some(p) => Ok(Self(Some(p), None)),
            None => Err(ApiError::new(
                ErrorKind::Unauthenticated,
                "unauthorized",
                if token.is_some() {
                    "the bearer token is not valid"
                } else {
                    "send `Authorization: Bearer <token>`"
                },
            )),
        }
    }

    fn require(&self, st: &AppState, name: &str, needed: Permission) -> Result<(), ApiError> {
        match (st.auth.as_ref().map(AuthHandle::current), &self.0) {
            (Some(auth), Some(p)) if !auth.allows(p, name, needed) => Err(ApiError::new(
                ErrorKind::Forbidden,
                "forbidden",
                format!(
                    "token {:?} may not {} locks named {name:?}",
                    p.name(),
                    needed.as_str()
                ),
            )),
            _ => Ok(()),
        }
    }

    pub(crate) fn may(&self, st: &AppState, name: &str, needed: Permission) -> bool {
        self.require(st, name, needed).is_ok()
    }

    pub(crate) fn anonymous() -> Self {
        Self(None, None)
    }

    /// The caller, connected from `peer`.
    pub(crate) fn connected_from(self, peer: Option<std::net::IpAddr>) -> Self {
        Self(self.0, peer)
    }

    /// How a hold taken by this caller names its holder: `TOKEN@ADDRESS` (the token's name
    /// with auth; the address the client says, else the one it connected from), so `list`
    /// and the web page show the client, not the server.
    fn holder(&self, given: Option<&str>) -> String {
        let place = given
            .map(str::to_owned)
            .or_else(|| self.1.map(|ip| ip.to_string()));
        match (&self.0, place) {
            (Some(p), Some(place)) => format!("{}@{place}", p.name()),
            (Some(p), None) => p.name().to_owned(),
            (None, Some(place)) => place,
            (None, None) => "unknown".to_owned(),
        }
    }

    pub(crate) fn who(&self) -> &str {
        self.0.as_ref().map_or("anonymous", Principal::name)
    }
}

fn parse_owner(s: &str) -> Result<OwnerId, ApiError> {
    let bad =
        || ApiError::bad_request("invalid_owner", "owner must be 32 hex digits, not all zero");
    match s.parse::<OwnerId>() {
        Ok(OwnerId::NOBODY) | Err(_) => Err(bad()),
        Ok(owner) => Ok(owner),
    }
}

fn owner_text(o: OwnerId) -> String {
    format!("{:032x}", o.as_u128())
}

fn lease(ms: u64) -> Result<Duration, ApiError> {
    if ms == 0 || ms > MAX_LEASE_MS {
        return Err(ApiError::bad_request(
            "lease_out_of_range",
            format!("lease_ms must be 1..={MAX_LEASE_MS}"),
        ));
    }
    Ok(Duration::from_millis(ms))
}

fn wait(ms: u64) -> Result<Duration, ApiError> {
    if ms > MAX_WAIT_MS {
        return Err(ApiError::bad_request(
            "invalid_options",
            format!("wait_ms must be at most {MAX_WAIT_MS}"),
        ));
    }
    Ok(Duration::from_millis(ms))
}

/// A free-text field: at most [`MAX_NOTE_BYTES`], no control characters but tab (a NUL cannot
/// even be stored by PostgreSQL).
/// A `limit` query parameter: 1 to [`MAX_PAGE`], 100 if absent.
fn page_limit(limit: Option<usize>) -> Result<usize, ApiError> {
    let limit = limit.unwrap_or(100);
    if (1..=MAX_PAGE).contains(&limit) {
        Ok(limit)
    } else {
        Err(ApiError::bad_request(
            "invalid_query",
            "limit must be 1..=1000",
        ))
    }
}

fn text_limit(field: &str, s: &Option<String>) -> Result<(), ApiError> {
    match s {
        Some(s) if s.len() > MAX_NOTE_BYTES => Err(ApiError::bad_request(
            "invalid_options",
            format!("{field} is longer than {MAX_NOTE_BYTES} bytes"),
        )),
        Some(s) if s.chars().any(|c| c.is_control() && c != '\t') => Err(ApiError::bad_request(
            "invalid_options",
            format!("{field} contains control characters"),
        )),
        _ => Ok(()),
    }
}

/// A list cursor is opaque to clients: the hex of the last key of the page (which may be a
/// name the caller cannot read).
fn cursor_out(key: String) -> String {
    key.bytes().map(|b| format!("{b:02x}")).collect()
}

fn cursor_in(cursor: &str) -> Result<String, ApiError> {
    let bad = || ApiError::bad_request("invalid_query", "cursor is not one this server gave out");
    if !cursor.len().is_multiple_of(2) || !cursor.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(bad());
    }
    let bytes: Vec<u8> = (0..cursor.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&cursor[i..i + 2], 16))
        .collect::<Result<_, _>>()
        .map_err(|_| bad())?;
    String::from_utf8(bytes).map_err(|_| bad())
}

/// The lock name of the path (validated by the operation).
fn path_name(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    Ok(path?.0)
}

/// A JSON **object** body (serde would also read a struct from an array), with every failure
/// answered by [`ApiError`]: 415 without a JSON content type, 413 over the size limit, 400
/// otherwise.
pub(crate) struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> axum::extract::FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: axum::extract::Request, state: &S) -> Result<Self, ApiError> {
        let Json(value) = Json::<serde_json::Value>::from_request(req, state)
            .await
            .map_err(ApiError::from)?;
        if !value.is_object() {
            return Err(ApiError::bad_request(
                "invalid_body",
                "the body must be a JSON object",
            ));
        }
        serde_json::from_value(value)
            .map(JsonBody)
            .map_err(|e| ApiError::bad_request("invalid_body", format!("invalid body: {e}")))
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
    State(st): Shared,
    caller: Caller,
    path: Result<Path<String>, PathRejection>,
    JsonBody(b): JsonBody<AcquireBody>,
) -> Result<Json<Hold>, ApiError> {
    let name = path_name(path)?;
    Ok(Json(st.acquire(&caller, name, b).await?))
}

impl AppState {
    /// The operation behind the `acquire` route, for HTTP and gRPC alike.
    pub(crate) async fn acquire(
        &self,
        caller: &Caller,
        name: String,
        b: AcquireBody,
    ) -> Result<Hold, ApiError> {
        self.locks.key_for(&name)?;
        caller.require(self, &name, Permission::Lock)?;
        let lease = lease(b.lease_ms)?;
        let wait_for = wait(b.wait_ms)?;
        text_limit("note", &b.note)?;
        let owner = match &b.owner {
            Some(o) => parse_owner(o)?,
            None => OwnerId::random(),
        };
        let holder = match b.holder {
            Some(h) => {
                text_limit("holder.note", &h.note)?;
                text_limit("holder.host", &Some(h.host.clone()))?;
                if h.host.len() > 255 {
                    return Err(ApiError::bad_request(
                        "invalid_options",
                        "holder.host is longer than 255 bytes",
                    ));
                }
                HolderInfo {
                    host: caller.holder(Some(&h.host)),
                    pid: h.pid,
                    note: h.note,
                }
            }
            // Not the server's own host and pid: the client, as far as the server knows it.
            None => HolderInfo {
                host: caller.holder(None),
                pid: 0,
                note: None,
            },
        };
        let holder = Some(holder);
        let mut opts = AcquireOptions::default()
            .lease(lease)
            .wait(if wait_for.is_zero() {
                Wait::Never
            } else {
                Wait::For(wait_for)
            });
        opts.note = b.note;
        match self.locks.acquire_as(&name, owner, &opts, holder).await? {
            Ok(h) => Ok(Hold {
                name,
                owner: owner_text(owner),
                fencing_token: h.fencing_token,
                lease_ms: b.lease_ms,
                expires_in_ms: millis(h.expires_in),
                expires_at: rfc3339(h.expires_at),
            }),
            // The storage's busy answer says who and for how long: no second read.
            Err(busy) => Err(ApiError::busy(
                &name,
                busy.holder.as_deref().map(Holder::from),
                Some(busy.left),
            )),
        }
    }
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
    State(st): Shared,
    caller: Caller,
    path: Result<Path<String>, PathRejection>,
    JsonBody(b): JsonBody<RenewBody>,
) -> Result<Json<Renewed>, ApiError> {
    let name = path_name(path)?;
    Ok(Json(st.renew(&caller, name, b).await?))
}

impl AppState {
    /// The operation behind the `renew` route, for HTTP and gRPC alike.
    pub(crate) async fn renew(
        &self,
        caller: &Caller,
        name: String,
        b: RenewBody,
    ) -> Result<Renewed, ApiError> {
        self.locks.key_for(&name)?;
        caller.require(self, &name, Permission::Lock)?;
        let owner = parse_owner(&b.owner)?;
        let lease = lease(b.lease_ms)?;
        match self.locks.renew_as(&name, owner, lease).await? {
            Some(expires_at) => Ok(Renewed {
                name,
                lease_ms: b.lease_ms,
                expires_in_ms: b.lease_ms,
                expires_at: rfc3339(expires_at),
            }),
            None => {
                let why = self
                    .locks
                    .hold_gone(&name, owner)
                    .await?
                    .unwrap_or(storage_lock_core::HoldGone::TakenOver);
                Err(ApiError::lost(&name, why))
            }
        }
    }
}

/// Release a hold (safe to retry: a second release answers `released: false`).
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
    State(st): Shared,
    caller: Caller,
    path: Result<Path<String>, PathRejection>,
    JsonBody(b): JsonBody<ReleaseBody>,
) -> Result<Json<Released>, ApiError> {
    let name = path_name(path)?;
    Ok(Json(st.release(&caller, name, b).await?))
}

impl AppState {
    /// The operation behind the `release` route, for HTTP and gRPC alike.
    pub(crate) async fn release(
        &self,
        caller: &Caller,
        name: String,
        b: ReleaseBody,
    ) -> Result<Released, ApiError> {
        self.locks.key_for(&name)?;
        caller.require(self, &name, Permission::Lock)?;
        let owner = parse_owner(&b.owner)?;
        let released = self.locks.release_as(&name, owner).await?;
        Ok(Released { released })
    }
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
    State(st): Shared,
    caller: Caller,
    path: Result<Path<String>, PathRejection>,
    JsonBody(b): JsonBody<ForceReleaseBody>,
) -> Result<Json<ForceReleased>, ApiError> {
    let name = path_name(path)?;
    Ok(Json(st.force_release(&caller, name, b).await?))
}

impl AppState {
    /// The operation behind the `force_release` route, for HTTP and gRPC alike.
    pub(crate) async fn force_release(
        &self,
        caller: &Caller,
        name: String,
        b: ForceReleaseBody,
    ) -> Result<ForceReleased, ApiError> {
        self.locks.key_for(&name)?;
        caller.require(self, &name, Permission::Admin)?;
        text_limit("reason", &b.reason)?;
        let expected = b.expected_fencing_token;
        let ended = match expected {
            Some(f) => self.locks.force_release_if(&name, f).await?,
            None => self.locks.force_release(&name).await?,
        };
        if let Some(r) = &ended {
            self.ui.annotate(
                &self.locks.key_for(&name)?,
                r.fencing,
                crate::recorder::AdminNote {
                    by: caller.who().to_owned(),
                    reason: b.reason.clone(),
                },
            );
        }
        tracing::info!(
            target: "storage_lock::audit",
            who = caller.who(),
            action = "force_release",
            lock = %name,
            fencing = ended.as_ref().map(|r| r.fencing),
            released = ended.is_some(),
            reason = b.reason.as_deref().unwrap_or(""),
            "admin action"
        );
        Ok(ForceReleased {
            released: ended.is_some(),
            fencing_token: ended.as_ref().map(|r| r.fencing),
            holder: ended
                .as_ref()
                .and_then(|r| r.holder.as_deref())
                .map(Holder::from),
        })
    }
}

/// `GET /v1/locks/{name}/events` query.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// At most this many, the newest (1–1000, default 100).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<usize>,
}

/// What happened to a lock (renewals are not kept).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// A hold began.
    Acquired,
    /// An acquisition found the lock busy.
    Contended,
    /// An acquisition gave up: busy until its wait ran out.
    TimedOut,
    /// An acquisition was cancelled while waiting (e.g. its client went away).
    Cancelled,
    /// A renewal failed.
    RenewFailed,
    /// A hold was lost.
    Lost,
    /// A hold was released.
    Released,
    /// An admin force-released the hold (`by`, `reason`).
    ForceReleased,
    /// An event of a kind newer than this server's API.
    Other,
}

impl From<storage_lock_core::LockEventKind> for EventKind {
    fn from(k: storage_lock_core::LockEventKind) -> Self {
        use storage_lock_core::LockEventKind as K;
        match k {
            K::Acquired => Self::Acquired,
            K::Contended => Self::Contended,
            K::TimedOut => Self::TimedOut,
            K::Cancelled => Self::Cancelled,
            K::RenewFailed => Self::RenewFailed,
            K::Lost => Self::Lost,
            K::Released => Self::Released,
            K::ForceReleased => Self::ForceReleased,
            _ => Self::Other,
        }
    }
}

/// One event of a lock, as this server saw it.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LockEventInfo {
    /// When this server saw it (its wall clock, RFC 3339).
    pub at: String,
    /// What happened.
    pub kind: EventKind,
    /// The fencing token of the hold involved (a decimal string).
    #[serde(with = "token::opt")]
    #[schema(value_type = Option<String>, pattern = "^[0-9]{1,20}$")]
    pub fencing_token: Option<u64>,
    /// For a force-release: the token name of the admin who did it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// For a force-release: the reason the admin gave.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A lock's recent events as **this replica** saw them.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LockEvents {
    /// The lock name.
    pub name: String,
    /// Oldest first.
    pub events: Vec<LockEventInfo>,
    /// When this server process started recording (RFC 3339): nothing older is known here.
    pub recorded_since: String,
    /// How many events (of all locks) the server keeps; older ones are dropped.
    pub kept_at_most: usize,
    /// Events (of all locks) the server skipped because it fell behind its engine.
    pub missed: u64,
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
    State(st): Shared,
    caller: Caller,
    path: Result<Path<String>, PathRejection>,
    q: Result<Query<EventsQuery>, QueryRejection>,
) -> Result<Json<LockEvents>, ApiError> {
    let name = path_name(path)?;
    let Query(q) = q?;
    Ok(Json(st.events(&caller, name, &q)?))
}

impl AppState {
    /// The operation behind the `events` route.
    pub(crate) fn events(
        &self,
        caller: &Caller,
        name: String,
        q: &EventsQuery,
    ) -> Result<LockEvents, ApiError> {
        let key = self.locks.key_for(&name)?.into_owned();
        caller.require(self, &name, Permission::Read)?;
        let limit = page_limit(q.limit)?;
        self.ui.start(&self.locks);
        let events = self
            .ui
            .of(&key, limit)
            .into_iter()
            .map(|e| LockEventInfo {
                at: rfc3339(e.at),
                kind: e.kind.into(),
                fencing_token: e.fencing,
                by: e.admin.as_ref().map(|a| a.by.clone()),
                reason: e.admin.as_ref().and_then(|a| a.reason.clone()),
            })
            .collect();
        Ok(LockEvents {
            name,
            events,
            recorded_since: rfc3339(self.ui.since().unwrap_or_else(SystemTime::now)),
            kept_at_most: crate::recorder::KEEP_EVENTS,
            missed: self.ui.missed(),
        })
    }
}

/// `POST /v1/sweep` (admin).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SweepBody {
    /// Only locks whose name starts with this (the caller needs `admin` on it). Default: all.
    #[serde(default)]
    #[schema(max_length = 1024)]
    pub prefix: String,
    /// Only records free for at least this long (milliseconds). Default 0.
    #[serde(default)]
    pub older_than_ms: u64,
}

/// The answer to a sweep.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Swept {
    /// Records deleted.
    pub deleted: usize,
    /// The fencing floor after the sweep (a decimal string): fresh locks start above it.
    #[schema(pattern = "^[0-9]{1,20}$")]
    pub fencing_floor: String,
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
    State(st): Shared,
    caller: Caller,
    JsonBody(b): JsonBody<SweepBody>,
) -> Result<Json<Swept>, ApiError> {
    text_limit("prefix", &Some(b.prefix.clone()))?;
    caller.require(&st, &b.prefix, Permission::Admin)?;
    let report = st
        .locks
        .storage()
        .sweep(&b.prefix, Duration::from_millis(b.older_than_ms))
        .await
        .map_err(storage_lock_core::LockError::from)?;
    tracing::info!(
        target: "storage_lock::audit",
        who = caller.who(),
        action = "sweep",
        prefix = %b.prefix,
        deleted = report.deleted,
        fencing_floor = report.floor,
        "admin action"
    );
    Ok(Json(Swept {
        deleted: report.deleted,
        fencing_floor: report.floor.to_string(),
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
    State(st): Shared,
    caller: Caller,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<LockList>, ApiError> {
    let Query(q) = q?;
    Ok(Json(st.list(&caller, q).await?))
}

impl AppState {
    /// The operation behind the `list` route, for HTTP and gRPC alike.
    pub(crate) async fn list(&self, caller: &Caller, q: ListQuery) -> Result<LockList, ApiError> {
        let limit = page_limit(q.limit)?;
        text_limit("prefix", &q.prefix)?;
        let after = q.cursor.as_deref().map(cursor_in).transpose()?;
        let storage = self.locks.storage();
        let now = storage
            .now()
            .await
            .map_err(storage_lock_core::LockError::from)?;
        let page = storage
            .list_locks(
                q.prefix.as_deref().unwrap_or(""),
                &PageRequest { after, limit },
            )
            .await
            .map_err(storage_lock_core::LockError::from)?;
        Ok(LockList {
            locks: page
                .entries
                .into_iter()
                .filter(|(k, _)| caller.may(self, k, Permission::Read))
                .map(|(k, s)| info(k, Some(&s), now))
                .collect(),
            next_cursor: page.next.map(cursor_out),
        })
    }
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
    State(st): Shared,
    caller: Caller,
    path: Result<Path<String>, PathRejection>,
    q: Result<Query<GetQuery>, QueryRejection>,
) -> Result<Json<LockInfo>, ApiError> {
    let name = path_name(path)?;
    let Query(q) = q?;
    Ok(Json(st.get(&caller, name, q).await?))
}

impl AppState {
    /// The operation behind the `get` route, for HTTP and gRPC alike.
    pub(crate) async fn get(
        &self,
        caller: &Caller,
        name: String,
        q: GetQuery,
    ) -> Result<LockInfo, ApiError> {
        let key = self.locks.key_for(&name)?.into_owned();
        caller.require(self, &name, Permission::Read)?;
        let wait_for = wait(q.wait_ms.unwrap_or(0))?;
        let storage = self.locks.storage().as_ref();
        let (now, stored) = if wait_for.is_zero() {
            read(storage, &key).await?
        } else {
            blocking_read(storage, &key, wait_for, q.while_).await?
        };
        Ok(info(name, stored.as_ref(), now))
    }
}

async fn read(s: &dyn Storage, key: &str) -> Result<(Timestamp, Option<Stored>), ApiError> {
    let stored = s
        .get(key)
        .await
        .map_err(storage_lock_core::LockError::from)?;
    let now = s.now().await.map_err(storage_lock_core::LockError::from)?;
    Ok((now, stored))
}

/// How often a blocking read looks again when no notification comes (notifications are only
/// a shortcut: some backends notify only when an acquirer is waiting).
const READ_POLL: Duration = Duration::from_millis(100);

async fn blocking_read(
    s: &dyn Storage,
    key: &str,
    wait_for: Duration,
    while_: Option<WhileState>,
) -> Result<(Timestamp, Option<Stored>), ApiError> {
    let deadline = tokio::time::Instant::now() + wait_for;
    let mut first: Option<Option<Version>> = None;
    loop {
        let change = s
            .wait_for_change(key)
            .await
            .unwrap_or_else(|_| ChangeWait::unsupported());
        let (now, stored) = read(s, key).await?;
        let version = stored.as_ref().map(|x| x.version.clone());
        let held_for = stored
            .as_ref()
            .map(|x| &x.record)
            .filter(|r| r.is_held_at(now))
            .map(|r| r.expires_at.saturating_since(now));
        let done = match while_ {
            Some(WhileState::Held) => held_for.is_none(),
            None => first.as_ref().is_some_and(|v| *v != version),
        };
        if done || tokio::time::Instant::now() >= deadline {
            return Ok((now, stored));
        }
        first.get_or_insert(version);
        let mut wake = deadline.min(tokio::time::Instant::now() + READ_POLL);
        if let Some(left) = held_for {
            wake = wake.min(tokio::time::Instant::now() + left + Duration::from_millis(1));
        }
        tokio::select! {
            () = change.changed() => {}
            () = tokio::time::sleep_until(wake) => {}
        }
    }
}

fn revision(v: &Version) -> String {
    match (v.as_u64(), v.as_text()) {
        (Some(n), _) => format!("n{n}"),
        (None, Some(t)) => format!("t{t}"),
        (None, None) => String::new(),
    }
}

fn info(name: String, stored: Option<&Stored>, now: Timestamp) -> LockInfo {
    let Some(stored) = stored else {
        return LockInfo {
            name,
            state: LockState::Free,
            fencing_token: None,
            holder: None,
            acquired_at: None,
            expires_at: None,
            expires_in_ms: None,
            revision: None,
        };
    };
    let r: &LockRecord = &stored.record;
    let state = if r.is_held_at(now) {
        LockState::Held
    } else if r.count == 0 {
        LockState::Released
    } else {
        LockState::Expired
    };
    LockInfo {
        name,
        state,
        fencing_token: Some(r.fencing),
        holder: r.holder.as_deref().map(Holder::from),
        acquired_at: ts(r.acquired_at),
        expires_at: ts(r.expires_at),
        expires_in_ms: (state == LockState::Held)
            .then(|| millis(r.expires_at.saturating_since(now))),
        revision: Some(revision(&stored.version)),
    }
}

/// What the server's storage promises.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct StorageInfo {
    /// The backend (`sqlite`, `postgres`, `mysql`, `redis`, `memory`).
    pub backend: String,
    /// `durable`, `unverified` (the settings could not be read) or `volatile` (opted in: a
    /// restart of the storage can hand a held lock out again).
    pub durability: String,
    /// Concurrent conditional writes have exactly one winner.
    pub linearizable_cas: bool,
    /// The storage lives in the server process (`memory`): locks last as long as this one
    /// server process and are not shared with other replicas.
    pub server_local: bool,
    /// The fencing floor (a decimal string): fresh locks start above it (sweeps raise it).
    pub fencing_floor: String,
}

/// What the storage behind this server promises.
#[utoipa::path(
    get, path = "/v1/storage", tag = "locks",
    responses((status = 200, body = StorageInfo), (status = 401, body = ErrorBody), (status = 503, body = ErrorBody))
)]
pub(crate) async fn storage_info(
    State(st): Shared,
    _caller: Caller,
) -> Result<Json<StorageInfo>, ApiError> {
    let storage = st.locks.storage();
    let caps = storage.capabilities();
    let floor = storage
        .fencing_floor()
        .await
        .map_err(storage_lock_core::LockError::from)?;
    Ok(Json(StorageInfo {
        backend: storage.name().to_owned(),
        durability: match caps.durability {
            storage_lock_core::Durability::Durable => "durable",
            storage_lock_core::Durability::Volatile => "volatile",
            _ => "unverified",
        }
        .to_owned(),
        linearizable_cas: caps.linearizable_cas,
        server_local: caps.process_local,
        fencing_floor: floor.to_string(),
    }))
}

/// `GET /healthz`: the process is up.
pub(crate) async fn healthz() -> &'static str {
    "ok\n"
}

/// `GET /readyz`: the storage answers.
pub(crate) async fn readyz(State(st): Shared) -> Response {
    match st.locks.storage().now().await {
        Ok(_) => (StatusCode::OK, "ready\n").into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "not ready");
            (StatusCode::SERVICE_UNAVAILABLE, "storage unreachable\n").into_response()
        }
    }
}

pub(crate) async fn not_found() -> ApiError {
    ApiError::new(ErrorKind::NotFound, "not_found", "no such route")
}

/// Unknown paths: a 404 with the error body; a lock name with a raw `/` gets told to send it
/// as `%2F` (a name is one path segment).
pub(crate) async fn fallback(uri: axum::http::Uri) -> ApiError {
    let rest = uri.path().strip_prefix("/v1/locks/").unwrap_or_default();
    if rest.trim_end_matches('/').contains('/') {
        return ApiError::new(
            ErrorKind::NotFound,
            "not_found",
            "no such route; a lock name is one path segment: send `/` in it as %2F",
        );
    }
    not_found().await
}

pub(crate) async fn method_not_allowed() -> ApiError {
    ApiError::new(
        ErrorKind::MethodNotAllowed,
        "method_not_allowed",
        "this route does not take that method",
    )
}
