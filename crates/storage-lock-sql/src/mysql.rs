//! [`MysqlStorage`]: locks in a MySQL 8 / MariaDB 10.5+ table, judged by the server's clock.
//!
//! Round trips per operation:
//!
//! | operation | round trips | how |
//! |---|---|---|
//! | `renew` | 1 | `UPDATE … SET expires_at = LAST_INSERT_ID(now + lease)`: the OK packet carries the new expiry |
//! | `release` | 1 | `UPDATE … SET count = LAST_INSERT_ID(count - 1)`: the OK packet carries the levels left |
//! | `try_acquire` | **2** | an `INSERT … ON DUPLICATE KEY UPDATE` that writes this request's random version only if the key is free, then a `SELECT` of the row: the request won iff the row carries its version |
//!
//! `try_acquire` needs two because neither server returns rows from an upsert (MySQL has no
//! `RETURNING`; MariaDB has none for `UPDATE`), and the outcome has three values (fencing token,
//! depth, expiry) where `LAST_INSERT_ID` carries one. Correctness does not depend on the second
//! statement: the upsert alone decides, atomically, on the server clock (`NOW(3)`).
//! One caveat: two *reentrant* acquisitions by the same owner that race each other may see each
//! other's version and report busy although their level was added; that level then lapses with
//! its lease.
//!
//! **Durability**: `open` reads `innodb_flush_log_at_trx_commit` and refuses any value but 1
//! (0 and 2 lose the last second of commits in a crash: a held lock granted again, a fencing
//! token issued twice) unless [`MysqlStorageBuilder::allow_volatile`] (`?durability=volatile`).
//! Each connection pins `READ COMMITTED` and `time_zone = '+00:00'` (see `SESSION`).
//!
//! Waiting uses jittered backoff bounded by the holder's expiry: MySQL has no notifications.
//! The upsert relies on MySQL's left-to-right evaluation of `SET` assignments, so each
//! connection clears MariaDB's `SIMULTANEOUS_ASSIGNMENT` SQL mode. Linearizable on a single
//! primary; not across asynchronous-replica failover.

use std::sync::Arc;
use std::time::Duration;

use sqlx::mysql::{MySqlPool, MySqlPoolOptions};
use sqlx::{Executor, Row, query};
use storage_lock_core::storage::ops::FENCING_FLOOR_KEY;
use storage_lock_core::{
    AcquireOutcome, AcquireRequest, Capabilities, Durability, OwnerId, ReleaseOutcome,
    RenewOutcome, StorageError, Timestamp,
};

use crate::row::{COLUMNS, corrupt, holder_params, lease_millis, new_version, timestamp};
use crate::server::{ServerOptions, server_setters};

const NAME: &str = "mysql";
/// What every connection sets first, whatever the server's defaults:
/// * no `SIMULTANEOUS_ASSIGNMENT` (MariaDB): the upsert relies on left-to-right assignments;
/// * `READ COMMITTED`: the statements are written for it (the acquisition's floor read is a
///   locking read, which conflicts with a sweep raising the floor, at any isolation);
/// * `time_zone = '+00:00'`: `UNIX_TIMESTAMP(NOW(3))` converts through the session time zone,
///   which in a zone with daylight saving time repeats or skips an hour.
const SESSION: [&str; 2] = [
    "SET SESSION sql_mode = REPLACE(@@SESSION.sql_mode, 'SIMULTANEOUS_ASSIGNMENT', ''),
        SESSION time_zone = '+00:00'",
    "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
];

/// The server clock in milliseconds, fixed for the whole statement.
const NOW: &str = "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)";

/// Locks in MySQL or MariaDB; see the [module docs](self).
#[derive(Debug, Clone)]
pub struct MysqlStorage {
    pool: MySqlPool,
    sql: Arc<Statements>,
    durability: Durability,
}

/// Configures and opens a [`MysqlStorage`].
#[derive(Debug, Clone, Default)]
#[must_use = "a builder does nothing until `open`"]
pub struct MysqlStorageBuilder {
    server: ServerOptions,
}

impl MysqlStorageBuilder {
    /// A builder with defaults: table `storage_lock`, 16 connections.
    pub fn new() -> Self {
        Self::default()
    }

    /// A builder from `STORAGE_LOCK_MYSQL_URL` and `STORAGE_LOCK_MYSQL_TABLE` (each optional).
    pub fn from_env() -> Self {
        Self {
            server: ServerOptions::from_env("MYSQL"),
        }
    }

