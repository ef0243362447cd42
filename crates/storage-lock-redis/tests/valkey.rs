//! Both suites against [`RedisStorage`] on a **Valkey** server, the one named by
//! `STORAGE_LOCK_VALKEY_URL` (`scripts/services.sh` starts a durable Valkey and sets it): the
//! Redis backend claims Valkey, so Valkey passes what Redis passes.

use storage_lock_redis::RedisStorage;

fn url() -> String {
    std::env::var("STORAGE_LOCK_VALKEY_URL")
        .expect("STORAGE_LOCK_VALKEY_URL must name a Valkey server (run scripts/test.sh)")
}

async fn valkey() -> RedisStorage {
    RedisStorage::builder()
        .url(url())
        .prefix("storage-lock-suite:")
        .open()
        .await
        .expect("connect to Valkey")
}

storage_lock_testkit::storage_lock_suites!(valkey);

/// The suites above ran on Valkey, not on a Redis that a wrong URL pointed at.
#[tokio::test]
async fn the_server_is_valkey() {
    let client = redis::Client::open(url().as_str()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        info.contains("valkey_version:"),
        "not a Valkey server:\n{info}"
    );
}
