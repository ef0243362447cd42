//! [`SqliteStorage`]: locks shared by the processes of one host through one SQLite file.
//!
//! * **WAL** journal, `synchronous = NORMAL`, a busy timeout (default 5 s) so concurrent writers
//!   from several processes queue instead of failing.
//! * Each lock operation is **one statement** (`INSERT … ON CONFLICT DO UPDATE … WHERE …
//!   RETURNING`, `UPDATE … RETURNING`); only a busy `try_acquire` reads once more to report the
//!   holder.
//! * Time is the host's clock ([`SystemClock`] unless injected), shared by every process on the
//!   host; the lock is **not** safe on a network file system (NFS locking and clocks are not
//!   what SQLite and this crate assume).
//! * No change notifications: waiters back off with jitter, bounded by the holder's expiry.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{Row, query};
use storage_lock_core::storage::ops::FENCING_FLOOR_KEY;
use storage_lock_core::{
    AcquireOutcome, AcquireRequest, Capabilities, Clock, HolderInfo, LockRecord, OwnerId, Page,
    PageRequest, ReleaseOutcome, RenewOutcome, Storage, StorageError, Stored, SystemClock,
    Timestamp, Version,
};

use crate::naming::{DEFAULT_TABLE, validate_table_name};

const NAME: &str = "sqlite";
const COLUMNS: &str = "lock_key, version, owner, count, fencing, acquired_at, expires_at, holder_host, holder_pid, holder_note";

/// Locks in a SQLite database file; see the [module docs](self).
#[derive(Debug, Clone)]
pub struct SqliteStorage {
    pool: SqlitePool,
    sql: Arc<Statements>,
    clock: Arc<dyn Clock>,
}

/// Configures and opens a [`SqliteStorage`].
#[derive(Debug, Clone)]
pub struct SqliteStorageBuilder {
    path: Option<PathBuf>,
    table: String,
    busy_timeout: Duration,
    max_connections: u32,
    clock: Arc<dyn Clock>,
}

impl Default for SqliteStorageBuilder {
    fn default() -> Self {
        Self {
            path: None,
            table: DEFAULT_TABLE.to_owned(),
            busy_timeout: Duration::from_secs(5),
            max_connections: 4,
            clock: Arc::new(SystemClock),
        }
    }
}

impl SqliteStorageBuilder {
    /// A builder with defaults: table `storage_lock`, busy timeout 5 s, 4 connections.
    pub fn new() -> Self {
        Self::default()
    }

    /// A builder from `STORAGE_LOCK_SQLITE_PATH` and (optionally) `STORAGE_LOCK_SQLITE_TABLE`.
    pub fn from_env() -> Self {
        let mut b = Self::default();
        if let Ok(path) = std::env::var("STORAGE_LOCK_SQLITE_PATH") {
            b.path = Some(path.into());
        }
        if let Ok(table) = std::env::var("STORAGE_LOCK_SQLITE_TABLE") {
            b.table = table;
        }
        b
    }

    /// The database file (created if missing, with its parent directory).
    pub fn path(mut self, path: impl AsRef<Path>) -> Self {
        self.path = Some(path.as_ref().to_owned());
        self
    }

    /// The table name (a plain identifier).
    pub fn table(mut self, table: impl Into<String>) -> Self {
        self.table = table.into();
        self
    }

    /// How long a statement waits for another writer before failing.
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// Pool size.
    pub fn max_connections(mut self, n: u32) -> Self {
        self.max_connections = n.max(1);
        self
    }

    /// The clock expiry is judged by (all processes sharing the file must use the same one).
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Opens the database, creating the file and the table if needed.
    pub async fn open(self) -> Result<SqliteStorage, StorageError> {
        let path = self
            .path
            .ok_or_else(|| StorageError::backend(NAME, "open", "no database path configured"))?;
        validate_table_name(&self.table).map_err(|e| StorageError::backend(NAME, "open", e))?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| {
                StorageError::backend(
                    NAME,
                    "open",
                    format!("cannot create {}: {e}", dir.display()),
                )
            })?;
        }
        let options = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(self.busy_timeout);
        // Switching a fresh file to WAL takes an exclusive lock that SQLite's busy timeout does
        // not wait for, so when several processes create the file at once, all but one may get
        // SQLITE_BUSY here: retry those (only those) for up to the busy timeout.
        let started = std::time::Instant::now();
        let pool = loop {
            match SqlitePoolOptions::new()
                .max_connections(self.max_connections)
                .connect_with(options.clone())
                .await
            {
                Ok(pool) => break pool,
                Err(e) if is_busy(&e) && started.elapsed() < self.busy_timeout => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err(e) => {
                    return Err(StorageError::backend(
                        NAME,
                        "open",
                        format!("{}: {e}", path.display()),
                    ));
                }
            }
        };
        let sql = Statements::new(&self.table);
        query(&sql.create_table)
            .execute(&pool)
            .await
            .map_err(err("create table"))?;
        Ok(SqliteStorage {
            pool,
            sql: Arc::new(sql),
            clock: self.clock,
        })
    }
}

