//! [`ZooKeeperStorage`]: storage-lock on Apache ZooKeeper 3.6 or later (tested on 3.8).
//!
//! # How it works
//! * **One persistent znode per lock**, `ROOT/NAME` with the name escaped to
//!   `[A-Za-z0-9_-]` and `=XX` (as on S3 and NATS: no `/`, never `.` or `..`), holding the
//!   encoded record. The znode's data version (`Stat.version`) is the record's version.
//! * **Compare-and-set**: create is `create(path)` (`NodeExists` if the lock has a znode),
//!   update is `setData(path, version)` (`BadVersion` if another write came first). Every
//!   write goes through the leader and is ordered by one zxid sequence: the writes are
//!   linearizable on a single server and on an ensemble alike. A multi-lock
//!   ([`Primitives::write_all`]) is one `multi` of those writes, applied together or not at
//!   all.
//! * **No deletes, so no ABA.** A znode's data version counts from 0 again when it is deleted
//!   and created anew, and ZooKeeper can condition a write on nothing else: a client that
//!   remembered version 5 of the old znode would overwrite version 5 of the new one. So this
//!   backend never deletes a znode ([`Capabilities::conditional_delete`] is false; a release
//!   writes a free record, and `sweep` is not supported), and a znode's versions never repeat.
//!   They are an `i32` in which `-1` means "any version", so an update that would expect a
//!   version above `i32::MAX - 2` is refused with [`StorageError::Backend`] instead (2^31 writes
//!   to one lock: at one renewal a second, 68 years). Never delete the znodes by hand while
//!   any client runs.
//! * **Reads are synced**: a read (`get`, and each read of a listing) is `sync(path)` then
//!   `getData(path)`, pipelined on one connection (one round trip). A follower answers the read
//!   only after it has caught up with the leader as of the sync, so a lock released through
//!   another server is not reported busy by a lagging follower. Safety does not rest on it
//!   (every decision is a compare-and-set, which a stale read can only make fail); `sync` is
//!   not quorum-acknowledged, so across a leader change a read may still lag
//!   (ZOOKEEPER-1675), which can only cost a retry.
//! * **Time: observed** ([`TimeSource::Observed`], proof in
//!   [`storage_lock_core::storage::observed`]): a contender judges a hold over once it has
//!   seen the same version for the lease left in it, on its own monotonic clock. The znode's
//!   `mtime` is the leader's wall clock, which a leader change can step; a session's expiry
//!   (an ephemeral znode) would tie the lock to a connection, not to the lease the engine
//!   renews. Neither decides anything here.
//! * **Durability**: ZooKeeper fsyncs its transaction log before it acknowledges a write
//!   (`forceSync=yes`, the default), so an acknowledged write survives a crash of the server,
//!   and on an ensemble a quorum has logged it. A client cannot see that setting: a server
//!   started with `-Dzookeeper.forceSync=no` can lose held locks on a crash.
//! * **Sessions**: one ZooKeeper session per storage, which the client keeps alive with
//!   pings and moves to another server of the connect string when its server goes away. A
//!   request whose connection broke is an error of unknown outcome (the engine resolves it by
//!   reading); an expired session is replaced by a new one at the next request. No lock
//!   depends on a session.
//! * **Waiting** is woken by a persistent recursive watch on the root (ZooKeeper 3.6+), on a
//!   session of its own, opened with the first waiter: every write to a lock's znode wakes that
//!   lock's waiters, whichever client made it. When the watch's session is disconnected every
//!   waiter re-checks (a change made meanwhile may not be delivered: ZOOKEEPER-4698); when it
//!   expires, a new session and watch replace it.
//!
//! # URL
//! `zookeeper://host:port[,host:port…][/ROOT][?timeout=2s&session_timeout=10s]`: the servers
//! of one ensemble, and the znode under which the locks live (default `/storage-lock`,
//! created with its parents if missing, open to anyone: `world:anyone` ACLs). `timeout` bounds
//! each request; `session_timeout` is the session's (the ensemble clamps it to 2 to 20 ticks).
//! Neither TLS nor ZooKeeper authentication (digest, SASL) is supported yet: a URL with a user
//! is refused, and the root must be writable by `world:anyone`.
//!
//! # Examples
//! ```no_run
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use storage_lock_core::{DistributedLock, StorageLock};
//! use storage_lock_zookeeper::ZooKeeperStorage;
//! let storage = ZooKeeperStorage::connect("zookeeper://127.0.0.1:2181/app/locks").await?;
//! let locks = StorageLock::new(storage)?;
//! let held = locks.try_acquire_for("nightly", std::time::Duration::ZERO).await?;
//! # Ok(()) }
//! ```

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use storage_lock_core::storage::encoding::{escape_key, unescape_key};
use storage_lock_core::storage::observed::Observations;
use storage_lock_core::storage::url::UrlParts;
use storage_lock_core::{
    Capabilities, CasWrite, ChangeWait, Clock, LockRecord, MonotonicClock, NotificationSource,
    Notifications, Page, PageRequest, Primitives, SourceEvent, Storage, StorageError, Stored,
    TimeSource, Timestamp, Version,
};
use zookeeper_client as zk;

