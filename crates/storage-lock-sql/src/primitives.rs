//! The CAS primitives, written once for every SQL dialect.
//!
//! Each dialect's `Statements` provides `get`, `create`, `update`, `delete` and `list` with the
//! same parameters in the same textual order:
//!
//! | statement | parameters |
//! |---|---|
//! | `get` | key |
//! | `create` (insert iff absent; 1 row affected iff created) | key, version, owner, count, fencing, acquired_at, expires_at, host, pid, note |
//! | `update` (iff the version matches; 1 row affected iff it did) | version, owner, count, fencing, acquired_at, expires_at, host, pid, note, key, expected version |
//! | `delete` (iff the version matches) | key, expected version |
//! | `list` | prefix, prefix, after, limit + 1 |
//!
//! An `update` that leaves a lock key free (count 0: a force release) calls the dialect's
//! `announce_free(key)` afterwards, so that waiters hear of it as they do of a release
//! (best effort: a lost announcement leaves them to their periodic re-check).
//!
//! Versions are fresh random 63-bit numbers chosen by the client for every write, so a version
//! never repeats for a key (not even after the row was deleted and recreated) and no dialect
//! needs `RETURNING` for the primitives.

/// `impl Storage for $ty { get, list, primitives, …the rest given }` and `impl Primitives for
/// $ty { create, update, delete }` for a type
/// with `pool` and `sql` (a `Statements`) fields and an inherent `async fn announce_free(&self,
/// key: &str)`, with `err(op)` mapping driver errors in scope.
/// (One macro emits the whole impl so that `#[async_trait]` sees every method.)
macro_rules! impl_sql_storage {
    ($ty:ty { $($rest:tt)* }) => {
        #[async_trait::async_trait]
        impl storage_lock_core::Storage for $ty {
        async fn get(
            &self,
            key: &str,
        ) -> Result<Option<storage_lock_core::Stored>, storage_lock_core::StorageError> {
            let row = sqlx::query(&self.sql.get)
                .bind(key)
                .fetch_optional(&self.pool)
                .await
                .map_err(err("get"))?;
            row.map(|r| crate::row::decode(key, &r)).transpose()
        }

        async fn list(
            &self,
            prefix: &str,
            page: &storage_lock_core::PageRequest,
        ) -> Result<storage_lock_core::Page, storage_lock_core::StorageError> {
            use sqlx::Row as _;
            let limit = page.effective_limit();
            let rows = sqlx::query(&self.sql.list)
                .bind(prefix)
                .bind(prefix)
                .bind(page.after.as_deref().unwrap_or(""))
                .bind(i64::try_from(limit).unwrap_or(i64::MAX).saturating_add(1))
                .fetch_all(&self.pool)
                .await
                .map_err(err("list"))?;
            // A row that does not decode is reported in the page, not fatal to the listing.
            let rows = rows
                .iter()
                .map(|r| {
                    let key: String = r
                        .try_get("lock_key")
                        .map_err(|e| crate::row::corrupt("?", e))?;
                    let stored = crate::row::decode(&key, r).map_err(|e| e.to_string());
                    Ok((key, stored))
                })
                .collect::<Result<Vec<_>, storage_lock_core::StorageError>>()?;
            Ok(storage_lock_core::Page::from_sorted_results(rows, limit))
        }

        fn primitives(&self) -> Option<&dyn storage_lock_core::Primitives> {
            Some(self)
        }

        $($rest)*
        }

        #[async_trait::async_trait]
        impl storage_lock_core::Primitives for $ty {
        async fn create(
            &self,
            key: &str,
            record: &storage_lock_core::LockRecord,
        ) -> Result<storage_lock_core::Version, storage_lock_core::StorageError> {
            let version = crate::row::new_version();
            let (host, pid, note) = crate::row::holder_params(record.holder.as_deref());
            let fencing = crate::row::fencing_param(key, record.fencing)?;
            let done = crate::row::retry_aborted(|| {
                sqlx::query(&self.sql.create)
                    .bind(key)
                    .bind(version)
                    .bind(record.owner.to_bytes().to_vec())
                    .bind(i64::from(record.count))
                    .bind(fencing)
                    .bind(crate::row::millis(record.acquired_at))
                    .bind(crate::row::millis(record.expires_at))
                    .bind(host)
                    .bind(pid)
                    .bind(note)
                    .execute(&self.pool)
            })
            .await
            .map_err(err("create"))?;
            if done.rows_affected() == 1 {
                Ok(crate::row::version_of(version))
            } else {
                Err(storage_lock_core::StorageError::already_exists(key))
            }
        }

        async fn update(
            &self,
            key: &str,
            expected: &storage_lock_core::Version,
            record: &storage_lock_core::LockRecord,
        ) -> Result<storage_lock_core::Version, storage_lock_core::StorageError> {
            let version = crate::row::new_version();
            let (host, pid, note) = crate::row::holder_params(record.holder.as_deref());
            let fencing = crate::row::fencing_param(key, record.fencing)?;
            let done = crate::row::retry_aborted(|| {
                sqlx::query(&self.sql.update)
                    .bind(version)
                    .bind(record.owner.to_bytes().to_vec())
                    .bind(i64::from(record.count))
                    .bind(fencing)
                    .bind(crate::row::millis(record.acquired_at))
                    .bind(crate::row::millis(record.expires_at))
                    .bind(host)
                    .bind(pid)
                    .bind(note)
                    .bind(key)
                    .bind(crate::row::version_param(expected))
                    .execute(&self.pool)
            })
            .await
            .map_err(err("update"))?;
            if done.rows_affected() == 1 {
                // A write that leaves a lock key free (a force release) wakes its waiters like
                // a release does.
                if record.count == 0 && !storage_lock_core::storage::ops::is_reserved_key(key) {
                    self.announce_free(key).await;
                }
                Ok(crate::row::version_of(version))
            } else {
                Err(storage_lock_core::StorageError::conflict(key))
            }
        }

        async fn delete(
            &self,
            key: &str,
            expected: &storage_lock_core::Version,
        ) -> Result<(), storage_lock_core::StorageError> {
            let done = crate::row::retry_aborted(|| {
                sqlx::query(&self.sql.delete)
                    .bind(key)
                    .bind(crate::row::version_param(expected))
                    .execute(&self.pool)
            })
            .await
            .map_err(err("delete"))?;
            if done.rows_affected() == 1 {
                Ok(())
            } else {
                Err(storage_lock_core::StorageError::conflict(key))
            }
        }
        }
    };
}

pub(crate) use impl_sql_storage;
