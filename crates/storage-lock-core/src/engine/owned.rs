//! Holds by explicit owner id without a handle: the API a lock *server* is built on.
//!
//! A server holds nothing itself: its client names the owner (a 128-bit secret), and every
//! request — acquire, renew, release — carries it. Unlike the reentrant API, an acquire by an
//! owner that already holds the lock does **not** add a level: it returns the hold it has
//! (same fencing token), so a client may retry an acquire whose answer it lost without ever
//! getting a second grant. Waiting, notifications, storage-error retries and cancel safety are
//! the acquire loop's (see `acquire`): a dropped `acquire_as` future releases a grant that lands
//! afterwards — unless a newer request of the same owner for the same key has started by then
//! (a client's retry, which adopts the hold; see [`Resumes`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use super::StorageLock;
use super::events::LockEventKind;
use crate::contract::{AcquireOptions, Busy, LockError};
use crate::storage::{HolderInfo, OwnerId, ReleaseOutcome, RenewOutcome, Storage};

/// Acquires by explicit owners in flight: per (key, owner), how many requests (and abandoned
/// storage calls) are alive, and a generation bumped by every new request.
///
/// A request dropped while its storage call is pending releases a grant that lands afterwards
/// (cancel safety) — unless a newer request of the same owner for the same key has started
/// since: that retry adopts (or will adopt) the hold, and releasing it would leave the client
/// believing it holds a free lock. Then the grant is left to the retry, and to its lease.
#[derive(Default)]
pub(crate) struct Resumes(Mutex<ResumeMap>);

/// (key, owner) → (generation of the newest request, requests and abandoned calls alive).
type ResumeMap = HashMap<(Arc<str>, OwnerId), (u64, u32)>;

/// One request's place in [`Resumes`]; dropped when the request and its storage call are done.
pub(crate) struct ResumeTicket {
    shared: Arc<super::EngineShared>,
    key: Arc<str>,
    owner: OwnerId,
    generation: u64,
}

impl Resumes {
    fn map(&self) -> std::sync::MutexGuard<'_, ResumeMap> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl ResumeTicket {
    fn enter(shared: &Arc<super::EngineShared>, key: &str, owner: OwnerId) -> Arc<Self> {
        let key: Arc<str> = key.into();
        let mut map = shared.resumes.map();
        let entry = map.entry((key.clone(), owner)).or_insert((0, 0));
        entry.0 += 1;
        entry.1 += 1;
        Arc::new(Self {
            shared: shared.clone(),
            key: key.clone(),
            owner,
            generation: entry.0,
        })
    }

    /// Whether no newer request of this owner for this key has started.
    pub(crate) fn is_latest(&self) -> bool {
        self.shared
            .resumes
            .map()
            .get(&(self.key.clone(), self.owner))
            .is_none_or(|(g, _)| *g == self.generation)
    }
}

impl Drop for ResumeTicket {
    fn drop(&mut self) {
        let mut map = self.shared.resumes.map();
        let id = (self.key.clone(), self.owner);
        if let Some(entry) = map.get_mut(&id) {
            entry.1 -= 1;
            if entry.1 == 0 {
                map.remove(&id);
            }
        }
    }
}

/// A hold of an explicit owner ([`StorageLock::acquire_as`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnedHold {
    /// The hold's fencing token (unchanged by renewals and by idempotent re-acquires).
    pub fencing_token: u64,
    /// The authoritative expiry (storage clock); informational for remote clients.
    pub expires_at: SystemTime,
    /// Time left when the storage decided: a remote client counts it from when it *sent* the
    /// request, so it never compares its clock with the storage's.
    pub expires_in: Duration,
}

/// Why an owner does not hold a lock ([`StorageLock::hold_gone`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldGone {
    /// The owner released it (or it was never held and the key is free).
    Released,
    /// The lease ran out without a renewal.
    Expired,
    /// An admin force-released it ([`crate::StorageExt::force_release`]).
    ForceReleased,
    /// Someone else holds it now (or held it after this owner).
    TakenOver,
}

