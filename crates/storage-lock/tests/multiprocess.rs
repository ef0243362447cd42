//! Several OS processes contend on one storage; each does a non-atomic read-modify-write of a
//! shared file under the lock and a fenced append (see `storage_lock_testkit::multiprocess`).
//! SQLite always; PostgreSQL, MySQL/MariaDB and Redis when their features are on (their URLs
//! come from the environment that `scripts/services.sh` sets up).

use storage_lock_testkit::multiprocess;

const PROCESSES: usize = 4;
const ROUNDS: u32 = 50;

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
    multiprocess::run_worker(&locks, "shared-file", &dir, multiprocess::worker_rounds()).await;
}

fn contend(url: &str) {
    let dir = multiprocess::run_processes("worker_entry_point", url, PROCESSES, ROUNDS);
    let _ = std::fs::remove_dir_all(dir);
}

fn env_url(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| panic!("{var} must be set (run scripts/test.sh)"))
}

#[test]
fn sqlite_processes_exclude_each_other() {
    let dir = tempfile::tempdir().unwrap();
    contend(&format!(
        "sqlite://{}",
        dir.path().join("locks.db").display()
    ));
}

#[cfg(feature = "postgres")]
#[test]
fn postgres_processes_exclude_each_other() {
    contend(&format!(
        "{}?table=storage_lock_mp",
        env_url("STORAGE_LOCK_POSTGRES_URL")
    ));
}

#[cfg(feature = "mysql")]
#[test]
fn mysql_processes_exclude_each_other() {
    contend(&format!(
        "{}?table=storage_lock_mp",
        env_url("STORAGE_LOCK_MYSQL_URL")
    ));
}

#[cfg(feature = "redis")]
#[test]
fn redis_processes_exclude_each_other() {
    contend(&format!(
        "{}?prefix=storage-lock-mp:",
        env_url("STORAGE_LOCK_REDIS_URL")
    ));
}

#[cfg(feature = "redis")]
#[test]
fn valkey_processes_exclude_each_other() {
    contend(&format!(
        "{}?prefix=storage-lock-mp:",
        env_url("STORAGE_LOCK_VALKEY_URL")
    ));
}

#[cfg(feature = "etcd")]
#[test]
fn etcd_processes_exclude_each_other() {
    contend(&format!(
        "{}?prefix=storage-lock-mp/",
        env_url("STORAGE_LOCK_ETCD_URL")
    ));
}

#[cfg(feature = "nats")]
#[test]
fn nats_processes_exclude_each_other() {
    contend(&format!(
        "{}?bucket=storage-lock-mp",
        env_url("STORAGE_LOCK_NATS_URL")
    ));
}

#[cfg(feature = "object-store")]
#[test]
fn s3_processes_exclude_each_other() {
    let url = env_url("STORAGE_LOCK_S3_URL");
    contend(&url.replacen("s3://storage-lock-test", "s3://storage-lock-test/mp", 1));
}

#[cfg(feature = "azure")]
#[test]
fn azure_processes_exclude_each_other() {
    let url = env_url("STORAGE_LOCK_AZURE_URL");
    contend(&url.replacen(
        "azure://storage-lock-test",
        "azure://storage-lock-test/mp",
        1,
    ));
}

#[cfg(feature = "memcached")]
#[test]
fn memcached_processes_exclude_each_other() {
    contend(&format!(
        "{}&prefix=mp-{:x}:",
        env_url("STORAGE_LOCK_MEMCACHED_URL"),
        std::process::id()
    ));
}

#[cfg(feature = "dynamodb")]
#[test]
fn dynamodb_processes_exclude_each_other() {
    let url = env_url("STORAGE_LOCK_DYNAMODB_URL");
    contend(&url.replacen(
        "dynamodb://storage-lock-test",
        &format!("dynamodb://storage-lock-test/mp-{:x}/", std::process::id()),
        1,
    ));
}

#[cfg(feature = "zookeeper")]
#[test]
fn zookeeper_processes_exclude_each_other() {
    contend(&format!(
        "{}/mp-{:x}",
        env_url("STORAGE_LOCK_ZOOKEEPER_URL"),
        std::process::id()
    ));
}
