//! [`acquire_all`]: several names held as one, all or nothing, deadlock-free.

use std::fmt;
use std::future::Future;

use futures_util::future::select_all;

use crate::contract::{AcquireOptions, LockError, Wait, validate_name};
use crate::hold::LockHandle;
use crate::lock::DistributedLock;

/// Holds of several names taken together by [`acquire_all`], in name order.
///
/// Dropping it releases every part in the background, as dropping each [`LockHandle`] would.
#[must_use = "dropping a MultiHandle releases every lock in the background; keep it while you work"]
pub struct MultiHandle {
    parts: Vec<LockHandle>,
}

impl MultiHandle {
    /// The holds, one per distinct name, sorted by name.
    pub fn parts(&self) -> &[LockHandle] {
        &self.parts
    }

    /// The hold of `name`, if it is one of the names.
    pub fn part(&self, name: &str) -> Option<&LockHandle> {
        self.parts.iter().find(|p| p.name() == name)
    }

    /// `(name, fencing token)` of every part, sorted by name: pass each resource the token of
    /// its own name.
    pub fn fencing_tokens(&self) -> Vec<(&str, u64)> {
        self.parts
            .iter()
            .map(|p| (p.name(), p.fencing_token()))
            .collect()
    }

    /// Whether any part is lost: the multi-lock as a whole no longer excludes.
    pub fn is_lost(&self) -> bool {
        self.parts.iter().any(LockHandle::is_lost)
    }

    /// Completes as soon as any part is lost (see [`LockHandle::lost`]); never for a released
    /// multi-lock.
    ///
    /// # Cancel safety
    /// Cancel safe, as [`LockHandle::lost`].
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let parts: Vec<_> = self.parts.iter().map(|p| Box::pin(p.lost())).collect();
        async move {
            select_all(parts).await;
        }
    }

    /// Releases every part (all of them, even when one fails).
    ///
    /// # Errors
    /// The first part's error, as [`LockHandle::release`]; a part that failed to release
    /// lapses at the end of its lease.
    pub async fn release(&self) -> Result<(), LockError> {
        release_all(&self.parts).await
    }
}

impl fmt::Debug for MultiHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiHandle")
            .field("parts", &self.parts)
            .finish()
    }
}

async fn release_all(parts: &[LockHandle]) -> Result<(), LockError> {
    let results = futures_util::future::join_all(parts.iter().map(LockHandle::release)).await;
    results.into_iter().collect()
}

/// Takes every name in `names` or none, waiting as `options.wait` says; each part gets
/// `options`' lease, auto-renewal and note. `Ok(None)`: some name stayed busy until the wait
/// budget ran out, and nothing is held.
///
/// Deadlock-free whatever order callers pass: the names are sorted and deduplicated, and the
/// caller never waits while it holds anything (see the [module docs](super)). Names a
/// [`crate::KeyNormalizer`] maps to one key are two locks of one key: they can never be held
/// together, and a [`crate::StorageLock`] refuses them ([`LockError::InvalidOptions`]) before
/// any request.
///
/// # Errors
/// * [`LockError::InvalidOptions`] for an empty list, [`LockError::InvalidName`] /
///   [`LockError::InvalidOptions`] as [`DistributedLock::try_acquire`] — before any storage
///   call;
/// * as [`DistributedLock::try_acquire`] otherwise; the parts taken so far are released before
///   the error returns.
///
/// # Cancel safety
/// Dropping the future drops the parts taken so far, which releases them in the background.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), storage_lock_core::LockError> {
/// use storage_lock_core::kinds::acquire_all;
/// use storage_lock_core::{AcquireOptions, MemoryStorage, StorageLock};
/// let locks = StorageLock::new(MemoryStorage::new())?;
/// let both = acquire_all(&locks, &["account/7", "account/3"], &AcquireOptions::default())
///     .await?
///     .expect("both free");
/// assert_eq!(both.parts()[0].name(), "account/3"); // sorted
/// // One of the names is taken: nothing is.
/// let other = acquire_all(&locks, &["account/3", "account/9"], &AcquireOptions::default()).await?;
/// assert!(other.is_none());
/// both.release().await?;
/// # Ok(()) }
/// ```
pub async fn acquire_all<L: DistributedLock + ?Sized>(
    locks: &L,
    names: &[&str],
    options: &AcquireOptions,
) -> Result<Option<MultiHandle>, LockError> {
    if names.is_empty() {
        return Err(LockError::invalid_option(
            "names",
            "a multi-lock needs at least one name",
        ));
    }
    options.validate()?;
    for name in names {
        validate_name(name)?;
    }
    let mut sorted = names.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let budget = super::Budget::new(options.wait);
    let once = options.clone().wait(Wait::Never);
    let mut waited_for: Option<LockHandle> = None;
    loop {
        let busy = match try_all(locks, &sorted, &once, waited_for.take()).await? {
            Ok(parts) => return Ok(Some(MultiHandle { parts })),
            Err(busy) => busy,
        };
        // Nothing is held here: wait for the busy name alone.
        let Some(wait) = budget.remaining() else {
            return Ok(None);
        };
        match locks.try_acquire(busy, &options.clone().wait(wait)).await? {
            Some(part) => waited_for = Some(part),
            None => return Ok(None),
        }
    }
}

/// One pass over `sorted` without waiting, keeping `held` (a part taken by waiting): every part
/// (`Ok`), or the first busy name with everything released (`Err`). The names not held are
/// taken with one [`DistributedLock::try_acquire_many`] call: one round trip on a storage that
/// takes several keys at once.
async fn try_all<'n, L: DistributedLock + ?Sized>(
    locks: &L,
    sorted: &[&'n str],
    once: &AcquireOptions,
    held: Option<LockHandle>,
) -> Result<Result<Vec<LockHandle>, &'n str>, LockError> {
    let rest: Vec<&'n str> = sorted
        .iter()
        .copied()
        .filter(|&name| held.as_ref().is_none_or(|h| h.name() != name))
        .collect();
    if rest.is_empty() {
        return Ok(Ok(held.into_iter().collect()));
    }
    let failed = match locks.try_acquire_many(&rest, once).await {
        Ok(Ok(mut parts)) => {
            parts.extend(held);
            parts.sort_by(|a, b| a.name().cmp(b.name()));
            return Ok(Ok(parts));
        }
        Ok(Err(index)) => Ok(Err(rest[index])),
        Err(e) => Err(e),
    };
    if let Some(held) = held {
        // A failed release leaves the part to lapse at its lease's end; the caller waits for
        // the busy name either way.
        let _ = held.release().await;
    }
    failed
}
