//! Both suites against [`SqliteStorage`] (one fresh database file per test), through its
//! one-statement lock operations and through the defaults on its primitives.

use storage_lock_sql::SqliteStorage;

async fn sqlite() -> SqliteStorage {
    let dir = tempfile::tempdir().expect("temp dir").keep();
    SqliteStorage::open(dir.join("locks.db"))
        .await
        .expect("open sqlite")
}

storage_lock_testkit::storage_lock_suites!(sqlite);

/// Regression: a corrupt row (written by hand, by another tool, by a bug) is a typed
/// `StorageError::Corrupt` naming the key — never a panic in the driver's `Row::get`, never a
/// silent wrap of a negative number.
#[tokio::test]
async fn corrupt_rows_are_typed_errors_not_panics() {
    use storage_lock_core::{PageRequest, Storage, StorageError};

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    let s = SqliteStorage::open(&path).await.unwrap();
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    for (key, count, fencing) in [
        ("neg", "-1", "3"),
        ("text", "1", "'abc'"),
        ("big", "1", "-5"),
    ] {
        sqlx::query(&format!(
            "INSERT INTO storage_lock VALUES ('{key}', 1, zeroblob(16), {count}, {fencing}, 0, 0, NULL, NULL, NULL)"
        ))
        .execute(&pool)
        .await
        .unwrap();
        let err = s.get(key).await.unwrap_err();
        assert!(
            matches!(&err, StorageError::Corrupt { key: k, .. } if k == key),
            "{key}: {err:?}"
        );
    }
    // A takeover of the row whose token is negative: the new token (-4) was wrapped to a huge
    // u64 by an `as` cast; now it is reported.
    let req = storage_lock_core::AcquireRequest {
        owner: storage_lock_core::OwnerId::random(),
        lease: std::time::Duration::from_secs(5),
        holder: None,
        reentrant: false,
    };
    let err = s.try_acquire("big", &req).await.unwrap_err();
    assert!(matches!(err, StorageError::Corrupt { .. }), "{err:?}");
    let err = s.list("", &PageRequest::default()).await.unwrap_err();
    assert!(matches!(err, StorageError::Corrupt { .. }), "{err:?}");
}
