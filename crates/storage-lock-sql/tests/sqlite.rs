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
