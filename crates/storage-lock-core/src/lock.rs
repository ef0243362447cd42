//! The entry point: [`DistributedLock`], the one trait application code depends on.
//!
//! Semantics in brief (each is a named test in `storage-lock-testkit`):
//!
//! | situation | result |
//! |---|---|
//! | busy and the wait budget ran out | `Ok(None)`, not an error |
//! | wait cancelled | `Err(LockError::Cancelled)` (or the dropped future); the holder is unaffected |
//! | blank / too long / control characters in the name | `Err(LockError::InvalidName)` before any storage call |
//! | invalid options | `Err(LockError::InvalidOptions)` before any storage call |
//! | lease ran out | handle is lost: `is_lost()`, `lost()` completes |
//! | renewal cannot confirm the hold | `RenewalResult::Lost`, never a transport error |
//! | second `release()` | no second storage call |
//! | fencing token | strictly increasing per key, across processes |
//! | same key twice from the same task | waits / times out: not reentrant |
//!
//! [`LockError::Cancelled`]: crate::LockError::Cancelled
//! [`LockError::InvalidName`]: crate::LockError::InvalidName
//! [`LockError::InvalidOptions`]: crate::LockError::InvalidOptions
//! [`RenewalResult::Lost`]: crate::RenewalResult::Lost

use std::time::Duration;

use async_trait::async_trait;

use crate::contract::{AcquireOptions, LockError, ProviderInfo, Wait};
use crate::hold::LockHandle;

/// A distributed lock provider: the one trait application code depends on.
///
/// Object-safe; hold it as `Arc<dyn DistributedLock>`.
///
/// # Cancel safety
/// Dropping the future returned by [`DistributedLock::try_acquire`] stops the wait. If the
/// storage granted the lock while the future was being dropped, the grant is released in the
/// background as soon as the runtime runs that task; nobody is left holding a lock no one owns.
#[async_trait]
pub trait DistributedLock: Send + Sync {
    /// Who provides the exclusion and how strong it is. A consumer that needs exclusion
    /// across processes checks [`ProviderInfo::process_local`].
    ///
    /// # Examples
    /// ```
    /// use storage_lock_core::{DistributedLock, MemoryStorage, StorageLock};
    /// let locks = StorageLock::new(MemoryStorage::new()).unwrap();
    /// assert!(locks.provider().process_local); // memory excludes tasks of this process only
    /// ```
    fn provider(&self) -> ProviderInfo;

