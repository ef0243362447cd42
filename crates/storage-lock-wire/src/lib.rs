//! The JSON wire format of the storage-lock server's HTTP API `/v1`: every request and response
//! body, declared once for the server (which derives its OpenAPI document from these types with
//! the `openapi` feature) and for its Rust SDK.
//!
//! # Conventions
//!
//! - **Fencing tokens are JSON strings** of decimal digits (`"fencing_token": "42"`): they are
//!   `u64`, and JavaScript numbers lose integers above 2^53. Durations (`*_ms`) are numbers, all
//!   far below 2^53.
//! - **Owners** are 32 hex digits (128 bits, not all zero): the secret that renews and releases
//!   a hold. They are never shown in lists or reads.
//! - **Request bodies refuse unknown fields** (a misspelt option is an error, not a silent
//!   default). Response bodies may gain fields in later versions: readers ignore unknown ones.
//! - **Times** (`*_at`) are RFC 3339 on the server's storage clock and are informational: count
//!   deadlines from the durations (`expires_in_ms`), never by comparing clocks.
//!
//! # Examples
//!
//! ```
//! use storage_lock_wire::{AcquireBody, Hold};
//!
//! let body: AcquireBody = serde_json::from_str(r#"{"lease_ms": 30000, "wait_ms": 5000}"#)?;
//! assert_eq!(body.lease_ms, 30_000);
//! assert!(serde_json::from_str::<AcquireBody>(r#"{"lease_ms": 1, "lease": 2}"#).is_err());
//!
//! let hold: Hold = serde_json::from_str(
//!     r#"{"name":"jobs/1","owner":"0123456789abcdef0123456789abcdef","fencing_token":"42",
//!         "lease_ms":30000,"expires_in_ms":29998,"expires_at":"2026-12-05T08:00:00.000Z"}"#,
//! )?;
//! assert_eq!(hold.fencing_token, 42);
//! # Ok::<(), serde_json::Error>(())
//! ```

use serde::{Deserialize, Serialize};
use storage_lock_core::HolderInfo;
#[cfg(feature = "openapi")]
use utoipa::{IntoParams, ToSchema};

/// The longest a request may wait (`wait_ms` of acquire and of a blocking read): 30 s.
pub const MAX_WAIT_MS: u64 = 30_000;
/// The longest lease a request may ask for: 1000 years of 365.25 days (the engine represents
/// expiries up to the year 9999; a lease is a bound on how long a crashed holder blocks others,
/// so keep yours short and renew).
pub const MAX_LEASE_MS: u64 = 31_557_600_000_000;
/// The longest note, reason or host name field: 1 KiB.
pub const MAX_NOTE_BYTES: usize = 1024;
/// The longest `holder.host`.
pub const MAX_HOST_BYTES: usize = 255;
/// The largest page of `GET /v1/locks` and of `GET /v1/locks/{name}/events`.
pub const MAX_PAGE: usize = 1000;
/// The page size when `limit` is absent.
pub const DEFAULT_PAGE: usize = 100;

/// A duration as the wire carries it: whole milliseconds (saturating).
///
/// # Examples
/// ```
/// assert_eq!(storage_lock_wire::millis(std::time::Duration::from_micros(2_999)), 2);
/// ```
pub fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A time as the wire carries it: RFC 3339 in UTC with milliseconds.
///
/// # Examples
/// ```
/// use std::time::{Duration, UNIX_EPOCH};
/// let t = UNIX_EPOCH + Duration::from_millis(1_500);
/// assert_eq!(storage_lock_wire::rfc3339(t), "1970-01-01T00:00:01.500Z");
/// ```
pub fn rfc3339(t: std::time::SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

/// Fencing tokens as JSON strings (a `u64` does not fit a JavaScript number).
pub mod token {
    use serde::{Deserialize, Deserializer, Serializer, de};

    fn parse<E: de::Error>(s: &str) -> Result<u64, E> {
        if s.is_empty() || s.len() > 20 || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(E::custom("a fencing token is a string of decimal digits"));
        }
        s.parse()
            .map_err(|_| E::custom("a fencing token is at most 18446744073709551615"))
    }

    /// Writes a token as a decimal string.
    ///
    /// # Errors
    /// The serializer's.
    pub fn serialize<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(v)
    }

    /// Reads a token from a decimal string.
    ///
    /// # Errors
    /// Anything but 1–20 decimal digits of a `u64`.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        parse(&String::deserialize(d)?)
    }

    /// An optional token (`null` or absent when there is none).
    pub mod opt {
        use super::{Deserialize, Deserializer, Serializer, parse};

        /// Writes a token as a decimal string, or `null`.
        ///
        /// # Errors
        /// The serializer's.
        pub fn serialize<S: Serializer>(v: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
            match v {
                Some(v) => s.collect_str(v),
                None => s.serialize_none(),
            }
        }

        /// Reads a token from a decimal string, or `null`.
        ///
        /// # Errors
        /// Anything but `null` or 1–20 decimal digits of a `u64`.
        pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
            Option::<String>::deserialize(d)?
                .map(|s| parse(&s))
                .transpose()
        }
    }
}

