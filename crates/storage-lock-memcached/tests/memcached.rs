//! Both suites against [`MemcachedStorage`] on the memcached named by
//! `STORAGE_LOCK_MEMCACHED_URL` (`scripts/services.sh` starts one with `-M` and sets it), and
//! servers of this test's own: one that evicts (refused), and one restarted with SIGKILL (it
//! forgets every lock, which is why every memcached is refused without `durability=volatile`).

use std::time::Duration;

use storage_lock_core::{AcquireOptions, Storage, StorageError, StorageLock};
use storage_lock_memcached::{MemcachedStorage, MemcachedStorageBuilder};
use storage_lock_testkit::restart::{ServerProcess, spare_port, wait_until};

fn url() -> String {
    std::env::var("STORAGE_LOCK_MEMCACHED_URL")
        .expect("STORAGE_LOCK_MEMCACHED_URL must name a memcached (run scripts/test.sh)")
}

fn bin() -> String {
    std::env::var("STORAGE_LOCK_MEMCACHED_BIN")
        .expect("STORAGE_LOCK_MEMCACHED_BIN (scripts/services.sh sets it)")
}

/// A storage under a prefix of its own, with requests given time on a loaded machine.
async fn memcached() -> MemcachedStorage {
    let prefix = format!("suite-{:016x}:", rand::random::<u64>());
    MemcachedStorageBuilder::from_url(&url())
        .expect("a valid memcached URL")
        .prefix(prefix)
        .timeout(Duration::from_secs(10))
        .open()
        .await
        .expect("the test memcached opens")
}

/// The holder's renewal, release and re-acquisition take one request each (the hint).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_known_record_saves_the_read() {
    storage_lock_testkit::conformance::a_known_record_saves_the_read(memcached().await).await;
}

// Only the primitives are implemented here: the lock operations are the engine's defaults.
storage_lock_testkit::storage_lock_suites!(memcached, lock_operations = default);

/// A memcached of this test's own, `extra` added to its command line.
fn own_server(extra: &[&str]) -> (ServerProcess, String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let port = spare_port();
    let user = std::env::var("USER").unwrap_or_else(|_| "root".to_owned());
    let mut args: Vec<String> = ["-u", &user, "-l", "127.0.0.1", "-U", "0", "-m", "16", "-p"]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
    args.push(port.to_string());
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    let server = ServerProcess::start(bin(), &args, dir.path().join("memcached.log"));
    (server, format!("127.0.0.1:{port}"), dir)
}

async fn open(address: &str) -> Result<MemcachedStorage, StorageError> {
    MemcachedStorageBuilder::new()
        .address(address)
        .allow_volatile(true)
        .timeout(Duration::from_secs(5))
        .open()
        .await
}

/// A server that may evict items (started without `-M`) would drop held locks under memory
/// pressure: refused even with `durability=volatile`. The same server with `-M` opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_evicts_is_refused() {
    let (_server, address, _dir) = own_server(&[]);
    let refused = wait_until("memcached starts", || async {
        match open(&address).await {
            Err(StorageError::Backend { .. }) => Err("not up yet"),
            other => Ok(other),
        }
    })
    .await;
    assert!(
        matches!(&refused, Err(StorageError::Config { reason, .. }) if reason.contains("-M")),
        "{refused:?}"
    );
    let (_server, address, _dir) = own_server(&["-M"]);
    wait_until("memcached -M starts", || async { open(&address).await }).await;
}

/// What `durability=volatile` accepts, shown: after a SIGKILL and a restart, a lock that was
/// held is free at once and its fencing tokens start again. (On every durable backend the
/// restart tests check the opposite.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_forgets_held_locks_and_fencing_tokens() {
    let (mut server, address, _dir) = own_server(&["-M"]);
    let storage = wait_until("memcached starts", || async { open(&address).await }).await;
    let locks = StorageLock::new(storage.clone()).unwrap();
    let opts = AcquireOptions::default().lease(Duration::from_secs(600));
    let mut last = 0;
    for _ in 0..3 {
        let h = locks
            .try_acquire("forgotten", &opts)
            .await
            .unwrap()
            .expect("free");
        last = h.fencing_token();
        h.release().await.unwrap();
    }
    let held = locks
        .try_acquire("forgotten", &opts)
        .await
        .unwrap()
        .expect("free");
    assert!(held.fencing_token() > last);
    server.restart();
    wait_until("memcached restarts", || async {
        storage.get("probe").await
    })
    .await;
    let again = locks
        .try_acquire("forgotten", &opts)
        .await
        .unwrap()
        .expect("a restarted memcached forgot the held lock");
    assert!(
        again.fencing_token() <= last,
        "tokens started again: {} after {}",
        again.fencing_token(),
        held.fencing_token()
    );
}
