//! Both suites against [`ObjectStoreStorage`] on Azure Blob Storage's emulator, Azurite, named by
//! `STORAGE_LOCK_AZURE_URL` (`scripts/services.sh` starts one with its metadata in MariaDB and
//! sets it), and a SIGKILL of an Azurite of this test's own. Tests share one container; each
//! uses a prefix of its own.

mod common;

use common::rand_u64;
use storage_lock_object_store::ObjectStoreStorage;
use storage_lock_testkit::restart::{ServerProcess, restart_keeps_fencing, spare_port, wait_until};

fn url() -> String {
    std::env::var("STORAGE_LOCK_AZURE_URL")
        .expect("STORAGE_LOCK_AZURE_URL must name an Azure container (run scripts/test.sh)")
}

/// A storage in a directory of its own, so that listings scan only this test's blobs.
async fn azure() -> ObjectStoreStorage {
    ObjectStoreStorage::from_url(&suite_url()).expect("a valid Azure URL")
}

/// The URL of a fresh directory of the suite's container, with requests given time on a
/// loaded machine (no case here needs a request to time out).
fn suite_url() -> String {
    let dir = format!("azure://storage-lock-test/suite/{:016x}", rand_u64());
    let url = url().replacen("azure://storage-lock-test", &dir, 1);
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}timeout=10s")
}

/// The holder's renewal, release and re-acquisition take one request each (the hint).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_known_record_saves_the_read() {
    storage_lock_testkit::conformance::a_known_record_saves_the_read(azure().await).await;
}

/// A second client whose clock runs an hour ahead finds a held lock busy (`clock: observed`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contender_whose_clock_runs_ahead_finds_a_held_lock_busy() {
    common::a_contender_whose_clock_runs_ahead_finds_a_held_lock_busy(&suite_url()).await;
}

/// ETags are content hashes on Azure too: two writes of one record get two versions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn equal_writes_get_distinct_versions() {
    common::equal_writes_get_distinct_versions(azure().await).await;
}

// Only the primitives are implemented here: the lock operations are the engine's defaults. The
// storage suite's racing-writers cases are what show that Azurite's conditional PUT is atomic.
storage_lock_testkit::storage_lock_suites!(azure, lock_operations = default);

/// SIGKILL of an Azurite this test started, *after* it saved what the test wrote: records and
/// their fencing tokens come back, and the renewals it forgot (written after that save) turn
/// their holder lost rather than grant anyone the lock. Azurite forgets up to 5 s of writes on
/// a SIGKILL (`scripts/azurite`, the crate docs), so this checks the storage's side of a
/// restart, not the emulator's durability: that is why its URLs need `durability=volatile`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_restart_after_a_save_keeps_fencing() {
    let azurite = std::path::PathBuf::from(
        std::env::var("STORAGE_LOCK_AZURITE")
            .expect("STORAGE_LOCK_AZURITE (scripts/services.sh sets it)"),
    );
    let container = azurite.with_file_name("azure-container.py");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let port = spare_port();
    let args = [port.to_string(), data.display().to_string()];
    let mut server = ServerProcess::start(&azurite, &args, dir.path().join("azurite.log"));
    let endpoint = format!("http://127.0.0.1:{port}");
    let create = || async {
        let status = std::process::Command::new(&container)
            .args([endpoint.as_str(), "restart"])
            .status()
            .map_err(|e| e.to_string())?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("{status}"))
        }
    };
    wait_until("Azurite starts", create).await;
    let storage = ObjectStoreStorage::from_url(&format!(
        "azure://restart/locks?endpoint={endpoint}&emulator=true&durability=volatile&timeout=5s"
    ))
    .unwrap();
    let probe = storage.clone();
    // Azurite's metadata file, rewritten whole at each save.
    let saved = data.join("__azurite_db_blob__.json");
    restart_keeps_fencing(storage, async {
        // A save that began before this point may miss the last writes; one whose file is
        // written well after it began after them (a save takes milliseconds).
        let after = std::time::SystemTime::now() + std::time::Duration::from_millis(200);
        wait_until("Azurite saves what the test wrote", || async {
            let modified = std::fs::metadata(&saved)
                .and_then(|m| m.modified())
                .map_err(|e| e.to_string())?;
            if modified > after {
                Ok(())
            } else {
                Err("not saved since".to_owned())
            }
        })
        .await;
        server.restart();
        wait_until("Azurite restarts", || async {
            use storage_lock_core::Storage;
            probe.get("probe").await
        })
        .await;
    })
    .await;
}
