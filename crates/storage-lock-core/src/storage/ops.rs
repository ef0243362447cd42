//! The lock operations' requests and outcomes, and the decision rules every backend shares.
//!
//! The rules are pure functions of the current record, so the default implementations (built on
//! the CAS primitives), the in-memory override and the tests all apply the *same* rules; SQL and
//! script backends encode these rules in their statements and are held to them by the suites.

use std::sync::Arc;
use std::time::Duration;

use super::record::{HolderInfo, LockRecord, OwnerId, Timestamp};

/// What [`crate::Storage::acquire_once`] is asked to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcquireRequest {
    /// Who acquires.
    pub owner: OwnerId,
    /// How long the hold lasts unless renewed.
    pub lease: Duration,
    /// Who holds it, for people and tools (shared: the engine sends the same one every time).
    pub holder: Option<Arc<HolderInfo>>,
    /// If the same owner already holds the key: `true` adds one level (reentrant API),
    /// `false` reports the key busy (the [`crate::DistributedLock`] contract is not reentrant).
    pub reentrant: bool,
}

/// The result of [`crate::Storage::acquire_once`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcquireOutcome {
    /// The owner holds the key now.
    Acquired {
        /// Fencing token of this hold (kept by reentry).
        fencing: u64,
        /// Reentrancy depth after this call.
        count: u32,
        /// When the hold lapses, on the storage clock.
        expires_at: Timestamp,
    },
    /// Someone else holds the key.
    Busy {
        /// When the current hold lapses unless renewed, on the storage clock.
        expires_at: Timestamp,
        /// The storage clock when this was decided, so callers can compute time left.
        now: Timestamp,
        /// Who holds it.
        holder: Option<Arc<HolderInfo>>,
    },
}

impl AcquireOutcome {
    /// For [`AcquireOutcome::Busy`], how long until the current hold lapses unless renewed.
    pub fn busy_for(&self) -> Option<Duration> {
        match self {
            Self::Busy {
                expires_at, now, ..
            } => Some(expires_at.saturating_since(*now)),
            Self::Acquired { .. } => None,
        }
    }
}

/// The result of [`crate::Storage::acquire_many`]: every key taken, or none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcquireManyOutcome {
    /// The owner holds every key now: one [`AcquireOutcome::Acquired`] per key, in the order
    /// the keys were given.
    Acquired(Vec<AcquireOutcome>),
    /// `keys[index]` is held by someone else (`outcome`, an [`AcquireOutcome::Busy`], says by
    /// whom and until when), and the owner holds none of the keys.
    Busy {
        /// The position of the busy key in the keys given.
        index: usize,
        /// What [`crate::Storage::acquire_once`] would have answered for it.
        outcome: AcquireOutcome,
    },
}

/// The result of [`crate::Storage::acquire_any`]: `need` of the keys taken, or none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcquireAnyOutcome {
    /// The owner holds `need` of the keys now.
    Acquired {
        /// `(position in the keys given, grant)` for each key taken, by position.
        taken: Vec<(usize, AcquireOutcome)>,
        /// The gate's fencing token when a gate was given (the fencing floor when it has no
        /// record: at least any token it ever had); else 0.
        gate: u64,
    },
    /// Fewer than `need` keys were free; the owner holds none of them. The keys found held
    /// (every key was looked at), as `(position, busy outcome)` by position; each outcome is
    /// an [`AcquireOutcome::Busy`] whose `holder` may be left out.
    Busy(Vec<(usize, AcquireOutcome)>),
    /// The gate given has a holder (its record's count is above 0, live or expired): nothing
    /// was taken.
    GateHeld,
}

/// One key of a [`crate::Storage::renew_many`] call: extend `owner`'s live hold of `key` to
/// `now + lease`, as [`crate::Storage::renew`] would.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RenewRequest<'a> {
    /// The key.
    pub key: &'a str,
    /// The owner whose hold is extended.
    pub owner: OwnerId,
    /// The new lease, from the storage's "now".
    pub lease: Duration,
}

/// The result of [`crate::Storage::renew`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewOutcome {
    /// Still held, until `expires_at`.
    Renewed {
        /// The new expiry on the storage clock.
        expires_at: Timestamp,
    },
    /// Not held by this owner (released, expired, or taken over).
    NotHeld,
}

/// The result of [`crate::Storage::release`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseOutcome {
    /// One level was released; `remaining == 0` means the key is free (a tombstone was written).
    Released {
        /// Reentrancy depth left.
        remaining: u32,
        /// The fencing token of the hold released: a release says what it released, so a
        /// retried or delegated release (the lock server's) can tell its caller without a read.
        fencing: u64,
    },
    /// The owner did not hold the key; nothing changed.
    NotHeld,
}

/// The result of [`crate::StorageExt::sweep`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SweepReport {
    /// Records deleted.
    pub deleted: usize,
    /// The fencing floor after the sweep: fresh keys start above it.
    pub floor: u64,
}

