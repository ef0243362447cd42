//! What the server shows that the storage does not keep: the events this server's engine
//! emitted (for `GET /v1/locks/{name}/events`, counters and lock pages), when each lock was last
//! granted or renewed here (the span its "expiring" colour is measured against), and the page's
//! CSRF secret.
//!
//! **History.** Recording starts when the server's routes are built ([`crate::Server::router`],
//! inside a tokio runtime; else at the first request) and keeps the last [`KEEP_EVENTS`] events
//! of this process, renewals left out. Each replica keeps its own: an event is seen by the
//! replica whose engine acted (an acquisition through replica A is in A's history, not in
//! B's), and a restart starts over. A force-release carries who did it (the token's name) and
//! the reason they gave: the engine emits the event and the API adds the note
//! ([`Recorder::annotate`]), whichever of the two comes first. A recorder that falls behind the
//! engine's event channel skips events and counts them in `missed`.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;

use sha2::{Digest, Sha256};
use storage_lock_core::{LockEventKind, StorageLock};

/// Events kept for counters and lock pages (renewals are not kept: they would crowd out the
/// rest; only their time is, per lock).
pub(crate) const KEEP_EVENTS: usize = 20_000;
/// Locks whose last grant or renewal time is kept; the map starts over when it is full.
const KEEP_GRANTS: usize = 100_000;

/// What this server saw (see the module docs).
pub(crate) struct Recorder {
    events: Mutex<VecDeque<Seen>>,
    last_grant: Mutex<HashMap<Arc<str>, SystemTime>>,
    /// When recording started.
    started: OnceLock<SystemTime>,
    /// Events skipped because the recorder fell behind the engine's channel.
    missed: AtomicU64,
    /// Admin notes whose engine event has not arrived yet, by (key, fencing token).
    pending: Mutex<HashMap<HoldId, Arc<AdminNote>>>,
    /// The CSRF secret of this server process.
    secret: [u8; 32],
    /// Live pages (`/ui/events` streams) open now.
    pub(crate) streams: AtomicUsize,
    /// Signed-in sessions: opaque id (the cookie) → the bearer token and when it ends. The
    /// cookie never carries the token itself.
    sessions: Mutex<HashMap<String, (String, SystemTime)>>,
}

/// How long a sign-in lasts.
pub(crate) const SESSION_TTL: std::time::Duration = std::time::Duration::from_secs(12 * 3600);
/// Sessions kept at most (the oldest go first).
const MAX_SESSIONS: usize = 10_000;

/// One event of this server's engine.
#[derive(Clone)]
pub(crate) struct Seen {
    pub(crate) at: SystemTime,
    pub(crate) kind: LockEventKind,
    pub(crate) key: Arc<str>,
    pub(crate) fencing: Option<u64>,
    /// Who force-released and why (force-releases through this server's API only).
    pub(crate) admin: Option<Arc<AdminNote>>,
}

/// Who took an admin action and why.
#[derive(Debug)]
pub(crate) struct AdminNote {
    /// The token's name (`anonymous` without auth).
    pub(crate) by: String,
    /// The reason given, if any.
    pub(crate) reason: Option<String>,
}

/// A hold: its key and fencing token.
type HoldId = (Arc<str>, u64);

/// Admin notes waiting for their event at most (the oldest go when full).
const KEEP_PENDING: usize = 1024;

impl Default for Recorder {
    fn default() -> Self {
        let mut secret = [0u8; 32];
        secret[..16].copy_from_slice(&rand::random::<u128>().to_le_bytes());
        secret[16..].copy_from_slice(&rand::random::<u128>().to_le_bytes());
        Self {
            events: Mutex::new(VecDeque::new()),
            last_grant: Mutex::new(HashMap::new()),
            started: OnceLock::new(),
            missed: AtomicU64::new(0),
            pending: Mutex::new(HashMap::new()),
            secret,
            streams: AtomicUsize::new(0),
            sessions: Mutex::new(HashMap::new()),
        }
    }
}