    server_setters!("mysql://user:password@host:port/db");

    /// Connects, creates the table if needed (migrating an old key column), and checks
    /// `innodb_flush_log_at_trx_commit` (see [`Self::allow_volatile`]).
    ///
    /// # Errors
    /// [`StorageError::Config`] for a bad table name or a server that flushes commits lazily
    /// (unless allowed); [`StorageError::Backend`] if the server cannot be reached.
    ///
    /// # Examples
    /// URL form: `mysql://user[:password]@host:port/db`. (Runs in the test command, which sets `STORAGE_LOCK_MYSQL_URL`.)
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), storage_lock_core::StorageError> {
    /// # let Ok(url) = std::env::var("STORAGE_LOCK_MYSQL_URL") else { return Ok(()) };
    /// use storage_lock_core::Storage;
    /// let storage = storage_lock_sql::MysqlStorage::builder()
    ///     .url(url) // mysql://root@127.0.0.1:3306/test
    ///     .table("doc_locks")
    ///     .open()
    ///     .await?;
    /// assert!(storage.capabilities().linearizable_cas);
    /// # Ok(()) }
    /// ```
    pub async fn open(self) -> Result<MysqlStorage, StorageError> {
        let url = self.server.checked_url(NAME)?;
        let pool = MySqlPoolOptions::new()
            .max_connections(self.server.max_connections)
            .acquire_timeout(self.server.acquire_timeout)
            .after_connect(|conn, _| {
                Box::pin(async move {
                    for statement in SESSION {
                        conn.execute(statement).await?;
                    }
                    Ok(())
                })
            })
            .connect(url)
            .await
            .map_err(err("open"))?;
        let sql = Statements::new(&self.server.table);
        for ddl in [&sql.create_table, &sql.create_floor] {
            query(ddl)
                .execute(&pool)
                .await
                .map_err(err("create table"))?;
        }
        migrate(&pool, &sql).await?;
        let flush: i64 = query("SELECT CAST(@@GLOBAL.innodb_flush_log_at_trx_commit AS SIGNED)")
            .fetch_one(&pool)
            .await
            .map_err(err("open"))?
            .try_get(0)
            .map_err(err("open"))?;
        let problem = (flush != 1).then(|| {
            format!(
                "innodb_flush_log_at_trx_commit is {flush}, not 1 (a crash loses the last \
                 second of commits)"
            )
        });
        let durability = Durability::judge(NAME, problem, self.server.allow_volatile)?;
        Ok(MysqlStorage {
            durability,
            pool,
            sql: Arc::new(sql),
        })
    }
}

/// Checks a `mysql://` URL as the driver reads it (options included), without connecting; the
/// URL must name a database.
///
/// # Errors
/// What the driver rejects, or a missing database (never the password).
pub fn validate_url(url: &str) -> Result<(), String> {
    use std::str::FromStr;
    sqlx::mysql::MySqlConnectOptions::from_str(url).map_err(|e| e.to_string())?;
    let path = url
        .split_once("://")
        .map(|(_, rest)| rest.split_once('?').map_or(rest, |(p, _)| p))
        .and_then(|rest| rest.split_once('/').map(|(_, db)| db))
        .unwrap_or("");
    if path.is_empty() {
        return Err("no database in the URL (mysql://user@host:port/DATABASE)".into());
    }
    Ok(())
}

impl MysqlStorage {
    /// Connects to `url` with default settings.
    pub async fn connect(url: &str) -> Result<Self, StorageError> {
        MysqlStorageBuilder::new().url(url).open().await
    }

    /// A builder.
    pub fn builder() -> MysqlStorageBuilder {
        MysqlStorageBuilder::new()
    }
}

#[derive(Debug)]
struct Statements {
    create_table: String,
    create_floor: String,
    key_column_type: String,
    migrate_key_column: String,
    now: String,
    get: String,
    create: String,
    update: String,
    delete: String,
    list: String,
    acquire: String,
    acquired: String,
    renew: String,
    release: String,
}

