//! Opening a storage from a URL.
//!
//! The registry is one table, `SCHEMES`: a scheme and the function that opens it. Parsing is
//! each backend builder's own (`XStorageBuilder::from_url`, on the core's one URL vocabulary,
//! `storage_lock_core::storage::url`); the table only dispatches. A backend behind a feature
//! adds one `#[cfg(feature = "…")]` line there and one `from_url_opener!` call.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use storage_lock_core::{LockError, MemoryStorage, Storage, StorageError, StorageLock, redact_url};

/// Why [`connect`] failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectError {
    /// The URL's scheme names no compiled-in backend.
    #[error("unknown storage scheme {scheme:?} (known: {known})")]
    UnknownScheme {
        /// The scheme found.
        scheme: String,
        /// The schemes this build knows, comma-separated.
        known: String,
    },
    /// The URL is malformed for its scheme.
    #[error("invalid storage URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL (without credentials).
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The backend could not be opened.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The storage is not fit to back a lock.
    #[error(transparent)]
    Lock(#[from] LockError),
}

type Opened = Pin<Box<dyn Future<Output = Result<Arc<dyn Storage>, ConnectError>> + Send>>;

type Opener = fn(String) -> Opened;

/// The registry: a scheme and the function that opens it. Add a backend with one line.
const SCHEMES: &[(&str, Opener)] = &[
    ("memory", open_memory),
    #[cfg(feature = "sqlite")]
    ("sqlite", open_sqlite),
    #[cfg(feature = "postgres")]
    ("postgres", open_postgres),
    #[cfg(feature = "postgres")]
    ("postgresql", open_postgres),
    #[cfg(feature = "mysql")]
    ("mysql", open_mysql),
    #[cfg(feature = "mysql")]
    ("mariadb", open_mysql),
    #[cfg(feature = "redis")]
    ("redis", open_redis),
    #[cfg(feature = "redis")]
    ("rediss", open_redis),
    #[cfg(feature = "etcd")]
    ("etcd", open_etcd),
    #[cfg(feature = "nats")]
    ("nats", open_nats),
    #[cfg(feature = "object-store")]
    ("s3", open_object_store),
    #[cfg(feature = "azure")]
    ("azure", open_object_store),
    #[cfg(feature = "memcached")]
    ("memcached", open_memcached),
    #[cfg(feature = "dynamodb")]
    ("dynamodb", open_dynamodb),
    #[cfg(feature = "zookeeper")]
    ("zookeeper", open_zookeeper),
    #[cfg(feature = "http")]
    ("http", open_http),
    #[cfg(feature = "http")]
    ("https", open_http),
];

/// The URL schemes this build can open.
pub fn schemes() -> impl Iterator<Item = &'static str> {
    SCHEMES.iter().map(|(name, _)| *name)
}

/// Opens the storage a URL names (see the crate docs for the URL forms), for listing,
/// sweeping or building a [`StorageLock`] with your own options.
///
/// # Errors
/// * [`ConnectError::UnknownScheme`] — no compiled-in backend has that scheme (check the
///   crate's features);
/// * [`ConnectError::InvalidUrl`] — malformed, an unknown option, or an option the driver
///   rejects (found before connecting; the password is never shown);
/// * [`ConnectError::Storage`] — the backend could not be opened:
///   [`StorageError::Config`] if the server can forget writes and `durability=volatile` was
///   not given, [`StorageError::Backend`] if it cannot be reached.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), storage_lock::ConnectError> {
/// use storage_lock::backend::{PageRequest, StorageExt};
/// let storage = storage_lock::connect_storage("memory:").await?;
/// let held = storage.list_locks("", &PageRequest::default()).await?;
/// assert!(held.entries.is_empty());
/// # Ok(()) }
/// ```
pub async fn connect_storage(url: &str) -> Result<Arc<dyn Storage>, ConnectError> {
    let Some((scheme, _)) = url.split_once(':') else {
        return Err(ConnectError::InvalidUrl {
            url: redact_url(url),
            reason: "expected SCHEME:… (e.g. sqlite:///var/lib/locks.db or memory:)".into(),
        });
    };
    let (_, open) = SCHEMES
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(scheme))
        .ok_or_else(|| ConnectError::UnknownScheme {
            scheme: scheme.to_owned(),
            known: schemes().collect::<Vec<_>>().join(", "),
        })?;
    open(url.to_owned()).await
}

