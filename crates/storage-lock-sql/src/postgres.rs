//! [`PostgresStorage`]: locks in a PostgreSQL table, judged by the server's clock.
//!
//! * `acquire_once`, `renew` and `release` are each **one statement** (one round trip): an
//!   `INSERT … ON CONFLICT DO UPDATE … WHERE … RETURNING` that takes a free or expired key;
//!   `UPDATE … RETURNING`. A **busy** acquisition takes a second statement, which marks the
//!   record and reports its holder: the statement that takes a key stays small, and the server
//!   time of an uncontended cycle (counted in instructions under callgrind: 530 k → 332 k, a
//!   durable-row upsert + update 200 k; BENCHMARKS.md) is what bounds throughput with many
//!   clients. Reentrant requests use a statement of their own with the reentry branch.
//!   "Now" is `statement_timestamp()` on the server.
//! * A busy acquisition marks the row (`waiters`), and the release that frees a marked row sends
//!   `pg_notify(channel, key)` in the same statement (unmarked releases send nothing: NOTIFY
//!   serializes the commits of notifying transactions); a force release (an `update` that
//!   frees a key) notifies too, after its commit; each storage keeps **one**
//!   `LISTEN` connection, multiplexed over all waiting keys and re-established after a
//!   connection loss (waiters are woken to re-check then). Waiters also back off to the holder's
//!   expiry, so a lost notification costs latency, never correctness.
//! * Linearizable on a single primary. Not across asynchronous-replica failover: a replica
//!   promoted before it received the last commits can grant a lock that was held.
//! * **Fencing tokens are bounded** by the `BIGINT` column: 2^63 − 1. A key whose token reached
//!   it is refused with [`StorageError::Corrupt`] naming the key (use another name); at one
//!   acquisition per microsecond that takes 292 000 years.
//! * **Durability**: every connection sets `synchronous_commit = on` (whatever the server, role
//!   or URL default: a grant acknowledged before its WAL flush and lost in a crash could be
//!   handed out again, with its fencing token; releases are the one exception, below), and `open` refuses a server running with
//!   `fsync = off` unless [`PostgresStorageBuilder::allow_volatile`] (`?durability=volatile`).
//! * **Releases commit asynchronously** (one WAL flush per acquire + release cycle, not two):
//!   the release statement sets `synchronous_commit = off` for its own transaction only, while
//!   acquisitions, renewals and the CAS primitives wait for the flush. Why a release lost in a
//!   crash is safe:
//!   1. WAL is replayed in order and a flush writes everything before it, so once *any* later
//!      synchronous commit returns (another client's acquisition of the key, a sweep, a renewal
//!      of anything), the release is durable too. The only releases a crash can lose are those
//!      after the last synchronous commit.
//!   2. A lost release leaves the record as it was before: held by the releasing owner, with the
//!      same fencing token and the same expiry (a release never extends a lease). Nobody was
//!      granted the key on top of it, since such a grant is a synchronous commit after it (1).
//!      So after the crash the key is simply held until its lease ends, then free: the state a
//!      holder that crashed without releasing leaves behind, which the lock must tolerate
//!      anyway. No fencing token goes back (a release never changes one).
//!   3. A waiter woken by the release's `NOTIFY` (delivered at commit, before the flush) only
//!      *tries* to acquire; its acquisition is synchronous, so it either commits after the
//!      release reached disk or fails with the crash.
//!
//!   `tests/postgres.rs` checks this on a server of its own stopped with
//!   `pg_ctl stop -m immediate`.
//! * Row versions never repeat for a key, so a CAS never confuses a recreated row with an old
//!   one: renewals take the next value of a sequence (`<table>_version`); acquisitions, the CAS
//!   primitives and the (asynchronously committed) release a random 63-bit number chosen by the
//!   client (a sequence advance lost with an asynchronous commit is handed out again after the
//!   crash).

use std::sync::Arc;
use std::time::Duration;

use std::str::FromStr;

use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions, Postgres};
use sqlx::{Executor, Row, query};
use storage_lock_core::storage::ops::FENCING_FLOOR_KEY;
use storage_lock_core::storage::url::{DriverUrl, allow_volatile};
use storage_lock_core::{
    AcquireAnyOutcome, AcquireManyOutcome, AcquireOutcome, AcquireRequest, Capabilities,
    ChangeWait, Durability, NotificationSource, Notifications, OwnerId, ReleaseOutcome,
    RenewOutcome, RenewRequest, SourceEvent, StorageError, Timestamp,
};

use crate::conns::{Conns, Setup};
use crate::naming::validate_table_name;
use crate::row::{COLUMNS, holder_params, lease_millis, timestamp};
use crate::server::{ServerOptions, server_setters};

const NAME: &str = "postgres";
/// What every connection sets before its first statement, whatever the server, database, role
/// or URL default: the isolation the statements are written for (a snapshot per statement;
/// the acquisition locks the floor row it reads), and commits that wait for the WAL flush (a
/// grant acknowledged and then lost in a crash could be handed out twice). Plans are generic:
/// every statement here finds its rows by the primary key, and under the default
/// (`plan_cache_mode = auto`) the server planned a multi-key acquisition anew on every
/// execution (0.3–1.1 ms of planning against 0.15 ms of execution, for three keys), since a
/// generic plan's estimate for an array of unknown length looked costlier (`plan_cache_mode`:
/// PostgreSQL 12 or later).
const SESSION: &str = "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED;
    SET synchronous_commit = on;
    SET plan_cache_mode = force_generic_plan";

