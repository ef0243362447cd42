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
