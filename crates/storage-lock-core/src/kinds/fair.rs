//! [`FairLock`]: an exclusive lock whose waiters are served in arrival order.

use std::fmt;

use futures_util::future::join_all;

use crate::contract::{AcquireOptions, LockError, Wait};
use crate::engine::StorageLock;
use crate::hold::LockHandle;
use crate::storage::{LockRecord, Storage, Stored};

/// How many waiters a [`FairLock`] queues in arrival order unless
/// [`FairLock::with_max_waiters`] says otherwise. Every waiter reads every place of the queue
/// when it looks for the waiter ahead of it, so the number is a trade between how long a queue
/// keeps its order and what a wait costs.
pub const DEFAULT_MAX_WAITERS: u32 = 16;

/// The most places a [`FairLock`]'s queue may have.
pub const MAX_WAITERS: u32 = 256;

/// The lock name of the ticket dispenser of the fair lock `name`: `NAME/tickets`.
///
/// # Examples
/// ```
/// assert_eq!(storage_lock_core::kinds::tickets_name("deploy"), "deploy/tickets");
/// ```
pub fn tickets_name(name: &str) -> String {
    format!("{name}/tickets")
}

/// The lock name of place `place` of the waiter queue of the fair lock `name`:
/// `NAME/waiting/PLACE`.
///
/// # Examples
/// ```
/// assert_eq!(storage_lock_core::kinds::place_name("deploy", 3), "deploy/waiting/3");
/// ```
pub fn place_name(name: &str, place: u32) -> String {
    format!("{name}/waiting/{place}")
}

/// The holder note of a queue place held by the waiter with `ticket`.
fn ticket_note(ticket: u64) -> String {
    format!("fair-ticket {ticket}")
}

/// The ticket of a queue place's holder, if it holds it as a waiter (not as a brief probe, and
/// not a record some other program wrote).
fn ticket_of(stored: &Stored) -> Option<u64> {
    waiter_ticket(&stored.record)
}

/// The ticket of the waiter whose queue place (see [`place_name`]) has this record: `None` for
/// a free place, a brief probe's hold, or a record some other program wrote. Whether the hold
/// is still in force is the caller's to judge ([`LockRecord::is_held_at`]).
///
/// # Examples
/// ```
/// use storage_lock_core::kinds::waiter_ticket;
/// use storage_lock_core::{HolderInfo, LockRecord, OwnerId, Timestamp};
/// let mut record = LockRecord {
///     owner: OwnerId::random(),
///     count: 1,
///     fencing: 7,
///     acquired_at: Timestamp::from_millis(0),
///     expires_at: Timestamp::from_millis(1_000),
///     holder: None,
/// };
/// assert_eq!(waiter_ticket(&record), None);
/// let mut holder = HolderInfo::this_process();
/// holder.note = Some("fair-ticket 12".into());
/// record.holder = Some(std::sync::Arc::new(holder));
/// assert_eq!(waiter_ticket(&record), Some(12));
/// ```
pub fn waiter_ticket(record: &LockRecord) -> Option<u64> {
    if record.count == 0 {
        return None;
    }
    let note = record.holder.as_ref()?.note.as_deref()?;
    note.strip_prefix("fair-ticket ")?.parse().ok()
}

