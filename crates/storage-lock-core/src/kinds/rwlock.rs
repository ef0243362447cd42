//! [`RwLock`]: many readers or one writer, writer-preferring, fenced.

use std::fmt;
use std::future::Future;

use futures_util::future::join_all;

use crate::contract::{AcquireOptions, LockError, Wait};
use crate::engine::StorageLock;
use crate::hold::LockHandle;
use crate::storage::{Storage, gate_token};

use super::fair::FairLock;
use super::semaphore::{Permit, Refused, Semaphore, slot_name};

/// How many readers an [`RwLock`] admits at once unless [`RwLock::with_max_readers`] says
/// otherwise. A writer looks at every reader slot, so the number is a trade between how many
/// readers may read together and what a write costs (see the [type's docs](RwLock)).
pub const DEFAULT_MAX_READERS: u32 = 16;

/// The name of the semaphore whose permits are the reader slots of the reader-writer lock
/// `name`: `NAME/readers` (its slots are `NAME/readers/permit/I`).
///
/// # Examples
/// ```
/// assert_eq!(storage_lock_core::kinds::readers_name("catalog"), "catalog/readers");
/// ```
pub fn readers_name(name: &str) -> String {
    format!("{name}/readers")
}

/// The name of the [`FairLock`] that orders the entries of the reader-writer lock `name` when
/// it is [FIFO](RwLock::fifo): `NAME/order`.
///
/// # Examples
/// ```
/// assert_eq!(storage_lock_core::kinds::order_name("catalog"), "catalog/order");
/// ```
pub fn order_name(name: &str) -> String {
    format!("{name}/order")
}

