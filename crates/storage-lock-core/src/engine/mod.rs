//! The lock engine: [`StorageLock`] runs the lock algorithm over any [`Storage`].
//!
//! Inside (private modules, in the order a call meets them):
//! * `acquire` — the acquire loop: validate, arm a change notification, try, sleep until the
//!   earliest of deadline / holder expiry / notification / jittered backoff; cancel safety;
//!   retries of storage errors while the wait lasts.
//! * `many` — one attempt at several keys, all or nothing, through
//!   [`Storage::acquire_many`] (the step of a multi-lock).
//! * `backend` — the storage side of a [`crate::LockHandle`]: renew and release through the
//!   storage, and the loss watch (the handle's runtime is the [`crate::hold`] layer's).
//! * `renewals` — the watchdogs' renewals, coalesced into [`Storage::renew_many`] calls (on the
//!   hold layer's one task per tokio runtime).
//! * `reentrant` — the explicit-owner reentrant API ([`StorageLock::lock_reentrant`]).
//! * `owned` — holds by explicit owner without a handle, for servers ([`StorageLock::acquire_as`]).
//! * `events` — [`LockEvent`]s (`metrics` are the crate's `telemetry` module).

mod acquire;
mod backend;
mod events;
mod many;
pub(crate) use many::AnyRefused;
mod owned;
mod reentrant;
mod renewals;

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::broadcast;

use crate::contract::{
    AcquireOptions, Busy, KeyNormalizer, LockError, PrefixNormalizer, ProviderInfo, validate_key,
    validate_name,
};
use crate::hold::LockHandle;
use crate::lock::DistributedLock;
use crate::storage::{HolderInfo, Storage, StorageExt, TimeSource};

pub use events::{LockEvent, LockEventKind};
pub use owned::{HoldGone, OwnedHold};
pub use reentrant::ReentrantHold;
pub use renewals::RENEW_BATCH;

/// A [`DistributedLock`] over a [`Storage`]; one instance serves any number of keys.
///
/// Cheap to clone (all clones share the storage and the event channel).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), storage_lock_core::LockError> {
/// use storage_lock_core::{MemoryStorage, PrefixNormalizer, StorageLock};
/// let locks = StorageLock::builder(MemoryStorage::new())
///     .normalizer(PrefixNormalizer::new("billing:"))
///     .build()?;
/// let handle = locks.try_acquire_for("invoice-7", std::time::Duration::ZERO).await?;
/// # use storage_lock_core::DistributedLock;
/// assert_eq!(handle.unwrap().key(), "billing:invoice-7");
/// # Ok(()) }
/// ```
pub struct StorageLock<S: Storage + ?Sized = dyn Storage> {
    storage: Arc<S>,
    shared: Arc<EngineShared>,
    /// Both of the above behind one pointer: what each handle keeps (8 bytes instead of 16).
    holds: Arc<HoldContext<S>>,
}

/// The storage and the engine a handle renews and releases through.
pub(crate) struct HoldContext<S: Storage + ?Sized> {
    pub(crate) storage: Arc<S>,
    pub(crate) engine: Arc<EngineShared>,
}

impl<S: Storage + ?Sized> HoldContext<S> {
    fn new(storage: &Arc<S>, engine: &Arc<EngineShared>) -> Arc<Self> {
        Arc::new(Self {
            storage: storage.clone(),
            engine: engine.clone(),
        })
    }
}

pub(crate) struct EngineShared {
    normalizer: Box<dyn KeyNormalizer>,
    holder: Arc<HolderInfo>,
    provider: ProviderInfo,
    pub(crate) events: events::Events,
    /// The largest fencing token granted ([`crate::Capabilities::fencing_limit`]) and the
    /// storage's bound, for the error.
    pub(crate) fencing_limit: (u64, u64),
    /// Requests by explicit owners in flight, per (key, owner): see `owned::ResumeTicket`.
    pub(crate) resumes: owned::Resumes,
    /// The batcher the watchdogs of this engine's handles renew through.
    pub(crate) renewals: renewals::Renewals,
    /// The watchdogs of this engine's auto-renewed handles, on one timer structure.
    pub(crate) watchdogs: crate::hold::Watchdogs,
}