/// The fencing token an acquisition's insert carries when its snapshot had a row for the key
/// (see `Statements::acquire`): never stored, since the statement fails if it inserts it.
const SWEPT: i64 = -1;
/// The SQLSTATE of that failure (`invalid_text_representation`: the statement has no other
/// text-to-number cast).
const SWEPT_MEANWHILE: &str = "22P02";
/// SQLSTATE `numeric_value_out_of_range`: a fencing token past `i64::MAX` (the column's bound).
const OUT_OF_RANGE: &str = "22003";
/// Attempts of one `acquire_once` that may end in [`SWEPT_MEANWHILE`] (each one means a sweep
/// deleted the key's record during the attempt; more in a row than this is reported).
const SWEPT_RETRIES: u32 = 8;
/// SQLSTATE `division_by_zero`: a multi-key acquisition found a key taken after its snapshot
/// and undid its writes (see `Statements::acquire_many`).
const TAKEN_MEANWHILE: &str = "22012";
/// SQLSTATE `deadlock_detected`: a multi-key acquisition that locked a row taken after its
/// snapshot (it locks in key order) can meet a multi-key renewal that locks the same rows in
/// the order of its plan; the server aborts one of them, and nothing it wrote stays.
const DEADLOCK: &str = "40P01";

/// The driver's URL options that [`PostgresStorageBuilder::from_url`] passes through.
const PG_OPTIONS: &[&str] = &[
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "options",
    "application_name",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "statement-cache-capacity",
];

/// The server clock in milliseconds, fixed for the whole statement.
const NOW: &str = "floor(extract(epoch from statement_timestamp()) * 1000)::bigint";

/// Locks in PostgreSQL; see the [module docs](self).
#[derive(Debug, Clone)]
pub struct PostgresStorage {
    /// Schema work, the CAS primitives, the `LISTEN` connection.
    pool: PgPool,
    /// The lock operations (see `crate::conns`).
    conns: Arc<Conns<Postgres>>,
    sql: Arc<Statements>,
    listener: Arc<Notifications<PgSource>>,
    durability: Durability,
}

/// Configures and opens a [`PostgresStorage`].
#[derive(Debug, Clone, Default)]
#[must_use = "a builder does nothing until `open`"]
pub struct PostgresStorageBuilder {
    server: ServerOptions,
    schema: Option<String>,
}

impl PostgresStorageBuilder {
    /// A builder with defaults: table `storage_lock` in the search path, 16 connections.
    pub fn new() -> Self {
        Self::default()
    }

    /// A builder from `STORAGE_LOCK_POSTGRES_URL`, `STORAGE_LOCK_POSTGRES_SCHEMA` and
    /// `STORAGE_LOCK_POSTGRES_TABLE` (each optional).
    pub fn from_env() -> Self {
        Self {
            server: ServerOptions::from_env("POSTGRES"),
            schema: std::env::var("STORAGE_LOCK_POSTGRES_SCHEMA").ok(),
        }
    }

    /// A builder from `postgres://user@host:port/db[?table=NAME&schema=NAME&durability=volatile
    /// &…driver options]` (what `storage_lock::connect` opens): the driver's own options
    /// (`sslmode`, `sslrootcert`, `application_name`, …) pass through, anything else is refused.
    ///
    /// # Errors
    /// [`StorageError::Config`] for an unknown option, an invalid table or schema name, or a
    /// URL the driver rejects (never showing the password).
    ///
    /// # Examples
    /// ```
    /// use storage_lock_sql::PostgresStorageBuilder;
    /// assert!(PostgresStorageBuilder::from_url("postgres://u@h/db?sslmode=disable&table=jobs").is_ok());
    /// assert!(PostgresStorageBuilder::from_url("postgres://u@h/db?tabel=jobs").is_err());
    /// ```
    pub fn from_url(url: &str) -> Result<Self, StorageError> {
        let invalid = |reason: String| StorageError::config("postgres", reason);
        let mut u = DriverUrl::split(url, &["table", "schema", "durability"], PG_OPTIONS)
            .map_err(invalid)?;
        validate_url(&u.driver).map_err(invalid)?;
        let mut b = Self::new().url(u.driver.clone());
        if let Some(table) = u.take("table") {
            validate_table_name(&table).map_err(|e| invalid(e.to_string()))?;
            b = b.table(table);
        }
        if let Some(schema) = u.take("schema") {
            validate_table_name(&schema).map_err(|e| invalid(e.to_string()))?;
            b = b.schema(schema);
        }
        if let Some(d) = u.take("durability") {
            b = b.allow_volatile(allow_volatile(&d).map_err(invalid)?);
        }
        Ok(b)
    }

    server_setters!("postgres://user@host:port/db");

    /// The schema holding the table (created if missing); default: the search path.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = Some(schema.into());
        self
    }

    /// Connects and creates the schema, table and version sequence if needed (catalog-checked
    /// migrations only when needed), and checks `fsync` (see [`Self::allow_volatile`]).
    ///
    /// # Errors
    /// [`StorageError::Config`] for a bad table or schema name, a URL the driver rejects, or a
    /// server running with `fsync = off` (unless allowed); [`StorageError::Backend`] if the
    /// server cannot be reached or the schema cannot be created.
    ///
    /// # Examples
    /// URL form: `postgres://user[:password]@host:port/db` (`tests/postgres.rs` runs the same
    /// lines against a real server):
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), storage_lock_core::StorageError> {
    /// let url = "postgres://postgres@127.0.0.1:5432/test";
    /// use storage_lock_core::Storage;
    /// let storage = storage_lock_sql::PostgresStorage::builder()
    ///     .url(url)
    ///     .table("doc_locks")
    ///     .open()
    ///     .await?;
    /// assert!(storage.capabilities().linearizable_cas);
    /// # Ok(()) }
    /// ```
    pub async fn open(self) -> Result<PostgresStorage, StorageError> {
        let url = self.server.checked_url(NAME)?;
        if let Some(schema) = &self.schema {
            validate_table_name(schema).map_err(|e| StorageError::config(NAME, e.to_string()))?;
        }
        let options = PgConnectOptions::from_str(url)
            .map_err(|e| StorageError::config(NAME, format!("invalid URL: {e}")))?;
        crate::server::probe::<sqlx::PgConnection>(NAME, &options, self.server.acquire_timeout)
            .await?;
        let pool = PgPoolOptions::new()
            .max_connections(self.server.max_connections)
            .acquire_timeout(self.server.acquire_timeout)
            .after_connect(|conn, _| session(conn))
            .connect_with(options.clone())
            .await
            .map_err(err("open"))?;
        let sql = Statements::new(self.schema.as_deref(), &self.server.table);
        create_schema(&pool, &sql).await?;
        let fsync: String = query("SELECT current_setting('fsync')")
            .fetch_one(&pool)
            .await
            .map_err(err("open"))?
            .try_get(0)
            .map_err(err("open"))?;
        let problem = (fsync != "on").then(|| {
            format!("fsync is {fsync:?}, not \"on\" (a crash of the machine loses commits)")
        });
        let durability = Durability::judge(NAME, problem, self.server.allow_volatile)?;
        let listener = Arc::new(Notifications::new(PgSource {
            pool: pool.clone(),
            channel: sql.channel.clone(),
        }));
        let conns = Conns::new(
            options,
            session,
            self.server.max_connections,
            self.server.acquire_timeout,
        );
        Ok(PostgresStorage {
            durability,
            pool,
            conns: Arc::new(conns),
            sql: Arc::new(sql),
            listener,
        })
    }
}

