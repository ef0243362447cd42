//! Time sources for storages that have no clock of their own, and for tests.
//!
//! Expiry is judged by **one clock per storage** (see [`crate::Storage::now`]). Backends with a
//! server clock use it inside their statements; [`crate::MemoryStorage`] and SQLite use a
//! [`Clock`] of the process/host (by default [`SystemClock`]); tests inject a [`ManualClock`].

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::storage::Timestamp;

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
    fn now(&self) -> Timestamp {
        let since = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        Timestamp::from_millis(u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
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
