//! The Rust SDK of the storage-lock server.
//!
//! [`RemoteStorage`] speaks the server's HTTP API (`storage-lock serve`) and plugs into the
//! same engine as every backend, so a [`RemoteLock`] is a [`storage_lock_core::DistributedLock`]
//! with every guarantee of the contract, across the network:
//!
//! * **fencing token** from the server, strictly increasing per lock;
//! * **local deadline** counted from an instant taken *before* the request was sent (minus the
//!   safety margin), on the clock that counts suspended time — a paused client never believes
//!   it holds a lock the server gave away;
//! * **fail-closed renewal**: a renewal the server does not confirm turns the handle lost by its
//!   local deadline; `lost()` completes;
//! * **idempotent release**, release on drop, and **cancel safety**: a dropped acquire whose
//!   grant lands anyway is released;
//! * waiting without polling: a waiter long-polls the server (`GET …?wait_ms=&while=held`).
//!
//! Acquire retries are idempotent on the server (the owner id is the idempotency key): a
//! request whose answer was lost, sent again by the engine with the same owner, gets the same
//! hold back.
//!
//! Not available remotely: the storage primitives (`create` / `update` / `delete`: the server
//! does not expose raw compare-and-set) and reentrant holds. The admin operations
//! (`StorageExt::force_release`, `sweep`, `fencing_floor`) run on the server
//! ([`storage_lock_core::DelegatedAdmin`]) and need a token with the `admin` grant.
//!
//! ```no_run
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use storage_lock_core::DistributedLock;
//!
//! let locks = storage_lock_client::connect("http://127.0.0.1:7420").await?;
//! if let Some(lock) = locks.try_acquire_for("deploy/prod", Duration::from_secs(5)).await? {
//!     println!("holding with fencing token {}", lock.fencing_token());
//!     lock.release().await?;
//! }
//! # Ok(()) }
//! ```
//!
//! URL: `http://HOST:PORT[/PATH]` or `https://…` with an optional `?token=…`; without it the
//! bearer token comes from `STORAGE_LOCK_TOKEN` if that is set. The token never appears in
//! errors, logs or `Debug` output. Over `https://` the server's certificate is checked against
//! the system's CAs plus those of `ca=PATH` (a PEM file); `cert=PATH&key=PATH` present a client
//! certificate to a server that requires one (`storage-lock serve --tls-client-ca`).

use std::fmt;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;
use storage_lock_core::{
    AcquireOutcome, AcquireRequest, Capabilities, ChangeWait, DelegatedAdmin, Durability,
    HolderInfo, LockError, LockRecord, OwnerId, Page, PageRequest, ReleaseOutcome, RenewOutcome,
    Storage, StorageError, StorageLock, Stored, SweepReport, Timestamp, Version,
};
use storage_lock_wire::{
    AcquireBody, ErrorBody, ForceReleaseBody, ForceReleased, Hold, HolderBody, LockInfo, LockList,
    LockState, ReleaseBody, Released, RenewBody, Renewed, SemaphoreLimit, SemaphoreLimitBody,
    StorageInfo, SweepBody, Swept, millis,
};

/// The environment variable the bearer token is read from when the URL has no `token=`.
pub const TOKEN_ENV: &str = "STORAGE_LOCK_TOKEN";

/// How long one request (other than a long poll) may take before it counts as failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one long poll of a waiter lasts (the server caps it at 30 s).
const LONG_POLL: Duration = Duration::from_secs(25);

const NAME: &str = "remote";
/// No request body (a `GET`).
const NO_BODY: Option<&()> = None;

#[cfg(feature = "grpc")]
mod session;
#[cfg(feature = "grpc")]
pub use session::SessionLock;

/// A lock engine over a storage-lock server: what [`connect`] returns.
pub type RemoteLock = StorageLock<RemoteStorage>;

/// Connects to the server at `url` and builds the lock engine over it.
///
/// # Errors
/// As [`RemoteStorage::connect`].
///
/// # Examples
/// See the crate docs.
pub async fn connect(url: &str) -> Result<RemoteLock, LockError> {
    let storage = RemoteStorage::connect(url).await?;
    StorageLock::new(storage)
}

