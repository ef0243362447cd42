//! [`SqliteStorage`]: locks shared by the processes of one host through one SQLite file.
//!
//! * **WAL** journal, `synchronous = FULL` (with `NORMAL`, a power loss can roll back the last
//!   commits: fencing tokens already issued would be issued again; `NORMAL` only with
//!   [`SqliteStorageBuilder::allow_volatile`], `?durability=volatile`), a busy timeout (default 5 s) so concurrent writers
//!   from several processes queue instead of failing.
//! * Each lock operation is **one statement** (`INSERT … ON CONFLICT DO UPDATE … WHERE …
//!   RETURNING`, `UPDATE … RETURNING`); only a busy `acquire_once` reads once more to report the
//!   holder.
//! * **Time** is the host's boot clock (`CLOCK_BOOTTIME` on Linux: it neither steps when the
//!   wall clock is set nor stops during a suspend), plus an offset that the first process to
//!   open the file after a boot records, with the boot id, in `<table>_boot`; timestamps
//!   therefore read as wall-clock times, and every process on the host judges expiry on the
//!   same clock. The first opener after a reboot also ends every hold recorded before it (its
//!   holders were processes of the earlier boot). Where there is no boot clock (not Linux), the
//!   wall clock ([`SystemClock`]) is used, and a step of it larger than a hold's time left
//!   can give two holders. An injected [`SqliteStorageBuilder::clock`] replaces all of this.
//!   The lock is **not** safe on a network file system (NFS locking and clocks are not what
//!   SQLite and this crate assume).
//! * **Releases commit without syncing** (`synchronous = NORMAL` on the connections that only
//!   release), so a cycle waits for one sync, not two. A release lost in a power failure is
//!   safe: the WAL is recovered as a prefix (frames are checksummed in a chain; recovery stops
//!   at the first bad one) and every synced commit syncs the whole file before it, so a lost
//!   release means no later synced commit survived either: nobody was granted the key on top
//!   of it. The record is then the hold as it was (same owner, token and expiry), held until
//!   its lease ends (and the first opener after the reboot ends it at once, see *Time*): what a
//!   holder that crashed without releasing leaves, which the lock tolerates anyway. Fencing
//!   tokens never go back (a release never changes one). Acquisitions, renewals and the CAS
//!   primitives stay `FULL`.
//! * **Hand-off across processes**: a release that frees a key writes one byte into a file of a
//!   directory next to the database (`<file>-wake/`), which the waiting processes watch
//!   (inotify on Linux): a waiter in another process re-checks within a millisecond instead of
//!   backing off. Where the directory cannot be created or watched, waiters back off with
//!   jitter, bounded by the holder's expiry. A force release signals too; a key freed without a
//!   signal (by a process of an older version) is noticed by the waiters' 2 s re-check (see
//!   `wake.rs`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sqlx::sqlite::{
    Sqlite, SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteSynchronous,
};
use sqlx::{Row, query};
use storage_lock_core::storage::ops::{FENCING_FLOOR_KEY, GateDecision, decide_gate};
use storage_lock_core::storage::url::{DriverUrl, allow_volatile, percent_decode};
use storage_lock_core::{
    AcquireAnyOutcome, AcquireManyOutcome, AcquireOutcome, AcquireRequest, Capabilities,
    ChangeWait, Clock, Durability, OwnerId, ReleaseOutcome, RenewOutcome, RenewRequest,
    StorageError, SystemClock, TimeSource, Timestamp, boot_time,
};

use crate::conns::{Conns, Setup};
use crate::naming::{DEFAULT_TABLE, validate_table_name};
use crate::row::{COLUMNS, corrupt, holder_params, lease_millis, millis, stored_u32, stored_u64};
use crate::wake::Wake;

const NAME: &str = "sqlite";

