//! SQL backends for storage-lock.
//!
//! | feature | backend | exclusion across | one round trip per lock op | notifications |
//! |---|---|---|---|---|
//! | `sqlite` (default) | `SqliteStorage` | processes on one host | yes (one statement) | no: jittered backoff |
//! | `postgres` | `PostgresStorage` | hosts sharing one primary | yes (one statement, server clock; a busy acquisition two) | `LISTEN/NOTIFY` |
//! | `mysql` | `MysqlStorage` (MySQL 8, MariaDB 10.5+) | hosts sharing one primary | renew/release 1, acquire 2 (see its docs) | no: jittered backoff |
//!
//! Every backend keeps one row per lock key in a table it creates idempotently
//! (default name `storage_lock`), with structured columns: owner (16 bytes), reentrancy count,
//! fencing token, acquired/expiry times (milliseconds since the Unix epoch), and the holder's host,
//! pid and note. Release writes a tombstone (`count = 0`); the per-storage fencing floor lives
//! in a reserved row. Each lock operation is one statement that applies the rules of
//! [`storage_lock_core::storage::ops`]; the primitives implement [`storage_lock_core::Storage`]'s
//! compare-and-set contract on a `BIGINT` row version that never repeats for a key: the
//! primitives write a fresh random 63-bit number (see `primitives`), PostgreSQL's renewals
//! the next value of a per-table sequence (its acquisitions a client-chosen random one),
//! SQLite's `random()` (64 bits) and MySQL's a client-chosen random 63-bit number. Versions are
//! opaque: only equality matters.
//!
//! # Connections
//!
//! PostgreSQL and MySQL/MariaDB run their lock operations (`acquire_once`, `renew`, `release`,
//! `now`; PostgreSQL's `renew_many`) on connections of the storage's own, not on a sqlx `Pool`:
//! a pool pings a connection when it hands it out and again when it takes it back, two round
//! trips per statement that made a PostgreSQL acquire + release cycle ~1.5× slower (BENCHMARKS.md).
//! SQLite does the same for `acquire_once`, `renew` and `release` (its ping is a round trip to
//! the connection's worker thread, which at a hand-off competes with the waking waiter; a
//! caller waits at most the busy timeout for one of its connections).
//! A connection goes back for reuse only after the server answered its statement (a result or
//! a database error); after any other error, or when the caller's future is dropped
//! mid-statement, it is closed. One idle for a second or more is pinged before reuse, so
//! connections a server restart broke are replaced, not handed to a lock operation. The rest
//! (schema work, the CAS primitives, the `LISTEN` connection, MySQL's batched renewals, which
//! need a transaction) uses a sqlx pool.

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
mod conns;
#[cfg(feature = "mysql")]
pub mod mysql;
mod naming;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
mod primitives;
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
mod row;
#[cfg(any(feature = "postgres", feature = "mysql"))]
mod server;
#[cfg(feature = "sqlite")]
pub mod sqlite;
#[cfg(feature = "sqlite")]
mod wake;

#[cfg(feature = "mysql")]
pub use mysql::{MysqlStorage, MysqlStorageBuilder};
pub use naming::{DEFAULT_TABLE, InvalidTableName, validate_table_name};
#[cfg(feature = "postgres")]
pub use postgres::{PostgresStorage, PostgresStorageBuilder};
#[cfg(feature = "sqlite")]
pub use sqlite::{SqliteStorage, SqliteStorageBuilder};