/// Who holds a lock (for people and tools; never used for decisions), as answers report it.
///
/// Unknown fields are ignored here, as in every answer, so that a client keeps reading the
/// answers of a newer server that says more about a holder; the request side is
/// [`HolderBody`], which refuses them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Holder {
    /// Host name of the holder.
    #[cfg_attr(feature = "openapi", schema(max_length = 255))]
    pub host: String,
    /// Process id of the holder.
    pub pid: u32,
    /// Free-form note.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(max_length = 1024))]
    pub note: Option<String>,
}

impl From<&HolderInfo> for Holder {
    fn from(h: &HolderInfo) -> Self {
        Self {
            host: h.host.clone(),
            pid: h.pid,
            note: h.note.clone(),
        }
    }
}

/// Who holds a lock, as an acquire names it ([`AcquireBody::holder`]): the fields of
/// [`Holder`], and nothing else (a misspelt field is refused, not dropped).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct HolderBody {
    /// Host name of the holder.
    #[cfg_attr(feature = "openapi", schema(max_length = 255))]
    pub host: String,
    /// Process id of the holder.
    pub pid: u32,
    /// Free-form note.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(max_length = 1024))]
    pub note: Option<String>,
}

impl From<HolderBody> for HolderInfo {
    fn from(h: HolderBody) -> Self {
        Self {
            host: h.host,
            pid: h.pid,
            note: h.note,
        }
    }
}

impl From<Holder> for HolderInfo {
    fn from(h: Holder) -> Self {
        Self {
            host: h.host,
            pid: h.pid,
            note: h.note,
        }
    }
}

/// `POST /v1/locks/{name}/acquire`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct AcquireBody {
    /// How long the hold lasts unless renewed.
    #[cfg_attr(
        feature = "openapi",
        schema(minimum = 1, maximum = 31_557_600_000_000.0)
    )]
    pub lease_ms: u64,
    /// How long to wait while another owner holds it (long poll); 0 = answer at once.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(minimum = 0, maximum = 30_000))]
    pub wait_ms: u64,
    /// Your owner id (32 hex digits, random, not all zero): send it to retry an acquire
    /// idempotently — while you hold the lock, the same hold and token come back. Chosen by the
    /// server if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^(?!0{32}$)[0-9a-fA-F]{32}$"))]
    pub owner: Option<String>,
    /// A note shown to people (the command, the job id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(max_length = 1024))]
    pub note: Option<String>,
    /// Who holds it (host, pid); where the request came from if absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<HolderBody>,
}

/// A hold: the answer to a granted acquire.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Hold {
    /// The lock name.
    pub name: String,
    /// The owner id: the secret that renews and releases this hold.
    pub owner: String,
    /// The fencing token (a decimal string; see the crate docs).
    #[serde(with = "token")]
    #[cfg_attr(
        feature = "openapi",
        schema(value_type = String, example = "42", pattern = "^[0-9]{1,20}$")
    )]
    pub fencing_token: u64,
    /// The lease granted.
    pub lease_ms: u64,
    /// Time left when the server decided: count it from when you *sent* the request.
    pub expires_in_ms: u64,
    /// The expiry on the server's storage clock (informational; do not compare clocks).
    pub expires_at: String,
}

/// `POST /v1/locks/{name}/renew`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct RenewBody {
    /// The owner id of the hold.
    #[cfg_attr(feature = "openapi", schema(pattern = "^(?!0{32}$)[0-9a-fA-F]{32}$"))]
    pub owner: String,
    /// The new lease, counted from now.
    #[cfg_attr(
        feature = "openapi",
        schema(minimum = 1, maximum = 31_557_600_000_000.0)
    )]
    pub lease_ms: u64,
}