const NAME: &str = "zookeeper";
/// The highest data version an update may expect: the next write makes it `i32::MAX - 1`,
/// far from the wrap to negative numbers (and `-1`, "any version").
const LAST_VERSION: i32 = i32::MAX - 2;
/// Reads of one listing in flight at once.
const LIST_READS: usize = 16;

fn invalid(reason: impl Into<String>) -> StorageError {
    StorageError::config(NAME, reason.into())
}

/// Locks in one ZooKeeper ensemble; see the [crate docs](crate). Cheap to clone (clones share
/// the session and the observations).
#[derive(Clone)]
pub struct ZooKeeperStorage {
    inner: Arc<Inner>,
}

struct Inner {
    servers: String,
    root: String,
    timeout: Duration,
    session_timeout: Duration,
    /// The current session; `None` after it expired, until the next request opens another.
    client: std::sync::Mutex<Option<zk::Client>>,
    /// One session opened at a time.
    connecting: tokio::sync::Mutex<()>,
    seen: Observations,
    /// The waiters, woken by the watch on the root.
    hub: Notifications<WatchSource>,
}

impl fmt::Debug for ZooKeeperStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZooKeeperStorage")
            .field("servers", &self.inner.servers)
            .field("root", &self.inner.root)
            .finish_non_exhaustive()
    }
}

/// What a request answered: a value, or one of the refusals a caller decides on.
enum Answer<T> {
    Done(T),
    /// `NoNode`, `NodeExists` or `BadVersion`.
    Refused(zk::Error),
}

impl ZooKeeperStorage {
    /// A builder (servers, root, timeouts, clock).
    pub fn builder() -> ZooKeeperStorageBuilder {
        ZooKeeperStorageBuilder::default()
    }

    /// `ZooKeeperStorageBuilder::from_url(url)?.open()`.
    ///
    /// # Errors
    /// As [`ZooKeeperStorageBuilder::from_url`] and [`ZooKeeperStorageBuilder::open`].
    pub async fn connect(url: &str) -> Result<Self, StorageError> {
        ZooKeeperStorageBuilder::from_url(url)?.open().await
    }

    /// The znode of a lock key.
    fn path(&self, key: &str) -> String {
        format!("{}/{}", self.inner.root, escape_key(key))
    }

    /// The current session's client, opening a session if there is none.
    async fn client(&self) -> Result<zk::Client, StorageError> {
        if let Some(client) = self.current() {
            return Ok(client);
        }
        let _turn = self.inner.connecting.lock().await;
        if let Some(client) = self.current() {
            return Ok(client);
        }
        let client = open_session(
            &self.inner.servers,
            self.inner.timeout,
            self.inner.session_timeout,
        )
        .await?;
        *self.inner.client.lock().unwrap_or_else(|e| e.into_inner()) = Some(client.clone());
        Ok(client)
    }

