//! Both suites against [`ObjectStoreStorage`] on the S3 emulator named by
//! `STORAGE_LOCK_S3_URL` (`scripts/services.sh` starts one and sets it), and a restart of an
//! emulator of this test's own. Tests share one bucket; each uses lock names under a prefix of
//! its own.

mod common;

use common::rand_u64;
use storage_lock_object_store::ObjectStoreStorage;
use storage_lock_testkit::restart::{ServerProcess, restart_keeps_fencing, spare_port, wait_until};

fn url() -> String {
    std::env::var("STORAGE_LOCK_S3_URL")
        .expect("STORAGE_LOCK_S3_URL must name an S3 bucket (run scripts/test.sh)")
}

/// A storage in a directory of its own, so that listings scan only this test's objects (the
/// emulator keeps every earlier run's objects).
async fn s3() -> ObjectStoreStorage {
    ObjectStoreStorage::from_url(&suite_url()).expect("a valid S3 URL")
}

/// The URL of a fresh directory of the suite's bucket.
fn suite_url() -> String {
    let dir = format!("s3://storage-lock-test/suite/{:016x}", rand_u64());
    let url = url().replacen("s3://storage-lock-test", &dir, 1);
    // Requests are given time on a loaded machine (the default 2 s made cases fail at random
    // while a hundred others ran beside them); no case here needs a request to time out.
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}timeout=10s")
}

/// The holder's renewal, release and re-acquisition take one request each (the hint).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_known_record_saves_the_read() {
    storage_lock_testkit::conformance::a_known_record_saves_the_read(s3().await).await;
}

/// A second client whose clock runs an hour ahead finds a held lock busy (`clock: observed`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contender_whose_clock_runs_ahead_finds_a_held_lock_busy() {
    common::a_contender_whose_clock_runs_ahead_finds_a_held_lock_busy(&suite_url()).await;
}

// Only the primitives are implemented here: the lock operations are the engine's defaults
// (the polling path of a storage without notifications runs in the other backends' `defaults`).
storage_lock_testkit::storage_lock_suites!(s3, lock_operations = default);

/// SIGKILL of an emulator this test started (objects persisted in its data directory): the
/// records and their fencing tokens come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_restart_keeps_fencing() {
    let emulator = std::env::var("STORAGE_LOCK_S3_EMULATOR")
        .expect("STORAGE_LOCK_S3_EMULATOR (scripts/services.sh sets it)");
    let dir = tempfile::tempdir().unwrap();
    let port = spare_port();
    let args = [
        port.to_string(),
        dir.path().join("data").display().to_string(),
    ];
    let mut server = ServerProcess::start(emulator, &args, dir.path().join("emulator.log"));
    let endpoint = format!("http://127.0.0.1:{port}");
    let bucket = || async {
        let status = std::process::Command::new("curl")
            .args(["-fsS", "-o", "/dev/null", "-X", "PUT"])
            .arg(format!("{endpoint}/restart"))
            .status()
            .map_err(|e| e.to_string())?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("{status}"))
        }
    };
    wait_until("the emulator starts", bucket).await;
    let storage = ObjectStoreStorage::from_url(&format!(
        "s3://restart/locks?endpoint={endpoint}&region=us-east-1&timeout=5s"
    ))
    .unwrap();
    let probe = storage.clone();
    restart_keeps_fencing(storage, async {
        server.restart();
        wait_until("the emulator restarts", || async {
            use storage_lock_core::Storage;
            probe.get("probe").await
        })
        .await;
    })
    .await;
}

/// ETags are content hashes: two writes of one record still get two versions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn equal_writes_get_distinct_versions() {
    common::equal_writes_get_distinct_versions(s3().await).await;
}

/// An object under the prefix that is no storage-lock record is one bad row of a listing,
/// named by its key (before, it failed the whole listing). On an in-memory store, which this
/// test can write garbage into directly; the listing code is the one every store runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_record_is_one_bad_row() {
    use object_store::ObjectStore;
    let store = std::sync::Arc::new(object_store::memory::InMemory::new());
    let storage = ObjectStoreStorage::new(store.clone(), "locks");
    storage_lock_testkit::conformance::a_corrupt_record_is_one_bad_row(storage, |key| async move {
        let escaped = storage_lock_core::storage::encoding::escape_key(&key);
        store
            .put_opts(
                &object_store::path::Path::from("locks").join(escaped),
                "garbage".into(),
                object_store::PutOptions::default(),
            )
            .await
            .expect("a raw put");
    })
    .await;
}
