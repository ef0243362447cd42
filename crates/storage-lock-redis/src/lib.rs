//! [`RedisStorage`]: storage-lock on Redis.
//!
//! * `acquire_once`, `renew` and `release` are each **one Lua script** (one round trip), judged by
//!   Redis `TIME` inside the script; `get`/`create`/`update`/`delete` are one command or script.
//! * Fencing tokens live in the record, which never expires (a released lock is a tombstone), so
//!   they survive release and lease expiry; sweeps raise a floor record first.
//! * A release that frees a key a busy acquisition marked `PUBLISH`es the key on a channel
//!   (unmarked releases publish nothing; a force release, an `update` that frees a key,
//!   publishes after it); each storage keeps **one** pub/sub connection,
//!   multiplexed over all waiting keys and re-established after a connection loss.
//! * Commands go through a [`ConnectionManager`](redis::aio::ConnectionManager) (on a cluster,
//!   a [`ClusterConnection`](redis::cluster_async::ClusterConnection)) that reconnects by itself; while Redis is
//!   unreachable, operations fail fast, so held handles turn lost at their local deadline
//!   (fail-closed) and acquisitions work again once Redis is back.
//!
//! # What holds where
//! * **Single primary** (with or without replicas you never fail over to): linearizable —
//!   safe.
//! * **Replica failover** (Sentinel, Redis Cluster) **without `replicas`**: *not* safe.
//!   Replication is asynchronous: a replica promoted before it got the last writes can grant a
//!   lock that was held, and fencing tokens can repeat. This is the Redlock debate.
//! * **Replica failover with [`RedisStorageBuilder::replicas`]`(n)`** (`?replicas=n`): after
//!   each write the storage sends `WAIT n` and confirms nothing (no grant, renewal or release)
//!   until `n` replicas hold the write; fewer in time is an error of unknown outcome (a grant
//!   that was not confirmed keeps the lock busy until its lease ends, as any failed grant
//!   does). With `n` = the shard's replica count, the replica a failover promotes holds every
//!   confirmed write, so exclusion and fencing survive the failover (`tests/cluster.rs`
//!   SIGKILLs the primary mid-contention). What it does **not** keep: a failover that
//!   promotes a replica that did not acknowledge (`n` below the replica count, or a replica
//!   added later and promoted before it synced); a node whose clock differs from the old
//!   primary's (expiry is judged on the serving primary's `TIME`: keep the nodes on NTP);
//!   replicas without the durability settings (a replica restarted with nothing on disk
//!   resyncs from its primary, which is fine, but a primary and replica that restart together
//!   forget everything). It costs a second round trip per operation, and a write waits for
//!   the slowest of the `n` replicas. `WAIT` blocks the connection it is sent on until the
//!   replicas answer, so with `replicas` the storage spreads its writes over four connections
//!   (each write and its `WAIT` on one) instead of queueing every operation behind one `WAIT`.
//! * **Redis Cluster** (`?cluster=true`): the URL names any node; the client learns the slot
//!   map, follows `MOVED`/`ASK` and refreshes the map after a failover. Each script touches
//!   the record and the fencing-floor record, which must hash to one slot: the prefix must
//!   carry a hash tag (default [`DEFAULT_CLUSTER_PREFIX`], `{storage-lock}:`; a prefix without
//!   one is refused at `open`). All locks of a storage then live on the shard that owns the
//!   tag, and the commands without a key (`SCAN`, `TIME`, `CONFIG GET`, `WAIT`) go to that
//!   shard's primary. The same hash tag lets `renew_many` (the watchdog's batched renewals:
//!   one script over up to [`storage_lock_core::RENEW_BATCH`] keys) run on a cluster, where a
//!   script may only touch keys of one slot. To spread locks over shards, open one storage per
//!   hash tag. Pub/sub: a cluster delivers a `PUBLISH` to the subscribers of every node, so
//!   the storage subscribes on any live node (the seed first, then the nodes of the slot map).
//!
//! # Valkey
//! Valkey (the Linux Foundation's fork of Redis 7.2) speaks the same protocol, runs the same
//! scripts and answers `CONFIG GET` the same way, so this backend serves it unchanged
//! (`redis://` URLs; the durability judgement is the same). The test suites run on both servers.
//! Valkey 8.1's `SET key value IFEQ old` is a compare-and-set in one command, but every lock
//! operation here is already one script in one round trip, and each script must also read the
//! clock, the fencing floor and the reentrancy count, which `IFEQ` cannot; so nothing would be
//! saved, and the backend keeps one code path for both servers.

mod conn;
mod scripts;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use conn::Conn;
use futures_util::StreamExt;
use redis::aio::ConnectionManagerConfig;
use redis::{Client, Script, Value};
use storage_lock_core::storage::ops::FENCING_FLOOR_KEY;
use storage_lock_core::storage::url::{DriverUrl, allow_volatile};
use storage_lock_core::{
    AcquireAnyOutcome, AcquireManyOutcome, AcquireOutcome, AcquireRequest, Capabilities,
    ChangeWait, Durability, HolderInfo, LockRecord, NotificationSource, Notifications, OwnerId,
    Page, PageRequest, Primitives, ReleaseOutcome, RenewOutcome, RenewRequest, SourceEvent,
    Storage, StorageError, Stored, Timestamp, Version,
};

const NAME: &str = "redis";

/// The key prefix used unless configured otherwise.
pub const DEFAULT_PREFIX: &str = "storage-lock:";