    fn current(&self) -> Option<zk::Client> {
        self.inner
            .client
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Runs one request of `client`'s within the timeout. A session that expired or closed is
    /// dropped (the next request opens another).
    async fn run<T>(
        &self,
        operation: &'static str,
        client: &zk::Client,
        request: impl Future<Output = Result<T, zk::Error>>,
    ) -> Result<Answer<T>, StorageError> {
        let answer = within(self.inner.timeout, operation, request).await?;
        match answer {
            Ok(value) => Ok(Answer::Done(value)),
            Err(e @ (zk::Error::NoNode | zk::Error::NodeExists | zk::Error::BadVersion)) => {
                Ok(Answer::Refused(e))
            }
            Err(e) => {
                if matches!(
                    e,
                    zk::Error::SessionExpired | zk::Error::ClientClosed | zk::Error::AuthFailed
                ) {
                    let mut slot = self.inner.client.lock().unwrap_or_else(|e| e.into_inner());
                    if slot
                        .as_ref()
                        .is_some_and(|c| c.session_id() == client.session_id())
                    {
                        *slot = None;
                    }
                }
                Err(error(operation, e))
            }
        }
    }

    /// `sync(path)` then `getData(path)`, sent together (see the [crate docs](crate)).
    async fn read(
        &self,
        operation: &'static str,
        path: &str,
    ) -> Result<Option<(Vec<u8>, zk::Stat)>, StorageError> {
        let client = self.client().await?;
        let synced = client.sync(path);
        let data = client.get_data(path);
        let both = async {
            let (synced, data) = futures_util::future::join(synced, data).await;
            synced.or_else(|e| match e {
                zk::Error::NoNode => Ok(()),
                e => Err(e),
            })?;
            data
        };
        match self.run(operation, &client, both).await? {
            Answer::Done(found) => Ok(Some(found)),
            Answer::Refused(zk::Error::NoNode) => Ok(None),
            Answer::Refused(e) => Err(error(operation, e)),
        }
    }

    /// The record in a znode's data, with its version, by the observation rule.
    fn decode(&self, key: &str, data: &[u8], stat: &zk::Stat) -> Result<Stored, StorageError> {
        let version = version_of(key, stat)?;
        let record = self
            .inner
            .seen
            .read(key, &version, data, self.inner.seen.now())?;
        Ok(Stored { record, version })
    }
}

/// A znode's data version as a record version.
fn version_of(key: &str, stat: &zk::Stat) -> Result<Version, StorageError> {
    u64::try_from(stat.version)
        .map(Version::from_u64)
        .map_err(|_| StorageError::Corrupt {
            key: key.to_owned(),
            reason: format!("the znode's data version is {}", stat.version),
        })
}

/// The data version an update expects; one this storage never handed out is a lost race.
fn expected_version(key: &str, expected: &Version) -> Result<i32, StorageError> {
    let version = expected
        .as_u64()
        .and_then(|v| i32::try_from(v).ok())
        .ok_or_else(|| StorageError::conflict(key))?;
    if version > LAST_VERSION {
        return Err(StorageError::backend(
            NAME,
            "update",
            format!(
                "the znode of {key:?} has used up ZooKeeper's data versions (2^31 writes); \
                 delete it by hand while no client runs"
            ),
        ));
    }
    Ok(version)
}

/// A ZooKeeper error as a storage error: a refused authentication is [`StorageError::Denied`].
fn error(operation: &'static str, e: zk::Error) -> StorageError {
    match e {
        zk::Error::NoAuth | zk::Error::AuthFailed => StorageError::Denied {
            backend: NAME.to_owned(),
            reason: e.to_string(),
        },
        e => StorageError::backend(NAME, operation, e),
    }
}

/// `request`'s answer, or a [`StorageError::Backend`] naming `operation` if none comes within
/// `timeout`.
async fn within<T>(
    timeout: Duration,
    operation: &'static str,
    request: impl Future<Output = T>,
) -> Result<T, StorageError> {
    tokio::time::timeout(timeout, request).await.map_err(|_| {
        StorageError::backend(NAME, operation, format!("no answer within {timeout:?}"))
    })
}

/// How every znode is created: persistent (never tied to a session), open to every client.
fn persistent() -> zk::CreateOptions<'static> {
    zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all())
}

/// A new session with the ensemble, within `timeout` (every server tried once).
async fn open_session(
    servers: &str,
    timeout: Duration,
    session_timeout: Duration,
) -> Result<zk::Client, StorageError> {
    let connect = zk::Client::connector()
        .with_session_timeout(session_timeout)
        .with_connection_timeout(timeout)
        .with_fail_eagerly()
        .connect(servers);
    within(timeout.max(Duration::from_secs(1)) * 2, "connect", connect)
        .await?
        .map_err(|e| error("connect", e))
}

/// The watch that wakes waiters: a persistent recursive watch on the root, on a session of
/// its own.
struct WatchSource {
    servers: String,
    root: String,
    timeout: Duration,
    session_timeout: Duration,
}

