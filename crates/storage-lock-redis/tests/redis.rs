//! Both suites against [`RedisStorage`] on the server named by `STORAGE_LOCK_REDIS_URL`
//! (`scripts/services.sh` starts one and sets it). Tests share one key prefix; each uses lock
//! names under a prefix of its own.

use storage_lock_redis::RedisStorage;

async fn redis() -> RedisStorage {
    let url = std::env::var("STORAGE_LOCK_REDIS_URL")
        .expect("STORAGE_LOCK_REDIS_URL must name a Redis server (run scripts/test.sh)");
    RedisStorage::builder()
        .url(url)
        .prefix("storage-lock-suite:")
        .open()
        .await
        .expect("connect to Redis")
}

storage_lock_testkit::storage_lock_suites!(redis);

/// One bad record stays one bad record: a key of another Redis type under the prefix (it made
/// the whole listing fail with WRONGTYPE) is reported as corrupt, and the locks beside it are
/// listed and swept as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_key_under_the_prefix_is_one_bad_row() {
    use storage_lock_core::{AcquireRequest, OwnerId, PageRequest, Storage, StorageExt};
    let url = std::env::var("STORAGE_LOCK_REDIS_URL").expect("STORAGE_LOCK_REDIS_URL");
    let prefix = format!("storage-lock-foreign-{:x}:", rand_u64());
    let s = RedisStorage::builder()
        .url(url.clone())
        .prefix(prefix.clone())
        .open()
        .await
        .unwrap();
    let req = AcquireRequest {
        owner: OwnerId::random(),
        lease: std::time::Duration::from_secs(30),
        holder: None,
        reentrant: false,
    };
    s.acquire_once("a-lock", &req).await.unwrap();
    let client = redis::Client::open(url.as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("SET")
        .arg(format!("{prefix}b-foreign"))
        .arg("not a hash")
        .query_async(&mut conn)
        .await
        .unwrap();
    let page = s.list("", &PageRequest::default()).await.expect("listed");
    let keys: Vec<&str> = page.entries.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["a-lock"], "{page:?}");
    assert_eq!(page.corrupt.len(), 1, "{page:?}");
    assert_eq!(page.corrupt[0].0, "b-foreign");
    s.release("a-lock", req.owner).await.unwrap();
    s.sweep("", std::time::Duration::ZERO)
        .await
        .expect("a sweep skips the foreign key");
    let _: () = redis::cmd("DEL")
        .arg(format!("{prefix}b-foreign"))
        .query_async(&mut conn)
        .await
        .unwrap();
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now())
}

/// `replicas=1` on a server without replicas: the script runs, but `WAIT 1` finds no replica
/// holding the write, so the grant is not confirmed: an error naming the replicas, never an
/// `Acquired` a failover could take back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_no_replica_holds_is_not_confirmed() {
    use storage_lock_core::{AcquireRequest, OwnerId, Storage, StorageError};
    let url = std::env::var("STORAGE_LOCK_REDIS_URL").expect("STORAGE_LOCK_REDIS_URL");
    let s = storage_lock_redis::RedisStorageBuilder::from_url(&format!(
        "{url}?replicas=1&prefix=storage-lock-unreplicated:"
    ))
    .unwrap()
    .response_timeout(std::time::Duration::from_millis(400))
    .open()
    .await
    .unwrap();
    assert!(
        s.capabilities()
            .round_trips
            .is_some_and(|r| r.starts_with("2 / 2 / 2")),
        "{:?}",
        s.capabilities().round_trips
    );
    let req = AcquireRequest {
        owner: OwnerId::random(),
        lease: std::time::Duration::from_secs(1),
        holder: None,
        reentrant: false,
    };
    let name = format!("unreplicated-{:x}", rand_u64());
    let err = s.acquire_once(&name, &req).await.unwrap_err();
    let StorageError::Backend { .. } = &err else {
        panic!("expected a backend error, got {err:?}");
    };
    assert!(err.to_string().contains("0 of 1 replicas"), "{err}");
}

/// The multi-key script looks at every record before it writes one: a busy key leaves the
/// others without a record (the default would have written and released them), and a
/// reentrant request re-enters the owner's key while it takes the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_key_acquisition_writes_nothing_when_a_key_is_busy() {
    use storage_lock_core::{AcquireManyOutcome, AcquireOutcome, AcquireRequest, OwnerId, Storage};
    let s = redis().await;
    let p = format!("multi-{:x}/", rand_u64());
    let (a, b, c) = (format!("{p}a"), format!("{p}b"), format!("{p}c"));
    let req = |owner, reentrant| AcquireRequest {
        owner,
        lease: std::time::Duration::from_secs(30),
        holder: None,
        reentrant,
    };
    let (x, y) = (OwnerId::random(), OwnerId::random());
    s.acquire_once(&b, &req(x, false)).await.unwrap();
    let busy = s.acquire_many(&[&a, &b, &c], &req(y, false)).await.unwrap();
    assert!(
        matches!(busy, AcquireManyOutcome::Busy { index: 1, .. }),
        "{busy:?}"
    );
    assert!(s.get(&a).await.unwrap().is_none(), "a was written");
    assert!(s.get(&c).await.unwrap().is_none(), "c was written");
    s.acquire_once(&a, &req(y, false)).await.unwrap();
    let both = s.acquire_many(&[&a, &c], &req(y, true)).await.unwrap();
    let AcquireManyOutcome::Acquired(grants) = both else {
        panic!("a is y's own, c is free: {both:?}");
    };
    let counts: Vec<u32> = grants
        .iter()
        .map(|g| match g {
            AcquireOutcome::Acquired { count, .. } => *count,
            AcquireOutcome::Busy { .. } => 0,
        })
        .collect();
    assert_eq!(counts, [2, 1]);
}
