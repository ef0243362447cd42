//! Baselines and set-up shared by the benchmarks.

#![allow(dead_code, missing_docs)] // each bench uses a subset; bench helpers

#[path = "../../../storage-lock-core/benches/support/naive_table.rs"]
mod naive_table;
#[allow(unused_imports)] // each bench uses a subset
pub use naive_table::NaiveTable;

/// A raw SQLite lock table: `INSERT OR IGNORE` + `DELETE`, the least a SQL lock can do.
pub struct RawSqlite {
    pub pool: sqlx::SqlitePool,
}

impl RawSqlite {
    /// A hand-written lock table in WAL mode; `synced`: every commit waits for the disk
    /// (`synchronous = FULL`, as the engine's acquisitions do), else `NORMAL`.
    pub async fn open(path: &std::path::Path, synced: bool) -> Self {
        use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
        let opts = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(if synced {
                SqliteSynchronous::Full
            } else {
                SqliteSynchronous::Normal
            });
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(opts)
            .await
            .unwrap();
        sqlx::query("CREATE TABLE IF NOT EXISTS raw_lock (k TEXT PRIMARY KEY, owner BLOB NOT NULL, expires INTEGER NOT NULL)")
            .execute(&pool)
            .await
            .unwrap();
        Self { pool }
    }

    pub async fn cycle(&self, key: &str) {
        let owner = [7u8; 16];
        let r =
            sqlx::query("INSERT OR IGNORE INTO raw_lock (k, owner, expires) VALUES (?1, ?2, ?3)")
                .bind(key)
                .bind(&owner[..])
                .bind(0i64)
                .execute(&self.pool)
                .await
                .unwrap();
        assert_eq!(r.rows_affected(), 1);
        sqlx::query("DELETE FROM raw_lock WHERE k = ?1 AND owner = ?2")
            .bind(key)
            .bind(&owner[..])
            .execute(&self.pool)
            .await
            .unwrap();
    }
}

/// p50/p99 of release → waiter-holds, over `n` hand-offs of one key.
pub async fn handoff<S: storage_lock::backend::Storage + ?Sized>(
    locks: &storage_lock::StorageLock<S>,
    n: usize,
) -> (std::time::Duration, std::time::Duration) {
    use std::time::{Duration, Instant};
    use storage_lock::{AcquireOptions, Wait};
    let opts = AcquireOptions::default().lease(Duration::from_secs(30));
    let wait = opts.clone().wait(Wait::Forever);
    let key = format!("handoff-{:x}", std::process::id());
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let holder = locks.try_acquire(&key, &opts).await.unwrap().unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (l, w, k) = (locks.clone(), wait.clone(), key.clone());
        let waiter = tokio::spawn(async move {
            let h = l.try_acquire(&k, &w).await.unwrap().unwrap();
            let _ = tx.send(Instant::now());
            h
        });
        tokio::time::sleep(Duration::from_millis(5)).await; // let the waiter start waiting
        let released = Instant::now();
        holder.release().await.unwrap();
        let got = rx.await.unwrap();
        samples.push(got.duration_since(released));
        waiter.await.unwrap().release().await.unwrap();
    }
    percentiles(samples)
}

/// (p50, p99) of `samples`.
pub fn percentiles(
    mut samples: Vec<std::time::Duration>,
) -> (std::time::Duration, std::time::Duration) {
    samples.sort();
    let n = samples.len();
    (samples[n / 2], samples[(n * 99 / 100).min(n - 1)])
}