#[async_trait]
impl NotificationSource for WatchSource {
    type Connection = (zk::Client, zk::PersistentWatcher);

    async fn connect(&self) -> Result<Self::Connection, StorageError> {
        let client = open_session(&self.servers, self.timeout, self.session_timeout).await?;
        let watch = client.watch(&self.root, zk::AddWatchMode::PersistentRecursive);
        // The watch is registered when this returns: every later write is delivered.
        let watcher = within(self.timeout, "watch", watch)
            .await?
            .map_err(|e| error("watch", e))?;
        Ok((client, watcher))
    }

    async fn next(&self, (_, watcher): &mut Self::Connection) -> SourceEvent {
        loop {
            // zookeeper-client 0.11 unwraps its event channel, which closes when the session
            // under the watcher ends: a panic here would end the notification hub for good.
            // Caught, it is what it means: the connection is gone (the hub opens a new one).
            let changed = std::panic::AssertUnwindSafe(watcher.changed());
            let Ok(event) = futures_util::FutureExt::catch_unwind(changed).await else {
                return SourceEvent::Disconnected;
            };
            match event.event_type {
                zk::EventType::Session => {
                    return match event.session_state {
                        // Events while disconnected may be lost: everyone re-checks.
                        zk::SessionState::Disconnected
                        | zk::SessionState::SyncConnected
                        | zk::SessionState::ConnectedReadOnly => SourceEvent::MayHaveMissed,
                        // Expired, closed, refused: the watcher delivers nothing more (and
                        // must not be asked again); the hub opens a new session.
                        _ => SourceEvent::Disconnected,
                    };
                }
                _ => {
                    let key = event
                        .path
                        .strip_prefix(self.root.as_str())
                        .and_then(|rest| rest.strip_prefix('/'))
                        .and_then(unescape_key);
                    // The root itself, or a znode no lock names: nobody to wake.
                    if let Some(key) = key {
                        return SourceEvent::Changed(key);
                    }
                }
            }
        }
    }
}

/// Configures a [`ZooKeeperStorage`]: from a URL or with setters, then [`Self::open`].
#[derive(Clone)]
#[must_use = "a builder does nothing until `open`"]
pub struct ZooKeeperStorageBuilder {
    servers: String,
    root: String,
    timeout: Duration,
    session_timeout: Duration,
    clock: Arc<dyn Clock>,
}

impl Default for ZooKeeperStorageBuilder {
    fn default() -> Self {
        Self {
            servers: "127.0.0.1:2181".to_owned(),
            root: "/storage-lock".to_owned(),
            timeout: Duration::from_secs(2),
            session_timeout: Duration::from_secs(10),
            clock: Arc::new(MonotonicClock),
        }
    }
}

impl fmt::Debug for ZooKeeperStorageBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZooKeeperStorageBuilder")
            .field("servers", &self.servers)
            .field("root", &self.root)
            .field("timeout", &self.timeout)
            .field("session_timeout", &self.session_timeout)
            .finish_non_exhaustive()
    }
}

impl ZooKeeperStorageBuilder {
    /// A builder from
    /// `zookeeper://host:port[,host:port…][/ROOT][?timeout=2s&session_timeout=10s]`.
    ///
    /// # Errors
    /// [`StorageError::Config`] for another scheme, no server, a user, a bad root, an unknown
    /// option or a bad value; nothing is contacted.
    ///
    /// # Examples
    /// ```
    /// use storage_lock_zookeeper::ZooKeeperStorageBuilder;
    /// let b = ZooKeeperStorageBuilder::from_url("zookeeper://zk1:2181,zk2:2181/app/locks")?;
    /// assert!(format!("{b:?}").contains("/app/locks"));
    /// assert!(ZooKeeperStorageBuilder::from_url("zookeeper://zk1:2181?depth=3").is_err());
    /// # Ok::<(), storage_lock_core::StorageError>(())
    /// ```
    pub fn from_url(url: &str) -> Result<Self, StorageError> {
        let mut u = UrlParts::parse(url).map_err(invalid)?;
        if u.scheme != "zookeeper" || u.hosts.is_empty() || u.user.is_some() {
            return Err(invalid(
                "expected zookeeper://host:port[,host:port…][/ROOT]",
            ));
        }
        let servers = u
            .hosts
            .iter()
            .map(|h| {
                if h.contains(':') && !h.ends_with(']') {
                    h.clone()
                } else {
                    format!("{h}:2181")
                }
            })
            .collect::<Vec<_>>()
            .join(",");
        let mut b = Self::new().servers(servers);
        if !u.path.is_empty() {
            b.root = format!("/{}", u.path.trim_end_matches('/'));
        }
        if let Some(timeout) = u.take_duration("timeout").map_err(invalid)? {
            b.timeout = timeout;
        }
        if let Some(timeout) = u.take_duration("session_timeout").map_err(invalid)? {
            b.session_timeout = timeout;
        }
        u.finish(&["timeout", "session_timeout"]).map_err(invalid)?;
        b.check()?;
        Ok(b)
    }