impl SqliteStorage {
    /// Opens (creating if needed) the database at `path` with default settings.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, StorageError> {
        SqliteStorageBuilder::new().path(path).open().await
    }

    /// A builder.
    pub fn builder() -> SqliteStorageBuilder {
        SqliteStorageBuilder::new()
    }
}

/// The statements, with the table name spliced in once.
#[derive(Debug)]
struct Statements {
    create_table: String,
    get: String,
    create: String,
    update: String,
    delete: String,
    list: String,
    acquire: String,
    renew: String,
    release: String,
}

impl Statements {
    fn new(t: &str) -> Self {
        // "live" = the stored hold is still valid at ?now.
        let live = format!("({t}.count > 0 AND {t}.expires_at > ?3)");
        Self {
            create_table: format!(
                "CREATE TABLE IF NOT EXISTS {t} (
                    lock_key TEXT PRIMARY KEY NOT NULL,
                    version INTEGER NOT NULL,
                    owner BLOB NOT NULL,
                    count INTEGER NOT NULL,
                    fencing INTEGER NOT NULL,
                    acquired_at INTEGER NOT NULL,
                    expires_at INTEGER NOT NULL,
                    holder_host TEXT,
                    holder_pid INTEGER,
                    holder_note TEXT
                ) WITHOUT ROWID"
            ),
            get: format!("SELECT {COLUMNS} FROM {t} WHERE lock_key = ?1"),
            create: format!(
                "INSERT INTO {t} ({COLUMNS}) VALUES (?1, random(), ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
                 ON CONFLICT (lock_key) DO NOTHING RETURNING version"
            ),
            update: format!(
                "UPDATE {t} SET version = random(), owner = ?3, count = ?4, fencing = ?5,
                    acquired_at = ?6, expires_at = ?7, holder_host = ?8, holder_pid = ?9, holder_note = ?10
                 WHERE lock_key = ?1 AND version = ?2 RETURNING version"
            ),
            delete: format!("DELETE FROM {t} WHERE lock_key = ?1 AND version = ?2"),
            list: format!(
                "SELECT {COLUMNS} FROM {t}
                 WHERE lock_key >= ?1 AND substr(lock_key, 1, length(?1)) = ?1 AND lock_key > ?2
                 ORDER BY lock_key LIMIT ?3"
            ),
            // ?1 key, ?2 owner, ?3 now, ?4 expires_at, ?5 host, ?6 pid, ?7 note, ?8 reentrant, ?9 floor key
            acquire: format!(
                "INSERT INTO {t} ({COLUMNS}) VALUES (?1, random(), ?2, 1,
                    COALESCE((SELECT fencing FROM {t} WHERE lock_key = ?9), 0) + 1, ?3, ?4, ?5, ?6, ?7)
                 ON CONFLICT (lock_key) DO UPDATE SET
                    version = random(),
                    count = CASE WHEN {live} THEN {t}.count + 1 ELSE 1 END,
                    fencing = CASE WHEN {live} THEN {t}.fencing ELSE {t}.fencing + 1 END,
                    acquired_at = CASE WHEN {live} THEN {t}.acquired_at ELSE excluded.acquired_at END,
                    expires_at = CASE WHEN {live} THEN max({t}.expires_at, excluded.expires_at) ELSE excluded.expires_at END,
                    holder_host = CASE WHEN {live} THEN {t}.holder_host ELSE excluded.holder_host END,
                    holder_pid = CASE WHEN {live} THEN {t}.holder_pid ELSE excluded.holder_pid END,
                    holder_note = CASE WHEN {live} THEN {t}.holder_note ELSE excluded.holder_note END,
                    owner = excluded.owner
                 WHERE NOT {live} OR (?8 AND {t}.owner = excluded.owner)
                 RETURNING fencing, count, expires_at"
            ),
            // ?1 key, ?2 owner, ?3 now, ?4 new expiry
            renew: format!(
                "UPDATE {t} SET version = random(), expires_at = ?4
                 WHERE lock_key = ?1 AND owner = ?2 AND count > 0 AND expires_at > ?3
                 RETURNING expires_at"
            ),
            // ?1 key, ?2 owner, ?3 now
            release: format!(
                "UPDATE {t} SET version = random(), count = count - 1,
                    expires_at = CASE WHEN count = 1 THEN min(expires_at, ?3) ELSE expires_at END
                 WHERE lock_key = ?1 AND owner = ?2 AND count > 0
                 RETURNING count"
            ),
        }
    }
}