/// The server's HTTP API as a [`Storage`] (see the crate docs for what it supports).
#[derive(Clone)]
pub struct RemoteStorage {
    http: reqwest::Client,
    /// `http://host:port[/path]` without a trailing slash, query or credentials.
    base: String,
    token: Option<String>,
    capabilities: Capabilities,
    /// The backend of the server's storage (`GET /v1/storage`).
    backend: String,
}

impl fmt::Debug for RemoteStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteStorage")
            .field("base", &self.base)
            .field("token", &self.token.as_ref().map(|_| "***"))
            .finish_non_exhaustive()
    }
}

/// A request's failure, before it is mapped to a [`StorageError`].
enum Failure {
    /// The server answered with this status and body.
    Status(StatusCode, ErrorBody),
    /// No usable answer (connection, timeout, malformed body): the outcome is unknown.
    Transport(StorageError),
}

fn now_ts() -> Timestamp {
    let ms = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    Timestamp::from_millis(u64::try_from(ms).unwrap_or(u64::MAX))
}

fn parse_ts(s: Option<&str>) -> Option<Timestamp> {
    let t = humantime::parse_rfc3339(s?).ok()?;
    let ms = t.duration_since(SystemTime::UNIX_EPOCH).ok()?.as_millis();
    Some(Timestamp::from_millis(u64::try_from(ms).ok()?))
}

fn corrupt(key: &str, reason: &str) -> StorageError {
    StorageError::Corrupt {
        key: key.to_owned(),
        reason: reason.to_owned(),
    }
}

/// The PEM contents of an [`Endpoint`]'s `ca=` and of its `cert=` + `key=` (one buffer).
type TlsFiles = (Option<Vec<u8>>, Option<Vec<u8>>);

/// Where and how to reach a server: what [`parse_url`] makes of a URL.
pub(crate) struct Endpoint {
    /// `http(s)://host:port[/path]` without a trailing slash, query or credentials.
    pub(crate) base: String,
    /// The bearer token (from the URL, else [`TOKEN_ENV`]).
    pub(crate) token: Option<String>,
    /// `ca=`: a PEM file of CA certificates to trust besides the system's.
    pub(crate) ca: Option<std::path::PathBuf>,
    /// `cert=` and `key=`: the client certificate (PEM) for a server that requires one.
    pub(crate) identity: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

impl Endpoint {
    /// Reads the `ca=` and `cert=`/`key=` files: (CA PEM, client chain and key PEM).
    fn read_tls(&self) -> Result<TlsFiles, StorageError> {
        let read = |what: &str, path: &std::path::Path| {
            std::fs::read(path).map_err(|e| {
                StorageError::config(
                    NAME,
                    format!("cannot read the {what} {}: {e}", path.display()),
                )
            })
        };
        let ca = self.ca.as_deref().map(|p| read("CA file", p)).transpose()?;
        let identity = match &self.identity {
            Some((cert, key)) => {
                let mut pem = read("client certificate", cert)?;
                pem.push(b'\n');
                pem.extend(read("client key", key)?);
                Some(pem)
            }
            None => None,
        };
        Ok((ca, identity))
    }

    /// The HTTP client for this endpoint (the CA and client certificate applied).
    fn http_client(&self) -> Result<reqwest::Client, StorageError> {
        let mut builder = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true);
        let (ca, identity) = self.read_tls()?;
        if let Some(ca) = ca {
            for cert in reqwest::Certificate::from_pem_bundle(&ca)
                .map_err(|e| StorageError::config(NAME, format!("the CA file: {e}")))?
            {
                builder = builder.add_root_certificate(cert);
            }
        }
        if let Some(pem) = identity {
            let identity = reqwest::Identity::from_pem(&pem)
                .map_err(|e| StorageError::config(NAME, format!("the client certificate: {e}")))?;
            builder = builder.identity(identity);
        }
        builder
            .build()
            .map_err(|e| StorageError::backend(NAME, "connect", e))
    }

    #[cfg(feature = "grpc")]
    pub(crate) fn is_tls(&self) -> bool {
        self.base.starts_with("https://")
    }
}