/// Connections for writes when [`RedisStorageBuilder::replicas`] is set: each `WAIT` blocks
/// one connection, so this many writes (with their `WAIT`s) can be in flight at once.
const WRITERS: usize = 4;

/// The key prefix used on a cluster unless configured otherwise: its hash tag puts every key
/// of the storage in one slot.
pub const DEFAULT_CLUSTER_PREFIX: &str = "{storage-lock}:";

/// Locks in Redis; see the [crate docs](crate).
#[derive(Clone)]
pub struct RedisStorage {
    /// Reads, keyless commands and the slot map.
    conn: Conn,
    /// Connections for writes: `conn` alone without `replicas`; with it, [`WRITERS`]
    /// connections, because `WAIT` blocks the connection it is sent on until the replicas
    /// answer, and every operation multiplexed behind it would wait in series.
    writers: Arc<[Conn]>,
    next_writer: Arc<AtomicUsize>,
    /// `WAIT` for this many replicas after each write (0: no `WAIT`).
    replicas: u32,
    wait_timeout: Duration,
    prefix: Arc<str>,
    channel: Arc<str>,
    scripts: Arc<Scripts>,
    hub: Arc<Notifications<PubSubSource>>,
    durability: Durability,
}

impl fmt::Debug for RedisStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStorage")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

struct Scripts {
    create: Script,
    update: Script,
    delete: Script,
    acquire: Script,
    acquire_many: Script,
    acquire_any: Script,
    renew: Script,
    renew_many: Script,
    release: Script,
}

/// Configures and opens a [`RedisStorage`] (`Debug` hides the password).
#[derive(Clone)]
#[must_use = "a builder does nothing until `open`"]
pub struct RedisStorageBuilder {
    url: Option<String>,
    /// `None`: [`DEFAULT_PREFIX`], or [`DEFAULT_CLUSTER_PREFIX`] on a cluster.
    prefix: Option<String>,
    response_timeout: Duration,
    allow_volatile: bool,
    cluster: bool,
    replicas: u32,
}

impl Default for RedisStorageBuilder {
    fn default() -> Self {
        Self {
            url: None,
            prefix: None,
            response_timeout: Duration::from_secs(2),
            allow_volatile: false,
            cluster: false,
            replicas: 0,
        }
    }
}

impl fmt::Debug for RedisStorageBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStorageBuilder")
            .field(
                "url",
                &self.url.as_deref().map(storage_lock_core::redact_url),
            )
            .field("prefix", &self.prefix)
            .field("response_timeout", &self.response_timeout)
            .field("allow_volatile", &self.allow_volatile)
            .field("cluster", &self.cluster)
            .field("replicas", &self.replicas)
            .finish()
    }
}

impl RedisStorageBuilder {
    /// A builder with defaults: prefix `storage-lock:`, 2 s response timeout.
    pub fn new() -> Self {
        Self::default()
    }

    /// A builder from `STORAGE_LOCK_REDIS_URL` and `STORAGE_LOCK_REDIS_PREFIX` (each optional).
    pub fn from_env() -> Self {
        let mut b = Self {
            url: std::env::var("STORAGE_LOCK_REDIS_URL").ok(),
            ..Self::default()
        };
        if let Ok(p) = std::env::var("STORAGE_LOCK_REDIS_PREFIX") {
            b.prefix = Some(p);
        }
        b
    }

    /// A builder from `redis://[:password@]host:port[/db][?prefix=PREFIX&durability=volatile
    /// &cluster=true&replicas=N&protocol=resp3]` (also `rediss://`; what `storage_lock::connect`
    /// opens).
    ///
    /// # Errors
    /// [`StorageError::Config`] for an unknown option or a URL the driver rejects (never
    /// showing the password).
    ///
    /// # Examples
    /// ```
    /// use storage_lock_redis::RedisStorageBuilder;
    /// assert!(RedisStorageBuilder::from_url("redis://127.0.0.1:6379/2?prefix=app:").is_ok());
    /// assert!(RedisStorageBuilder::from_url("redis://127.0.0.1/?prefx=app:").is_err());
    /// // A cluster, its locks under one hash tag, each write held by a replica:
    /// assert!(RedisStorageBuilder::from_url("redis://h:7000/?cluster=true&replicas=1").is_ok());
    /// assert!(RedisStorageBuilder::from_url("redis://h:7000/?replicas=one").is_err());
    /// ```
    pub fn from_url(url: &str) -> Result<Self, StorageError> {
        let invalid = |reason: String| StorageError::config("redis", reason);
        let mut u = DriverUrl::split(
            url,
            &["prefix", "durability", "cluster", "replicas"],
            &["protocol"],
        )
        .map_err(invalid)?;
        validate_url(&u.driver).map_err(invalid)?;
        let mut b = Self::new().url(u.driver.clone());
        if let Some(prefix) = u.take("prefix") {
            b = b.prefix(prefix);
        }
        if let Some(d) = u.take("durability") {
            b = b.allow_volatile(allow_volatile(&d).map_err(invalid)?);
        }
        if let Some(c) = u.take("cluster") {
            b = b.cluster(match c.as_str() {
                "true" | "1" => true,
                "false" | "0" => false,
                _ => return Err(invalid(format!("cluster={c:?}: expected true or false"))),
            });
        }
        if let Some(n) = u.take("replicas") {
            b = b.replicas(n.parse().map_err(|_| {
                invalid(format!(
                    "replicas={n:?}: expected a number of replicas (0, 1, 2, …)"
                ))
            })?);
        }
        Ok(b)
    }

