//! The storage layer: the object-safe [`Storage`] trait (reads, the clock and the lock
//! operations the engine calls) and [`Primitives`] (the compare-and-set writes the provided lock
//! operations are built on), split by role: a storage that has no raw compare-and-set to offer
//! (a lock server's client) implements only [`Storage`], overriding the lock operations.
//!
//! A backend over a store implements the reads ([`Storage::get`], [`Storage::list`],
//! [`Storage::now`], [`Storage::capabilities`], [`Storage::name`]), the writes
//! ([`Primitives::create`], [`Primitives::update`], optionally [`Primitives::delete`]) and
//! `fn primitives(&self) -> Option<&dyn Primitives> { Some(self) }`, and gets correct lock
//! operations for free. A
//! backend that can do better overrides [`Storage::acquire_once`], [`Storage::renew`] and
//! [`Storage::release`] to take one round trip each (one SQL statement on the database clock, one
//! Redis script using `TIME`, …), [`Storage::renew_many`] to renew the watchdog's batches in one
//! round trip, [`Storage::acquire_many`] to take a multi-lock's keys at once,
//! [`Storage::acquire_any`] to take a semaphore's free slots at once, and
//! [`Storage::wait_for_change`] to deliver notifications. The
//! suites in `storage-lock-testkit` run against both the defaults and the overrides.
//!
//! Every decision the defaults make is one of the pure rules in [`ops`]:
//! [`ops::decide_acquire`], [`ops::decide_renew`], [`ops::decide_release`].

mod capabilities;
mod change;
mod defaults;
pub(crate) use defaults::gate_token;
pub mod encoding;
mod error;
pub mod observed;
pub mod ops;
mod record;
pub mod url;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

pub use capabilities::{Capabilities, Durability, FENCING_HEADROOM, TimeSource};
pub use change::{ChangeWait, NotificationSource, Notifications, SourceEvent, Waiters, key_bucket};
pub use error::{StorageError, redact_url};
pub use ops::{
    AcquireAnyOutcome, AcquireManyOutcome, AcquireOutcome, AcquireRequest, ReleaseOutcome,
    RenewOutcome, RenewRequest, SweepReport,
};
pub use record::{
    HolderInfo, LockRecord, OwnerId, Page, PageRequest, ParseOwnerIdError, Stored, Timestamp,
    Version,
};

