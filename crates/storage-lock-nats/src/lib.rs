//! [`NatsStorage`]: storage-lock on a NATS JetStream key-value bucket.
//!
//! * **Compare-and-set** is JetStream's expected-last-sequence check: `create` writes only if
//!   the key has no value (or only a delete marker), `update` and `delete` only if the key's
//!   last revision is the expected one. A revision is the stream sequence of the write, which
//!   the stream never reuses, so every write yields a version never seen before for its key.
//! * **Lock operations** are the engine's defaults on these primitives: one revision-checked
//!   write on the version of the record this storage last wrote or saw (its own writes, its
//!   reads, and every record the watch delivers; [`Primitives::known`]), so a holder's renewal
//!   and release, and a waiter's acquisition after the watch showed it the release, take one
//!   round trip; a record not known yet is read first (two).
//! * **Waiting** is push-driven: each storage keeps one KV `watch` over the bucket (multiplexed
//!   over every waiting key, re-established after a failure); no polling.
//! * **Release** writes a tombstone (the fencing token stays in the record); `sweep` writes a
//!   revision-checked delete marker after raising the fencing floor.
//! * **Keys** are lock names in the bucket's key alphabet (see
//!   [`storage_lock_core::storage::encoding::escape_key`]), so any lock name works.
//!
//! # Time: observed, never a wall clock
//! JetStream has no clock API a client can read, so expiry is judged by observation
//! ([`TimeSource::Observed`]; the rule and its proof are in
//! [`storage_lock_core::storage::observed`]): a record carries the lease left when it was
//! written, and a contender judges it expired once it has seen that revision unchanged for that
//! long on its own monotonic clock. No client's wall clock decides anything, so a client whose
//! clock runs ahead (or an NTP step) cannot take a held lock early. The cost: a contender that
//! first reads a hold abandoned by a crashed holder waits one more lease from that read.
//! Fencing tokens never repeat (they live in the record, which release never deletes).
//!
//! # What holds where
//! Writes and reads here go to the stream leader (reads use the stream's message-get API, never
//! the direct get that any replica or mirror may answer from behind), so a bucket is
//! linearizable in every configuration below; what differs is what survives a crash:
//! * **R3 (or R5), file storage**: a write is acknowledged once a quorum has it — survives the
//!   loss of any one server (two for R5). **Safe**: [`Durability::Durable`].
//! * **R1, file storage**: survives a restart of the server process, but the server writes to
//!   disk on its `sync_interval` (default 2 minutes): a machine crash can lose acknowledged
//!   writes unless the server runs with `jetstream { sync_interval: always }`. The storage
//!   opens as [`Durability::Unverified`] (the setting is not visible to clients) with a warning.
//! * **Memory storage**: a restart forgets every hold and fencing token; refused unless the
//!   caller accepts it with `?durability=volatile` ([`NatsStorageBuilder::allow_volatile`]).
//! * **Refused** unless accepted like memory storage: a bucket with a `max_age` (it would expire
//!   released records, and with them their fencing tokens) and a bucket that mirrors or sources
//!   another (an asynchronous copy).
//! * **Refused**: NATS servers older than 2.10 (async-nats's KV needs 2.10+): opening fails with
//!   a [`StorageError::Config`] that names the server's version.
//!
//! # URL
//! `nats://[user:password@]host:4222[,host:4222…][?bucket=B&prefix=P&replicas=N&timeout=2s&durability=volatile]`
//! (see [`NatsStorageBuilder::from_url`]). TLS is not compiled in.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::kv::{self, Store, UpdateErrorKind};
use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::stream::{LastRawMessageErrorKind, StorageType};
use async_trait::async_trait;
use futures_util::{StreamExt, TryStreamExt};
use storage_lock_core::storage::encoding::{escape_key, unescape_key};
use storage_lock_core::storage::observed::Observations;
use storage_lock_core::storage::url::UrlParts;
use storage_lock_core::{
    Capabilities, ChangeWait, Clock, Durability, LockRecord, MonotonicClock, NotificationSource,
    Notifications, Page, PageRequest, Primitives, SourceEvent, Storage, StorageError, Stored,
    TimeSource, Timestamp, Version,
};

