//! What the object-store test binaries share: the nonce check, the clock-ahead case, unique
//! names.

use storage_lock_core::{LockRecord, OwnerId, Storage, StorageError, Timestamp};
use storage_lock_object_store::ObjectStoreStorage;

/// ETags are content hashes: writing the same record twice must still give two versions, and
/// a compare-and-set against the first must fail after the second (the nonce in every write).
pub async fn equal_writes_get_distinct_versions(s: ObjectStoreStorage) {
    let key = format!("equal-writes-{:016x}", rand_u64());
    let record = LockRecord {
        owner: OwnerId::from_u128(1),
        count: 1,
        fencing: 1,
        acquired_at: Timestamp::from_millis(1),
        expires_at: Timestamp::from_millis(2),
        holder: None,
    };
    let v1 = storage_lock_testkit::cas(&s)
        .create(&key, &record)
        .await
        .unwrap();
    let v2 = storage_lock_testkit::cas(&s)
        .update(&key, &v1, &record)
        .await
        .unwrap();
    assert_ne!(v1, v2, "two writes of one record share a version");
    let stale = storage_lock_testkit::cas(&s)
        .update(&key, &v1, &record)
        .await;
    assert!(
        matches!(stale, Err(StorageError::Conflict { .. })),
        "{stale:?}"
    );
    assert_eq!(s.get(&key).await.unwrap().unwrap().version, v2);
}

/// A number no other call in this run (or, practically, any other run) returns.
pub fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    RandomState::new().hash_one((
        std::time::SystemTime::now(),
        N.fetch_add(1, Ordering::Relaxed),
    ))
}

/// A second client whose clock runs an hour ahead finds a held lock busy (`clock: observed`):
/// two storages opened on `url`, one of them timing its observations an hour ahead.
pub async fn a_contender_whose_clock_runs_ahead_finds_a_held_lock_busy(url: &str) {
    let holder = ObjectStoreStorage::from_url(url).expect("a valid URL");
    let ahead = ObjectStoreStorage::from_url(url)
        .expect("a valid URL")
        .with_clock(storage_lock_testkit::conformance::Ahead(
            std::time::Duration::from_secs(3600),
        ));
    storage_lock_testkit::conformance::a_contender_whose_clock_runs_ahead_finds_a_held_lock_busy(
        holder, ahead,
    )
    .await;
}