/// A renewed hold.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
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
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ReleaseBody {
    /// The owner id of the hold.
    #[cfg_attr(feature = "openapi", schema(pattern = "^(?!0{32}$)[0-9a-fA-F]{32}$"))]
    pub owner: String,
}

/// The answer to a release: what it released.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Released {
    /// `false` if this owner held nothing (a retried release): safe to retry.
    pub released: bool,
    /// The fencing token of the hold this release ended (a decimal string); absent when
    /// nothing was released.
    #[serde(default, with = "token::opt", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(value_type = Option<String>, pattern = "^[0-9]{1,20}$")
    )]
    pub fencing_token: Option<u64>,
}

/// `POST /v1/locks/{name}/force-release` (admin).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ForceReleaseBody {
    /// Release only the hold with this fencing token (a decimal string), so you never evict
    /// the next holder by mistake. Any holder if absent.
    #[serde(default, with = "token::opt", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "openapi",
        schema(value_type = Option<String>, pattern = "^[0-9]{1,20}$")
    )]
    pub expected_fencing_token: Option<u64>,
    /// Why (logged with who did it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(max_length = 1024))]
    pub reason: Option<String>,
}

/// The answer to a force-release.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ForceReleased {
    /// `false` if the lock was free or held under another fencing token.
    pub released: bool,
    /// The evicted hold's fencing token (a decimal string); the next hold's is greater.
    #[serde(default, with = "token::opt")]
    #[cfg_attr(
        feature = "openapi",
        schema(value_type = Option<String>, pattern = "^[0-9]{1,20}$")
    )]
    pub fencing_token: Option<u64>,
    /// Who held it.
    #[serde(default)]
    pub holder: Option<Holder>,
}

/// What a lock looks like now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
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
    /// A state newer than this reader knows (a newer server); the server never sends `other`.
    #[serde(other)]
    Other,
}

impl LockState {
    /// The state's name on the wire (`held`, `released`, `expired`, `free`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Held => "held",
            Self::Released => "released",
            Self::Expired => "expired",
            Self::Free => "free",
            Self::Other => "other",
        }
    }
}

/// A lock as `GET` shows it (never its owner).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct LockInfo {
    /// The lock name.
    pub name: String,
    /// Held or free, and why free.
    pub state: LockState,
    /// The last hold's fencing token (a decimal string); the next hold's is greater.
    #[serde(default, with = "token::opt")]
    #[cfg_attr(
        feature = "openapi",
        schema(value_type = Option<String>, pattern = "^[0-9]{1,20}$")
    )]
    pub fencing_token: Option<u64>,
    /// Who holds (or last held) it.
    #[serde(default)]
    pub holder: Option<Holder>,
    /// When the last hold began (storage clock, informational).
    #[serde(default)]
    pub acquired_at: Option<String>,
    /// When it ends or ended (storage clock, informational).
    #[serde(default)]
    pub expires_at: Option<String>,
    /// For a held lock: time left when the server read it.
    #[serde(default)]
    pub expires_in_ms: Option<u64>,
    /// Opaque; changes whenever the record does.
    #[serde(default)]
    pub revision: Option<String>,
}

/// What the lock kinds keep beside a name (`GET /v1/locks/{name}/parts`): a semaphore's
/// permits, a reader-writer lock's readers, a fair lock's queue. Each field is absent when no
/// such kind uses the name.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct LockParts {
    /// The name.
    pub name: String,
    /// A semaphore of this name: its permits and the ones held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub semaphore: Option<SlotsInfo>,
    /// A reader-writer lock of this name: its reader slots and the ones held (its writer holds
    /// the lock `name` itself).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readers: Option<SlotsInfo>,
    /// A fair lock of this name: its queued waiters, in ticket order (served in that order).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub queue: Vec<WaiterInfo>,
}

/// A semaphore's (or an RW lock's readers') slots.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct SlotsInfo {
    /// The stored number of slots.
    pub limit: u64,
    /// The slots held now, in slot order.
    pub held: Vec<SlotInfo>,
}

/// A held slot of a semaphore: its number and its lock.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct SlotInfo {
    /// The slot's number.
    pub slot: u32,
    /// The slot's lock (`NAME/permit/SLOT`).
    pub lock: LockInfo,
}