const NAME: &str = "nats";

/// The bucket used unless configured otherwise.
pub const DEFAULT_BUCKET: &str = "storage-lock";

/// Locks in a NATS JetStream KV bucket; see the [crate docs](crate).
#[derive(Clone)]
pub struct NatsStorage {
    store: Store,
    prefix: Arc<str>,
    seen: Arc<Observations>,
    durability: Durability,
    hub: Arc<Notifications<WatchSource>>,
    /// The builder's request timeout: what a read may take in all, however often it is asked.
    timeout: Duration,
}

impl fmt::Debug for NatsStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsStorage")
            .field("prefix", &self.prefix)
            .field("durability", &self.durability)
            .finish_non_exhaustive()
    }
}

/// Configures and opens a [`NatsStorage`] (`Debug` hides the password).
#[derive(Clone)]
#[must_use = "a builder does nothing until `open`"]
pub struct NatsStorageBuilder {
    servers: Vec<String>,
    user: Option<(String, String)>,
    bucket: String,
    prefix: String,
    replicas: usize,
    timeout: Duration,
    allow_volatile: bool,
    clock: Arc<dyn Clock>,
}

impl Default for NatsStorageBuilder {
    fn default() -> Self {
        Self {
            servers: Vec::new(),
            user: None,
            bucket: DEFAULT_BUCKET.to_owned(),
            prefix: String::new(),
            replicas: 1,
            timeout: Duration::from_secs(2),
            allow_volatile: false,
            clock: Arc::new(MonotonicClock),
        }
    }
}

impl fmt::Debug for NatsStorageBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsStorageBuilder")
            .field("servers", &self.servers)
            .field("user", &self.user.as_ref().map(|(u, _)| u))
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .field("replicas", &self.replicas)
            .field("timeout", &self.timeout)
            .field("allow_volatile", &self.allow_volatile)
            .finish_non_exhaustive()
    }
}

fn invalid(reason: impl Into<String>) -> StorageError {
    StorageError::config(NAME, reason)
}

/// The oldest nats-server whose JetStream key-value API async-nats speaks (older servers answer
/// in a form the client cannot decode).
const OLDEST_SERVER: (u64, u64) = (2, 10);

/// A [`StorageError::Config`] naming both versions if `version` (the server's `INFO`) is older
/// than [`OLDEST_SERVER`]; a version that does not parse (a development build) passes.
fn check_server_version(version: &str) -> Result<(), StorageError> {
    let mut parts = version
        .trim_start_matches('v')
        .split(['.', '-', '+'])
        .map(str::parse::<u64>);
    if let (Some(Ok(major)), Some(Ok(minor))) = (parts.next(), parts.next())
        && (major, minor) < OLDEST_SERVER
    {
        let (want_major, want_minor) = OLDEST_SERVER;
        return Err(invalid(format!(
            "nats-server {version} is too old: this backend needs {want_major}.{want_minor} or \
             later"
        )));
    }
    Ok(())
}

impl NatsStorageBuilder {
    /// A builder with defaults: bucket `storage-lock`, no prefix, one replica (for a bucket it
    /// creates), 2 s per request, observations timed on [`MonotonicClock`].
    pub fn new() -> Self {
        Self::default()
    }

    /// A builder from the URL in `STORAGE_LOCK_NATS_URL`, if set.
    ///
    /// # Errors
    /// As [`Self::from_url`].
    pub fn from_env() -> Result<Self, StorageError> {
        match std::env::var("STORAGE_LOCK_NATS_URL") {
            Ok(url) => Self::from_url(&url),
            Err(_) => Ok(Self::new()),
        }
    }

