//! Both suites against [`PostgresStorage`] on the server named by `STORAGE_LOCK_POSTGRES_URL`
//! (`scripts/services.sh` starts one and sets it). The tests share one table; each uses keys
//! under a prefix of its own.

use storage_lock_sql::PostgresStorage;

async fn postgres() -> PostgresStorage {
    let url = std::env::var("STORAGE_LOCK_POSTGRES_URL")
        .expect("STORAGE_LOCK_POSTGRES_URL must name a PostgreSQL server (run scripts/test.sh)");
    PostgresStorage::builder()
        .url(url)
        .table("storage_lock_suite")
        .open()
        .await
        .expect("connect to PostgreSQL")
}

storage_lock_testkit::storage_lock_suites!(postgres);

/// Regression: an acquisition whose statement took its snapshot before a sweep raised the
/// fencing floor and deleted the key's tombstone must still see the raised floor (it read the
/// floor from its snapshot and re-issued token 1). The acquisition is held between its snapshot
/// and its floor read by a lock on the version sequence (`nextval` comes first in its row).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisition_delayed_past_a_sweep_gets_a_new_token() {
    use std::time::Duration;
    use storage_lock_core::{AcquireOutcome, AcquireRequest, OwnerId, Storage, StorageExt};

    let url = std::env::var("STORAGE_LOCK_POSTGRES_URL")
        .expect("STORAGE_LOCK_POSTGRES_URL must name a PostgreSQL server (run scripts/test.sh)");
    let table = format!("sl_race_{:08x}", rand_suffix());
    let s = PostgresStorage::builder()
        .url(&url)
        .table(&table)
        .open()
        .await
        .expect("connect to PostgreSQL");
    let req = |owner| AcquireRequest {
        owner,
        lease: Duration::from_secs(30),
        holder: None,
        reentrant: false,
    };
    let token = |o: AcquireOutcome| match o {
        AcquireOutcome::Acquired { fencing, .. } => fencing,
        busy => panic!("{busy:?}"),
    };
    let a = OwnerId::random();
    let first = token(s.acquire_once("k", &req(a)).await.unwrap());
    s.release("k", a).await.unwrap();

    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let mut blocker = pool.begin().await.unwrap();
    sqlx::query(&format!("ALTER SEQUENCE {table}_version INCREMENT BY 1"))
        .execute(&mut *blocker)
        .await
        .unwrap();
    let s = std::sync::Arc::new(s);
    let delayed = tokio::spawn({
        let s = s.clone();
        async move { s.acquire_once("k", &req(OwnerId::random())).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await; // it has its snapshot and waits
    let swept = s.sweep("", Duration::ZERO).await.unwrap();
    assert_eq!(swept.deleted, 1, "{swept:?}");
    blocker.rollback().await.unwrap();
    let second = token(delayed.await.unwrap().unwrap());
    sqlx::query(&format!(
        "DROP TABLE {table}; DROP SEQUENCE {table}_version"
    ))
    .execute(&pool)
    .await
    .ok();
    assert!(
        second > first,
        "token {second} issued after {first}: the floor raised by the sweep was not seen"
    );
}

fn rand_suffix() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos()
        ^ std::process::id()
}

/// Regression: every open ran `ALTER TABLE … ADD COLUMN IF NOT EXISTS`, which queues for an
/// exclusive table lock behind any open transaction that read the table (an idle `psql`, a
/// CLI `list` in a transaction) and makes every lock operation queue behind it: a holder lost
/// its lock. Opening must not touch an up-to-date table, and renewals go on meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opening_does_not_queue_behind_a_reader_of_the_table() {
    use std::time::Duration;
    use storage_lock_core::{AcquireOutcome, AcquireRequest, OwnerId, RenewOutcome, Storage};

    let url = std::env::var("STORAGE_LOCK_POSTGRES_URL")
        .expect("STORAGE_LOCK_POSTGRES_URL must name a PostgreSQL server (run scripts/test.sh)");
    let table = format!("sl_idle_{:08x}", rand_suffix());
    let open = || PostgresStorage::builder().url(&url).table(&table).open();
    let s = open().await.unwrap();
    let owner = OwnerId::random();
    let req = AcquireRequest {
        owner,
        lease: Duration::from_secs(30),
        holder: None,
        reentrant: false,
    };
    assert!(matches!(
        s.acquire_once("k", &req).await.unwrap(),
        AcquireOutcome::Acquired { .. }
    ));
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let mut idle = pool.begin().await.unwrap();
    sqlx::query(&format!("SELECT count(*) FROM {table}"))
        .execute(&mut *idle)
        .await
        .unwrap();
    let second = tokio::time::timeout(Duration::from_secs(4), open()).await;
    let renewed = tokio::time::timeout(
        Duration::from_secs(4),
        s.renew("k", owner, Duration::from_secs(30)),
    )
    .await;
    idle.rollback().await.unwrap();
    sqlx::query(&format!(
        "DROP TABLE {table}; DROP SEQUENCE {table}_version"
    ))
    .execute(&pool)
    .await
    .ok();
    second
        .expect("open queued behind an idle reader of the table")
        .unwrap();
    assert!(matches!(
        renewed.expect("renewal queued").unwrap(),
        RenewOutcome::Renewed { .. }
    ));
}
