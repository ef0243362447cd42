//! [`MysqlStorage`]: locks in a MySQL 8 / MariaDB 10.5+ table, judged by the server's clock.
//!
//! Round trips per operation:
//!
//! | operation | round trips | how |
//! |---|---|---|
//! | `renew` | 1 | `UPDATE … SET expires_at = LAST_INSERT_ID(now + lease)`: the OK packet carries the new expiry |
//! | `renew_many` (the watchdog's batches) | 4 per batch | in one transaction, an `UPDATE … JOIN` of the batch's keys that writes one random version, then a `SELECT` of the rows: a key was renewed iff its owner's row carries that version |
//! | `release` | 1 (2 for a reentrant level that leaves the hold held) | `UPDATE … LAST_INSERT_ID(fencing << 1 \| more)`: the OK packet carries the released hold's token and whether levels are left |
//! | `acquire_once` on MariaDB | 1 | an `INSERT … ON DUPLICATE KEY UPDATE … RETURNING` that writes this request's random version only if the key is free (or its own to re-enter) and returns the row as the statement left it: the request won iff the row carries its version, and a busy answer carries the holder |
//! | `acquire_once` on MySQL 8 | **2** | the same upsert without `RETURNING`, then a `SELECT` of the row |
//!
//! MySQL 8 has no `RETURNING`, and the outcome has three values (fencing token, depth, expiry)
//! where `LAST_INSERT_ID` carries one, so it needs the second statement; `open` asks the server
//! which it is (`VERSION()`). Correctness does not depend on the second statement: the upsert
//! alone decides, atomically, on the server clock (`NOW(3)`). One caveat on MySQL 8 only: two
//! *reentrant* acquisitions by the same owner that race each other may see each other's version
//! and report busy although their level was added; that level then lapses with its lease.
//! (MariaDB's `RETURNING` reports the row as this statement left it, so it has no such race.)
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

use std::str::FromStr;

use sqlx::mysql::{MySql, MySqlConnectOptions, MySqlConnection, MySqlPool, MySqlPoolOptions};
use sqlx::{Executor, Row, query};
use storage_lock_core::storage::ops::FENCING_FLOOR_KEY;
use storage_lock_core::storage::url::{DriverUrl, allow_volatile};
use storage_lock_core::{
    AcquireAnyOutcome, AcquireManyOutcome, AcquireOutcome, AcquireRequest, Capabilities,
    Durability, OwnerId, ReleaseOutcome, RenewOutcome, RenewRequest, StorageError, Timestamp,
};

use crate::conns::{Conns, Setup};
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

/// The driver's URL options that [`MysqlStorageBuilder::from_url`] passes through (not
/// `timezone`: the session is pinned to UTC).
const MYSQL_OPTIONS: &[&str] = &[
    "ssl-mode",
    "ssl-ca",
    "ssl-cert",
    "ssl-key",
    "sslmode",
    "sslca",
    "charset",
    "collation",
    "socket",
    "statement-cache-capacity",
];

/// The server clock in milliseconds, fixed for the whole statement.
const NOW: &str = "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)";

/// Locks in MySQL or MariaDB; see the [module docs](self).
#[derive(Debug, Clone)]
pub struct MysqlStorage {
    /// Schema work, the CAS primitives, batched renewals (a transaction).
    pool: MySqlPool,
    /// The lock operations (see `crate::conns`).
    conns: Arc<Conns<MySql>>,
    sql: Arc<Statements>,
    table: Arc<str>,
    durability: Durability,
    /// MariaDB (10.5+): the acquisition returns its row (`RETURNING`); MySQL 8 reads it after.
    returning: bool,
}