    /// A builder from
    /// `nats://[user:password@]host:port[,host:port…][?bucket=B&prefix=P&replicas=N&timeout=T&durability=volatile]`.
    ///
    /// # Errors
    /// [`StorageError::Config`] for another scheme, no server, an unknown option or a bad value
    /// (the password is never shown).
    ///
    /// # Examples
    /// ```
    /// use storage_lock_nats::NatsStorageBuilder;
    /// let b = NatsStorageBuilder::from_url("nats://127.0.0.1:4222?bucket=locks&replicas=3")?;
    /// assert!(format!("{b:?}").contains("locks"));
    /// assert!(NatsStorageBuilder::from_url("nats://h:1?replicas=0").is_err());
    /// # Ok::<(), storage_lock_core::StorageError>(())
    /// ```
    pub fn from_url(url: &str) -> Result<Self, StorageError> {
        let mut u = UrlParts::parse(url).map_err(invalid)?;
        if u.scheme != "nats" || u.hosts.is_empty() || !u.path.is_empty() {
            return Err(invalid("expected nats://host:port[,host:port…]"));
        }
        let mut b = Self::new();
        if let Some(user) = u.user.take() {
            b.user = Some((user, u.password.take().unwrap_or_default()));
        }
        b.servers = u.hosts.iter().map(|h| format!("nats://{h}")).collect();
        if let Some(bucket) = u.take("bucket") {
            b.bucket = bucket;
        }
        if let Some(prefix) = u.take("prefix") {
            b.prefix = prefix;
        }
        if let Some(n) = u.take("replicas") {
            b.replicas = n
                .parse()
                .ok()
                .filter(|n| (1..=5).contains(n))
                .ok_or_else(|| invalid(format!("bad replicas {n:?} (1 to 5)")))?;
        }
        if let Some(timeout) = u.take_duration("timeout").map_err(invalid)? {
            b.timeout = timeout;
        }
        if let Some(v) = u.take("durability") {
            // `unverified`: the operator made sure of what clients cannot read (the CLI then
            // stops warning); the storage opens as without it.
            b.allow_volatile = match v.as_str() {
                "volatile" => true,
                "durable" | "unverified" => false,
                _ => {
                    return Err(invalid(format!(
                        "bad durability {v:?} (durable, unverified or volatile)"
                    )));
                }
            };
        }
        u.finish(&["bucket", "prefix", "replicas", "timeout", "durability"])
            .map_err(invalid)?;
        Ok(b)
    }

    /// The servers (`nats://host:port`) of one cluster.
    pub fn servers<I: IntoIterator<Item = S>, S: Into<String>>(mut self, servers: I) -> Self {
        self.servers = servers.into_iter().map(Into::into).collect();
        self
    }

    /// User and password.
    pub fn user(mut self, name: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some((name.into(), password.into()));
        self
    }

    /// The bucket (created with file storage, history 1 and [`Self::replicas`] if missing).
    pub fn bucket(mut self, bucket: impl Into<String>) -> Self {
        self.bucket = bucket.into();
        self
    }

    /// A prefix of every lock name this storage writes, so several users can share a bucket.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Replicas of a bucket this storage creates (3 keeps the guarantee through the loss of
    /// one server; see the [crate docs](crate)). An existing bucket keeps its own.
    pub fn replicas(mut self, replicas: usize) -> Self {
        self.replicas = replicas;
        self
    }

    /// How long one request may take before it fails (and a renewal counts as unconfirmed).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Accepts a bucket in memory storage (**a server restart forgets every hold and fencing
    /// token**), with a `max_age` (released records expire and their fencing tokens repeat),
    /// or that mirrors or sources another bucket. Default `false`: [`Self::open`] refuses them.
    pub fn allow_volatile(mut self, yes: bool) -> Self {
        self.allow_volatile = yes;
        self
    }

