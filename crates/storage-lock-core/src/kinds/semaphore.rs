//! [`Semaphore`]: at most N holders of a name, each permit an exclusive hold of one slot.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;

use crate::contract::{AcquireOptions, LockError, Wait};
use crate::engine::{AnyRefused, StorageLock};
use crate::hold::LockHandle;
use crate::storage::ops::RESERVED_KEY_PREFIX;
use crate::storage::{Storage, StorageExt};

/// The most permits a semaphore may have.
pub const MAX_PERMITS: u32 = 1024;

/// How many busy slots an acquisition waits on at once (the ones the storage said end soonest).
pub const WATCHED_SLOTS: usize = 8;

/// How often a waiting acquisition looks at every slot again when it cannot watch them all
/// (more than [`WATCHED_SLOTS`] permits): a release on an unwatched slot is seen within this.
pub const RESCAN: Duration = Duration::from_secs(1);

/// The lock name of permit slot `slot` of semaphore `name`: `NAME/permit/SLOT`.
///
/// # Examples
/// ```
/// assert_eq!(storage_lock_core::kinds::slot_name("pool", 2), "pool/permit/2");
/// ```
pub fn slot_name(name: &str, slot: u32) -> String {
    format!("{name}/permit/{slot}")
}

/// The internal storage key of the limit record of the semaphore whose name has the storage
/// key `key` (listings and sweeps skip it). Delete it, with every holder stopped, to change a
/// semaphore's number of permits.
///
/// # Examples
/// ```
/// let key = storage_lock_core::kinds::limit_key("pool");
/// assert!(storage_lock_core::storage::ops::is_reserved_key(&key));
/// ```
pub fn limit_key(key: &str) -> String {
    format!("{RESERVED_KEY_PREFIX}storage-lock:semaphore:{key}")
}

/// A counting semaphore: at most `permits` holders of `name` at a time, each with its own lease,
/// fencing token and lost signal (see the [module docs](super) for why it keeps the exclusive
/// lock's guarantees). Cheap to clone.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), storage_lock_core::LockError> {
/// use storage_lock_core::kinds::Semaphore;
/// use storage_lock_core::{AcquireOptions, MemoryStorage, StorageLock};
/// let locks = StorageLock::new(MemoryStorage::new())?;
/// let gpus = Semaphore::new(&locks, "gpu", 2)?;
/// let a = gpus.acquire(&AcquireOptions::default()).await?.expect("2 free");
/// let b = gpus.acquire(&AcquireOptions::default()).await?.expect("1 free");
/// assert_ne!(a.slot(), b.slot());
/// assert!(gpus.acquire(&AcquireOptions::default()).await?.is_none()); // both out
/// a.release().await?;
/// assert!(gpus.acquire(&AcquireOptions::default()).await?.is_some());
/// # Ok(()) }
/// ```
pub struct Semaphore<S: Storage + ?Sized = dyn Storage> {
    locks: StorageLock<S>,
    inner: Arc<Inner>,
}

struct Inner {
    name: String,
    permits: u32,
    /// The limit record was found to agree (checked once per semaphore value and its clones).
    checked: AtomicBool,
}

impl<S: Storage + ?Sized> Clone for Semaphore<S> {
    fn clone(&self) -> Self {
        Self {
            locks: self.locks.clone(),
            inner: self.inner.clone(),
        }
    }
}

impl<S: Storage + ?Sized> fmt::Debug for Semaphore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.inner.name)
            .field("permits", &self.inner.permits)
            .finish_non_exhaustive()
    }
}