/// A linearizable store of [`LockRecord`]s keyed by string.
///
/// # Contract of the primitives
/// * `create` inserts iff the key is absent, else [`StorageError::AlreadyExists`].
/// * `update` and `delete` succeed iff the stored version equals `expected`, else
///   [`StorageError::Conflict`] (also when the record is gone). Every successful write yields a
///   new version never equal to an earlier one of the same key.
/// * Concurrent conditional writes of one key: exactly one wins ([`Capabilities::linearizable_cas`]).
/// * Any error other than the typed conflicts means the outcome is unknown.
#[async_trait]
pub trait Storage: fmt::Debug + Send + Sync + 'static {
    /// A short name for logs and errors, e.g. `"sqlite"`.
    fn name(&self) -> &str;

    /// What this storage promises.
    fn capabilities(&self) -> Capabilities;

    /// The storage clock. Expiry is judged by this clock only.
    async fn now(&self) -> Result<Timestamp, StorageError>;

    /// The record under `key`, with its version.
    async fn get(&self, key: &str) -> Result<Option<Stored>, StorageError>;

    /// Records whose key starts with `prefix`, in ascending key order, including internal keys
    /// (see [`ops::is_reserved_key`]); use [`StorageExt::list_locks`] to skip those.
    async fn list(&self, prefix: &str, page: &PageRequest) -> Result<Page, StorageError>;

    /// One attempt to take `key` for `req.owner`: takes it if it is free, else reports who
    /// holds it — never waits (waiting is the engine's job; see [`ops::decide_acquire`]).
    /// Named apart from [`crate::DistributedLock::try_acquire`], which validates, normalizes
    /// and waits, and returns a handle.
    async fn acquire_once(
        &self,
        key: &str,
        req: &AcquireRequest,
    ) -> Result<AcquireOutcome, StorageError> {
        defaults::try_acquire(primitives_of(self, "acquire_once")?, key, req).await
    }

    /// One attempt to take every key in `keys` for `req.owner`, all or nothing, never waiting:
    /// [`AcquireManyOutcome::Acquired`] with one grant per key, or
    /// [`AcquireManyOutcome::Busy`] naming the first key found held, with none of the keys held
    /// by the owner. Each key is decided by the rule of [`Storage::acquire_once`]
    /// ([`ops::decide_acquire`]). The keys are distinct, in the order the caller takes them
    /// (a multi-lock sorts them).
    ///
    /// The default, on a storage whose primitives write several keys at once
    /// ([`Primitives::write_all`]), decides every key on what it knows or reads and writes
    /// them all in one [`Primitives::write_all`]: one request when the records are known. On
    /// the others it takes the keys one by one with [`Storage::acquire_once`] ([`acquire_each`])
    /// and, at the first busy key, releases the ones it took: one round trip per key, and for a
    /// moment others may find a key held that the call then gives back. A backend whose lock
    /// operations are its own overrides it to decide and write every key at once, in one
    /// round trip (one script, one statement); then nobody sees part of the keys taken (except
    /// where an override falls back to the default: for a reentrant request on PostgreSQL,
    /// or after repeated refused writes).
    ///
    /// # Errors
    /// As [`Storage::acquire_once`]: the outcome of every key is unknown (the default gives
    /// back the keys it took before the failure, as far as it can; one it cannot give back
    /// lapses at the end of its lease).
    async fn acquire_many(
        &self,
        keys: &[&str],
        req: &AcquireRequest,
    ) -> Result<AcquireManyOutcome, StorageError> {
        match self.primitives() {
            Some(p) if p.writes_all_at_once() => defaults::acquire_many_at_once(p, keys, req).await,
            _ => acquire_each(self, keys, req).await,
        }
    }

    /// One attempt to take `need` of the keys in `keys` for `req.owner`, any of them, all
    /// `need` or nothing, never waiting: [`AcquireAnyOutcome::Acquired`] with the positions
    /// taken (the first free ones in the order given) and their grants, or
    /// [`AcquireAnyOutcome::Busy`] with every key found held and none held by the owner. Each
    /// key is decided by the rule of [`Storage::acquire_once`]. The keys are distinct; `need`
    /// is at least 1 and at most `keys.len()`. This is a semaphore's attempt
    /// ([`crate::kinds::Semaphore`]: the keys are its slots, from a random one on).
    ///
    /// With a `gate` (a key apart from `keys`: a reader-writer lock's, [`crate::kinds::RwLock`],
    /// whose reader slots are the keys), the keys are taken only while the gate has no holder
    /// (no record, or a count of 0), and the answer carries the gate's fencing token (the
    /// fencing floor when it has no record: a sweep may have deleted it); a held
    /// gate is [`AcquireAnyOutcome::GateHeld`] with nothing taken. The gate must be read
    /// *after* the keys are taken, or at one instant with their taking: a writer takes the gate
    /// first and then looks at the slots, so one of the two sees the other.
    ///
    /// The default ([`acquire_first_free`]) takes the keys one by one with
    /// [`Storage::acquire_once`] until it has `need`, and gives them back if it runs out of
    /// keys first (one round trip per key it looks at), then reads the gate, and gives the keys
    /// back if it is held. A backend whose lock operations are its own overrides it to look at
    /// the gate and every key and take the free ones in one round trip.
    ///
    /// A `need` of 0 takes nothing; one above the number of keys is busy.
    ///
    /// # Errors
    /// As [`Storage::acquire_once`] (the outcome of every key is unknown; the default gives
    /// back what it took before the failure, as far as it can).
    async fn acquire_any(
        &self,
        keys: &[&str],
        need: usize,
        gate: Option<&str>,
        req: &AcquireRequest,
    ) -> Result<AcquireAnyOutcome, StorageError> {
        acquire_first_free(self, keys, need, gate, req).await
    }

    /// Extends `owner`'s live hold of `key` to `now + lease` (see [`ops::decide_renew`]).
    async fn renew(
        &self,
        key: &str,
        owner: OwnerId,
        lease: Duration,
    ) -> Result<RenewOutcome, StorageError> {
        defaults::renew(primitives_of(self, "renew")?, key, owner, lease).await
    }

    /// Renews many holds in one go: the answer has one entry per request, in order, each what
    /// [`Storage::renew`] would have answered for it. The watchdog of a [`crate::StorageLock`]
    /// coalesces the renewals of all its auto-renewed handles into calls of this method (at most
    /// [`crate::RENEW_BATCH`] keys each).
    ///
    /// The default renews key by key, all keys at once; backends that can do it in one round
    /// trip override it (one SQL statement or transaction, one script). An override must decide
    /// every key on its own: a key that cannot be renewed never makes another fail.
    ///
    /// # Errors
    /// The outer error: the call as a whole failed, and the outcome of every key is unknown.
    /// An inner error: that key's outcome is unknown.
    async fn renew_many(
        &self,
        renewals: &[RenewRequest<'_>],
    ) -> Result<Vec<Result<RenewOutcome, StorageError>>, StorageError> {
        Ok(defaults::renew_many(self, renewals).await)
    }

    /// Releases one level of `owner`'s hold of `key`, writing a tombstone at zero (see
    /// [`ops::decide_release`]).
    async fn release(&self, key: &str, owner: OwnerId) -> Result<ReleaseOutcome, StorageError> {
        defaults::release(primitives_of(self, "release")?, key, owner).await
    }

    /// Arms a notification for the next change of `key` (see [`ChangeWait`]). The default has
    /// none; waiters then back off with jitter.
    async fn wait_for_change(&self, key: &str) -> Result<ChangeWait, StorageError> {
        let _ = key;
        Ok(ChangeWait::unsupported())
    }

    /// A storage that runs the admin operations itself (a lock server: it has no raw
    /// compare-and-set to build them from) returns them here; [`StorageExt`]'s
    /// `force_release`, `force_release_if`, `sweep` and `fencing_floor` then delegate to it.
    /// `None` (the default): they are built on the primitives.
    fn delegated_admin(&self) -> Option<&dyn DelegatedAdmin> {
        None
    }

    /// The storage's compare-and-set primitives, which the provided lock operations and
    /// [`StorageExt`]'s admin operations are built on: `Some(self)` for every backend over a
    /// store (one line: `fn primitives(&self) -> Option<&dyn Primitives> { Some(self) }`).
    /// `None` (the default) for a storage that has none to offer, a lock server's client: it
    /// overrides the lock operations and delegates the admin ones
    /// ([`Self::delegated_admin`]); a provided operation it does not override answers
    /// [`StorageError::Unsupported`].
    fn primitives(&self) -> Option<&dyn Primitives> {
        None
    }
}