    /// A builder from `STORAGE_LOCK_ZOOKEEPER_URL`.
    ///
    /// # Errors
    /// [`StorageError::Config`] if it is not set, else as [`Self::from_url`].
    pub fn from_env() -> Result<Self, StorageError> {
        let url = std::env::var("STORAGE_LOCK_ZOOKEEPER_URL")
            .map_err(|_| invalid("STORAGE_LOCK_ZOOKEEPER_URL is not set"))?;
        Self::from_url(&url)
    }

    /// The defaults: `127.0.0.1:2181`, root `/storage-lock`, timeout 2 s, session timeout
    /// 10 s.
    pub fn new() -> Self {
        Self::default()
    }

    /// The servers of the ensemble, `host:port,host:port`.
    pub fn servers(mut self, servers: impl Into<String>) -> Self {
        self.servers = servers.into();
        self
    }

    /// The znode the locks live under (absolute, without a trailing `/`).
    pub fn root(mut self, root: impl Into<String>) -> Self {
        self.root = root.into();
        self
    }

    /// How long one request may take before it fails (an error of unknown outcome).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The session's timeout: how long the ensemble keeps the session without hearing from
    /// this client. No lock depends on it (see the [crate docs](crate)).
    pub fn session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    /// The clock this client times its observations on (default [`MonotonicClock`]; see the
    /// [crate docs](crate)): only its rate matters, and it must not step backwards.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    fn check(&self) -> Result<(), StorageError> {
        let root_ok = self.root.starts_with('/')
            && self.root.len() > 1
            && !self.root.ends_with('/')
            && self.root[1..]
                .split('/')
                .all(|part| !part.is_empty() && part != "." && part != "..")
            && !self.root.chars().any(char::is_control);
        if !root_ok {
            return Err(invalid(format!(
                "root {:?} is not an absolute znode path below / (no empty, `.` or `..` parts)",
                self.root
            )));
        }
        if self.servers.is_empty() {
            return Err(invalid("no servers"));
        }
        if self.timeout.is_zero() || self.session_timeout.is_zero() {
            return Err(invalid("timeouts must be positive"));
        }
        Ok(())
    }

    /// Opens a session and creates the root znode (with its parents) if it is missing.
    ///
    /// # Errors
    /// [`StorageError::Config`] for a bad root or timeout; [`StorageError::Backend`] if no
    /// server answers within the timeout; [`StorageError::Denied`] if the root's ACL refuses
    /// this client.
    pub async fn open(self) -> Result<ZooKeeperStorage, StorageError> {
        self.check()?;
        let client = open_session(&self.servers, self.timeout, self.session_timeout).await?;
        within(
            self.timeout,
            "open",
            client.mkdir(&self.root, &persistent()),
        )
        .await?
        .or_else(|e| match e {
            zk::Error::NodeExists => Ok(()),
            e => Err(error("open", e)),
        })?;
        let hub = Notifications::new(WatchSource {
            servers: self.servers.clone(),
            root: self.root.clone(),
            timeout: self.timeout,
            session_timeout: self.session_timeout,
        });
        Ok(ZooKeeperStorage {
            inner: Arc::new(Inner {
                hub,
                servers: self.servers,
                root: self.root,
                timeout: self.timeout,
                session_timeout: self.session_timeout,
                client: std::sync::Mutex::new(Some(client)),
                connecting: tokio::sync::Mutex::new(()),
                seen: Observations::with_clock(self.clock),
            }),
        })
    }
}