    /// The clock this client times its observations on (default [`MonotonicClock`]; see the
    /// [crate docs](crate)): only its rate matters, and it must not step backwards.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Connects, opens (or creates) the bucket and judges its durability.
    ///
    /// # Errors
    /// [`StorageError::Config`] without servers or for a memory bucket (unless allowed);
    /// [`StorageError::Backend`] if the servers cannot be reached or JetStream refuses.
    ///
    /// # Examples
    /// With `STORAGE_LOCK_NATS_URL` set (`tests/nats.rs` runs the same lines against a real
    /// server):
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), storage_lock_core::StorageError> {
    /// use storage_lock_core::Storage;
    /// let storage = storage_lock_nats::NatsStorageBuilder::from_env()?
    ///     .prefix("doc-locks/")
    ///     .open()
    ///     .await?;
    /// assert!(storage.capabilities().linearizable_cas);
    /// # Ok(()) }
    /// ```
    pub async fn open(self) -> Result<NatsStorage, StorageError> {
        if self.servers.is_empty() {
            return Err(invalid("no server configured"));
        }
        let mut options = async_nats::ConnectOptions::new()
            .connection_timeout(self.timeout)
            .request_timeout(Some(self.timeout))
            // Reconnect quickly and forever: a held handle's renewals need the connection back
            // well within a lease.
            .reconnect_delay_callback(|attempts| {
                Duration::from_millis(100 * u64::try_from(attempts.min(10)).unwrap_or(10))
            });
        if let Some((user, password)) = self.user {
            options = options.user_and_password(user, password);
        }
        let addrs = self
            .servers
            .iter()
            .map(|s| s.parse::<async_nats::ServerAddr>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid(format!("bad server address: {e}")))?;
        let client = async_nats::connect_with_options(addrs, options)
            .await
            .map_err(err("open"))?;
        check_server_version(&client.server_info().version)?;
        let mut js = async_nats::jetstream::new(client);
        js.set_timeout(self.timeout);
        // A lookup while another client creates the bucket can go unanswered (see `led`): ask
        // again rather than wait out the whole request timeout.
        let found = asking_again(self.timeout, || js.get_key_value(&self.bucket))
            .await
            .and_then(Result::ok);
        let store = match found {
            Some(store) => store,
            None => js
                .create_key_value(kv::Config {
                    bucket: self.bucket.clone(),
                    description: "storage-lock records".to_owned(),
                    history: 1,
                    storage: StorageType::File,
                    num_replicas: self.replicas,
                    ..Default::default()
                })
                .await
                .map_err(err("open"))?,
        };
        let status = led(&store, self.timeout).await?;
        let config = &status.info.config;
        let problem = if config.storage == StorageType::Memory {
            Some(format!(
                "bucket {:?} keeps its data in memory",
                status.bucket
            ))
        } else if !config.max_age.is_zero() {
            Some(format!(
                "bucket {:?} expires entries after {:?} (fencing tokens of released locks would \
                 repeat)",
                status.bucket, config.max_age
            ))
        } else if config.mirror.is_some() || config.sources.as_ref().is_some_and(|s| !s.is_empty())
        {
            Some(format!(
                "bucket {:?} is an asynchronous copy (mirror or sources) of another",
                status.bucket
            ))
        } else {
            None
        };
        let mut durability = Durability::judge(NAME, problem, self.allow_volatile)?;
        if durability == Durability::Durable && config.num_replicas < 3 {
            tracing::warn!(
                bucket = %status.bucket,
                replicas = config.num_replicas,
                "nats: a bucket with fewer than 3 replicas loses acknowledged writes in a machine \
                 crash unless the server runs with jetstream sync_interval: always; use 3 \
                 replicas or set that"
            );
            durability = Durability::Unverified;
        }
        let prefix: Arc<str> = escape_key(&self.prefix).into();
        let seen = Arc::new(Observations::with_clock(self.clock));
        Ok(NatsStorage {
            hub: Arc::new(Notifications::new(WatchSource {
                store: store.clone(),
                prefix: prefix.clone(),
                seen: seen.clone(),
            })),
            store,
            prefix,
            seen,
            durability,
            timeout: self.timeout,
        })
    }
}

impl NatsStorage {
    /// A write of `value` expecting no message on the subject; if there is one and it is a
    /// delete or purge marker, a write expecting that marker. Only a lost expectation is
    /// `AlreadyExists`: any other failure (a timeout whose write may have landed) stays an error
    /// of unknown outcome.
    async fn create_value(&self, key: &str, value: bytes::Bytes) -> Result<Version, StorageError> {
        let exists = || StorageError::already_exists(key);
        let k = self.full(key);
        match self.store.update(&k, value.clone(), 0).await {
            Ok(rev) => return Ok(Version::from_u64(rev)),
            Err(e) if lost_expectation(&e) => {}
            Err(e) => return Err(StorageError::backend(NAME, "create", e)),
        }
        match self.last(key).await? {
            Some(marker) if !is_value(&marker) => {
                match self.store.update(&k, value, marker.sequence).await {
                    Ok(rev) => Ok(Version::from_u64(rev)),
                    Err(e) if lost_expectation(&e) => Err(exists()),
                    Err(e) => Err(StorageError::backend(NAME, "create", e)),
                }
            }
            // No message (yet): on a clustered stream the leader rejects a write whose subject
            // has a write in flight (error 10164) before that write is applied, so the read
            // that follows can still find nothing; or the key was purged in between. Either
            // way the expectation was lost: the caller reads again.
            Some(_) | None => Err(exists()),
        }
    }

