use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use super::LockError;
use crate::storage::Timestamp;

/// How long a hold lasts unless renewed, checked once: longer than zero, and ending by
/// [`Timestamp::MAX`] (the year 9999) from now. Every lease the engine takes — in
/// [`crate::AcquireOptions`] (checked by [`crate::AcquireOptions::validate`]), in
/// `LockHandle::try_renew`, `StorageLock::renew_as` and `StorageLock::renew_reentrant` — passes
/// through [`Lease::new`], so one rule holds everywhere.
///
/// Leases have no other upper bound: a lease of centuries works (its timer is capped, nothing
/// overflows). Tools add their own policy on top and say so: the lock server's schema caps
/// `lease_ms` at 1000 years, the CLI asks for at least 10 ms so that `run` can renew in time.
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use storage_lock_core::{Lease, LockError};
/// assert_eq!(Lease::new(Duration::from_secs(30))?.get(), Duration::from_secs(30));
/// assert!(matches!(Lease::new(Duration::ZERO), Err(LockError::InvalidOptions { .. })));
/// assert!(matches!(Lease::new(Duration::MAX), Err(LockError::LeaseOutOfRange { .. })));
/// # Ok::<(), LockError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lease(Duration);

impl Lease {
    /// `lease`, if it is one.
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] for zero; [`LockError::LeaseOutOfRange`] for a lease that
    /// would end after [`Timestamp::MAX`] (judged on this host's clock, in whole milliseconds
    /// as storages count; the storage's own verdict comes with its expiry).
    ///
    /// The wall clock is read once per process: every lease up to [`Timestamp::MAX`] minus that
    /// reading minus a century fits for the next century (unless the clock jumps further ahead),
    /// so ordinary leases pass without a clock read (this runs on every acquisition); longer
    /// ones are judged on a fresh reading.
    pub fn new(lease: Duration) -> Result<Self, LockError> {
        const CENTURY: Duration = Duration::from_secs(100 * 365 * 86_400);
        static SURE_TO_FIT: OnceLock<Duration> = OnceLock::new();
        if lease.is_zero() {
            return Err(LockError::invalid_option(
                "lease",
                "must be greater than zero",
            ));
        }
        let room = || {
            // Fits iff floor_ms(now + lease) <= MAX, i.e. now + lease < MAX + 1 ms.
            let end = Duration::from_millis(Timestamp::MAX.as_millis() + 1);
            let now = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default();
            end.saturating_sub(now)
        };
        if lease < *SURE_TO_FIT.get_or_init(|| room().saturating_sub(CENTURY)) || lease < room() {
            Ok(Self(lease))
        } else {
            Err(LockError::LeaseOutOfRange { lease })
        }
    }

    /// The duration.
    pub const fn get(self) -> Duration {
        self.0
    }
}

impl TryFrom<Duration> for Lease {
    type Error = LockError;
    fn try_from(lease: Duration) -> Result<Self, LockError> {
        Self::new(lease)
    }
}

impl From<Lease> for Duration {
    fn from(lease: Lease) -> Duration {
        lease.0
    }
}