impl<S: Storage + ?Sized> Semaphore<S> {
    /// A semaphore of `permits` permits named `name`, over `locks`' storage and settings.
    /// Touches no storage: the limit is checked by the first acquisition.
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] for 0 or more than [`MAX_PERMITS`] permits;
    /// [`LockError::InvalidName`] if `name` or one of its slot names ([`slot_name`]) is not a
    /// valid lock name.
    pub fn new(locks: &StorageLock<S>, name: &str, permits: u32) -> Result<Self, LockError> {
        if permits == 0 || permits > MAX_PERMITS {
            return Err(LockError::invalid_option(
                "permits",
                format!("must be 1..={MAX_PERMITS}, got {permits}"),
            ));
        }
        locks.key_for(name)?;
        locks.key_for(&slot_name(name, permits - 1))?;
        Ok(Self {
            locks: locks.clone(),
            inner: Arc::new(Inner {
                name: name.to_owned(),
                permits,
                checked: AtomicBool::new(false),
            }),
        })
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The number of permits.
    pub fn permits(&self) -> u32 {
        self.inner.permits
    }

    /// Takes one permit, waiting as `options.wait` says; the permit gets `options`' lease,
    /// auto-renewal and note. `Ok(None)`: every permit stayed out until the wait budget ran out.
    ///
    /// # Errors
    /// * [`LockError::InvalidOptions`] before any storage call;
    /// * [`LockError::SemaphoreLimitMismatch`]: the name's stored limit is another number;
    /// * [`LockError::Storage`] with [`crate::StorageError::Unsupported`] on a storage that
    ///   cannot keep the limit record ([`StorageExt::semaphore_limit`]: neither primitives nor a
    ///   delegate);
    /// * as [`crate::DistributedLock::try_acquire`] otherwise.
    ///
    /// # Cancel safety
    /// As [`crate::DistributedLock::try_acquire`]: a permit granted after the drop is released
    /// in the background.
    pub async fn acquire(&self, options: &AcquireOptions) -> Result<Option<Permit>, LockError> {
        Ok(self
            .acquire_many(1, options)
            .await?
            .map(|mut p| p.parts.remove(0)))
    }

    /// Takes `k` permits at once, all or nothing (never waiting while it holds any, so two
    /// callers taking several permits cannot starve each other into a deadlock); otherwise as
    /// [`Self::acquire`].
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] for `k` = 0 or `k` > the permits; otherwise as
    /// [`Self::acquire`].
    pub async fn acquire_many(
        &self,
        k: u32,
        options: &AcquireOptions,
    ) -> Result<Option<Permits>, LockError> {
        if k == 0 || k > self.inner.permits {
            return Err(LockError::invalid_option(
                "permits",
                format!(
                    "taking {k} of a semaphore of {} permits",
                    self.inner.permits
                ),
            ));
        }
        options.validate()?;
        self.check_limit().await?;
        let budget = super::Budget::new(options.wait);
        let once = options.clone().wait(Wait::Never);
        let mut waited_for: Option<Permit> = None;
        loop {
            let busy = match self.try_take(k, &once, waited_for.take()).await? {
                Ok(parts) => return Ok(Some(Permits { parts })),
                Err(busy) => busy,
            };
            // Nothing is held here: wait for the slots that end soonest.
            let left = match budget.remaining() {
                None => return Ok(None),
                Some(Wait::For(left)) => Some(left),
                Some(_) => None,
            };
            waited_for = self.wait_for_one(busy, left, options).await?;
        }
    }

    /// Creates the limit record if absent, else checks it (once per semaphore).
    pub(super) async fn check_limit(&self) -> Result<(), LockError> {
        if self.inner.checked.load(Ordering::Acquire) {
            return Ok(());
        }
        let storage = self.locks.storage();
        super::keeps_limits(
            &**storage,
            "semaphore (keeps its limit with compare-and-set)",
        )?;
        let key = self.locks.key_for(&self.inner.name)?;
        let permits = u64::from(self.inner.permits);
        let stored = storage.semaphore_limit(&key, Some(permits)).await?;
        self.agrees(stored.unwrap_or(permits))?;
        self.inner.checked.store(true, Ordering::Release);
        Ok(())
    }

    /// Reads the limit record without writing one: `Ok(false)` when there is none yet (no
    /// permit of the name was ever taken: [`Self::acquire`] writes it first), `Ok(true)` when
    /// it agrees with this semaphore's limit.
    ///
    /// # Errors
    /// [`LockError::SemaphoreLimitMismatch`]; storage errors.
    pub(super) async fn limit_is_set(&self) -> Result<bool, LockError> {
        let key = self.locks.key_for(&self.inner.name)?;
        match self.locks.storage().semaphore_limit(&key, None).await? {
            None => Ok(false),
            Some(stored) => self.agrees(stored).map(|()| true),
        }
    }

    /// Whether a stored limit agrees with this semaphore's.
    fn agrees(&self, stored: u64) -> Result<(), LockError> {
        if stored == u64::from(self.inner.permits) {
            return Ok(());
        }
        Err(LockError::SemaphoreLimitMismatch {
            name: self.inner.name.clone(),
            permits: self.inner.permits,
            stored,
        })
    }

    /// One attempt at every slot, from a random one, without waiting, keeping `held`: `k`
    /// permits (`Ok`), or everything released and the busy slots with the time each has left
    /// (`Err`). One [`Storage::acquire_any`] call: one round trip on a storage that overrides
    /// it, however many slots are out.
    async fn try_take(
        &self,
        k: u32,
        once: &AcquireOptions,
        held: Option<Permit>,
    ) -> Result<Result<Vec<Permit>, Vec<(u32, Duration)>>, LockError> {
        Ok(match self.take(k, once, held, None).await? {
            Ok((parts, _)) => Ok(parts),
            Err(Refused::Busy(busy)) => Err(busy),
            // No gate was asked about.
            Err(Refused::GateHeld) => Err(Vec::new()),
        })
    }

    /// One permit, without waiting, only while the lock `gate` has no holder, with the gate's
    /// fencing token (the fencing floor when it has no record): a reader-writer lock's read in
    /// one request on a storage
    /// that overrides [`Storage::acquire_any`]. Checks the limit record first, as
    /// [`Self::acquire`] does.
    ///
    /// # Errors
    /// As [`Self::acquire`].
    pub(super) async fn try_pass(
        &self,
        gate: &str,
        once: &AcquireOptions,
    ) -> Result<Result<(Permit, u64), Refused>, LockError> {
        self.check_limit().await?;
        Ok(self
            .take(1, once, None, Some(gate))
            .await?
            .map(|(mut parts, token)| (parts.remove(0), token)))
    }

    /// [`Self::try_take`] with a gate.
    async fn take(
        &self,
        k: u32,
        once: &AcquireOptions,
        held: Option<Permit>,
        gate: Option<&str>,
    ) -> Result<Result<(Vec<Permit>, u64), Refused>, LockError> {
        let n = self.inner.permits;
        let start = rand::random_range(0..n);
        let mut parts: Vec<Permit> = held.into_iter().collect();
        let slots: Vec<u32> = (0..n)
            .map(|i| (start + i) % n)
            .filter(|slot| parts.iter().all(|p| p.slot != *slot))
            .collect();
        let need = (k as usize).saturating_sub(parts.len());
        let mut token = 0;
        if need > 0 {
            let names: Vec<String> = slots
                .iter()
                .map(|&slot| slot_name(&self.inner.name, slot))
                .collect();
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            let attempt = self
                .locks
                .acquire_any_handles(&names, need, gate, once)
                .await;
            let refused = match attempt {
                Ok(Ok((taken, gate_token))) => {
                    token = gate_token;
                    parts.extend(taken.into_iter().map(|(i, handle)| Permit {
                        slot: slots[i],
                        handle,
                    }));
                    None
                }
                Ok(Err(AnyRefused::Busy(busy))) => {
                    let mut busy: Vec<(u32, Duration)> =
                        busy.into_iter().map(|(i, left)| (slots[i], left)).collect();
                    busy.sort_by_key(|&(_, left)| left);
                    Some(Ok(Refused::Busy(busy)))
                }
                Ok(Err(AnyRefused::GateHeld)) => Some(Ok(Refused::GateHeld)),
                Err(e) => Some(Err(e)),
            };
            if let Some(refused) = refused {
                // A failed release leaves the permit to lapse at its lease's end.
                let _ = release_all(&parts).await;
                return refused.map(Err);
            }
        }
        parts.sort_by_key(|p| p.slot);
        Ok(Ok((parts, token)))
    }

    /// Waits on the busy slots that end soonest (at most [`WATCHED_SLOTS`]; for at most
    /// [`RESCAN`] when some slots go unwatched) and returns the first permit one of them
    /// grants, or `None` when none did in time.
    async fn wait_for_one(
        &self,
        busy: Vec<(u32, Duration)>,
        left: Option<Duration>,
        options: &AcquireOptions,
    ) -> Result<Option<Permit>, LockError> {
        // Every slot busy and watched: a release anywhere wakes a watcher, so wait the whole
        // budget; otherwise look at every slot again within RESCAN.
        let all_watched = busy.len() == self.inner.permits as usize && busy.len() <= WATCHED_SLOTS;
        let slice = if all_watched {
            left
        } else {
            Some(left.map_or(RESCAN, |l| l.min(RESCAN)))
        };
        let wait = slice.map_or(Wait::Forever, Wait::For);
        let opts = options.clone().wait(wait);
        let mut waits: FuturesUnordered<_> = busy
            .into_iter()
            .take(WATCHED_SLOTS)
            .map(|(slot, _)| {
                let name = slot_name(&self.inner.name, slot);
                let opts = &opts;
                async move {
                    let got = self.locks.try_acquire(&name, opts).await;
                    (slot, got)
                }
            })
            .collect();
        if waits.is_empty() {
            // Every slot was free or errored out of the pass: look again at once.
            return Ok(None);
        }
        let mut error = None;
        while let Some((slot, got)) = waits.next().await {
            match got {
                // The other waits are dropped: a grant that lands meanwhile is released in
                // the background (the engine's cancel safety).
                Ok(Some(handle)) => return Ok(Some(Permit { slot, handle })),
                Ok(None) => {}
                Err(e) => error = Some(e),
            }
        }
        match error {
            Some(e) => Err(e),
            None => Ok(None),
        }
    }
}