fn guard<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Recorder {
    /// Starts following the engine's events (once; from inside the runtime).
    pub(crate) fn start(self: &Arc<Self>, locks: &StorageLock) {
        self.started.get_or_init(|| {
            let since = SystemTime::now();
            let mut rx = locks.subscribe();
            let weak = Arc::downgrade(self);
            tokio::spawn(async move {
                loop {
                    let ev = match rx.recv().await {
                        Ok(ev) => ev,
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(n)) => {
                            tracing::debug!(missed = n, "the server's event recorder fell behind");
                            if let Some(me) = weak.upgrade() {
                                me.missed.fetch_add(n, Ordering::Relaxed);
                            }
                            continue;
                        }
                        Err(_) => break,
                    };
                    let Some(me) = weak.upgrade() else { break };
                    me.record(Seen {
                        at: SystemTime::now(),
                        kind: ev.kind,
                        key: ev.key,
                        fencing: ev.fencing_token,
                        admin: None,
                    });
                }
            });
            since
        });
    }

    /// When recording started (`None` before [`Self::start`]).
    pub(crate) fn since(&self) -> Option<SystemTime> {
        self.started.get().copied()
    }

    /// Events skipped because the recorder fell behind.
    pub(crate) fn missed(&self) -> u64 {
        self.missed.load(Ordering::Relaxed)
    }

    /// Adds who force-released `key`'s hold `fencing` and why to its event: to the event if
    /// it is recorded already, else to the event when it arrives.
    pub(crate) fn annotate(&self, key: &str, fencing: u64, note: AdminNote) {
        let note = Arc::new(note);
        // Under the events lock, so that `record` cannot slip between the search and the
        // pending entry.
        let mut events = guard(&self.events);
        let recorded = events.iter_mut().rev().find(|e| {
            e.kind == LockEventKind::ForceReleased
                && &*e.key == key
                && e.fencing == Some(fencing)
                && e.admin.is_none()
        });
        match recorded {
            Some(e) => e.admin = Some(note),
            None => {
                let mut pending = guard(&self.pending);
                if pending.len() >= KEEP_PENDING {
                    pending.clear();
                }
                pending.insert((Arc::from(key), fencing), note);
            }
        }
    }

    fn record(&self, mut seen: Seen) {
        if matches!(seen.kind, LockEventKind::Acquired | LockEventKind::Renewed) {
            let mut grants = guard(&self.last_grant);
            if grants.len() >= KEEP_GRANTS {
                grants.clear();
            }
            grants.insert(seen.key.clone(), seen.at);
        }
        if seen.kind == LockEventKind::Renewed {
            return;
        }
        let mut events = guard(&self.events);
        if let (LockEventKind::ForceReleased, Some(f)) = (seen.kind, seen.fencing) {
            seen.admin = guard(&self.pending).remove(&(seen.key.clone(), f));
        }
        if events.len() >= KEEP_EVENTS {
            events.pop_front();
        }
        events.push_back(seen);
    }

    /// When this server last granted or renewed `key`.
    pub(crate) fn last_grant(&self, key: &str) -> Option<SystemTime> {
        guard(&self.last_grant).get(key).copied()
    }

    /// Counts of the events newer than `from` that `keep` accepts, by kind.
    pub(crate) fn count_since(
        &self,
        from: SystemTime,
        kinds: &[LockEventKind],
        keep: impl Fn(&str) -> bool,
    ) -> usize {
        guard(&self.events)
            .iter()
            .rev()
            .take_while(|e| e.at >= from)
            .filter(|e| kinds.contains(&e.kind) && keep(&e.key))
            .count()
    }

    /// The last `n` events of `key`, oldest first.
    pub(crate) fn of(&self, key: &str, n: usize) -> Vec<Seen> {
        let events = guard(&self.events);
        let mut v: Vec<Seen> = events
            .iter()
            .rev()
            .filter(|e| &*e.key == key)
            .take(n)
            .cloned()
            .collect();
        v.reverse();
        v
    }

    /// Starts a session for `token`; returns its opaque id (for the cookie).
    pub(crate) fn sign_in(&self, token: &str) -> String {
        let id = format!(
            "{:032x}{:032x}",
            rand::random::<u128>(),
            rand::random::<u128>()
        );
        let now = SystemTime::now();
        let mut sessions = guard(&self.sessions);
        sessions.retain(|_, (_, ends)| *ends > now);
        if sessions.len() >= MAX_SESSIONS
            && let Some(oldest) = sessions
                .iter()
                .min_by_key(|(_, (_, e))| *e)
                .map(|(k, _)| k.clone())
        {
            sessions.remove(&oldest);
        }
        sessions.insert(id.clone(), (token.to_owned(), now + SESSION_TTL));
        id
    }

    /// The bearer token of a live session.
    pub(crate) fn session_token(&self, id: &str) -> Option<String> {
        let sessions = guard(&self.sessions);
        sessions
            .get(id)
            .filter(|(_, ends)| *ends > SystemTime::now())
            .map(|(t, _)| t.clone())
    }

    /// Ends a session.
    pub(crate) fn sign_out(&self, id: &str) {
        guard(&self.sessions).remove(id);
    }

    /// The CSRF token of a session.
    pub(crate) fn csrf(&self, session: &str) -> String {
        hex(&hmac(&self.secret, session.as_bytes()))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// HMAC-SHA256 (RFC 2104).
fn hmac(key: &[u8; 32], msg: &[u8]) -> [u8; 32] {
    let mut k = [0u8; 64];
    k[..32].copy_from_slice(key);
    let pad = |b: u8| k.iter().map(|x| x ^ b).collect::<Vec<u8>>();
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(msg)
        .finalize();
    Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize()
        .into()
}
