//! What every SQL dialect shares: the column list, decoding a row into a record, and turning
//! records and times into bind parameters. Integers are `BIGINT`/`INTEGER` (i64) everywhere, the
//! owner is 16 bytes, times are milliseconds since the Unix epoch.

use std::sync::Arc;

use sqlx::{ColumnIndex, Decode, Row, Type};
use storage_lock_core::{
    HolderInfo, LockRecord, OwnerId, StorageError, Stored, Timestamp, Version,
};

/// The record columns, in the order the statements use them.
pub(crate) const COLUMNS: &str = "lock_key, version, owner, count, fencing, acquired_at, expires_at, holder_host, holder_pid, holder_note";

pub(crate) fn millis(t: Timestamp) -> i64 {
    i64::try_from(t.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(any(feature = "postgres", feature = "mysql"))]
/// A time the *server* computed (its clock); it cannot be negative on a sane server, and is
/// read as the epoch if it were.
pub(crate) fn timestamp(v: i64) -> Timestamp {
    Timestamp::from_millis(u64::try_from(v).unwrap_or(0))
}

/// A stored non-negative integer (fencing token, time), or [`StorageError::Corrupt`].
pub(crate) fn stored_u64(key: &str, what: &str, v: i64) -> Result<u64, StorageError> {
    u64::try_from(v).map_err(|_| corrupt(key, format!("{what} is negative ({v})")))
}

/// A stored reentrancy depth, or [`StorageError::Corrupt`].
pub(crate) fn stored_u32(key: &str, what: &str, v: i64) -> Result<u32, StorageError> {
    u32::try_from(v).map_err(|_| corrupt(key, format!("{what} is out of range ({v})")))
}

/// The largest fencing token a `BIGINT`/`INTEGER` column holds (2^63 − 1): the backends'
/// [`storage_lock_core::Capabilities::fencing_bound`].
pub(crate) const FENCING_BOUND: u64 = i64::MAX as u64;

/// A fencing token as a bind parameter (`BIGINT`): tokens beyond 2^63 − 1 cannot be stored.
pub(crate) fn fencing_param(key: &str, fencing: u64) -> Result<i64, StorageError> {
    i64::try_from(fencing).map_err(|_| corrupt(key, "fencing token beyond 2^63 - 1"))
}

/// A stored version: the column holds the version's 64 bits (read as a signed `BIGINT`).
pub(crate) fn version_of(v: i64) -> Version {
    Version::from_u64(v.cast_unsigned())
}

/// A lease in milliseconds, clamped to half of what a BIGINT holds, so that `now + lease`
/// computed by the server cannot overflow (half of `i64::MAX` ms is ~146 million years).
pub(crate) fn lease_millis(lease: std::time::Duration) -> i64 {
    i64::try_from(lease.as_millis()).map_or(i64::MAX / 2, |ms| ms.min(i64::MAX / 2))
}

/// Runs a single-statement write again when the database aborted it as a deadlock victim or a
/// serialization failure (SQLSTATE `40001`, PostgreSQL's `40P01`): the statement was rolled back
/// whole, so running it again is the same as running it once. MySQL/InnoDB picks such victims
/// when a create's locking read of the fencing floor races a sweep that raises it.
pub(crate) async fn retry_aborted<T, F, Fut>(mut run: F) -> Result<T, sqlx::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, sqlx::Error>>,
{
    const ATTEMPTS: u32 = 8;
    let mut attempt = 1;
    loop {
        match run().await {
            Err(sqlx::Error::Database(e))
                if attempt < ATTEMPTS && matches!(e.code().as_deref(), Some("40001" | "40P01")) =>
            {
                tracing::debug!(attempt, error = %e, "write aborted by the database; running it again");
                // Jittered, growing: the other transaction finishes first.
                let micros = (OwnerId::random().as_u128() % 900 + 100) as u64 * u64::from(attempt);
                tokio::time::sleep(std::time::Duration::from_micros(micros)).await;
                attempt += 1;
            }
            result => return result,
        }
    }
}

/// A fresh random version for a write (63 bits, from the owner-id CSPRNG).
pub(crate) fn new_version() -> i64 {
    version_param(&Version::random())
}

/// The version as a bind parameter: its 64 bits as a signed `BIGINT` (the primitives choose
/// 63-bit ones; SQLite's `random()` may fill all 64).
pub(crate) fn version_param(v: &Version) -> i64 {
    v.as_u64().map_or(-1, u64::cast_signed)
}

/// Host, pid and note of a holder as bind parameters.
pub(crate) fn holder_params(h: Option<&HolderInfo>) -> (Option<&str>, Option<i64>, Option<&str>) {
    match h {
        Some(h) => (
            Some(h.host.as_str()),
            Some(i64::from(h.pid)),
            h.note.as_deref(),
        ),
        None => (None, None, None),
    }
}

pub(crate) fn corrupt(key: &str, reason: impl std::fmt::Display) -> StorageError {
    StorageError::Corrupt {
        key: key.to_owned(),
        reason: reason.to_string(),
    }
}

/// The holder columns (`holder_host`, `holder_pid`, `holder_note`) at `first..first + 3` of a
/// row, as the holder info they describe (none without a host).
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn holder_at<'r, R>(row: &'r R, first: usize) -> Option<Arc<HolderInfo>>
where
    R: Row,
    usize: ColumnIndex<R>,
    Option<i64>: Decode<'r, R::Database> + Type<R::Database>,
    Option<String>: Decode<'r, R::Database> + Type<R::Database>,
{
    let host = row.try_get::<Option<String>, _>(first).ok().flatten()?;
    let pid: Option<i64> = row.try_get(first + 1).ok().flatten();
    Some(Arc::new(HolderInfo {
        host,
        pid: pid.and_then(|p| u32::try_from(p).ok()).unwrap_or(0),
        note: row.try_get(first + 2).ok().flatten(),
    }))
}