    /// The server URL (`redis://[:password@]host:port/db`).
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.url = Some(url.into());
        self
    }

    /// The prefix of every key this storage writes (and of its pub/sub channel).
    ///
    /// On a cluster it must carry a hash tag (`{locks}:`): every key of the storage then lives
    /// in the tag's slot, which is what lets one script touch a record and the fencing floor.
    /// Default: [`DEFAULT_PREFIX`], or [`DEFAULT_CLUSTER_PREFIX`] on a cluster.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = Some(prefix.into());
        self
    }

    /// Talks to a Redis Cluster: the URL names one node (a seed); the client learns the slot
    /// map from it, follows `MOVED`/`ASK`, and refreshes the map after a failover. All locks of
    /// the storage live on the shard that owns the prefix's hash tag. URL form:
    /// `?cluster=true`.
    pub fn cluster(mut self, yes: bool) -> Self {
        self.cluster = yes;
        self
    }

    /// After each write, `WAIT` until `replicas` replicas hold it (up to the response
    /// timeout); a write that fewer replicas acknowledged in time is an error of unknown
    /// outcome, never a grant. Set it to the number of replicas of the shard so that the
    /// replica a failover promotes holds every acknowledged grant, renewal and release (see
    /// the crate docs: what this keeps and what it does not). Each operation then takes two
    /// round trips. Default 0 (no `WAIT`). URL form: `?replicas=N`.
    pub fn replicas(mut self, replicas: u32) -> Self {
        self.replicas = replicas;
        self
    }

    /// How long a command may take before it fails (and a renewal counts as unconfirmed).
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Accepts a server that can forget writes on a restart (no AOF, `appendfsync` other than
    /// `always`, an `allkeys-*` eviction policy): **exclusion and fencing can break on
    /// restart** (a restarted server grants held locks again and issues tokens from 1). Default
    /// `false`: [`Self::open`] refuses such a server. URL form: `?durability=volatile`.
    pub fn allow_volatile(mut self, yes: bool) -> Self {
        self.allow_volatile = yes;
        self
    }

    /// Connects, and checks the server's durability settings (see [`Self::allow_volatile`]).
    ///
    /// # Errors
    /// [`StorageError::Config`] for a server that can forget writes (unless allowed);
    /// [`StorageError::Backend`] if it cannot be reached.
    ///
    /// # Examples
    /// URL form: `redis://[:password@]host:port[/db]` (`tests/redis.rs` runs the same lines
    /// against a real server):
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), storage_lock_core::StorageError> {
    /// let url = "redis://127.0.0.1:6390/";
    /// use storage_lock_core::Storage;
    /// let storage = storage_lock_redis::RedisStorage::builder()
    ///     .url(url) // a server with appendonly yes, appendfsync always
    ///     .prefix("doc-locks:")
    ///     .open()
    ///     .await?;
    /// assert!(storage.capabilities().linearizable_cas);
    /// # Ok(()) }
    /// ```
    pub async fn open(self) -> Result<RedisStorage, StorageError> {
        let url = self
            .url
            .ok_or_else(|| StorageError::config(NAME, "no server URL configured"))?;
        let client = Client::open(url.as_str()).map_err(err("open"))?;
        let prefix = self.prefix.unwrap_or_else(|| {
            if self.cluster {
                DEFAULT_CLUSTER_PREFIX
            } else {
                DEFAULT_PREFIX
            }
            .to_owned()
        });
        let cluster = if self.cluster {
            if conn::hash_tag(&prefix).is_none() {
                return Err(StorageError::config(
                    NAME,
                    format!(
                        "on a cluster the prefix needs a hash tag, e.g. \"{{locks}}:\" (got \
                         {prefix:?}): a lock's record and the fencing floor must share a slot"
                    ),
                ));
            }
            let cluster = redis::cluster::ClusterClientBuilder::new(vec![url.as_str()])
                .response_timeout(self.response_timeout)
                .connection_timeout(self.response_timeout)
                .retries(2)
                .build()
                .map_err(err("open"))?;
            Some(cluster)
        } else {
            None
        };
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(self.response_timeout)
            .set_connection_timeout(self.response_timeout)
            .set_number_of_retries(1)
            .set_max_delay(500);
        let mut writers = Vec::new();
        let mut slot = None;
        for _ in 0..if self.replicas == 0 { 1 } else { WRITERS } {
            writers.push(match &cluster {
                Some(cluster) => {
                    let mut conn = cluster.get_async_connection().await.map_err(err("open"))?;
                    let slot = match slot {
                        Some(slot) => slot,
                        None => {
                            let tag = conn::hash_tag(&prefix).unwrap_or_default();
                            let s: u16 = redis::cmd("CLUSTER")
                                .arg("KEYSLOT")
                                .arg(format!("{{{tag}}}"))
                                .query_async(&mut conn)
                                .await
                                .map_err(err("open"))?;
                            *slot.insert(s)
                        }
                    };
                    Conn::Cluster { conn, slot }
                }
                None => Conn::Single(
                    client
                        .get_connection_manager_with_config(config.clone())
                        .await
                        .map_err(err("open"))?,
                ),
            });
        }
        let conn = writers[0].clone();
        let durability = check_durability(&conn, self.allow_volatile).await?;
        let channel: Arc<str> = format!("{prefix}changes").into();
        let hub = Arc::new(Notifications::new(PubSubSource {
            seed: client,
            conn: conn.clone(),
            tried: AtomicUsize::new(0),
            channel: channel.clone(),
        }));
        Ok(RedisStorage {
            conn,
            writers: writers.into(),
            next_writer: Arc::new(AtomicUsize::new(0)),
            replicas: self.replicas,
            wait_timeout: self.response_timeout,
            prefix: prefix.into(),
            channel,
            scripts: Arc::new(Scripts {
                create: Script::new(&scripts::create()),
                update: Script::new(&scripts::update()),
                delete: Script::new(scripts::DELETE),
                acquire: Script::new(&scripts::acquire()),
                acquire_many: Script::new(&scripts::acquire_many()),
                acquire_any: Script::new(&scripts::acquire_any()),
                renew: Script::new(&scripts::renew()),
                renew_many: Script::new(&scripts::renew_many()),
                release: Script::new(&scripts::release()),
            }),
            hub,
            durability,
        })
    }
}