/// The default [`Storage::acquire_many`]: [`Storage::acquire_once`] on each key in order and,
/// at the first busy key (or error), the keys taken so far released. For an override that
/// handles some requests itself and leaves the rest to the default (a reentrant one, say).
///
/// # Errors
/// As [`Storage::acquire_many`].
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), storage_lock_core::StorageError> {
/// use std::time::Duration;
/// use storage_lock_core::storage::acquire_each;
/// use storage_lock_core::{AcquireManyOutcome, AcquireRequest, MemoryStorage, OwnerId};
/// let req = AcquireRequest {
///     owner: OwnerId::random(),
///     lease: Duration::from_secs(30),
///     holder: None,
///     reentrant: false,
/// };
/// let taken = acquire_each(&MemoryStorage::new(), &["a", "b"], &req).await?;
/// assert!(matches!(taken, AcquireManyOutcome::Acquired(grants) if grants.len() == 2));
/// # Ok(()) }
/// ```
pub async fn acquire_each<S: Storage + ?Sized>(
    s: &S,
    keys: &[&str],
    req: &AcquireRequest,
) -> Result<AcquireManyOutcome, StorageError> {
    defaults::acquire_many(s, keys, req).await
}

/// The default [`Storage::acquire_any`]: [`Storage::acquire_once`] on each key in order until
/// `need` are taken; if the keys run out first (or a request fails), the keys taken are
/// released. Then the gate, if any, is read, and the keys given back if it is held. For an
/// override that leaves some requests to the default.
///
/// # Errors
/// As [`Storage::acquire_any`].
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), storage_lock_core::StorageError> {
/// use std::time::Duration;
/// use storage_lock_core::storage::acquire_first_free;
/// use storage_lock_core::{AcquireAnyOutcome, AcquireRequest, MemoryStorage, OwnerId, Storage};
/// let req = |owner| AcquireRequest { owner, lease: Duration::from_secs(30), holder: None, reentrant: false };
/// let s = MemoryStorage::new();
/// s.acquire_once("a", &req(OwnerId::random())).await?;
/// let AcquireAnyOutcome::Acquired { taken, .. } =
///     acquire_first_free(&s, &["a", "b", "c"], 1, None, &req(OwnerId::random())).await?
/// else {
///     panic!("b and c are free")
/// };
/// assert_eq!(taken[0].0, 1); // "a" is held: "b" is the first free key
/// # Ok(()) }
/// ```
pub async fn acquire_first_free<S: Storage + ?Sized>(
    s: &S,
    keys: &[&str],
    need: usize,
    gate: Option<&str>,
    req: &AcquireRequest,
) -> Result<AcquireAnyOutcome, StorageError> {
    defaults::acquire_any(s, keys, need, gate, req).await
}

/// One conditional write of [`Primitives::write_all`].
#[derive(Debug, Clone, Copy)]
pub struct CasWrite<'a> {
    /// The key.
    pub key: &'a str,
    /// `None`: create (the key must be absent); `Some`: update (the stored version must be
    /// this one).
    pub expected: Option<&'a Version>,
    /// The record to store.
    pub record: &'a LockRecord,
}