/// Why [`Semaphore::try_pass`] took nothing.
#[derive(Debug)]
pub(super) enum Refused {
    /// Too few slots were free: the busy ones, with the time each hold has left, soonest first.
    Busy(Vec<(u32, Duration)>),
    /// The gate has a holder.
    GateHeld,
}

/// One permit of a [`Semaphore`]: an exclusive hold of one of its slots. Dropping it releases
/// the permit in the background.
#[must_use = "dropping a Permit gives it back in the background; keep it while you work"]
pub struct Permit {
    slot: u32,
    handle: LockHandle,
}

impl Permit {
    /// The slot this permit holds (`0..permits`).
    pub fn slot(&self) -> u32 {
        self.slot
    }

    /// `(slot, fencing token)`: tokens rise per slot, so a resource that fences permit holders
    /// keeps the highest token it saw *per slot*.
    pub fn fencing_token(&self) -> (u32, u64) {
        (self.slot, self.handle.fencing_token())
    }

    /// The slot's hold: lease, expiry, renewal, the lost signal.
    pub fn handle(&self) -> &LockHandle {
        &self.handle
    }

    /// Whether the permit is lost (see [`LockHandle::is_lost`]).
    pub fn is_lost(&self) -> bool {
        self.handle.is_lost()
    }

    /// Completes when the permit is lost (see [`LockHandle::lost`]).
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.handle.lost()
    }

    /// Gives the permit back.
    ///
    /// # Errors
    /// As [`LockHandle::release`].
    pub async fn release(&self) -> Result<(), LockError> {
        self.handle.release().await
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("slot", &self.slot)
            .field("handle", &self.handle)
            .finish()
    }
}

/// Several permits taken at once by [`Semaphore::acquire_many`], sorted by slot.
#[must_use = "dropping Permits gives them back in the background; keep them while you work"]
#[derive(Debug)]
pub struct Permits {
    parts: Vec<Permit>,
}

impl Permits {
    /// The permits, sorted by slot.
    pub fn parts(&self) -> &[Permit] {
        &self.parts
    }

    /// Whether any permit is lost.
    pub fn is_lost(&self) -> bool {
        self.parts.iter().any(Permit::is_lost)
    }

    /// Completes as soon as any permit is lost.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let parts: Vec<_> = self.parts.iter().map(|p| Box::pin(p.lost())).collect();
        async move {
            futures_util::future::select_all(parts).await;
        }
    }

    /// Gives every permit back (all of them, even when one fails).
    ///
    /// # Errors
    /// The first error, as [`LockHandle::release`].
    pub async fn release(&self) -> Result<(), LockError> {
        release_all(&self.parts).await
    }
}

async fn release_all(parts: &[Permit]) -> Result<(), LockError> {
    let results = futures_util::future::join_all(parts.iter().map(Permit::release)).await;
    results.into_iter().collect()
}
