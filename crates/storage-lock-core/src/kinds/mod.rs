//! Lock kinds built on the exclusive lock: several names held as one ([`acquire_all`]),
//! counting semaphores ([`Semaphore`]), reader-writer locks ([`RwLock`]), fair (first-come,
//! first-served) locks ([`FairLock`]) and leader election ([`Election`]).
//!
//! # Which one do I need?
//!
//! | you want… | use | fencing |
//! |---|---|---|
//! | one writer per resource | [`crate::DistributedLock::try_acquire`] | one token |
//! | one writer per resource, waiters served in arrival order (a deploy queue nobody may jump) | [`FairLock`] → [`crate::LockHandle`] | one token |
//! | one holder of *several* resources at once (move money between two accounts) | [`acquire_all`] → [`MultiHandle`] | a token per name |
//! | many readers or one writer (a catalogue read by many jobs, rebuilt by one) | [`RwLock`] → [`ReadGuard`] / [`WriteGuard`] | writers' tokens rise past every reader's |
//! | at most N holders (N connections to a licence server, N workers on a GPU pool) | [`Semaphore`] → [`Permit`] / [`Permits`] | a token per permit slot |
//! | one leader among replicas, and everyone else knowing who it is | [`Election`] → [`Leadership`], [`Observer`] | the term |
//!
//! # Why they keep the exclusive lock's guarantees
//! Every kind is made of ordinary exclusive holds, taken through the engine: every part has its
//! lease on the storage's clock, its local deadline, fail-closed renewal (auto-renew included),
//! release on drop and its own fencing token. Nothing new is written to the storage except a
//! semaphore's limit record, so every backend (and its one-round-trip overrides, batched
//! renewals, listings, force-release and sweeps) serves them unchanged. A lock server's client,
//! which has no primitives, has its server keep the limit record
//! ([`crate::StorageExt::semaphore_limit`]), so every kind also works through a lock server.
//!
//! * **No deadlock, whatever order callers pass the names in.** [`acquire_all`] sorts the names
//!   and never waits while it holds anything: it tries every name without waiting; on the first
//!   busy one it releases what it took and waits for that one alone, then tries the rest again
//!   without waiting. A waiter holds at most the one lock it waited for while it tries the others,
//!   and a try never blocks, so no cycle of waiters can form (Redisson's `RedissonMultiLock`
//!   took names in the caller's order and deadlocked).
//! * **No permit leaks when a holder crashes.** A semaphore of N permits is N exclusive locks,
//!   its *slots* (`NAME/permit/0` … `NAME/permit/{N-1}`); a permit is a hold of one slot, so a
//!   crashed holder's permit comes back when its lease ends, judged by the storage like any
//!   lock's (Redisson's `RSemaphore` and Curator's semaphores counted permits in one value that a
//!   crashed holder never gave back). At most N permits are out because at most one holder holds
//!   each slot: the bound is the exclusive lock's guarantee, N times.
//! * **One N per name.** The first semaphore of a name writes its limit into a record of its
//!   own (under an internal key, so listings and sweeps skip it); a semaphore of the same name
//!   with another N gets [`crate::LockError::SemaphoreLimitMismatch`] instead of quietly
//!   allowing more holders. To change N, stop every holder and delete the record
//!   ([`limit_key`]).
//! * **Readers never read while a writer writes, and writers are not starved.** An RW lock's
//!   gate is an exclusive lock that a writer holds, and its reader slots are a semaphore's
//!   permits: a reader passes the gate only after its slot is taken, a writer looks at the slots
//!   only after the gate is taken, and the storage orders the two (see [`RwLock`] for the
//!   proof). A waiting writer holds the gate, so readers that arrive after it wait; if it dies,
//!   the gate lapses with its lease.
//! * **Waiters of a fair lock are served in arrival order, and a dead one costs its lease.**
//!   A waiter takes a ticket (the fencing token of a dispenser lock it holds for a moment) and
//!   holds a place in the queue with it; it waits for the waiter just ahead of it, and for the
//!   lock only when none is ahead (see [`FairLock`]). A dead waiter's place lapses with its
//!   lease (the old queues waited a fixed time per dead waiter).
//! * **k permits at once are all or nothing**: one attempt takes k free slots or none.
//! * **One leader per term.** An election's seat is one exclusive lock; the leader's value
//!   rides in its holder note and its term is its fencing token, so terms rise and a deposed
//!   leader's writes are fenced off. Observers read the seat and report it in term order,
//!   vacancies included (etcd's `Observe` never reports a vacant seat).
//!
//! # Cost
//! A multi-lock's attempt at k names is one [`crate::Storage::acquire_many`] call: one round
//! trip on a storage that overrides it (memory, Redis, PostgreSQL; one transaction on SQLite
//! and MySQL), one write after reading
//! the names it does not know on one whose primitives write several keys at once
//! ([`crate::Primitives::write_all`]: etcd, ZooKeeper, DynamoDB), k acquisitions on the
//! others. A semaphore's attempt is one [`crate::Storage::acquire_any`] call over its slots
//! from a random one on: one round trip on a storage that overrides it (memory, Redis,
//! PostgreSQL) however many permits are out, one request per slot looked at on the others
//! (several permits at once: one transaction on SQLite and MySQL).
//! When every slot is out it waits for releases on at most [`WATCHED_SLOTS`] slots at once
//! (the ones the storage said end soonest) and looks at all slots again at least every
//! [`RESCAN`]. An RW lock's read is the same call with the gate: one round trip on memory and
//! Redis, one transaction on SQLite; elsewhere the slot as above, then a read of the gate.