/// The compare-and-set primitives of a store (see [`Storage::primitives`] and the contract in
/// [`Storage`]'s docs): the writes the provided lock operations are built on.
///
/// # Examples
/// A storage over a store gives its primitives out as itself:
/// ```
/// use storage_lock_core::{MemoryStorage, Storage};
/// assert!(MemoryStorage::new().primitives().is_some());
/// ```
#[async_trait]
pub trait Primitives: Storage {
    /// Inserts `record` iff `key` is absent.
    async fn create(&self, key: &str, record: &LockRecord) -> Result<Version, StorageError>;

    /// Replaces the record iff its version is `expected`.
    async fn update(
        &self,
        key: &str,
        expected: &Version,
        record: &LockRecord,
    ) -> Result<Version, StorageError>;

    /// The record this storage last wrote or saw under `key`, with its version, if it keeps
    /// one (default: `None`). A **hint**: the default lock operations try their compare-and-set
    /// on its version before they read (one request instead of two when it is current), and
    /// read again before they answer busy or not-held on it. It must be a record this storage
    /// really read or wrote under that version, with `expires_at` as [`Storage::get`] would
    /// report it (see [`observed`]).
    fn known(&self, key: &str) -> Option<Stored> {
        let _ = key;
        None
    }

    /// Whether [`Primitives::write_all`] is implemented (default: `false`); the two go
    /// together.
    fn writes_all_at_once(&self) -> bool {
        false
    }

    /// Applies every write or none, in one request: each a create (`expected: None`: the key
    /// must be absent) or an update (the stored version must be `expected`), as
    /// [`Primitives::create`] and [`Primitives::update`] would one by one. The new versions, in
    /// order. Implemented where the store has a multi-key transaction (etcd's `Txn`,
    /// ZooKeeper's `multi`, DynamoDB's `TransactWriteItems`); [`Storage::acquire_many`] then
    /// takes a multi-lock in one request.
    /// The keys are distinct.
    ///
    /// # Errors
    /// [`StorageError::AlreadyExists`] or [`StorageError::Conflict`] when any condition fails
    /// (nothing was written; which key, if known); [`StorageError::Unsupported`] by default;
    /// any other error: the outcome is unknown.
    async fn write_all(&self, writes: &[CasWrite<'_>]) -> Result<Vec<Version>, StorageError> {
        let _ = writes;
        Err(StorageError::Unsupported {
            backend: self.name().to_owned(),
            operation: "write_all",
        })
    }

    /// Deletes the record iff its version is `expected`. Optional
    /// ([`Capabilities::conditional_delete`]); release never deletes, only [`StorageExt::sweep`] does.
    async fn delete(&self, key: &str, expected: &Version) -> Result<(), StorageError> {
        let _ = (key, expected);
        Err(StorageError::Unsupported {
            backend: self.name().to_owned(),
            operation: "delete",
        })
    }
}

/// `s`'s primitives, for an operation (`op`) built on them (a provided one, or a wrapper's);
/// a storage without any answers [`StorageError::Unsupported`].
pub(crate) fn primitives_of<'a, S: Storage + ?Sized>(
    s: &'a S,
    op: &'static str,
) -> Result<&'a dyn Primitives, StorageError> {
    s.primitives().ok_or_else(|| StorageError::Unsupported {
        backend: s.name().to_owned(),
        operation: op,
    })
}