fn err(operation: &'static str) -> impl Fn(sqlx::Error) -> StorageError {
    move |e| StorageError::backend(NAME, operation, e)
}

/// Whether `e` is SQLITE_BUSY (any extended variant): another connection holds a lock.
fn is_busy(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .and_then(|code| code.parse::<i32>().ok())
        .is_some_and(|code| code & 0xff == 5)
}

fn millis(t: Timestamp) -> i64 {
    i64::try_from(t.as_millis()).unwrap_or(i64::MAX)
}

fn ts(v: i64) -> Timestamp {
    Timestamp::from_millis(u64::try_from(v).unwrap_or(0))
}

fn corrupt(key: &str, reason: impl std::fmt::Display) -> StorageError {
    StorageError::Corrupt {
        key: key.to_owned(),
        reason: reason.to_string(),
    }
}

fn decode(key: &str, row: &SqliteRow) -> Result<Stored, StorageError> {
    let get_i64 = |col: &str| row.try_get::<i64, _>(col).map_err(|e| corrupt(key, e));
    let owner: Vec<u8> = row.try_get("owner").map_err(|e| corrupt(key, e))?;
    let host: Option<String> = row.try_get("holder_host").map_err(|e| corrupt(key, e))?;
    let holder = match host {
        Some(host) => Some(Arc::new(HolderInfo {
            host,
            pid: u32::try_from(
                row.try_get::<Option<i64>, _>("holder_pid")
                    .map_err(|e| corrupt(key, e))?
                    .unwrap_or(0),
            )
            .unwrap_or(0),
            note: row.try_get("holder_note").map_err(|e| corrupt(key, e))?,
        })),
        None => None,
    };
    Ok(Stored {
        record: LockRecord {
            owner: OwnerId::from_bytes(&owner)
                .ok_or_else(|| corrupt(key, "owner is not 16 bytes"))?,
            count: u32::try_from(get_i64("count")?).map_err(|e| corrupt(key, e))?,
            fencing: u64::try_from(get_i64("fencing")?).map_err(|e| corrupt(key, e))?,
            acquired_at: ts(get_i64("acquired_at")?),
            expires_at: ts(get_i64("expires_at")?),
            holder,
        },
        version: Version::from_u64(get_i64("version")? as u64),
    })
}

fn version_param(v: &Version) -> Option<i64> {
    v.as_u64().map(|n| n as i64)
}

fn holder_params(h: Option<&HolderInfo>) -> (Option<&str>, Option<i64>, Option<&str>) {
    match h {
        Some(h) => (
            Some(h.host.as_str()),
            Some(i64::from(h.pid)),
            h.note.as_deref(),
        ),
        None => (None, None, None),
    }
}