use tokio::time::Instant;

use crate::contract::{AcquireOptions, LockError, Wait};
use crate::engine::StorageLock;
use crate::storage::Storage;

mod election;
mod fair;
mod multi;
mod parts;
mod rwlock;
mod semaphore;

pub use election::{
    Election, Leadership, MAX_VALUE_LEN, OBSERVE_POLL, Observed, Observer, validate_value,
};
pub use fair::{
    DEFAULT_MAX_WAITERS, FairLock, MAX_WAITERS, place_name, tickets_name, waiter_ticket,
};
pub use multi::{MultiHandle, acquire_all};
pub use parts::{Parts, Slots, Waiter, parts};
pub use rwlock::{DEFAULT_MAX_READERS, ReadGuard, RwLock, WriteGuard, order_name, readers_name};
pub use semaphore::{
    MAX_PERMITS, Permit, Permits, RESCAN, Semaphore, WATCHED_SLOTS, limit_key, slot_name,
};

/// Whether `storage` can keep a semaphore's limit record ([`crate::StorageExt::semaphore_limit`]):
/// on its compare-and-set primitives, or through its delegate (a lock server's client, whose
/// server keeps it); [`crate::StorageError::Unsupported`], for `operation`, otherwise.
fn keeps_limits<S: crate::storage::Storage + ?Sized>(
    storage: &S,
    operation: &'static str,
) -> Result<(), crate::StorageError> {
    if storage.primitives().is_some() || storage.delegated_admin().is_some() {
        return Ok(());
    }
    Err(crate::StorageError::Unsupported {
        backend: storage.name().to_owned(),
        operation,
    })
}

/// `options` for a hold given back at once (a fair lock's dispenser, a reader passing an RW
/// lock's gate, a probe): no renewal, no loss watch, no note.
fn brief(options: &AcquireOptions, wait: Wait) -> AcquireOptions {
    let mut brief = options.clone().wait(wait);
    brief.auto_renew = None;
    brief.watch_loss = Some(false);
    brief.note = None;
    brief
}

/// `options` for a hold kept while its owner waits for something else (a fair lock's queue
/// place, an RW lock's FIFO turn): no note, no loss watch, and renewed, at `auto_renew` or else
/// a third of the lease, so a waiter that runs keeps it however long it waits and a dead one
/// loses it when its lease ends.
fn kept_while_waiting(options: &AcquireOptions) -> AcquireOptions {
    let mut keep = options.clone();
    keep.note = None;
    keep.watch_loss = Some(false);
    if keep.auto_renew.is_none() && !(keep.lease / 3).is_zero() {
        keep.auto_renew = Some(keep.lease / 3);
    }
    keep
}

/// Waits, within `wait`, until `name` is free — given up, or lapsed with its lease — by taking
/// it and giving it back at once: `false` when the wait ran out first. A failed release leaves
/// the brief hold to lapse with its lease.
///
/// # Errors
/// As [`StorageLock::try_acquire`].
async fn wait_until_free<S: Storage + ?Sized>(
    locks: &StorageLock<S>,
    name: &str,
    options: &AcquireOptions,
    wait: Wait,
) -> Result<bool, LockError> {
    match locks.try_acquire(name, &brief(options, wait)).await? {
        Some(probe) => {
            let _ = probe.release().await;
            Ok(true)
        }
        None => Ok(false),
    }
}

/// What is left of an acquisition's wait budget across the passes of a kind's loop (each pass
/// tries without waiting, then waits with what is left).
struct Budget {
    wait: Wait,
    deadline: Option<Instant>,
}

impl Budget {
    fn new(wait: Wait) -> Self {
        let deadline = match wait {
            Wait::For(d) => Instant::now().checked_add(d),
            Wait::Never | Wait::Forever => None,
        };
        Self { wait, deadline }
    }

    /// The wait for the next pass: `None` when the budget is spent (or was [`Wait::Never`]).
    fn remaining(&self) -> Option<Wait> {
        match (self.wait, self.deadline) {
            (Wait::Never, _) => None,
            (Wait::For(_), Some(deadline)) => {
                let left = deadline.saturating_duration_since(Instant::now());
                (!left.is_zero()).then_some(Wait::For(left))
            }
            // A wait too long to add to the clock, or none at all: until it is free.
            (Wait::For(_) | Wait::Forever, _) => Some(Wait::Forever),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_budget_says_what_is_left() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            assert_eq!(Budget::new(Wait::Never).remaining(), None);
            assert_eq!(Budget::new(Wait::For(Duration::ZERO)).remaining(), None);
            assert_eq!(Budget::new(Wait::Forever).remaining(), Some(Wait::Forever));
            assert_eq!(
                Budget::new(Wait::For(Duration::MAX)).remaining(),
                Some(Wait::Forever)
            );
            let hour = Duration::from_secs(3600);
            match Budget::new(Wait::For(hour)).remaining() {
                Some(Wait::For(left)) => assert!(left <= hour && left > hour / 2),
                other => panic!("{other:?}"),
            }
        });
    }
}
