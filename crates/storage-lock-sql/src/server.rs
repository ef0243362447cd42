//! What the server-backed SQL storages (PostgreSQL, MySQL/MariaDB) configure alike.

use std::time::Duration;

use storage_lock_core::StorageError;

use crate::naming::{DEFAULT_TABLE, validate_table_name};

/// Connection settings shared by the server-backed builders (`Debug` hides the password).
#[derive(Clone)]
pub(crate) struct ServerOptions {
    pub(crate) url: Option<String>,
    pub(crate) table: String,
    pub(crate) max_connections: u32,
    pub(crate) acquire_timeout: Duration,
    pub(crate) allow_volatile: bool,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            url: None,
            table: DEFAULT_TABLE.to_owned(),
            max_connections: 16,
            acquire_timeout: Duration::from_secs(5),
            allow_volatile: false,
        }
    }
}

impl std::fmt::Debug for ServerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerOptions")
            .field(
                "url",
                &self.url.as_deref().map(storage_lock_core::redact_url),
            )
            .field("table", &self.table)
            .field("max_connections", &self.max_connections)
            .field("acquire_timeout", &self.acquire_timeout)
            .field("allow_volatile", &self.allow_volatile)
            .finish()
    }
}

impl ServerOptions {
    /// Defaults, overridden by `STORAGE_LOCK_<BACKEND>_URL` and `STORAGE_LOCK_<BACKEND>_TABLE`.
    pub(crate) fn from_env(backend: &str) -> Self {
        let var = |what: &str| std::env::var(format!("STORAGE_LOCK_{backend}_{what}")).ok();
        let defaults = Self::default();
        Self {
            url: var("URL"),
            table: var("TABLE").unwrap_or(defaults.table),
            ..defaults
        }
    }

    /// The URL, after checking that one is set and that the table name is a plain identifier.
    pub(crate) fn checked_url(&self, backend: &'static str) -> Result<&str, StorageError> {
        validate_table_name(&self.table)
            .map_err(|e| StorageError::config(backend, e.to_string()))?;
        self.url
            .as_deref()
            .ok_or_else(|| StorageError::config(backend, "no connection URL configured"))
    }
}

/// Makes one connection outside the pool and closes it again, so that an unreachable server or
/// a refused login fails `open` at once with the driver's reason ("Connection refused",
/// "password authentication failed"): the pool retries failed connects until its
/// `acquire_timeout` and then reports only that it timed out.
pub(crate) async fn probe<C: sqlx::Connection>(
    backend: &'static str,
    options: &C::Options,
    timeout: Duration,
) -> Result<(), StorageError> {
    match tokio::time::timeout(timeout, C::connect_with(options)).await {
        Ok(Ok(conn)) => {
            let _ = conn.close().await;
            Ok(())
        }
        Ok(Err(e)) => Err(StorageError::backend(backend, "open", e)),
        Err(_) => Err(StorageError::backend(
            backend,
            "open",
            format!("no connection within {timeout:?}"),
        )),
    }
}

/// The setters of [`ServerOptions`] for a builder with a `server` field.
macro_rules! server_setters {
    ($url_form:literal) => {
        #[doc = concat!("The connection URL (`", $url_form, "`).")]
        pub fn url(mut self, url: impl Into<String>) -> Self {
            self.server.url = Some(url.into());
            self
        }

        /// The table name (a plain identifier; default `storage_lock`).
        pub fn table(mut self, table: impl Into<String>) -> Self {
            self.server.table = table.into();
            self
        }

        /// Connections for lock operations (default 16, opened as needed; see the crate
        /// docs, "Connections"); the storage's other work (schema, the CAS primitives,
        /// notifications, batched renewals on MySQL/MariaDB) has a sqlx pool of the same bound.
        pub fn max_connections(mut self, n: u32) -> Self {
            self.server.max_connections = n.max(1);
            self
        }

        /// Accepts a server that can forget acknowledged writes in a crash (see the module
        /// docs for the settings checked): **exclusion and fencing can break on restart**.
        /// Default `false`: `open` refuses such a server with [`StorageError::Config`].
        /// URL form: `?durability=volatile`.
        pub fn allow_volatile(mut self, yes: bool) -> Self {
            self.server.allow_volatile = yes;
            self
        }

        /// How long an operation waits for a pooled connection (default 5 s), bounded so
        /// that an unreachable server surfaces as an error well before typical leases end.
        pub fn acquire_timeout(mut self, timeout: std::time::Duration) -> Self {
            self.server.acquire_timeout = timeout;
            self
        }
    };
}

pub(crate) use server_setters;