/// The operations built on the primitives, run by a storage that has none and runs them itself
/// (see [`Storage::delegated_admin`]): the admin operations, and the semaphore limit record
/// the lock kinds keep. Each keeps the contract of its [`StorageExt`] namesake.
#[async_trait]
pub trait DelegatedAdmin: Send + Sync {
    /// The backend of the storage that the delegate runs on (a lock server's own storage:
    /// `postgres`, `redis`, …), for people: `storage-lock check` prints it.
    fn backend(&self) -> &str;
    /// As [`StorageExt::force_release`] (`Some(fencing)`: [`StorageExt::force_release_if`]).
    async fn force_release(
        &self,
        key: &str,
        fencing: Option<u64>,
    ) -> Result<Option<LockRecord>, StorageError>;
    /// As [`StorageExt::sweep`].
    async fn sweep(&self, prefix: &str, older_than: Duration) -> Result<SweepReport, StorageError>;
    /// As [`StorageExt::fencing_floor`].
    async fn fencing_floor(&self) -> Result<u64, StorageError>;
    /// As [`StorageExt::semaphore_limit`].
    async fn semaphore_limit(
        &self,
        key: &str,
        permits: Option<u64>,
    ) -> Result<Option<u64>, StorageError>;
}

/// What callers do with a [`Storage`] beyond the lock operations — listing, sweeping, the
/// fencing floor, force-release — built once on the primitives for every backend.
///
/// Implemented for every storage (and `dyn Storage`); a backend cannot override these, so their
/// safety arguments (the floor is raised before a sweep deletes, a force-release keeps the
/// token) hold everywhere. Bring it into scope to call them: `use storage_lock_core::StorageExt`.
#[async_trait]
pub trait StorageExt: Storage {
    /// The per-storage fencing floor: fresh keys start above it.
    async fn fencing_floor(&self) -> Result<u64, StorageError> {
        if let Some(admin) = self.delegated_admin() {
            return admin.fencing_floor().await;
        }
        defaults::fencing_floor(self).await
    }

    /// Raises the fencing floor to at least `to`; returns the floor afterwards.
    async fn raise_fencing_floor(&self, to: u64) -> Result<u64, StorageError> {
        defaults::raise_fencing_floor(primitives_of(self, "raise_fencing_floor")?, to).await
    }

    /// Like [`Storage::list`] without internal keys.
    async fn list_locks(&self, prefix: &str, page: &PageRequest) -> Result<Page, StorageError> {
        let mut page = self.list(prefix, page).await?;
        page.entries.retain(|(k, _)| !ops::is_reserved_key(k));
        Ok(page)
    }

    /// **Admin operation**: frees `key` whoever holds it, for a holder that is gone for good.
    /// Writes a tombstone owned by [`OwnerId::NOBODY`] (the fencing token stays, so the next
    /// acquisition's token is still strictly higher; the owner tells the evicted holder why its
    /// hold ended) and returns the record as it was, or `None` if the key was not held.
    /// The evicted holder finds out at its next renewal (its handle turns lost) or by its local
    /// deadline; until then it may still *believe* it holds the lock, which is why the protected
    /// resource must check fencing tokens.
    async fn force_release(&self, key: &str) -> Result<Option<LockRecord>, StorageError> {
        if let Some(admin) = self.delegated_admin() {
            return admin.force_release(key, None).await;
        }
        defaults::force_release(primitives_of(self, "force_release")?, key, None).await
    }

    /// [`StorageExt::force_release`] only if the hold's fencing token is `fencing` (compared and
    /// written in one compare-and-set, so a newer holder is never evicted by mistake); `None`
    /// if the key is free or held under another token.
    async fn force_release_if(
        &self,
        key: &str,
        fencing: u64,
    ) -> Result<Option<LockRecord>, StorageError> {
        if let Some(admin) = self.delegated_admin() {
            return admin.force_release(key, Some(fencing)).await;
        }
        defaults::force_release(primitives_of(self, "force_release")?, key, Some(fencing)).await
    }