/// Locks in a SQLite database file; see the [module docs](self).
#[derive(Debug, Clone)]
pub struct SqliteStorage {
    /// Schema work, the CAS primitives, batched renewals (a transaction).
    pool: SqlitePool,
    /// Acquisitions and renewals (see `crate::conns`: no ping to the connection's worker
    /// thread when a connection comes back, as sqlx's pool does).
    conns: Arc<Conns<Sqlite>>,
    /// Connections for releases only, committing without waiting for the WAL to reach the disk
    /// (`synchronous = NORMAL`; see the module docs for why that is safe).
    release_conns: Arc<Conns<Sqlite>>,
    sql: Arc<Statements>,
    clock: Arc<dyn Clock>,
    time_source: TimeSource,
    durability: Durability,
    /// Cross-process wake-ups (`None` where they could not be set up: waiters back off).
    wake: Option<Arc<Wake>>,
}

/// Configures and opens a [`SqliteStorage`].
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `open`"]
pub struct SqliteStorageBuilder {
    path: Option<PathBuf>,
    table: String,
    busy_timeout: Duration,
    max_connections: u32,
    clock: Arc<dyn Clock>,
    time_source: TimeSource,
    allow_volatile: bool,
}

impl Default for SqliteStorageBuilder {
    fn default() -> Self {
        Self {
            path: None,
            table: DEFAULT_TABLE.to_owned(),
            busy_timeout: Duration::from_secs(5),
            max_connections: 4,
            clock: Arc::new(SystemClock),
            time_source: TimeSource::Server,
            allow_volatile: false,
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

    /// A builder from `sqlite://PATH[?table=NAME&durability=volatile]`: `sqlite:///abs/file.db`
    /// or `sqlite://relative/file.db` (what [`storage_lock::connect`] opens).
    ///
    /// # Errors
    /// [`StorageError::Config`] for a malformed URL, an invalid table name or an unknown
    /// option (the message names it).
    ///
    /// # Examples
    /// ```
    /// use storage_lock_sql::SqliteStorageBuilder;
    /// assert!(SqliteStorageBuilder::from_url("sqlite:///var/lib/locks.db?table=jobs").is_ok());
    /// assert!(SqliteStorageBuilder::from_url("sqlite:///x.db?tabel=jobs").is_err());
    /// ```
    ///
    /// [`storage_lock::connect`]: https://docs.rs/storage-lock
    pub fn from_url(url: &str) -> Result<Self, StorageError> {
        let invalid = |reason: &str| StorageError::config("sqlite", reason);
        let mut options = DriverUrl::split(url, &["table", "durability"], &[])
            .map_err(|reason| invalid(&reason))?;
        // What is left without the options is `sqlite://PATH`.
        let path = options
            .driver
            .get(.."sqlite://".len())
            .filter(|s| s.eq_ignore_ascii_case("sqlite://"))
            .and_then(|_| options.driver.get("sqlite://".len()..))
            .ok_or_else(|| invalid("expected sqlite://PATH"))?;
        // A path is percent-decoded like every part of a URL: `#` is written `%23` (a raw `#`
        // starts a fragment, which is refused), `%` itself `%25`.
        let path = percent_decode(path).map_err(|reason| invalid(&reason))?;
        if path.is_empty() {
            return Err(invalid("the database path is empty"));
        }
        let mut builder = Self::new().path(path);
        if let Some(table) = options.take("table") {
            validate_table_name(&table).map_err(|e| invalid(&e.to_string()))?;
            builder = builder.table(table);
        }
        if let Some(d) = options.take("durability") {
            builder =
                builder.allow_volatile(allow_volatile(&d).map_err(|reason| invalid(&reason))?);
        }
        Ok(builder)
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
        self.time_source = TimeSource::Injected;
        self
    }

    /// Commits with `synchronous = NORMAL` instead of `FULL`: faster, but a power loss can
    /// roll back the last commits, so **fencing tokens can repeat** after a machine crash.
    pub fn allow_volatile(mut self, yes: bool) -> Self {
        self.allow_volatile = yes;
        self
    }

    /// Opens the database, creating the file (and its directory) and the tables if needed, and
    /// agrees on this boot's clock (see the module docs).
    ///
    /// # Errors
    /// [`StorageError::Config`] for no path or a bad table name; [`StorageError::Backend`] if
    /// the file cannot be created or opened.
    ///
    /// # Examples
    /// URL form: `sqlite:///absolute/path.db` (`sqlite://relative.db` is relative to the working
    /// directory).
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), storage_lock_core::StorageError> {
    /// use storage_lock_core::{Durability, Storage};
    /// let dir = std::env::temp_dir().join(format!("sl-doc-{}", std::process::id()));
    /// let storage = storage_lock_sql::SqliteStorage::builder()
    ///     .path(dir.join("locks.db"))
    ///     .open()
    ///     .await?;
    /// assert_eq!(storage.capabilities().durability, Durability::Durable);
    /// # Ok(()) }
    /// ```
    pub async fn open(self) -> Result<SqliteStorage, StorageError> {
        let path = self
            .path
            .ok_or_else(|| StorageError::config(NAME, "no database path configured"))?;
        validate_table_name(&self.table).map_err(|e| StorageError::config(NAME, e.to_string()))?;
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
            .synchronous(if self.allow_volatile {
                SqliteSynchronous::Normal
            } else {
                SqliteSynchronous::Full
            })
            .busy_timeout(self.busy_timeout);
        let sql = Statements::new(&self.table);
        // Several processes opening a fresh file at once race to switch it to WAL; SQLite
        // reports SQLITE_BUSY for that without consulting the busy timeout, so retry here.
        let started = std::time::Instant::now();
        let pool = loop {
            match connect(&options, self.max_connections, &sql.ddl).await {
                Ok(pool) => break pool,
                Err(e) if is_busy(&e) && started.elapsed() < self.busy_timeout => {
                    tokio::time::sleep(Duration::from_millis(
                        5 + u64::from(std::process::id() % 20),
                    ))
                    .await;
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
        // Releases: the same file, commits not synced (the next synced commit carries them).
        let release_conns = Conns::new(
            options.clone().synchronous(SqliteSynchronous::Normal),
            no_setup,
            2,
            self.busy_timeout,
        );
        let conns = Conns::new(options, no_setup, self.max_connections, self.busy_timeout);
        let clock = match self.time_source {
            TimeSource::Injected => self.clock,
            _ => match boot_clock(&pool, &sql).await? {
                Some(clock) => Arc::new(clock) as Arc<dyn Clock>,
                None => self.clock,
            },
        };
        Ok(SqliteStorage {
            wake: Wake::open(&path).map(Arc::new),
            release_conns: Arc::new(release_conns),
            conns: Arc::new(conns),
            pool,
            sql: Arc::new(sql),
            clock,
            time_source: self.time_source,
            durability: if self.allow_volatile {
                Durability::Volatile
            } else {
                Durability::Durable
            },
        })
    }
}

/// The lock operations' connections need nothing beyond their options.
fn no_setup(_: &mut sqlx::SqliteConnection) -> Setup<'_> {
    Box::pin(std::future::ready(Ok(())))
}

async fn connect(
    options: &SqliteConnectOptions,
    max_connections: u32,
    ddl: &[String],
) -> Result<SqlitePool, sqlx::Error> {
    // No ping before each statement: a local connection has no peer to lose, and sqlx pings
    // every connection when it returns to the pool anyway (dropping a broken one). The ping is
    // a round trip to the connection's worker thread, ~60 µs on an idle two-core machine: a
    // tenth of a cross-process hand-off.
    let pool = SqlitePoolOptions::new()
        .max_connections(max_connections)
        .test_before_acquire(false)
        .connect_with(options.clone())
        .await?;
    for statement in ddl {
        query(statement).execute(&pool).await?;
    }
    Ok(pool)
}

/// The host's clock for this database file: [`boot_time`] (`CLOCK_BOOTTIME`: it neither steps
/// with the wall clock nor stops during a suspend) plus an offset agreed, once per boot, by the
/// first process that opens the file, so that timestamps read as wall-clock times.
#[derive(Debug)]
struct BootClock {
    offset_ms: i64,
}

impl Clock for BootClock {
    fn now(&self) -> Timestamp {
        let up = boot_time().map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        Timestamp::from_millis(u64::try_from(up.saturating_add(self.offset_ms)).unwrap_or(0))
    }
}

/// This boot's identity (`/proc/sys/kernel/random/boot_id`), if the platform has one.
fn boot_id() -> Option<String> {
    boot_time()?;
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    Some(id.trim().to_owned()).filter(|id| !id.is_empty())
}

/// Agrees on this boot's [`BootClock`] through the database. The first opener after a boot
/// records the boot id and the offset (wall clock − boot time) and, in the same transaction,
/// ends every hold recorded before (their holders were processes of an earlier boot). `None`
/// where there is no boot clock: the caller falls back to the wall clock.
async fn boot_clock(
    pool: &SqlitePool,
    sql: &Statements,
) -> Result<Option<BootClock>, StorageError> {
    let (Some(id), Some(up)) = (boot_id(), boot_time()) else {
        return Ok(None);
    };
    let up_ms = i64::try_from(up.as_millis()).unwrap_or(i64::MAX);
    let wall_ms = millis(SystemClock.now());
    let mut tx = pool.begin().await.map_err(err("open"))?;
    // A write first, so the transaction holds the write lock before it reads anything.
    let switched = query(&sql.boot_switch)
        .bind(&id)
        .bind(wall_ms.saturating_sub(up_ms))
        .fetch_optional(&mut *tx)
        .await
        .map_err(err("open"))?;
    let offset_ms: i64 = match switched {
        Some(row) => {
            let offset: i64 = row.try_get(0).map_err(err("open"))?;
            query(&sql.end_earlier_boot_holds)
                .bind(up_ms.saturating_add(offset))
                .execute(&mut *tx)
                .await
                .map_err(err("open"))?;
            offset
        }
        None => query(&sql.boot_offset)
            .fetch_one(&mut *tx)
            .await
            .map_err(err("open"))?
            .try_get(0)
            .map_err(err("open"))?,
    };
    tx.commit().await.map_err(err("open"))?;
    Ok(Some(BootClock { offset_ms }))
}

/// SQLITE_BUSY (5) or one of its extended codes (`5 + 256·n`).
fn is_busy(e: &sqlx::Error) -> bool {
    e.as_database_error()
        .and_then(|d| d.code())
        .and_then(|c| c.parse::<u32>().ok())
        .is_some_and(|c| c & 0xff == 5)
}

impl SqliteStorage {
    /// The `acquire` statement for `key`, bound (`holder`: [`holder_params`] of the request).
    fn take<'q>(
        &'q self,
        key: &'q str,
        req: &AcquireRequest,
        now: Timestamp,
        holder: (Option<&'q str>, Option<i64>, Option<&'q str>),
    ) -> sqlx::query::Query<'q, Sqlite, sqlx::sqlite::SqliteArguments<'q>> {
        let (host, pid, note) = holder;
        query(&self.sql.acquire)
            .bind(key)
            .bind(req.owner.to_bytes().to_vec())
            .bind(millis(now))
            .bind(millis(now).saturating_add(lease_millis(req.lease)))
            .bind(host)
            .bind(pid)
            .bind(note)
            .bind(req.reentrant)
            .bind(FENCING_FLOOR_KEY)
    }

    /// One attempt at several keys in one `BEGIN IMMEDIATE` transaction (the database's write
    /// lock, so the keys are decided on one state and nobody sees part of them taken): `need`
    /// of them (the first free ones in order; `need` = every key for a multi-lock), while the
    /// gate, if any, has no holder. Committed only if the attempt succeeds; rolled back
    /// otherwise.
    async fn attempt_in_transaction(
        &self,
        conn: &mut sqlx::SqliteConnection,
        keys: &[&str],
        need: usize,
        gate: Option<&str>,
        req: &AcquireRequest,
    ) -> Result<Result<AcquireAnyOutcome, StorageError>, sqlx::Error> {
        use sqlx::Connection as _;
        let now = self.clock.now();
        let holder = holder_params(req.holder.as_deref());
        let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
        let record = |key: &str, row: Option<sqlx::sqlite::SqliteRow>| {
            row.map(|r| crate::row::decode(key, &r)).transpose()
        };
        let mut gate_token = 0;
        if let Some(gate) = gate {
            let row = query(&self.sql.get)
                .bind(gate)
                .fetch_optional(&mut *tx)
                .await?;
            let gate = match record(gate, row) {
                Ok(gate) => gate,
                Err(e) => return Ok(Err(e)),
            };
            match decide_gate(gate.as_ref().map(|g| &g.record)) {
                GateDecision::Held => {
                    tx.rollback().await?;
                    return Ok(Ok(AcquireAnyOutcome::GateHeld));
                }
                GateDecision::Passes(token) => gate_token = token,
                GateDecision::PassesWithFloor => {
                    let row = query(&self.sql.get)
                        .bind(FENCING_FLOOR_KEY)
                        .fetch_optional(&mut *tx)
                        .await?;
                    match record(FENCING_FLOOR_KEY, row) {
                        Ok(floor) => gate_token = floor.map_or(0, |f| f.record.fencing),
                        Err(e) => return Ok(Err(e)),
                    }
                }
            }
        }
        let (mut taken, mut busy) = (Vec::with_capacity(need), Vec::new());
        for (index, key) in keys.iter().enumerate() {
            if taken.len() == need {
                break;
            }
            if let Some(r) = self
                .take(key, req, now, holder)
                .fetch_optional(&mut *tx)
                .await?
            {
                match grant_of(key, &r) {
                    Ok(grant) => taken.push((index, grant)),
                    Err(e) => return Ok(Err(e)),
                }
                continue;
            }
            busy.push(index);
            if need == keys.len() {
                break; // a multi-lock: the first held key is the answer
            }
        }
        if taken.len() < need {
            // Who holds the busy keys, read only now that the answer is busy.
            let mut held = Vec::with_capacity(busy.len());
            for index in busy {
                let key = keys[index];
                let row = query(&self.sql.get)
                    .bind(key)
                    .fetch_optional(&mut *tx)
                    .await?;
                let holder = match record(key, row) {
                    Ok(stored) => stored.map(|s| s.record),
                    Err(e) => return Ok(Err(e)),
                };
                held.push((
                    index,
                    AcquireOutcome::Busy {
                        expires_at: holder.as_ref().map_or(now, |h| h.expires_at),
                        now,
                        holder: holder.and_then(|h| h.holder),
                    },
                ));
            }
            tx.rollback().await?;
            return Ok(Ok(AcquireAnyOutcome::Busy(held)));
        }
        tx.commit().await?;
        Ok(Ok(AcquireAnyOutcome::Acquired {
            taken,
            gate: gate_token,
        }))
    }

    /// [`Self::attempt_in_transaction`] on a connection of the pool.
    async fn attempt(
        &self,
        keys: &[&str],
        need: usize,
        gate: Option<&str>,
        req: &AcquireRequest,
    ) -> Result<AcquireAnyOutcome, StorageError> {
        let mut c = self.conns.get().await.map_err(err("acquire"))?;
        let outcome = self
            .attempt_in_transaction(c.conn(), keys, need, gate, req)
            .await;
        c.keep_if(&outcome);
        outcome.map_err(err("acquire"))?
    }

    /// Opens (creating if needed) the database at `path` with default settings.
    pub async fn open(path: impl AsRef<Path>) -> Result<Self, StorageError> {
        SqliteStorageBuilder::new().path(path).open().await
    }

    /// A builder.
    pub fn builder() -> SqliteStorageBuilder {
        SqliteStorageBuilder::new()
    }

    /// Tells the waiters of every process on this file that `key` is free (the wake-up
    /// directory, as a release does), after an `update` that freed it.
    async fn announce_free(&self, key: &str) {
        if let Some(wake) = &self.wake {
            wake.signal(key);
        }
    }
}

/// The statements, with the table name spliced in once.
#[derive(Debug)]
struct Statements {
    ddl: Vec<String>,
    boot_switch: String,
    boot_offset: String,
    end_earlier_boot_holds: String,
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
            ddl: vec![format!(
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
                format!(
                    "CREATE TABLE IF NOT EXISTS {t}_boot (
                        id INTEGER PRIMARY KEY CHECK (id = 1),
                        boot_id TEXT NOT NULL,
                        offset_ms INTEGER NOT NULL
                    )"
                ),
            ],
            // ?1 boot id, ?2 offset: a row comes back iff this call recorded a new boot.
            boot_switch: format!(
                "INSERT INTO {t}_boot (id, boot_id, offset_ms) VALUES (1, ?1, ?2)
                 ON CONFLICT (id) DO UPDATE SET boot_id = excluded.boot_id, offset_ms = excluded.offset_ms
                 WHERE {t}_boot.boot_id <> excluded.boot_id
                 RETURNING offset_ms"
            ),
            boot_offset: format!("SELECT offset_ms FROM {t}_boot WHERE id = 1"),
            // ?1 = now on the new boot's clock
            end_earlier_boot_holds: format!(
                "UPDATE {t} SET expires_at = min(expires_at, ?1), version = random() WHERE count > 0"
            ),
            get: format!("SELECT {COLUMNS} FROM {t} WHERE lock_key = ?"),
            create: format!(
                "INSERT INTO {t} ({COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
                 ON CONFLICT (lock_key) DO NOTHING"
            ),
            update: format!(
                "UPDATE {t} SET version = ?, owner = ?, count = ?, fencing = ?, acquired_at = ?,
                    expires_at = ?, holder_host = ?, holder_pid = ?, holder_note = ?
                 WHERE lock_key = ? AND version = ?"
            ),
            delete: format!("DELETE FROM {t} WHERE lock_key = ? AND version = ?"),
            list: format!(
                "SELECT {COLUMNS} FROM {t}
                 WHERE lock_key >= ? AND instr(lock_key, ?) = 1 AND lock_key > ?
                 ORDER BY lock_key LIMIT ?"
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
                 RETURNING count, fencing"
            ),
        }
    }
}

fn err(operation: &'static str) -> impl Fn(sqlx::Error) -> StorageError {
    move |e| StorageError::backend(NAME, operation, e)
}

crate::primitives::impl_sql_storage! { SqliteStorage {
    fn name(&self) -> &str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::linearizable()
            .with_conditional_delete(true)
            .with_change_notifications(self.wake.as_ref().is_some_and(|w| w.watches()))
            .with_time_source(self.time_source)
            .with_durability(self.durability)
            .with_fencing_bound(crate::row::FENCING_BOUND)
            .with_round_trips("1 / 1 / 1 (one statement each)")
    }

    async fn wait_for_change(&self, key: &str) -> Result<ChangeWait, StorageError> {
        Ok(match &self.wake {
            Some(wake) => wake.arm(key).await,
            None => ChangeWait::unsupported(),
        })
    }

    async fn now(&self) -> Result<Timestamp, StorageError> {
        Ok(self.clock.now())
    }

    async fn acquire_once(
        &self,
        key: &str,
        req: &AcquireRequest,
    ) -> Result<AcquireOutcome, StorageError> {
        loop {
            let now = self.clock.now();
            let (host, pid, note) = holder_params(req.holder.as_deref());
            let mut c = self.conns.get().await.map_err(err("acquire"))?;
            let row = self
                .take(key, req, now, (host, pid, note))
                .fetch_optional(c.conn())
                .await;
            c.keep_if(&row);
            let row = row.map_err(err("acquire"))?;
            if let Some(r) = row {
                return grant_of(key, &r);
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

    /// Every key in one `BEGIN IMMEDIATE` transaction: decided on one state, written together
    /// or not at all.
    async fn acquire_many(
        &self,
        keys: &[&str],
        req: &AcquireRequest,
    ) -> Result<AcquireManyOutcome, StorageError> {
        match self.attempt(keys, keys.len(), None, req).await? {
            AcquireAnyOutcome::Acquired { taken, .. } => Ok(AcquireManyOutcome::Acquired(
                taken.into_iter().map(|(_, grant)| grant).collect(),
            )),
            AcquireAnyOutcome::Busy(busy) => match busy.into_iter().next() {
                Some((index, outcome)) => Ok(AcquireManyOutcome::Busy { index, outcome }),
                None => Err(corrupt(&keys.join(", "), "refused with no key held")),
            },
            AcquireAnyOutcome::GateHeld => Err(corrupt(&keys.join(", "), "a gate nobody gave")),
        }
    }

    /// The gate and the keys in one `BEGIN IMMEDIATE` transaction. One key without a gate
    /// takes the default (a statement per key looked at, each its own transaction): nothing
    /// to make atomic, and no `BEGIN` or `COMMIT` to pay.
    async fn acquire_any(
        &self,
        keys: &[&str],
        need: usize,
        gate: Option<&str>,
        req: &AcquireRequest,
    ) -> Result<AcquireAnyOutcome, StorageError> {
        if need == 1 && gate.is_none() {
            return storage_lock_core::storage::acquire_first_free(self, keys, need, gate, req)
                .await;
        }
        self.attempt(keys, need, gate, req).await
    }

    async fn renew(
        &self,
        key: &str,
        owner: OwnerId,
        lease: Duration,
    ) -> Result<RenewOutcome, StorageError> {
        let now = self.clock.now();
        let mut c = self.conns.get().await.map_err(err("renew"))?;
        let row = query(&self.sql.renew)
            .bind(key)
            .bind(&owner.to_bytes()[..])
            .bind(millis(now))
            .bind(millis(now).saturating_add(lease_millis(lease)))
            .fetch_optional(c.conn())
            .await;
        c.keep_if(&row);
        let row = row.map_err(err("renew"))?;
        crate::row::renew_outcome(key, row.as_ref())
    }

    /// The renewal statement for every key inside one transaction (one commit, one reading of
    /// the clock).
    async fn renew_many(
        &self,
        renewals: &[RenewRequest<'_>],
    ) -> Result<Vec<Result<RenewOutcome, StorageError>>, StorageError> {
        if renewals.is_empty() {
            return Ok(Vec::new());
        }
        let now = millis(self.clock.now());
        let mut tx = self.pool.begin().await.map_err(err("renew"))?;
        let mut answers = Vec::with_capacity(renewals.len());
        for r in renewals {
            let row = query(&self.sql.renew)
                .bind(r.key)
                .bind(&r.owner.to_bytes()[..])
                .bind(now)
                .bind(now.saturating_add(lease_millis(r.lease)))
                .fetch_optional(&mut *tx)
                .await
                .map_err(err("renew"))?;
            answers.push(crate::row::renew_outcome(r.key, row.as_ref()));
        }
        tx.commit().await.map_err(err("renew"))?;
        Ok(answers)
    }

    async fn release(&self, key: &str, owner: OwnerId) -> Result<ReleaseOutcome, StorageError> {
        let mut c = self.release_conns.get().await.map_err(err("release"))?;
        let row = query(&self.sql.release)
            .bind(key)
            .bind(&owner.to_bytes()[..])
            .bind(millis(self.clock.now()))
            .fetch_optional(c.conn())
            .await;
        c.keep_if(&row);
        let row = row.map_err(err("release"))?;
        let outcome = crate::row::release_outcome(key, row.as_ref())?;
        if let (ReleaseOutcome::Released { remaining: 0, .. }, Some(wake)) = (&outcome, &self.wake) {
            wake.signal(key);
        }
        Ok(outcome)
    }
}}

/// The grant of an `acquire` row (fencing, count, expiry).
fn grant_of(key: &str, r: &sqlx::sqlite::SqliteRow) -> Result<AcquireOutcome, StorageError> {
    let int = |i: usize| r.try_get::<i64, _>(i).map_err(|e| corrupt(key, e));
    Ok(AcquireOutcome::Acquired {
        fencing: stored_u64(key, "fencing", int(0)?)?,
        count: stored_u32(key, "count", int(1)?)?,
        expires_at: Timestamp::from_millis(stored_u64(key, "expires_at", int(2)?)?),
    })
}