/// The outcome of an acquisition from a result row laid out as
/// `(_, fencing, count, expires_at, holder_host, holder_pid, holder_note, now_ms)`: the grant if
/// `acquired`, else the holder's record as the busy answer.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn acquire_outcome<'r, R>(
    key: &str,
    row: &'r R,
    acquired: bool,
) -> Result<storage_lock_core::AcquireOutcome, StorageError>
where
    R: Row,
    usize: ColumnIndex<R>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
    Option<i64>: Decode<'r, R::Database> + Type<R::Database>,
    Option<String>: Decode<'r, R::Database> + Type<R::Database>,
{
    use storage_lock_core::AcquireOutcome;
    let int = |i: usize| row.try_get::<i64, _>(i).map_err(|e| corrupt(key, e));
    Ok(if acquired {
        AcquireOutcome::Acquired {
            fencing: stored_u64(key, "fencing", int(1)?)?,
            count: stored_u32(key, "count", int(2)?)?,
            expires_at: Timestamp::from_millis(stored_u64(key, "expires_at", int(3)?)?),
        }
    } else {
        AcquireOutcome::Busy {
            expires_at: timestamp(int(3)?),
            now: timestamp(int(7)?),
            holder: holder_at(row, 4),
        }
    })
}

/// Decodes the [`COLUMNS`] of a row.
pub(crate) fn decode<'r, R>(key: &str, row: &'r R) -> Result<Stored, StorageError>
where
    R: Row,
    &'static str: ColumnIndex<R>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
    Option<i64>: Decode<'r, R::Database> + Type<R::Database>,
    Vec<u8>: Decode<'r, R::Database> + Type<R::Database>,
    Option<String>: Decode<'r, R::Database> + Type<R::Database>,
{
    let int = |col: &'static str| row.try_get::<i64, _>(col).map_err(|e| corrupt(key, e));
    let owner: Vec<u8> = row.try_get("owner").map_err(|e| corrupt(key, e))?;
    let host: Option<String> = row.try_get("holder_host").map_err(|e| corrupt(key, e))?;
    let holder = match host {
        Some(host) => {
            let pid: Option<i64> = row.try_get("holder_pid").map_err(|e| corrupt(key, e))?;
            Some(Arc::new(HolderInfo {
                host,
                pid: pid.and_then(|p| u32::try_from(p).ok()).unwrap_or(0),
                note: row.try_get("holder_note").map_err(|e| corrupt(key, e))?,
            }))
        }
        None => None,
    };
    Ok(Stored {
        record: LockRecord {
            owner: OwnerId::from_bytes(&owner)
                .ok_or_else(|| corrupt(key, "owner is not 16 bytes"))?,
            count: u32::try_from(int("count")?).map_err(|e| corrupt(key, e))?,
            fencing: u64::try_from(int("fencing")?).map_err(|e| corrupt(key, e))?,
            acquired_at: Timestamp::from_millis(stored_u64(
                key,
                "acquired_at",
                int("acquired_at")?,
            )?),
            expires_at: Timestamp::from_millis(stored_u64(key, "expires_at", int("expires_at")?)?),
            holder,
        },
        version: version_of(int("version")?),
    })
}

/// A renewal's outcome from the `RETURNING expires_at` row of a dialect that has one.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn renew_outcome<'r, R>(
    key: &str,
    row: Option<&'r R>,
) -> Result<storage_lock_core::RenewOutcome, StorageError>
where
    R: Row,
    usize: ColumnIndex<R>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
{
    renew_outcome_at(key, row, 0)
}

/// [`renew_outcome`] with the expiry in column `column`.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn renew_outcome_at<'r, R>(
    key: &str,
    row: Option<&'r R>,
    column: usize,
) -> Result<storage_lock_core::RenewOutcome, StorageError>
where
    R: Row,
    usize: ColumnIndex<R>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
{
    Ok(match row {
        Some(r) => storage_lock_core::RenewOutcome::Renewed {
            expires_at: Timestamp::from_millis(stored_u64(
                key,
                "expires_at",
                r.try_get(column).map_err(|e| corrupt(key, e))?,
            )?),
        },
        None => storage_lock_core::RenewOutcome::NotHeld,
    })
}

/// A release's outcome from the `RETURNING count, fencing` row of a dialect that has one.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn release_outcome<'r, R>(
    key: &str,
    row: Option<&'r R>,
) -> Result<storage_lock_core::ReleaseOutcome, StorageError>
where
    R: Row,
    usize: ColumnIndex<R>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
{
    Ok(match row {
        Some(r) => storage_lock_core::ReleaseOutcome::Released {
            remaining: stored_u32(key, "count", r.try_get(0).map_err(|e| corrupt(key, e))?)?,
            fencing: stored_u64(key, "fencing", r.try_get(1).map_err(|e| corrupt(key, e))?)?,
        },
        None => storage_lock_core::ReleaseOutcome::NotHeld,
    })
}