impl<S: Storage + ?Sized> Clone for StorageLock<S> {
    fn clone(&self) -> Self {
        Self {
            storage: self.storage.clone(),
            shared: self.shared.clone(),
            holds: self.holds.clone(),
        }
    }
}

impl<S: Storage + ?Sized> fmt::Debug for StorageLock<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StorageLock")
            .field("storage", &self.storage)
            .field("normalizer", &self.shared.normalizer)
            .finish_non_exhaustive()
    }
}

impl<S: Storage> StorageLock<S> {
    /// A lock over `storage` with default settings; see [`StorageLockBuilder::build`] for the
    /// capability check.
    pub fn new(storage: S) -> Result<Self, LockError> {
        Self::builder(storage).build()
    }

    /// A builder over `storage`.
    pub fn builder(storage: S) -> StorageLockBuilder<S> {
        StorageLockBuilder::new(Arc::new(storage))
    }
}

/// Erases the storage type: `StorageLock<MyStorage>` → `StorageLock` (`StorageLock<dyn Storage>`),
/// sharing the storage, the settings and the event channel.
impl<S: Storage> From<StorageLock<S>> for StorageLock {
    fn from(locks: StorageLock<S>) -> Self {
        let storage: Arc<dyn Storage> = locks.storage;
        Self {
            holds: HoldContext::new(&storage, &locks.shared),
            storage,
            shared: locks.shared,
        }
    }
}

impl<S: Storage + ?Sized> StorageLock<S> {
    /// A builder over a shared storage.
    pub fn builder_arc(storage: Arc<S>) -> StorageLockBuilder<S> {
        StorageLockBuilder::new(storage)
    }

    /// The storage underneath.
    pub fn storage(&self) -> &Arc<S> {
        &self.storage
    }

    /// Subscribes to this engine's [`LockEvent`]s (delivered without blocking the hot path: a slow listener misses events, it never slows locking).
    pub fn subscribe(&self) -> broadcast::Receiver<LockEvent> {
        self.shared.events.subscribe()
    }

    /// [`DistributedLock::try_acquire`] without the boxed future of the object-safe trait: what
    /// the trait calls, and what a caller holding a concrete `StorageLock` gets by method
    /// resolution. Same semantics, errors and cancel safety.
    pub async fn try_acquire(
        &self,
        name: &str,
        options: &AcquireOptions,
    ) -> Result<Option<LockHandle>, LockError> {
        self.acquire_handle(name, options).await.map(Result::ok)
    }

