//! [`LockHandle`]: what application code holds. Its runtime (state machine, timers, watchdog)
//! is this layer's `HoldRuntime`; this is the documented face.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio_util::sync::CancellationToken;

use super::io::Io;
use super::{HoldGrant, HoldIo, HoldRuntime};
use crate::contract::LockError;

/// The result of [`LockHandle::try_renew`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RenewalResult {
    /// Still held; the fencing token is unchanged.
    Renewed {
        /// The new authoritative expiry (storage clock).
        expires_at: SystemTime,
    },
    /// Not held (any more). Unless the handle had been released normally, it is now lost.
    Lost,
}

/// One hold of a lock.
///
/// States: **held** → **released** (by [`LockHandle::release`] or drop) or **lost** (local
/// deadline passed, renewal not confirmed). Both are terminal; a handle never re-acquires.
///
/// Rules of use: release it from the task that acquired it (or let it drop); do not cache it
/// across requests; pass [`LockHandle::fencing_token`] with every write to the protected
/// resource and let the resource reject stale tokens ([`crate::FencedResource`]); stop writing
/// as soon as [`LockHandle::lost`] completes.
#[must_use = "dropping a LockHandle releases the lock in the background; keep it while you work"]
pub struct LockHandle {
    runtime: Arc<HoldRuntime>,
}

impl LockHandle {
    /// The face of a started hold runtime.
    pub(crate) fn from_runtime(runtime: Arc<HoldRuntime>) -> Self {
        Self { runtime }
    }

    /// Starts the handle of a hold a provider was just granted: the local deadline (counted
    /// from [`HoldGrant`]'s `sent_at`), the deadline timer, the watchdog if asked for, the lost
    /// signal and release on drop all work as for the engine's own handles; `io` does the
    /// renewals and the release. For providers that are not a [`crate::Storage`].
    ///
    /// Must be called inside a tokio runtime (the timers are tokio tasks).
    ///
    /// # Examples
    /// See [`HoldIo`].
    pub fn start(grant: HoldGrant, io: impl HoldIo) -> Self {
        Self::from_runtime(super::watchdog::start_watched(grant, Io(io), None))
    }

