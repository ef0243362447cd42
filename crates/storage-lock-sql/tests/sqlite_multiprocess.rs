//! Several OS processes contend on one SQLite file; each does a non-atomic read-modify-write of
//! a shared file under the lock and a fenced append (see `storage_lock_testkit::multiprocess`).

use storage_lock_core::StorageLock;
use storage_lock_sql::SqliteStorage;
use storage_lock_testkit::multiprocess;

/// Not a test on its own: the body of each worker process (returns at once otherwise).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_entry_point() {
    let Some(dir) = multiprocess::worker_dir() else {
        return;
    };
    let storage = SqliteStorage::open(dir.join("locks.db")).await.unwrap();
    let locks = StorageLock::new(storage).unwrap();
    multiprocess::run_worker(&locks, "shared-file", &dir, multiprocess::worker_rounds()).await;
}

#[test]
fn processes_on_one_sqlite_file_exclude_each_other() {
    let dir = multiprocess::run_processes("worker_entry_point", 4, 50);
    let _ = std::fs::remove_dir_all(dir);
}