impl Statements {
    fn new(t: &str) -> Self {
        // Inside ON DUPLICATE KEY UPDATE, assignments run left to right and see earlier ones:
        // `version` goes first and records the decision; later columns test `mine`.
        let mine = "version = VALUES(version)";
        let live = format!("(count > 0 AND expires_at > {NOW})");
        // The key column is VARBINARY: keys compare and sort as bytes, like on every other
        // backend (a PAD SPACE collation such as `utf8mb4_bin` made `a` and `a ` one key);
        // read it back as text. (Statements name the column `{t}.lock_key`: the bare name
        // would mean this text alias, which sorts by a collation, not by bytes.)
        let select = COLUMNS.replacen("lock_key", "CONVERT(lock_key USING utf8mb4) AS lock_key", 1);
        Self {
            create_table: format!(
                "CREATE TABLE IF NOT EXISTS {t} (
                    lock_key VARBINARY(1024) PRIMARY KEY,
                    version BIGINT NOT NULL,
                    owner VARBINARY(16) NOT NULL,
                    count BIGINT NOT NULL,
                    fencing BIGINT NOT NULL,
                    acquired_at BIGINT NOT NULL,
                    expires_at BIGINT NOT NULL,
                    holder_host VARCHAR(255) NULL,
                    holder_pid BIGINT NULL,
                    holder_note TEXT NULL
                ) ENGINE = InnoDB"
            ),
            // The fencing floor's row exists from the start, so that an acquisition can lock it.
            create_floor: format!(
                "INSERT IGNORE INTO {t} ({COLUMNS})
                 VALUES ('{FENCING_FLOOR_KEY}', 0, UNHEX(REPEAT('00', 16)), 0, 0, 0, 0, NULL, NULL, NULL)"
            ),
            key_column_type: format!(
                "SELECT DATA_TYPE FROM information_schema.COLUMNS
                 WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = '{t}' AND COLUMN_NAME = 'lock_key'"
            ),
            migrate_key_column: format!("ALTER TABLE {t} MODIFY lock_key VARBINARY(1024) NOT NULL"),
            now: format!("SELECT {NOW}"),
            get: format!("SELECT {select} FROM {t} WHERE lock_key = ?"),
            create: format!(
                "INSERT IGNORE INTO {t} ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
            ),
            update: format!(
                "UPDATE {t} SET version = ?, owner = ?, count = ?, fencing = ?, acquired_at = ?,
                    expires_at = ?, holder_host = ?, holder_pid = ?, holder_note = ?
                 WHERE lock_key = ? AND version = ?"
            ),
            delete: format!("DELETE FROM {t} WHERE lock_key = ? AND version = ?"),
            list: format!(
                "SELECT {select} FROM {t}
                 WHERE {t}.lock_key >= ? AND LOCATE(?, {t}.lock_key) = 1 AND {t}.lock_key > ?
                 ORDER BY {t}.lock_key LIMIT ?"
            ),
            // key, version, owner, floor key, lease, host, pid, note, reentrant.
            // The floor is a locking read (`LOCK IN SHARE MODE`, which MySQL 8 and MariaDB both
            // accept): a sweep raises the floor before it deletes tombstones, so the raise waits
            // for this statement, and a raise committed before it is seen. A consistent read
            // could return a floor older than a deletion the insert then relies on, and so
            // re-issue a token.
            acquire: format!(
                "INSERT INTO {t} ({COLUMNS})
                 SELECT ?, ?, ?, 1,
                        COALESCE((SELECT f.fencing FROM {t} AS f WHERE f.lock_key = ? LOCK IN SHARE MODE), 0) + 1,
                        {NOW}, {NOW} + ?, ?, ?, ?
                 ON DUPLICATE KEY UPDATE
                    version = IF(NOT {live} OR (? AND owner = VALUES(owner)), VALUES(version), version),
                    fencing = IF({mine}, IF({live}, fencing, fencing + 1), fencing),
                    acquired_at = IF({mine}, IF({live}, acquired_at, VALUES(acquired_at)), acquired_at),
                    holder_host = IF({mine}, IF({live}, holder_host, VALUES(holder_host)), holder_host),
                    holder_pid = IF({mine}, IF({live}, holder_pid, VALUES(holder_pid)), holder_pid),
                    holder_note = IF({mine}, IF({live}, holder_note, VALUES(holder_note)), holder_note),
                    count = IF({mine}, IF({live}, count + 1, 1), count),
                    expires_at = IF({mine}, GREATEST(expires_at, VALUES(expires_at)), expires_at),
                    owner = IF({mine}, VALUES(owner), owner)"
            ),
            acquired: format!(
                "SELECT version, fencing, count, expires_at, holder_host, holder_pid, holder_note,
                        {NOW} AS now_ms
                 FROM {t} WHERE lock_key = ?"
            ),
            renew: format!(
                "UPDATE {t} SET version = ?, expires_at = LAST_INSERT_ID({NOW} + ?)
                 WHERE lock_key = ? AND owner = ? AND count > 0 AND expires_at > {NOW}"
            ),
            release: format!(
                "UPDATE {t} SET version = ?,
                    expires_at = IF(count = 1, LEAST(expires_at, {NOW}), expires_at),
                    count = LAST_INSERT_ID(count - 1)
                 WHERE lock_key = ? AND owner = ? AND count > 0"
            ),
        }
    }
}