impl HoldGone {
    /// A stable lowercase code: `released`, `expired`, `force_released`, `taken_over`.
    ///
    /// # Examples
    /// ```
    /// assert_eq!(storage_lock_core::HoldGone::TakenOver.code(), "taken_over");
    /// ```
    pub fn code(self) -> &'static str {
        match self {
            Self::Released => "released",
            Self::Expired => "expired",
            Self::ForceReleased => "force_released",
            Self::TakenOver => "taken_over",
        }
    }
}

impl<S: Storage + ?Sized> StorageLock<S> {
    /// Acquires `name` for `owner`, waiting per `options.wait`; `Ok(Err(busy))` if another
    /// owner held it until the wait ran out ([`Busy`]: who, and for how long at most, from the
    /// storage's last answer). If `owner` already holds it (a retried request), returns
    /// that hold — never a second grant, never a reentrant level. `options.auto_renew` must be
    /// unset: the owner renews with [`StorageLock::renew_as`]. `holder` names who holds it for
    /// people and tools (a server passes its client's); `None` means this process.
    ///
    /// # Errors
    /// As [`crate::DistributedLock::try_acquire`], plus [`LockError::InvalidOptions`] for
    /// `auto_renew` or the reserved owner [`OwnerId::NOBODY`].
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), storage_lock_core::LockError> {
    /// use storage_lock_core::{AcquireOptions, MemoryStorage, OwnerId, StorageLock};
    /// let locks = StorageLock::new(MemoryStorage::new())?;
    /// let me = OwnerId::random();
    /// let opts = AcquireOptions::default();
    /// let first = locks.acquire_as("jobs/1", me, &opts, None).await?.expect("free");
    /// let retry = locks.acquire_as("jobs/1", me, &opts, None).await?.expect("still mine");
    /// assert_eq!(first.fencing_token, retry.fencing_token);
    /// let busy = locks.acquire_as("jobs/1", OwnerId::random(), &opts, None).await?.unwrap_err();
    /// assert!(busy.holder.is_some());
    /// // A release says what it released: the hold's fencing token.
    /// assert_eq!(locks.release_as("jobs/1", me).await?, Some(first.fencing_token));
    /// assert_eq!(locks.release_as("jobs/1", me).await?, None); // a retry is harmless
    /// # Ok(()) }
    /// ```
    pub async fn acquire_as(
        &self,
        name: &str,
        owner: OwnerId,
        options: &AcquireOptions,
        holder: Option<HolderInfo>,
    ) -> Result<Result<OwnedHold, Busy>, LockError> {
        options.validate()?;
        if options.auto_renew.is_some() {
            return Err(LockError::InvalidOptions {
                option: "auto_renew",
                reason: "a hold by explicit owner has no watchdog; call renew_as".into(),
            });
        }
        if owner == OwnerId::NOBODY {
            return Err(LockError::InvalidOptions {
                option: "owner",
                reason: "the all-zero owner id is reserved".into(),
            });
        }
        let key = crate::small_key::SmallKey::new(&self.key_for(name)?);
        let mut req = self.request(owner, options, false);
        if let Some(mut holder) = holder {
            holder.note = options.note.clone().or(holder.note);
            req.holder = Some(Arc::new(holder));
        }
        let ticket = ResumeTicket::enter(&self.shared, key.as_str(), owner);
        let granted = match self.acquire_loop(&key, &req, options, Some(ticket)).await? {
            Ok(granted) => granted,
            Err(busy) => return Ok(Err(busy)),
        };
        crate::telemetry::not_a_handle();
        let expires_at = self
            .expiry_or_release(key.as_str(), owner, &granted, options.lease)
            .await?;
        self.shared
            .events
            .emit(LockEventKind::Acquired, key.as_str(), Some(granted.fencing));
        Ok(Ok(OwnedHold {
            fencing_token: granted.fencing,
            expires_at,
            expires_in: granted.expires_in,
        }))
    }

    /// Extends `owner`'s live hold of `name` to `now + lease` and returns the new authoritative
    /// expiry; `Ok(None)` if it does not hold it (ask [`StorageLock::hold_gone`] why). One
    /// storage call; the time left is `lease`.
    ///
    /// # Errors
    /// [`LockError::InvalidName`], [`LockError::InvalidOptions`] for a zero lease,
    /// [`LockError::LeaseOutOfRange`], [`LockError::Storage`].
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), storage_lock_core::LockError> {
    /// # use std::time::Duration;
    /// use storage_lock_core::{AcquireOptions, MemoryStorage, OwnerId, StorageLock};
    /// let locks = StorageLock::new(MemoryStorage::new())?;
    /// let me = OwnerId::random();
    /// locks.acquire_as("jobs/2", me, &AcquireOptions::default(), None).await?.expect("free");
    /// assert!(locks.renew_as("jobs/2", me, Duration::from_secs(60)).await?.is_some());
    /// assert!(locks.renew_as("jobs/2", OwnerId::random(), Duration::from_secs(1)).await?.is_none());
    /// # Ok(()) }
    /// ```
    pub async fn renew_as(
        &self,
        name: &str,
        owner: OwnerId,
        lease: Duration,
    ) -> Result<Option<SystemTime>, LockError> {
        crate::contract::Lease::new(lease)?;
        let key: Arc<str> = Arc::from(&*self.key_for(name)?);
        let outcome = self.storage.as_ref().renew(&key, owner, lease).await?;
        let RenewOutcome::Renewed { expires_at } = outcome else {
            self.shared
                .events
                .emit(LockEventKind::RenewFailed, &key, None);
            return Ok(None);
        };
        self.shared.events.emit(LockEventKind::Renewed, &key, None);
        expires_at
            .to_system_time()
            .map(Some)
            .ok_or(LockError::LeaseOutOfRange { lease })
    }

    /// Releases `owner`'s hold of `name` and says what it released: the hold's fencing token,
    /// `Ok(None)` if it held none (so a retried release is harmless).
    ///
    /// # Errors
    /// [`LockError::InvalidName`], [`LockError::Storage`].
    ///
    /// # Examples
    /// See [`StorageLock::acquire_as`].
    pub async fn release_as(&self, name: &str, owner: OwnerId) -> Result<Option<u64>, LockError> {
        let key: Arc<str> = Arc::from(&*self.key_for(name)?);
        match self.storage.as_ref().release(&key, owner).await? {
            ReleaseOutcome::Released { fencing, .. } => {
                self.shared
                    .events
                    .emit(LockEventKind::Released, &key, Some(fencing));
                Ok(Some(fencing))
            }
            ReleaseOutcome::NotHeld => Ok(None),
        }
    }

    /// Why `owner` does not hold `name` (read after a failed renewal). `None` if it does.
    ///
    /// # Errors
    /// [`LockError::InvalidName`], [`LockError::Storage`].
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), storage_lock_core::LockError> {
    /// use storage_lock_core::{AcquireOptions, HoldGone, MemoryStorage, OwnerId, StorageLock};
    /// let locks = StorageLock::new(MemoryStorage::new())?;
    /// let me = OwnerId::random();
    /// locks.acquire_as("jobs/3", me, &AcquireOptions::default(), None).await?.expect("free");
    /// locks.force_release("jobs/3").await?;
    /// assert_eq!(locks.hold_gone("jobs/3", me).await?, Some(HoldGone::ForceReleased));
    /// # Ok(()) }
    /// ```
    pub async fn hold_gone(
        &self,
        name: &str,
        owner: OwnerId,
    ) -> Result<Option<HoldGone>, LockError> {
        let key = self.key_for(name)?;
        let now = self.storage.as_ref().now().await?;
        let Some(stored) = self.storage.as_ref().get(&key).await? else {
            return Ok(Some(HoldGone::Released));
        };
        let rec = stored.record;
        Ok(Some(if rec.owner == owner {
            if rec.is_held_at(now) {
                return Ok(None);
            }
            if rec.count == 0 {
                HoldGone::Released
            } else {
                HoldGone::Expired
            }
        } else if rec.owner == OwnerId::NOBODY {
            HoldGone::ForceReleased
        } else {
            HoldGone::TakenOver
        }))
    }
}
