//! The connections the lock operations of the server-backed storages (PostgreSQL,
//! MySQL/MariaDB) run on: one statement costs one round trip.
//!
//! sqlx's `Pool` pings a connection (one more round trip) when it hands it out and again when
//! it takes it back, so a one-statement lock operation on a pool costs three round trips, two of
//! them the pool's. On this project's bench machine that made a PostgreSQL acquire + release
//! cycle 1.5× slower at 16 clients than the same statements on connections held by the caller.
//! Here, instead:
//!
//! * **A connection goes back only after an answered statement**: the caller returns it with
//!   [`Leased::keep_if`] when the statement ended with a result or with an error the server sent
//!   (the protocol is then in step). Any other error, or a caller dropped mid-statement (a
//!   cancelled future), closes the connection instead of returning it in an unknown state.
//! * **A ping only after a pause**: a connection idle for [`PING_AFTER`] or more is pinged before
//!   it is handed out (a server restart takes longer than that, so a connection that predates
//!   one is found out here, not by the caller's statement); a failed ping closes it and the next
//!   one is tried.
//! * **Bounded**: at most `max` connections (the builders' `max_connections`), opened lazily; a
//!   caller waits at most the builders' `acquire_timeout` for one (then
//!   [`sqlx::Error::PoolTimedOut`]); idle connections are reused newest first, and one idle for
//!   [`IDLE_TIMEOUT`] is closed.
//!
//! Everything else (schema work, the CAS primitives, transactions, the `LISTEN` connection) keeps
//! a sqlx `Pool`: those calls are rare, and a pool's checks cost them little.

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::{ConnectOptions, Connection, Database};
use tokio::sync::{Semaphore, SemaphorePermit};

/// An idle connection is pinged before reuse after this long.
pub(crate) const PING_AFTER: Duration = Duration::from_secs(1);
/// An idle connection is closed after this long (sqlx's default `idle_timeout`).
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(600);

/// What runs on every new connection before its first use (session settings).
pub(crate) type Init<DB> = for<'c> fn(&'c mut <DB as Database>::Connection) -> Setup<'c>;

/// The future an [`Init`] returns (also what sqlx's `after_connect` takes).
pub(crate) type Setup<'c> = Pin<Box<dyn Future<Output = Result<(), sqlx::Error>> + Send + 'c>>;

/// A bounded, lazily filled set of connections (see the module docs).
pub(crate) struct Conns<DB: Database> {
    options: <DB::Connection as Connection>::Options,
    init: Init<DB>,
    idle: Mutex<Vec<(DB::Connection, Instant)>>,
    permits: Semaphore,
    acquire_timeout: Duration,
}

impl<DB: Database> std::fmt::Debug for Conns<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conns")
            .field("available", &self.permits.available_permits())
            .field("acquire_timeout", &self.acquire_timeout)
            .finish_non_exhaustive()
    }
}

impl<DB: Database> Conns<DB> {
    /// Up to `max` connections made from `options`, each set up by `init`.
    pub(crate) fn new(
        options: <DB::Connection as Connection>::Options,
        init: Init<DB>,
        max: u32,
        acquire_timeout: Duration,
    ) -> Self {
        Self {
            options,
            init,
            idle: Mutex::new(Vec::new()),
            permits: Semaphore::new(usize::try_from(max.max(1)).unwrap_or(usize::MAX)),
            acquire_timeout,
        }
    }

    /// A connection for one operation: an idle one (pinged first after a pause) or a new one.
    ///
    /// # Errors
    /// [`sqlx::Error::PoolTimedOut`] after `acquire_timeout` without a free slot or a new
    /// connection; the driver's error if connecting (or its session setup) fails.
    pub(crate) async fn get(&self) -> Result<Leased<'_, DB>, sqlx::Error> {
        match tokio::time::timeout(self.acquire_timeout, self.get_untimed()).await {
            Ok(leased) => leased,
            Err(_) => Err(sqlx::Error::PoolTimedOut),
        }
    }

    async fn get_untimed(&self) -> Result<Leased<'_, DB>, sqlx::Error> {
        let permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| sqlx::Error::PoolClosed)?;
        while let Some((mut conn, since)) = self.pop_idle() {
            let idle_for = since.elapsed();
            if idle_for >= IDLE_TIMEOUT {
                continue; // dropped: closed without a goodbye
            }
            if idle_for >= PING_AFTER && conn.ping().await.is_err() {
                continue;
            }
            return Ok(Leased::new(self, conn, permit));
        }
        let mut conn = self.options.connect().await?;
        (self.init)(&mut conn).await?;
        Ok(Leased::new(self, conn, permit))
    }

    fn pop_idle(&self) -> Option<(DB::Connection, Instant)> {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop()
    }

    fn put_back(&self, conn: DB::Connection) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        // The oldest are at the front (reuse is newest first): close the ones idle too long.
        let stale = idle
            .iter()
            .take_while(|(_, since)| since.elapsed() >= IDLE_TIMEOUT)
            .count();
        idle.drain(..stale);
        idle.push((conn, Instant::now()));
    }
}

/// One connection taken from [`Conns`]: dropped, it is closed; [`Leased::keep_if`] returns it.
pub(crate) struct Leased<'a, DB: Database> {
    conns: &'a Conns<DB>,
    conn: Option<DB::Connection>,
    _permit: SemaphorePermit<'a>,
}

impl<'a, DB: Database> Leased<'a, DB> {
    fn new(conns: &'a Conns<DB>, conn: DB::Connection, permit: SemaphorePermit<'a>) -> Self {
        Self {
            conns,
            conn: Some(conn),
            _permit: permit,
        }
    }

    /// The connection, for one statement.
    pub(crate) fn conn(&mut self) -> &mut DB::Connection {
        // Present until `keep_if` consumes `self`.
        self.conn
            .as_mut()
            .unwrap_or_else(|| unreachable!("a leased connection is taken only by keep_if"))
    }

    /// Returns the connection for reuse if `result` is an answer from the server (a result or
    /// a database error); closes it otherwise (an I/O or protocol error).
    pub(crate) fn keep_if<T>(mut self, result: &Result<T, sqlx::Error>) {
        if matches!(result, Ok(_) | Err(sqlx::Error::Database(_)))
            && let Some(conn) = self.conn.take()
        {
            self.conns.put_back(conn);
        }
    }
}
