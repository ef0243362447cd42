//! A hold's facts and state, packed: what a million held locks cost a million of.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use once_cell::race::OnceBox;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::small_key::SmallKey;

/// A hold's facts and state, kept small: a million held locks cost a million of these.
///
/// * The state (held → released | lost) and the one-time flags share one atomic byte; the
///   expiry (milliseconds since the epoch, as storages count) and the local deadline
///   (nanoseconds on the boot clock) are atomic words, read without a lock. A renewal stores
///   them, then confirms only if the hold is still held (once ended, they mean nothing).
/// * The key is inline when short ([`SmallKey`]); the name is a suffix of it (the default
///   normalizer's key is the name; a prefix normalizer's ends with it) or kept in [`Extra`].
/// * What only some handles need — the `lost()` wake-up, the lost token, a name that is not a
///   suffix of the key — lives in [`Extra`], allocated on first use.
pub(crate) struct HoldCore {
    pub(super) key: SmallKey,
    pub(super) fencing: u64,
    /// The lease in nanoseconds; [`LEASE_ELSEWHERE`] for one of 584 years or more (kept in
    /// [`Extra`]).
    pub(super) lease_ns: u64,
    pub(super) expires_ms: AtomicU64,
    pub(super) deadline_ns: AtomicU64,
    /// One pointer (a `OnceLock` would add a word for its state).
    pub(super) extra: OnceBox<Extra>,
    /// Where the name starts in the key ([`NAME_ELSEWHERE`]: in [`Extra`]).
    pub(super) name_at: u16,
    pub(super) flags: AtomicU8,
}

/// `HoldCore::name_at` when the name is not a suffix of the key.
pub(super) const NAME_ELSEWHERE: u16 = u16::MAX;

/// `HoldCore::lease_ns` when the lease does not fit 64 bits of nanoseconds.
pub(super) const LEASE_ELSEWHERE: u64 = u64::MAX;

/// The parts of a hold most handles never need.
#[derive(Default)]
pub(super) struct Extra {
    /// Wakes `lost()` futures, the deadline timer and a provider's watchdog task when the
    /// handle ends (released or lost); they look at the state to tell which.
    pub(super) ended: Notify,
    /// Created by the first `lost_token()` call only.
    pub(super) lost_token: OnceLock<CancellationToken>,
    /// The name, when it is not a suffix of the key.
    pub(super) name: Option<Box<str>>,
    /// The lease, when it is 584 years or more.
    pub(super) lease: Option<Duration>,
}

/// `HoldCore::flags`: the state in the low two bits, then one-time flags.
pub(super) const STATE: u8 = 0b11;
pub(super) const HELD: u8 = 0;
pub(super) const RELEASED: u8 = 1;
pub(super) const LOST: u8 = 2;
/// `release()` or drop ran (only the first does I/O).
pub(super) const RELEASE_STARTED: u8 = 0b100;
/// A deadline timer or a watchdog task of the handle's own runs.
pub(super) const TIMER_STARTED: u8 = 0b1000;
/// A renewal is in flight (see [`HoldRuntime::renewal_turn`]).
pub(super) const RENEWING: u8 = 0b1_0000;
/// The backend has reported the hold's end (see [`HoldCore::first_end`]).
pub(super) const END_REPORTED: u8 = 0b10_0000;

pub(super) fn to_millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

pub(super) fn from_millis(ms: u64) -> SystemTime {
    UNIX_EPOCH
        .checked_add(Duration::from_millis(ms))
        .unwrap_or(UNIX_EPOCH)
}

impl HoldCore {
    /// The storage key.
    pub(crate) fn key(&self) -> &SmallKey {
        &self.key
    }

    /// The fencing token.
    pub(crate) fn fencing(&self) -> u64 {
        self.fencing
    }

    /// True the first time only: for a backend that reports a hold's end once (metrics and an
    /// event), whichever of release and loss comes first. A bit of the hold's flags rather
    /// than a field of the backend's, so that the engine's handle fits a 128-byte allocation.
    pub(crate) fn first_end(&self) -> bool {
        !self.flag_was_set(END_REPORTED)
    }

    /// Sets the one-time `flag`; whether it was set already.
    pub(super) fn flag_was_set(&self, flag: u8) -> bool {
        self.flags.fetch_or(flag, Ordering::AcqRel) & flag != 0
    }
}