/// An exclusive lock whose waiters get it in the order they arrived (FIFO), each waiter's place
/// kept by a hold with its own lease, so a waiter that dies loses its place when its lease ends.
/// The granted hold is an ordinary [`LockHandle`] of `NAME`: its fencing token, lease,
/// auto-renewal and lost signal are the exclusive lock's. Cheap to clone.
///
/// # How it works, and why it is fair
/// It is made of exclusive holds, like every [kind](super):
/// * the **lock** is the exclusive lock `NAME` itself.
/// * the **ticket dispenser** is the exclusive lock [`tickets_name`]`(NAME)`: a waiter holds it
///   for a moment, and its fencing token, which the storage raises at every grant, is the
///   waiter's **ticket**.
/// * the **queue** is `max_waiters` places, the exclusive locks [`place_name`]`(NAME, I)`.
///   Holding the dispenser, the waiter with ticket `T` takes place `T % max_waiters` with its
///   ticket in the hold's note, then lets the dispenser go. It keeps its place until it holds
///   `NAME` or gives up, renewed in the background (at `options.auto_renew`, or a third of the
///   lease when that is unset).
/// * A waiter reads every place, and waits (by taking it and giving it back at once) for the
///   place of the nearest waiter ahead, the highest ticket below its own. When no place holds a
///   lower ticket, it waits for `NAME` itself, then gives its place up.
///
/// Why arrival order: tickets rise in the order waiters took the dispenser, and a waiter holds
/// its place before the next waiter can get a ticket, so every waiter ahead of it is in the
/// queue when it first looks. A waiter waits for `NAME` only once no waiter ahead of it is
/// queued, and it keeps its place while it waits, so the waiters behind it wait for it and not
/// for `NAME`: at most one fair waiter waits for `NAME` at a time. An acquisition first looks
/// at the queue (the places and the dispenser) and takes `NAME` at once only when nobody waits
/// or is taking a ticket; a try ([`Wait::Never`]) with waiters queued finds the lock busy.
///
/// A waiter that dies (or is cut off from the storage) holds its place until its lease ends;
/// then the waiter behind it takes the place over for a moment, finds nobody else ahead and
/// moves on. A waiter whose wait budget runs out, or whose acquisition is dropped, gives its
/// place up at once.
///
/// # Fencing
/// The granted hold is `NAME`'s, so its token is strictly greater than every earlier holder's.
///
/// # Limits
/// * The order holds among the users of `FairLock`: a plain acquisition of `NAME` (through
///   [`StorageLock`]) does not queue and may overtake.
/// * When more than `max_waiters` wait, a newcomer waits for a place to come free and takes a
///   new ticket then, so it may be overtaken by waiters that arrived while it waited for the
///   place.
/// * A waiter stalled for a whole lease between its ticket and its place (its process stopped)
///   may find itself behind a later ticket: the order is kept for waiters that run.
///
/// # Cost
/// With nobody queued: one read of each place (in parallel) and one acquisition of `NAME`. A
/// waiter also takes the dispenser and its place (three round trips), reads every place each
/// time the waiter ahead of it moves, and gives its place up when it is served.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), storage_lock_core::LockError> {
/// use storage_lock_core::kinds::FairLock;
/// use storage_lock_core::{AcquireOptions, MemoryStorage, StorageLock, Wait};
/// let locks = StorageLock::new(MemoryStorage::new())?;
/// let deploy = FairLock::new(&locks, "deploy")?;
/// let now = AcquireOptions::default().wait(Wait::Never);
/// let first = deploy.acquire(&now).await?.expect("free");
/// assert!(deploy.acquire(&now).await?.is_none()); // held
/// first.release().await?;
/// let second = deploy.acquire(&now).await?.expect("free again");
/// assert!(second.fencing_token() > first.fencing_token());
/// # Ok(()) }
/// ```
pub struct FairLock<S: Storage + ?Sized = dyn Storage> {
    locks: StorageLock<S>,
    name: String,
    tickets: String,
    places: Vec<String>,
    /// The storage keys of `tickets` and of `places`, in order: read on every look at the queue.
    tickets_key: String,
    place_keys: Vec<String>,
}

impl<S: Storage + ?Sized> Clone for FairLock<S> {
    fn clone(&self) -> Self {
        Self {
            locks: self.locks.clone(),
            name: self.name.clone(),
            tickets: self.tickets.clone(),
            places: self.places.clone(),
            tickets_key: self.tickets_key.clone(),
            place_keys: self.place_keys.clone(),
        }
    }
}

impl<S: Storage + ?Sized> fmt::Debug for FairLock<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FairLock")
            .field("name", &self.name)
            .field("max_waiters", &self.places.len())
            .finish_non_exhaustive()
    }
}

impl<S: Storage + ?Sized> FairLock<S> {
    /// A fair lock named `name` queueing [`DEFAULT_MAX_WAITERS`] waiters in order. Touches no
    /// storage.
    ///
    /// # Errors
    /// [`LockError::InvalidName`] if `name`, its dispenser's or one of its places' names is not
    /// a valid lock name.
    pub fn new(locks: &StorageLock<S>, name: &str) -> Result<Self, LockError> {
        Self::with_max_waiters(locks, name, DEFAULT_MAX_WAITERS)
    }