    /// The limit record of the semaphore whose name has the storage key `key` (kept under
    /// [`crate::kinds::limit_key`]): the stored number of permits, written first as `permits`
    /// if none is stored and `permits` is given (create-if-absent: of racing writers, one
    /// wins and every one reads what it wrote). `None`: none stored, none asked for.
    ///
    /// [`crate::kinds::Semaphore`] and [`crate::kinds::RwLock`] use it so that every party of
    /// a name agrees on its number of permits (or readers).
    ///
    /// # Errors
    /// [`StorageError::Unsupported`] on a storage with neither primitives nor a delegate;
    /// storage errors.
    async fn semaphore_limit(
        &self,
        key: &str,
        permits: Option<u64>,
    ) -> Result<Option<u64>, StorageError> {
        if let Some(admin) = self.delegated_admin() {
            return admin.semaphore_limit(key, permits).await;
        }
        defaults::semaphore_limit(self, key, permits).await
    }

    /// Deletes records under `prefix` that have been free for at least `older_than`, after
    /// raising the fencing floor above their tokens, so fencing stays monotonic per key forever.
    /// Needs [`Capabilities::conditional_delete`].
    async fn sweep(&self, prefix: &str, older_than: Duration) -> Result<SweepReport, StorageError> {
        if let Some(admin) = self.delegated_admin() {
            return admin.sweep(prefix, older_than).await;
        }
        defaults::sweep(primitives_of(self, "sweep")?, prefix, older_than).await
    }
}

impl<S: Storage + ?Sized> StorageExt for S {}

macro_rules! forward_storage {
    ($($ptr:ty),*) => {$(
        // Every method forwarded: a provided one left out would silently run the default on
        // top of the pointee's primitives instead of the pointee's own override.
        #[deny(clippy::missing_trait_methods)]
        #[async_trait]
        impl<S: Storage + ?Sized> Storage for $ptr {
            fn name(&self) -> &str { (**self).name() }
            fn capabilities(&self) -> Capabilities { (**self).capabilities() }
            async fn now(&self) -> Result<Timestamp, StorageError> { (**self).now().await }
            async fn get(&self, key: &str) -> Result<Option<Stored>, StorageError> { (**self).get(key).await }
            async fn list(&self, prefix: &str, page: &PageRequest) -> Result<Page, StorageError> {
                (**self).list(prefix, page).await
            }
            async fn acquire_once(&self, key: &str, req: &AcquireRequest) -> Result<AcquireOutcome, StorageError> {
                (**self).acquire_once(key, req).await
            }
            async fn acquire_many(&self, keys: &[&str], req: &AcquireRequest) -> Result<AcquireManyOutcome, StorageError> {
                (**self).acquire_many(keys, req).await
            }
            async fn acquire_any(&self, keys: &[&str], need: usize, gate: Option<&str>, req: &AcquireRequest) -> Result<AcquireAnyOutcome, StorageError> {
                (**self).acquire_any(keys, need, gate, req).await
            }
            async fn renew(&self, key: &str, owner: OwnerId, lease: Duration) -> Result<RenewOutcome, StorageError> {
                (**self).renew(key, owner, lease).await
            }
            async fn renew_many(&self, renewals: &[RenewRequest<'_>]) -> Result<Vec<Result<RenewOutcome, StorageError>>, StorageError> {
                (**self).renew_many(renewals).await
            }
            async fn release(&self, key: &str, owner: OwnerId) -> Result<ReleaseOutcome, StorageError> {
                (**self).release(key, owner).await
            }
            async fn wait_for_change(&self, key: &str) -> Result<ChangeWait, StorageError> {
                (**self).wait_for_change(key).await
            }
            fn delegated_admin(&self) -> Option<&dyn DelegatedAdmin> {
                (**self).delegated_admin()
            }
            fn primitives(&self) -> Option<&dyn Primitives> {
                (**self).primitives()
            }
        }
    )*};
}

forward_storage!(Arc<S>, Box<S>);
