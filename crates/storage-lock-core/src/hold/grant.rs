//! What a provider knows right after a grant ([`HoldGrant`]), where the hold's name is kept, and
//! which leases can be represented at all.

use std::fmt;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::state::{NAME_ELSEWHERE, from_millis, to_millis};
use crate::clock::BootInstant;
use crate::small_key::SmallKey;

/// The safety margin subtracted from a lease to get the handle's **local deadline**:
/// 1 % of the lease (the clock-rate drift bound between holder and storage) plus 2 ms (the
/// millisecond rounding of stored timestamps), at most half the lease.
///
/// The local deadline starts from a monotonic instant taken *before* the acquire/renew request
/// was sent, so it always falls before the storage's expiry (which the storage computed later,
/// from its own clock) as long as the clocks' rates differ by less than 1 %.
pub fn safety_margin(lease: Duration) -> Duration {
    (lease / 100 + Duration::from_millis(2)).min(lease / 2)
}

/// What a provider knows right after the storage granted a hold: the input of
/// [`crate::LockHandle::start`].
#[derive(Clone)]
pub struct HoldGrant {
    pub(crate) name: GrantName,
    pub(crate) key: SmallKey,
    pub(crate) fencing: u64,
    pub(crate) lease: Duration,
    /// The expiry in milliseconds since the epoch, rounded down (as the handle keeps it).
    pub(crate) expires_ms: u64,
    /// Taken before the acquire request was sent.
    pub(crate) sent_at: BootInstant,
    pub(crate) auto_renew: Option<Duration>,
}

impl fmt::Debug for HoldGrant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HoldGrant")
            .field("name", &self.name_str())
            .field("key", &self.key.as_str())
            .field("fencing", &self.fencing)
            .field("lease", &self.lease)
            .field("expires_at", &from_millis(self.expires_ms))
            .field("sent_at", &self.sent_at)
            .field("auto_renew", &self.auto_renew)
            .finish()
    }
}

impl HoldGrant {
    /// The name (see [`GrantName`]).
    fn name_str(&self) -> &str {
        match &self.name {
            GrantName::Key => self.key.as_str(),
            GrantName::SuffixAt(at) => self.key.as_str().get(usize::from(*at)..).unwrap_or(""),
            GrantName::Other(name) => name,
        }
    }

    /// A grant of `name` with fencing token `fencing` for `lease`, which the authority says ends
    /// at `expires_at`; `sent_at` was taken *before* the acquire request was sent, and the
    /// handle's local deadline is `sent_at + lease − safety margin`. The key is the name and
    /// there is no auto-renew unless set.
    ///
    /// # Examples
    /// See [`super::HoldIo`].
    pub fn new(
        name: &str,
        fencing: u64,
        lease: Duration,
        expires_at: SystemTime,
        sent_at: BootInstant,
    ) -> Self {
        Self {
            key: SmallKey::new(name),
            name: GrantName::Key,
            fencing,
            lease,
            expires_ms: to_millis(expires_at),
            sent_at,
            auto_renew: None,
        }
    }

    /// The key the provider stored the lock under, when it differs from the name.
    ///
    /// # Examples
    /// ```
    /// # use std::time::{Duration, SystemTime};
    /// # use storage_lock_core::{clock::BootInstant, hold::HoldGrant};
    /// let grant = HoldGrant::new("a/b", 1, Duration::from_secs(1), SystemTime::now(), BootInstant::now())
    ///     .key("locks/a/b");
    /// # let _ = grant;
    /// ```
    #[must_use]
    pub fn key(mut self, key: &str) -> Self {
        self.name = GrantName::of(key, self.name_str());
        self.key = SmallKey::new(key);
        self
    }

    /// Renews every `period` in the background (the watchdog), as
    /// [`crate::AcquireOptions::auto_renew`].
    ///
    /// # Examples
    /// ```
    /// # use std::time::{Duration, SystemTime};
    /// # use storage_lock_core::{clock::BootInstant, hold::HoldGrant};
    /// let grant = HoldGrant::new("a", 1, Duration::from_secs(9), SystemTime::now(), BootInstant::now())
    ///     .auto_renew(Some(Duration::from_secs(3)));
    /// # let _ = grant;
    /// ```
    #[must_use]
    pub fn auto_renew(mut self, period: Option<Duration>) -> Self {
        self.auto_renew = period;
        self
    }
}

/// Where a hold's name is, given its key: kept apart only when the key does not end with it.
#[derive(Debug, Clone)]
pub(crate) enum GrantName {
    /// The name is the key (the default normalizer).
    Key,
    /// The name is the key from this byte on (a prefix normalizer).
    SuffixAt(u16),
    /// Any other normalizer's.
    Other(Box<str>),
}

impl GrantName {
    pub(crate) fn of(key: &str, name: &str) -> Self {
        match key.len().checked_sub(name.len()) {
            Some(0) if key == name => Self::Key,
            Some(at) if key.as_bytes()[at..] == *name.as_bytes() => u16::try_from(at)
                .ok()
                .filter(|at| *at != NAME_ELSEWHERE)
                .map_or_else(|| Self::Other(name.into()), Self::SuffixAt),
            _ => Self::Other(name.into()),
        }
    }
}

/// The longest a timer is set for: later deadlines are capped (a lease of centuries still
/// works; its timer simply never fires within the process's life).
pub(super) const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);

/// The longest a deadline timer sleeps before it looks at the boot clock again: tokio's timers
/// run on the monotonic clock, which stands still while the machine is suspended, so after a
/// resume a handle notices its passed deadline within this long (and `is_lost()` at once).
pub(super) const SUSPEND_CHECK: Duration = Duration::from_secs(1);

/// When a timer waiting for `deadline` wakes up (on tokio's clock).
pub(super) fn wake_for(deadline: BootInstant) -> Instant {
    let left = deadline.saturating_duration_since(BootInstant::now());
    Instant::now() + left.min(SUSPEND_CHECK)
}

pub(super) fn local_deadline(sent_at: BootInstant, lease: Duration) -> BootInstant {
    let wanted = lease - safety_margin(lease);
    // `Instant + Duration` must never overflow; if even the cap does not fit, fail closed.
    sent_at
        .checked_add(wanted.min(FAR_FUTURE))
        .unwrap_or(sent_at)
}
