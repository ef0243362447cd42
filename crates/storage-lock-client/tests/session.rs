//! `SessionLock` (gRPC sessions) against a real server on loopback: exclusion and hand-off,
//! holds kept through many TTLs by pings alone, `lost()` before the lease ends when the server's
//! storage fails, and everything released when the session is dropped.

use std::sync::Arc;
use std::time::Duration;

use storage_lock_client::SessionLock;
use storage_lock_core::fault::FaultyStorage;
use storage_lock_core::{
    AcquireOptions, DistributedLock, MemoryStorage, Storage, StorageLock, Wait,
};
use storage_lock_server::Server;

async fn serve(storage: Arc<dyn Storage>) -> String {
    let locks = StorageLock::builder_arc(storage).build().unwrap();
    Server::new(locks).spawn_on_loopback().await.unwrap()
}

async fn state(base: &str, name: &str) -> String {
    let v: serde_json::Value = reqwest_get(&format!("{base}/v1/locks/{name}")).await;
    v["state"].as_str().unwrap_or_default().to_owned()
}

async fn reqwest_get(url: &str) -> serde_json::Value {
    reqwest::get(url).await.unwrap().json().await.unwrap()
}

fn wait(d: Duration) -> AcquireOptions {
    AcquireOptions::default().wait(Wait::For(d))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_exclude_each_other_and_hand_off() {
    let base = serve(Arc::new(MemoryStorage::new())).await;
    let a = SessionLock::open(&base, Duration::from_secs(3))
        .await
        .unwrap();
    let b = SessionLock::open(&base, Duration::from_secs(3))
        .await
        .unwrap();
    assert!(!a.provider().process_local);
    let held = a
        .try_acquire("x", &AcquireOptions::default())
        .await
        .unwrap()
        .unwrap();
    assert!(
        b.try_acquire("x", &AcquireOptions::default())
            .await
            .unwrap()
            .is_none()
    );
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.try_acquire("x", &wait(Duration::from_secs(10))).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let token = held.fencing_token();
    held.release().await.unwrap();
    let next = waiter.await.unwrap().unwrap().expect("handed off");
    assert!(next.fencing_token() > token);
    assert!(matches!(
        a.try_acquire("", &AcquireOptions::default()).await,
        Err(storage_lock_core::LockError::InvalidName { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_keeps_its_locks_through_many_ttls() {
    let base = serve(Arc::new(MemoryStorage::new())).await;
    let s = SessionLock::open(&base, Duration::from_millis(600))
        .await
        .unwrap();
    let h = s
        .try_acquire("keep", &AcquireOptions::default())
        .await
        .unwrap()
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!h.is_lost(), "5 TTLs later");
    assert_eq!(state(&base, "keep").await, "held");
    h.release().await.unwrap();
    assert_eq!(state(&base, "keep").await, "released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storage_outage_turns_the_handle_lost_before_the_lease_ends() {
    let faulty = Arc::new(FaultyStorage::new(MemoryStorage::new()));
    let base = serve(faulty.clone()).await;
    let ttl = Duration::from_millis(900);
    let s = SessionLock::open(&base, ttl).await.unwrap();
    let h = s
        .try_acquire("outage", &AcquireOptions::default())
        .await
        .unwrap()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    faulty.set_outage(true);
    let since = tokio::time::Instant::now();
    tokio::time::timeout(ttl, h.lost())
        .await
        .expect("lost within one TTL of the outage");
    assert!(since.elapsed() < ttl);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_handles_and_session_releases_at_once() {
    let base = serve(Arc::new(MemoryStorage::new())).await;
    let s = SessionLock::open(&base, Duration::from_secs(30))
        .await
        .unwrap();
    let h = s
        .try_acquire("dropped", &AcquireOptions::default())
        .await
        .unwrap()
        .unwrap();
    let other = s
        .try_acquire("dropped-2", &AcquireOptions::default())
        .await
        .unwrap()
        .unwrap();
    drop(h);
    drop(other);
    drop(s);
    let started = tokio::time::Instant::now();
    while state(&base, "dropped").await == "held" || state(&base, "dropped-2").await == "held" {
        assert!(
            // Well before the 30 s TTL, with room for a loaded machine.
            started.elapsed() < Duration::from_secs(15),
            "still held, TTL is 30 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_is_not_reentrant_and_vouches_for_two_thirds_of_its_ttl() {
    let base = serve(Arc::new(MemoryStorage::new())).await;
    let s = SessionLock::open(&base, Duration::from_secs(3))
        .await
        .unwrap();
    let h = s
        .try_acquire("once", &AcquireOptions::default())
        .await
        .unwrap()
        .unwrap();
    let again = s
        .try_acquire("once", &wait(Duration::from_millis(300)))
        .await
        .unwrap();
    assert!(
        again.is_none(),
        "the same session does not get the lock twice"
    );
    // Asking for an hour changes nothing: a pong vouches for 2/3 TTL.
    h.try_renew(Some(Duration::from_secs(3600))).await.unwrap();
    let left = h.time_left().unwrap();
    assert!(left <= Duration::from_secs(2), "{left:?}");
    let token = h.fencing_token();
    h.release().await.unwrap();
    let next = s
        .try_acquire("once", &AcquireOptions::default())
        .await
        .unwrap()
        .unwrap();
    assert!(next.fencing_token() > token);
}