#[async_trait]
impl Storage for ZooKeeperStorage {
    fn name(&self) -> &str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::linearizable()
            .with_time_source(TimeSource::Observed)
            .with_change_notifications(true)
            .with_round_trips(
                "1 / 1 / 1 when the record is known (the holder's renewal and release, its next \
                 acquisition): one version-checked setData; otherwise a synced read first (2); \
                 a fresh key's first acquisition is one create after the read (2)",
            )
    }

    async fn now(&self) -> Result<Timestamp, StorageError> {
        Ok(self.inner.seen.now())
    }

    async fn get(&self, key: &str) -> Result<Option<Stored>, StorageError> {
        match self.read("get", &self.path(key)).await? {
            None => {
                self.inner.seen.forget(key);
                Ok(None)
            }
            Some((data, stat)) => self.decode(key, &data, &stat).map(Some),
        }
    }

    async fn list(&self, prefix: &str, page: &PageRequest) -> Result<Page, StorageError> {
        use futures_util::StreamExt;

        let client = self.client().await?;
        let root = self.inner.root.as_str();
        let synced = client.sync(root);
        let children = client.list_children(root);
        let both = async {
            let (synced, children) = futures_util::future::join(synced, children).await;
            synced?;
            children
        };
        let children = match self.run("list", &client, both).await? {
            Answer::Done(children) => children,
            Answer::Refused(zk::Error::NoNode) => Vec::new(),
            Answer::Refused(e) => return Err(error("list", e)),
        };
        let escaped_prefix = escape_key(prefix);
        let wanted: Vec<Result<String, String>> = children
            .into_iter()
            .filter_map(|child| match unescape_key(&child) {
                Some(key) if key.starts_with(prefix) => Some(Ok(key)),
                Some(_) => None,
                // A znode no client of this backend named: reported, never read.
                None if child.starts_with(&escaped_prefix) => Some(Err(child)),
                None => None,
            })
            .collect();
        let reads = futures_util::stream::iter(wanted)
            .map(|key| async move {
                match key {
                    Ok(key) => {
                        let got = self.read("list", &self.path(&key)).await;
                        (key, Some(got))
                    }
                    Err(child) => (child, None),
                }
            })
            .buffer_unordered(LIST_READS);
        let answers: Vec<_> = reads.collect().await;
        let mut rows = Vec::new();
        for (key, got) in answers {
            match got {
                None => rows.push((key, Err("not a lock's znode name".to_owned()))),
                Some(got) => match got? {
                    None => {} // deleted by hand since the listing
                    Some((data, stat)) => match self.decode(&key, &data, &stat) {
                        Ok(stored) => rows.push((key, Ok(stored))),
                        Err(StorageError::Corrupt { reason, .. }) => rows.push((key, Err(reason))),
                        Err(e) => return Err(e),
                    },
                },
            }
        }
        Ok(Page::from_unsorted_results(rows, prefix, page))
    }

    async fn wait_for_change(&self, key: &str) -> Result<ChangeWait, StorageError> {
        Ok(self.inner.hub.arm(key).await)
    }

    fn primitives(&self) -> Option<&dyn Primitives> {
        Some(self)
    }
}

#[async_trait]
impl Primitives for ZooKeeperStorage {
    fn known(&self, key: &str) -> Option<Stored> {
        self.inner.seen.known(key)
    }

    async fn create(&self, key: &str, record: &LockRecord) -> Result<Version, StorageError> {
        let path = self.path(key);
        let (data, written) = self.inner.seen.encode(record, rand::random());
        let client = self.client().await?;
        let created = client.create(&path, &data, &persistent());
        match self.run("create", &client, created).await? {
            Answer::Done((stat, _)) => {
                let version = version_of(key, &stat)?;
                self.inner.seen.wrote(key, &version, written);
                Ok(version)
            }
            Answer::Refused(zk::Error::NodeExists) => Err(StorageError::already_exists(key)),
            Answer::Refused(zk::Error::NoNode) => Err(StorageError::backend(
                NAME,
                "create",
                format!("the root znode {} is gone", self.inner.root),
            )),
            Answer::Refused(e) => Err(error("create", e)),
        }
    }

    async fn update(
        &self,
        key: &str,
        expected: &Version,
        record: &LockRecord,
    ) -> Result<Version, StorageError> {
        let version = expected_version(key, expected)?;
        let path = self.path(key);
        let (data, written) = self.inner.seen.encode(record, rand::random());
        let client = self.client().await?;
        let set = client.set_data(&path, &data, Some(version));
        match self.run("update", &client, set).await? {
            Answer::Done(stat) => {
                let version = version_of(key, &stat)?;
                self.inner.seen.wrote(key, &version, written);
                Ok(version)
            }
            Answer::Refused(zk::Error::BadVersion | zk::Error::NoNode) => {
                Err(StorageError::conflict(key))
            }
            Answer::Refused(e) => Err(error("update", e)),
        }
    }