/// Tables created by earlier versions had a text key with a PAD SPACE collation: move them to
/// bytes. Runs only when the catalog shows the old type.
async fn migrate(pool: &MySqlPool, sql: &Statements) -> Result<(), StorageError> {
    let ty: Option<String> = query(&sql.key_column_type)
        .fetch_optional(pool)
        .await
        .map_err(err("migrate table"))?
        .map(|r| r.try_get::<String, _>(0))
        .transpose()
        .map_err(err("migrate table"))?;
    if ty.is_some_and(|t| !t.eq_ignore_ascii_case("varbinary")) {
        query(&sql.migrate_key_column)
            .execute(pool)
            .await
            .map_err(err("migrate table"))?;
    }
    Ok(())
}

fn err(operation: &'static str) -> impl Fn(sqlx::Error) -> StorageError {
    move |e| StorageError::backend(NAME, operation, e)
}

crate::primitives::impl_sql_storage! { MysqlStorage {
    fn name(&self) -> &str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        // try_acquire takes two round trips (see the module docs).
        Capabilities::linearizable()
            .with_conditional_delete(true)
            .with_durability(self.durability)
    }

    async fn now(&self) -> Result<Timestamp, StorageError> {
        let ms: i64 = query(&self.sql.now)
            .fetch_one(&self.pool)
            .await
            .map_err(err("now"))?
            .try_get(0)
            .map_err(err("now"))?;
        Ok(timestamp(ms))
    }

    async fn acquire_once(
        &self,
        key: &str,
        req: &AcquireRequest,
    ) -> Result<AcquireOutcome, StorageError> {
        let (host, pid, note) = holder_params(req.holder.as_deref());
        loop {
            let version = new_version();
            query(&self.sql.acquire)
                .bind(key)
                .bind(version)
                .bind(req.owner.to_bytes().to_vec())
                .bind(FENCING_FLOOR_KEY)
                .bind(lease_millis(req.lease))
                .bind(host)
                .bind(pid)
                .bind(note)
                .bind(req.reentrant)
                .execute(&self.pool)
                .await
                .map_err(err("acquire"))?;
            let row = query(&self.sql.acquired)
                .bind(key)
                .fetch_optional(&self.pool)
                .await
                .map_err(err("acquire"))?;
            // Deleted in between by a sweep: try again.
            let Some(r) = row else { continue };
            // The request won iff the row carries its version.
            let won = r.try_get::<i64, _>(0).map_err(|e| corrupt(key, e))? == version;
            return crate::row::acquire_outcome(key, &r, won);
        }
    }

    async fn renew(
        &self,
        key: &str,
        owner: OwnerId,
        lease: Duration,
    ) -> Result<RenewOutcome, StorageError> {
        let done = query(&self.sql.renew)
            .bind(new_version())
            .bind(lease_millis(lease))
            .bind(key)
            .bind(owner.to_bytes().to_vec())
            .execute(&self.pool)
            .await
            .map_err(err("renew"))?;
        Ok(if done.rows_affected() == 1 {
            RenewOutcome::Renewed {
                expires_at: Timestamp::from_millis(done.last_insert_id()),
            }
        } else {
            RenewOutcome::NotHeld
        })
    }

    async fn release(&self, key: &str, owner: OwnerId) -> Result<ReleaseOutcome, StorageError> {
        let done = query(&self.sql.release)
            .bind(new_version())
            .bind(key)
            .bind(owner.to_bytes().to_vec())
            .execute(&self.pool)
            .await
            .map_err(err("release"))?;
        Ok(if done.rows_affected() == 1 {
            ReleaseOutcome::Released {
                remaining: u32::try_from(done.last_insert_id()).unwrap_or(u32::MAX),
            }
        } else {
            ReleaseOutcome::NotHeld
        })
    }
}}