/// `http(s)://HOST:PORT[/PATH][?token=…&ca=…&cert=…&key=…]` → an [`Endpoint`].
pub(crate) fn parse_url(url: &str) -> Result<Endpoint, StorageError> {
    let bad = |reason: &str| StorageError::config(NAME, format!("invalid server URL: {reason}"));
    let parsed = reqwest::Url::parse(url).map_err(|e| bad(&e.to_string()))?;
    let scheme = parsed.scheme();
    if scheme != "http" && scheme != "https" {
        return Err(bad("the scheme is http:// or https://"));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(bad(
            "send the token as ?token=… or $STORAGE_LOCK_TOKEN, not in the authority",
        ));
    }
    let (mut token, mut ca, mut cert, mut key) = (None, None, None, None);
    for (k, v) in parsed.query_pairs() {
        let v = v.into_owned();
        match &*k {
            "token" => token = Some(v),
            "ca" => ca = Some(std::path::PathBuf::from(v)),
            "cert" => cert = Some(std::path::PathBuf::from(v)),
            "key" => key = Some(std::path::PathBuf::from(v)),
            // The operator made sure of a server storage that cannot verify its durability
            // (the CLI then stops warning); the server's storage decides everything else.
            "durability" if v == "unverified" => {}
            "durability" => {
                return Err(bad(
                    "durability=unverified is the only durability option (the server's storage \
                     decides the rest)",
                ));
            }
            other => {
                return Err(bad(&format!(
                    "unknown option {other:?} (known: token, ca, cert, key, durability)"
                )));
            }
        }
    }
    if scheme == "http" && (ca.is_some() || cert.is_some()) {
        return Err(bad("ca=, cert= and key= need https://"));
    }
    let identity = match (cert, key) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        _ => return Err(bad("cert= and key= go together")),
    };
    let token = token
        .or_else(|| std::env::var(TOKEN_ENV).ok())
        .filter(|t| !t.is_empty());
    let host = parsed.host_str().ok_or_else(|| bad("no host"))?;
    let port = parsed
        .port_or_known_default()
        .unwrap_or(if scheme == "https" { 443 } else { 80 });
    let host = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]")
    } else {
        host.to_owned()
    };
    let base = format!(
        "{scheme}://{host}:{port}{}",
        parsed.path().trim_end_matches('/')
    );
    Ok(Endpoint {
        base,
        token,
        ca,
        identity,
    })
}