/// Sets up a new connection ([`SESSION`]), in the pool and in the lock operations' [`Conns`].
fn session(conn: &mut sqlx::PgConnection) -> Setup<'_> {
    Box::pin(async move { conn.execute(SESSION).await.map(drop) })
}

/// Checks a `postgres://` URL as the driver reads it (options included), without connecting.
///
/// # Errors
/// What the driver rejects (never the password).
pub fn validate_url(url: &str) -> Result<(), String> {
    PgConnectOptions::from_str(url)
        .map(drop)
        .map_err(|e| e.to_string())
}

impl PostgresStorage {
    /// Connects to `url` with default settings.
    pub async fn connect(url: &str) -> Result<Self, StorageError> {
        PostgresStorageBuilder::new().url(url).open().await
    }

    /// A builder.
    pub fn builder() -> PostgresStorageBuilder {
        PostgresStorageBuilder::new()
    }

    /// Tells the waiters of every host that `key` is free (`NOTIFY`, as the release of a marked
    /// row does), after an `update` that freed it. Best effort: if it fails, they find out at
    /// their next re-check.
    async fn announce_free(&self, key: &str) {
        let sent = sqlx::query("SELECT pg_notify($1, $2)")
            .bind(&self.sql.channel)
            .bind(key)
            .execute(&self.pool)
            .await;
        if let Err(e) = sent {
            tracing::warn!(key, error = %err("notify")(e),
                "cannot announce a freed key: its waiters find out at their next re-check");
        }
    }
}

#[derive(Debug)]
struct Statements {
    ddl: Vec<String>,
    has_waiters_column: String,
    add_waiters_column: String,
    channel: String,
    now: String,
    get: String,
    create: String,
    update: String,
    delete: String,
    list: String,
    acquire: String,
    acquire_reentrant: String,
    acquire_many: String,
    acquire_any: String,
    held_of_any: String,
    busy_of_many: String,
    mark: String,
    renew: String,
    renew_many: String,
    release: String,
}