/// Configures and opens a [`MysqlStorage`].
#[derive(Debug, Clone, Default)]
#[must_use = "a builder does nothing until `open`"]
pub struct MysqlStorageBuilder {
    server: ServerOptions,
    /// Tests only: take MySQL 8's path (no `RETURNING`) on MariaDB too.
    without_returning: bool,
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
            without_returning: false,
        }
    }

    /// A builder from `mysql://user:password@host:port/db[?table=NAME&durability=volatile
    /// &…driver options]` (also `mariadb://`; what `storage_lock::connect` opens): the driver's
    /// own options (`ssl-mode`, `ssl-ca`, `charset`, …) pass through, anything else is refused.
    /// The session time zone is pinned to UTC (expiry arithmetic depends on it), so `timezone`
    /// is refused.
    ///
    /// # Errors
    /// [`StorageError::Config`] for an unknown option, an invalid table name, or a URL the
    /// driver rejects (never showing the password).
    ///
    /// # Examples
    /// ```
    /// use storage_lock_sql::MysqlStorageBuilder;
    /// assert!(MysqlStorageBuilder::from_url("mariadb://root@h/db?table=jobs").is_ok());
    /// assert!(MysqlStorageBuilder::from_url("mysql://root@h/db?timezone=%2B01:00").is_err());
    /// ```
    pub fn from_url(url: &str) -> Result<Self, StorageError> {
        let invalid = |reason: String| StorageError::config("mysql", reason);
        let mut u =
            DriverUrl::split(url, &["table", "durability"], MYSQL_OPTIONS).map_err(invalid)?;
        let driver = match u.driver.get(.."mariadb:".len()) {
            Some(s) if s.eq_ignore_ascii_case("mariadb:") => {
                format!("mysql:{}", &u.driver["mariadb:".len()..])
            }
            _ => u.driver.clone(),
        };
        validate_url(&driver).map_err(invalid)?;
        let mut b = Self::new().url(driver);
        if let Some(table) = u.take("table") {
            crate::naming::validate_table_name(&table).map_err(|e| invalid(e.to_string()))?;
            b = b.table(table);
        }
        if let Some(d) = u.take("durability") {
            b = b.allow_volatile(allow_volatile(&d).map_err(invalid)?);
        }
        Ok(b)
    }

    server_setters!("mysql://user:password@host:port/db");

    /// Acquires as on MySQL 8 (the upsert, then a `SELECT`) even on MariaDB, so that the test
    /// suites cover that path on the MariaDB the tests run against. Not for production use.
    #[doc(hidden)]
    pub fn without_returning(mut self) -> Self {
        self.without_returning = true;
        self
    }

    /// Connects, creates the table if needed (migrating an old key column), and checks
    /// `innodb_flush_log_at_trx_commit` (see [`Self::allow_volatile`]).
    ///
    /// # Errors
    /// [`StorageError::Config`] for a bad table name or a server that flushes commits lazily
    /// (unless allowed); [`StorageError::Backend`] if the server cannot be reached.
    ///
    /// # Examples
    /// URL form: `mysql://user[:password]@host:port/db` (`tests/mysql.rs` runs the same lines
    /// against a real server):
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), storage_lock_core::StorageError> {
    /// let url = "mysql://root@127.0.0.1:3306/test";
    /// use storage_lock_core::Storage;
    /// let storage = storage_lock_sql::MysqlStorage::builder()
    ///     .url(url)
    ///     .table("doc_locks")
    ///     .open()
    ///     .await?;
    /// assert!(storage.capabilities().linearizable_cas);
    /// # Ok(()) }
    /// ```
    pub async fn open(self) -> Result<MysqlStorage, StorageError> {
        let url = self.server.checked_url(NAME)?;
        let options = MySqlConnectOptions::from_str(url)
            .map_err(|e| StorageError::config(NAME, format!("invalid URL: {e}")))?;
        crate::server::probe::<MySqlConnection>(NAME, &options, self.server.acquire_timeout)
            .await?;
        let pool = MySqlPoolOptions::new()
            .max_connections(self.server.max_connections)
            .acquire_timeout(self.server.acquire_timeout)
            .after_connect(|conn, _| session(conn))
            .connect_with(options.clone())
            .await
            .map_err(err("open"))?;
        let conns = Conns::new(
            options,
            session,
            self.server.max_connections,
            self.server.acquire_timeout,
        );
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
        let version: String = query("SELECT VERSION()")
            .fetch_one(&pool)
            .await
            .map_err(err("open"))?
            .try_get(0)
            .map_err(err("open"))?;
        Ok(MysqlStorage {
            conns: Arc::new(conns),
            table: self.server.table.as_str().into(),
            returning: version.contains("MariaDB") && !self.without_returning,
            durability,
            pool,
            sql: Arc::new(sql),
        })
    }
}

/// Sets up a new connection ([`SESSION`]), in the pool and in the lock operations' [`Conns`].
fn session(conn: &mut MySqlConnection) -> Setup<'_> {
    Box::pin(async move {
        for statement in SESSION {
            conn.execute(statement).await?;
        }
        Ok(())
    })
}

