//! Time sources for storages that have no clock of their own, and for tests.
//!
//! Expiry is judged by **one clock per storage** (see [`crate::Storage::now`]). Backends with a
//! server clock use it inside their statements; [`crate::MemoryStorage`] and SQLite use a
//! [`Clock`] of the process/host (by default [`SystemClock`]); tests inject a [`ManualClock`].

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A wall-clock source, read synchronously.
///
/// Implementations must be cheap: the engine and in-process storages read the clock on every
/// operation. A clock shared by several processes must agree within the drift bound documented by
/// whoever injects it.
pub trait Clock: fmt::Debug + Send + Sync + 'static {
    /// The current time.
    fn now(&self) -> Timestamp;
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    fn now(&self) -> Timestamp {
        (**self).now()
    }
}

/// The operating system's real-time clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    /// Milliseconds since the Unix epoch, rounded down (0 before it).
    ///
    /// Read through the C library's `clock_gettime` (what [`std::time::SystemTime`] calls), not
    /// straight from the vDSO: a process run under libfaketime then sees the time it is given,
    /// which is how the tests show what a client whose clock runs ahead can and cannot do.
    fn now(&self) -> Timestamp {
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        Timestamp::from_millis(u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
    }
}

/// A clock that reads like the wall clock when this process first reads it, then moves only
/// with [`BootInstant`]: it never steps, whatever NTP or an operator does to the wall clock
/// afterwards, and it counts time the machine spends suspended.
///
/// What storages that time observations use by default (see [`crate::storage::observed`]):
/// only its rate matters there, and its readings still look like dates to people.
///
/// # Examples
/// ```
/// use storage_lock_core::{Clock, MonotonicClock};
/// let (a, b) = (MonotonicClock.now(), MonotonicClock.now());
/// assert!(b >= a);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct MonotonicClock;

impl Clock for MonotonicClock {
    fn now(&self) -> Timestamp {
        static ANCHOR: std::sync::OnceLock<(Timestamp, BootInstant)> = std::sync::OnceLock::new();
        let (wall, boot) = *ANCHOR.get_or_init(|| (SystemClock.now(), BootInstant::now()));
        wall.saturating_add(BootInstant::now().saturating_duration_since(boot))
    }
}

/// A clock that only moves when told to; clones share the same time.
///
/// ```
/// use std::time::Duration;
/// use storage_lock_core::{Clock, ManualClock, Timestamp};
/// let clock = ManualClock::new(Timestamp::from_millis(1_000));
/// clock.advance(Duration::from_millis(250));
/// assert_eq!(clock.now(), Timestamp::from_millis(1_250));
/// ```
#[derive(Debug, Clone, Default)]
pub struct ManualClock {
    millis: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock that reads `start` until advanced.
    pub fn new(start: Timestamp) -> Self {
        Self {
            millis: Arc::new(AtomicU64::new(start.as_millis())),
        }
    }

    /// Moves the clock forward by `by` (millisecond resolution, saturating).
    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        let _ = self
            .millis
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |m| {
                Some(m.saturating_add(by))
            });
    }

    /// Sets the clock to `to` (it may move backwards: tests of clock skew need that).
    pub fn set(&self, to: Timestamp) {
        self.millis.store(to.as_millis(), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_millis(self.millis.load(Ordering::SeqCst))
    }
}

/// How long the host has been up **including time spent suspended**: `CLOCK_BOOTTIME` on Linux,
/// which neither steps with the wall clock nor stops during a system suspend, unlike the
/// monotonic clock tokio's timers use. `None` where the platform has no such clock.
///
/// Local deadlines are kept on this clock, so a holder that wakes from a suspend knows at once
/// that its deadline passed; SQLite judges expiry on it, so a wall-clock step cannot create two
/// holders.
pub fn boot_time() -> Option<Duration> {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        let ts = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
        Some(Duration::new(
            u64::try_from(ts.tv_sec).unwrap_or(0),
            u32::try_from(ts.tv_nsec).unwrap_or(0),
        ))
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    {
        None
    }
}