impl Statements {
    fn new(schema: Option<&str>, table: &str) -> Self {
        let t = match schema {
            Some(s) => format!("{s}.{table}"),
            None => table.to_owned(),
        };
        let seq = format!("{t}_version");
        let next = format!("nextval('{seq}')");
        // $1 key, $2 owner, $3 lease ms, $4 host, $5 pid, $6 note, $7 floor key, $8 a random
        // version. See `acquire` below.
        let take = |reentrant: bool| {
            let live = "(cur.count > 0 AND cur.expires_at > EXCLUDED.acquired_at)";
            // Only a reentry passes the `WHERE` with the record live: there, `on_live(a, b)`
            // is `a` for a reentry and `b` for a new hold; the plain statement is just `b`.
            let on_live = |held: &str, new: &str| {
                if reentrant {
                    format!("CASE WHEN {live} THEN {held} ELSE {new} END")
                } else {
                    new.to_owned()
                }
            };
            let keep = |col: &str| on_live(&format!("cur.{col}"), &format!("EXCLUDED.{col}"));
            let (acquired_at, host, pid, note) = (
                keep("acquired_at"),
                keep("holder_host"),
                keep("holder_pid"),
                keep("holder_note"),
            );
            let count = on_live("cur.count + 1", "1");
            let expires_at = on_live(
                "GREATEST(cur.expires_at, EXCLUDED.expires_at)",
                "EXCLUDED.expires_at",
            );
            let fencing = on_live("cur.fencing", "cur.fencing + 1");
            let waiters = on_live("cur.waiters", "false");
            let admit = if reentrant {
                format!("NOT {live} OR cur.owner = EXCLUDED.owner")
            } else {
                format!("NOT {live}")
            };
            format!(
                "INSERT INTO {t} AS cur ({COLUMNS}) VALUES ($1, $8, $2, 1,
                    CASE WHEN EXISTS (SELECT 1 FROM {t} WHERE lock_key = $1) THEN {SWEPT}
                         ELSE COALESCE((SELECT fencing FROM {t} WHERE lock_key = $7 FOR SHARE), 0) + 1 END,
                    {NOW}, {NOW} + $3, $4, $5, $6)
                 ON CONFLICT (lock_key) DO UPDATE SET
                    version = EXCLUDED.version, count = {count}, fencing = {fencing},
                    acquired_at = {acquired_at}, expires_at = {expires_at},
                    holder_host = {host}, holder_pid = {pid}, holder_note = {note},
                    waiters = {waiters}, owner = EXCLUDED.owner
                 WHERE {admit}
                 RETURNING true,
                    CASE WHEN fencing <> {SWEPT} THEN fencing
                         ELSE ('storage-lock: the record was swept meanwhile; retry ' || fencing)::bigint END,
                    count, expires_at"
            )
        };
        // The pieces of the multi-key statements (`acquire_many`, `acquire_any`): the values of
        // a row taken by `owner` ($2) for key `k` of the SELECT feeding the INSERT (a fresh
        // key's token from the floor, `acquire`'s sentinel otherwise), …
        let fresh_row = format!(
            "$8, $2, 1,
                        CASE WHEN EXISTS (SELECT 1 FROM {t} WHERE lock_key = k) THEN {SWEPT}
                             ELSE COALESCE((SELECT fencing FROM {t} WHERE lock_key = $7 FOR SHARE), 0) + 1 END,
                        {NOW}, {NOW} + $3, $4, $5, $6"
        );
        // … the conflict branch (a record that is not held gets the next token) …
        let take_free_rows = "ON CONFLICT (lock_key) DO UPDATE SET
                       version = EXCLUDED.version, count = 1, fencing = cur.fencing + 1,
                       acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at,
                       holder_host = EXCLUDED.holder_host, holder_pid = EXCLUDED.holder_pid,
                       holder_note = EXCLUDED.holder_note, waiters = false, owner = EXCLUDED.owner
                    WHERE NOT (cur.count > 0 AND cur.expires_at > EXCLUDED.acquired_at)
                    RETURNING lock_key, fencing, count, expires_at";
        // … and the answer: a row per key written (`grant`), the whole statement failed
        // (22012) unless as many were written as the expression that follows says.
        let grant = format!(
            "SELECT true,
                    CASE WHEN fencing <> {SWEPT} THEN fencing
                         ELSE ('storage-lock: the record was swept meanwhile; retry ' || fencing)::bigint END,
                    count, expires_at, lock_key"
        );
        let grants_of_taken = format!("{grant}, 1 / (CASE WHEN n.n = ");
        let divide_unless_all = " THEN 1 ELSE n.n - n.n END)";
        // $1 keys (text[], distinct, in the caller's order), $2…$8 as `acquire`, $9 how many
        // to take. The first $9 keys free in the statement's snapshot (`cand`) are written as
        // `acquire_many` writes its keys, only if there are that many; a candidate taken after
        // the snapshot makes fewer rows come back, and the division fails the statement
        // (SQLSTATE 22012, every row undone): `acquire_any` runs it again on a fresh snapshot.
        // No row back: fewer than $9 keys were free; `held_of_any` then says which.
        // (No gated form: a gate read in the statement would have to be a locking read, to see
        // a writer's acquisition committed after the snapshot, and a row kept share-locked by
        // a stream of readers lets them starve the writer's acquisition, which needs it
        // exclusively. A gated call takes the default: the slot, then a read of the gate.)
        let acquire_any = format!(
            "WITH cand AS (
                SELECT r.k FROM unnest($1::text[]) WITH ORDINALITY AS r(k, i)
                 WHERE NOT EXISTS (SELECT 1 FROM {t} WHERE lock_key = r.k
                                      AND count > 0 AND expires_at > {NOW})
                 ORDER BY r.i LIMIT $9
             ), taken AS (
                INSERT INTO {t} AS cur ({COLUMNS})
                SELECT c.k, {fresh_row}
                  FROM cand c
                 WHERE (SELECT count(*) FROM cand) = $9
                 ORDER BY c.k COLLATE \"C\"
                {take_free_rows}
             ), n AS (SELECT count(*) AS n FROM taken)
             {grants_of_taken}$9{divide_unless_all} FROM taken, n"
        );
        let mut ddl = Vec::new();
        if let Some(s) = schema {
            ddl.push(format!("CREATE SCHEMA IF NOT EXISTS {s}"));
        }
        ddl.push(format!("CREATE SEQUENCE IF NOT EXISTS {seq}"));
        ddl.push(format!(
            "CREATE TABLE IF NOT EXISTS {t} (
                lock_key TEXT COLLATE \"C\" PRIMARY KEY,
                version BIGINT NOT NULL,
                owner BYTEA NOT NULL,
                count BIGINT NOT NULL,
                fencing BIGINT NOT NULL,
                acquired_at BIGINT NOT NULL,
                expires_at BIGINT NOT NULL,
                holder_host TEXT,
                holder_pid BIGINT,
                holder_note TEXT,
                waiters BOOLEAN NOT NULL DEFAULT false
            )"
        ));
        // The fencing floor's row exists from the start, so that an acquisition can lock it
        // (see `acquire`): a row that does not exist yet cannot be locked.
        ddl.push(format!(
            "INSERT INTO {t} ({COLUMNS}) VALUES ('{FENCING_FLOOR_KEY}', 0, '\\x00000000000000000000000000000000'::bytea, 0, 0, 0, 0, NULL, NULL, NULL)
             ON CONFLICT (lock_key) DO NOTHING"
        ));
        let schema_test =
            schema.map_or_else(|| "current_schema()".to_owned(), |s| format!("'{s}'"));
        Self {
            ddl,
            has_waiters_column: format!(
                "SELECT EXISTS (SELECT 1 FROM information_schema.columns
                 WHERE table_schema = {schema_test} AND table_name = '{table}'
                   AND column_name = 'waiters')"
            ),
            add_waiters_column: format!(
                "ALTER TABLE {t} ADD COLUMN IF NOT EXISTS waiters BOOLEAN NOT NULL DEFAULT false"
            ),
            channel: format!("storage_lock_{table}"),
            now: format!("SELECT {NOW}"),
            get: format!("SELECT {COLUMNS} FROM {t} WHERE lock_key = $1"),
            create: format!(
                "INSERT INTO {t} ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
                 ON CONFLICT (lock_key) DO NOTHING"
            ),
            update: format!(
                "UPDATE {t} SET version = $1, owner = $2, count = $3, fencing = $4, acquired_at = $5,
                    expires_at = $6, holder_host = $7, holder_pid = $8, holder_note = $9
                 WHERE lock_key = $10 AND version = $11"
            ),
            delete: format!("DELETE FROM {t} WHERE lock_key = $1 AND version = $2"),
            list: format!(
                "SELECT {COLUMNS} FROM {t}
                 WHERE lock_key >= $1 AND starts_with(lock_key, $2) AND lock_key > $3
                 ORDER BY lock_key LIMIT $4"
            ),
            // A fresh key's token comes from the fencing floor, read `FOR SHARE`: a sweep raises
            // the floor (an UPDATE of that row) before it deletes tombstones, so it waits until
            // this statement commits, and a floor raised after the statement's snapshot is still
            // seen (a locking read at READ COMMITTED reads the newest committed row). A plain
            // snapshot read could miss a raise whose deletions then let the INSERT through with
            // a token already issued.
            // The floor is read (and locked) only when the snapshot has no row for the key: a
            // key with a record takes its token from the record (the conflict branch), and
            // locking the one floor row in every acquisition made concurrent acquisitions queue
            // on it (a row lock shared by several transactions is a MultiXact, WAL-logged).
            // When the snapshot has a row, the insert carries the sentinel `SWEPT` instead; the
            // insert happens anyway only if a sweep deleted that row after the snapshot, and
            // then its `RETURNING` list fails the statement (a cast error, SQLSTATE 22P02, so that
            // the sentinel row is never committed) and `acquire_once` tries again, with a fresh
            // snapshot that reads the floor. (`ON CONFLICT` checks NOT NULL and CHECK
            // constraints before it looks for the conflict, so a constraint cannot do this.)
            // Safety does not rest on PostgreSQL skipping the unneeded `FOR SHARE` sub-select
            // (it does: an InitPlan runs when first needed); only the cost does. The tests
            // `acquisition_delayed_past_a_sweep_gets_a_new_token` and the conformance case
            // `sweeps_racing_acquisitions_keep_tokens_increasing` fail if the sentinel row can
            // commit.
            // A statement takes the key or changes nothing: free or expired, the record gets
            // the next token (the conflict branch); otherwise the `WHERE` leaves it alone and
            // nothing is returned, and `acquire_once` asks `mark` who holds it. Reentrant
            // requests have a statement of their own (`take(true)`), which also admits the
            // holder's reentry (one level more); the plain one has no reentry branch to
            // evaluate. "Now" inside the conflict branch is `EXCLUDED.acquired_at` (the
            // statement's clock, read once in `VALUES`).
            acquire: take(false),
            acquire_reentrant: take(true),
            // $1 keys (text[], distinct), $2…$8 as `acquire`. All or nothing, in one statement
            // on one snapshot and one clock: the rows are written only if the snapshot shows
            // none of the keys held (so a busy call locks and writes nothing), in key order
            // (bytewise, whatever order the caller gave: two calls lock shared keys in one
            // order, so they cannot deadlock each other); each row is
            // `acquire`'s, sentinel included. If a key turned out held after all (taken after
            // the snapshot: its conflict branch's `WHERE` refused it), fewer rows came back
            // than keys were asked, and the division by zero in the last column fails the
            // statement, which undoes every row it wrote (SQLSTATE 22012): `acquire_many`
            // then asks `busy_of_many` who holds which. No row back: a key was held.
            acquire_many: format!(
                "WITH taken AS (
                    INSERT INTO {t} AS cur ({COLUMNS})
                    SELECT r.k, {fresh_row}
                      FROM unnest($1::text[]) WITH ORDINALITY AS r(k, i)
                     WHERE NOT EXISTS (SELECT 1 FROM {t} WHERE lock_key = ANY($1::text[])
                                          AND count > 0 AND expires_at > {NOW})
                     ORDER BY r.k COLLATE \"C\"
                    {take_free_rows}
                 ), n AS (SELECT count(*) AS n FROM taken)
                 {grants_of_taken}cardinality($1::text[]){divide_unless_all} FROM taken, n"
            ),
            acquire_any,
            // $1 keys (text[]). Every one held: its 1-based position, expiry and the clock. Not
            // marked (`mark` is for the key a waiter then waits on).
            held_of_any: format!(
                "SELECT array_position($1::text[], lock_key)::bigint, expires_at, {NOW}
                   FROM {t} WHERE lock_key = ANY($1::text[]) AND count > 0 AND expires_at > {NOW}
                  ORDER BY 1"
            ),
            // $1 keys (text[]). The first of them held, by position, marked as `mark` marks
            // it (its release then notifies; "expires now" if it ended before the mark), with
            // the columns of `mark` and its 1-based position last. No row: none is held any more; `acquire_many` tries again.
            busy_of_many: format!(
                "WITH first AS (
                    SELECT lock_key FROM {t}
                     WHERE lock_key = ANY($1::text[]) AND count > 0 AND expires_at > {NOW}
                     ORDER BY array_position($1::text[], lock_key) LIMIT 1
                 ), flag AS (
                    UPDATE {t} SET waiters = true
                     WHERE lock_key = (SELECT lock_key FROM first) AND NOT waiters
                       AND count > 0 AND expires_at > {NOW}
                    RETURNING 1
                 )
                 SELECT false, fencing, count,
                        CASE WHEN waiters OR EXISTS (SELECT 1 FROM flag) THEN expires_at ELSE {NOW} END,
                        holder_host, holder_pid, holder_note,
                        {NOW}, array_position($1::text[], lock_key)::bigint
                   FROM {t} WHERE lock_key = (SELECT lock_key FROM first)"
            ),
            // $1 key. Answers a busy acquisition: the record from the statement's snapshot and
            // the clock. It also marks the record (`waiters`), so that the release notifies
            // (uncontended releases skip NOTIFY, whose commit-time lock serializes concurrent
            // commits). The mark is set only on a live record; if the hold ended before it
            // (the release then saw no mark and sent nothing), the answer says "expires now":
            // the waiter retries at once instead of sleeping through a notification that
            // never comes. No row: the record is gone (a sweep); `acquire_once` tries again.
            mark: format!(
                "WITH flag AS (
                    UPDATE {t} SET waiters = true
                    WHERE lock_key = $1 AND NOT waiters AND count > 0 AND expires_at > {NOW}
                    RETURNING 1
                 )
                 SELECT false, fencing, count,
                        CASE WHEN waiters OR EXISTS (SELECT 1 FROM flag) THEN expires_at ELSE {NOW} END,
                        holder_host, holder_pid, holder_note, {NOW}
                   FROM {t} WHERE lock_key = $1"
            ),
            renew: format!(
                "UPDATE {t} SET version = {next}, expires_at = {NOW} + $3
                 WHERE lock_key = $1 AND owner = $2 AND count > 0 AND expires_at > {NOW}
                 RETURNING expires_at"
            ),
            // $1 keys, $2 owners, $3 leases (ms), arrays of one length; one statement, one
            // statement clock, each row decided on its own. The answer names the *request* it
            // renewed (its position), so a request for a key another owner holds is never
            // reported renewed by that owner's row.
            renew_many: format!(
                "UPDATE {t} AS cur SET version = {next}, expires_at = {NOW} + r.lease
                 FROM unnest($1::text[], $2::bytea[], $3::bigint[])
                      WITH ORDINALITY AS r(lock_key, owner, lease, i)
                 WHERE cur.lock_key = r.lock_key AND cur.owner = r.owner AND cur.count > 0
                   AND cur.expires_at > {NOW}
                 RETURNING r.i, cur.expires_at"
            ),
            // $3 = the notification channel; waiters hear of a key only when it becomes free,
            // and only if one said it waits. $4 = a random version, not the sequence's: an
            // asynchronous commit lost in a crash can take the sequence's advance with it, and
            // the value would then be handed out again.
            // The release commits without waiting for its WAL flush (`set_config(…, true)` is
            // transaction-local, and the implicit transaction reads it at commit): see
            // "Releases commit asynchronously" in the module docs for why that is safe.
            release: format!(
                "UPDATE {t} SET version = $4, count = count - 1,
                    expires_at = CASE WHEN count = 1 THEN LEAST(expires_at, {NOW}) ELSE expires_at END
                 WHERE lock_key = $1 AND owner = $2 AND count > 0
                 RETURNING count, fencing,
                    CASE WHEN count = 0 AND waiters THEN (SELECT 1 FROM pg_notify($3, $1)) ELSE 0 END AS notified,
                    set_config('synchronous_commit', 'off', true) AS async_commit"
            ),
        }
    }
}