    fn writes_all_at_once(&self) -> bool {
        true
    }

    /// One `multi`: a `create` or a version-checked `setData` per key, applied together or not
    /// at all. A created znode's data version is 0 (read off the answer's `Stat` would trust
    /// ZOOKEEPER-4026's servers, which answer a `create` in a `multi` without one).
    async fn write_all(&self, writes: &[CasWrite<'_>]) -> Result<Vec<Version>, StorageError> {
        let Some(first) = writes.first() else {
            return Ok(Vec::new());
        };
        let client = self.client().await?;
        let mut multi = client.new_multi_writer();
        let mut written = Vec::with_capacity(writes.len());
        for w in writes {
            let path = self.path(w.key);
            let (data, wrote) = self.inner.seen.encode(w.record, rand::random());
            match w.expected {
                None => multi.add_create(&path, &data, &persistent()),
                Some(v) => multi.add_set_data(&path, &data, Some(expected_version(w.key, v)?)),
            }
            .map_err(|e| error("write_all", e))?;
            written.push(wrote);
        }
        let committed = multi.commit();
        let committed = async move { committed.await.map_err(zk::Error::from) };
        let results = match self.run("write_all", &client, committed).await? {
            Answer::Done(results) => results,
            Answer::Refused(_) => return Err(StorageError::conflict(first.key)),
        };
        if results.len() != writes.len() {
            return Err(StorageError::backend(
                NAME,
                "write_all",
                format!("{} answers to {} writes", results.len(), writes.len()),
            ));
        }
        let mut versions = Vec::with_capacity(writes.len());
        for ((w, result), wrote) in writes.iter().zip(results).zip(written) {
            let version = match result {
                zk::MultiWriteResult::SetData { stat } => version_of(w.key, &stat)?,
                _ => Version::from_u64(0),
            };
            self.inner.seen.wrote(w.key, &version, wrote);
            versions.push(version);
        }
        Ok(versions)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_before_connecting() {
        let b = ZooKeeperStorageBuilder::from_url(
            "zookeeper://a:2181,b,c:2182/app/locks/?timeout=1s&session_timeout=4s",
        )
        .unwrap();
        assert_eq!(b.servers, "a:2181,b:2181,c:2182");
        assert_eq!(b.root, "/app/locks");
        assert_eq!(b.timeout, Duration::from_secs(1));
        assert_eq!(b.session_timeout, Duration::from_secs(4));
        let default = ZooKeeperStorageBuilder::from_url("zookeeper://zk").unwrap();
        assert_eq!(
            (default.servers.as_str(), default.root.as_str()),
            ("zk:2181", "/storage-lock")
        );
        for bad in [
            "etcd://h:1",
            "zookeeper:///root",
            "zookeeper://u@h:1",
            "zookeeper://h:1/a//b",
            "zookeeper://h:1/a/../b",
            "zookeeper://h:1?prefix=x",
            "zookeeper://h:1?timeout=soon",
            "zookeeper://h:1?timeout=0s",
        ] {
            let e = ZooKeeperStorageBuilder::from_url(bad).unwrap_err();
            assert!(matches!(e, StorageError::Config { .. }), "{bad}: {e:?}");
        }
    }

    /// Versions near the `i32` limit are refused before they could wrap to `-1` ("any").
    #[test]
    fn versions_stop_short_of_the_wrap() {
        assert_eq!(expected_version("k", &Version::from_u64(7)).unwrap(), 7);
        let last = Version::from_u64(LAST_VERSION as u64);
        assert_eq!(expected_version("k", &last).unwrap(), LAST_VERSION);
        let past = Version::from_u64(LAST_VERSION as u64 + 1);
        assert!(matches!(
            expected_version("k", &past),
            Err(StorageError::Backend { .. })
        ));
        for foreign in [Version::from_u64(1 << 40), Version::from_text("etag")] {
            assert!(matches!(
                expected_version("k", &foreign),
                Err(StorageError::Conflict { .. })
            ));
        }
    }
}