    /// A builder.
    pub fn builder() -> NatsStorageBuilder {
        NatsStorageBuilder::new()
    }

    fn full(&self, key: &str) -> String {
        format!("{}{}", self.prefix, escape_key(key))
    }

    /// The lock name of a bucket key this storage wrote.
    fn name_of(&self, bucket_key: &str) -> Option<String> {
        unescape_key(bucket_key.strip_prefix(&*self.prefix)?)
    }

    /// The last message of `key`'s subject, read from the stream leader (linearizable).
    ///
    /// A read that goes unanswered for [`PROBE`] is asked again, within the builder's timeout:
    /// a replicated stream's leader can change in the first moments of a new bucket (after
    /// [`led`] saw one), and a request sent to the leader that just stepped down is never
    /// answered (a clean-clone CI run failed so: a fresh R3 bucket's first read waited out the
    /// whole 10 s timeout). Asking again is safe because it only reads.
    async fn last(&self, key: &str) -> Result<Option<StreamMessage>, StorageError> {
        let subject = format!("{}{}", self.store.prefix, self.full(key));
        let asked = asking_again(self.timeout, || {
            self.store.stream.get_last_raw_message_by_subject(&subject)
        });
        match asked.await {
            Some(Ok(m)) => Ok(Some(m)),
            Some(Err(e)) if matches!(e.kind(), LastRawMessageErrorKind::NoMessageFound) => Ok(None),
            Some(Err(e)) => Err(StorageError::backend(NAME, "get", e)),
            None => Err(StorageError::backend(
                NAME,
                "get",
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no answer within {:?}", self.timeout),
                ),
            )),
        }
    }
}

/// The bucket's status once its stream has a leader (at once for a stream that is not
/// replicated).
///
/// A replicated bucket that another client is creating at this moment is found (or "created")
/// before its stream has elected a leader, and a request the leader should answer that is sent
/// then — a message-get, a stream-info — is never answered (or answered "stream not found" by
/// a server that has not applied the new stream yet): every such caller's first read would
/// wait out the whole request timeout and fail. So `open` asks for the stream's info until it
/// names a leader, each ask given at most [`PROBE`] (an unanswered one is asked again; it only
/// reads), all within the builder's timeout.
async fn led(store: &Store, timeout: Duration) -> Result<kv::bucket::Status, StorageError> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        // (`Store::status` would return the info as it was when the store was made.)
        match tokio::time::timeout(PROBE.min(left), store.stream.get_info()).await {
            Ok(Ok(info)) if info.cluster.as_ref().is_none_or(|c| c.leader.is_some()) => {
                let bucket = store.name.clone();
                return Ok(kv::bucket::Status { info, bucket });
            }
            Ok(Err(e)) if !settling(&e) => return Err(StorageError::backend(NAME, "open", e)),
            // No leader yet, no answer, or not yet known to the server that answered.
            _ => {}
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(StorageError::backend(
                NAME,
                "open",
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("the stream of bucket {:?} elected no leader", store.name),
                ),
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether `e` is what a stream being created answers while it settles: no answer, no
/// responder, or "stream not found" from a server that has not applied its assignment yet
/// (seen in CI on a loaded machine, after another client's create had returned).
fn settling(e: &async_nats::jetstream::context::RequestError) -> bool {
    use async_nats::jetstream::context::RequestErrorKind;
    use async_nats::jetstream::{Error as ApiError, ErrorCode};
    match e.kind() {
        RequestErrorKind::TimedOut | RequestErrorKind::NoResponders => true,
        _ => std::error::Error::source(e)
            .and_then(|s| s.downcast_ref::<ApiError>())
            .is_some_and(|api| api.error_code() == ErrorCode::STREAM_NOT_FOUND),
    }
}

/// How long [`led`] and [`asking_again`] wait for one answer before they ask again.
const PROBE: Duration = Duration::from_secs(1);

/// The answer to the first of `ask`'s requests that is answered within [`PROBE`]: a request
/// that goes unanswered is made again, all within `timeout` (`None`: nothing answered). Only
/// for requests that are safe to repeat (reads, a lookup).
async fn asking_again<T, Ask, Fut>(timeout: Duration, mut ask: Ask) -> Option<T>
where
    Ask: FnMut() -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        match tokio::time::timeout(PROBE.min(left), ask()).await {
            Ok(answer) => return Some(answer),
            Err(_) if left > PROBE => {}
            Err(_) => return None,
        }
    }
}