/// Checks a `mysql://` URL as the driver reads it (options included), without connecting; the
/// URL must name a database.
///
/// # Errors
/// What the driver rejects, or a missing database (never the password).
pub fn validate_url(url: &str) -> Result<(), String> {
    MySqlConnectOptions::from_str(url).map_err(|e| e.to_string())?;
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
    /// One attempt at several keys in one transaction, the keys' rows locked in the order
    /// given: `need` of them (the first free ones; `need` = every key for a multi-lock, which
    /// stops at the first held key), committed only if the attempt succeeds, rolled back
    /// otherwise. `Ok(None)`: a row vanished between the statements (a sweep; MySQL 8), or the
    /// database aborted the transaction as a deadlock victim: nothing was taken; try again.
    async fn attempt_in_transaction(
        &self,
        conn: &mut MySqlConnection,
        keys: &[&str],
        need: usize,
        req: &AcquireRequest,
    ) -> Result<Option<Result<AcquireAnyOutcome, StorageError>>, sqlx::Error> {
        use sqlx::Connection as _;
        let (host, pid, note) = holder_params(req.holder.as_deref());
        let statement = if self.returning {
            &self.sql.acquire_returning
        } else {
            &self.sql.acquire
        };
        let mut tx = conn.begin().await?;
        let (mut taken, mut busy) = (Vec::with_capacity(need), Vec::new());
        for (index, key) in keys.iter().enumerate() {
            if taken.len() == need {
                break;
            }
            let version = new_version();
            let upsert = take(statement, key, version, req, (host, pid, note));
            let row = if self.returning {
                upsert.fetch_optional(&mut *tx).await
            } else {
                match upsert.execute(&mut *tx).await {
                    Ok(_) => {
                        query(&self.sql.acquired)
                            .bind(*key)
                            .fetch_optional(&mut *tx)
                            .await
                    }
                    Err(e) => Err(e),
                }
            };
            let row = match row {
                Ok(Some(row)) => row,
                Ok(None) => return tx.rollback().await.map(|()| None),
                Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("40001") => {
                    return tx.rollback().await.map(|()| None);
                }
                Err(e) => return Err(e),
            };
            let won = match row.try_get::<i64, _>(0) {
                Ok(v) => v == version,
                Err(e) => return Ok(Some(Err(corrupt(key, e)))),
            };
            match crate::row::acquire_outcome(key, &row, won) {
                Ok(grant) if won => taken.push((index, grant)),
                Ok(held) => {
                    busy.push((index, held));
                    if need == keys.len() {
                        break; // a multi-lock: the first held key is the answer
                    }
                }
                Err(e) => return Ok(Some(Err(e))),
            }
        }
        if taken.len() < need {
            tx.rollback().await?;
            return Ok(Some(Ok(AcquireAnyOutcome::Busy(busy))));
        }
        match tx.commit().await {
            Ok(()) => Ok(Some(Ok(AcquireAnyOutcome::Acquired { taken, gate: 0 }))),
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("40001") => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// [`Self::attempt_in_transaction`] on a connection of the pool, again after a deadlock or
    /// a sweep (up to 8 times; then `None`: the caller takes the keys one by one).
    async fn attempt(
        &self,
        keys: &[&str],
        need: usize,
        req: &AcquireRequest,
    ) -> Result<Option<AcquireAnyOutcome>, StorageError> {
        for _ in 0..8 {
            let mut c = self.conns.get().await.map_err(err("acquire"))?;
            let outcome = self.attempt_in_transaction(c.conn(), keys, need, req).await;
            c.keep_if(&outcome);
            if let Some(outcome) = outcome.map_err(err("acquire"))? {
                return outcome.map(Some);
            }
        }
        Ok(None)
    }

    /// Connects to `url` with default settings.
    pub async fn connect(url: &str) -> Result<Self, StorageError> {
        MysqlStorageBuilder::new().url(url).open().await
    }

    /// A builder.
    pub fn builder() -> MysqlStorageBuilder {
        MysqlStorageBuilder::new()
    }

    /// Nothing to announce: MySQL has no change notifications (waiters back off).
    async fn announce_free(&self, _key: &str) {}
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
    acquire_returning: String,
    acquired: String,
    renew: String,
    release: String,
    /// The levels of a reentrant hold left after a release that did not free it.
    levels_left: String,
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
        // What the acquisition reports, in the order `row::acquire_outcome` reads (after the
        // version): by `RETURNING` on MariaDB, by a second statement on MySQL 8.
        let outcome = format!(
            "version, fencing, count, expires_at, holder_host, holder_pid, holder_note, {NOW} AS now_ms"
        );
        // key, version, owner, floor key, lease, host, pid, note, reentrant.
        // The floor is a locking read (`LOCK IN SHARE MODE`, which MySQL 8 and MariaDB both
        // accept): a sweep raises the floor before it deletes tombstones, so the raise waits
        // for this statement, and a raise committed before it is seen. A consistent read
        // could return a floor older than a deletion the insert then relies on, and so
        // re-issue a token.
        let acquire = format!(
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
        );
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
            acquire_returning: format!("{acquire} RETURNING {outcome}"),
            acquire,
            acquired: format!("SELECT {outcome} FROM {t} WHERE lock_key = ?"),
            renew: format!(
                "UPDATE {t} SET version = ?, expires_at = LAST_INSERT_ID({NOW} + ?)
                 WHERE lock_key = ? AND owner = ? AND count > 0 AND expires_at > {NOW}"
            ),
            release: format!(
                "UPDATE {t} SET version = ?,
                    expires_at = IF(count = 1, LEAST(expires_at, {NOW}), expires_at),
                    count = count - 1 + LEAST(0, LAST_INSERT_ID(
                        (CAST(fencing AS UNSIGNED) << 1) | IF(count > 1, 1, 0)))
                 WHERE lock_key = ? AND owner = ? AND count > 0"
            ),
            levels_left: format!("SELECT count FROM {t} WHERE lock_key = ? AND owner = ?"),
        }
    }
}