/// Opens the storage a URL names and builds a [`StorageLock`] over it (capability check
/// included).
///
/// # Errors
/// As [`connect_storage`], and [`ConnectError::Lock`] if the storage cannot back a lock
/// safely (no linearizable compare-and-set, no clock).
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use storage_lock::DistributedLock;
/// let dir = tempfile::tempdir()?;
/// let url = format!("sqlite://{}/locks.db", dir.path().display());
/// let locks = storage_lock::connect(&url).await?;
/// let lock = locks.try_acquire_for("deploy", Duration::ZERO).await?.expect("free");
/// lock.release().await?;
/// # Ok(()) }
/// ```
pub async fn connect(url: &str) -> Result<StorageLock, ConnectError> {
    let storage = connect_storage(url).await?;
    Ok(StorageLock::builder_arc(storage).build()?)
}

fn open_memory(url: String) -> Opened {
    Box::pin(async move {
        let rest = &url["memory:".len()..];
        if !rest.is_empty() && rest != "//" {
            return Err(ConnectError::InvalidUrl {
                url,
                reason: "memory: takes no path or options".into(),
            });
        }
        Ok(Arc::new(MemoryStorage::new()) as Arc<dyn Storage>)
    })
}

/// A backend builder's URL check (`from_url`) as [`ConnectError::InvalidUrl`].
#[cfg(any(
    feature = "sqlite",
    feature = "postgres",
    feature = "mysql",
    feature = "redis",
    feature = "etcd",
    feature = "nats",
    feature = "object-store",
    feature = "azure",
    feature = "memcached",
    feature = "dynamodb",
    feature = "zookeeper"
))]
fn backend_url<B>(url: &str, parsed: Result<B, StorageError>) -> Result<B, ConnectError> {
    parsed.map_err(|e| ConnectError::InvalidUrl {
        url: redact_url(url),
        reason: match e {
            StorageError::Config { reason, .. } => reason,
            other => other.to_string(),
        },
    })
}

/// Defines `fn $name(url) -> Opened`: the backend builder's own `from_url` (its URL check as
/// [`ConnectError::InvalidUrl`]), then its `open`.
macro_rules! from_url_opener {
    ($(#[$meta:meta])* $name:ident => $builder:ty) => {
        $(#[$meta])*
        fn $name(url: String) -> Opened {
            Box::pin(async move {
                let builder = backend_url(&url, <$builder>::from_url(&url))?;
                Ok(Arc::new(builder.open().await?) as Arc<dyn Storage>)
            })
        }
    };
}

from_url_opener!(
    /// `sqlite://PATH[?table=NAME&durability=volatile]`.
    #[cfg(feature = "sqlite")]
    open_sqlite => storage_lock_sql::SqliteStorageBuilder
);
from_url_opener!(
    /// `postgres://…`.
    #[cfg(feature = "postgres")]
    open_postgres => storage_lock_sql::PostgresStorageBuilder
);
from_url_opener!(
    /// `mysql://…`, `mariadb://…`.
    #[cfg(feature = "mysql")]
    open_mysql => storage_lock_sql::MysqlStorageBuilder
);
from_url_opener!(
    /// `redis://…`, `rediss://…`.
    #[cfg(feature = "redis")]
    open_redis => storage_lock_redis::RedisStorageBuilder
);
from_url_opener!(
    /// `etcd://…`.
    #[cfg(feature = "etcd")]
    open_etcd => storage_lock_etcd::EtcdStorageBuilder
);
from_url_opener!(
    /// `nats://…`.
    #[cfg(feature = "nats")]
    open_nats => storage_lock_nats::NatsStorageBuilder
);
from_url_opener!(
    /// `s3://…`, `azure://…`.
    #[cfg(any(feature = "object-store", feature = "azure"))]
    open_object_store => storage_lock_object_store::ObjectStoreStorageBuilder
);

from_url_opener!(
    /// `memcached://…` (refused unless `durability=volatile`).
    #[cfg(feature = "memcached")]
    open_memcached => storage_lock_memcached::MemcachedStorageBuilder
);
from_url_opener!(
    /// `dynamodb://…` (an emulator refused unless `durability=volatile`).
    #[cfg(feature = "dynamodb")]
    open_dynamodb => storage_lock_dynamodb::DynamoDbStorageBuilder
);
from_url_opener!(
    /// `zookeeper://…`.
    #[cfg(feature = "zookeeper")]
    open_zookeeper => storage_lock_zookeeper::ZooKeeperStorageBuilder
);

#[cfg(feature = "http")]
fn open_http(url: String) -> Opened {
    Box::pin(async move {
        let storage = storage_lock_client::RemoteStorage::connect(&url).await?;
        Ok(Arc::new(storage) as Arc<dyn Storage>)
    })
}