/// Whether a KV message holds a value (not a delete or purge marker).
fn is_value(m: &StreamMessage) -> bool {
    m.headers.get("KV-Operation").is_none() && m.headers.get("Nats-Marker-Reason").is_none()
}

fn err<E: std::error::Error + Send + Sync + 'static>(
    operation: &'static str,
) -> impl Fn(E) -> StorageError {
    move |e| StorageError::backend(NAME, operation, e)
}

/// The revision a version stands for; 0 (which JetStream reads as "no value yet") and
/// versions of other backends never match.
fn revision(key: &str, v: &Version) -> Result<u64, StorageError> {
    v.as_u64()
        .filter(|&r| r != 0)
        .ok_or_else(|| StorageError::conflict(key))
}

#[async_trait]
impl Storage for NatsStorage {
    fn name(&self) -> &str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        let caps = Capabilities::linearizable()
            .with_conditional_delete(true)
            .with_change_notifications(true)
            .with_time_source(TimeSource::Observed)
            .with_round_trips(
                "1 / 1 / 1 when the record is known (the holder's renewal and release, its next \
                 acquisition, a waiter's acquisition after the watch showed it the release): one \
                 revision-checked write; otherwise a read first (2); a fresh key's first \
                 acquisition also reads the fencing floor before and after its create (4)",
            );
        match self.durability {
            Durability::Unverified => caps.with_unverified_durability(
                "a bucket with fewer than 3 replicas keeps acknowledged writes through a \
                 machine crash only if the server runs with jetstream { sync_interval: always }, \
                 which clients cannot read",
            ),
            durability => caps.with_durability(durability),
        }
    }

    async fn now(&self) -> Result<Timestamp, StorageError> {
        Ok(self.seen.now())
    }

    async fn get(&self, key: &str) -> Result<Option<Stored>, StorageError> {
        match self.last(key).await? {
            Some(m) if is_value(&m) => {
                let version = Version::from_u64(m.sequence);
                let record = self.seen.read(key, &version, &m.payload, self.seen.now())?;
                Ok(Some(Stored { record, version }))
            }
            _ => {
                self.seen.forget(key);
                Ok(None)
            }
        }
    }

    async fn list(&self, prefix: &str, page: &PageRequest) -> Result<Page, StorageError> {
        let wanted = self.full(prefix);
        let names: Vec<String> = self
            .store
            .keys()
            .await
            .map_err(err("list"))?
            .try_filter_map(|k| {
                let name = k
                    .starts_with(&wanted)
                    .then(|| self.name_of(&k))
                    .flatten()
                    .filter(|n| page.after.as_deref().is_none_or(|a| n.as_str() > a));
                async move { Ok(name) }
            })
            .try_collect()
            .await
            .map_err(err("list"))?;
        Page::gather(names, page.effective_limit(), |name| async move {
            self.get(&name).await
        })
        .await
    }

    async fn wait_for_change(&self, key: &str) -> Result<ChangeWait, StorageError> {
        Ok(self.hub.arm(key).await)
    }

    fn primitives(&self) -> Option<&dyn Primitives> {
        Some(self)
    }
}

#[async_trait]
impl Primitives for NatsStorage {
    fn known(&self, key: &str) -> Option<Stored> {
        self.seen.known(key)
    }