/// Binds `$2`…`$8` of the `acquire` statements (`$1` is the key, or the keys): the owner, the
/// lease, the holder, the floor's key and a new version.
fn bind_request<'q>(
    q: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
    req: &'q AcquireRequest,
) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
    let (host, pid, note) = holder_params(req.holder.as_deref());
    q.bind(req.owner.to_bytes().to_vec())
        .bind(lease_millis(req.lease))
        .bind(host)
        .bind(pid)
        .bind(note)
        .bind(FENCING_FLOOR_KEY)
        .bind(crate::row::new_version())
}

/// The grants of a multi-key statement's rows (`acquire_many`, `acquire_any`: one per key
/// written, in any order), by the position of their key in `keys`.
fn grants_by_key(
    keys: &[&str],
    rows: &[sqlx::postgres::PgRow],
) -> Result<Vec<Option<AcquireOutcome>>, StorageError> {
    let mut granted: Vec<Option<AcquireOutcome>> = vec![None; keys.len()];
    for r in rows {
        let key: String = r.try_get(4).map_err(err("acquire"))?;
        let slot = keys
            .iter()
            .position(|k| *k == key)
            .and_then(|i| granted.get_mut(i));
        match slot {
            Some(slot) => *slot = Some(crate::row::acquire_outcome(&key, r, true)?),
            None => {
                return Err(StorageError::Corrupt {
                    key,
                    reason: "a multi-key acquisition granted a key it was not asked for".to_owned(),
                });
            }
        }
    }
    Ok(granted)
}

