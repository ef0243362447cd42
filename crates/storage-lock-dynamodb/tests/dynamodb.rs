//! Both suites against [`DynamoDbStorage`] on the DynamoDB named by `STORAGE_LOCK_DYNAMODB_URL`
//! (`scripts/services.sh` points it at the ministack emulator it starts, whose conditional
//! writes run on one event loop), and emulators of this test's own: one restarted with SIGKILL
//! (it forgets every table, which is why an emulator is refused without
//! `durability=volatile`).

use std::time::Duration;

use base64::Engine as _;
use storage_lock_core::{AcquireOptions, Storage, StorageError, StorageLock};
use storage_lock_dynamodb::{DynamoDbStorage, DynamoDbStorageBuilder};
use storage_lock_testkit::restart::{ServerProcess, spare_port, wait_until};

fn url() -> String {
    std::env::var("STORAGE_LOCK_DYNAMODB_URL")
        .expect("STORAGE_LOCK_DYNAMODB_URL must name a DynamoDB table (run scripts/test.sh)")
}

fn endpoint() -> String {
    let url = url();
    let start = url.find("endpoint=").expect("an endpoint") + "endpoint=".len();
    let end = url[start..].find('&').map_or(url.len(), |i| start + i);
    url[start..end].to_owned()
}

fn unique(what: &str) -> String {
    format!("{what}-{:016x}/", rand::random::<u64>())
}

/// A storage under a prefix of its own, with requests given time on a loaded machine.
async fn dynamodb() -> DynamoDbStorage {
    builder(&unique("suite"))
        .open()
        .await
        .expect("the test table opens")
}

fn builder(prefix: &str) -> DynamoDbStorageBuilder {
    DynamoDbStorageBuilder::from_url(&url())
        .expect("a valid DynamoDB URL")
        .prefix(prefix)
        .timeout(Duration::from_secs(10))
}

/// The holder's renewal, release and re-acquisition take one request each (the hint).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_known_record_saves_the_read() {
    storage_lock_testkit::conformance::a_known_record_saves_the_read(dynamodb().await).await;
}

/// A second client whose clock runs an hour ahead finds a held lock busy (`clock: observed`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contender_whose_clock_runs_ahead_finds_a_held_lock_busy() {
    let prefix = unique("ahead");
    let holder = builder(&prefix).open().await.unwrap();
    let ahead = builder(&prefix)
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

// Only the primitives are implemented here: the lock operations are the engine's defaults.
storage_lock_testkit::storage_lock_suites!(dynamodb, lock_operations = default);

/// One unsigned JSON-API call straight to the emulator (it does not check signatures).
async fn raw(action: &str, body: serde_json::Value) -> serde_json::Value {
    let response = reqwest::Client::new()
        .post(format!("{}/", endpoint()))
        .header("content-type", "application/x-amz-json-1.0")
        .header("x-amz-target", format!("DynamoDB_20120810.{action}"))
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    serde_json::from_slice(&response.bytes().await.unwrap()).unwrap()
}

fn table_of_url() -> String {
    let url = url();
    let rest = url.strip_prefix("dynamodb://").unwrap();
    rest[..rest.find(['/', '?']).unwrap_or(rest.len())].to_owned()
}

/// An item under the prefix that is no storage-lock record is one bad row of a listing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_record_is_one_bad_row() {
    let prefix = unique("corrupt");
    let storage = builder(&prefix).open().await.unwrap();
    storage_lock_testkit::conformance::a_corrupt_record_is_one_bad_row(storage, |key| async move {
        let item = serde_json::json!({
            "k": { "S": format!("{prefix}{key}") },
            "r": { "B": base64::engine::general_purpose::STANDARD.encode("not a record") },
            "v": { "N": "7" },
        });
        raw(
            "PutItem",
            serde_json::json!({ "TableName": table_of_url(), "Item": item }),
        )
        .await;
    })
    .await;
}

/// A table whose key is not the string partition key `k` is refused at open, and a missing
/// table with `create=false` too (nothing is created).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_of_another_shape_is_refused() {
    let other = format!("other-{:016x}", rand::random::<u64>());
    raw(
        "CreateTable",
        serde_json::json!({
            "TableName": other,
            "AttributeDefinitions": [{ "AttributeName": "id", "AttributeType": "N" }],
            "KeySchema": [{ "AttributeName": "id", "KeyType": "HASH" }],
            "BillingMode": "PAY_PER_REQUEST",
        }),
    )
    .await;
    let refused = builder("").table(&other).open().await.unwrap_err();
    assert!(
        matches!(&refused, StorageError::Config { reason, .. } if reason.contains("\"k\"")),
        "{refused:?}"
    );
    let missing = format!("missing-{:016x}", rand::random::<u64>());
    let refused = builder("")
        .table(&missing)
        .create_table(false)
        .open()
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, StorageError::Config { reason, .. } if reason.contains("does not exist")),
        "{refused:?}"
    );
    let tables = raw("ListTables", serde_json::json!({})).await;
    assert!(!tables.to_string().contains(&missing), "{tables}");
}

/// What `durability=volatile` accepts for an emulator, shown: after a SIGKILL and a restart of
/// an emulator this test started, the table is gone (operations fail, never grant), and once
/// it is opened again a lock that was held is free at once and its fencing tokens start again.
/// (On every durable backend the restart tests check the opposite.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emulator_restart_forgets_held_locks_and_fencing_tokens() {
    let emulator = std::env::var("STORAGE_LOCK_S3_EMULATOR")
        .expect("STORAGE_LOCK_S3_EMULATOR (scripts/services.sh sets it)");
    let dir = tempfile::tempdir().unwrap();
    let port = spare_port();
    let args = [
        port.to_string(),
        dir.path().join("data").display().to_string(),
    ];
    let mut server = ServerProcess::start(emulator, &args, dir.path().join("emulator.log"));
    let url = format!(
        "dynamodb://restart?endpoint=http://127.0.0.1:{port}&region=us-east-1&emulator=true\
         &durability=volatile&timeout=5s"
    );
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
        "tokens started again: {} after {}",
        again.fencing_token(),
        held.fencing_token()
    );
}