/// Checks a `redis://` URL as the client reads it, without connecting.
///
/// # Errors
/// What the client rejects (an unsupported scheme, a bad database number, …).
pub fn validate_url(url: &str) -> Result<(), String> {
    Client::open(url).map(drop).map_err(|e| e.to_string())
}

/// Reads `appendonly`, `appendfsync` and `maxmemory-policy` and judges them with
/// [`judge_durability`]. A server that hides `CONFIG` (managed services) is `Unverified`, with
/// one warning.
async fn check_durability(conn: &Conn, allow_volatile: bool) -> Result<Durability, StorageError> {
    let mut settings = Vec::new();
    for name in ["appendonly", "appendfsync", "maxmemory-policy"] {
        let got: Result<HashMap<String, String>, _> = conn
            .on_keys_server(redis::cmd("CONFIG").arg("GET").arg(name))
            .await;
        match got {
            Ok(map) => settings.push(map.get(name).cloned().unwrap_or_default()),
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "redis: cannot read the server's durability settings (CONFIG GET); make sure \
                     it runs with appendonly yes, appendfsync always and no allkeys-* eviction"
                );
                return Ok(Durability::Unverified);
            }
        }
    }
    let problem = judge_durability(&settings[0], &settings[1], &settings[2]).err();
    Durability::judge(NAME, problem, allow_volatile)
}

/// Whether a server with these settings keeps every acknowledged write across a restart:
/// the append-only file on, fsynced before each reply, and no eviction of keys without a TTL
/// (lock records have none). `Err` says which setting fails.
pub fn judge_durability(appendonly: &str, appendfsync: &str, policy: &str) -> Result<(), String> {
    if !appendonly.eq_ignore_ascii_case("yes") {
        return Err(format!(
            "appendonly is {appendonly:?}, not \"yes\" (a restart loses every write since the \
             last snapshot)"
        ));
    }
    if !appendfsync.eq_ignore_ascii_case("always") {
        return Err(format!(
            "appendfsync is {appendfsync:?}, not \"always\" (a machine crash loses the last \
             second of writes)"
        ));
    }
    if policy.to_ascii_lowercase().starts_with("allkeys") {
        return Err(format!(
            "maxmemory-policy is {policy:?} (it may evict lock records under memory pressure; use \
             noeviction or a volatile-* policy)"
        ));
    }
    Ok(())
}

impl RedisStorage {
    /// Connects to `url` with default settings.
    pub async fn connect(url: &str) -> Result<Self, StorageError> {
        RedisStorageBuilder::new().url(url).open().await
    }

    /// A builder.
    pub fn builder() -> RedisStorageBuilder {
        RedisStorageBuilder::new()
    }

    fn redis_key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// The connection for one write (and its `WAIT`): the next of [`Self::writers`] in turn.
    /// The floor's key and the arguments of the acquire scripts (see `scripts::ACQUIRE_RULE`),
    /// after the records' keys.
    fn request_args(&self, inv: &mut redis::ScriptInvocation<'_>, req: &AcquireRequest) {
        inv.key(self.redis_key(FENCING_FLOOR_KEY))
            .arg(version_arg(&Version::random()))
            .arg(req.owner.to_string())
            .arg(lease_millis(req.lease))
            .arg(if req.reentrant { "1" } else { "0" });
        holder_args(inv, req.holder.as_deref());
    }

    fn writer(&self) -> Conn {
        let i = self.next_writer.fetch_add(1, Ordering::Relaxed);
        self.writers[i % self.writers.len()].clone()
    }

    /// With [`RedisStorageBuilder::replicas`] set: waits until that many replicas hold the
    /// writes `writer` sent so far (`WAIT`); fewer in time is an error of unknown
    /// outcome.
    async fn replicated(&self, writer: &Conn, operation: &'static str) -> Result<(), StorageError> {
        if self.replicas == 0 {
            return Ok(());
        }
        let got = writer
            .wait_replicas(self.replicas, self.wait_timeout / 2)
            .await
            .map_err(err(operation))?;
        if got < self.replicas {
            return Err(StorageError::backend(
                NAME,
                operation,
                format!(
                    "{got} of {} replicas acknowledged the write within {:?}: a failover may \
                     lose it, so it is not confirmed",
                    self.replicas,
                    self.wait_timeout / 2
                ),
            ));
        }
        Ok(())
    }

