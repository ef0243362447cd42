//! # storage-lock
//!
//! Distributed locks over any storage that offers a linearizable compare-and-set. One engine,
//! every backend held to the same two test suites; handles carry a **fencing token**, an
//! authoritative expiry, a **lost** signal and fail-closed renewal.
//!
//! This crate is the facade: it re-exports the contract and the engine from
//! [`storage_lock_core`] and opens any compiled-in backend from a URL with [`connect`].
//!
//! | URL | backend | feature |
//! |---|---|---|
//! | `memory:` | [`MemoryStorage`] (process-local, fresh per call) | always |
//! | `sqlite://PATH[?table=NAME]` | `SqliteStorage` (processes on one host) | `sqlite` (default) |
//! | `postgres://…[?table=NAME&schema=NAME]` | `PostgresStorage` | `postgres` |
//! | `mysql://…[?table=NAME]` (also `mariadb://`) | `MysqlStorage` | `mysql` |
//! | `redis://…[?prefix=PREFIX]` | `RedisStorage` | `redis` |
//! | `etcd://host:2379[,host:2379…][?prefix=PREFIX&timeout=2s]` | `EtcdStorage` | `etcd` |
//! | `nats://host:4222[,…][?bucket=B&prefix=P&replicas=3&timeout=2s]` | `NatsStorage` | `nats` |
//! | `s3://BUCKET[/PREFIX][?endpoint=URL&region=R&timeout=2s]` | `ObjectStoreStorage` | `object-store` |
//! | `http(s)://HOST:PORT[?token=T&ca=PEM&cert=PEM&key=PEM]` | `RemoteStorage` (a `storage-lock serve`) | `http` |
//!
//! ```no_run
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use storage_lock::{AcquireOptions, DistributedLock, Wait};
//!
//! let locks = storage_lock::connect("sqlite:///tmp/locks.db").await?;
//! let opts = AcquireOptions::default()
//!     .wait(Wait::For(Duration::from_secs(10)))
//!     .lease(Duration::from_secs(30))
//!     .auto_renew(Duration::from_secs(10));
//! if let Some(handle) = locks.try_acquire("nightly-report", &opts).await? {
//!     println!("holding with fencing token {}", handle.fencing_token());
//!     // ... work; pass handle.fencing_token() to every write; stop if handle.lost() fires ...
//!     handle.release().await?;
//! }
//! # Ok(()) }
//! ```

mod connect;

pub use connect::{ConnectError, connect, connect_storage, schemes};
pub use storage_lock_core::redact_url;
pub use storage_lock_core::{
    AcquireOptions, AcquireOutcome, AcquireRequest, Capabilities, ChangeWait, Clock,
    DelegatedAdmin, DistributedLock, Durability, FencedResource, HolderInfo, KeyNormalizer,
    LockError, LockEvent, LockEventKind, LockHandle, LockRecord, MAX_NAME_LEN, ManualClock,
    MemoryStorage, OwnerId, Page, PageRequest, PrefixNormalizer, ProviderInfo, RENEW_BATCH,
    ReentrantHold, ReleaseOutcome, RenewOutcome, RenewRequest, RenewalResult, StaleToken, Storage,
    StorageError, StorageExt, StorageLock, StorageLockBuilder, Stored, SweepReport, SystemClock,
    TimeSource, Timestamp, Version, Wait,
};
pub use storage_lock_core::{clock, contract, engine, fenced, memory, storage};
#[cfg(feature = "etcd")]
pub use storage_lock_etcd::{EtcdStorage, EtcdStorageBuilder};
#[cfg(feature = "nats")]
pub use storage_lock_nats::{NatsStorage, NatsStorageBuilder};
#[cfg(feature = "object-store")]
pub use storage_lock_object_store::ObjectStoreStorage;
#[cfg(feature = "redis")]
pub use storage_lock_redis::{RedisStorage, RedisStorageBuilder};
#[cfg(feature = "mysql")]
pub use storage_lock_sql::{MysqlStorage, MysqlStorageBuilder};
#[cfg(feature = "postgres")]
pub use storage_lock_sql::{PostgresStorage, PostgresStorageBuilder};
#[cfg(feature = "sqlite")]
pub use storage_lock_sql::{SqliteStorage, SqliteStorageBuilder};
