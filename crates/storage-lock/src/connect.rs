//! Opening a storage from a URL.
//!
//! The registry is one table, `SCHEMES`: a scheme and the function that opens it. A backend
//! behind a feature adds one `#[cfg(feature = "…")]` line there.

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
    ("s3", open_s3),
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

/// `sqlite://PATH[?table=NAME]`: `sqlite:///abs/file.db` or `sqlite://relative/file.db`.
#[cfg(feature = "sqlite")]
fn open_sqlite(url: String) -> Opened {
    Box::pin(async move {
        let invalid = |reason: &str| ConnectError::InvalidUrl {
            url: redact_url(&url),
            reason: reason.to_owned(),
        };
        let rest = url
            .get("sqlite:".len()..)
            .and_then(|r| r.strip_prefix("//"))
            .ok_or_else(|| invalid("expected sqlite://PATH"))?;
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        if path.is_empty() {
            return Err(invalid("the database path is empty"));
        }
        let mut builder = storage_lock_sql::SqliteStorage::builder().path(path);
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("table", table)) => {
                    storage_lock_sql::validate_table_name(table)
                        .map_err(|e| invalid(&e.to_string()))?;
                    builder = builder.table(table);
                }
                Some(("durability", v)) => builder = builder.allow_volatile(volatile(&url, v)?),
                _ => {
                    return Err(invalid(&format!(
                        "unknown option {pair:?} (known: table, durability)"
                    )));
                }
            }
        }
        Ok(Arc::new(builder.open().await?) as Arc<dyn Storage>)
    })
}

/// Splits storage-lock's own query parameters (`ours`, percent-decoded) off a URL parsed by
/// [`url::Url`]; the rest stays for the driver, but only options in `driver` are accepted: a
/// misspelled option (`?tabel=x`) is an error, never silently ignored.
#[cfg(any(feature = "postgres", feature = "mysql", feature = "redis"))]
fn take_params(
    raw: &str,
    ours: &[&str],
    driver: &[&str],
) -> Result<(String, Vec<(String, String)>), ConnectError> {
    let invalid = |reason: String| ConnectError::InvalidUrl {
        url: redact_url(raw),
        reason,
    };
    let mut url = url::Url::parse(raw).map_err(|e| invalid(e.to_string()))?;
    let (mut kept, mut taken) = (Vec::new(), Vec::new());
    for (k, v) in url.query_pairs() {
        if ours.contains(&&*k) {
            taken.push((k.into_owned(), v.into_owned()));
        } else if driver.contains(&&*k) {
            kept.push((k.into_owned(), v.into_owned()));
        } else {
            let known = ours.iter().chain(driver).copied().collect::<Vec<_>>();
            return Err(invalid(format!(
                "unknown option {k:?} (known: {})",
                known.join(", ")
            )));
        }
    }
    if kept.is_empty() {
        url.set_query(None);
    } else {
        url.query_pairs_mut().clear().extend_pairs(kept);
    }
    Ok((url.into(), taken))
}

/// A driver's verdict on its URL as [`ConnectError::InvalidUrl`].
#[cfg(any(feature = "postgres", feature = "mysql", feature = "redis"))]
fn checked_driver_url(url: &str, verdict: Result<(), String>) -> Result<(), ConnectError> {
    verdict.map_err(|reason| ConnectError::InvalidUrl {
        url: redact_url(url),
        reason,
    })
}