impl PostgresStorage {
    /// Every key of `keys` held now (`Statements::held_of_any`), by position.
    async fn held_of_any(
        &self,
        keys: &[&str],
    ) -> Result<Vec<(usize, AcquireOutcome)>, StorageError> {
        let mut c = self.conns.get().await.map_err(err("acquire"))?;
        let rows = query(&self.sql.held_of_any)
            .bind(keys)
            .fetch_all(c.conn())
            .await;
        c.keep_if(&rows);
        let mut held = Vec::new();
        for r in rows.map_err(err("acquire"))? {
            let index = position_in(keys, &r, 0)?;
            let expires_at: i64 = r.try_get(1).map_err(err("acquire"))?;
            let now: i64 = r.try_get(2).map_err(err("acquire"))?;
            held.push((
                index,
                AcquireOutcome::Busy {
                    expires_at: timestamp(expires_at),
                    now: timestamp(now),
                    holder: None,
                },
            ));
        }
        Ok(held)
    }
}

/// The index into `keys` of the 1-based position (`array_position`) in column `column` of `r`.
fn position_in(
    keys: &[&str],
    r: &sqlx::postgres::PgRow,
    column: usize,
) -> Result<usize, StorageError> {
    let position: i64 = r.try_get(column).map_err(err("acquire"))?;
    usize::try_from(position)
        .ok()
        .and_then(|p| p.checked_sub(1))
        .filter(|&i| i < keys.len())
        .ok_or_else(|| StorageError::Corrupt {
            key: keys.join(", "),
            reason: format!("a held key at position {position}"),
        })
}

/// The grants of an `acquire_many` statement's rows, in the order of `keys`.
fn granted_in_order(
    keys: &[&str],
    rows: &[sqlx::postgres::PgRow],
) -> Result<AcquireManyOutcome, StorageError> {
    grants_by_key(keys, rows)?
        .into_iter()
        .zip(keys)
        .map(|(g, key)| {
            g.ok_or_else(|| StorageError::Corrupt {
                key: (*key).to_owned(),
                reason: "a multi-key acquisition returned no grant for it".to_owned(),
            })
        })
        .collect::<Result<_, _>>()
        .map(AcquireManyOutcome::Acquired)
}

/// A multi-key statement's error: a token at the column's bound is said once, typed.
fn grant_error(keys: &[&str], e: sqlx::Error) -> StorageError {
    match e {
        sqlx::Error::Database(d) if d.code().as_deref() == Some(OUT_OF_RANGE) => {
            StorageError::Corrupt {
                key: keys.join(", "),
                reason: format!(
                    "a fencing token reached the bound of the BIGINT column ({}); \
                     that key cannot be granted again: use another name",
                    i64::MAX
                ),
            }
        }
        e => err("acquire")(e),
    }
}

