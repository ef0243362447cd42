//! The storage layer's error type.

use std::error::Error as StdError;

use super::Stored;

/// What a [`crate::Storage`] call can fail with.
///
/// Conflicts are **typed**: backends map their native signal (affected rows, a failed
/// transaction compare, a `412 Precondition Failed`) to [`StorageError::AlreadyExists`] or
/// [`StorageError::Conflict`]; nobody matches error text.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// `create` found a record under the key. Made by [`Self::already_exists`].
    #[error("a record already exists for key {key:?}")]
    #[non_exhaustive]
    AlreadyExists {
        /// The key.
        key: String,
        /// The record found, when the storage's refusal carried it ([`Self::with_current`]).
        current: Option<Box<Stored>>,
    },
    /// A conditional `update`/`delete` found another version (or no record). Made by
    /// [`Self::conflict`].
    #[error("the record for key {key:?} changed (version conflict)")]
    #[non_exhaustive]
    Conflict {
        /// The key.
        key: String,
        /// The record as it is now, when the storage's refusal carried it
        /// ([`Self::with_current`]).
        current: Option<Box<Stored>>,
    },
    /// The backend does not offer this operation.
    #[error("{backend} does not support {operation}")]
    Unsupported {
        /// The backend's name.
        backend: String,
        /// The operation.
        operation: &'static str,
    },
    /// The storage is configured so that it cannot be used (a bad table name, a missing path, an
    /// unknown URL option), or so that it cannot keep the lock's guarantees (a server that can
    /// forget acknowledged writes, unless that was explicitly accepted). Retrying cannot help.
    #[error("{backend}: {reason}")]
    Config {
        /// The backend's name.
        backend: String,
        /// What is wrong, and how to fix it (never credentials).
        reason: String,
    },
    /// The storage refused the caller's credentials, or they do not allow this operation (a
    /// lock server's 401 or 403). Retrying cannot help until the credentials change; waits do
    /// not retry it.
    #[error("{backend}: not allowed: {reason}")]
    Denied {
        /// The backend's name.
        backend: String,
        /// Why (never the credentials themselves).
        reason: String,
    },
    /// A stored record could not be decoded.
    #[error("the record for key {key:?} is malformed: {reason}")]
    Corrupt {
        /// The key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The backend could not be reached or failed; the outcome of a write is unknown.
    #[error("{backend} failed during {operation}: {source}")]
    Backend {
        /// The backend's name.
        backend: String,
        /// The operation that failed.
        operation: &'static str,
        /// The driver's error.
        #[source]
        source: Box<dyn StdError + Send + Sync>,
    },
}

impl StorageError {
    /// A [`StorageError::Backend`] from a driver error.
    pub fn backend(
        backend: impl Into<String>,
        operation: &'static str,
        source: impl Into<Box<dyn StdError + Send + Sync>>,
    ) -> Self {
        Self::Backend {
            backend: backend.into(),
            operation,
            source: source.into(),
        }
    }

    /// A [`StorageError::Config`].
    pub fn config(backend: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Config {
            backend: backend.into(),
            reason: reason.into(),
        }
    }

    /// A [`StorageError::AlreadyExists`]: `create` found a record under `key`.
    pub fn already_exists(key: impl Into<String>) -> Self {
        Self::AlreadyExists {
            key: key.into(),
            current: None,
        }
    }

    /// A [`StorageError::Conflict`]: a conditional write or delete of `key` found another
    /// version, or no record.
    pub fn conflict(key: impl Into<String>) -> Self {
        Self::Conflict {
            key: key.into(),
            current: None,
        }
    }

    /// A compare-and-set conflict that also says what the record is now, for a storage whose
    /// refusal carries it (DynamoDB's `ReturnValuesOnConditionCheckFailure`, a transaction's
    /// failure branch that reads the key): the default lock operations decide their retry on
    /// it as on a read, so a lost race costs one request, not two. `current` must be what the
    /// storage held when it refused, read as [`crate::Storage::get`] would read it. Other
    /// errors are returned unchanged.
    ///
    /// # Examples
    /// ```
    /// use storage_lock_core::{LockRecord, OwnerId, StorageError, Stored, Timestamp, Version};
    ///
    /// let record = LockRecord {
    ///     owner: OwnerId::from_u128(7),
    ///     count: 1,
    ///     fencing: 3,
    ///     acquired_at: Timestamp::from_millis(0),
    ///     expires_at: Timestamp::from_millis(30_000),
    ///     holder: None,
    /// };
    /// let current = Stored { record, version: Version::from_u64(9) };
    /// let e = StorageError::conflict("jobs/nightly").with_current(current.clone());
    /// assert!(e.is_cas_conflict());
    /// assert_eq!(e.current(), Some(&current));
    /// ```
    #[must_use]
    pub fn with_current(mut self, stored: Stored) -> Self {
        if let Self::AlreadyExists { current, .. } | Self::Conflict { current, .. } = &mut self {
            *current = Some(Box::new(stored));
        }
        self
    }

    /// The record a compare-and-set conflict carried ([`Self::with_current`]), if any.
    pub fn current(&self) -> Option<&Stored> {
        match self {
            Self::AlreadyExists { current, .. } | Self::Conflict { current, .. } => {
                current.as_deref()
            }
            _ => None,
        }
    }

    /// Whether this is a typed CAS conflict ([`Self::Conflict`] or [`Self::AlreadyExists`]).
    pub fn is_cas_conflict(&self) -> bool {
        matches!(self, Self::Conflict { .. } | Self::AlreadyExists { .. })
    }
}

/// The URL with any password — in the authority, or a `token` / `password` query option —
/// replaced by `***`, for errors, logs and `Debug` output: backends and tools never show a
/// connection URL any other way.
///
/// ```
/// assert_eq!(
///     storage_lock_core::redact_url("postgres://app:s3cret@db:5432/locks"),
///     "postgres://app:***@db:5432/locks"
/// );
/// assert_eq!(
///     storage_lock_core::redact_url("http://locks:7420?token=s3cret&x=1"),
///     "http://locks:7420?token=***&x=1"
/// );
/// ```
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let tail = redact_query(tail);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            let masked = if userinfo.contains(':') {
                format!("{user}:***")
            } else {
                user.to_owned()
            };
            format!("{scheme}://{masked}@{host}{tail}")
        }
        None => format!("{scheme}://{authority}{tail}"),
    }
}

/// `path?query#fragment` with the values of secret query options masked.
fn redact_query(tail: &str) -> String {
    let Some((path, query)) = tail.split_once('?') else {
        return tail.to_owned();
    };
    let (query, fragment) = query
        .split_once('#')
        .map_or((query, None), |(q, f)| (q, Some(f)));
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((k, _)) if matches!(k.to_ascii_lowercase().as_str(), "token" | "password") => {
                format!("{k}=***")
            }
            _ => pair.to_owned(),
        })
        .collect();
    let mut out = format!("{path}?{}", pairs.join("&"));
    if let Some(f) = fragment {
        out.push('#');
        out.push_str(f);
    }
    out
}
