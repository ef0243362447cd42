//! [`EtcdStorage`]: storage-lock on etcd v3, the replicated, linearizable store.
//!
//! * **Compare-and-set** is one `Txn` per write: `create_revision == 0` to create, `mod_revision
//!   == expected` to update or delete. The record's version is its `mod_revision`, so every
//!   write yields a version never seen before for that key, even after a delete. The `Txn`'s
//!   failure branch reads the key, so a refusal carries the record as etcd holds it
//!   ([`StorageError::with_current`]) and a contender that lost a race decides on it with no
//!   second request.
//! * **Lock operations** are the engine's defaults on these primitives: one compare-and-set
//!   `Txn` on the version of the record this storage last wrote or saw (its own writes, its
//!   reads, and every record the watch delivers; [`Primitives::known`]), so a holder's renewal
//!   and release, and a waiter's acquisition after the watch showed it the release, take one
//!   round trip; a record not known yet is read first (two). etcd compares bytes, not the
//!   times inside a record, so a lock operation on an unknown record cannot be decided on the
//!   server in one round trip.
//! * **A multi-lock** ([`Primitives::write_all`]) is one `Txn` over every key: a compare and a
//!   put per key, applied together or not at all, after a read of each key the storage does
//!   not know yet (up to [`MAX_TXN_OPS`] keys; more are taken one by one).
//! * **Waiting** is push-driven: each storage keeps one `watch` over its prefix (multiplexed
//!   over every waiting key, re-established after a failure); a waiter re-tries on the next
//!   change of its key, never by polling.
//! * **Release** writes a tombstone (the fencing token stays in the record); `sweep` deletes
//!   long-free records with a conditional delete after raising the fencing floor.
//!
//! # Time: observed, never a wall clock
//! etcd has no clock API, and its own leases count whole seconds (two at least) and delete the
//! key when they run out. So expiry is judged by observation ([`TimeSource::Observed`]; the
//! rule and its proof are in [`storage_lock_core::storage::observed`]): a record carries the
//! lease left when it was written, and a contender judges it expired once it has seen that
//! `mod_revision` unchanged for that long on its own monotonic clock. No client's wall clock
//! decides anything, so a client whose clock runs ahead (or an NTP step) cannot take a held
//! lock early. The cost: a contender that first reads a hold abandoned by a crashed holder
//! waits one more lease from that read. Fencing tokens never repeat: they live in the record,
//! which a release never deletes, and fresh keys start above the floor that a sweep raises
//! first.
//!
//! # What holds where
//! * **An etcd cluster (1, 3 or 5 members)**: every read and write here is linearizable
//!   (serializable reads are never used) and etcd fsyncs its log before it answers, so a
//!   granted lock survives a member crash or a restart of the whole cluster — safe.
//! * **Not safe**: `--unsafe-no-fsync`, or a cluster restored from a snapshot or backup taken
//!   before a grant (it forgets holds and fencing tokens, as any store rolled back would).
//!
//! # URL
//! `etcd://[user:password@]host:2379[,host2:2379…][?prefix=locks/&timeout=2s]` (see
//! [`EtcdStorageBuilder::from_url`]). TLS is not compiled in.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, KvClient, Txn, TxnOp,
    TxnOpResponse, WatchOptions, WatchStream,
};
use storage_lock_core::storage::observed::Observations;
use storage_lock_core::storage::url::UrlParts;
use storage_lock_core::{
    Capabilities, CasWrite, ChangeWait, Clock, LockRecord, MonotonicClock, NotificationSource,
    Notifications, Page, PageRequest, Primitives, SourceEvent, Storage, StorageError, Stored,
    TimeSource, Timestamp, Version,
};

const NAME: &str = "etcd";

/// The key prefix used unless configured otherwise.
pub const DEFAULT_PREFIX: &str = "storage-lock/";

