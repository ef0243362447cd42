//! Baselines and set-up shared by the benchmarks.

#![allow(dead_code, missing_docs)] // each bench uses a subset; bench helpers

use std::collections::HashMap;
use std::sync::Mutex;

/// The naive baseline: a keyed `Mutex<HashMap>` lock table (insert-if-absent, remove).
#[derive(Default)]
pub struct NaiveTable {
    held: Mutex<HashMap<String, u64>>,
    next: Mutex<u64>,
}

impl NaiveTable {
    pub fn try_lock(&self, key: &str) -> Option<u64> {
        let mut held = self.held.lock().unwrap();
        if held.contains_key(key) {
            return None;
        }
        let token = {
            let mut n = self.next.lock().unwrap();
            *n += 1;
            *n
        };
        held.insert(key.to_owned(), token);
        Some(token)
    }

    pub fn unlock(&self, key: &str) {
        self.held.lock().unwrap().remove(key);
    }
}

/// A raw SQLite lock table: `INSERT OR IGNORE` + `DELETE`, the least a SQL lock can do.
pub struct RawSqlite {
    pub pool: sqlx::SqlitePool,
}

impl RawSqlite {
    pub async fn open(path: &std::path::Path) -> Self {
        use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};
        let opts = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal);
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