    /// Tries to acquire `name`, waiting as `options.wait` says. `Ok(None)` means the lock is
    /// busy and the wait budget ran out: a normal branch, not an error.
    ///
    /// # Errors
    /// * [`LockError::InvalidName`] / [`LockError::InvalidOptions`] /
    ///   [`LockError::LeaseOutOfRange`] — before any storage call;
    /// * [`LockError::Cancelled`] — `options.cancel` fired while waiting;
    /// * [`LockError::Storage`] — the storage failed and no wait budget was left to retry in
    ///   (while waiting, storage errors are retried with backoff).
    ///
    /// # Cancel safety
    /// Dropping the future stops the wait; a grant that lands after the drop is released in
    /// the background. Existing holders are never affected.
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), storage_lock_core::LockError> {
    /// use std::time::Duration;
    /// use storage_lock_core::{AcquireOptions, DistributedLock, MemoryStorage, StorageLock, Wait};
    /// let locks = StorageLock::new(MemoryStorage::new())?;
    /// let opts = AcquireOptions::default()
    ///     .wait(Wait::For(Duration::from_secs(1)))
    ///     .lease(Duration::from_secs(10))
    ///     .auto_renew(Duration::from_secs(3));
    /// let held = locks.try_acquire("report", &opts).await?.expect("free");
    /// // A second attempt that does not wait finds it busy.
    /// let busy = locks.try_acquire("report", &AcquireOptions::default()).await?;
    /// assert!(busy.is_none());
    /// held.release().await?;
    /// # Ok(()) }
    /// ```
    async fn try_acquire(
        &self,
        name: &str,
        options: &AcquireOptions,
    ) -> Result<Option<LockHandle>, LockError>;

    /// One attempt at every name in `names`, all or nothing, never waiting (whatever
    /// `options.wait` says): the holds, in the order of `names`, or the position of a name
    /// found busy, and then none is held. The step [`crate::kinds::acquire_all`] repeats; call
    /// that instead (it sorts the names, so callers cannot deadlock, and waits).
    ///
    /// The default tries the names one by one and, at the first busy one, releases what it
    /// took. A [`crate::StorageLock`] takes them with one [`crate::Storage::acquire_many`]
    /// call: one round trip on a storage that overrides it (see its docs).
    ///
    /// # Errors
    /// As [`DistributedLock::try_acquire`], and [`LockError::InvalidOptions`] for two names of
    /// one lock (a [`crate::KeyNormalizer`]'s doing) from a [`crate::StorageLock`]. After an
    /// error every grant the call may have got is released (one whose release fails lapses at
    /// the end of its lease).
    ///
    /// # Cancel safety
    /// As [`DistributedLock::try_acquire`]: grants that land after the drop are released.
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), storage_lock_core::LockError> {
    /// use storage_lock_core::{AcquireOptions, DistributedLock, MemoryStorage, StorageLock};
    /// let locks = StorageLock::new(MemoryStorage::new())?;
    /// let held = locks.try_acquire("b", &AcquireOptions::default()).await?.expect("free");
    /// let opts = AcquireOptions::default();
    /// assert_eq!(locks.try_acquire_many(&["a", "b", "c"], &opts).await?.err(), Some(1));
    /// held.release().await?;
    /// let all = locks.try_acquire_many(&["a", "b", "c"], &opts).await?.expect("all free");
    /// assert_eq!(all.len(), 3);
    /// # Ok(()) }
    /// ```
    async fn try_acquire_many(
        &self,
        names: &[&str],
        options: &AcquireOptions,
    ) -> Result<Result<Vec<LockHandle>, usize>, LockError> {
        let once = options.clone().wait(Wait::Never);
        let mut parts: Vec<LockHandle> = Vec::with_capacity(names.len());
        for (index, name) in names.iter().enumerate() {
            let failed = match self.try_acquire(name, &once).await {
                Ok(Some(part)) => {
                    parts.push(part);
                    continue;
                }
                Ok(None) => Ok(Err(index)),
                Err(e) => Err(e),
            };
            // A failed release leaves the part to lapse at its lease's end.
            let released = parts.iter().map(LockHandle::release);
            let _ = futures_util::future::join_all(released).await;
            return failed;
        }
        Ok(Ok(parts))
    }

    /// [`DistributedLock::try_acquire`] with the default lease (30 s, no auto-renew) and the given
    /// wait. Work that may outlast 30 s must use the options form with `auto_renew`.
    ///
    /// # Errors
    /// As [`DistributedLock::try_acquire`].
    ///
    /// # Cancel safety
    /// As [`DistributedLock::try_acquire`].
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), storage_lock_core::LockError> {
    /// use std::time::Duration;
    /// use storage_lock_core::{DistributedLock, MemoryStorage, StorageLock};
    /// let locks = StorageLock::new(MemoryStorage::new())?;
    /// if let Some(lock) = locks.try_acquire_for("nightly", Duration::ZERO).await? {
    ///     assert!(lock.fencing_token() >= 1);
    /// }
    /// # Ok(()) }
    /// ```
    async fn try_acquire_for(
        &self,
        name: &str,
        wait: Duration,
    ) -> Result<Option<LockHandle>, LockError> {
        self.try_acquire(name, &AcquireOptions::default().wait(Wait::For(wait)))
            .await
    }
}
