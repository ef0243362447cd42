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
    let err = s.acquire_once("big", &req).await.unwrap_err();
    assert!(matches!(err, StorageError::Corrupt { .. }), "{err:?}");
    // One bad record stays one bad record: a listing (and a sweep, built on it) reports the
    // corrupt rows by key and goes on with the rest (it failed as a whole).
    let good = s.acquire_once("good", &req).await.unwrap();
    assert!(matches!(
        good,
        storage_lock_core::AcquireOutcome::Acquired { .. }
    ));
    let page = s
        .list(
            "",
            &PageRequest {
                after: None,
                limit: 2,
            },
        )
        .await
        .unwrap();
    let mut keys: Vec<&str> = page.entries.iter().map(|(k, _)| k.as_str()).collect();
    keys.extend(page.corrupt.iter().map(|(k, _)| k.as_str()));
    keys.sort_unstable();
    assert_eq!(keys, ["big", "good"], "{page:?}");
    let rest = s
        .list(
            "",
            &PageRequest {
                after: page.next.clone(),
                limit: 10,
            },
        )
        .await
        .unwrap();
    let corrupt: Vec<&str> = page
        .corrupt
        .iter()
        .chain(&rest.corrupt)
        .map(|(k, _)| k.as_str())
        .collect();
    assert_eq!(corrupt, ["big", "neg", "text"], "{rest:?}");
    assert!(rest.corrupt.iter().all(|(_, why)| !why.is_empty()));
    use storage_lock_core::StorageExt;
    s.sweep("", std::time::Duration::ZERO)
        .await
        .expect("a sweep skips corrupt records");
}

/// Expiry is judged on the host's boot clock (`CLOCK_BOOTTIME`) plus an offset agreed once per
/// boot through the file, not on each process's wall clock (a forward step of the wall clock
/// larger than a hold's time left gave two holders). Two storages on one file read the same
/// clock, close to the wall clock.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn expiry_clock_is_boot_time_plus_one_offset_per_boot() {
    use storage_lock_core::{Clock, Storage, SystemClock, boot_time};

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    let a = SqliteStorage::open(&path).await.unwrap();
    let b = SqliteStorage::open(&path).await.unwrap();
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    let offset: i64 = sqlx::query_scalar("SELECT offset_ms FROM storage_lock_boot")
        .fetch_one(&pool)
        .await
        .unwrap();
    for s in [&a, &b] {
        let up = i64::try_from(boot_time().unwrap().as_millis()).unwrap();
        let now = i64::try_from(s.now().await.unwrap().as_millis()).unwrap();
        let up_after = i64::try_from(boot_time().unwrap().as_millis()).unwrap();
        assert!(
            now >= up + offset && now <= up_after + offset,
            "not boot time + offset"
        );
    }
    let wall = i64::try_from(SystemClock.now().as_millis()).unwrap();
    let now = i64::try_from(a.now().await.unwrap().as_millis()).unwrap();
    assert!((now - wall).abs() < 5_000, "far from the wall clock");
}

/// After a reboot every hold recorded before it is over (its holder was a process of the
/// earlier boot), and the next token is still higher.
#[cfg(target_os = "linux")]
#[tokio::test]
async fn holds_from_an_earlier_boot_are_over() {
    use std::time::Duration;
    use storage_lock_core::{AcquireOutcome, AcquireRequest, OwnerId, Storage};

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    let req = || AcquireRequest {
        owner: OwnerId::random(),
        lease: Duration::from_secs(3600),
        holder: None,
        reentrant: false,
    };
    let s = SqliteStorage::open(&path).await.unwrap();
    let AcquireOutcome::Acquired { fencing, .. } = s.acquire_once("k", &req()).await.unwrap()
    else {
        panic!("free")
    };
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    // The same boot: the hold stands.
    let again = SqliteStorage::open(&path).await.unwrap();
    assert!(matches!(
        again.acquire_once("k", &req()).await.unwrap(),
        AcquireOutcome::Busy { .. }
    ));
    sqlx::query("UPDATE storage_lock_boot SET boot_id = 'an-earlier-boot'")
        .execute(&pool)
        .await
        .unwrap();
    let rebooted = SqliteStorage::open(&path).await.unwrap();
    let next = rebooted.acquire_once("k", &req()).await.unwrap();
    assert!(
        matches!(next, AcquireOutcome::Acquired { fencing: f, .. } if f == fencing + 1),
        "{next:?}"
    );
}

/// A release in one storage (as in one process) wakes a waiter armed on another storage of the
/// same file (another process), through the `-wake` directory next to the file: the armed
/// notification completes although the two share nothing in memory. Without the wake-up it
/// would never complete (the waiter would back off instead).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_a_waiter_of_another_storage_on_the_same_file() {
    use std::time::Duration;
    use storage_lock_core::{AcquireOutcome, AcquireRequest, OwnerId, Storage};

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locks.db");
    let (holder, waiter) = (
        SqliteStorage::open(&path).await.unwrap(),
        SqliteStorage::open(&path).await.unwrap(),
    );
    assert!(waiter.capabilities().change_notifications);
    assert!(dir.path().join("locks.db-wake").is_dir());
    let owner = OwnerId::random();
    let req = AcquireRequest {
        owner,
        lease: Duration::from_secs(30),
        holder: None,
        reentrant: false,
    };
    // The first arm starts the watcher, which wakes everyone once when it starts listening:
    // get that out of the way so that only real signals complete the waits below.
    let warm_up = waiter.wait_for_change("warm-up").await.unwrap();
    let _ = tokio::time::timeout(Duration::from_millis(200), warm_up.changed()).await;
    for key in ["a", "jobs/7", "b"] {
        assert!(matches!(
            holder.acquire_once(key, &req).await.unwrap(),
            AcquireOutcome::Acquired { .. }
        ));
        let armed = waiter.wait_for_change(key).await.unwrap();
        assert!(armed.is_supported());
        holder.release(key, owner).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), armed.changed())
            .await
            .unwrap_or_else(|_| panic!("the release of {key:?} did not wake the other storage"));
    }
}