    /// Tells the waiters of every client that `key` is free (`PUBLISH`, as the release of a
    /// marked record does), after an `update` that freed it (a force release). Best effort: if
    /// it fails, they find out at their next re-check.
    async fn announce_free(&self, key: &str) {
        let sent: Result<i64, _> = redis::cmd("PUBLISH")
            .arg(&*self.channel)
            .arg(key)
            .query_async(&mut self.conn.clone())
            .await;
        if let Err(e) = sent {
            tracing::warn!(key, error = %err("publish")(e),
                "cannot announce a freed key: its waiters find out at their next re-check");
        }
    }
}

/// The pub/sub connection behind the storage's notification hub.
///
/// On a cluster, a `PUBLISH` reaches the subscribers of every node, so any node will do: a
/// (re)connection tries the seed and then each node of the current slot map, starting one
/// further each time, so that a dead node is not the only one ever tried.
struct PubSubSource {
    seed: Client,
    conn: Conn,
    tried: AtomicUsize,
    channel: Arc<str>,
}

impl PubSubSource {
    async fn subscribe(&self, client: &Client) -> Result<redis::aio::PubSubStream, StorageError> {
        let mut pubsub = client.get_async_pubsub().await.map_err(err("subscribe"))?;
        pubsub
            .subscribe(&*self.channel)
            .await
            .map_err(err("subscribe"))?;
        Ok(pubsub.into_on_message())
    }
}

#[async_trait]
impl NotificationSource for PubSubSource {
    type Connection = redis::aio::PubSubStream;

    async fn connect(&self) -> Result<Self::Connection, StorageError> {
        let mut candidates = vec![self.seed.clone()];
        for (host, port) in self.conn.cluster_nodes().await {
            let mut info = self.seed.get_connection_info().clone();
            if !matches!(info.addr, redis::ConnectionAddr::Tcp(..)) {
                break; // TLS or a socket: the seed only
            }
            info.addr = redis::ConnectionAddr::Tcp(host, port);
            if let Ok(client) = Client::open(info) {
                candidates.push(client);
            }
        }
        let start = self.tried.fetch_add(1, Ordering::Relaxed);
        let mut last = None;
        for i in 0..candidates.len() {
            match self
                .subscribe(&candidates[(start + i) % candidates.len()])
                .await
            {
                Ok(stream) => return Ok(stream),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| StorageError::backend(NAME, "subscribe", "no node to try")))
    }

    async fn next(&self, conn: &mut Self::Connection) -> SourceEvent {
        match conn.next().await {
            Some(msg) => msg
                .get_payload::<String>()
                .map_or(SourceEvent::MayHaveMissed, SourceEvent::Changed),
            None => SourceEvent::Disconnected,
        }
    }
}

fn err(operation: &'static str) -> impl Fn(redis::RedisError) -> StorageError {
    move |e| StorageError::backend(NAME, operation, e)
}

fn corrupt(key: &str, reason: impl fmt::Display) -> StorageError {
    StorageError::Corrupt {
        key: key.to_owned(),
        reason: reason.to_string(),
    }
}

/// A busy answer's `expires_at, now, host, pid, note` (the holder's), as the scripts return them.
fn busy_outcome(key: &str, reply: &[Value]) -> Result<AcquireOutcome, StorageError> {
    let holder = text(reply.get(2)).map(|host| {
        Arc::new(HolderInfo {
            host,
            pid: text(reply.get(3)).and_then(|p| p.parse().ok()).unwrap_or(0),
            note: text(reply.get(4)),
        })
    });
    Ok(AcquireOutcome::Busy {
        expires_at: Timestamp::from_millis(uint(key, reply.first())?),
        now: Timestamp::from_millis(uint(key, reply.get(1))?),
        holder,
    })
}

/// A lease in milliseconds, clamped so that `now + lease` stays exact in Lua's doubles.
fn lease_millis(lease: Duration) -> u64 {
    u64::try_from(lease.as_millis()).map_or(1 << 50, |ms| ms.min(1 << 50))
}

fn version_arg(v: &Version) -> String {
    v.as_u64().map_or_else(String::new, |n| n.to_string())
}

/// The record arguments of the `write` helper in [`scripts`].
fn record_args(inv: &mut redis::ScriptInvocation<'_>, version: &Version, r: &LockRecord) {
    inv.arg(version_arg(version))
        .arg(r.owner.to_string())
        .arg(r.count)
        .arg(r.fencing)
        .arg(r.acquired_at.as_millis())
        .arg(r.expires_at.as_millis());
    holder_args(inv, r.holder.as_deref());
}

fn holder_args(inv: &mut redis::ScriptInvocation<'_>, h: Option<&HolderInfo>) {
    match h {
        Some(h) => {
            inv.arg("1").arg(&h.host).arg(h.pid);
            match &h.note {
                Some(n) => inv.arg("1").arg(n),
                None => inv.arg("0").arg(""),
            };
        }
        None => {
            inv.arg("0").arg("").arg(0).arg("0").arg("");
        }
    }
}

fn decode(key: &str, mut h: HashMap<String, String>) -> Result<Option<Stored>, StorageError> {
    if h.is_empty() {
        return Ok(None);
    }
    let num = |f: &str| -> Result<u64, StorageError> {
        h.get(f)
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| corrupt(key, format!("field {f} missing or not a number")))
    };
    let (version, count, fencing, acquired_at, expires_at) =
        (num("v")?, num("c")?, num("f")?, num("a")?, num("e")?);
    let owner: OwnerId = h
        .get("o")
        .and_then(|o| o.parse().ok())
        .ok_or_else(|| corrupt(key, "owner missing or malformed"))?;
    let holder = h.remove("hh").map(|host| {
        Arc::new(HolderInfo {
            host,
            pid: h.get("hp").and_then(|p| p.parse().ok()).unwrap_or(0),
            note: h.remove("hn"),
        })
    });
    Ok(Some(Stored {
        record: LockRecord {
            owner,
            count: u32::try_from(count).map_err(|e| corrupt(key, e))?,
            fencing,
            acquired_at: Timestamp::from_millis(acquired_at),
            expires_at: Timestamp::from_millis(expires_at),
            holder,
        },
        version: Version::from_u64(version),
    }))
}

