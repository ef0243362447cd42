//! Connection loss is fail-closed: with the server unreachable (every connection cut by a
//! loopback proxy), a held handle turns lost no later than its local deadline and nothing
//! panics; once the server is reachable again, new acquisitions work in the same process.

use std::net::SocketAddr;
use std::time::Duration;

use storage_lock::{AcquireOptions, Wait, connect};
use storage_lock_testkit::proxy::Proxy;
use tokio::time::{Instant, timeout};

const LEASE: Duration = Duration::from_secs(2);

/// `scheme://[userinfo@]host:port/rest` → (target address, URL through `proxy`).
fn through_proxy(url: &str, proxy: SocketAddr) -> (SocketAddr, String) {
    let (scheme, rest) = url.split_once("://").expect("scheme://");
    let (userinfo, hostpart) = match rest.rsplit_once('@') {
        Some((u, h)) => (format!("{u}@"), h),
        None => (String::new(), rest),
    };
    let (authority, tail) = hostpart.split_at(hostpart.find(['/', '?']).unwrap_or(hostpart.len()));
    let target = authority
        .replace("localhost", "127.0.0.1")
        .parse()
        .expect("host:port");
    (target, format!("{scheme}://{userinfo}{proxy}{tail}"))
}

/// `s3://bucket?endpoint=http://host:port&…` (or `azure://…`) → (the endpoint's address, URL
/// through `proxy`).
#[cfg(any(feature = "object-store", feature = "azure", feature = "dynamodb"))]
fn endpoint_through_proxy(url: &str, proxy: SocketAddr) -> (SocketAddr, String) {
    let start = url.find("endpoint=http://").expect("an http endpoint") + "endpoint=http://".len();
    let end = url[start..]
        .find(['&', '/'])
        .map_or(url.len(), |i| start + i);
    let target = url[start..end].parse().expect("host:port");
    (target, format!("{}{proxy}{}", &url[..start], &url[end..]))
}

async fn fail_closed_and_recover(url_var: &str, params: &str) {
    fail_closed_and_recover_via(url_var, params, through_proxy).await;
}

async fn fail_closed_and_recover_via(
    url_var: &str,
    params: &str,
    via: fn(&str, SocketAddr) -> (SocketAddr, String),
) {
    let url = std::env::var(url_var).unwrap_or_else(|_| panic!("{url_var} must be set"));
    let (target, _) = via(&url, "127.0.0.1:1".parse().unwrap());
    let proxy = Proxy::start(target).await.unwrap();
    let (_, proxied) = via(&url, proxy.addr());
    let proxied = format!("{proxied}{params}");
    let locks = connect(&proxied).await.expect("connect through the proxy");
    let name = format!("conn-loss-{:x}", rand_u64());
    let opts = AcquireOptions::default()
        .lease(LEASE)
        .auto_renew(Duration::from_millis(400));
    let h = locks
        .try_acquire(&name, &opts)
        .await
        .unwrap()
        .expect("free");

    let cut = Instant::now();
    proxy.cut();
    // The local deadline is at most LEASE after the acquisition was sent, which was before
    // `cut`: from then on the handle says lost (`is_lost` reads the clock; only the wake-up of
    // `lost()` waits for a timer, which a loaded machine may run late).
    tokio::time::sleep_until(cut + LEASE).await;
    assert!(h.is_lost(), "not lost at its local deadline");
    timeout(Duration::from_secs(5), h.lost())
        .await
        .expect("lost() fired");
    // While cut off, acquisitions fail (or time out) instead of pretending.
    let during = timeout(
        Duration::from_secs(10),
        locks.try_acquire(&name, &AcquireOptions::default().wait(Wait::Never)),
    )
    .await;
    assert!(
        !matches!(during, Ok(Ok(Some(_)))),
        "acquired while unreachable"
    );

    proxy.restore();
    let again = timeout(Duration::from_secs(20), async {
        loop {
            match locks
                .try_acquire(&name, &AcquireOptions::default().wait(Wait::For(LEASE * 2)))
                .await
            {
                Ok(Some(h)) => return h,
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    })
    .await
    .expect("acquirable again after the server came back");
    assert!(again.fencing_token() > h.fencing_token());
    again.release().await.unwrap();
}

fn rand_u64() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(std::time::SystemTime::now())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_connection_loss_is_fail_closed() {
    fail_closed_and_recover("STORAGE_LOCK_POSTGRES_URL", "?table=storage_lock_suite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mysql_connection_loss_is_fail_closed() {
    fail_closed_and_recover("STORAGE_LOCK_MYSQL_URL", "?table=storage_lock_suite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_connection_loss_is_fail_closed() {
    fail_closed_and_recover("STORAGE_LOCK_REDIS_URL", "?prefix=storage-lock-suite:").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkey_connection_loss_is_fail_closed() {
    fail_closed_and_recover("STORAGE_LOCK_VALKEY_URL", "?prefix=storage-lock-suite:").await;
}

#[cfg(feature = "etcd")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_connection_loss_is_fail_closed() {
    fail_closed_and_recover(
        "STORAGE_LOCK_ETCD_URL",
        "?prefix=storage-lock-suite/&timeout=1s",
    )
    .await;
}

#[cfg(feature = "nats")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_connection_loss_is_fail_closed() {
    fail_closed_and_recover(
        "STORAGE_LOCK_NATS_URL",
        "?bucket=storage-lock-suite&timeout=1s",
    )
    .await;
}

#[cfg(feature = "object-store")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_connection_loss_is_fail_closed() {
    fail_closed_and_recover_via("STORAGE_LOCK_S3_URL", "&timeout=1s", endpoint_through_proxy).await;
}

#[cfg(feature = "azure")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn azure_connection_loss_is_fail_closed() {
    fail_closed_and_recover_via(
        "STORAGE_LOCK_AZURE_URL",
        "&timeout=1s",
        endpoint_through_proxy,
    )
    .await;
}

#[cfg(feature = "memcached")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memcached_connection_loss_is_fail_closed() {
    fail_closed_and_recover("STORAGE_LOCK_MEMCACHED_URL", "&timeout=1s").await;
}

#[cfg(feature = "dynamodb")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamodb_connection_loss_is_fail_closed() {
    fail_closed_and_recover_via(
        "STORAGE_LOCK_DYNAMODB_URL",
        "&timeout=1s",
        endpoint_through_proxy,
    )
    .await;
}

#[cfg(feature = "zookeeper")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zookeeper_connection_loss_is_fail_closed() {
    fail_closed_and_recover("STORAGE_LOCK_ZOOKEEPER_URL", "?timeout=1s").await;
}