/// A reader-writer lock: many readers or one writer of `name`, **writer-preferring** (a writer
/// that waits keeps new readers out), every hold with its own lease on the storage's clock,
/// auto-renewal and lost signal. Cheap to clone.
///
/// # How it works, and why it excludes
/// It is made of exclusive holds, like every [kind](super):
/// * the **gate** is the exclusive lock `NAME` itself. A writer holds it for its whole write;
///   that is its intent, which keeps new readers out and lapses with the gate's lease if the
///   writer dies.
/// * the **reader slots** are the permits of the semaphore [`readers_name`]`(NAME)`, of
///   `max_readers` permits (its limit record makes every party agree on the number). A reader
///   holds one for its whole read.
/// * A **reader** takes a slot, then reads the gate: free, and the read begins; held, and it
///   gives the slot back, waits for the gate by taking it, takes a slot while it holds the
///   gate (without waiting) and lets the gate go. A storage that can do it takes the slot only
///   if the gate is free, in one request ([`crate::Storage::acquire_any`] with a gate: memory,
///   Redis, SQLite), reading the gate at the instant it takes the slot; the argument below is
///   the same.
/// * A **writer** takes the gate, then reads the readers' limit record: none, and no reader
///   ever came in (a reader writes it before it takes a slot), so the write begins. Otherwise
///   it waits until it has seen every reader slot free (one read of each slot, in parallel; a
///   slot that may be held is waited for by taking it and giving it back at once).
///
/// No reader reads while a writer writes: a reader's read of the gate and a writer's taking of
/// it are ordered by the storage (its compare-and-set is linearizable). If the reader read
/// first, its limit record was written and its slot taken before the writer looked at either,
/// so the writer waits for it; if the writer took the gate first, the reader sees it held and
/// steps aside before reading. Two writers exclude each other on the gate.
///
/// # Fencing
/// A writer's token is its gate hold's token. A reader's token is the gate's token when it
/// passed it: the last writer's (or, after stepping aside, its own brief hold's; for a gate
/// without a record, never held or swept, the fencing floor, which is at least any token the
/// gate ever had and below the next writer's). So every
/// writer's token is strictly greater than every token of a reader before it, and readers of
/// one read phase share the token of the writer before them (or the floor, which a sweep may
/// raise between two of them): a resource that keeps the highest
/// token it saw rejects a deposed writer, and may accept reads carrying a token at least that
/// high.
///
/// # Cost
/// A read is one [`crate::Storage::acquire_any`] call with the gate (one round trip on memory
/// and Redis, one transaction on SQLite; elsewhere the slot, in one round trip on PostgreSQL
/// or one request per slot looked at, then a read of the gate) and a release one; more when a
/// writer holds or waits, or every slot is taken (the first read of a name in a process also
/// reads, or writes, the readers' limit). A write is
/// one acquisition and one read of the readers' limit; once readers have used the name, also
/// one read of each of the `max_readers` slots (in parallel) and two more round trips for each
/// slot a reader holds. So a name no reader uses costs what the exclusive lock costs, plus one
/// read, and the exclusive lock `NAME` excludes readers only when taken through [`RwLock::write`].
///
/// # FIFO
/// [`RwLock::fifo`] serves readers and writers in arrival order: each one first takes the
/// [`FairLock`] [`order_name`]`(NAME)` (waiting its turn there), enters as above, and lets the
/// order lock go once it is in. A reader that is in does not keep the next one out, so readers
/// that arrive together still read together; a writer at the front keeps everyone behind it
/// out until it writes. It costs a fair lock's acquisition and release per entry.
///
/// # Limits
/// * Needs a storage that keeps the reader slots' limit record
///   ([`crate::StorageExt::semaphore_limit`]): one with compare-and-set primitives, or a lock
///   server's client (the server keeps it).
/// * Without [`RwLock::fifo`], writers are served before new readers, but neither writers nor
///   readers are served in arrival order among themselves.
/// * A try ([`Wait::Never`]) may find the lock busy while another reader passes the gate.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), storage_lock_core::LockError> {
/// use storage_lock_core::kinds::RwLock;
/// use storage_lock_core::{AcquireOptions, MemoryStorage, StorageLock, Wait};
/// let locks = StorageLock::new(MemoryStorage::new())?;
/// let catalog = RwLock::new(&locks, "catalog")?;
/// let now = AcquireOptions::default().wait(Wait::Never);
/// let r1 = catalog.read(&now).await?.expect("free");
/// let r2 = catalog.read(&now).await?.expect("readers share");
/// assert!(catalog.write(&now).await?.is_none()); // readers are in
/// r1.release().await?;
/// r2.release().await?;
/// let w = catalog.write(&now).await?.expect("free again");
/// assert!(w.fencing_token() > r1.fencing_token());
/// # Ok(()) }
/// ```
pub struct RwLock<S: Storage + ?Sized = dyn Storage> {
    locks: StorageLock<S>,
    name: String,
    readers: Semaphore<S>,
    /// The order lock, when entries are served in arrival order.
    order: Option<FairLock<S>>,
}

impl<S: Storage + ?Sized> Clone for RwLock<S> {
    fn clone(&self) -> Self {
        Self {
            locks: self.locks.clone(),
            name: self.name.clone(),
            readers: self.readers.clone(),
            order: self.order.clone(),
        }
    }
}

impl<S: Storage + ?Sized> fmt::Debug for RwLock<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RwLock")
            .field("name", &self.name)
            .field("max_readers", &self.readers.permits())
            .field("fifo", &self.order.is_some())
            .finish_non_exhaustive()
    }
}

impl<S: Storage + ?Sized> RwLock<S> {
    /// A reader-writer lock named `name` admitting [`DEFAULT_MAX_READERS`] readers at once.
    /// Touches no storage.
    ///
    /// # Errors
    /// [`LockError::InvalidName`] if `name` or one of its reader slots' names is not a valid
    /// lock name.
    pub fn new(locks: &StorageLock<S>, name: &str) -> Result<Self, LockError> {
        Self::with_max_readers(locks, name, DEFAULT_MAX_READERS)
    }

