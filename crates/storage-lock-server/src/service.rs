//! The lock service: every operation of the server once, in typed requests and answers, with
//! one error type ([`ServiceError`]). HTTP (`api`), gRPC (`grpc`) and the web page (`ui`) are
//! thin adapters over it: they parse their wire format into these types, call the service, and
//! write the answer back in their own format — no transport knows another's types.
//!
//! The service checks, in this order, for every operation on a lock: the name (the engine's
//! rule), the caller's permission on it, then the request's values (lease, wait, text limits).
//! Limits are the wire crate's ([`storage_lock_wire::MAX_LEASE_MS`] and the others), so the
//! OpenAPI document and the checks cannot disagree.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use storage_lock_core::{
    AcquireOptions, ChangeWait, HoldGone, HolderInfo, LockRecord, OwnerId, PageRequest, Storage,
    StorageExt, StorageLock, Stored, SweepReport, Timestamp, Version, Wait,
};
use storage_lock_wire::{
    LockState, MAX_HOST_BYTES, MAX_LEASE_MS, MAX_NOTE_BYTES, MAX_PAGE, MAX_PERMITS,
};

use crate::auth::{AuthHandle, Permission, Principal};
use crate::error::{ErrorKind, ServiceError};

/// The server's state and its operations.
pub(crate) struct LockService {
    pub(crate) locks: StorageLock,
    pub(crate) auth: Option<AuthHandle>,
    /// Cancelled when the server starts shutting down (ends gRPC sessions).
    pub(crate) shutdown: tokio_util::sync::CancellationToken,
    /// What the web page and the events route show that the storage does not keep.
    pub(crate) recorder: Arc<crate::recorder::Recorder>,
    /// When `/metrics` last began counting the held locks (see `observe::count_held`).
    pub(crate) held_counted: std::sync::Mutex<Option<tokio::time::Instant>>,
}

/// Who calls: the principal of a bearer token (anyone when the server has no auth) and the
/// address the connection came from, when the transport knows it.
#[derive(Clone)]
pub(crate) struct Caller(Option<Principal>, Option<std::net::IpAddr>);

