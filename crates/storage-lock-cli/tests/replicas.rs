//! Two `storage-lock serve` processes over one PostgreSQL (`STORAGE_LOCK_POSTGRES_URL`) serve the
//! same locks: three worker processes, two of them on one replica and one on the other, run
//! critical sections with a non-atomic read-modify-write and a fenced append
//! (`storage_lock_testkit::multiprocess`); no overlap, no stale token, no lost update.

mod support;

use storage_lock_testkit::multiprocess;
use support::Served;

/// Not a test on its own: the body of each worker process, which the test below starts with
/// `--ignored --exact` (returns at once when run without a worker's environment).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a worker process's body, started by the contention test"]
async fn worker_entry_point() {
    let Some(dir) = multiprocess::worker_dir() else {
        return;
    };
    let url = std::env::var(multiprocess::WORKER_URL_ENV).expect("worker URL");
    let locks = storage_lock::connect(&url).await.expect("worker connects");
    multiprocess::run_worker(&locks, "replicated", &dir, multiprocess::worker_rounds()).await;
}

#[test]
fn three_processes_through_two_server_replicas_exclude_each_other() {
    let pg = std::env::var("STORAGE_LOCK_POSTGRES_URL")
        .expect("STORAGE_LOCK_POSTGRES_URL must be set (run scripts/test.sh)");
    let storage = format!("{pg}?table=storage_lock_replicas");
    let a = Served::start(&storage, &[]);
    let b = Served::start(&storage, &[]);
    assert_ne!(a.url, b.url);
    let dir =
        multiprocess::run_processes_on("worker_entry_point", &[&a.url, &b.url, &a.url], 3, 40);
    let _ = std::fs::remove_dir_all(dir);
}