    /// [`Self::try_acquire`] that says, when the lock stayed busy, who holds it and for how
    /// long at most ([`Busy`], from the storage's last answer: no second read).
    ///
    /// # Errors
    /// As [`DistributedLock::try_acquire`].
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), storage_lock_core::LockError> {
    /// use storage_lock_core::{AcquireOptions, MemoryStorage, StorageLock};
    /// let locks = StorageLock::new(MemoryStorage::new())?;
    /// let held = locks.try_acquire_or_busy("report", &AcquireOptions::default()).await?.unwrap();
    /// let busy = locks.try_acquire_or_busy("report", &AcquireOptions::default()).await?.unwrap_err();
    /// assert!(busy.holder.is_some() && busy.left > std::time::Duration::ZERO);
    /// held.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn try_acquire_or_busy(
        &self,
        name: &str,
        options: &AcquireOptions,
    ) -> Result<Result<LockHandle, Busy>, LockError> {
        self.acquire_handle(name, options).await
    }

    /// [`DistributedLock::try_acquire_for`], inherent like [`Self::try_acquire`].
    pub async fn try_acquire_for(
        &self,
        name: &str,
        wait: std::time::Duration,
    ) -> Result<Option<LockHandle>, LockError> {
        self.acquire_handle(
            name,
            &AcquireOptions::default().wait(crate::contract::Wait::For(wait)),
        )
        .await
        .map(Result::ok)
    }

    /// **Admin operation**: frees the lock `name` whoever holds it (a holder gone for good);
    /// returns the record of the hold it ended, or `None` if nothing was held. The fencing token
    /// is kept, so the next acquisition's token is strictly higher; the evicted holder's handle
    /// turns lost at its next renewal or local deadline. See [`StorageExt::force_release`].
    ///
    /// # Errors
    /// [`LockError::InvalidName`] before any storage call; [`LockError::Storage`] if the
    /// storage fails.
    ///
    /// # Examples
    /// ```
    /// # tokio_test_block_on(async {
    /// use storage_lock_core::{DistributedLock, MemoryStorage, StorageLock};
    /// let locks = StorageLock::new(MemoryStorage::new()).unwrap();
    /// let stuck = locks.try_acquire_for("nightly", std::time::Duration::ZERO).await.unwrap().unwrap();
    /// let ended = locks.force_release("nightly").await.unwrap().expect("it was held");
    /// assert_eq!(ended.fencing, stuck.fencing_token());
    /// let next = locks.try_acquire_for("nightly", std::time::Duration::ZERO).await.unwrap().unwrap();
    /// assert!(next.fencing_token() > stuck.fencing_token());
    /// # });
    /// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
    /// #     tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
    /// # }
    /// ```
    pub async fn force_release(
        &self,
        name: &str,
    ) -> Result<Option<crate::storage::LockRecord>, LockError> {
        self.force_release_matching(name, None).await
    }

    /// [`StorageLock::force_release`] only if the hold's fencing token is `fencing`, so an
    /// operator who looked at one holder never evicts the next one by mistake. `Ok(None)` if the
    /// lock is free or held under another token.
    ///
    /// # Errors
    /// [`LockError::InvalidName`], [`LockError::Storage`].
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), storage_lock_core::LockError> {
    /// use storage_lock_core::{DistributedLock, MemoryStorage, StorageLock};
    /// let locks = StorageLock::new(MemoryStorage::new())?;
    /// let held = locks.try_acquire_for("nightly", std::time::Duration::ZERO).await?.expect("free");
    /// let token = held.fencing_token();
    /// assert!(locks.force_release_if("nightly", token + 1).await?.is_none()); // not that hold
    /// assert!(locks.force_release_if("nightly", token).await?.is_some());
    /// # Ok(()) }
    /// ```
    pub async fn force_release_if(
        &self,
        name: &str,
        fencing: u64,
    ) -> Result<Option<crate::storage::LockRecord>, LockError> {
        self.force_release_matching(name, Some(fencing)).await
    }

    async fn force_release_matching(
        &self,
        name: &str,
        fencing: Option<u64>,
    ) -> Result<Option<crate::storage::LockRecord>, LockError> {
        let key = self.key_for(name)?;
        let storage = self.storage.as_ref();
        let ended = match fencing {
            None => storage.force_release(&key).await?,
            Some(f) => storage.force_release_if(&key, f).await?,
        };
        if let Some(rec) = &ended {
            tracing::warn!(key = %key, fencing = rec.fencing, "lock force-released");
            self.shared.events.emit(
                events::LockEventKind::ForceReleased,
                &key,
                Some(rec.fencing),
            );
        }
        Ok(ended)
    }

    /// Validates `name` and returns the storage key it maps to.
    pub fn key_for<'a>(&self, name: &'a str) -> Result<Cow<'a, str>, LockError> {
        validate_name(name)?;
        let key = self.shared.normalizer.normalize(name);
        if let Cow::Owned(key) = &key {
            validate_key(key)?;
        }
        Ok(key)
    }
}

/// Builds a [`StorageLock`].
#[must_use = "a builder does nothing until `build`"]
pub struct StorageLockBuilder<S: Storage + ?Sized> {
    storage: Arc<S>,
    normalizer: Box<dyn KeyNormalizer>,
    holder: HolderInfo,
    skip_capability_check: bool,
}