#[cfg(any(
    feature = "sqlite",
    feature = "postgres",
    feature = "mysql",
    feature = "redis"
))]
/// `durability=volatile` accepts a server that can forget writes; `durability=durable` is the
/// default; `durability=unverified` opens as the default does (a server whose settings cannot
/// be read opens as [`storage_lock_core::Durability::Unverified`]) and tells the CLI that the
/// operator made sure of them, so it neither warns nor fails `check`.
fn volatile(url: &str, value: &str) -> Result<bool, ConnectError> {
    match value {
        "volatile" => Ok(true),
        "durable" | "unverified" => Ok(false),
        other => Err(ConnectError::InvalidUrl {
            url: redact_url(url),
            reason: format!("durability must be durable, unverified or volatile, not {other:?}"),
        }),
    }
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
fn checked_identifier(url: &str, value: String) -> Result<String, ConnectError> {
    storage_lock_sql::validate_table_name(&value).map_err(|e| ConnectError::InvalidUrl {
        url: redact_url(url),
        reason: e.to_string(),
    })?;
    Ok(value)
}

/// `postgres://user@host:port/db[?table=NAME&schema=NAME&durability=volatile&…driver options]`.
#[cfg(feature = "postgres")]
fn open_postgres(url: String) -> Opened {
    Box::pin(async move {
        let (driver_url, params) =
            take_params(&url, &["table", "schema", "durability"], PG_OPTIONS)?;
        checked_driver_url(&url, storage_lock_sql::postgres::validate_url(&driver_url))?;
        let mut b = storage_lock_sql::PostgresStorage::builder().url(driver_url);
        for (k, v) in params {
            b = match k.as_str() {
                "durability" => b.allow_volatile(volatile(&url, &v)?),
                "table" => b.table(checked_identifier(&url, v)?),
                _ => b.schema(checked_identifier(&url, v)?),
            };
        }
        Ok(Arc::new(b.open().await?) as Arc<dyn Storage>)
    })
}

/// The PostgreSQL driver's URL options passed through.
#[cfg(feature = "postgres")]
const PG_OPTIONS: &[&str] = &[
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "options",
    "application_name",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "statement-cache-capacity",
];

/// `mysql://user:password@host:port/db[?table=NAME&durability=volatile&…driver options]`.
/// The session time zone is pinned to UTC (expiry arithmetic depends on it), so `timezone` is
/// refused.
#[cfg(feature = "mysql")]
fn open_mysql(url: String) -> Opened {
    Box::pin(async move {
        let (driver_url, params) = take_params(&url, &["table", "durability"], MYSQL_OPTIONS)?;
        let driver_url = driver_url.replacen("mariadb:", "mysql:", 1);
        checked_driver_url(&url, storage_lock_sql::mysql::validate_url(&driver_url))?;
        let mut b = storage_lock_sql::MysqlStorage::builder().url(driver_url);
        for (k, v) in params {
            b = match k.as_str() {
                "durability" => b.allow_volatile(volatile(&url, &v)?),
                _ => b.table(checked_identifier(&url, v)?),
            };
        }
        Ok(Arc::new(b.open().await?) as Arc<dyn Storage>)
    })
}

/// The MySQL driver's URL options passed through (not `timezone`: see [`open_mysql`]).
#[cfg(feature = "mysql")]
const MYSQL_OPTIONS: &[&str] = &[
    "ssl-mode",
    "ssl-ca",
    "ssl-cert",
    "ssl-key",
    "sslmode",
    "sslca",
    "charset",
    "collation",
    "socket",
    "statement-cache-capacity",
];

/// `redis://[:password@]host:port[/db][?prefix=PREFIX&durability=volatile&protocol=resp3]`.
#[cfg(feature = "redis")]
fn open_redis(url: String) -> Opened {
    Box::pin(async move {
        let (driver_url, params) = take_params(&url, &["prefix", "durability"], &["protocol"])?;
        checked_driver_url(&url, storage_lock_redis::validate_url(&driver_url))?;
        let mut b = storage_lock_redis::RedisStorage::builder().url(driver_url);
        for (k, v) in params {
            b = match k.as_str() {
                "durability" => b.allow_volatile(volatile(&url, &v)?),
                _ => b.prefix(v),
            };
        }
        Ok(Arc::new(b.open().await?) as Arc<dyn Storage>)
    })
}

/// A backend's own URL check as [`ConnectError::InvalidUrl`].
#[cfg(any(feature = "etcd", feature = "nats", feature = "object-store"))]
fn backend_url<B>(url: &str, parsed: Result<B, StorageError>) -> Result<B, ConnectError> {
    parsed.map_err(|e| ConnectError::InvalidUrl {
        url: redact_url(url),
        reason: match e {
            StorageError::Config { reason, .. } => reason,
            other => other.to_string(),
        },
    })
}

#[cfg(feature = "etcd")]
fn open_etcd(url: String) -> Opened {
    Box::pin(async move {
        let builder = backend_url(&url, storage_lock_etcd::EtcdStorageBuilder::from_url(&url))?;
        Ok(Arc::new(builder.open().await?) as Arc<dyn Storage>)
    })
}

#[cfg(feature = "nats")]
fn open_nats(url: String) -> Opened {
    Box::pin(async move {
        let builder = backend_url(&url, storage_lock_nats::NatsStorageBuilder::from_url(&url))?;
        Ok(Arc::new(builder.open().await?) as Arc<dyn Storage>)
    })
}

#[cfg(feature = "object-store")]
fn open_s3(url: String) -> Opened {
    Box::pin(async move {
        let storage = backend_url(
            &url,
            storage_lock_object_store::ObjectStoreStorage::from_url(&url),
        )?;
        Ok(Arc::new(storage) as Arc<dyn Storage>)
    })
}

#[cfg(feature = "http")]
fn open_http(url: String) -> Opened {
    Box::pin(async move {
        let storage = storage_lock_client::RemoteStorage::connect(&url).await?;
        Ok(Arc::new(storage) as Arc<dyn Storage>)
    })
}