    /// The lock name given at acquisition (not the storage key).
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), storage_lock_core::LockError> {
    /// # use std::time::Duration;
    /// # use storage_lock_core::{MemoryStorage, StorageLock};
    /// # let locks = StorageLock::new(MemoryStorage::new())?;
    /// let lock = locks.try_acquire_for("orders/42", Duration::ZERO).await?.expect("free");
    /// assert_eq!(lock.name(), "orders/42");
    /// # Ok(()) }
    /// ```
    pub fn name(&self) -> &str {
        self.runtime.name()
    }

    /// The storage key the name was normalized to.
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), storage_lock_core::LockError> {
    /// # use std::time::Duration;
    /// # use storage_lock_core::{MemoryStorage, StorageLock};
    /// # let locks = StorageLock::new(MemoryStorage::new())?;
    /// let lock = locks.try_acquire_for("orders/42", Duration::ZERO).await?.expect("free");
    /// assert_eq!(lock.key(), "orders/42"); // the default normalizer keeps the name
    /// # Ok(()) }
    /// ```
    pub fn key(&self) -> &str {
        self.runtime.key()
    }

    /// This hold's fencing token: strictly greater than every earlier hold's of the same key,
    /// unchanged by renewals.
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), storage_lock_core::LockError> {
    /// # use std::time::Duration;
    /// # use storage_lock_core::{MemoryStorage, StorageLock};
    /// # let locks = StorageLock::new(MemoryStorage::new())?;
    /// let lock = locks.try_acquire_for("orders/42", Duration::ZERO).await?.expect("free");
    /// let token = lock.fencing_token();
    /// lock.release().await?;
    /// let next = locks.try_acquire_for("orders/42", Duration::ZERO).await?.expect("free");
    /// assert!(next.fencing_token() > token);
    /// # Ok(()) }
    /// ```
    pub fn fencing_token(&self) -> u64 {
        self.runtime.fencing()
    }

    /// The owner the storage records this hold under (`None` for a handle made by a provider
    /// of its own, [`LockHandle::start`]). It is the secret that renews and releases the hold:
    /// hand it only to a process that must release for this one if it dies (what
    /// `storage-lock run`'s dead-man switch does), never to a log.
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), storage_lock_core::LockError> {
    /// # use std::time::Duration;
    /// # use storage_lock_core::{MemoryStorage, Storage, StorageLock};
    /// # let locks = StorageLock::new(MemoryStorage::new())?;
    /// let lock = locks.try_acquire_for("job", Duration::ZERO).await?.expect("free");
    /// let owner = lock.owner().expect("an engine handle");
    /// // Another party that knows the owner can release the hold.
    /// locks.storage().release(lock.key(), owner).await?;
    /// assert!(locks.try_acquire_for("job", Duration::ZERO).await?.is_some());
    /// # Ok(()) }
    /// ```
    pub fn owner(&self) -> Option<crate::storage::OwnerId> {
        self.runtime.owner()
    }

    /// The lease each renewal extends the hold by when no other is given.
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), storage_lock_core::LockError> {
    /// # use std::time::Duration;
    /// # use storage_lock_core::{MemoryStorage, StorageLock};
    /// # let locks = StorageLock::new(MemoryStorage::new())?;
    /// let lock = locks.try_acquire_for("orders/42", Duration::ZERO).await?.expect("free");
    /// assert_eq!(lock.lease(), Duration::from_secs(30)); // the default
    /// # Ok(()) }
    /// ```
    pub fn lease(&self) -> Duration {
        self.runtime.lease()
    }

    /// The authoritative expiry (storage clock) as of the last confirmed acquire/renew, to the
    /// millisecond (as storages count it; a provider's finer expiry is rounded down).
    /// Meaningless once the handle is lost or released.
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), storage_lock_core::LockError> {
    /// # use std::time::Duration;
    /// # use storage_lock_core::{MemoryStorage, StorageLock};
    /// # let locks = StorageLock::new(MemoryStorage::new())?;
    /// let lock = locks.try_acquire_for("orders/42", Duration::ZERO).await?.expect("free");
    /// assert!(lock.expires_at() > std::time::SystemTime::now());
    /// # Ok(()) }
    /// ```
    pub fn expires_at(&self) -> SystemTime {
        self.runtime.expires_at()
    }

    /// How long until the handle's **local deadline** (see [`super::safety_margin`]): the moment it
    /// turns lost unless a renewal is confirmed first. `None` once the handle is released or
    /// lost. A supervisor that must stop work before anyone else can hold the lock (the CLI's
    /// `run`) schedules that stop from this, not from [`Self::expires_at`] (another clock).
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), storage_lock_core::LockError> {
    /// # use std::time::Duration;
    /// # use storage_lock_core::{AcquireOptions, MemoryStorage, StorageLock, Wait};
    /// # let locks = StorageLock::new(MemoryStorage::new())?;
    /// let lock = locks.try_acquire_for("job", Duration::ZERO).await?.expect("free");
    /// let left = lock.time_left().expect("held");
    /// assert!(left < Duration::from_secs(30)); // the default lease, less the safety margin
    /// lock.release().await?;
    /// assert_eq!(lock.time_left(), None);
    /// # Ok(()) }
    /// ```
    pub fn time_left(&self) -> Option<Duration> {
        self.runtime.time_left()
    }

    /// Whether the hold is lost (terminal). A normally released handle is *not* lost, so use
    /// [`Self::lost`] (or [`Self::lost_token`]) — not this — to decide whether to keep writing.
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), storage_lock_core::LockError> {
    /// # use std::time::Duration;
    /// # use storage_lock_core::{MemoryStorage, StorageLock};
    /// # let locks = StorageLock::new(MemoryStorage::new())?;
    /// let lock = locks.try_acquire_for("orders/42", Duration::ZERO).await?.expect("free");
    /// assert!(!lock.is_lost());
    /// lock.release().await?;
    /// assert!(!lock.is_lost()); // released is not lost
    /// # Ok(()) }
    /// ```
    pub fn is_lost(&self) -> bool {
        self.runtime.is_lost()
    }

    /// Completes when the hold is lost: the local deadline passed without a confirmed renewal,
    /// or a renewal could not confirm the hold. Never completes for a released handle.
    /// Needs no background task; works on any tokio runtime.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future changes nothing; a new call watches again.
    ///
    /// # Examples
    /// Stop the work when the hold is lost:
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), storage_lock_core::LockError> {
    /// # use std::time::Duration;
    /// # use storage_lock_core::{AcquireOptions, MemoryStorage, StorageLock, Wait};
    /// # let locks = StorageLock::new(MemoryStorage::new())?;
    /// let lock = locks.try_acquire_for("job", Duration::ZERO).await?.expect("free");
    /// tokio::select! {
    ///     () = lock.lost() => { /* stop writing: someone else may hold it now */ }
    ///     () = tokio::time::sleep(Duration::from_millis(10)) => { /* the work, done */ }
    /// }
    /// lock.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.runtime.lost()
    }

    /// A token cancelled when the hold is lost, for APIs that take a `CancellationToken`.
    /// The first call starts a deadline timer on the current tokio runtime (the auto-renew
    /// watchdog, if enabled, already is one).
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), storage_lock_core::LockError> {
    /// # use std::time::Duration;
    /// # use storage_lock_core::{AcquireOptions, MemoryStorage, StorageLock, Wait};
    /// # let locks = StorageLock::new(MemoryStorage::new())?;
    /// let lock = locks.try_acquire_for("job", Duration::ZERO).await?.expect("free");
    /// let token = lock.lost_token();
    /// assert!(!token.is_cancelled());
    /// # Ok(()) }
    /// ```
    pub fn lost_token(&self) -> CancellationToken {
        self.runtime.lost_token()
    }

    /// Extends the hold by `lease` (default: the acquisition's lease).
    ///
    /// Fail-closed: if the local deadline has passed (no storage call then), the storage does not
    /// confirm the hold, or the storage cannot be reached, the handle turns lost and this returns
    /// [`RenewalResult::Lost`]. On a released handle it returns `Lost` without I/O and without
    /// changing state.
    ///
    /// # Errors
    /// Only for an invalid `lease`: zero ([`LockError::InvalidOptions`]) or ending after the year
    /// 9999 ([`LockError::LeaseOutOfRange`]); nothing changes then.
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), storage_lock_core::LockError> {
    /// # use std::time::Duration;
    /// # use storage_lock_core::{AcquireOptions, MemoryStorage, StorageLock, Wait};
    /// # let locks = StorageLock::new(MemoryStorage::new())?;
    /// use storage_lock_core::RenewalResult;
    /// let lock = locks.try_acquire_for("job", Duration::ZERO).await?.expect("free");
    /// match lock.try_renew(Some(Duration::from_secs(60))).await? {
    ///     RenewalResult::Renewed { expires_at } => assert_eq!(expires_at, lock.expires_at()),
    ///     RenewalResult::Lost => unreachable!("just acquired"),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn try_renew(&self, lease: Option<Duration>) -> Result<RenewalResult, LockError> {
        self.runtime.try_renew(lease).await
    }

    /// Releases the hold. Idempotent: only the first call (or drop) does storage I/O. Releasing
    /// a lost handle still tries to remove its record (harmless if someone else holds the key).
    ///
    /// # Errors
    /// [`LockError::Storage`] if the storage failed: the lock then frees itself when its lease
    /// ends (the handle counts as released either way).
    ///
    /// # Cancel safety
    /// Cancel safe: if this future is dropped before the storage answered (a `timeout` around
    /// it, a cancelled task), the release goes on in the background, as for a dropped handle.
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), storage_lock_core::LockError> {
    /// # use std::time::Duration;
    /// # use storage_lock_core::{AcquireOptions, MemoryStorage, StorageLock, Wait};
    /// # let locks = StorageLock::new(MemoryStorage::new())?;
    /// let lock = locks.try_acquire_for("job", Duration::ZERO).await?.expect("free");
    /// lock.release().await?;
    /// lock.release().await?; // no second storage call
    /// assert!(locks.try_acquire_for("job", Duration::ZERO).await?.is_some());
    /// # Ok(()) }
    /// ```
    pub async fn release(&self) -> Result<(), LockError> {
        self.runtime.release().await
    }

    /// Releases the hold like [`Self::release`] and says whether it was still ours until then:
    /// `false` when the handle had turned lost, or when the storage no longer had the hold
    /// under this handle's owner (an admin broke it, a sweep or another holder took it). Work
    /// done under the lock may then have overlapped another holder's: a caller that cannot
    /// fence its writes reports it (`storage-lock run` exits 76). A second call answers from
    /// the handle's state without storage I/O.
    ///
    /// # Errors
    /// As [`Self::release`].
    ///
    /// # Cancel safety
    /// As [`Self::release`].
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), storage_lock_core::LockError> {
    /// # use std::time::Duration;
    /// # use storage_lock_core::{MemoryStorage, StorageExt, StorageLock};
    /// # let locks = StorageLock::new(MemoryStorage::new())?;
    /// let lock = locks.try_acquire_for("job", Duration::ZERO).await?.expect("free");
    /// locks.storage().force_release("job").await?; // an admin breaks it
    /// assert!(!lock.release_checked().await?, "it was not ours any more");
    /// # Ok(()) }
    /// ```
    pub async fn release_checked(&self) -> Result<bool, LockError> {
        self.runtime.release_checked().await
    }
}

impl Drop for LockHandle {
    fn drop(&mut self) {
        self.runtime.dropped();
    }
}

impl fmt::Debug for LockHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.runtime.fmt(f)
    }
}