/// The decision of [`decide_acquire`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AcquireDecision {
    /// A new hold: write this record (create if there was none, else compare-and-set).
    Take(LockRecord),
    /// The owner's live hold gains a level: set `count` and `expires_at`, keep everything else.
    Reenter {
        /// The new depth.
        count: u32,
        /// The new expiry.
        expires_at: Timestamp,
    },
    /// Leave the record alone and report this.
    Busy(AcquireOutcome),
}

/// The acquire rule: a free key (no record, a tombstone, or an expired hold) goes to the
/// requester with fencing `max(previous, floor) + 1` (`floor + 1` for a fresh key); the owner's
/// own live hold gains a level if `reentrant`, keeping its fencing token; anything else is busy.
///
/// `floor` must have been read *after* `current` (a caller that knows the record exists and
/// cannot have been swept and recreated may pass 0): then every token ever issued for the key
/// on a record that a sweep deleted is at most `floor`.
pub fn decide_acquire(
    current: Option<&LockRecord>,
    floor: u64,
    now: Timestamp,
    req: &AcquireRequest,
) -> AcquireDecision {
    let expires_at = now.saturating_add(req.lease);
    match current {
        Some(rec) if rec.is_held_at(now) => {
            if req.reentrant && rec.owner == req.owner {
                AcquireDecision::Reenter {
                    count: rec.count.saturating_add(1),
                    expires_at: expires_at.max(rec.expires_at),
                }
            } else {
                AcquireDecision::Busy(AcquireOutcome::Busy {
                    expires_at: rec.expires_at,
                    now,
                    holder: rec.holder.clone(),
                })
            }
        }
        _ => AcquireDecision::Take(LockRecord {
            owner: req.owner,
            count: 1,
            fencing: current
                .map_or(floor, |r| r.fencing.max(floor))
                .saturating_add(1),
            acquired_at: now,
            expires_at,
            holder: req.holder.clone(),
        }),
    }
}

/// The renew rule: only the owner's live hold is extended; returns the new expiry, `now + lease`.
pub fn decide_renew(
    current: Option<&LockRecord>,
    owner: OwnerId,
    now: Timestamp,
    lease: Duration,
) -> Option<Timestamp> {
    current
        .filter(|r| r.owner == owner && r.is_held_at(now))
        .map(|_| now.saturating_add(lease))
}

/// How a reader-writer lock's gate is passed ([`decide_gate`], for
/// [`crate::Storage::acquire_any`] with a gate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateDecision {
    /// The gate has a holder (live or expired): nothing is taken.
    Held,
    /// Free: the reader passes with this token (the record's).
    Passes(u64),
    /// No record (never held, or deleted by a sweep): the reader passes with the fencing floor,
    /// which a sweep raises above every token it deletes, so it is at least any token the gate
    /// ever had.
    PassesWithFloor,
}

/// The gate rule: a gate whose record has a holder (count above 0, expired or not) is held; a
/// free record passes readers with its token; no record, with the fencing floor.
///
/// # Examples
/// ```
/// use storage_lock_core::storage::ops::{GateDecision, decide_gate};
/// assert_eq!(decide_gate(None), GateDecision::PassesWithFloor);
/// ```
pub fn decide_gate(gate: Option<&LockRecord>) -> GateDecision {
    match gate {
        Some(g) if g.count > 0 => GateDecision::Held,
        Some(g) => GateDecision::Passes(g.fencing),
        None => GateDecision::PassesWithFloor,
    }
}

/// What [`decide_release`] changes: the record keeps everything else (fencing token included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Release {
    /// The new depth; 0 makes the record a tombstone.
    pub count: u32,
    /// The new expiry: the release time for a tombstone, unchanged otherwise.
    pub expires_at: Timestamp,
}

/// The release rule: the owner's hold loses one level; at zero it becomes a tombstone whose
/// `expires_at` is the release time. The fencing token is never touched.
pub fn decide_release(
    current: Option<&LockRecord>,
    owner: OwnerId,
    now: Timestamp,
) -> Option<Release> {
    let rec = current.filter(|r| r.owner == owner && r.count > 0)?;
    let count = rec.count - 1;
    Some(Release {
        count,
        expires_at: if count == 0 {
            rec.expires_at.min(now)
        } else {
            rec.expires_at
        },
    })
}

/// The outcome reported for a hold with this record.
pub fn acquired(rec: &LockRecord) -> AcquireOutcome {
    AcquireOutcome::Acquired {
        fencing: rec.fencing,
        count: rec.count,
        expires_at: rec.expires_at,
    }
}

/// Keys that begin with this character are internal to storage-lock (the fencing floor lives
/// under one). Lock names and normalized keys may not contain control characters, so no user key
/// can collide with them.
pub const RESERVED_KEY_PREFIX: char = '\u{1f}';

/// The key under which the per-storage fencing floor is kept (as a tombstone's fencing token).
pub const FENCING_FLOOR_KEY: &str = "\u{1f}storage-lock:fencing-floor";

/// Whether `key` is internal to storage-lock.
pub fn is_reserved_key(key: &str) -> bool {
    key.starts_with(RESERVED_KEY_PREFIX)
}
