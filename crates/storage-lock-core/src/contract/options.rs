use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::LockError;

/// The lease used when none is given: 30 seconds.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// How long [`crate::DistributedLock::try_acquire`] waits for a busy lock.
///
/// | mode | busy lock |
/// |---|---|
/// | [`Wait::Never`] (default) | one attempt, then `Ok(None)` at once |
/// | [`Wait::For`]`(d)` | keeps trying for at most `d`, then `Ok(None)` |
/// | [`Wait::Forever`] | keeps trying until acquired or cancelled |
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Wait {
    /// Never wait: one attempt; busy means `Ok(None)` at once. (Not "no limit": that is
    /// [`Wait::Forever`].)
    #[default]
    Never,
    /// Keep trying for at most this long.
    For(Duration),
    /// Wait until acquired (or cancelled).
    Forever,
}

/// Options of one acquisition. Cheap to clone and safe to reuse across acquisitions.
///
/// ```
/// use std::time::Duration;
/// use storage_lock_core::{AcquireOptions, Wait};
/// let opts = AcquireOptions::default()
///     .wait(Wait::For(Duration::from_secs(5)))
///     .lease(Duration::from_secs(10))
///     .auto_renew(Duration::from_secs(3));
/// assert!(opts.validate().is_ok());
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
#[must_use = "options do nothing until passed to `try_acquire`"]
pub struct AcquireOptions {
    /// How long to wait when busy (default: one attempt).
    pub wait: Wait,
    /// How long a hold lasts unless renewed (default 30 s; must be > 0).
    pub lease: Duration,
    /// Renew in the background at this interval (default off; `0 < auto_renew < lease`).
    pub auto_renew: Option<Duration>,
    /// Stops the wait with [`LockError::Cancelled`] when cancelled (dropping the future works too).
    pub cancel: Option<CancellationToken>,
    /// A note stored with the holder info (shown by `list`/`inspect`).
    pub note: Option<String>,
    /// Watch the held record and turn the handle lost as soon as it stops being ours (broken
    /// by an admin, swept, taken over), instead of at the next renewal. `None` (the default):
    /// on for auto-renewed holds on a storage with change notifications that other processes
    /// share (PostgreSQL, Redis, etcd, NATS, SQLite, a lock server); see [`Self::watch_loss`].
    pub watch_loss: Option<bool>,
}

impl Default for AcquireOptions {
    fn default() -> Self {
        Self {
            wait: Wait::Never,
            lease: DEFAULT_LEASE,
            auto_renew: None,
            cancel: None,
            note: None,
            watch_loss: None,
        }
    }
}

impl AcquireOptions {
    /// Sets [`Self::wait`] (default [`Wait::Never`]: one attempt).
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use storage_lock_core::{AcquireOptions, Wait};
    /// let opts = AcquireOptions::default().wait(Wait::For(Duration::from_secs(5)));
    /// assert_eq!(opts.wait, Wait::For(Duration::from_secs(5)));
    /// ```
    pub fn wait(mut self, wait: Wait) -> Self {
        self.wait = wait;
        self
    }

    /// Sets [`Self::lease`] (default 30 s; no upper bound but the year 9999).
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use storage_lock_core::AcquireOptions;
    /// let opts = AcquireOptions::default().lease(Duration::from_secs(600));
    /// assert_eq!(opts.lease, Duration::from_secs(600));
    /// ```
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Sets [`Self::auto_renew`]: a watchdog renews the hold every `every` (must be shorter
    /// than the lease; a third of it leaves two retries before the local deadline).
    ///
    /// On a [`crate::StorageLock`], the watchdogs of all its handles renew together: renewals
    /// fall on a grid of an eighth of their period (so a hold is renewed up to that much
    /// early) and reach the storage as [`crate::Storage::renew_many`] calls of up to
    /// [`crate::RENEW_BATCH`] keys; each hold still stays fail-closed on its own.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use storage_lock_core::AcquireOptions;
    /// let opts = AcquireOptions::default()
    ///     .lease(Duration::from_secs(30))
    ///     .auto_renew(Duration::from_secs(10));
    /// assert!(opts.validate().is_ok());
    /// ```
    pub fn auto_renew(mut self, every: Duration) -> Self {
        self.auto_renew = Some(every);
        self
    }

    /// Sets [`Self::watch_loss`]: whether the hold's record is watched so that a broken,
    /// swept or taken-over hold turns lost within one notification round trip, not at the next
    /// renewal (which may be minutes away for a long lease).
    ///
    /// The watch is a task per hold that arms the storage's change notification for the key and
    /// reads the record after each change (a renewal on etcd or NATS is a change too, so it
    /// costs one read per renewal there). Without notifications on the storage it does nothing:
    /// renewals find out. Off by default for holds without auto-renew (they end by their lease)
    /// and on a process-local storage (nobody else can break them).
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use storage_lock_core::AcquireOptions;
    /// let opts = AcquireOptions::default()
    ///     .auto_renew(Duration::from_secs(10))
    ///     .watch_loss(false); // renewals alone find out
    /// assert_eq!(opts.watch_loss, Some(false));
    /// ```
    pub fn watch_loss(mut self, on: bool) -> Self {
        self.watch_loss = Some(on);
        self
    }

    /// Sets [`Self::cancel`]: cancelling the token stops the wait with
    /// [`LockError::Cancelled`].
    ///
    /// # Examples
    /// ```
    /// use storage_lock_core::AcquireOptions;
    /// use tokio_util::sync::CancellationToken;
    /// let shutdown = CancellationToken::new();
    /// let opts = AcquireOptions::default().cancel(shutdown.child_token());
    /// assert!(opts.cancel.is_some());
    /// ```
    pub fn cancel(mut self, token: CancellationToken) -> Self {
        self.cancel = Some(token);
        self
    }

    /// Sets [`Self::note`]: text stored with the hold for people and tools (`list` shows it to
    /// everyone who can read the storage: no secrets).
    ///
    /// # Examples
    /// ```
    /// use storage_lock_core::AcquireOptions;
    /// let opts = AcquireOptions::default().note("nightly report");
    /// assert_eq!(opts.note.as_deref(), Some("nightly report"));
    /// ```
    pub fn note(mut self, note: impl Into<String>) -> Self {
        self.note = Some(note.into());
        self
    }

    /// Checks the options: `lease > 0` and, if set, `0 < auto_renew < lease`. The engine runs
    /// it before any storage call.
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] naming the option and what is wrong with it.
    ///
    /// # Examples
    /// ```
    /// use std::time::Duration;
    /// use storage_lock_core::AcquireOptions;
    /// let bad = AcquireOptions::default().auto_renew(Duration::from_secs(60)); // ≥ the 30 s lease
    /// assert!(bad.validate().is_err());
    /// ```
    pub fn validate(&self) -> Result<(), LockError> {
        super::Lease::new(self.lease)?;
        if let Some(every) = self.auto_renew {
            if every.is_zero() {
                return Err(LockError::invalid_option(
                    "auto_renew",
                    "must be greater than zero",
                ));
            }
            if every >= self.lease {
                return Err(LockError::invalid_option(
                    "auto_renew",
                    format!(
                        "{every:?} must be shorter than the lease ({:?})",
                        self.lease
                    ),
                ));
            }
        }
        Ok(())
    }
}