impl Caller {
    /// The caller an `Authorization` value (`Bearer <token>`) names: `unauthorized` if the
    /// server has auth and the value is missing or not a known token.
    pub(crate) fn from_authorization(
        svc: &LockService,
        value: Option<&str>,
    ) -> Result<Self, ServiceError> {
        let Some(auth) = svc.auth.as_ref().map(AuthHandle::current) else {
            return Ok(Self(None, None));
        };
        // The scheme is case-insensitive (RFC 7235).
        let token = value
            .and_then(|v| v.split_once(' '))
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, t)| t.trim());
        match token.and_then(|t| auth.authenticate(t)) {
            Some(p) => Ok(Self(Some(p), None)),
            None => Err(ServiceError::new(
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

    /// Anyone (the sign-in page).
    pub(crate) fn anonymous() -> Self {
        Self(None, None)
    }

    /// The caller, connected from `peer`.
    pub(crate) fn connected_from(self, peer: Option<std::net::IpAddr>) -> Self {
        Self(self.0, peer)
    }

    fn require(
        &self,
        svc: &LockService,
        name: &str,
        needed: Permission,
    ) -> Result<(), ServiceError> {
        match (svc.auth.as_ref().map(AuthHandle::current), &self.0) {
            (Some(auth), Some(p)) if !auth.allows(p, name, needed) => Err(ServiceError::new(
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

    /// Whether this caller may do `needed` on `name`.
    pub(crate) fn may(&self, svc: &LockService, name: &str, needed: Permission) -> bool {
        self.require(svc, name, needed).is_ok()
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

    /// The token name of the caller, `anonymous` without auth (for audit logs).
    pub(crate) fn who(&self) -> &str {
        self.0.as_ref().map_or("anonymous", Principal::name)
    }
}

// ---- Typed requests and answers ---------------------------------------------------------------

/// Acquire `name`.
#[derive(Debug, Clone)]
pub(crate) struct Acquire {
    /// How long the hold lasts unless renewed (1 ms ..= [`MAX_LEASE_MS`]).
    pub(crate) lease: Duration,
    /// How long to wait while another owner holds it (≤ [`storage_lock_wire::MAX_WAIT_MS`]).
    pub(crate) wait: Duration,
    /// The caller's owner id (an idempotent retry), or a fresh one.
    pub(crate) owner: Option<OwnerId>,
    /// A note for people.
    pub(crate) note: Option<String>,
    /// Who holds it as the client says (its host is prefixed with the caller's token name).
    pub(crate) holder: Option<HolderInfo>,
}

/// A granted acquire.
#[derive(Debug, Clone)]
pub(crate) struct Granted {
    pub(crate) owner: OwnerId,
    pub(crate) fencing: u64,
    pub(crate) lease: Duration,
    /// Time left when the storage decided.
    pub(crate) expires_in: Duration,
    /// The expiry on the storage's clock (informational).
    pub(crate) expires_at: SystemTime,
}

/// A renewed hold.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Renewal {
    pub(crate) lease: Duration,
    pub(crate) expires_at: SystemTime,
}

/// What a release released: the fencing token of the hold it ended, `None` if the owner held
/// nothing (a retried release).
pub(crate) type Released = Option<u64>;

/// Force-release `name`.
#[derive(Debug, Clone, Default)]
pub(crate) struct ForceRelease {
    /// Only the hold with this fencing token.
    pub(crate) expected: Option<u64>,
    /// Why (logged with who).
    pub(crate) reason: Option<String>,
}

/// The hold a force-release ended.
#[derive(Debug, Clone)]
pub(crate) struct Evicted {
    pub(crate) fencing: u64,
    pub(crate) holder: Option<Arc<HolderInfo>>,
}

/// Read `name`, at once or as a blocking read.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Read {
    /// Wait up to this long for a change (0: answer at once).
    pub(crate) wait: Duration,
    /// With `wait`: return as soon as the lock is free, not at the first change.
    pub(crate) while_held: bool,
}

/// A lock as a read shows it (never its owner).
#[derive(Debug, Clone)]
pub(crate) struct LockView {
    pub(crate) name: String,
    pub(crate) state: LockState,
    /// The last hold's fencing token.
    pub(crate) fencing: Option<u64>,
    pub(crate) holder: Option<Arc<HolderInfo>>,
    pub(crate) acquired_at: Option<SystemTime>,
    pub(crate) expires_at: Option<SystemTime>,
    /// For a held lock: time left when the server read it.
    pub(crate) expires_in: Option<Duration>,
    /// Opaque; changes whenever the record does.
    pub(crate) revision: Option<String>,
}

/// List locks by name prefix.
#[derive(Debug, Clone, Default)]
pub(crate) struct List {
    pub(crate) prefix: String,
    /// The `next_cursor` of the previous page.
    pub(crate) cursor: Option<String>,
    /// 1 ..= [`MAX_PAGE`]; [`storage_lock_wire::DEFAULT_PAGE`] if absent.
    pub(crate) limit: Option<usize>,
}

/// A page of locks the caller may read.
#[derive(Debug, Clone)]
pub(crate) struct LockPage {
    pub(crate) locks: Vec<LockView>,
    pub(crate) next_cursor: Option<String>,
}

/// A lock's recent events as this replica saw them.
#[derive(Clone)]
pub(crate) struct History {
    pub(crate) events: Vec<crate::recorder::Seen>,
    pub(crate) recorded_since: SystemTime,
    pub(crate) kept_at_most: usize,
    pub(crate) missed: u64,
}

/// What the server's storage promises.
#[derive(Debug, Clone)]
pub(crate) struct StorageFacts {
    pub(crate) backend: String,
    pub(crate) capabilities: storage_lock_core::Capabilities,
    pub(crate) fencing_floor: u64,
}

// ---- Input rules ------------------------------------------------------------------------------

/// An owner id from its text form (32 hex digits, not all zero).
pub(crate) fn parse_owner(s: &str) -> Result<OwnerId, ServiceError> {
    match s.parse::<OwnerId>() {
        Ok(OwnerId::NOBODY) | Err(_) => Err(ServiceError::bad_request(
            "invalid_owner",
            "owner must be 32 hex digits, not all zero",
        )),
        Ok(owner) => Ok(owner),
    }
}

fn check_lease(lease: Duration) -> Result<(), ServiceError> {
    if lease < Duration::from_millis(1) || lease > Duration::from_millis(MAX_LEASE_MS) {
        return Err(ServiceError::bad_request(
            "lease_out_of_range",
            format!("lease_ms must be 1..={MAX_LEASE_MS}"),
        ));
    }
    Ok(())
}

fn check_wait(wait: Duration) -> Result<(), ServiceError> {
    let max = storage_lock_wire::MAX_WAIT_MS;
    if wait > Duration::from_millis(max) {
        return Err(ServiceError::bad_request(
            "invalid_options",
            format!("wait_ms must be at most {max}"),
        ));
    }
    Ok(())
}

/// A `limit`: 1 to [`MAX_PAGE`], [`storage_lock_wire::DEFAULT_PAGE`] if absent.
fn page_limit(limit: Option<usize>) -> Result<usize, ServiceError> {
    let limit = limit.unwrap_or(storage_lock_wire::DEFAULT_PAGE);
    if (1..=MAX_PAGE).contains(&limit) {
        Ok(limit)
    } else {
        Err(ServiceError::bad_request(
            "invalid_query",
            format!("limit must be 1..={MAX_PAGE}"),
        ))
    }
}

/// A free-text field: at most `max` bytes, no control characters but tab (a NUL cannot even be
/// stored by PostgreSQL).
fn check_text(field: &str, s: Option<&str>, max: usize) -> Result<(), ServiceError> {
    match s {
        Some(s) if s.len() > max => Err(ServiceError::bad_request(
            "invalid_options",
            format!("{field} is longer than {max} bytes"),
        )),
        Some(s) if s.chars().any(|c| c.is_control() && c != '\t') => {
            Err(ServiceError::bad_request(
                "invalid_options",
                format!("{field} contains control characters"),
            ))
        }
        _ => Ok(()),
    }
}

/// `s` cut to a valid note: control characters dropped, at most [`MAX_NOTE_BYTES`].
pub(crate) fn fit_note(s: &str) -> String {
    s.chars()
        .filter(|c| !c.is_control())
        .scan(0, |n, c| {
            *n += c.len_utf8();
            (*n <= MAX_NOTE_BYTES).then_some(c)
        })
        .collect()
}

/// A list cursor is opaque to clients: the hex of the last key of the page (which may be a
/// name the caller cannot read).
fn cursor_out(key: String) -> String {
    key.bytes().map(|b| format!("{b:02x}")).collect()
}

fn cursor_in(cursor: &str) -> Result<String, ServiceError> {
    let bad =
        || ServiceError::bad_request("invalid_query", "cursor is not one this server gave out");
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

// ---- Operations -------------------------------------------------------------------------------

impl LockService {
    /// Acquires `name`, waiting up to `r.wait` while another owner holds it.
    ///
    /// Cancel safety: dropping the future cancels the wait, and a grant that lands afterwards
    /// is released by the engine.
    pub(crate) async fn acquire(
        &self,
        caller: &Caller,
        name: &str,
        r: Acquire,
    ) -> Result<Granted, ServiceError> {
        self.locks.key_for(name)?;
        caller.require(self, name, Permission::Lock)?;
        check_lease(r.lease)?;
        check_wait(r.wait)?;
        check_text("note", r.note.as_deref(), MAX_NOTE_BYTES)?;
        let holder = match r.holder {
            Some(h) => {
                check_text("holder.note", h.note.as_deref(), MAX_NOTE_BYTES)?;
                check_text("holder.host", Some(&h.host), MAX_HOST_BYTES)?;
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
        let owner = r.owner.unwrap_or_else(OwnerId::random);
        let mut opts = AcquireOptions::default()
            .lease(r.lease)
            .wait(if r.wait.is_zero() {
                Wait::Never
            } else {
                Wait::For(r.wait)
            });
        opts.note = r.note;
        match self
            .locks
            .acquire_as(name, owner, &opts, Some(holder))
            .await?
        {
            Ok(h) => Ok(Granted {
                owner,
                fencing: h.fencing_token,
                lease: r.lease,
                expires_in: h.expires_in,
                expires_at: h.expires_at,
            }),
            // The storage's busy answer says who and for how long: no second read.
            Err(busy) => Err(ServiceError::busy(name, busy.holder, busy.left)),
        }
    }

    /// Extends `owner`'s hold of `name` to `lease` from now; `lost` (with why) if it holds
    /// none.
    pub(crate) async fn renew(
        &self,
        caller: &Caller,
        name: &str,
        owner: OwnerId,
        lease: Duration,
    ) -> Result<Renewal, ServiceError> {
        self.locks.key_for(name)?;
        caller.require(self, name, Permission::Lock)?;
        check_lease(lease)?;
        match self.locks.renew_as(name, owner, lease).await? {
            Some(expires_at) => Ok(Renewal { lease, expires_at }),
            None => {
                let why = self
                    .locks
                    .hold_gone(name, owner)
                    .await?
                    .unwrap_or(HoldGone::TakenOver);
                Err(ServiceError::lost(name, why))
            }
        }
    }

    /// Releases `owner`'s hold of `name`: the fencing token of the hold it ended, `None` if
    /// it held none (safe to retry).
    pub(crate) async fn release(
        &self,
        caller: &Caller,
        name: &str,
        owner: OwnerId,
    ) -> Result<Released, ServiceError> {
        self.locks.key_for(name)?;
        caller.require(self, name, Permission::Lock)?;
        Ok(self.locks.release_as(name, owner).await?)
    }

    /// The limit record of the semaphore `name`: the stored number of permits, written first
    /// as `permits` if none is stored and `permits` is given (see
    /// [`StorageExt::semaphore_limit`]). Needs `lock` on the name: it is part of taking a
    /// permit.
    pub(crate) async fn semaphore_limit(
        &self,
        caller: &Caller,
        name: &str,
        permits: Option<u32>,
    ) -> Result<Option<u64>, ServiceError> {
        let key = self.locks.key_for(name)?;
        caller.require(self, name, Permission::Lock)?;
        if let Some(p) = permits
            && !(1..=MAX_PERMITS).contains(&p)
        {
            return Err(ServiceError::bad_request(
                "invalid_permits",
                format!("permits must be 1..={MAX_PERMITS}, got {p}"),
            ));
        }
        Ok(self
            .locks
            .storage()
            .semaphore_limit(&key, permits.map(u64::from))
            .await?)
    }

    /// Admin: ends the hold of `name` whoever holds it (only the one with `expected`'s token
    /// if given); the audit log and the events say who did it and why.
    pub(crate) async fn force_release(
        &self,
        caller: &Caller,
        name: &str,
        r: ForceRelease,
    ) -> Result<Option<Evicted>, ServiceError> {
        let key = self.locks.key_for(name)?.into_owned();
        caller.require(self, name, Permission::Admin)?;
        check_text("reason", r.reason.as_deref(), MAX_NOTE_BYTES)?;
        let ended = match r.expected {
            Some(f) => self.locks.force_release_if(name, f).await?,
            None => self.locks.force_release(name).await?,
        };
        if let Some(rec) = &ended {
            self.recorder.annotate(
                &key,
                rec.fencing,
                crate::recorder::AdminNote {
                    by: caller.who().to_owned(),
                    reason: r.reason.clone(),
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
            reason = r.reason.as_deref().unwrap_or(""),
            "admin action"
        );
        Ok(ended.map(|rec| Evicted {
            fencing: rec.fencing,
            holder: rec.holder,
        }))
    }

    /// The recent events of `name` seen by this server process (at most `limit`, newest).
    pub(crate) fn events(
        &self,
        caller: &Caller,
        name: &str,
        limit: Option<usize>,
    ) -> Result<History, ServiceError> {
        let key = self.locks.key_for(name)?.into_owned();
        caller.require(self, name, Permission::Read)?;
        let limit = page_limit(limit)?;
        self.recorder.start(&self.locks);
        Ok(History {
            events: self.recorder.of(&key, limit),
            recorded_since: self.recorder.since().unwrap_or_else(SystemTime::now),
            kept_at_most: crate::recorder::KEEP_EVENTS,
            missed: self.recorder.missed(),
        })
    }

    /// Admin: deletes the records under `prefix` free for at least `older_than`, after raising
    /// the fencing floor above their tokens.
    pub(crate) async fn sweep(
        &self,
        caller: &Caller,
        prefix: &str,
        older_than: Duration,
    ) -> Result<SweepReport, ServiceError> {
        check_text("prefix", Some(prefix), MAX_NOTE_BYTES)?;
        caller.require(self, prefix, Permission::Admin)?;
        let report = self.locks.storage().sweep(prefix, older_than).await?;
        tracing::info!(
            target: "storage_lock::audit",
            who = caller.who(),
            action = "sweep",
            prefix = %prefix,
            deleted = report.deleted,
            fencing_floor = report.floor,
            "admin action"
        );
        Ok(report)
    }

    /// A page of the locks under a prefix, only those the caller may read.
    pub(crate) async fn list(&self, caller: &Caller, r: List) -> Result<LockPage, ServiceError> {
        let limit = page_limit(r.limit)?;
        check_text("prefix", Some(&r.prefix), MAX_NOTE_BYTES)?;
        let after = r.cursor.as_deref().map(cursor_in).transpose()?;
        let storage = self.locks.storage();
        let now = storage.now().await?;
        let page = storage
            .list_locks(&r.prefix, &PageRequest { after, limit })
            .await?;
        Ok(LockPage {
            locks: page
                .entries
                .into_iter()
                .filter(|(k, _)| caller.may(self, k, Permission::Read))
                .map(|(k, s)| view(k, Some(&s), now))
                .collect(),
            next_cursor: page.next.map(cursor_out),
        })
    }

    /// Reads `name`; with a wait, a blocking read that returns when the record changes (or,
    /// `while_held`, when the lock is free).
    pub(crate) async fn get(
        &self,
        caller: &Caller,
        name: &str,
        r: Read,
    ) -> Result<LockView, ServiceError> {
        let key = self.locks.key_for(name)?.into_owned();
        caller.require(self, name, Permission::Read)?;
        check_wait(r.wait)?;
        let storage = self.locks.storage().as_ref();
        let (now, stored) = if r.wait.is_zero() {
            read(storage, &key).await?
        } else {
            blocking_read(storage, &key, r.wait, r.while_held).await?
        };
        Ok(view(name.to_owned(), stored.as_ref(), now))
    }

    /// What the lock kinds keep beside `name` (see [`storage_lock_core::kinds::parts`]), as
    /// views of their locks. Needs `read` on the name.
    pub(crate) async fn parts(
        &self,
        caller: &Caller,
        name: &str,
    ) -> Result<PartsView, ServiceError> {
        caller.require(self, name, Permission::Read)?;
        let parts = storage_lock_core::kinds::parts(&self.locks, name).await?;
        let now = parts.now;
        let slots = |of: &str, s: &storage_lock_core::kinds::Slots| {
            let held = s
                .held
                .iter()
                .map(|(i, stored)| {
                    let part = storage_lock_core::kinds::slot_name(of, *i);
                    (*i, view(part, Some(stored), now))
                })
                .collect();
            (s.limit, held)
        };
        let readers = storage_lock_core::kinds::readers_name(name);
        Ok(PartsView {
            semaphore: parts.semaphore.as_ref().map(|s| slots(name, s)),
            readers: parts.readers.as_ref().map(|s| slots(&readers, s)),
            queue: parts
                .queue
                .iter()
                .map(|w| {
                    let place = storage_lock_core::kinds::place_name(name, w.place);
                    (w.ticket, view(place, Some(&w.stored), now))
                })
                .collect(),
        })
    }

    /// What the storage behind this server promises.
    pub(crate) async fn storage_facts(&self) -> Result<StorageFacts, ServiceError> {
        let storage = self.locks.storage();
        Ok(StorageFacts {
            backend: storage.name().to_owned(),
            capabilities: storage.capabilities(),
            fencing_floor: storage.fencing_floor().await?,
        })
    }

    /// Whether the storage answers.
    pub(crate) async fn ready(&self) -> Result<(), ServiceError> {
        self.locks.storage().now().await?;
        Ok(())
    }
}

async fn read(s: &dyn Storage, key: &str) -> Result<(Timestamp, Option<Stored>), ServiceError> {
    let stored = s.get(key).await?;
    let now = s.now().await?;
    Ok((now, stored))
}

/// How often a blocking read looks again when no notification comes (notifications are only
/// a shortcut: some backends notify only when an acquirer is waiting).
const READ_POLL: Duration = Duration::from_millis(100);

async fn blocking_read(
    s: &dyn Storage,
    key: &str,
    wait_for: Duration,
    while_held: bool,
) -> Result<(Timestamp, Option<Stored>), ServiceError> {
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
        let done = if while_held {
            held_for.is_none()
        } else {
            first.as_ref().is_some_and(|v| *v != version)
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

/// What the lock kinds keep beside a name, as views of their locks (see
/// [`LockService::parts`]).
pub(crate) struct PartsView {
    /// A semaphore's number of permits and its held permit slots.
    pub(crate) semaphore: Option<(u64, Vec<(u32, LockView)>)>,
    /// An RW lock's number of reader slots and its held ones.
    pub(crate) readers: Option<(u64, Vec<(u32, LockView)>)>,
    /// A fair lock's queued waiters: ticket and queue place, in ticket order.
    pub(crate) queue: Vec<(u64, LockView)>,
}

fn revision(v: &Version) -> String {
    match (v.as_u64(), v.as_text()) {
        (Some(n), _) => format!("n{n}"),
        (None, Some(t)) => format!("t{t}"),
        (None, None) => String::new(),
    }
}

fn view(name: String, stored: Option<&Stored>, now: Timestamp) -> LockView {
    let Some(stored) = stored else {
        return LockView {
            name,
            state: LockState::Free,
            fencing: None,
            holder: None,
            acquired_at: None,
            expires_at: None,
            expires_in: None,
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
    LockView {
        name,
        state,
        fencing: Some(r.fencing),
        holder: r.holder.clone(),
        acquired_at: r.acquired_at.to_system_time(),
        expires_at: r.expires_at.to_system_time(),
        expires_in: (state == LockState::Held).then(|| r.expires_at.saturating_since(now)),
        revision: Some(revision(&stored.version)),
    }
}