/// Locks in etcd; see the [crate docs](crate).
#[derive(Clone)]
pub struct EtcdStorage {
    client: Client,
    prefix: Arc<str>,
    seen: Arc<Observations>,
    hub: Arc<Notifications<WatchSource>>,
}

impl fmt::Debug for EtcdStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdStorage")
            .field("prefix", &self.prefix)
            .field("seen", &self.seen)
            .finish_non_exhaustive()
    }
}

/// Configures and opens an [`EtcdStorage`] (`Debug` hides the password).
#[derive(Clone)]
#[must_use = "a builder does nothing until `open`"]
pub struct EtcdStorageBuilder {
    endpoints: Vec<String>,
    user: Option<(String, String)>,
    prefix: String,
    timeout: Duration,
    clock: Arc<dyn Clock>,
}

impl Default for EtcdStorageBuilder {
    fn default() -> Self {
        Self {
            endpoints: Vec::new(),
            user: None,
            prefix: DEFAULT_PREFIX.to_owned(),
            timeout: Duration::from_secs(2),
            clock: Arc::new(MonotonicClock),
        }
    }
}

impl fmt::Debug for EtcdStorageBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdStorageBuilder")
            .field("endpoints", &self.endpoints)
            .field("user", &self.user.as_ref().map(|(u, _)| u))
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("clock", &self.clock)
            .finish()
    }
}

fn invalid(reason: impl Into<String>) -> StorageError {
    StorageError::config(NAME, reason)
}

impl EtcdStorageBuilder {
    /// A builder with defaults: prefix `storage-lock/`, 2 s per request, observations timed on
    /// [`MonotonicClock`].
    pub fn new() -> Self {
        Self::default()
    }

    /// A builder from the URL in `STORAGE_LOCK_ETCD_URL`, if set.
    ///
    /// # Errors
    /// As [`Self::from_url`].
    pub fn from_env() -> Result<Self, StorageError> {
        match std::env::var("STORAGE_LOCK_ETCD_URL") {
            Ok(url) => Self::from_url(&url),
            Err(_) => Ok(Self::new()),
        }
    }

    /// A builder from `etcd://[user:password@]host:port[,host:port…][?prefix=P&timeout=T]`.
    /// `timeout` is a number with a unit (`500ms`, `2s`).
    ///
    /// # Errors
    /// [`StorageError::Config`] for another scheme, no endpoint, an unknown option or a bad
    /// value (the password is never shown).
    ///
    /// # Examples
    /// ```
    /// let b = storage_lock_etcd::EtcdStorageBuilder::from_url(
    ///     "etcd://127.0.0.1:2379,127.0.0.1:22379?prefix=app/locks/&timeout=500ms",
    /// )?;
    /// assert!(format!("{b:?}").contains("app/locks/"));
    /// assert!(storage_lock_etcd::EtcdStorageBuilder::from_url("etcd://h:1?tabel=x").is_err());
    /// # Ok::<(), storage_lock_core::StorageError>(())
    /// ```
    pub fn from_url(url: &str) -> Result<Self, StorageError> {
        let mut u = UrlParts::parse(url).map_err(invalid)?;
        if u.scheme != "etcd" || u.hosts.is_empty() || !u.path.is_empty() {
            return Err(invalid("expected etcd://host:port[,host:port…]"));
        }
        let mut b = Self::new();
        if let Some(user) = u.user.take() {
            b.user = Some((user, u.password.take().unwrap_or_default()));
        }
        b.endpoints = u.hosts.iter().map(|h| format!("http://{h}")).collect();
        if let Some(prefix) = u.take("prefix") {
            b.prefix = prefix;
        }
        if let Some(timeout) = u.take_duration("timeout").map_err(invalid)? {
            b.timeout = timeout;
        }
        u.finish(&["prefix", "timeout"]).map_err(invalid)?;
        Ok(b)
    }

    /// The cluster's client endpoints (`http://host:port`); requests go to any of them.
    pub fn endpoints<I: IntoIterator<Item = S>, S: Into<String>>(mut self, endpoints: I) -> Self {
        self.endpoints = endpoints.into_iter().map(Into::into).collect();
        self
    }

