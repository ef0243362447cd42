use std::time::Duration;

use async_trait::async_trait;

use super::{AcquireOptions, LockError, LockHandle, ProviderInfo, Wait};

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
    /// Who provides the exclusion and how strong it is.
    fn provider(&self) -> ProviderInfo;

    /// Tries to acquire `name`. `Ok(None)` means the lock is busy and the wait budget ran out.
    ///
    /// Errors: [`LockError::InvalidName`] / [`LockError::InvalidOptions`] before any storage
    /// call; [`LockError::Cancelled`] if `options.cancel` fires; [`LockError::Storage`] if the
    /// storage fails.
    async fn try_acquire(
        &self,
        name: &str,
        options: &AcquireOptions,
    ) -> Result<Option<LockHandle>, LockError>;

    /// [`DistributedLock::try_acquire`] with the default lease (30 s, no auto-renew) and the given
    /// wait. Work that may outlast 30 s must use the options form with `auto_renew`.
    async fn try_acquire_for(
        &self,
        name: &str,
        wait: Duration,
    ) -> Result<Option<LockHandle>, LockError> {
        self.try_acquire(name, &AcquireOptions::default().wait(Wait::For(wait)))
            .await
    }
}