/// Creates what is missing (schema, sequence, table, the floor's row) and migrates tables made
/// by earlier versions. Statements that take a table lock run only when the catalog says they
/// are needed, under a `lock_timeout`: an `ALTER TABLE` queued behind a session that read the
/// table would block every lock operation behind it (renewals included) until that session
/// ends.
async fn create_schema(pool: &PgPool, sql: &Statements) -> Result<(), StorageError> {
    let mut tx = pool.begin().await.map_err(err("create table"))?;
    query("SET LOCAL lock_timeout = '5s'")
        .execute(&mut *tx)
        .await
        .map_err(err("create table"))?;
    // Serialize concurrent schema creation (CREATE … IF NOT EXISTS races in PostgreSQL).
    query("SELECT pg_advisory_xact_lock(7262817271)")
        .execute(&mut *tx)
        .await
        .map_err(err("create table"))?;
    for ddl in &sql.ddl {
        query(ddl)
            .execute(&mut *tx)
            .await
            .map_err(err("create table"))?;
    }
    let has_waiters: bool = query(&sql.has_waiters_column)
        .fetch_one(&mut *tx)
        .await
        .map_err(err("create table"))?
        .try_get(0)
        .map_err(err("create table"))?;
    if !has_waiters {
        // Tables created before the column existed.
        query(&sql.add_waiters_column)
            .execute(&mut *tx)
            .await
            .map_err(err("migrate table"))?;
    }
    tx.commit().await.map_err(err("create table"))
}

fn err(operation: &'static str) -> impl Fn(sqlx::Error) -> StorageError {
    move |e| StorageError::backend(NAME, operation, e)
}

/// The `LISTEN` connection behind a storage's [`Notifications`] hub.
#[derive(Debug)]
struct PgSource {
    pool: PgPool,
    channel: String,
}

#[async_trait::async_trait]
impl NotificationSource for PgSource {
    type Connection = PgListener;

    async fn connect(&self) -> Result<PgListener, StorageError> {
        let mut l = PgListener::connect_with(&self.pool)
            .await
            .map_err(err("listen"))?;
        l.listen(&self.channel).await.map_err(err("listen"))?;
        Ok(l)
    }

    async fn next(&self, conn: &mut PgListener) -> SourceEvent {
        match conn.try_recv().await {
            Ok(Some(n)) => SourceEvent::Changed(n.payload().to_owned()),
            // The connection dropped and sqlx reconnects on the next call: re-check everything.
            Ok(None) => SourceEvent::MayHaveMissed,
            Err(_) => SourceEvent::Disconnected,
        }
    }
}

