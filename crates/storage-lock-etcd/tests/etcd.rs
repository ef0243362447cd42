//! Both suites against [`EtcdStorage`] on the cluster named by `STORAGE_LOCK_ETCD_URL`
//! (`scripts/services.sh` starts one and sets it), and a restart of an etcd of this test's own.
//! Tests share one key prefix; each uses lock names under a prefix of its own.

use storage_lock_etcd::{EtcdStorage, EtcdStorageBuilder};
use storage_lock_testkit::restart::{ServerProcess, restart_keeps_fencing, spare_port, wait_until};

async fn etcd() -> EtcdStorage {
    let url = std::env::var("STORAGE_LOCK_ETCD_URL")
        .expect("STORAGE_LOCK_ETCD_URL must name an etcd cluster (run scripts/test.sh)");
    EtcdStorageBuilder::from_url(&url)
        .expect("a valid etcd URL")
        .prefix("storage-lock-suite/")
        // Time for a loaded machine (the default 2 s failed cases at random); no case here
        // needs a request to time out.
        .timeout(std::time::Duration::from_secs(10))
        .open()
        .await
        .expect("connect to etcd")
}

// Only the primitives are implemented here: the lock operations are the engine's defaults
// (the polling path of a storage without notifications runs in the other backends' `defaults`).
storage_lock_testkit::storage_lock_suites!(etcd, lock_operations = default);

/// SIGKILL of an etcd this test started (same data directory on restart): etcd fsyncs before
/// it answers, so the records and their fencing tokens come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_restart_keeps_fencing() {
    let bin = std::env::var("STORAGE_LOCK_ETCD_BIN").unwrap_or_else(|_| "etcd".into());
    let dir = tempfile::tempdir().unwrap();
    let (client, peer) = (spare_port(), spare_port());
    let args: Vec<String> = [
        "--name=restart".to_owned(),
        format!("--data-dir={}", dir.path().join("data").display()),
        format!("--listen-client-urls=http://127.0.0.1:{client}"),
        format!("--advertise-client-urls=http://127.0.0.1:{client}"),
        format!("--listen-peer-urls=http://127.0.0.1:{peer}"),
        format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"),
        format!("--initial-cluster=restart=http://127.0.0.1:{peer}"),
    ]
    .into();
    let mut server = ServerProcess::start(bin, &args, dir.path().join("etcd.log"));
    let url = format!("etcd://127.0.0.1:{client}?timeout=5s");
    let open = || async { EtcdStorageBuilder::from_url(&url).unwrap().open().await };
    let storage = wait_until("etcd starts", open).await;
    restart_keeps_fencing(storage, async {
        server.restart();
        wait_until("etcd restarts", open).await;
    })
    .await;
}

/// The example of `EtcdStorageBuilder::open` (a `no_run` doctest) against the real server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_open_works() {
    use storage_lock_core::Storage;
    let storage = storage_lock_etcd::EtcdStorageBuilder::from_env()
        .expect("STORAGE_LOCK_ETCD_URL is valid")
        .prefix("doc-locks/")
        .open()
        .await
        .expect("connect");
    assert!(storage.capabilities().linearizable_cas);
}

/// The holder's renewal, release and re-acquisition take one request each (the hint).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_known_record_saves_the_read() {
    storage_lock_testkit::conformance::a_known_record_saves_the_read(etcd().await).await;
}

/// A second client whose clock runs an hour ahead finds a held lock busy (`clock: observed`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contender_whose_clock_runs_ahead_finds_a_held_lock_busy() {
    let url = std::env::var("STORAGE_LOCK_ETCD_URL").expect("STORAGE_LOCK_ETCD_URL");
    let ahead = EtcdStorageBuilder::from_url(&url)
        .expect("a valid etcd URL")
        .prefix("storage-lock-suite/")
        .timeout(std::time::Duration::from_secs(10))
        .clock(storage_lock_testkit::conformance::Ahead(
            std::time::Duration::from_secs(3600),
        ))
        .open()
        .await
        .expect("connect to etcd");
    storage_lock_testkit::conformance::a_contender_whose_clock_runs_ahead_finds_a_held_lock_busy(
        etcd().await,
        ahead,
    )
    .await;
}

/// `host:port` of every member named by an `etcd://` URL (no credentials in the test's URL).
fn endpoints(url: &str) -> Vec<String> {
    let hosts = url.trim_start_matches("etcd://");
    let hosts = hosts.split(['?', '/']).next().unwrap_or(hosts);
    hosts.split(',').map(str::to_owned).collect()
}

/// A value under the prefix that is no storage-lock record is one bad row of a listing, named
/// by its key (before, it failed the whole listing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_record_is_one_bad_row() {
    let url = std::env::var("STORAGE_LOCK_ETCD_URL").expect("STORAGE_LOCK_ETCD_URL");
    let mut raw = etcd_client::Client::connect(endpoints(&url), None)
        .await
        .expect("a raw etcd client");
    storage_lock_testkit::conformance::a_corrupt_record_is_one_bad_row(
        etcd().await,
        |key| async move {
            raw.put(format!("storage-lock-suite/{key}"), "garbage", None)
                .await
                .expect("a raw put");
        },
    )
    .await;
}