fn int(key: &str, v: Option<&Value>) -> Result<i64, StorageError> {
    match v {
        Some(Value::Int(n)) => Ok(*n),
        other => Err(corrupt(key, format!("expected an integer, got {other:?}"))),
    }
}

fn uint(key: &str, v: Option<&Value>) -> Result<u64, StorageError> {
    let n = int(key, v)?;
    u64::try_from(n).map_err(|_| corrupt(key, format!("expected a non-negative integer, got {n}")))
}

fn text(v: Option<&Value>) -> Option<String> {
    match v {
        Some(Value::BulkString(b)) => String::from_utf8(b.clone()).ok(),
        Some(Value::SimpleString(s)) => Some(s.clone()),
        Some(Value::Int(n)) => Some(n.to_string()),
        _ => None,
    }
}

/// `prefix` with Redis glob metacharacters escaped.
fn glob_escape(prefix: &str) -> String {
    let mut out = String::with_capacity(prefix.len());
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[async_trait]
impl Storage for RedisStorage {
    fn name(&self) -> &str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        // The scripts count fencing tokens in Lua numbers (doubles): exact up to 2^53, and
        // `2^53 + 1` rounds back to `2^53`, a token handed out twice.
        let caps = Capabilities::linearizable()
            .with_conditional_delete(true)
            .with_change_notifications(true)
            .with_fencing_bound((1 << 53) - 1)
            .with_round_trips(if self.replicas == 0 {
                "1 / 1 / 1 (one Lua script each, on Redis TIME)"
            } else {
                "2 / 2 / 2 (one Lua script each, on Redis TIME, then WAIT for the replicas)"
            });
        match self.durability {
            Durability::Unverified => caps.with_unverified_durability(
                "the server refuses CONFIG GET (managed services do), so its persistence \
                 could not be read: held locks and fencing tokens survive its restart only \
                 with appendonly yes, appendfsync always and no allkeys-* eviction",
            ),
            durability => caps.with_durability(durability),
        }
    }

    async fn now(&self) -> Result<Timestamp, StorageError> {
        let (secs, micros): (u64, u64) = self
            .conn
            .on_keys_server(&redis::cmd("TIME"))
            .await
            .map_err(err("now"))?;
        Ok(Timestamp::from_millis(secs * 1000 + micros / 1000))
    }

    async fn get(&self, key: &str) -> Result<Option<Stored>, StorageError> {
        let h: HashMap<String, String> = redis::cmd("HGETALL")
            .arg(self.redis_key(key))
            .query_async(&mut self.conn.clone())
            .await
            .map_err(err("get"))?;
        decode(key, h)
    }

    async fn list(&self, prefix: &str, page: &PageRequest) -> Result<Page, StorageError> {
        let mut conn = self.conn.clone();
        let pattern = format!("{}{}*", glob_escape(&self.prefix), glob_escape(prefix));
        let mut keys: Vec<String> = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, batch): (u64, Vec<String>) = conn
                .on_keys_server(
                    redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(&pattern)
                        .arg("COUNT")
                        .arg(1000),
                )
                .await
                .map_err(err("list"))?;
            keys.extend(
                batch
                    .into_iter()
                    .filter_map(|k| k.strip_prefix(&*self.prefix).map(str::to_owned))
                    .filter(|k| k.as_str() != &*self.channel)
                    .filter(|k| page.after.as_deref().is_none_or(|a| k.as_str() > a)),
            );
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
        keys.sort();
        keys.dedup();
        let limit = page.effective_limit();
        keys.truncate(limit + 1);
        let mut pipe = redis::pipe();
        for k in &keys {
            pipe.cmd("HGETALL").arg(self.redis_key(k));
        }
        let hashes: Vec<Result<HashMap<String, String>, String>> = match pipe
            .query_async::<Vec<HashMap<String, String>>>(&mut conn)
            .await
        {
            Ok(hashes) => hashes.into_iter().map(Ok).collect(),
            // A key of another type under the prefix (WRONGTYPE) fails the whole pipeline:
            // read them one by one, so it is one bad row, reported in the page.
            Err(e) if e.kind() == redis::ErrorKind::TypeError || e.code() == Some("WRONGTYPE") => {
                let mut one_by_one = Vec::with_capacity(keys.len());
                for k in &keys {
                    let got: Result<HashMap<String, String>, _> = redis::cmd("HGETALL")
                        .arg(self.redis_key(k))
                        .query_async(&mut conn)
                        .await;
                    one_by_one.push(match got {
                        Ok(h) => Ok(h),
                        Err(e) if e.code() == Some("WRONGTYPE") => {
                            Err("not a lock record (another Redis type)".to_owned())
                        }
                        Err(e) => return Err(err("list")(e)),
                    });
                }
                one_by_one
            }
            Err(e) => return Err(err("list")(e)),
        };
        let mut rows = Vec::with_capacity(keys.len());
        for (k, hash) in keys.into_iter().zip(hashes) {
            let row = match hash.map(|h| decode(&k, h)) {
                Ok(Ok(Some(stored))) => Ok(stored),
                Ok(Ok(None)) => continue, // gone meanwhile
                Ok(Err(e)) => Err(e.to_string()),
                Err(why) => Err(why),
            };
            rows.push((k, row));
        }
        Ok(Page::from_sorted_results(rows, limit))
    }

    async fn acquire_once(
        &self,
        key: &str,
        req: &AcquireRequest,
    ) -> Result<AcquireOutcome, StorageError> {
        let mut writer = self.writer();
        let mut inv = self.scripts.acquire.key(self.redis_key(key));
        self.request_args(&mut inv, req);
        let reply: Vec<Value> = inv
            .invoke_async(&mut writer)
            .await
            .map_err(err("acquire"))?;
        if int(key, reply.first())? == 1 {
            let granted = AcquireOutcome::Acquired {
                fencing: uint(key, reply.get(1))?,
                count: u32::try_from(uint(key, reply.get(2))?).map_err(|e| corrupt(key, e))?,
                expires_at: Timestamp::from_millis(uint(key, reply.get(3))?),
            };
            self.replicated(&writer, "acquire").await?;
            return Ok(granted);
        }
        busy_outcome(key, &reply[1.min(reply.len())..])
    }

    /// One script over every key (all in one slot on a cluster: the prefix's hash tag), on one
    /// `TIME`: every record is looked at before any is written, so a busy key leaves the others
    /// untouched and nobody sees part of them taken.
    async fn acquire_many(
        &self,
        keys: &[&str],
        req: &AcquireRequest,
    ) -> Result<AcquireManyOutcome, StorageError> {
        let Some(first) = keys.first() else {
            return Ok(AcquireManyOutcome::Acquired(Vec::new()));
        };
        let mut writer = self.writer();
        let mut inv = self.scripts.acquire_many.prepare_invoke();
        for key in keys {
            inv.key(self.redis_key(key));
        }
        self.request_args(&mut inv, req);
        let reply: Vec<Value> = inv
            .invoke_async(&mut writer)
            .await
            .map_err(err("acquire"))?;
        if int(first, reply.first())? == 1 {
            let mut granted = Vec::with_capacity(keys.len());
            for (i, key) in keys.iter().enumerate() {
                let at = 1 + 3 * i;
                granted.push(AcquireOutcome::Acquired {
                    fencing: uint(key, reply.get(at))?,
                    count: u32::try_from(uint(key, reply.get(at + 1))?)
                        .map_err(|e| corrupt(key, e))?,
                    expires_at: Timestamp::from_millis(uint(key, reply.get(at + 2))?),
                });
            }
            self.replicated(&writer, "acquire").await?;
            return Ok(AcquireManyOutcome::Acquired(granted));
        }
        let index = usize::try_from(uint(first, reply.get(1))?)
            .ok()
            .and_then(|i| i.checked_sub(1))
            .filter(|&i| i < keys.len())
            .ok_or_else(|| corrupt(first, "a busy position outside the keys"))?;
        Ok(AcquireManyOutcome::Busy {
            index,
            outcome: busy_outcome(keys[index], &reply[2.min(reply.len())..])?,
        })
    }

    /// One script over the gate and every key (one slot on a cluster, as for
    /// [`Self::acquire_many`]), on one `TIME`: the first `need` free keys are taken while the
    /// gate has no holder, or none is written.
    async fn acquire_any(
        &self,
        keys: &[&str],
        need: usize,
        gate: Option<&str>,
        req: &AcquireRequest,
    ) -> Result<AcquireAnyOutcome, StorageError> {
        let Some(first) = keys.first() else {
            return storage_lock_core::storage::acquire_first_free(self, keys, need, gate, req)
                .await;
        };
        let mut writer = self.writer();
        let mut inv = self.scripts.acquire_any.prepare_invoke();
        for key in keys {
            inv.key(self.redis_key(key));
        }
        self.request_args(&mut inv, req);
        if let Some(gate) = gate {
            inv.key(self.redis_key(gate));
        }
        inv.arg(need).arg(if gate.is_some() { "1" } else { "0" });
        let reply: Vec<Value> = inv
            .invoke_async(&mut writer)
            .await
            .map_err(err("acquire"))?;
        let position = |at: usize| -> Result<usize, StorageError> {
            usize::try_from(uint(first, reply.get(at))?)
                .ok()
                .and_then(|i| i.checked_sub(1))
                .filter(|&i| i < keys.len())
                .ok_or_else(|| corrupt(first, "a position outside the keys"))
        };
        let answer = int(first, reply.first())?;
        if answer == 2 {
            return Ok(AcquireAnyOutcome::GateHeld);
        }
        if answer == 1 {
            let gate = uint(first, reply.get(1))?;
            let mut taken = Vec::with_capacity(need);
            for at in (2..reply.len()).step_by(4) {
                let i = position(at)?;
                let key = keys[i];
                taken.push((
                    i,
                    AcquireOutcome::Acquired {
                        fencing: uint(key, reply.get(at + 1))?,
                        count: u32::try_from(uint(key, reply.get(at + 2))?)
                            .map_err(|e| corrupt(key, e))?,
                        expires_at: Timestamp::from_millis(uint(key, reply.get(at + 3))?),
                    },
                ));
            }
            self.replicated(&writer, "acquire").await?;
            return Ok(AcquireAnyOutcome::Acquired { taken, gate });
        }
        let now = Timestamp::from_millis(uint(first, reply.get(1))?);
        let mut held = Vec::new();
        for at in (2..reply.len()).step_by(2) {
            let i = position(at)?;
            held.push((
                i,
                AcquireOutcome::Busy {
                    expires_at: Timestamp::from_millis(uint(keys[i], reply.get(at + 1))?),
                    now,
                    holder: None,
                },
            ));
        }
        Ok(AcquireAnyOutcome::Busy(held))
    }

    async fn renew(
        &self,
        key: &str,
        owner: OwnerId,
        lease: Duration,
    ) -> Result<RenewOutcome, StorageError> {
        let mut writer = self.writer();
        let expires: i64 = self
            .scripts
            .renew
            .key(self.redis_key(key))
            .arg(version_arg(&Version::random()))
            .arg(owner.to_string())
            .arg(lease_millis(lease))
            .invoke_async(&mut writer)
            .await
            .map_err(err("renew"))?;
        Ok(match u64::try_from(expires) {
            Ok(ms) => {
                self.replicated(&writer, "renew").await?;
                RenewOutcome::Renewed {
                    expires_at: Timestamp::from_millis(ms),
                }
            }
            Err(_) => RenewOutcome::NotHeld,
        })
    }

    /// One script over all the keys (one round trip, one `TIME`).
    async fn renew_many(
        &self,
        renewals: &[RenewRequest<'_>],
    ) -> Result<Vec<Result<RenewOutcome, StorageError>>, StorageError> {
        let mut writer = self.writer();
        if renewals.is_empty() {
            return Ok(Vec::new());
        }
        let mut call = self.scripts.renew_many.prepare_invoke();
        call.arg(version_arg(&Version::random()));
        for r in renewals {
            call.key(self.redis_key(r.key))
                .arg(r.owner.to_string())
                .arg(lease_millis(r.lease));
        }
        let expiries: Vec<i64> = call.invoke_async(&mut writer).await.map_err(err("renew"))?;
        if expiries.len() != renewals.len() {
            return Err(StorageError::backend(
                NAME,
                "renew",
                format!("{} answers for {} keys", expiries.len(), renewals.len()),
            ));
        }
        if expiries.iter().any(|&e| e >= 0) {
            self.replicated(&writer, "renew").await?;
        }
        Ok(expiries
            .into_iter()
            .map(|e| {
                Ok(match u64::try_from(e) {
                    Ok(ms) => RenewOutcome::Renewed {
                        expires_at: Timestamp::from_millis(ms),
                    },
                    Err(_) => RenewOutcome::NotHeld,
                })
            })
            .collect())
    }

    async fn release(&self, key: &str, owner: OwnerId) -> Result<ReleaseOutcome, StorageError> {
        let mut writer = self.writer();
        let (left, fencing): (i64, String) = self
            .scripts
            .release
            .key(self.redis_key(key))
            .arg(version_arg(&Version::random()))
            .arg(owner.to_string())
            .arg(&*self.channel)
            .arg(key)
            .invoke_async(&mut writer)
            .await
            .map_err(err("release"))?;
        Ok(match u32::try_from(left) {
            Ok(remaining) => {
                let fencing = fencing.parse().map_err(|_| StorageError::Corrupt {
                    key: key.to_owned(),
                    reason: "the fencing token is not a u64".to_owned(),
                })?;
                self.replicated(&writer, "release").await?;
                ReleaseOutcome::Released { remaining, fencing }
            }
            Err(_) => ReleaseOutcome::NotHeld,
        })
    }

    async fn wait_for_change(&self, key: &str) -> Result<ChangeWait, StorageError> {
        Ok(self.hub.arm(key).await)
    }

    fn primitives(&self) -> Option<&dyn Primitives> {
        Some(self)
    }
}