    /// etcd user and password (auth enabled on the cluster).
    pub fn user(mut self, name: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some((name.into(), password.into()));
        self
    }

    /// The prefix of every key this storage writes (and watches).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long one request may take before it fails (and a renewal counts as unconfirmed).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The clock this client times its observations on (default [`MonotonicClock`]; see the
    /// [crate docs](crate)): only its rate matters, and it must not step backwards.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Connects and checks that the cluster answers a linearizable read.
    ///
    /// # Errors
    /// [`StorageError::Config`] without endpoints; [`StorageError::Backend`] if the cluster
    /// cannot be reached within the timeout.
    ///
    /// # Examples
    /// With `STORAGE_LOCK_ETCD_URL` set (`tests/etcd.rs` runs the same lines against a real
    /// cluster):
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), storage_lock_core::StorageError> {
    /// use storage_lock_core::Storage;
    /// let storage = storage_lock_etcd::EtcdStorageBuilder::from_env()?
    ///     .prefix("doc-locks/")
    ///     .open()
    ///     .await?;
    /// assert!(storage.capabilities().linearizable_cas);
    /// # Ok(()) }
    /// ```
    pub async fn open(self) -> Result<EtcdStorage, StorageError> {
        if self.endpoints.is_empty() {
            return Err(invalid("no endpoint configured"));
        }
        let mut options = ConnectOptions::new()
            .with_timeout(self.timeout)
            .with_connect_timeout(self.timeout)
            .with_keep_alive(Duration::from_secs(2), self.timeout)
            .with_keep_alive_while_idle(true);
        if let Some((user, password)) = self.user {
            options = options.with_user(user, password);
        }
        let client = tokio::time::timeout(
            self.timeout,
            Client::connect(&self.endpoints, Some(options)),
        )
        .await
        .map_err(|_| StorageError::backend(NAME, "open", "connect timed out"))?
        .map_err(err("open"))?;
        let prefix: Arc<str> = self.prefix.into();
        let seen = Arc::new(Observations::with_clock(self.clock));
        let storage = EtcdStorage {
            hub: Arc::new(Notifications::new(WatchSource {
                client: client.clone(),
                prefix: prefix.clone(),
                seen: seen.clone(),
            })),
            client,
            prefix,
            seen,
        };
        // A linearizable read: the cluster has a leader and answers.
        storage
            .kv()
            .get(storage.full("\u{1f}open"), None)
            .await
            .map_err(err("open"))?;
        Ok(storage)
    }
}

impl EtcdStorage {
    /// A builder.
    pub fn builder() -> EtcdStorageBuilder {
        EtcdStorageBuilder::new()
    }

    fn kv(&self) -> KvClient {
        self.client.kv_client()
    }

    fn full(&self, key: &str) -> Vec<u8> {
        let mut k = Vec::with_capacity(self.prefix.len() + key.len());
        k.extend_from_slice(self.prefix.as_bytes());
        k.extend_from_slice(key.as_bytes());
        k
    }

    /// One `Txn`: if `compare`, do `op`; the new version is the revision the write made.
    async fn cas(
        &self,
        operation: &'static str,
        key: &str,
        compare: Compare,
        op: TxnOp,
        refused: fn(&str) -> StorageError,
    ) -> Result<Version, StorageError> {
        let read = TxnOp::get(self.full(key), None);
        let resp = self
            .kv()
            .txn(Txn::new().when([compare]).and_then([op]).or_else([read]))
            .await
            .map_err(err(operation))?;
        if !resp.succeeded() {
            let received = self.seen.now();
            // A record that does not decode is left to the retry's read to report: the
            // refusal stays a typed conflict.
            let found = match resp.op_responses().first() {
                Some(TxnOpResponse::Get(got)) => {
                    self.found(key, got.kvs(), received).ok().flatten()
                }
                _ => None,
            };
            return Err(match found {
                Some(current) => refused(key).with_current(current),
                None => refused(key),
            });
        }
        let revision = resp
            .header()
            .map(|h| h.revision())
            .ok_or_else(|| StorageError::backend(NAME, operation, "no header in the answer"))?;
        Ok(revision_version(revision))
    }

