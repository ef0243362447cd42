//! The storage-lock contract, the storage layer, the lock engine and the in-memory backend.
//!
//! # Which piece do I need?
//!
//! | you want to… | use |
//! |---|---|
//! | take a lock in application code, backend-agnostic | [`DistributedLock`] (usually as `Arc<dyn DistributedLock>`) |
//! | run the lock algorithm over a storage | [`StorageLock`] — it implements [`DistributedLock`] |
//! | coordinate tasks of one process, nothing to install | [`MemoryStorage`] with [`StorageLock`] |
//! | hold a lock counted by an explicit owner id (reentrant) | [`StorageLock::lock_reentrant`] |
//! | serve locks to remote clients that name their owner (idempotent retries) | [`StorageLock::acquire_as`] |
//! | add a backend | implement the reads of [`Storage`] and the writes of [`Primitives`] (`primitives()` returns `Some(self)`), override lock operations the store can decide in one round trip, then stamp the suites of `storage-lock-testkit` with one macro call |
//! | hold several names as one, or let at most N hold a name | [`kinds`]: [`kinds::acquire_all`], [`kinds::Semaphore`] |
//! | make a protected resource reject stale holders | [`FencedResource`] and the fencing token of a [`LockHandle`] |
//!
//! # Data flow
//!
//! [`DistributedLock::try_acquire`] validates the name and the options (no storage I/O before
//! that), normalizes the name into a key, then loops: arm a change notification
//! ([`Storage::wait_for_change`]), call [`Storage::acquire_once`] (one round trip on backends that
//! override it, a get + conditional create/update on the default implementation), and either
//! build a [`LockHandle`] or sleep until the earliest of the wait deadline, the holder's expiry, a
//! change notification or a jittered backoff. See [`engine`] for the details.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), storage_lock_core::LockError> {
//! use std::time::Duration;
//! use storage_lock_core::{AcquireOptions, DistributedLock, MemoryStorage, StorageLock, Wait};
//!
//! let locks = StorageLock::new(MemoryStorage::new())?;
//! let opts = AcquireOptions::default().wait(Wait::For(Duration::from_secs(5)));
//! let handle = locks.try_acquire("orders:42", &opts).await?.expect("nobody else holds it");
//! // Pass the fencing token to the protected resource with every write.
//! assert!(handle.fencing_token() >= 1);
//! handle.release().await?;
//! # Ok(()) }
//! ```

pub mod clock;
pub mod contract;
pub mod engine;
#[cfg(any(test, feature = "testing"))]
pub mod fault;
pub mod fenced;
pub mod hold;
pub mod kinds;
pub mod lock;
pub mod memory;
mod small_key;
pub mod storage;
mod telemetry;

pub use clock::{Clock, ManualClock, MonotonicClock, SystemClock, boot_time};
pub use contract::{
    AcquireOptions, Busy, KeyNormalizer, Lease, LockError, MAX_NAME_LEN, PrefixNormalizer,
    ProviderInfo, Wait,
};
pub use engine::{
    HoldGone, LockEvent, LockEventKind, OwnedHold, RENEW_BATCH, ReentrantHold, StorageLock,
    StorageLockBuilder,
};
pub use fenced::{FencedResource, StaleToken};
pub use hold::{LockHandle, RenewalResult};
pub use lock::DistributedLock;
pub use memory::MemoryStorage;
pub use storage::{
    AcquireAnyOutcome, AcquireManyOutcome, AcquireOutcome, AcquireRequest, Capabilities, CasWrite,
    ChangeWait, DelegatedAdmin, Durability, FENCING_HEADROOM, HolderInfo, LockRecord, OwnerId,
    Page, PageRequest, ParseOwnerIdError, Primitives, ReleaseOutcome, RenewOutcome, RenewRequest,
    Storage, StorageError, StorageExt, Stored, SweepReport, TimeSource, Timestamp, Version,
    Waiters, redact_url,
};
pub use storage::{NotificationSource, Notifications, SourceEvent};
pub use telemetry::describe_metrics;
