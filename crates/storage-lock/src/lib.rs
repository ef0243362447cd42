//! # storage-lock
//!
//! Distributed locks over any storage that offers a linearizable compare-and-set. One engine,
//! every backend held to the same two test suites; handles carry a **fencing token**, an
//! authoritative expiry, a **lost** signal and fail-closed renewal.
//!
//! This crate is the facade: its root holds what an application uses (open a storage from a URL
//! with [`connect`], or a backend's builder with [`StorageLock`]; take locks through
//! [`DistributedLock`]; the [`LockHandle`], its options and errors; [`FencedResource`] for the
//! protected side), and [`backend`] what a backend author or a tool on stored records needs.
//!
//! | URL | backend | feature |
//! |---|---|---|
//! | `memory:` | [`MemoryStorage`] (process-local, fresh per call) | always |
//! | `sqlite://PATH[?table=NAME]` | `SqliteStorage` (processes on one host) | `sqlite` (default) |
//! | `postgres://…[?table=NAME&schema=NAME]` | `PostgresStorage` | `postgres` |
//! | `mysql://…[?table=NAME]` (also `mariadb://`) | `MysqlStorage` | `mysql` |
//! | `redis://…[?prefix=PREFIX&cluster=true&replicas=N]` | `RedisStorage` (also a Redis Cluster) | `redis` |
//! | `etcd://host:2379[,host:2379…][?prefix=PREFIX&timeout=2s]` | `EtcdStorage` | `etcd` |
//! | `nats://host:4222[,…][?bucket=B&prefix=P&replicas=3&timeout=2s]` | `NatsStorage` | `nats` |
//! | `s3://BUCKET[/PREFIX][?endpoint=URL&region=R&timeout=2s]` | `ObjectStoreStorage` | `object-store` |
//! | `azure://CONTAINER[/PREFIX][?account=A&endpoint=URL&emulator=true&timeout=2s]` | `ObjectStoreStorage` (Azure Blob, Azurite) | `azure` |
//! | `memcached://host:port[?prefix=P&timeout=2s]&durability=volatile` (refused without it) | `MemcachedStorage` | `memcached` |
//! | `dynamodb://TABLE[/PREFIX][?region=R&endpoint=URL&emulator=true&timeout=2s]` | `DynamoDbStorage` | `dynamodb` |
//! | `zookeeper://host:2181[,host:2181…][/ROOT][?timeout=2s&session_timeout=10s]` | `ZooKeeperStorage` | `zookeeper` |
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
/// Lock kinds built on the exclusive lock: [`kinds::acquire_all`] (several names as one),
/// [`kinds::Semaphore`] (at most N holders), [`kinds::RwLock`] (many readers or one writer),
/// [`kinds::FairLock`] (waiters served in arrival order) and [`kinds::Election`] (one leader,
/// its term fenced); see the module's table for which to pick.
pub use storage_lock_core::kinds;
pub use storage_lock_core::{
    AcquireOptions, Busy, DistributedLock, FencedResource, KeyNormalizer, Lease, LockError,
    LockEvent, LockEventKind, LockHandle, MAX_NAME_LEN, MemoryStorage, PrefixNormalizer,
    ProviderInfo, ReentrantHold, RenewalResult, StaleToken, StorageError, StorageLock,
    StorageLockBuilder, Wait,
};
#[cfg(feature = "dynamodb")]
pub use storage_lock_dynamodb::{DynamoDbStorage, DynamoDbStorageBuilder};
#[cfg(feature = "etcd")]
pub use storage_lock_etcd::{EtcdStorage, EtcdStorageBuilder};
#[cfg(feature = "memcached")]
pub use storage_lock_memcached::{MemcachedStorage, MemcachedStorageBuilder};
#[cfg(feature = "nats")]
pub use storage_lock_nats::{NatsStorage, NatsStorageBuilder};
#[cfg(any(feature = "object-store", feature = "azure"))]
pub use storage_lock_object_store::{ObjectStoreStorage, ObjectStoreStorageBuilder};
#[cfg(feature = "redis")]
pub use storage_lock_redis::{RedisStorage, RedisStorageBuilder};
#[cfg(feature = "mysql")]
pub use storage_lock_sql::{MysqlStorage, MysqlStorageBuilder};
#[cfg(feature = "postgres")]
pub use storage_lock_sql::{PostgresStorage, PostgresStorageBuilder};
#[cfg(feature = "sqlite")]
pub use storage_lock_sql::{SqliteStorage, SqliteStorageBuilder};
#[cfg(feature = "zookeeper")]
pub use storage_lock_zookeeper::{ZooKeeperStorage, ZooKeeperStorageBuilder};

/// For backend authors and tools that work on stored records: the [`backend::Storage`] trait
/// (required compare-and-set primitives, provided lock operations), its records, capabilities
/// and clocks, the hold layer's seam for providers that are not a storage
/// ([`backend::HoldIo`]), and the core's modules. An application needs none of it: it takes
/// locks through [`connect`] (or a backend's builder and [`StorageLock`]) and
/// [`DistributedLock`].
pub mod backend {
    pub use storage_lock_core::hold::{HoldGrant, HoldIo};
    pub use storage_lock_core::{
        AcquireAnyOutcome, AcquireManyOutcome, AcquireOutcome, AcquireRequest, Capabilities,
        CasWrite, ChangeWait, Clock, DelegatedAdmin, Durability, FENCING_HEADROOM, HolderInfo,
        LockRecord, ManualClock, OwnerId, Page, PageRequest, ParseOwnerIdError, Primitives,
        RENEW_BATCH, ReleaseOutcome, RenewOutcome, RenewRequest, Storage, StorageExt, Stored,
        SweepReport, SystemClock, TimeSource, Timestamp, Version, redact_url,
    };
    pub use storage_lock_core::{clock, contract, engine, fenced, hold, lock, memory, storage};
}