    /// The record of `key` in a read's answer (`kvs`, received at `received`), decoded with
    /// the observation rule; `None` (and `key` forgotten) when the key is absent.
    fn found(
        &self,
        key: &str,
        kvs: &[etcd_client::KeyValue],
        received: Timestamp,
    ) -> Result<Option<Stored>, StorageError> {
        let Some(kv) = kvs.first() else {
            self.seen.forget(key);
            return Ok(None);
        };
        let version = revision_version(kv.mod_revision());
        Ok(Some(Stored {
            record: self.seen.read(key, &version, kv.value(), received)?,
            version,
        }))
    }
}

fn revision_version(revision: i64) -> Version {
    Version::from_u64(u64::try_from(revision).unwrap_or(0))
}

/// The `mod_revision` a version stands for; 0 (which etcd compares equal for an absent key) and
/// versions of other backends never match.
fn expected_revision(key: &str, v: &Version) -> Result<i64, StorageError> {
    v.as_u64()
        .and_then(|n| i64::try_from(n).ok())
        .filter(|&n| n > 0)
        .ok_or_else(|| StorageError::conflict(key))
}

fn err(operation: &'static str) -> impl Fn(etcd_client::Error) -> StorageError {
    move |e| StorageError::backend(NAME, operation, e)
}

/// The smallest key greater than every key that starts with `prefix` (etcd's range end);
/// `[0]` (the whole keyspace onwards) if there is none.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

#[async_trait]
impl Storage for EtcdStorage {
    fn name(&self) -> &str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::linearizable()
            .with_conditional_delete(true)
            .with_change_notifications(true)
            .with_time_source(TimeSource::Observed)
            .with_round_trips(
                "1 / 1 / 1 when the record is known (the holder's renewal and release, its next \
                 acquisition, a waiter's acquisition after the watch showed it the release): one \
                 compare-and-set Txn; otherwise a read first (2); a fresh key's first \
                 acquisition also reads the fencing floor before and after its create (4)",
            )
    }

    async fn now(&self) -> Result<Timestamp, StorageError> {
        Ok(self.seen.now())
    }

    async fn get(&self, key: &str) -> Result<Option<Stored>, StorageError> {
        let resp = self
            .kv()
            .get(self.full(key), None)
            .await
            .map_err(err("get"))?;
        self.found(key, resp.kvs(), self.seen.now())
    }

    async fn list(&self, prefix: &str, page: &PageRequest) -> Result<Page, StorageError> {
        let mut from = self.full(prefix);
        let end = prefix_end(&from);
        if from.is_empty() {
            from.push(0); // etcd refuses an empty key; "\0" is the first key there is
        }
        let start = match &page.after {
            Some(after) => {
                let mut a = self.full(after);
                a.push(0);
                a.max(from)
            }
            None => from,
        };
        let limit = page.effective_limit();
        let options = GetOptions::new()
            .with_range(end)
            .with_limit(i64::try_from(limit + 1).unwrap_or(i64::MAX));
        let resp = self
            .kv()
            .get(start, Some(options))
            .await
            .map_err(err("list"))?;
        let received = self.seen.now();
        let mut rows = Vec::with_capacity(resp.kvs().len());
        for kv in resp.kvs() {
            let Some(key) = kv
                .key()
                .strip_prefix(self.prefix.as_bytes())
                .and_then(|k| std::str::from_utf8(k).ok())
            else {
                continue; // not a key this storage wrote
            };
            // A record that does not decode is reported with its key, not fatal to the page.
            let version = revision_version(kv.mod_revision());
            let row = match self.seen.read(key, &version, kv.value(), received) {
                Ok(record) => Ok(Stored { record, version }),
                Err(StorageError::Corrupt { reason, .. }) => Err(reason),
                Err(e) => return Err(e),
            };
            rows.push((key.to_owned(), row));
        }
        Ok(Page::from_sorted_results(rows, limit))
    }

    async fn wait_for_change(&self, key: &str) -> Result<ChangeWait, StorageError> {
        Ok(self.hub.arm(key).await)
    }

    fn primitives(&self) -> Option<&dyn Primitives> {
        Some(self)
    }
}

