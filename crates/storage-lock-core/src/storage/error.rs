//! The storage layer's error type.

use std::error::Error as StdError;

/// What a [`crate::Storage`] call can fail with.
///
/// Conflicts are **typed**: backends map their native signal (affected rows, a failed
/// transaction compare, a `412 Precondition Failed`) to [`StorageError::AlreadyExists`] or
/// [`StorageError::Conflict`]; nobody matches error text.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// `create` found a record under the key.
    #[error("a record already exists for key {key:?}")]
    AlreadyExists {
        /// The key.
        key: String,
    },
    /// A conditional `update`/`delete` found another version (or no record).
    #[error("the record for key {key:?} changed (version conflict)")]
    Conflict {
        /// The key.
        key: String,
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