#[async_trait]
impl Primitives for RedisStorage {
    async fn create(&self, key: &str, record: &LockRecord) -> Result<Version, StorageError> {
        let mut writer = self.writer();
        let version = Version::random();
        let mut inv = self.scripts.create.key(self.redis_key(key));
        record_args(&mut inv, &version, record);
        let created: i64 = inv.invoke_async(&mut writer).await.map_err(err("create"))?;
        if created == 1 {
            self.replicated(&writer, "create").await?;
            Ok(version)
        } else {
            Err(StorageError::already_exists(key))
        }
    }

    async fn update(
        &self,
        key: &str,
        expected: &Version,
        record: &LockRecord,
    ) -> Result<Version, StorageError> {
        let mut writer = self.writer();
        let version = Version::random();
        let mut inv = self.scripts.update.key(self.redis_key(key));
        inv.arg(version_arg(expected));
        record_args(&mut inv, &version, record);
        let updated: i64 = inv.invoke_async(&mut writer).await.map_err(err("update"))?;
        if updated == 1 {
            self.replicated(&writer, "update").await?;
            if record.count == 0 && !storage_lock_core::storage::ops::is_reserved_key(key) {
                self.announce_free(key).await;
            }
            Ok(version)
        } else {
            Err(StorageError::conflict(key))
        }
    }

    async fn delete(&self, key: &str, expected: &Version) -> Result<(), StorageError> {
        let mut writer = self.writer();
        let deleted: i64 = self
            .scripts
            .delete
            .key(self.redis_key(key))
            .arg(version_arg(expected))
            .invoke_async(&mut writer)
            .await
            .map_err(err("delete"))?;
        if deleted == 1 {
            self.replicated(&writer, "delete").await
        } else {
            Err(StorageError::conflict(key))
        }
    }
}