#[async_trait]
impl Primitives for EtcdStorage {
    fn known(&self, key: &str) -> Option<Stored> {
        self.seen.known(key)
    }

    async fn create(&self, key: &str, record: &LockRecord) -> Result<Version, StorageError> {
        let k = self.full(key);
        let (bytes, written) = self.seen.encode(record, 0);
        let put = TxnOp::put(k.clone(), bytes, None);
        let version = self
            .cas(
                "create",
                key,
                Compare::create_revision(k, CompareOp::Equal, 0),
                put,
                |key| StorageError::already_exists(key),
            )
            .await?;
        self.seen.wrote(key, &version, written);
        Ok(version)
    }

    async fn update(
        &self,
        key: &str,
        expected: &Version,
        record: &LockRecord,
    ) -> Result<Version, StorageError> {
        let rev = expected_revision(key, expected)?;
        let k = self.full(key);
        let (bytes, written) = self.seen.encode(record, 0);
        let put = TxnOp::put(k.clone(), bytes, None);
        let version = self
            .cas(
                "update",
                key,
                Compare::mod_revision(k, CompareOp::Equal, rev),
                put,
                |key| StorageError::conflict(key),
            )
            .await?;
        self.seen.wrote(key, &version, written);
        Ok(version)
    }

    async fn delete(&self, key: &str, expected: &Version) -> Result<(), StorageError> {
        let rev = expected_revision(key, expected)?;
        let k = self.full(key);
        let del = TxnOp::delete(k.clone(), None);
        self.cas(
            "delete",
            key,
            Compare::mod_revision(k, CompareOp::Equal, rev),
            del,
            |key| StorageError::conflict(key),
        )
        .await?;
        self.seen.forget(key);
        Ok(())
    }

    fn writes_all_at_once(&self) -> bool {
        true
    }

    /// One `Txn`: a compare per key (`create_revision == 0` to create, `mod_revision` to
    /// update), a put per key; every key gets the transaction's revision. More keys than an
    /// etcd server takes in one transaction by default ([`MAX_TXN_OPS`]) are
    /// [`StorageError::Unsupported`]: the caller takes them one by one.
    async fn write_all(&self, writes: &[CasWrite<'_>]) -> Result<Vec<Version>, StorageError> {
        let Some(first) = writes.first() else {
            return Ok(Vec::new());
        };
        if writes.len() > MAX_TXN_OPS {
            return Err(StorageError::Unsupported {
                backend: NAME.to_owned(),
                operation: "write_all of more keys than one transaction takes",
            });
        }
        let mut compares = Vec::with_capacity(writes.len());
        let mut puts = Vec::with_capacity(writes.len());
        let mut written = Vec::with_capacity(writes.len());
        for w in writes {
            let k = self.full(w.key);
            compares.push(match w.expected {
                None => Compare::create_revision(k.clone(), CompareOp::Equal, 0),
                Some(v) => {
                    Compare::mod_revision(k.clone(), CompareOp::Equal, expected_revision(w.key, v)?)
                }
            });
            let (bytes, wrote) = self.seen.encode(w.record, 0);
            puts.push(TxnOp::put(k, bytes, None));
            written.push(wrote);
        }
        let resp = self
            .kv()
            .txn(Txn::new().when(compares).and_then(puts))
            .await
            .map_err(err("write_all"))?;
        if !resp.succeeded() {
            return Err(StorageError::conflict(first.key));
        }
        let version = resp
            .header()
            .map(|h| revision_version(h.revision()))
            .ok_or_else(|| StorageError::backend(NAME, "write_all", "no header in the answer"))?;
        for (w, wrote) in writes.iter().zip(written) {
            self.seen.wrote(w.key, &version, wrote);
        }
        Ok(vec![version; writes.len()])
    }
}

/// The most operations an etcd server takes in one transaction unless configured otherwise
/// (`--max-txn-ops`).
pub const MAX_TXN_OPS: usize = 128;

/// One `watch` over the storage's prefix, behind its notification hub; every record it
/// carries becomes the storage's hint for its key ([`Primitives::known`]).
struct WatchSource {
    client: Client,
    prefix: Arc<str>,
    seen: Arc<Observations>,
}

/// A created watch and the keys of events not yet handed out.
struct Watching {
    stream: WatchStream,
    pending: VecDeque<SourceEvent>,
}

#[async_trait]
impl NotificationSource for WatchSource {
    type Connection = Watching;

