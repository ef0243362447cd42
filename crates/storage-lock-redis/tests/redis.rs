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