/// A waiter queued for a fair lock.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct WaiterInfo {
    /// Its ticket (a decimal string): waiters are served in ticket order.
    #[serde(with = "token")]
    #[cfg_attr(
        feature = "openapi",
        schema(value_type = String, pattern = "^[0-9]{1,20}$")
    )]
    pub ticket: u64,
    /// Its queue place's lock (`NAME/waiting/PLACE`), held by the waiter.
    pub lock: LockInfo,
}

/// A page of locks.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct LockList {
    /// Locks in name order.
    pub locks: Vec<LockInfo>,
    /// Pass as `cursor` for the next page; absent on the last page.
    #[serde(default)]
    pub next_cursor: Option<String>,
}

/// `GET /v1/locks` query.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Only names starting with this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// The `next_cursor` of the previous page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
    /// At most this many (1–1000, default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", param(minimum = 1, maximum = 1000))]
    pub limit: Option<usize>,
}

/// `GET /v1/locks/{name}` query.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
#[serde(deny_unknown_fields)]
pub struct GetQuery {
    /// Blocking read: wait up to this long (≤ 30 000) for the record to change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", param(minimum = 0, maximum = 30_000))]
    pub wait_ms: Option<u64>,
    /// With `wait_ms`: `held` waits only while the lock is held, i.e. returns at once if it is
    /// free and otherwise when the hold ends (released, expired, force-released).
    #[serde(default, rename = "while", skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", param(rename = "while"))]
    pub while_: Option<WhileState>,
}

/// The condition of a blocking read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum WhileState {
    /// Wait while the lock is held.
    Held,
}

/// `GET /v1/locks/{name}/events` query.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(IntoParams))]
#[cfg_attr(feature = "openapi", into_params(parameter_in = Query))]
#[serde(deny_unknown_fields)]
pub struct EventsQuery {
    /// At most this many, the newest (1–1000, default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", param(minimum = 1, maximum = 1000))]
    pub limit: Option<usize>,
}

/// What happened to a lock (renewals are not kept).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
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
    /// An event of a kind newer than this reader knows.
    #[serde(other)]
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

/// One event of a lock, as one server saw it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct LockEventInfo {
    /// When the server saw it (its wall clock, RFC 3339).
    pub at: String,
    /// What happened.
    pub kind: EventKind,
    /// The fencing token of the hold involved (a decimal string).
    #[serde(default, with = "token::opt")]
    #[cfg_attr(
        feature = "openapi",
        schema(value_type = Option<String>, pattern = "^[0-9]{1,20}$")
    )]
    pub fencing_token: Option<u64>,
    /// For a force-release: the token name of the admin who did it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// For a force-release: the reason the admin gave.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A lock's recent events as **one replica** saw them.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
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

/// `PUT /v1/locks/{name}/semaphore-limit`: the number of permits of the semaphore `name`
/// (a reader-writer lock's readers are the semaphore `NAME/readers`), written if none is
/// stored yet.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SemaphoreLimitBody {
    /// 1 to [`MAX_PERMITS`].
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 1024))]
    pub permits: u32,
}

/// The stored number of permits of a semaphore (`GET` and `PUT
/// /v1/locks/{name}/semaphore-limit`): every party of the name must use it. Absent when none is
/// stored (no permit of the name was ever taken).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct SemaphoreLimit {
    /// The stored number of permits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permits: Option<u64>,
}

/// The most permits a semaphore has (the engine's).
pub const MAX_PERMITS: u32 = storage_lock_core::kinds::MAX_PERMITS;

/// `POST /v1/sweep` (admin).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(deny_unknown_fields)]
pub struct SweepBody {
    /// Only locks whose name starts with this (the caller needs `admin` on it). Default: all.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(max_length = 1024))]
    pub prefix: String,
    /// Only records free for at least this long (milliseconds). Default 0.
    #[serde(default)]
    pub older_than_ms: u64,
}

/// The answer to a sweep.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct Swept {
    /// Records deleted.
    pub deleted: usize,
    /// The fencing floor after the sweep (a decimal string): fresh locks start above it.
    #[serde(with = "token")]
    #[cfg_attr(
        feature = "openapi",
        schema(value_type = String, pattern = "^[0-9]{1,20}$")
    )]
    pub fencing_floor: u64,
}