    /// A write expecting no message on the subject, or the delete marker left by a release:
    /// only a lost expectation is `AlreadyExists`; a timeout stays an error of unknown outcome.
    async fn create(&self, key: &str, record: &LockRecord) -> Result<Version, StorageError> {
        let (value, written) = self.seen.encode(record, 0);
        let version = self.create_value(key, value.into()).await?;
        self.seen.wrote(key, &version, written);
        Ok(version)
    }

    async fn update(
        &self,
        key: &str,
        expected: &Version,
        record: &LockRecord,
    ) -> Result<Version, StorageError> {
        let (value, written) = self.seen.encode(record, 0);
        let rev = revision(key, expected)?;
        match self.store.update(self.full(key), value.into(), rev).await {
            Ok(rev) => {
                let version = Version::from_u64(rev);
                self.seen.wrote(key, &version, written);
                Ok(version)
            }
            Err(e) if lost_expectation(&e) => Err(StorageError::conflict(key)),
            Err(e) => Err(StorageError::backend(NAME, "update", e)),
        }
    }

    async fn delete(&self, key: &str, expected: &Version) -> Result<(), StorageError> {
        let rev = revision(key, expected)?;
        match self
            .store
            .delete_expect_revision(self.full(key), Some(rev))
            .await
        {
            Ok(()) => {
                self.seen.forget(key);
                Ok(())
            }
            Err(e) if lost_expectation(&e) => Err(StorageError::conflict(key)),
            Err(e) => Err(StorageError::backend(NAME, "delete", e)),
        }
    }
}

/// Whether a write failed because the subject's last sequence was not the expected one (a
/// lost compare-and-set), and nothing else. A single server answers error 10071 ("wrong last
/// sequence: N"), which `async-nats` reports as `WrongLastRevision`; a clustered stream answers
/// 10164 ("wrong last sequence", checked when the write is proposed to the stream's Raft group),
/// which it reports as `Other`: both are the same lost race. Found by running the conformance
/// suite on an R3 bucket (`tests/nats.rs`, module `cluster`): racing writers got errors, not conflicts.
fn lost_expectation(e: &async_nats::jetstream::kv::UpdateError) -> bool {
    if e.kind() == UpdateErrorKind::WrongLastRevision {
        return true;
    }
    let mut source = std::error::Error::source(e);
    while let Some(err) = source {
        if let Some(js) = err.downcast_ref::<async_nats::jetstream::Error>() {
            return js.error_code()
                == async_nats::jetstream::ErrorCode::STREAM_WRONG_LAST_SEQUENCE_CONSTANT;
        }
        source = err.source();
    }
    false
}

/// One KV watch over the bucket, behind the storage's notification hub; every record it
/// carries becomes the storage's hint for its key ([`Primitives::known`]).
struct WatchSource {
    store: Store,
    prefix: Arc<str>,
    seen: Arc<Observations>,
}

#[async_trait]
impl NotificationSource for WatchSource {
    type Connection = kv::Watch;

    async fn connect(&self) -> Result<kv::Watch, StorageError> {
        // The watch's consumer exists when this returns: later writes are delivered.
        self.store.watch_all().await.map_err(err("watch"))
    }

    async fn next(&self, conn: &mut kv::Watch) -> SourceEvent {
        loop {
            match conn.next().await {
                Some(Ok(entry)) => {
                    // Keys of other users of the bucket (another prefix) wake nobody.
                    if let Some(name) = entry.key.strip_prefix(&*self.prefix).and_then(unescape_key)
                    {
                        match entry.operation {
                            kv::Operation::Put => self.seen.saw(
                                &name,
                                &Version::from_u64(entry.revision),
                                &entry.value,
                            ),
                            _ => self.seen.forget(&name),
                        }
                        return SourceEvent::Changed(name);
                    }
                }
                Some(Err(_)) | None => return SourceEvent::Disconnected,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::check_server_version;

    #[test]
    fn a_server_older_than_2_10_is_refused_by_name() {
        let e = check_server_version("2.9.10").unwrap_err().to_string();
        assert!(e.contains("nats-server 2.9.10 is too old"), "{e}");
        assert!(e.contains("2.10 or later"), "{e}");
        for ok in ["2.10.0", "2.14.6", "v2.11.0-beta.1", "3.0.0", "dev"] {
            assert!(check_server_version(ok).is_ok(), "{ok}");
        }
    }
}