impl<S: Storage + ?Sized> StorageLockBuilder<S> {
    fn new(storage: Arc<S>) -> Self {
        Self {
            storage,
            normalizer: Box::new(PrefixNormalizer::default()),
            holder: HolderInfo::this_process(),
            skip_capability_check: false,
        }
    }

    /// The name → key mapping (default: the name itself).
    pub fn normalizer(mut self, normalizer: impl KeyNormalizer) -> Self {
        self.normalizer = Box::new(normalizer);
        self
    }

    /// The holder info stored with each hold (default: this host and pid).
    pub fn holder(mut self, holder: HolderInfo) -> Self {
        self.holder = holder;
        self
    }

    /// Accepts a storage that lacks linearizable CAS or a time source. Exclusion is then **not**
    /// guaranteed; use it only for experiments or a storage you have verified yourself.
    pub fn skip_capability_check(mut self) -> Self {
        self.skip_capability_check = true;
        self
    }

    /// Builds the lock. Fails with [`LockError::Unsafe`] if the storage does not declare
    /// linearizable compare-and-set or has no time source, unless the check was skipped.
    pub fn build(self) -> Result<StorageLock<S>, LockError> {
        let caps = self.storage.capabilities();
        if !self.skip_capability_check {
            let missing = if !caps.linearizable_cas {
                Some("linearizable compare-and-set")
            } else if caps.time_source == TimeSource::None {
                Some("a time source (a server clock or an injected Clock)")
            } else {
                None
            };
            if let Some(missing) = missing {
                return Err(LockError::Unsafe {
                    storage: self.storage.name().to_owned(),
                    missing,
                });
            }
        }
        let provider = ProviderInfo {
            name: self.storage.name().to_owned(),
            process_local: caps.process_local,
        };
        let shared = Arc::new(EngineShared {
            normalizer: self.normalizer,
            holder: Arc::new(self.holder),
            provider,
            events: events::Events::new(),
            fencing_limit: (caps.fencing_limit(), caps.fencing_bound),
            resumes: owned::Resumes::default(),
            renewals: renewals::Renewals::default(),
            watchdogs: crate::hold::Watchdogs::default(),
        });
        Ok(StorageLock {
            holds: HoldContext::new(&self.storage, &shared),
            storage: self.storage,
            shared,
        })
    }
}

#[async_trait]
impl<S: Storage + ?Sized> DistributedLock for StorageLock<S> {
    fn provider(&self) -> ProviderInfo {
        self.shared.provider.clone()
    }

    async fn try_acquire(
        &self,
        name: &str,
        options: &AcquireOptions,
    ) -> Result<Option<LockHandle>, LockError> {
        self.acquire_handle(name, options).await.map(Result::ok)
    }

    async fn try_acquire_many(
        &self,
        names: &[&str],
        options: &AcquireOptions,
    ) -> Result<Result<Vec<LockHandle>, usize>, LockError> {
        self.acquire_many_handles(names, options).await
    }
}

#[cfg(all(test, target_pointer_width = "64"))]
mod size {
    /// A held lock's handle is one allocation of this (its key inline when short), 16 bytes
    /// of reference counts and the allocator's 8: 128 bytes in glibc's size classes at most.
    /// `benches/holds.rs` measures the whole cost per hold (≤ 300 bytes at a million holds).
    /// Guards against fields creeping back in.
    #[test]
    fn a_handle_stays_small() {
        let handle = std::mem::size_of::<
            crate::hold::HoldRuntime<super::backend::EngineHold<crate::memory::MemoryStorage>>,
        >();
        // 104 + 16 + 8 = 128 bytes; one byte more and glibc's next size class is 144.
        assert!(handle <= 104, "HoldRuntime<EngineHold> is {handle} bytes");
        let record = std::mem::size_of::<crate::storage::LockRecord>();
        assert!(record <= 56, "LockRecord is {record} bytes");
    }
}
