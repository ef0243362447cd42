//! The lock semantics suite through a real server on loopback: `RemoteStorage` (HTTP) →
//! `storage-lock-server` → memory, SQLite and PostgreSQL (`STORAGE_LOCK_POSTGRES_URL`, set by
//! `scripts/services.sh`). Each test starts its own server on a spare port.

use std::sync::Arc;

use storage_lock_client::RemoteStorage;
use storage_lock_core::{MemoryStorage, Storage, StorageLock};
use storage_lock_server::Server;

/// Serves `storage` on a spare loopback port for the rest of the test and connects to it.
async fn serve(storage: Arc<dyn Storage>) -> RemoteStorage {
    let locks = StorageLock::builder_arc(storage)
        .build()
        .expect("storage passes the gate");
    let base = Server::new(locks).spawn_on_loopback().await.expect("bind");
    RemoteStorage::connect(&base)
        .await
        .expect("connect to the server")
}

mod memory {
    async fn storage() -> storage_lock_client::RemoteStorage {
        super::serve(std::sync::Arc::new(super::MemoryStorage::new())).await
    }
    storage_lock_testkit::storage_lock_remote_suite!(storage);
}

mod sqlite {
    async fn storage() -> storage_lock_client::RemoteStorage {
        let dir = tempfile::tempdir().expect("tempdir").keep();
        let s = storage_lock_sql::SqliteStorage::open(dir.join("locks.db"))
            .await
            .expect("open SQLite");
        super::serve(std::sync::Arc::new(s)).await
    }
    storage_lock_testkit::storage_lock_remote_suite!(storage);
}

mod postgres {
    async fn storage() -> storage_lock_client::RemoteStorage {
        let url = std::env::var("STORAGE_LOCK_POSTGRES_URL").expect(
            "STORAGE_LOCK_POSTGRES_URL must name a PostgreSQL server (run scripts/test.sh)",
        );
        let s = storage_lock_sql::PostgresStorage::builder()
            .url(url)
            .table("storage_lock_remote_suite")
            .open()
            .await
            .expect("connect to PostgreSQL");
        super::serve(std::sync::Arc::new(s)).await
    }
    storage_lock_testkit::storage_lock_remote_suite!(storage);
}

/// A lock server's client is a storage by role, not by pretence: it offers no compare-and-set
/// primitives (no `create`/`update` that could only fail), says that it hides owners and how
/// many requests each operation takes, and its admin operations run on the server.
#[tokio::test]
async fn a_remote_storage_has_no_primitives_and_says_what_it_hides() {
    use storage_lock_core::StorageExt;
    let remote = serve(Arc::new(MemoryStorage::new())).await;
    assert!(remote.primitives().is_none());
    let caps = remote.capabilities();
    assert!(caps.owners_hidden);
    assert!(caps.round_trips.is_some_and(|r| r.contains("lock server")));
    assert!(remote.delegated_admin().is_some());
    assert_eq!(remote.fencing_floor().await.unwrap(), 0);
    let local = MemoryStorage::new();
    assert!(local.primitives().is_some() && !local.capabilities().owners_hidden);
}