#[async_trait]
impl Storage for SqliteStorage {
    fn name(&self) -> &str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::linearizable()
            .with_conditional_delete(true)
            .with_one_round_trip_ops(true)
    }

    async fn now(&self) -> Result<Timestamp, StorageError> {
        Ok(self.clock.now())
    }

    async fn get(&self, key: &str) -> Result<Option<Stored>, StorageError> {
        let row = query(&self.sql.get)
            .bind(key)
            .fetch_optional(&self.pool)
            .await
            .map_err(err("get"))?;
        row.map(|r| decode(key, &r)).transpose()
    }

    async fn create(&self, key: &str, record: &LockRecord) -> Result<Version, StorageError> {
        let (host, pid, note) = holder_params(record.holder.as_deref());
        let row = query(&self.sql.create)
            .bind(key)
            .bind(&record.owner.to_bytes()[..])
            .bind(i64::from(record.count))
            .bind(record.fencing as i64)
            .bind(millis(record.acquired_at))
            .bind(millis(record.expires_at))
            .bind(host)
            .bind(pid)
            .bind(note)
            .fetch_optional(&self.pool)
            .await
            .map_err(err("create"))?;
        match row {
            Some(r) => Ok(Version::from_u64(r.get::<i64, _>(0) as u64)),
            None => Err(StorageError::AlreadyExists {
                key: key.to_owned(),
            }),
        }
    }

    async fn update(
        &self,
        key: &str,
        expected: &Version,
        record: &LockRecord,
    ) -> Result<Version, StorageError> {
        let (host, pid, note) = holder_params(record.holder.as_deref());
        let row = query(&self.sql.update)
            .bind(key)
            .bind(version_param(expected))
            .bind(&record.owner.to_bytes()[..])
            .bind(i64::from(record.count))
            .bind(record.fencing as i64)
            .bind(millis(record.acquired_at))
            .bind(millis(record.expires_at))
            .bind(host)
            .bind(pid)
            .bind(note)
            .fetch_optional(&self.pool)
            .await
            .map_err(err("update"))?;
        match row {
            Some(r) => Ok(Version::from_u64(r.get::<i64, _>(0) as u64)),
            None => Err(StorageError::Conflict {
                key: key.to_owned(),
            }),
        }
    }

    async fn delete(&self, key: &str, expected: &Version) -> Result<(), StorageError> {
        let done = query(&self.sql.delete)
            .bind(key)
            .bind(version_param(expected))
            .execute(&self.pool)
            .await
            .map_err(err("delete"))?;
        if done.rows_affected() == 1 {
            Ok(())
        } else {
            Err(StorageError::Conflict {
                key: key.to_owned(),
            })
        }
    }

    async fn list(&self, prefix: &str, page: &PageRequest) -> Result<Page, StorageError> {
        let limit = page.effective_limit();
        let rows = query(&self.sql.list)
            .bind(prefix)
            .bind(page.after.as_deref().unwrap_or(""))
            .bind(i64::try_from(limit).unwrap_or(i64::MAX).saturating_add(1))
            .fetch_all(&self.pool)
            .await
            .map_err(err("list"))?;
        let mut entries = rows
            .iter()
            .map(|r| {
                let key: String = r.try_get("lock_key").map_err(|e| corrupt("?", e))?;
                let stored = decode(&key, r)?;
                Ok((key, stored))
            })
            .collect::<Result<Vec<_>, StorageError>>()?;
        let next = (entries.len() > limit).then(|| entries[limit - 1].0.clone());
        entries.truncate(limit);
        Ok(Page { entries, next })
    }

    async fn try_acquire(
        &self,
        key: &str,
        req: &AcquireRequest,
    ) -> Result<AcquireOutcome, StorageError> {
        loop {
            let now = self.clock.now();
            let (host, pid, note) = holder_params(req.holder.as_deref());
            let row = query(&self.sql.acquire)
                .bind(key)
                .bind(&req.owner.to_bytes()[..])
                .bind(millis(now))
                .bind(millis(now.saturating_add(req.lease)))
                .bind(host)
                .bind(pid)
                .bind(note)
                .bind(req.reentrant)
                .bind(FENCING_FLOOR_KEY)
                .fetch_optional(&self.pool)
                .await
                .map_err(err("try_acquire"))?;
            if let Some(r) = row {
                return Ok(AcquireOutcome::Acquired {
                    fencing: r.get::<i64, _>(0) as u64,
                    count: r.get::<i64, _>(1) as u32,
                    expires_at: ts(r.get(2)),
                });
            }
            // Busy: report who holds it. If it was released in between, try again.
            if let Some(holder) = self.get(key).await?
                && holder.record.is_held_at(now)
            {
                return Ok(AcquireOutcome::Busy {
                    expires_at: holder.record.expires_at,
                    now,
                    holder: holder.record.holder,
                });
            }
        }
    }

    async fn renew(
        &self,
        key: &str,
        owner: OwnerId,
        lease: Duration,
    ) -> Result<RenewOutcome, StorageError> {
        let now = self.clock.now();
        let row = query(&self.sql.renew)
            .bind(key)
            .bind(&owner.to_bytes()[..])
            .bind(millis(now))
            .bind(millis(now.saturating_add(lease)))
            .fetch_optional(&self.pool)
            .await
            .map_err(err("renew"))?;
        Ok(match row {
            Some(r) => RenewOutcome::Renewed {
                expires_at: ts(r.get(0)),
            },
            None => RenewOutcome::NotHeld,
        })
    }

    async fn release(&self, key: &str, owner: OwnerId) -> Result<ReleaseOutcome, StorageError> {
        let row = query(&self.sql.release)
            .bind(key)
            .bind(&owner.to_bytes()[..])
            .bind(millis(self.clock.now()))
            .fetch_optional(&self.pool)
            .await
            .map_err(err("release"))?;
        Ok(match row {
            Some(r) => ReleaseOutcome::Released {
                remaining: r.get::<i64, _>(0) as u32,
            },
            None => ReleaseOutcome::NotHeld,
        })
    }
}
