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

/// A SQLite path is percent-decoded, as the refusal of a raw `#` tells users to write it: the
/// file of `a%23b.db` is `a#b.db` (it was created as `a%23b.db`).
#[tokio::test]
async fn a_percent_encoded_sqlite_path_names_the_decoded_file() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}/a%23b%20c.db", dir.path().display());
    let locks = connect(&url).await.unwrap_or_else(|e| panic!("{url}: {e}"));
    drop(locks);
    assert!(dir.path().join("a#b c.db").exists(), "{url}");
    assert!(!dir.path().join("a%23b%20c.db").exists(), "{url}");
    let raw = format!("sqlite://{}/a#b.db", dir.path().display());
    let Err(ConnectError::InvalidUrl { reason, .. }) = connect(&raw).await else {
        panic!("{raw} opened")
    };
    assert!(reason.contains("%23"), "{reason}");
    let bad = format!("sqlite://{}/100%.db", dir.path().display());
    assert!(
        matches!(connect(&bad).await, Err(ConnectError::InvalidUrl { .. })),
        "{bad}"
    );
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

/// Misspelled options are errors on every scheme (they were silently ignored on PostgreSQL,
/// MySQL and Redis), and so is MySQL's `timezone` (the session is pinned to UTC).
#[tokio::test]
async fn unknown_options_are_rejected_on_every_scheme() {
    for url in [
        "postgres://u@127.0.0.1:1/db?tabel=x",
        "mysql://root@127.0.0.1:1/test?tabel=x",
        "mariadb://root@127.0.0.1:1/test?timezone=%2B02:00",
        "redis://127.0.0.1:1/?prefx=a",
        "sqlite:///tmp/x.db?tabel=x",
        "postgres://u@127.0.0.1:1/db?durability=maybe",
    ] {
        match connect(url).await {
            Err(ConnectError::InvalidUrl { reason, .. }) => {
                assert!(
                    reason.contains("unknown option") || reason.contains("durability"),
                    "{url}: {reason}"
                )
            }
            other => panic!("{url}: {other:?}"),
        }
    }
}

/// Passwords never reach an error message.
#[tokio::test]
async fn passwords_are_redacted_from_errors() {
    for url in [
        "postgres://u:s3cret@127.0.0.1:1/db?table=bad-name",
        "mysql://root:s3cret@127.0.0.1:1/test?nope=1",
        "redis://:s3cret@127.0.0.1:1/?nope=1",
        "postgres://u:s3cret@127.0.0.1:1/db",
    ] {
        let err = connect(url).await.unwrap_err();
        let shown = format!("{err} {err:?}");
        assert!(!shown.contains("s3cret"), "{url}: {shown}");
    }
    assert_eq!(
        storage_lock::backend::redact_url("postgres://u:pw@h:5/db?x=1"),
        "postgres://u:***@h:5/db?x=1"
    );
    assert_eq!(
        storage_lock::backend::redact_url("redis://h:1/"),
        "redis://h:1/"
    );
    // Builders print no password either.
    let pg = storage_lock::PostgresStorage::builder().url("postgres://u:s3cret@h/db");
    let redis = storage_lock::RedisStorage::builder().url("redis://:s3cret@h/");
    for shown in [format!("{pg:?}"), format!("{redis:?}")] {
        assert!(
            !shown.contains("s3cret") && shown.contains("***"),
            "{shown}"
        );
    }
}

/// URLs the drivers reject are usage errors (`InvalidUrl`), found before connecting — not
/// "storage unavailable".
#[tokio::test]
async fn urls_the_drivers_reject_are_invalid_urls() {
    for url in [
        "postgres://u@127.0.0.1:5432/db?sslmode=bogus",
        "mysql://root@127.0.0.1:3306/test?ssl-mode=bogus",
        "mysql://root@127.0.0.1:3306",
        "mysql://root@127.0.0.1:3306/",
        "redis://127.0.0.1:6379/notanumber",
    ] {
        let r = connect(url).await;
        assert!(
            matches!(r, Err(ConnectError::InvalidUrl { .. })),
            "{url}: {r:?}"
        );
    }
}

/// Options are percent-decoded (a Redis Cluster hash tag is `%7Blocks%7D:` in a URL).
#[tokio::test]
async fn options_are_percent_decoded() {
    let Ok(url) = std::env::var("STORAGE_LOCK_REDIS_URL") else {
        panic!("STORAGE_LOCK_REDIS_URL must name a Redis server (run scripts/test.sh)")
    };
    let sep = if url.contains('?') { '&' } else { '?' };
    let storage = storage_lock::connect_storage(&format!("{url}{sep}prefix=%7Blocks%7D:"))
        .await
        .unwrap();
    assert!(
        format!("{storage:?}").contains("\"{locks}:\""),
        "{storage:?}"
    );
}