/// A point on [`boot_time`]'s clock (on other platforms: a monotonic clock anchored at first
/// use, which may stop while the machine is suspended).
///
/// Handles count their local deadline on this clock, so time the machine spends suspended
/// counts against the hold. A provider outside this crate takes one with
/// [`BootInstant::now`] *before* it sends an acquire request and passes it in its
/// [`crate::hold::HoldGrant`].
///
/// # Examples
/// ```
/// use storage_lock_core::clock::BootInstant;
/// let sent_at = BootInstant::now();
/// assert!(BootInstant::now() >= sent_at);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct BootInstant(Duration);

impl BootInstant {
    /// The current instant.
    pub fn now() -> Self {
        let since_boot = boot_time().unwrap_or_else(|| {
            static ANCHOR: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
            ANCHOR.get_or_init(std::time::Instant::now).elapsed()
        });
        Self(since_boot + suspend::slept())
    }

    pub(crate) fn checked_add(self, by: Duration) -> Option<Self> {
        self.0.checked_add(by).map(Self)
    }

    pub(crate) fn saturating_duration_since(self, earlier: Self) -> Duration {
        self.0.saturating_sub(earlier.0)
    }

    /// Nanoseconds on this clock (saturating after 584 years of uptime): how a handle keeps
    /// its deadline in one atomic word.
    pub(crate) fn as_nanos(self) -> u64 {
        u64::try_from(self.0.as_nanos()).unwrap_or(u64::MAX)
    }

    /// The instant [`Self::as_nanos`] returned `nanos` for.
    pub(crate) const fn from_nanos(nanos: u64) -> Self {
        Self(Duration::from_nanos(nanos))
    }
}

/// A simulated system suspend for tests (per thread: a current-thread runtime's tasks see it,
/// other tests do not).
pub(crate) mod suspend {
    use std::cell::Cell;
    use std::time::Duration;

    thread_local! {
        static SLEPT: Cell<Duration> = const { Cell::new(Duration::ZERO) };
    }

    pub(crate) fn slept() -> Duration {
        if cfg!(test) {
            SLEPT.with(Cell::get)
        } else {
            Duration::ZERO
        }
    }

    /// Moves this thread's boot clock forward by `by`, as if the machine had been suspended
    /// while tokio's monotonic clock stood still.
    #[cfg(test)]
    pub(crate) fn sleep_machine(by: Duration) {
        SLEPT.with(|s| s.set(s.get() + by));
    }
}

/// A point in time on the storage's clock: milliseconds since the Unix epoch.
///
/// Millisecond resolution is what every backend can store and compare exactly; leases are
/// expected to be at least tens of milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Timestamp(u64);

impl Timestamp {
    /// The timestamp `millis` milliseconds after the Unix epoch.
    pub const fn from_millis(millis: u64) -> Self {
        Self(millis)
    }

    /// Milliseconds since the Unix epoch.
    pub const fn as_millis(self) -> u64 {
        self.0
    }

    /// `self + by`, saturating at the largest representable timestamp.
    pub fn saturating_add(self, by: Duration) -> Self {
        Self(
            self.0
                .saturating_add(u64::try_from(by.as_millis()).unwrap_or(u64::MAX)),
        )
    }

    /// How long after `earlier` this timestamp is (zero if it is not later).
    pub fn saturating_since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }

    /// The last instant storage-lock gives a meaning to: 9999-12-31T23:59:59.999Z, the end of
    /// what RFC 3339 (and so every tool that prints an expiry) can write.
    pub const MAX: Timestamp = Timestamp(253_402_300_799_999);

    /// The same instant as a [`SystemTime`], or `None` if it is later than [`Self::MAX`] or the
    /// platform cannot represent it.
    pub fn to_system_time(self) -> Option<SystemTime> {
        if self > Self::MAX {
            return None;
        }
        UNIX_EPOCH.checked_add(Duration::from_millis(self.0))
    }
}
