//! Both suites against [`MysqlStorage`] on the server named by `STORAGE_LOCK_MYSQL_URL`
//! (`scripts/services.sh` starts MariaDB and sets it). The tests share one table; each uses keys
//! under a prefix of its own.

use storage_lock_sql::MysqlStorage;

async fn mysql() -> MysqlStorage {
    let url = std::env::var("STORAGE_LOCK_MYSQL_URL")
        .expect("STORAGE_LOCK_MYSQL_URL must name a MySQL/MariaDB server (run scripts/test.sh)");
    MysqlStorage::builder()
        .url(url)
        .table("storage_lock_suite")
        // Time for a loaded machine: the default 5 s to get a connection failed the suite
        // once with a release build beside it (PoolTimedOut); no case needs it to time out.
        .acquire_timeout(std::time::Duration::from_secs(30))
        .open()
        .await
        .expect("connect to MySQL/MariaDB")
}

storage_lock_testkit::storage_lock_suites!(mysql);

/// Both suites again on MySQL 8's acquisition path (the upsert, then a `SELECT`: no
/// `RETURNING`), which the MariaDB the tests run against would otherwise never take.
mod two_statement_acquire {
    use storage_lock_sql::MysqlStorage;

    async fn mysql_without_returning() -> MysqlStorage {
        let url = std::env::var("STORAGE_LOCK_MYSQL_URL").expect(
            "STORAGE_LOCK_MYSQL_URL must name a MySQL/MariaDB server (run scripts/test.sh)",
        );
        MysqlStorage::builder()
            .url(url)
            .table("storage_lock_suite")
            // Time for a loaded machine: the default 5 s to get a connection failed the suite
            // once with a release build beside it (PoolTimedOut); no case needs it to time out.
            .acquire_timeout(std::time::Duration::from_secs(30))
            .without_returning()
            .open()
            .await
            .expect("connect to MySQL/MariaDB")
    }

    storage_lock_testkit::storage_lock_suites!(mysql_without_returning);
}

/// Regression: tables made by earlier versions keyed locks by `VARCHAR … utf8mb4_bin`, a PAD
/// SPACE collation under which `rv-pad` and `rv-pad ` are one key. Opening migrates the key to
/// bytes, after which they are two locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_pad_space_tables_are_migrated_to_byte_keys() {
    use std::time::Duration;
    use storage_lock_core::{AcquireOutcome, AcquireRequest, OwnerId, Storage};

    let url = std::env::var("STORAGE_LOCK_MYSQL_URL")
        .expect("STORAGE_LOCK_MYSQL_URL must name a MySQL/MariaDB server (run scripts/test.sh)");
    let table = format!(
        "sl_pad_{:08x}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_nanos()
            ^ std::process::id()
    );
    let pool = sqlx::MySqlPool::connect(&url).await.unwrap();
    sqlx::query(&format!(
        "CREATE TABLE {table} (
            lock_key VARCHAR(512) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin PRIMARY KEY,
            version BIGINT NOT NULL, owner VARBINARY(16) NOT NULL, count BIGINT NOT NULL,
            fencing BIGINT NOT NULL, acquired_at BIGINT NOT NULL, expires_at BIGINT NOT NULL,
            holder_host VARCHAR(255) NULL, holder_pid BIGINT NULL, holder_note TEXT NULL
        ) ENGINE = InnoDB"
    ))
    .execute(&pool)
    .await
    .unwrap();
    let s = MysqlStorage::builder()
        .url(&url)
        .table(&table)
        .open()
        .await
        .expect("open migrates");
    let req = || AcquireRequest {
        owner: OwnerId::random(),
        lease: Duration::from_secs(30),
        holder: None,
        reentrant: false,
    };
    let a = s.acquire_once("rv-pad", &req()).await.unwrap();
    let b = s.acquire_once("rv-pad ", &req()).await.unwrap();
    sqlx::query(&format!("DROP TABLE {table}"))
        .execute(&pool)
        .await
        .ok();
    assert!(matches!(a, AcquireOutcome::Acquired { .. }), "{a:?}");
    assert!(
        matches!(b, AcquireOutcome::Acquired { .. }),
        "'rv-pad ' is the same lock as 'rv-pad': {b:?}"
    );
}

/// Waiting survives a server restart (issue 26 #10): a MariaDB of the test's own (a fresh data
/// directory, `innodb_flush_log_at_trx_commit = 1`, on a spare port) is killed with `SIGKILL`
/// while a waiter waits and started again; the waiter keeps its later grant for its whole
/// lease, the held hold is lost or still held with the storage agreeing, and fencing tokens
/// after the restart are higher (`restart_keeps_fencing`, as for the other servers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_restart_keeps_fencing() {
    use storage_lock_testkit::restart::{
        ServerProcess, restart_keeps_fencing, spare_port, wait_until,
    };
    let server_bin = ["/usr/sbin/mariadbd", "/usr/sbin/mysqld"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .unwrap_or("mariadbd");
    let root = std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut install = std::process::Command::new("mariadb-install-db");
    install
        .arg("--no-defaults")
        .arg(format!("--datadir={}", data.display()))
        .args(["--auth-root-authentication-method=normal", "--skip-test-db"]);
    if root {
        install.arg("--user=root");
    }
    let out = install.output().expect("mariadb-install-db");
    assert!(out.status.success(), "mariadb-install-db: {out:?}");
    let port = spare_port();
    let mut args = vec![
        "--no-defaults".to_owned(),
        format!("--datadir={}", data.display()),
        format!("--port={port}"),
        "--bind-address=127.0.0.1".to_owned(),
        format!("--socket={}", dir.path().join("sock").display()),
        "--skip-log-bin".to_owned(),
        "--innodb-flush-log-at-trx-commit=1".to_owned(),
    ];
    if root {
        args.push("--user=root".to_owned());
    }
    let mut server = ServerProcess::start(server_bin, &args, dir.path().join("server.log"));
    let url = format!("mysql://root@127.0.0.1:{port}/mysql");
    let open = || MysqlStorage::builder().url(&url).table("restart").open();
    let storage = wait_until("MariaDB starts", open).await;
    restart_keeps_fencing(storage, async {
        server.restart();
        drop(wait_until("MariaDB restarts", open).await);
    })
    .await;
}