/// What the server's storage promises (`GET /v1/storage`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct StorageInfo {
    /// The backend (`sqlite`, `postgres`, `mysql`, `redis`, `etcd`, `nats`, `s3`, `memory`).
    pub backend: String,
    /// `durable`, `unverified` (the settings could not be read) or `volatile` (opted in: a
    /// restart of the storage can hand a held lock out again).
    pub durability: String,
    /// Concurrent conditional writes have exactly one winner.
    pub linearizable_cas: bool,
    /// The storage lives in the server process (`memory`): locks last as long as this one
    /// server process and are not shared with other replicas.
    #[serde(default)]
    pub server_local: bool,
    /// The fencing floor (a decimal string): fresh locks start above it (sweeps raise it).
    #[serde(with = "token")]
    #[cfg_attr(
        feature = "openapi",
        schema(value_type = String, pattern = "^[0-9]{1,20}$")
    )]
    pub fencing_floor: u64,
}

/// The body of every non-2xx response: a stable machine code and a message for people.
///
/// Codes: `invalid_body`, `unsupported_media_type`, `body_too_large`, `invalid_name`,
/// `invalid_owner`, `invalid_options`, `lease_out_of_range`, `invalid_query`, `unauthorized`,
/// `forbidden`, `not_found`, `method_not_allowed`, `busy` (409), `lost` (410),
/// `fencing_exhausted` (422), `unavailable` (503: the storage cannot be reached; retry),
/// `internal` (500).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct ErrorBody {
    /// Stable machine-readable code.
    #[cfg_attr(feature = "openapi", schema(example = "busy"))]
    pub error: String,
    /// What happened, for people.
    pub message: String,
    /// For `lost`: why the hold is gone (`released`, `expired`, `force_released`,
    /// `taken_over`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// For `busy`: who holds the lock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<Holder>,
    /// For `busy`: how long the current hold lasts unless renewed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_in_ms: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_decimal_strings_both_ways() {
        let r = Released {
            released: true,
            fencing_token: Some(u64::MAX),
        };
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(
            text,
            r#"{"released":true,"fencing_token":"18446744073709551615"}"#
        );
        let back: Released = serde_json::from_str(&text).unwrap();
        assert_eq!(back.fencing_token, Some(u64::MAX));
        for bad in [
            r#""""#,
            r#""-1""#,
            r#""1e3""#,
            r#""18446744073709551616""#,
            "42",
        ] {
            let json = format!(r#"{{"released":true,"fencing_token":{bad}}}"#);
            assert!(serde_json::from_str::<Released>(&json).is_err(), "{bad}");
        }
    }

    #[test]
    fn requests_refuse_unknown_fields_and_responses_ignore_them() {
        assert!(serde_json::from_str::<RenewBody>(r#"{"owner":"x","lease_ms":1,"x":1}"#).is_err());
        let info: LockInfo =
            serde_json::from_str(r#"{"name":"a","state":"free","new_field":1}"#).unwrap();
        assert_eq!(info.state, LockState::Free);
        let state: LockState = serde_json::from_str(r#""draining""#).unwrap();
        assert_eq!(state, LockState::Other);
        let kind: EventKind = serde_json::from_str(r#""some_future_kind""#).unwrap();
        assert_eq!(kind, EventKind::Other);
    }

    /// A holder in an answer may say more than this version knows (a newer server); a holder
    /// in an acquire may not (a misspelt field would be dropped without a word).
    #[test]
    fn a_holder_with_a_new_field_reads_in_answers_and_is_refused_in_requests() {
        let info: LockInfo = serde_json::from_str(
            r#"{"name":"a","state":"held","holder":{"host":"h","pid":7,"zone":"eu-1"}}"#,
        )
        .unwrap();
        assert_eq!(info.holder.map(|h| (h.host, h.pid)), Some(("h".into(), 7)));
        let err: ErrorBody = serde_json::from_str(
            r#"{"error":"busy","message":"m","holder":{"host":"h","pid":7,"zone":"eu-1"}}"#,
        )
        .unwrap();
        assert_eq!(err.holder.map(|h| h.pid), Some(7));
        let bad = r#"{"lease_ms":1,"holder":{"host":"h","pid":7,"zone":"eu-1"}}"#;
        assert!(serde_json::from_str::<AcquireBody>(bad).is_err());
        let good = r#"{"lease_ms":1,"holder":{"host":"h","pid":7}}"#;
        assert!(serde_json::from_str::<AcquireBody>(good).is_ok());
    }
}