crate::primitives::impl_sql_storage! { PostgresStorage {
    fn name(&self) -> &str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::linearizable()
            .with_conditional_delete(true)
            .with_change_notifications(true)
            .with_durability(self.durability)
            .with_fencing_bound(crate::row::FENCING_BOUND)
            .with_round_trips("1 / 1 / 1 (one statement each, on the server clock; a busy acquire 2)")
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
        let take = if req.reentrant {
            &self.sql.acquire_reentrant
        } else {
            &self.sql.acquire
        };
        let mut swept = 0;
        loop {
            let mut c = self.conns.get().await.map_err(err("acquire"))?;
            let row = bind_request(query(take).bind(key), req)
                .fetch_optional(c.conn())
                .await;
            c.keep_if(&row);
            match row {
                Ok(Some(r)) => return crate::row::acquire_outcome(key, &r, true),
                // A sweep deleted the record after the statement's snapshot: nothing was
                // written; try again (the fresh snapshot reads the fencing floor).
                Err(sqlx::Error::Database(e))
                    if e.code().as_deref() == Some(SWEPT_MEANWHILE) && swept < SWEPT_RETRIES =>
                {
                    swept += 1;
                    continue;
                }
                // The next token would not fit the BIGINT column (the record holds 2^63 − 1):
                // this key can never be granted again. Said once, typed, naming the key.
                Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some(OUT_OF_RANGE) => {
                    return Err(StorageError::Corrupt {
                        key: key.to_owned(),
                        reason: format!(
                            "its fencing token reached the bound of the BIGINT column ({}); \
                             the key cannot be granted again: use another name",
                            i64::MAX
                        ),
                    });
                }
                Err(e) => return Err(err("acquire")(e)),
                // Busy: a second statement marks the record and reports its holder.
                Ok(None) => {}
            }
            let mut c = self.conns.get().await.map_err(err("acquire"))?;
            let row = query(&self.sql.mark).bind(key).fetch_optional(c.conn()).await;
            c.keep_if(&row);
            // No row: the record vanished since the upsert's check (a sweep); try again.
            if let Some(r) = row.map_err(err("acquire"))? {
                return crate::row::acquire_outcome(key, &r, false);
            }
        }
    }

    /// One statement for every key, all or nothing, on the server clock (see
    /// `Statements::acquire_many`); a busy answer costs a second one, as for one key. A
    /// reentrant request, and a call whose keys keep changing between the two statements,
    /// take the keys one by one ([`storage_lock_core::storage::acquire_each`]).
    async fn acquire_many(
        &self,
        keys: &[&str],
        req: &AcquireRequest,
    ) -> Result<AcquireManyOutcome, StorageError> {
        if req.reentrant || keys.is_empty() {
            return storage_lock_core::storage::acquire_each(self, keys, req).await;
        }
        for _ in 0..SWEPT_RETRIES {
            let mut c = self.conns.get().await.map_err(err("acquire"))?;
            let rows = bind_request(query(&self.sql.acquire_many).bind(keys), req)
                .fetch_all(c.conn())
                .await;
            c.keep_if(&rows);
            match rows {
                Ok(rows) if !rows.is_empty() => return granted_in_order(keys, &rows),
                Ok(_) => {} // a key was held in the snapshot
                Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some(TAKEN_MEANWHILE) => {}
                Err(sqlx::Error::Database(e))
                    if matches!(e.code().as_deref(), Some(SWEPT_MEANWHILE | DEADLOCK)) =>
                {
                    continue;
                }
                Err(e) => return Err(grant_error(keys, e)),
            }
            let mut c = self.conns.get().await.map_err(err("acquire"))?;
            let row = query(&self.sql.busy_of_many)
                .bind(keys)
                .fetch_optional(c.conn())
                .await;
            c.keep_if(&row);
            // No row: every key is free again; try again.
            if let Some(r) = row.map_err(err("acquire"))? {
                let index = position_in(keys, &r, 8)?;
                let outcome = crate::row::acquire_outcome(keys[index], &r, false)?;
                return Ok(AcquireManyOutcome::Busy { index, outcome });
            }
        }
        storage_lock_core::storage::acquire_each(self, keys, req).await
    }

    /// One statement, on the server clock (see `Statements::acquire_any`): the first `need`
    /// free keys taken, or none; when fewer are free, a second statement lists the held ones.
    /// A gate, a reentrant request, and a call whose keys keep changing under it, take the
    /// keys one by one ([`storage_lock_core::storage::acquire_first_free`]).
    async fn acquire_any(
        &self,
        keys: &[&str],
        need: usize,
        gate: Option<&str>,
        req: &AcquireRequest,
    ) -> Result<AcquireAnyOutcome, StorageError> {
        let asked = match i64::try_from(need) {
            Ok(asked) if !req.reentrant && gate.is_none() && need > 0 && need <= keys.len() => {
                asked
            }
            _ => {
                return storage_lock_core::storage::acquire_first_free(self, keys, need, gate, req)
                    .await;
            }
        };
        for _ in 0..SWEPT_RETRIES {
            let mut c = self.conns.get().await.map_err(err("acquire"))?;
            let rows = bind_request(query(&self.sql.acquire_any).bind(keys), req)
                .bind(asked)
                .fetch_all(c.conn())
                .await;
            c.keep_if(&rows);
            match rows {
                Ok(rows) if !rows.is_empty() => {
                    let taken: Vec<(usize, AcquireOutcome)> = grants_by_key(keys, &rows)?
                        .into_iter()
                        .enumerate()
                        .filter_map(|(i, g)| g.map(|g| (i, g)))
                        .collect();
                    return Ok(AcquireAnyOutcome::Acquired { taken, gate: 0 });
                }
                Ok(_) => {} // fewer than `need` were free in the snapshot
                // A candidate was taken after the snapshot, or swept: nothing was written.
                Err(sqlx::Error::Database(e))
                    if matches!(
                        e.code().as_deref(),
                        Some(TAKEN_MEANWHILE | SWEPT_MEANWHILE | DEADLOCK)
                    ) =>
                {
                    continue;
                }
                Err(e) => return Err(grant_error(keys, e)),
            }
            let held = self.held_of_any(keys).await?;
            // Enough keys freed since the first statement: try again.
            if keys.len() - held.len() < need {
                return Ok(AcquireAnyOutcome::Busy(held));
            }
        }
        storage_lock_core::storage::acquire_first_free(self, keys, need, None, req).await
    }

    async fn renew(
        &self,
        key: &str,
        owner: OwnerId,
        lease: Duration,
    ) -> Result<RenewOutcome, StorageError> {
        let mut c = self.conns.get().await.map_err(err("renew"))?;
        let row = query(&self.sql.renew)
            .bind(key)
            .bind(&owner.to_bytes()[..])
            .bind(lease_millis(lease))
            .fetch_optional(c.conn())
            .await;
        c.keep_if(&row);
        let row = row.map_err(err("renew"))?;
        crate::row::renew_outcome(key, row.as_ref())
    }

    /// One `UPDATE … FROM unnest(…) RETURNING` for all the keys.
    async fn renew_many(
        &self,
        renewals: &[RenewRequest<'_>],
    ) -> Result<Vec<Result<RenewOutcome, StorageError>>, StorageError> {
        if renewals.is_empty() {
            return Ok(Vec::new());
        }
        let keys: Vec<&str> = renewals.iter().map(|r| r.key).collect();
        let owners: Vec<Vec<u8>> = renewals.iter().map(|r| r.owner.to_bytes().to_vec()).collect();
        let leases: Vec<i64> = renewals.iter().map(|r| lease_millis(r.lease)).collect();
        let mut c = self.conns.get().await.map_err(err("renew"))?;
        let rows = query(&self.sql.renew_many)
            .bind(&keys)
            .bind(&owners)
            .bind(&leases)
            .fetch_all(c.conn())
            .await;
        c.keep_if(&rows);
        let rows = rows.map_err(err("renew"))?;
        let mut answers: Vec<Result<RenewOutcome, StorageError>> =
            renewals.iter().map(|_| Ok(RenewOutcome::NotHeld)).collect();
        for r in &rows {
            let i: i64 = r.try_get(0).map_err(err("renew"))?;
            // ORDINALITY counts from 1.
            let i = usize::try_from(i).ok().and_then(|i| i.checked_sub(1));
            if let Some((slot, req)) = i.and_then(|i| answers.get_mut(i).zip(renewals.get(i))) {
                *slot = crate::row::renew_outcome_at(req.key, Some(r), 1);
            }
        }
        Ok(answers)
    }

    async fn release(&self, key: &str, owner: OwnerId) -> Result<ReleaseOutcome, StorageError> {
        let mut c = self.conns.get().await.map_err(err("release"))?;
        let row = query(&self.sql.release)
            .bind(key)
            .bind(&owner.to_bytes()[..])
            .bind(&self.sql.channel)
            .bind(crate::row::new_version())
            .fetch_optional(c.conn())
            .await;
        c.keep_if(&row);
        let row = row.map_err(err("release"))?;
        crate::row::release_outcome(key, row.as_ref())
    }

    async fn wait_for_change(&self, key: &str) -> Result<ChangeWait, StorageError> {
        Ok(self.listener.arm(key).await)
    }
}}