/// A `renew_many` outcome from its `SELECT` row (index, version, expiry): renewed iff the row
/// carries the batch's version.
fn renewed_row(
    key: &str,
    row: &sqlx::mysql::MySqlRow,
    version: i64,
) -> Result<RenewOutcome, StorageError> {
    let v: i64 = row.try_get(1).map_err(|e| corrupt(key, e))?;
    if v != version {
        return Ok(RenewOutcome::NotHeld);
    }
    let e: i64 = row.try_get(2).map_err(|e| corrupt(key, e))?;
    Ok(RenewOutcome::Renewed {
        expires_at: timestamp(e),
    })
}

/// The two statements of `renew_many` for `n` keys: an `UPDATE` joined with the keys (`n` ×
/// key, owner, lease ms; then the batch's version) and a `SELECT` of their rows (`n` × index,
/// key, owner: a request is answered only by a row its owner holds).
fn renew_many_statements(t: &str, n: usize) -> (String, String) {
    let rows = |first: &str, rest: &str| {
        std::iter::once(first)
            .chain(std::iter::repeat_n(rest, n.saturating_sub(1)))
            .collect::<Vec<_>>()
            .join(" UNION ALL ")
    };
    (
        format!(
            "UPDATE {t} JOIN ({}) AS r ON {t}.lock_key = r.k AND {t}.owner = r.o
             SET {t}.version = ?, {t}.expires_at = {NOW} + r.l
             WHERE {t}.count > 0 AND {t}.expires_at > {NOW}",
            rows("SELECT ? AS k, ? AS o, ? AS l", "SELECT ?, ?, ?")
        ),
        format!(
            "SELECT r.i, {t}.version, {t}.expires_at FROM ({}) AS r
             JOIN {t} ON {t}.lock_key = r.k AND {t}.owner = r.o",
            rows("SELECT ? AS i, ? AS k, ? AS o", "SELECT ?, ?, ?")
        ),
    )
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
        Capabilities::linearizable()
            .with_conditional_delete(true)
            .with_durability(self.durability)
            .with_fencing_bound(crate::row::FENCING_BOUND)
            .with_round_trips(if self.returning {
                "1 / 1 / 1 (one statement each; MariaDB's upsert returns the row)"
            } else {
                "2 / 1 / 1 (no RETURNING from an upsert: the acquisition reads the row after)"
            })
    }

    async fn now(&self) -> Result<Timestamp, StorageError> {
        let mut c = self.conns.get().await.map_err(err("now"))?;
        let row = query(&self.sql.now).fetch_one(c.conn()).await;
        c.keep_if(&row);
        let ms: i64 = row
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
            let statement = if self.returning {
                &self.sql.acquire_returning
            } else {
                &self.sql.acquire
            };
            let upsert = take(statement, key, version, req, (host, pid, note));
            let mut c = self.conns.get().await.map_err(err("acquire"))?;
            let row = if self.returning {
                upsert.fetch_optional(c.conn()).await
            } else {
                match upsert.execute(c.conn()).await {
                    Ok(_) => {
                        query(&self.sql.acquired)
                            .bind(key)
                            .fetch_optional(c.conn())
                            .await
                    }
                    Err(e) => Err(e),
                }
            };
            c.keep_if(&row);
            let row = row.map_err(err("acquire"))?;
            // Deleted in between by a sweep (MySQL 8's second statement): try again.
            let Some(r) = row else { continue };
            // The request won iff the row carries its version.
            let won = r.try_get::<i64, _>(0).map_err(|e| corrupt(key, e))? == version;
            return crate::row::acquire_outcome(key, &r, won);
        }
    }

    /// Every key in one transaction, the rows locked in key order (bytewise, whatever order
    /// the caller gave, so two calls cannot deadlock each other on shared keys): written
    /// together or not at all. Keys still contended after 8 deadlocks go one by one.
    async fn acquire_many(
        &self,
        keys: &[&str],
        req: &AcquireRequest,
    ) -> Result<AcquireManyOutcome, StorageError> {
        let mut order: Vec<usize> = (0..keys.len()).collect();
        order.sort_by_key(|&i| keys[i].as_bytes());
        let sorted: Vec<&str> = order.iter().map(|&i| keys[i]).collect();
        match self.attempt(&sorted, sorted.len(), req).await? {
            Some(AcquireAnyOutcome::Acquired { taken, .. }) => {
                let mut grants: Vec<Option<AcquireOutcome>> = vec![None; keys.len()];
                for (at, grant) in taken {
                    grants[order[at]] = Some(grant);
                }
                grants
                    .into_iter()
                    .map(|g| g.ok_or_else(|| corrupt(&keys.join(", "), "a key without a grant")))
                    .collect::<Result<_, _>>()
                    .map(AcquireManyOutcome::Acquired)
            }
            Some(AcquireAnyOutcome::Busy(busy)) => match busy.into_iter().next() {
                Some((at, outcome)) => Ok(AcquireManyOutcome::Busy {
                    index: order[at],
                    outcome,
                }),
                None => Err(corrupt(&keys.join(", "), "refused with no key held")),
            },
            Some(AcquireAnyOutcome::GateHeld) => {
                Err(corrupt(&keys.join(", "), "a gate nobody gave"))
            }
            None => storage_lock_core::storage::acquire_each(self, keys, req).await,
        }
    }

    /// Several keys in one transaction (the first `need` free ones taken, or none). One key,
    /// and a gate, take the default: one key needs no transaction (each statement commits on
    /// its own, without a `BEGIN` and a `COMMIT` around it); and in a transaction the slot's
    /// write stays invisible until the commit, so a writer that takes the gate after the read
    /// of it could miss the slot, while the default commits the slot before it reads the gate.
    async fn acquire_any(
        &self,
        keys: &[&str],
        need: usize,
        gate: Option<&str>,
        req: &AcquireRequest,
    ) -> Result<AcquireAnyOutcome, StorageError> {
        if gate.is_none()
            && need > 1
            && let Some(outcome) = self.attempt(keys, need, req).await?
        {
            return Ok(outcome);
        }
        storage_lock_core::storage::acquire_first_free(self, keys, need, gate, req).await
    }

    async fn renew(
        &self,
        key: &str,
        owner: OwnerId,
        lease: Duration,
    ) -> Result<RenewOutcome, StorageError> {
        let mut c = self.conns.get().await.map_err(err("renew"))?;
        let done = query(&self.sql.renew)
            .bind(new_version())
            .bind(lease_millis(lease))
            .bind(key)
            .bind(owner.to_bytes().to_vec())
            .execute(c.conn())
            .await;
        c.keep_if(&done);
        let done = done.map_err(err("renew"))?;
        Ok(if done.rows_affected() == 1 {
            RenewOutcome::Renewed {
                expires_at: Timestamp::from_millis(done.last_insert_id()),
            }
        } else {
            RenewOutcome::NotHeld
        })
    }

    /// Two statements per batch (see the module docs); batches are padded to a power of two
    /// (repeating the last key, which a multi-table `UPDATE` writes once), so at most eight
    /// statement shapes are prepared per connection.
    async fn renew_many(
        &self,
        renewals: &[RenewRequest<'_>],
    ) -> Result<Vec<Result<RenewOutcome, StorageError>>, StorageError> {
        let mut answers = Vec::with_capacity(renewals.len());
        for batch in renewals.chunks(storage_lock_core::RENEW_BATCH) {
            let Some(last) = batch.last() else { break };
            let slots = batch.len().next_power_of_two();
            let padded = || batch.iter().chain(std::iter::repeat(last)).take(slots);
            let (update, select) = renew_many_statements(&self.table, slots);
            let version = new_version();
            // One transaction: the rows the UPDATE renewed stay locked until the SELECT has
            // read them, so nothing (an explicit renewal, a reentrant acquisition) can change
            // their version in between and make a renewed key look lost.
            let mut tx = self.pool.begin().await.map_err(err("renew"))?;
            let mut q = query(&update);
            for r in padded() {
                q = q.bind(r.key).bind(r.owner.to_bytes().to_vec()).bind(lease_millis(r.lease));
            }
            q.bind(version)
                .execute(&mut *tx)
                .await
                .map_err(err("renew"))?;
            let mut q = query(&select);
            for (i, r) in padded().enumerate() {
                q = q
                    .bind(i64::try_from(i).unwrap_or(i64::MAX))
                    .bind(r.key)
                    .bind(r.owner.to_bytes().to_vec());
            }
            let rows = q.fetch_all(&mut *tx).await.map_err(err("renew"))?;
            tx.commit().await.map_err(err("renew"))?;
            let mut outcome: Vec<Result<RenewOutcome, StorageError>> =
                batch.iter().map(|_| Ok(RenewOutcome::NotHeld)).collect();
            for row in rows {
                let i: i64 = row.try_get(0).map_err(err("renew"))?;
                let i = usize::try_from(i).unwrap_or(usize::MAX);
                // Indexes past the batch are padding rows.
                if let (Some(slot), Some(r)) = (outcome.get_mut(i), batch.get(i)) {
                    *slot = renewed_row(r.key, &row, version);
                }
            }
            answers.extend(outcome);
        }
        Ok(answers)
    }

    async fn release(&self, key: &str, owner: OwnerId) -> Result<ReleaseOutcome, StorageError> {
        let mut c = self.conns.get().await.map_err(err("release"))?;
        let done = query(&self.sql.release)
            .bind(new_version())
            .bind(key)
            .bind(owner.to_bytes().to_vec())
            .execute(c.conn())
            .await
            .map(|done| (done.rows_affected(), done.last_insert_id()));
        // The OK packet's insert id carries `fencing << 1 | (levels left > 0)` (see the
        // statement); the exact depth left of a reentrant hold costs one read.
        let left = match done {
            Ok((1, packed)) if packed & 1 == 1 => {
                let left: Result<Option<i64>, _> = sqlx::query_scalar(&self.sql.levels_left)
                    .bind(key)
                    .bind(owner.to_bytes().to_vec())
                    .fetch_optional(c.conn())
                    .await;
                Some(left)
            }
            _ => None,
        };
        match &left {
            Some(read) => c.keep_if(read),
            None => c.keep_if(&done),
        }
        let (rows, packed) = done.map_err(err("release"))?;
        if rows != 1 {
            return Ok(ReleaseOutcome::NotHeld);
        }
        let remaining = match left {
            Some(read) => read
                .map_err(err("release"))?
                .map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX)),
            None => 0,
        };
        Ok(ReleaseOutcome::Released {
            remaining,
            fencing: packed >> 1,
        })
    }
}}

/// `statement` (`acquire` or `acquire_returning`) for `key`, bound, writing `version`
/// (`holder`: [`holder_params`] of the request).
fn take<'q>(
    statement: &'q str,
    key: &'q str,
    version: i64,
    req: &AcquireRequest,
    holder: (Option<&'q str>, Option<i64>, Option<&'q str>),
) -> sqlx::query::Query<'q, MySql, sqlx::mysql::MySqlArguments> {
    let (host, pid, note) = holder;
    query(statement)
        .bind(key)
        .bind(version)
        .bind(req.owner.to_bytes().to_vec())
        .bind(FENCING_FLOOR_KEY)
        .bind(lease_millis(req.lease))
        .bind(host)
        .bind(pid)
        .bind(note)
        .bind(req.reentrant)
}
