//! `connect(url)`: every registered scheme opens, bad URLs get typed errors.

use storage_lock::{ConnectError, DistributedLock, connect};

#[tokio::test]
async fn memory_and_sqlite_urls_open() {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = format!(
        "sqlite://{}?table=my_locks",
        dir.path().join("l.db").display()
    );
    for url in ["memory:", sqlite.as_str()] {
        let locks = connect(url).await.unwrap_or_else(|e| panic!("{url}: {e}"));
        let h = locks
            .try_acquire_for("x", std::time::Duration::ZERO)
            .await
            .unwrap();
        assert!(h.is_some(), "{url}");
    }
    assert!(connect("memory:").await.unwrap().provider().process_local);
    assert!(!connect(&sqlite).await.unwrap().provider().process_local);
}

#[tokio::test]
async fn bad_urls_are_typed_errors() {
    for (url, unknown) in [
        ("nosuch://x", true),
        ("no-colon", false),
        ("sqlite://", false),
        ("sqlite:relative.db", false),
        ("sqlite:///tmp/x.db?table=drop;table", false),
        ("sqlite:///tmp/x.db?colour=red", false),
        ("memory:extra", false),
    ] {
        match connect(url).await {
            Err(ConnectError::UnknownScheme { .. }) if unknown => {}
            Err(ConnectError::InvalidUrl { .. }) if !unknown => {}
            other => panic!("{url}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn unreadable_sqlite_path_is_a_storage_error() {
    let r = connect("sqlite:///proc/definitely/not/here.db").await;
    assert!(matches!(r, Err(ConnectError::Storage(_))), "{r:?}");
}
