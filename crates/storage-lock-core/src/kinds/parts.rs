//! [`parts`]: what the lock kinds keep beside a name, for people (`storage-lock inspect`, the
//! lock server's `GET /v1/locks/{name}/parts` and its web page).

use futures_util::future::try_join5;

use crate::contract::LockError;
use crate::engine::StorageLock;
use crate::storage::{PageRequest, Storage, StorageError, StorageExt, Stored, Timestamp};

use super::{place_name, readers_name, slot_name, waiter_ticket};

/// The numbered slots of a semaphore (or an RW lock's readers): its limit and the slots held.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Slots {
    /// The stored number of slots (permits, or reader slots).
    pub limit: u64,
    /// The slots held at the time of the read, in slot order, with their records.
    pub held: Vec<(u32, Stored)>,
}

/// A waiter in a fair lock's queue.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Waiter {
    /// Its queue place (see [`place_name`]).
    pub place: u32,
    /// Its ticket: waiters are served in ticket order.
    pub ticket: u64,
    /// The place's record (its holder is the waiter).
    pub stored: Stored,
}

/// What the lock kinds keep beside the lock `name` itself, as the storage shows it at one time:
/// see [`parts`]. A name can be several kinds at once only by misuse; each part is read on its
/// own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Parts {
    /// The storage's time of the read: what "held" was judged by.
    pub now: Timestamp,
    /// A [`super::Semaphore`] of this name: its permits.
    pub semaphore: Option<Slots>,
    /// A [`super::RwLock`] of this name: its reader slots (its writer holds `name` itself).
    pub readers: Option<Slots>,
    /// A [`super::FairLock`] of this name: the waiters queued, in ticket order.
    pub queue: Vec<Waiter>,
}

impl Parts {
    /// Whether no kind keeps anything beside the name.
    pub fn is_empty(&self) -> bool {
        self.semaphore.is_none() && self.readers.is_none() && self.queue.is_empty()
    }
}

/// Reads what the lock kinds keep beside `name`: a semaphore's limit and held permits, an RW
/// lock's reader limit and held reader slots, a fair lock's queued waiters. Read-only: two
/// limit reads and three listings (by prefix), in parallel. A storage that cannot keep limits
/// shows no semaphore or RW parts; records that do not decode are left out.
///
/// # Errors
/// [`LockError::InvalidName`] for a bad name; storage errors.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), storage_lock_core::LockError> {
/// use storage_lock_core::kinds::{Semaphore, parts};
/// use storage_lock_core::{AcquireOptions, MemoryStorage, StorageLock, Wait};
/// let locks = StorageLock::new(MemoryStorage::new())?;
/// let permit = Semaphore::new(&locks, "pool", 3)?
///     .acquire(&AcquireOptions::default().wait(Wait::Never))
///     .await?
///     .expect("free");
/// let seen = parts(&locks, "pool").await?;
/// let semaphore = seen.semaphore.expect("a semaphore");
/// assert_eq!((semaphore.limit, semaphore.held.len()), (3, 1));
/// permit.release().await?;
/// # Ok(()) }
/// ```
pub async fn parts<S: Storage + ?Sized>(
    locks: &StorageLock<S>,
    name: &str,
) -> Result<Parts, LockError> {
    let storage = locks.storage();
    let readers = readers_name(name);
    let (name_key, readers_key) = (locks.key_for(name)?, locks.key_for(&readers)?);
    // The numbered names end in their number: their prefix is the name of number 0 without it.
    let prefix = |first: String| -> Result<String, LockError> {
        let key = locks.key_for(&first)?.into_owned();
        Ok(key.strip_suffix('0').unwrap_or(&key).to_owned())
    };
    let (permits, reader_slots, places) = (
        prefix(slot_name(name, 0))?,
        prefix(slot_name(&readers, 0))?,
        prefix(place_name(name, 0))?,
    );
    let now = storage.now().await?;
    let (limit, readers_limit, held_permits, held_readers, waiting) = try_join5(
        limit_of(&**storage, &name_key),
        limit_of(&**storage, &readers_key),
        numbered(&**storage, &permits, now),
        numbered(&**storage, &reader_slots, now),
        numbered(&**storage, &places, now),
    )
    .await?;
    let mut queue: Vec<Waiter> = waiting
        .into_iter()
        .filter_map(|(place, stored)| {
            Some(Waiter {
                place,
                ticket: waiter_ticket(&stored.record)?,
                stored,
            })
        })
        .collect();
    queue.sort_by_key(|w| w.ticket);
    Ok(Parts {
        now,
        semaphore: limit.map(|limit| Slots {
            limit,
            held: held_permits,
        }),
        readers: readers_limit.map(|limit| Slots {
            limit,
            held: held_readers,
        }),
        queue,
    })
}

/// A semaphore's stored limit; none on a storage that cannot keep one.
async fn limit_of<S: Storage + ?Sized>(
    storage: &S,
    key: &str,
) -> Result<Option<u64>, StorageError> {
    match storage.semaphore_limit(key, None).await {
        Err(StorageError::Unsupported { .. }) => Ok(None),
        other => other,
    }
}

/// The locks held at `now` named `prefix` + a number, in number order.
async fn numbered<S: Storage + ?Sized>(
    storage: &S,
    prefix: &str,
    now: Timestamp,
) -> Result<Vec<(u32, Stored)>, StorageError> {
    let mut held = Vec::new();
    let mut page = PageRequest::default();
    loop {
        let listed = storage.list_locks(prefix, &page).await?;
        held.extend(listed.entries.into_iter().filter_map(|(key, stored)| {
            let number = key.strip_prefix(prefix)?.parse().ok()?;
            stored.record.is_held_at(now).then_some((number, stored))
        }));
        match listed.next {
            Some(next) => page.after = Some(next),
            None => break,
        }
    }
    held.sort_by_key(|(number, _)| *number);
    Ok(held)
}