/// Every byte but the unreserved ones percent-encoded: a lock name is one path segment.
fn segment(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl RemoteStorage {
    /// Connects to the server at `url` (`http://HOST:PORT[/PATH][?token=…]`) and reads what its
    /// storage promises (`GET /v1/storage`), which also checks that it is reachable and that
    /// the token is accepted.
    ///
    /// # Errors
    /// [`StorageError::Config`] for a malformed URL, an unknown option or a refused token;
    /// [`StorageError::Backend`] if the server cannot be reached.
    pub async fn connect(url: &str) -> Result<Self, StorageError> {
        let endpoint = parse_url(url)?;
        let http = endpoint.http_client()?;
        let mut storage = Self {
            http,
            base: endpoint.base,
            token: endpoint.token,
            capabilities: Capabilities::linearizable(),
            backend: String::new(),
        };
        let info: StorageInfo = storage
            .call(Method::GET, "/v1/storage", NO_BODY, REQUEST_TIMEOUT)
            .await
            .map_err(|f| storage.fail(f, "connect"))?;
        let caps = Capabilities::linearizable()
            .with_change_notifications(true)
            .with_linearizable_cas(info.linearizable_cas)
            .with_owners_hidden(true)
            .with_round_trips(
                "1 / 1 / 1 requests to the lock server (plus its storage's own behind it)",
            );
        storage.capabilities = match info.durability.as_str() {
            "durable" => caps.with_durability(Durability::Durable),
            "volatile" => caps.with_durability(Durability::Volatile),
            _ => caps.with_unverified_durability(
                "the lock server's storage could not verify its durability (`storage-lock \
                 check` with the server's storage URL says why)",
            ),
        };
        storage.backend = info.backend;
        Ok(storage)
    }

    /// The server's base URL (no token).
    pub fn base_url(&self) -> &str {
        &self.base
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&(impl Serialize + Sync)>,
        timeout: Duration,
    ) -> Result<T, Failure> {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .timeout(timeout);
        if let Some(token) = &self.token {
            req = req.bearer_auth(token);
        }
        if let Some(body) = body {
            req = req.json(body);
        }
        let transport = |op: &'static str, e: reqwest::Error| {
            // reqwest errors carry the URL, never the bearer header.
            Failure::Transport(StorageError::backend(NAME, op, e.without_url()))
        };
        let res = req.send().await.map_err(|e| transport("request", e))?;
        let status = res.status();
        let bytes = res.bytes().await.map_err(|e| transport("response", e))?;
        if status.is_success() {
            serde_json::from_slice(&bytes)
                .map_err(|e| Failure::Transport(StorageError::backend(NAME, "response", e)))
        } else {
            let body = serde_json::from_slice(&bytes).unwrap_or_else(|_| ErrorBody {
                error: "unknown".into(),
                message: String::from_utf8_lossy(&bytes).chars().take(200).collect(),
                reason: None,
                expires_in_ms: None,
                holder: None,
            });
            Err(Failure::Status(status, body))
        }
    }

    /// Maps a failure that is not an expected outcome: 4xx is a configuration problem (bad
    /// token, bad input: retrying will not help), 5xx and transport errors are the storage's.
    fn fail(&self, f: Failure, op: &'static str) -> StorageError {
        match f {
            Failure::Transport(e) => e,
            Failure::Status(status @ (StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN), body) => {
                StorageError::Denied {
                    backend: NAME.into(),
                    reason: format!("server refused {op} ({status}): {}", body.message),
                }
            }
            Failure::Status(status, body) if status.is_client_error() => StorageError::config(
                NAME,
                format!("server refused {op} ({}): {}", body.error, body.message),
            ),
            Failure::Status(status, body) => StorageError::backend(
                NAME,
                op,
                format!("server answered {status}: {}: {}", body.error, body.message),
            ),
        }
    }

    /// The server's fencing floor (`GET /v1/storage`), failing as `op`.
    async fn read_floor(&self, op: &'static str) -> Result<u64, StorageError> {
        let info: StorageInfo = self
            .call(Method::GET, "/v1/storage", NO_BODY, REQUEST_TIMEOUT)
            .await
            .map_err(|f| self.fail(f, op))?;
        Ok(info.fencing_floor)
    }

    async fn floor(&self) -> Result<Option<Stored>, StorageError> {
        let floor = self.read_floor("get").await?;
        let now = now_ts();
        Ok((floor > 0).then(|| Stored {
            record: LockRecord {
                owner: OwnerId::NOBODY,
                count: 0,
                fencing: floor,
                acquired_at: now,
                expires_at: now,
                holder: None,
            },
            version: Version::from_u64(floor),
        }))
    }

    fn lock_path(name: &str, action: &str) -> String {
        format!("/v1/locks/{}{action}", segment(name))
    }

    fn stored(
        &self,
        info: LockInfo,
        now: Timestamp,
    ) -> Result<Option<(String, Stored)>, StorageError> {
        let Some(fencing) = info.fencing_token else {
            return Ok(None);
        };
        // A state this version does not know counts as held while the server gives it time
        // left: never read a lock as free on a guess.
        let held = match info.state {
            LockState::Held => true,
            LockState::Other => info.expires_in_ms.is_some_and(|left| left > 0),
            _ => false,
        };
        // Times of a held lock are counted on this host's clock from the server's durations,
        // so that `now()` (this host's clock) and the record agree; a free record's expiry is
        // in the past whatever the clocks say.
        let expires_at = match info.expires_in_ms {
            Some(left) if held => now.saturating_add(Duration::from_millis(left)),
            _ => parse_ts(info.expires_at.as_deref()).map_or(now, |t| t.min(now)),
        };
        let record = LockRecord {
            owner: OwnerId::NOBODY, // the server never shows owners
            count: u32::from(info.state != LockState::Released),
            fencing,
            acquired_at: parse_ts(info.acquired_at.as_deref()).unwrap_or(now),
            expires_at,
            holder: info.holder.map(|h| HolderInfo::from(h).into()),
        };
        let version = Version::from_text(info.revision.unwrap_or_default());
        Ok(Some((info.name, Stored { record, version })))
    }
}