    /// A reader-writer lock admitting `max_readers` readers at once (every party of a name must
    /// use the same number: another one is refused with
    /// [`LockError::SemaphoreLimitMismatch`]).
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] for 0 or more than [`super::MAX_PERMITS`] readers;
    /// otherwise as [`Self::new`].
    pub fn with_max_readers(
        locks: &StorageLock<S>,
        name: &str,
        max_readers: u32,
    ) -> Result<Self, LockError> {
        locks.key_for(name)?;
        let readers = Semaphore::new(locks, &readers_name(name), max_readers)?;
        Ok(Self {
            locks: locks.clone(),
            name: name.to_owned(),
            readers,
            order: None,
        })
    }

    /// Serves readers and writers in arrival order (see [FIFO](RwLock#fifo)) instead of
    /// preferring writers. Every party of a name should choose the same: a party without it
    /// does not queue, and may overtake.
    ///
    /// # Errors
    /// [`LockError::InvalidName`] if the order lock's names ([`order_name`]) are not valid.
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), storage_lock_core::LockError> {
    /// use storage_lock_core::kinds::RwLock;
    /// use storage_lock_core::{AcquireOptions, MemoryStorage, StorageLock};
    /// let locks = StorageLock::new(MemoryStorage::new())?;
    /// let catalog = RwLock::new(&locks, "catalog")?.fifo()?;
    /// let read = catalog.read(&AcquireOptions::default()).await?.expect("free");
    /// read.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn fifo(mut self) -> Result<Self, LockError> {
        self.order = Some(FairLock::new(&self.locks, &order_name(&self.name))?);
        Ok(self)
    }

    /// Whether entries are served in arrival order ([`Self::fifo`]).
    pub fn is_fifo(&self) -> bool {
        self.order.is_some()
    }

    /// Refuses, before any storage call, a storage that cannot keep the readers' limit record.
    fn check_storage(&self) -> Result<(), LockError> {
        super::keeps_limits(
            &**self.locks.storage(),
            "reader-writer lock (its readers keep their limit with compare-and-set)",
        )?;
        Ok(())
    }

    /// With [`Self::fifo`]: waits for this entry's turn and returns the order lock's hold
    /// (renewed; give it back once in) with the options for the entry, its wait what is left of
    /// the budget. Without: no hold, the same options. `Ok(None)`: the budget ran out in the
    /// queue.
    async fn turn(
        &self,
        options: &AcquireOptions,
    ) -> Result<Option<(Option<LockHandle>, AcquireOptions)>, LockError> {
        let Some(order) = &self.order else {
            return Ok(Some((None, options.clone())));
        };
        let budget = super::Budget::new(options.wait);
        let Some(turn) = order.acquire(&super::kept_while_waiting(options)).await? else {
            return Ok(None);
        };
        // A wait that ran out in the queue still gets one try at the front.
        let wait = budget.remaining().unwrap_or(Wait::Never);
        Ok(Some((Some(turn), options.clone().wait(wait))))
    }

    /// The lock's name (its gate's lock name).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many readers may read at once.
    pub fn max_readers(&self) -> u32 {
        self.readers.permits()
    }

    /// Takes a read hold, waiting as `options.wait` says (while a writer holds or waits, and
    /// while every reader slot is taken); the hold gets `options`' lease, auto-renewal and
    /// note. `Ok(None)`: the wait budget ran out.
    ///
    /// # Errors
    /// * [`LockError::InvalidOptions`] before any storage call;
    /// * [`LockError::SemaphoreLimitMismatch`]: the name's readers were set up with another
    ///   `max_readers`;
    /// * [`LockError::Storage`] with [`crate::StorageError::Unsupported`] on a storage that
    ///   cannot keep the readers' limit record (neither primitives nor a delegate);
    /// * as [`crate::DistributedLock::try_acquire`] otherwise; nothing is left held.
    ///
    /// # Cancel safety
    /// As [`crate::DistributedLock::try_acquire`]: a hold granted after the drop is released
    /// in the background.
    pub async fn read(&self, options: &AcquireOptions) -> Result<Option<ReadGuard>, LockError> {
        options.validate()?;
        self.check_storage()?;
        let Some((turn, options)) = self.turn(options).await? else {
            return Ok(None);
        };
        let read = self.read_now(&options).await;
        give_back(turn).await;
        read
    }

    /// [`Self::read`] without the order lock.
    async fn read_now(&self, options: &AcquireOptions) -> Result<Option<ReadGuard>, LockError> {
        let budget = super::Budget::new(options.wait);
        let gate_key = self.locks.key_for(&self.name)?.into_owned();
        let once = options.clone().wait(Wait::Never);
        let mut wait = options.wait;
        loop {
            // A slot while the gate is free, in one request where the storage can do it (it
            // reads the gate at one instant with its taking of the slot, or after it).
            match self.readers.try_pass(&self.name, &once).await? {
                Ok((permit, token)) => return Ok(Some(ReadGuard { permit, token })),
                Err(Refused::GateHeld) => {}
                Err(Refused::Busy(_)) => {
                    // Every slot is taken: wait for one, then read the gate.
                    let Some(permit) = self.readers.acquire(&options.clone().wait(wait)).await?
                    else {
                        return Ok(None);
                    };
                    // The gate, read after the slot is ours: free (released or never taken),
                    // and no writer can be past its look at the slots.
                    let gate = match self.locks.storage().get(&gate_key).await {
                        Ok(gate) => gate,
                        Err(e) => {
                            let _ = permit.release().await;
                            return Err(e.into());
                        }
                    };
                    let storage = &**self.locks.storage();
                    match gate_token(storage, gate.as_ref().map(|g| &g.record)).await {
                        Ok(Some(token)) => return Ok(Some(ReadGuard { permit, token })),
                        // Held. A failed release leaves the slot to lapse at its lease's end.
                        Ok(None) => drop(permit.release().await),
                        Err(e) => {
                            let _ = permit.release().await;
                            return Err(e.into());
                        }
                    }
                }
            }
            // A writer holds or waits (or a reader steps through): wait for the gate by
            // taking it, and take a slot while it is ours.
            let gate_wait = budget.remaining().unwrap_or(Wait::Never);
            let gate_options = super::brief(options, gate_wait);
            let Some(gate) = self.locks.try_acquire(&self.name, &gate_options).await? else {
                return Ok(None);
            };
            let permit = self.readers.acquire(&once).await;
            let token = gate.fencing_token();
            let _ = gate.release().await;
            if let Some(permit) = permit? {
                return Ok(Some(ReadGuard { permit, token }));
            }
            // Every slot is taken by readers: wait for one, and pass the gate again.
            match budget.remaining() {
                Some(w) => wait = w,
                None => return Ok(None),
            }
        }
    }

    /// Takes the write hold, waiting as `options.wait` says (for the gate, then for the
    /// readers that came in before it); the hold gets `options`' lease, auto-renewal and note.
    /// `Ok(None)`: the wait budget ran out, and nothing is held.
    ///
    /// # Errors
    /// As [`Self::read`].
    ///
    /// # Cancel safety
    /// As [`Self::read`].
    pub async fn write(&self, options: &AcquireOptions) -> Result<Option<WriteGuard>, LockError> {
        options.validate()?;
        self.check_storage()?;
        let Some((turn, options)) = self.turn(options).await? else {
            return Ok(None);
        };
        let write = self.write_now(&options).await;
        give_back(turn).await;
        write
    }

    /// [`Self::write`] without the order lock.
    async fn write_now(&self, options: &AcquireOptions) -> Result<Option<WriteGuard>, LockError> {
        let budget = super::Budget::new(options.wait);
        let Some(gate) = self.locks.try_acquire(&self.name, options).await? else {
            return Ok(None);
        };
        match self.drain_readers(&budget, options).await {
            Ok(true) => Ok(Some(WriteGuard { gate })),
            Ok(false) => {
                let _ = gate.release().await;
                Ok(None)
            }
            Err(e) => {
                let _ = gate.release().await;
                Err(e)
            }
        }
    }

    /// With the gate held: whether every reader slot was seen free within the budget.
    async fn drain_readers(
        &self,
        budget: &super::Budget,
        options: &AcquireOptions,
    ) -> Result<bool, LockError> {
        // No limit record: no reader ever came in (one writes it before it takes a slot), and
        // none can pass the gate now. Another reader limit: refused.
        if !self.readers.limit_is_set().await? {
            return Ok(true);
        }
        let storage = self.locks.storage();
        let slots: Vec<String> = (0..self.readers.permits())
            .map(|i| slot_name(self.readers.name(), i))
            .collect();
        let keys = slots
            .iter()
            .map(|s| self.locks.key_for(s).map(std::borrow::Cow::into_owned))
            .collect::<Result<Vec<_>, _>>()?;
        let seen = join_all(keys.iter().map(|k| storage.get(k))).await;
        for (slot, seen) in slots.iter().zip(seen) {
            // Released and never-taken slots are free; a slot with a holder (live, or expired
            // and judged so by the storage when we take it) is waited for.
            if seen?.is_none_or(|s| s.record.count == 0) {
                continue;
            }
            let wait = budget.remaining().unwrap_or(Wait::Never);
            if !super::wait_until_free(&self.locks, slot, options, wait).await? {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// Gives the order lock's hold back once an entry is done (a failed release leaves it to lapse
/// with its lease).
async fn give_back(turn: Option<LockHandle>) {
    if let Some(turn) = turn {
        let _ = turn.release().await;
    }
}

/// A read hold of an [`RwLock`]: one of its reader slots. Dropping it releases in the
/// background.
#[must_use = "dropping a ReadGuard releases it in the background; keep it while you read"]
pub struct ReadGuard {
    permit: Permit,
    token: u64,
}

impl ReadGuard {
    /// The read's fencing token: the gate's token when the reader passed it (see
    /// [`RwLock`]'s fencing), at least the token of every writer before it.
    pub fn fencing_token(&self) -> u64 {
        self.token
    }

    /// The reader slot held.
    pub fn slot(&self) -> u32 {
        self.permit.slot()
    }

    /// The slot's hold: lease, expiry, renewal.
    pub fn handle(&self) -> &LockHandle {
        self.permit.handle()
    }

    /// Whether the read hold is lost (see [`LockHandle::is_lost`]).
    pub fn is_lost(&self) -> bool {
        self.permit.is_lost()
    }

    /// Completes when the read hold is lost: stop reading.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.permit.lost()
    }

    /// Releases the read hold.
    ///
    /// # Errors
    /// As [`LockHandle::release`].
    pub async fn release(&self) -> Result<(), LockError> {
        self.permit.release().await
    }
}

impl fmt::Debug for ReadGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadGuard")
            .field("token", &self.token)
            .field("permit", &self.permit)
            .finish()
    }
}

/// The write hold of an [`RwLock`]: its gate. Dropping it releases in the background.
#[must_use = "dropping a WriteGuard releases it in the background; keep it while you write"]
#[derive(Debug)]
pub struct WriteGuard {
    gate: LockHandle,
}

impl WriteGuard {
    /// The write's fencing token, strictly greater than every earlier reader's and writer's.
    pub fn fencing_token(&self) -> u64 {
        self.gate.fencing_token()
    }

    /// The gate's hold: lease, expiry, renewal.
    pub fn handle(&self) -> &LockHandle {
        &self.gate
    }

    /// Whether the write hold is lost (see [`LockHandle::is_lost`]).
    pub fn is_lost(&self) -> bool {
        self.gate.is_lost()
    }

    /// Completes when the write hold is lost: stop writing.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.gate.lost()
    }

    /// Releases the write hold.
    ///
    /// # Errors
    /// As [`LockHandle::release`].
    pub async fn release(&self) -> Result<(), LockError> {
        self.gate.release().await
    }
}