    /// A fair lock whose queue has `max_waiters` places. Every party of a name should use the
    /// same number (parties with different numbers look at different places, so they may
    /// overtake each other; exclusion is never at stake: it is `NAME`'s).
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] for 0 or more than [`MAX_WAITERS`] places; otherwise as
    /// [`Self::new`].
    pub fn with_max_waiters(
        locks: &StorageLock<S>,
        name: &str,
        max_waiters: u32,
    ) -> Result<Self, LockError> {
        if max_waiters == 0 || max_waiters > MAX_WAITERS {
            return Err(LockError::invalid_option(
                "max_waiters",
                format!("must be 1..={MAX_WAITERS}, got {max_waiters}"),
            ));
        }
        locks.key_for(name)?;
        let tickets = tickets_name(name);
        let tickets_key = locks.key_for(&tickets)?.into_owned();
        let places: Vec<String> = (0..max_waiters).map(|i| place_name(name, i)).collect();
        let place_keys = places
            .iter()
            .map(|p| locks.key_for(p).map(std::borrow::Cow::into_owned))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            locks: locks.clone(),
            name: name.to_owned(),
            tickets,
            places,
            tickets_key,
            place_keys,
        })
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many waiters the queue keeps in order.
    pub fn max_waiters(&self) -> u32 {
        u32::try_from(self.places.len()).unwrap_or(MAX_WAITERS)
    }

    /// Takes the lock, waiting in arrival order as `options.wait` says; the hold gets
    /// `options`' lease, auto-renewal and note (so does the waiter's place in the queue, but
    /// for the note). `Ok(None)`: the wait budget ran out (for [`Wait::Never`]: the lock is
    /// held or waiters are queued), and nothing is held.
    ///
    /// # Errors
    /// * [`LockError::InvalidOptions`] before any storage call;
    /// * as [`crate::DistributedLock::try_acquire`] otherwise; nothing is left held.
    ///
    /// # Cancel safety
    /// As [`crate::DistributedLock::try_acquire`]: a hold (of the lock or of a place in its
    /// queue) granted after the drop is released in the background.
    pub async fn acquire(&self, options: &AcquireOptions) -> Result<Option<LockHandle>, LockError> {
        options.validate()?;
        if self.queue_is_empty().await? {
            let now = options.clone().wait(Wait::Never);
            if let Some(held) = self.locks.try_acquire(&self.name, &now).await? {
                return Ok(Some(held));
            }
        }
        let budget = super::Budget::new(options.wait);
        let Some((ticket, place)) = self.join(&budget, options).await? else {
            return Ok(None);
        };
        let served = self.wait_turn(ticket, &budget, options).await;
        // Served or not, the place goes back: the waiters behind move up. A failed release
        // leaves the place to lapse with its lease.
        let _ = place.release().await;
        served
    }

    /// Takes a ticket and the queue place it names: `None` when the budget ran out first.
    async fn join(
        &self,
        budget: &super::Budget,
        options: &AcquireOptions,
    ) -> Result<Option<(u64, LockHandle)>, LockError> {
        loop {
            let Some(wait) = budget.remaining() else {
                return Ok(None);
            };
            let Some(dispenser) = self
                .locks
                .try_acquire(&self.tickets, &super::brief(options, wait))
                .await?
            else {
                return Ok(None);
            };
            let ticket = dispenser.fencing_token();
            let place = &self.places[self.index(ticket)];
            let mut keep = super::kept_while_waiting(options).wait(Wait::Never);
            keep.note = Some(ticket_note(ticket));
            let taken = self.locks.try_acquire(place, &keep).await;
            let _ = dispenser.release().await;
            if let Some(held) = taken? {
                return Ok(Some((ticket, held)));
            }
            // The place is still a waiter's from a full round of tickets ago (more waiters
            // than places): wait for it, then take a new ticket.
            let Some(wait) = budget.remaining() else {
                return Ok(None);
            };
            if !super::wait_until_free(&self.locks, place, options, wait).await? {
                return Ok(None);
            }
        }
    }

    /// Holding the place of `ticket`: waits until no waiter ahead is queued, then for the lock.
    async fn wait_turn(
        &self,
        ticket: u64,
        budget: &super::Budget,
        options: &AcquireOptions,
    ) -> Result<Option<LockHandle>, LockError> {
        loop {
            let Some(wait) = budget.remaining() else {
                return Ok(None);
            };
            match self.queued_below(ticket).await? {
                // The waiter ahead: wait until its place is given up (or lapses), then look
                // again.
                Some((_, place)) => {
                    if !super::wait_until_free(&self.locks, place, options, wait).await? {
                        return Ok(None);
                    }
                }
                None => {
                    return self
                        .locks
                        .try_acquire(&self.name, &options.clone().wait(wait))
                        .await;
                }
            }
        }
    }

    /// Whether nobody waits: no place is held by a waiter, and nobody is taking a ticket (a
    /// waiter between its ticket and its place arrived before us).
    async fn queue_is_empty(&self) -> Result<bool, LockError> {
        let (joining, queued) = futures_util::future::join(
            self.locks.storage().get(&self.tickets_key),
            self.queued_below(u64::MAX),
        )
        .await;
        Ok(queued?.is_none() && joining?.is_none_or(|d| d.record.count == 0))
    }

    /// The queued waiter with the highest ticket below `below`, and its place's name.
    async fn queued_below(&self, below: u64) -> Result<Option<(u64, &str)>, LockError> {
        let storage = self.locks.storage();
        let seen = join_all(self.place_keys.iter().map(|k| storage.get(k))).await;
        let mut ahead: Option<(u64, &str)> = None;
        for (place, seen) in self.places.iter().zip(seen) {
            let Some(ticket) = seen?.as_ref().and_then(ticket_of) else {
                continue;
            };
            if ticket < below && ahead.is_none_or(|(t, _)| ticket > t) {
                ahead = Some((ticket, place));
            }
        }
        Ok(ahead)
    }

    fn index(&self, ticket: u64) -> usize {
        // The remainder is below the number of places, which is a `usize`.
        usize::try_from(ticket % self.places.len() as u64).unwrap_or(0)
    }
}