#[async_trait]
impl Storage for RemoteStorage {
    fn name(&self) -> &str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        self.capabilities
    }

    /// This host's clock: every time the server sends is turned into one on this clock through
    /// the durations it carries, so no two clocks are ever compared.
    async fn now(&self) -> Result<Timestamp, StorageError> {
        Ok(now_ts())
    }

    /// A lock's record as the server shows it (owner hidden: [`OwnerId::NOBODY`]). The fencing
    /// floor's reserved key is served from `GET /v1/storage`.
    async fn get(&self, key: &str) -> Result<Option<Stored>, StorageError> {
        if key == storage_lock_core::storage::ops::FENCING_FLOOR_KEY {
            return self.floor().await;
        }
        let info: LockInfo = self
            .call(
                Method::GET,
                &Self::lock_path(key, ""),
                NO_BODY,
                REQUEST_TIMEOUT,
            )
            .await
            .map_err(|f| self.fail(f, "get"))?;
        Ok(self.stored(info, now_ts())?.map(|(_, s)| s))
    }

    async fn list(&self, prefix: &str, page: &PageRequest) -> Result<Page, StorageError> {
        let limit = page.effective_limit().clamp(1, 1000).to_string();
        let mut query = vec![("prefix", prefix), ("limit", limit.as_str())];
        if let Some(after) = &page.after {
            query.push(("cursor", after));
        }
        let qs: Vec<String> = query
            .iter()
            .map(|(k, v)| format!("{k}={}", segment(v)))
            .collect();
        let list: LockList = self
            .call(
                Method::GET,
                &format!("/v1/locks?{}", qs.join("&")),
                NO_BODY,
                REQUEST_TIMEOUT,
            )
            .await
            .map_err(|f| self.fail(f, "list"))?;
        let now = now_ts();
        let mut entries = Vec::with_capacity(list.locks.len());
        for info in list.locks {
            entries.extend(self.stored(info, now)?);
        }
        Ok(Page {
            entries,
            next: list.next_cursor,
            corrupt: Vec::new(),
        })
    }

    async fn acquire_once(
        &self,
        key: &str,
        req: &AcquireRequest,
    ) -> Result<AcquireOutcome, StorageError> {
        if req.reentrant {
            return Err(StorageError::Unsupported {
                backend: NAME.into(),
                operation: "reentrant acquire",
            });
        }
        let body = AcquireBody {
            lease_ms: millis(req.lease),
            owner: Some(req.owner.to_string()),
            // The note travels once, as the hold's note.
            holder: req.holder.as_deref().map(|h| HolderBody {
                host: h.host.clone(),
                pid: h.pid,
                note: None,
            }),
            note: req.holder.as_ref().and_then(|h| h.note.clone()),
            ..AcquireBody::default()
        };
        let sent = now_ts();
        match self
            .call::<Hold>(
                Method::POST,
                &Self::lock_path(key, "/acquire"),
                Some(&body),
                REQUEST_TIMEOUT,
            )
            .await
        {
            Ok(hold) => Ok(AcquireOutcome::Acquired {
                fencing: hold.fencing_token,
                count: 1,
                // Counted from before the request left: never later than the server's expiry.
                expires_at: sent.saturating_add(Duration::from_millis(hold.expires_in_ms)),
            }),
            Err(Failure::Status(StatusCode::CONFLICT, busy)) => {
                let now = now_ts();
                Ok(AcquireOutcome::Busy {
                    expires_at: now
                        .saturating_add(Duration::from_millis(busy.expires_in_ms.unwrap_or(0))),
                    now,
                    holder: busy.holder.map(|h| HolderInfo::from(h).into()),
                })
            }
            Err(f) => Err(self.fail(f, "acquire")),
        }
    }

    async fn renew(
        &self,
        key: &str,
        owner: OwnerId,
        lease: Duration,
    ) -> Result<RenewOutcome, StorageError> {
        let body = RenewBody {
            lease_ms: millis(lease),
            owner: owner.to_string(),
        };
        let sent = now_ts();
        match self
            .call::<Renewed>(
                Method::POST,
                &Self::lock_path(key, "/renew"),
                Some(&body),
                REQUEST_TIMEOUT,
            )
            .await
        {
            Ok(_) => Ok(RenewOutcome::Renewed {
                expires_at: sent.saturating_add(lease),
            }),
            Err(Failure::Status(StatusCode::GONE, _)) => Ok(RenewOutcome::NotHeld),
            Err(f) => Err(self.fail(f, "renew")),
        }
    }

    async fn release(&self, key: &str, owner: OwnerId) -> Result<ReleaseOutcome, StorageError> {
        let body = ReleaseBody {
            owner: owner.to_string(),
        };
        let r: Released = self
            .call(
                Method::POST,
                &Self::lock_path(key, "/release"),
                Some(&body),
                REQUEST_TIMEOUT,
            )
            .await
            .map_err(|f| self.fail(f, "release"))?;
        match (r.released, r.fencing_token) {
            (true, Some(fencing)) => Ok(ReleaseOutcome::Released {
                remaining: 0,
                fencing,
            }),
            (true, None) => Err(corrupt(key, "a release without a fencing token")),
            (false, _) => Ok(ReleaseOutcome::NotHeld),
        }
    }

    /// A long poll that completes when the lock is (or becomes) free: it is sent only when the
    /// engine starts waiting, after its attempt found the lock busy, and returns at once if the
    /// lock was freed in between — no wake-up is lost.
    async fn wait_for_change(&self, key: &str) -> Result<ChangeWait, StorageError> {
        let this = self.clone();
        let path = format!(
            "{}?wait_ms={}&while=held",
            Self::lock_path(key, ""),
            LONG_POLL.as_millis()
        );
        Ok(ChangeWait::new(async move {
            let r = this
                .call::<LockInfo>(Method::GET, &path, NO_BODY, LONG_POLL + REQUEST_TIMEOUT)
                .await;
            if r.is_err() {
                // The server is unreachable: let the engine's own retry pacing take over.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }))
    }

    fn delegated_admin(&self) -> Option<&dyn DelegatedAdmin> {
        Some(self)
    }
}

/// How long a sweep through the server may take (it deletes page by page).
const SWEEP_TIMEOUT: Duration = Duration::from_secs(300);

/// The operations run by the server: the admin ones (`POST /v1/locks/{name}/force-release`,
/// `POST /v1/sweep`, `GET /v1/storage`), which need a token with the `admin` grant, and a
/// semaphore's limit record (`/v1/locks/{name}/semaphore-limit`), which needs `lock`.
#[async_trait]
impl DelegatedAdmin for RemoteStorage {
    fn backend(&self) -> &str {
        &self.backend
    }

    async fn force_release(
        &self,
        key: &str,
        expected: Option<u64>,
    ) -> Result<Option<LockRecord>, StorageError> {
        let body = ForceReleaseBody {
            expected_fencing_token: expected,
            reason: None,
        };
        let ended: ForceReleased = self
            .call(
                Method::POST,
                &Self::lock_path(key, "/force-release"),
                Some(&body),
                REQUEST_TIMEOUT,
            )
            .await
            .map_err(|f| self.fail(f, "force_release"))?;
        if !ended.released {
            return Ok(None);
        }
        let now = now_ts();
        let Some(fencing) = ended.fencing_token else {
            return Err(corrupt(key, "a force-release without a fencing token"));
        };
        Ok(Some(LockRecord {
            owner: OwnerId::NOBODY, // the server never shows owners
            count: 1,
            fencing,
            acquired_at: now,
            expires_at: now,
            holder: ended
                .holder
                .map(|h| std::sync::Arc::new(HolderInfo::from(h))),
        }))
    }

    async fn sweep(&self, prefix: &str, older_than: Duration) -> Result<SweepReport, StorageError> {
        let body = SweepBody {
            prefix: prefix.to_owned(),
            older_than_ms: millis(older_than),
        };
        let swept: Swept = self
            .call(Method::POST, "/v1/sweep", Some(&body), SWEEP_TIMEOUT)
            .await
            .map_err(|f| self.fail(f, "sweep"))?;
        Ok(SweepReport {
            deleted: swept.deleted,
            floor: swept.fencing_floor,
        })
    }

    async fn fencing_floor(&self) -> Result<u64, StorageError> {
        self.read_floor("fencing_floor").await
    }

    /// `GET` / `PUT /v1/locks/{name}/semaphore-limit`: the server keeps the record on its
    /// storage (needs `lock` on the name, as taking a permit does).
    async fn semaphore_limit(
        &self,
        key: &str,
        permits: Option<u64>,
    ) -> Result<Option<u64>, StorageError> {
        let path = Self::lock_path(key, "/semaphore-limit");
        let limit: SemaphoreLimit = match permits {
            None => {
                self.call(Method::GET, &path, NO_BODY, REQUEST_TIMEOUT)
                    .await
            }
            Some(permits) => {
                let body = SemaphoreLimitBody {
                    permits: u32::try_from(permits).unwrap_or(u32::MAX),
                };
                self.call(Method::PUT, &path, Some(&body), REQUEST_TIMEOUT)
                    .await
            }
        }
        .map_err(|f| self.fail(f, "semaphore_limit"))?;
        Ok(limit.permits)
    }
}
