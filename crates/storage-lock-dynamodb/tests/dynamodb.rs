//! Both suites against [`DynamoDbStorage`] on two DynamoDB emulators that `scripts/services.sh`
//! starts: ministack (`STORAGE_LOCK_DYNAMODB_URL`; its writes run on one event loop) and
//! dynalite (`STORAGE_LOCK_DYNALITE_URL`; a lock per item key, tables on LevelDB); and
//! emulators of this test's own, restarted with SIGKILL: ministack forgets every table (which
//! is why an emulator is refused without `durability=volatile`), dynalite keeps them and the
//! fencing tokens go on rising.

use std::time::Duration;

use base64::Engine as _;
use storage_lock_core::{AcquireOptions, Storage, StorageError, StorageLock};
use storage_lock_dynamodb::{DynamoDbStorage, DynamoDbStorageBuilder};
use storage_lock_testkit::restart::{ServerProcess, restart_keeps_fencing, spare_port, wait_until};

fn env(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| panic!("{var} must be set (run scripts/test.sh)"))
}

/// `http://host:port` of a test URL.
fn endpoint(url: &str) -> String {
    let start = url.find("endpoint=").expect("an endpoint") + "endpoint=".len();
    let end = url[start..].find('&').map_or(url.len(), |i| start + i);
    url[start..end].to_owned()
}

/// The table of a test URL.
fn table_of(url: &str) -> String {
    let rest = url.strip_prefix("dynamodb://").expect("dynamodb://");
    rest[..rest.find(['/', '?']).unwrap_or(rest.len())].to_owned()
}

fn unique(what: &str) -> String {
    format!("{what}-{:016x}/", rand::random::<u64>())
}

/// A storage on `url` under `prefix`, with requests given time on a loaded machine.
fn builder(url: &str, prefix: &str) -> DynamoDbStorageBuilder {
    DynamoDbStorageBuilder::from_url(url)
        .expect("a valid DynamoDB URL")
        .prefix(prefix)
        .timeout(Duration::from_secs(10))
}

/// One JSON-API call straight to an emulator (neither checks signatures; dynalite wants
/// `Authorization` and `X-Amz-Date` headers of the right shape).
async fn raw(url: &str, action: &str, body: serde_json::Value) -> serde_json::Value {
    let response = reqwest::Client::new()
        .post(format!("{}/", endpoint(url)))
        .header("content-type", "application/x-amz-json-1.0")
        .header("x-amz-target", format!("DynamoDB_20120810.{action}"))
        .header("x-amz-date", "20260101T000000Z")
        .header(
            "authorization",
            "AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/dynamodb/aws4_request, \
             SignedHeaders=host, Signature=0",
        )
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    serde_json::from_slice(&response.bytes().await.unwrap()).unwrap()
}

/// The cases every emulator runs, in a module named after it.
macro_rules! on_emulator {
    ($emulator:ident, $var:literal) => {
        mod $emulator {
            use super::*;

            fn url() -> String {
                env($var)
            }

            async fn storage() -> DynamoDbStorage {
                builder(&url(), &unique("suite"))
                    .open()
                    .await
                    .expect("the test table opens")
            }

            // Only the primitives are implemented: the lock operations are the engine's
            // defaults.
            storage_lock_testkit::storage_lock_suites!(storage, lock_operations = default);

            /// The holder's renewal, release and re-acquisition take one request each.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_known_record_saves_the_read() {
                storage_lock_testkit::conformance::a_known_record_saves_the_read(storage().await)
                    .await;
            }

            /// A second client whose clock runs an hour ahead finds a held lock busy
            /// (`clock: observed`).
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_contender_whose_clock_runs_ahead_finds_a_held_lock_busy() {
                let prefix = unique("ahead");
                let holder = builder(&url(), &prefix).open().await.unwrap();
                let ahead = builder(&url(), &prefix)
                    .clock(storage_lock_testkit::conformance::Ahead(
                        Duration::from_secs(3600),
                    ))
                    .open()
                    .await
                    .unwrap();
                storage_lock_testkit::conformance::a_contender_whose_clock_runs_ahead_finds_a_held_lock_busy(
                    holder, ahead,
                )
                .await;
            }

            /// An item under the prefix that is no storage-lock record is one bad row of a
            /// listing.
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_corrupt_record_is_one_bad_row() {
                let prefix = unique("corrupt");
                let s = builder(&url(), &prefix).open().await.unwrap();
                storage_lock_testkit::conformance::a_corrupt_record_is_one_bad_row(
                    s,
                    |key| async move {
                        let item = serde_json::json!({
                            "k": { "S": format!("{prefix}{key}") },
                            "r": { "B": base64::engine::general_purpose::STANDARD.encode("not a record") },
                            "v": { "N": "7" },
                        });
                        let body = serde_json::json!({ "TableName": table_of(&url()), "Item": item });
                        raw(&url(), "PutItem", body).await;
                    },
                )
                .await;
            }

            /// A table whose key is not the string partition key `k` is refused at open, and
            /// a missing table with `create=false` too (nothing is created).
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn a_table_of_another_shape_is_refused() {
                let other = format!("other-{:016x}", rand::random::<u64>());
                let body = serde_json::json!({
                    "TableName": other,
                    "AttributeDefinitions": [{ "AttributeName": "id", "AttributeType": "N" }],
                    "KeySchema": [{ "AttributeName": "id", "KeyType": "HASH" }],
                    "BillingMode": "PAY_PER_REQUEST",
                });
                raw(&url(), "CreateTable", body).await;
                let refused = builder(&url(), "").table(&other).open().await.unwrap_err();
                assert!(
                    matches!(&refused, StorageError::Config { reason, .. } if reason.contains("\"k\"")),
                    "{refused:?}"
                );
                let missing = format!("missing-{:016x}", rand::random::<u64>());
                let refused = builder(&url(), "")
                    .table(&missing)
                    .create_table(false)
                    .open()
                    .await
                    .unwrap_err();
                assert!(
                    matches!(&refused, StorageError::Config { reason, .. } if reason.contains("does not exist")),
                    "{refused:?}"
                );
                let tables = raw(&url(), "ListTables", serde_json::json!({})).await;
                assert!(!tables.to_string().contains(&missing), "{tables}");
                raw(&url(), "DeleteTable", serde_json::json!({ "TableName": other })).await;
            }
        }
    };
}