    async fn connect(&self) -> Result<Watching, StorageError> {
        let mut stream = self
            .client
            .watch_client()
            .watch(
                self.prefix.as_bytes(),
                Some(WatchOptions::new().with_prefix()),
            )
            .await
            .map_err(err("watch"))?;
        // Listening only once etcd confirmed the watch: a change after this is delivered.
        match stream.message().await.map_err(err("watch"))? {
            Some(resp) if resp.created() && !resp.canceled() => Ok(Watching {
                stream,
                pending: VecDeque::new(),
            }),
            _ => Err(StorageError::backend(
                NAME,
                "watch",
                "the watch was not created",
            )),
        }
    }

    async fn next(&self, conn: &mut Watching) -> SourceEvent {
        loop {
            if let Some(event) = conn.pending.pop_front() {
                return event;
            }
            match conn.stream.message().await {
                Ok(Some(resp)) if resp.canceled() => return SourceEvent::Disconnected,
                Ok(Some(resp)) => {
                    for event in resp.events() {
                        let Some((key, kv)) = event.kv().and_then(|kv| {
                            let key = kv
                                .key()
                                .strip_prefix(self.prefix.as_bytes())
                                .and_then(|k| std::str::from_utf8(k).ok())?;
                            Some((key, kv))
                        }) else {
                            conn.pending.push_back(SourceEvent::MayHaveMissed);
                            continue;
                        };
                        match event.event_type() {
                            EventType::Put => {
                                self.seen
                                    .saw(key, &revision_version(kv.mod_revision()), kv.value())
                            }
                            EventType::Delete => self.seen.forget(key),
                        }
                        conn.pending.push_back(SourceEvent::Changed(key.to_owned()));
                    }
                }
                Ok(None) | Err(_) => return SourceEvent::Disconnected,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_is_the_next_key_after_the_range() {
        assert_eq!(prefix_end(b"ab"), b"ac");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
        assert_eq!(prefix_end(b""), vec![0]);
    }

    #[test]
    fn urls_are_checked_before_connecting() {
        let b = EtcdStorageBuilder::from_url("etcd://u:p%40ss@h1:1,h2:2/?prefix=x%2Fy&timeout=1s")
            .unwrap();
        assert_eq!(b.endpoints, ["http://h1:1", "http://h2:2"]);
        assert_eq!(b.prefix, "x/y");
        assert_eq!(b.timeout, Duration::from_secs(1));
        assert_eq!(b.user, Some(("u".into(), "p@ss".into())));
        assert!(!format!("{b:?}").contains("p@ss"));
        for bad in [
            "http://h:1",
            "etcd://",
            "etcd://h:1,,h:2",
            "etcd://h:1?timeout=0s",
            "etcd://h:1?timeout=5",
            "etcd://h:1/path",
            "etcd://h:1?x=1",
            "etcd://u:%zz@h:1",
        ] {
            assert!(EtcdStorageBuilder::from_url(bad).is_err(), "{bad}");
        }
    }
}