on_emulator!(ministack, "STORAGE_LOCK_DYNAMODB_URL");
on_emulator!(dynalite, "STORAGE_LOCK_DYNALITE_URL");

/// On ministack, which returns the item a failed condition found (as DynamoDB does with
/// `ReturnValuesOnConditionCheckFailure`), a lost race is answered busy from the refusal, with
/// no `GetItem`. dynalite ignores the option: there the engine reads (its suites pass that way).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_race_costs_one_request() {
    let url = env("STORAGE_LOCK_DYNAMODB_URL");
    let prefix = unique("lost");
    let open = || builder(&url, &prefix).open();
    storage_lock_testkit::conformance::a_lost_race_costs_one_request(
        open().await.unwrap(),
        open().await.unwrap(),
    )
    .await;
}

/// An emulator of this test's own, started by `script` (`STORAGE_LOCK_S3_EMULATOR` or
/// `STORAGE_LOCK_DYNALITE`), and a URL of it.
fn own_emulator(script: &str) -> (ServerProcess, String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let port = spare_port();
    let args = [
        port.to_string(),
        dir.path().join("data").display().to_string(),
    ];
    let server = ServerProcess::start(env(script), &args, dir.path().join("emulator.log"));
    let url = format!(
        "dynamodb://restart?endpoint=http://127.0.0.1:{port}&region=us-east-1&emulator=true\
         &durability=volatile&timeout=5s"
    );
    (server, url, dir)
}

/// SIGKILL of a dynalite this test started (tables on LevelDB): the records and their fencing
/// tokens come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynalite_restart_keeps_fencing() {
    let (mut server, url, _dir) = own_emulator("STORAGE_LOCK_DYNALITE");
    let storage = wait_until("dynalite starts", || async {
        DynamoDbStorage::connect(&url).await
    })
    .await;
    let probe = storage.clone();
    restart_keeps_fencing(storage, async {
        server.restart();
        wait_until("dynalite restarts", || async { probe.get("probe").await }).await;
    })
    .await;
}

/// What `durability=volatile` accepts for an emulator, shown: after a SIGKILL and a restart of
/// a ministack this test started, the table is gone (operations fail, never grant), and once
/// it is opened again a lock that was held is free at once and its fencing tokens start again.
/// (On every durable backend the restart tests check the opposite.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ministack_restart_forgets_held_locks_and_fencing_tokens() {
    let (mut server, url, _dir) = own_emulator("STORAGE_LOCK_S3_EMULATOR");
    let open = || async { DynamoDbStorage::connect(&url).await };
    let storage = wait_until("the emulator starts", open).await;
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
    // The table went with the emulator: a read fails, it does not report the lock free.
    let gone = wait_until("the emulator restarts", || async {
        match storage.get("forgotten").await {
            Err(StorageError::Backend { source, .. })
                if source.to_string().contains("ResourceNotFound") =>
            {
                Ok(())
            }
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let () = gone;
    let reopened = DynamoDbStorage::connect(&url).await.unwrap();
    let again = StorageLock::new(reopened)
        .unwrap()
        .try_acquire("forgotten", &opts)
        .await
        .unwrap()
        .expect("a restarted emulator forgot the held lock");
    assert!(
        again.fencing_token() <= last,
        "tokens started again: {} after {} (the held one: {})",
        again.fencing_token(),
        last,
        held.fencing_token()
    );
}
