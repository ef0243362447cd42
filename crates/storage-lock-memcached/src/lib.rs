//! [`MemcachedStorage`]: storage-lock on a memcached server — **volatile only**.
//!
//! Memcached keeps every item in memory. A restart forgets every held lock and every fencing
//! token (tokens start again from 1), and a server that runs out of memory evicts items, held
//! locks included, without a word. So this backend is the refused case that proves the
//! durability gate:
//! * `memcached://…` opens only with `durability=volatile` (otherwise
//!   [`StorageError::Config`]: the CLI's exit 78), and then reports [`Durability::Volatile`]:
//!   `storage-lock check` calls it unsafe;
//! * a server that evicts (started without `-M`) is refused whatever the URL says, as is one
//!   without CAS (`-C`): both checked at open with `stats settings`.
//!
//! Use it where losing every lock on a restart is acceptable (caches, best-effort
//! de-duplication), never to protect data.
//!
//! # How it works
//! * **Compare-and-set** with the meta protocol (memcached 1.6): create is `ms KEY N c ME`
//!   (add: `NS` if the key exists), update is `ms KEY N c C<cas>` (`EX` if another write came
//!   first), delete is `md KEY C<cas>`. The version is the item's CAS, which the server takes
//!   from one counter for every write, so on one running server a key's versions never repeat
//!   (after a restart the counter starts again, so a version a client remembers can match a
//!   new record: one more way a restart breaks exclusion). Items never expire (`T0` is the
//!   default); the lock's lease lives in the record.
//! * **Time: observed** ([`TimeSource::Observed`], proof in
//!   [`storage_lock_core::storage::observed`]): memcached's only clock is whole seconds in
//!   `stats`, so a contender judges a hold over once it has seen the same CAS for the lease left
//!   in it, on its own monotonic clock. No wall clock decides anything.
//! * **Keys**: `PREFIX` + the name escaped to `[A-Za-z0-9_-]` and `=XX` (as on S3 and NATS);
//!   a name whose escaped form does not fit memcached's 250 bytes becomes `PREFIX~` + its
//!   SHA-256. Every value starts with its lock's name (`LEN:NAME`), so a listing (through
//!   `lru_crawler metadump`) names every lock, hashed or not.
//! * **Connections**: four, used in turn, one request at a time each; one that fails or times
//!   out is dropped and reconnected at its next use (an answer lost that way is an error of
//!   unknown outcome, which the engine resolves by reading the record).
//! * **Waiting** backs off with jitter (memcached has no notifications).
//!
//! # URL
//! `memcached://host[:port][?prefix=P&timeout=2s&durability=volatile]` (default port 11211,
//! default prefix `storage-lock:`, at most 150 printable ASCII bytes).
//!
//! # Examples
//! ```no_run
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use storage_lock_core::{DistributedLock, StorageLock};
//! use storage_lock_memcached::MemcachedStorage;
//! let storage = MemcachedStorage::builder()
//!     .address("127.0.0.1:11211")
//!     .allow_volatile(true) // a restart forgets every lock: accepted
//!     .open()
//!     .await?;
//! let locks = StorageLock::new(storage)?;
//! let held = locks.try_acquire_for("nightly", std::time::Duration::ZERO).await?;
//! # Ok(()) }
//! ```

mod conn;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use sha2::{Digest, Sha256};
use storage_lock_core::storage::encoding::escape_key;
use storage_lock_core::storage::observed::Observations;
use storage_lock_core::storage::url::{UrlParts, allow_volatile};
use storage_lock_core::{
    Capabilities, Clock, Durability, LockRecord, MonotonicClock, Page, PageRequest, Primitives,
    Storage, StorageError, Stored, TimeSource, Timestamp, Version,
};
use tokio::sync::Mutex;

use conn::{Conn, Reply};

const NAME: &str = "memcached";
/// memcached's longest key.
const MAX_KEY: usize = 250;
/// The longest prefix: a hashed key (`~` and 64 hex digits) still fits.
const MAX_PREFIX: usize = 150;
/// Connections per storage.
const POOL: usize = 4;
/// The most items one listing scans (`metadump` lines).
const MAX_LISTED: usize = 1_000_000;
/// Why every memcached is refused without `durability=volatile`.
const FORGETS: &str = "memcached keeps every item in memory: a restart forgets every held \
                       lock and fencing token";

fn invalid(reason: impl Into<String>) -> StorageError {
    StorageError::config(NAME, reason.into())
}

/// Locks on one memcached server; see the [crate docs](crate). Cheap to clone (clones share
/// the connections and the observations).
#[derive(Clone)]
pub struct MemcachedStorage {
    inner: Arc<Inner>,
}

struct Inner {
    address: String,
    prefix: String,
    timeout: Duration,
    pool: Vec<Mutex<Option<Conn>>>,
    turn: AtomicUsize,
    seen: Observations,
    durability: Durability,
}

impl fmt::Debug for MemcachedStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemcachedStorage")
            .field("address", &self.inner.address)
            .field("prefix", &self.inner.prefix)
            .finish_non_exhaustive()
    }
}

impl MemcachedStorage {
    /// A builder (address, prefix, timeout, volatility, clock).
    pub fn builder() -> MemcachedStorageBuilder {
        MemcachedStorageBuilder::default()
    }

    /// `MemcachedStorageBuilder::from_url(url)?.open()`.
    ///
    /// # Errors
    /// As [`MemcachedStorageBuilder::from_url`] and [`MemcachedStorageBuilder::open`].
    pub async fn connect(url: &str) -> Result<Self, StorageError> {
        MemcachedStorageBuilder::from_url(url)?.open().await
    }

    /// The memcached key of a lock key (see the [crate docs](crate)).
    fn item(&self, key: &str) -> String {
        let prefix = &self.inner.prefix;
        let escaped = escape_key(key);
        if prefix.len() + escaped.len() <= MAX_KEY {
            format!("{prefix}{escaped}")
        } else {
            let digest = Sha256::digest(key.as_bytes());
            let mut item = format!("{prefix}~");
            for b in digest {
                item.push_str(&format!("{b:02x}"));
            }
            item
        }
    }

    /// One meta request on the next connection, within the timeout.
    ///
    /// # Cancel safety
    /// The connection is taken out of its slot for the request and put back only after a
    /// whole answer was read: a request whose future is dropped (or that fails, or times out)
    /// takes its connection with it, so no later request reads an earlier one's answer.
    async fn call(
        &self,
        operation: &'static str,
        line: &str,
        data: Option<&[u8]>,
    ) -> Result<Reply, StorageError> {
        let slot = self.inner.turn.fetch_add(1, Ordering::Relaxed) % POOL;
        let mut slot = self.inner.pool[slot].lock().await;
        let open = slot.take();
        let ask = async {
            let mut conn = match open {
                Some(conn) => conn,
                None => Conn::connect(&self.inner.address).await?,
            };
            let reply = conn.meta(line, data).await?;
            Ok::<_, std::io::Error>((conn, reply))
        };
        match tokio::time::timeout(self.inner.timeout, ask).await {
            Ok(Ok((conn, reply))) => {
                *slot = Some(conn);
                Ok(reply)
            }
            Ok(Err(e)) => Err(StorageError::backend(NAME, operation, e)),
            Err(_) => Err(StorageError::backend(
                NAME,
                operation,
                format!("no answer within {:?}", self.inner.timeout),
            )),
        }
    }

    /// A stored value: its lock key and the record, decoded with the observation rule.
    fn decode(
        &self,
        item: &str,
        cas: Option<u64>,
        data: &[u8],
    ) -> Result<(String, Stored), StorageError> {
        let corrupt = |reason: &str| StorageError::Corrupt {
            key: item.to_owned(),
            reason: reason.to_owned(),
        };
        let cas = cas.ok_or_else(|| corrupt("the server sent no CAS"))?;
        let (key, bytes) = split_value(data).ok_or_else(|| corrupt("no LEN:NAME header"))?;
        let version = Version::from_u64(cas);
        let record = self
            .inner
            .seen
            .read(&key, &version, bytes, self.inner.seen.now())?;
        Ok((key, Stored { record, version }))
    }

    /// `key`'s value: `LEN:KEY` then the encoded record (with a fresh nonce), and what the
    /// observations need to know of the write.
    fn encode(
        &self,
        key: &str,
        record: &LockRecord,
    ) -> (Vec<u8>, storage_lock_core::storage::observed::Written) {
        let (bytes, written) = self.inner.seen.encode(record, rand::random());
        let mut value = format!("{}:{key}", key.len()).into_bytes();
        value.extend_from_slice(&bytes);
        (value, written)
    }

    /// One meta set of `record` under `key` (`mode`: `ME` to add, `C<cas>` to compare first):
    /// the new version, or the answer that refused the write.
    async fn set(
        &self,
        operation: &'static str,
        key: &str,
        record: &LockRecord,
        mode: &str,
    ) -> Result<Result<Version, Reply>, StorageError> {
        let (value, written) = self.encode(key, record);
        let line = format!("ms {} {} c {mode}", self.item(key), value.len());
        match self.call(operation, &line, Some(&value)).await? {
            Reply::Done { cas: Some(cas) } => {
                let version = Version::from_u64(cas);
                self.inner.seen.wrote(key, &version, written);
                Ok(Ok(version))
            }
            refused => Ok(Err(refused)),
        }
    }

    /// Every item key under this storage's prefix that may hold a lock key starting with
    /// `wanted`, from `lru_crawler metadump all` on a connection of its own.
    async fn items(&self, wanted: &str) -> Result<Vec<String>, StorageError> {
        let escaped = format!("{}{}", self.inner.prefix, escape_key(wanted));
        let hashed = format!("{}~", self.inner.prefix);
        // One crawl at a time per server: a listing that finds another running waits its turn.
        let dump = async {
            let mut conn = Conn::connect(&self.inner.address).await?;
            loop {
                match conn.lines("lru_crawler metadump all", MAX_LISTED).await {
                    Err(e) if e.kind() == std::io::ErrorKind::ResourceBusy => {
                        let pause = rand::random_range(5..50);
                        tokio::time::sleep(Duration::from_millis(pause)).await;
                    }
                    done => return done,
                }
            }
        };
        let lines = tokio::time::timeout(self.inner.timeout * 4, dump)
            .await
            .map_err(|_| StorageError::backend(NAME, "list", "metadump took too long"))?
            .map_err(|e| StorageError::backend(NAME, "list", e))?;
        Ok(lines
            .iter()
            .filter_map(|line| line.split(' ').find_map(|w| w.strip_prefix("key=")))
            .filter_map(percent_decode)
            .filter(|item| item.starts_with(&escaped) || item.starts_with(&hashed))
            .collect())
    }
}

/// The CAS a version holds; a version no write of this storage made is a lost race.
fn cas_of(key: &str, expected: &Version) -> Result<u64, StorageError> {
    expected
        .as_u64()
        .filter(|&c| c != 0)
        .ok_or_else(|| StorageError::conflict(key))
}

/// `LEN:KEY` + rest → (KEY, rest).
fn split_value(data: &[u8]) -> Option<(String, &[u8])> {
    let colon = data.iter().take(5).position(|&b| b == b':')?;
    let len: usize = std::str::from_utf8(&data[..colon]).ok()?.parse().ok()?;
    let rest = data.get(colon + 1..)?;
    let key = std::str::from_utf8(rest.get(..len)?).ok()?.to_owned();
    Some((key, &rest[len..]))
}

/// `metadump`'s URL-encoded key.
fn percent_decode(s: &str) -> Option<String> {
    let mut out = Vec::with_capacity(s.len());
    let mut bytes = s.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let hex = [bytes.next()?, bytes.next()?];
            out.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
        } else {
            out.push(b);
        }
    }
    String::from_utf8(out).ok()
}

/// Configures a [`MemcachedStorage`]: from a URL or with setters, then [`Self::open`].
#[derive(Clone)]
#[must_use = "a builder does nothing until `open`"]
pub struct MemcachedStorageBuilder {
    address: String,
    prefix: String,
    timeout: Duration,
    allow_volatile: bool,
    clock: Arc<dyn Clock>,
}

impl Default for MemcachedStorageBuilder {
    fn default() -> Self {
        Self {
            address: "127.0.0.1:11211".to_owned(),
            prefix: "storage-lock:".to_owned(),
            timeout: Duration::from_secs(2),
            allow_volatile: false,
            clock: Arc::new(MonotonicClock),
        }
    }
}

impl fmt::Debug for MemcachedStorageBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemcachedStorageBuilder")
            .field("address", &self.address)
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("allow_volatile", &self.allow_volatile)
            .finish_non_exhaustive()
    }
}

impl MemcachedStorageBuilder {
    /// A builder from `memcached://host:port[?prefix=P&timeout=2s&durability=volatile]`.
    ///
    /// # Errors
    /// [`StorageError::Config`] for another scheme, not exactly one `host:port`, a user or a
    /// path, an unknown option or a bad value; nothing is contacted.
    ///
    /// # Examples
    /// ```
    /// use storage_lock_memcached::MemcachedStorageBuilder;
    /// let b = MemcachedStorageBuilder::from_url("memcached://127.0.0.1:11211?prefix=app:")?;
    /// assert!(format!("{b:?}").contains("app:"));
    /// assert!(MemcachedStorageBuilder::from_url("memcached://a:1,b:2").is_err());
    /// # Ok::<(), storage_lock_core::StorageError>(())
    /// ```
    pub fn from_url(url: &str) -> Result<Self, StorageError> {
        let mut u = UrlParts::parse(url).map_err(invalid)?;
        let address = match u.hosts.as_slice() {
            [host] if u.scheme == "memcached" && u.user.is_none() && u.path.is_empty() => {
                // memcached's own port when the URL leaves it out.
                if host.contains(':') && !host.ends_with(']') {
                    host.clone()
                } else {
                    format!("{host}:11211")
                }
            }
            _ => return Err(invalid("expected memcached://host:port")),
        };
        let mut b = Self::new().address(address);
        if let Some(prefix) = u.take("prefix") {
            b.prefix = prefix;
        }
        if let Some(timeout) = u.take_duration("timeout").map_err(invalid)? {
            b.timeout = timeout;
        }
        if let Some(v) = u.take("durability") {
            b.allow_volatile = allow_volatile(&v).map_err(invalid)?;
        }
        u.finish(&[]).map_err(invalid)?;
        b.check_prefix()?;
        Ok(b)
    }

    /// The defaults: `127.0.0.1:11211`, prefix `storage-lock:`, timeout 2 s, volatility not
    /// accepted.
    pub fn new() -> Self {
        Self::default()
    }

    /// The server, `host:port`.
    pub fn address(mut self, address: impl Into<String>) -> Self {
        self.address = address.into();
        self
    }

    /// What every item key of this storage starts with (printable ASCII, at most 150 bytes).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long one request may take (connecting included) before it fails.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Accepts that a restart of the server forgets every lock and fencing token
    /// (`durability=volatile`); without it, [`Self::open`] refuses every memcached.
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

    fn check_prefix(&self) -> Result<(), StorageError> {
        if self.prefix.len() > MAX_PREFIX || !self.prefix.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(invalid(format!(
                "prefix must be printable ASCII without spaces, at most {MAX_PREFIX} bytes"
            )));
        }
        Ok(())
    }

    /// Refuses the storage unless volatility is accepted, then connects and checks the
    /// server's settings (`stats settings`): no evictions (`-M`), CAS on.
    ///
    /// # Errors
    /// [`StorageError::Config`] without [`Self::allow_volatile`] (before any I/O), for a bad
    /// prefix, a server that evicts or has CAS off; [`StorageError::Backend`] if it cannot be
    /// reached or answers unlike memcached 1.6.
    pub async fn open(self) -> Result<MemcachedStorage, StorageError> {
        self.check_prefix()?;
        let durability = Durability::judge(NAME, Some(FORGETS.to_owned()), self.allow_volatile)?;
        let settings = async {
            let mut conn = Conn::connect(&self.address).await?;
            let lines = conn.lines("stats settings", 1000).await?;
            // The meta protocol's no-op: memcached before 1.6 answers ERROR.
            conn.meta("mn", None).await?;
            Ok::<_, std::io::Error>((conn, lines))
        };
        let (conn, lines) = tokio::time::timeout(self.timeout, settings)
            .await
            .map_err(|_| {
                StorageError::backend(NAME, "open", format!("no answer within {:?}", self.timeout))
            })?
            .map_err(|e| StorageError::backend(NAME, "open", e))?;
        let setting = |name: &str| {
            lines.iter().find_map(|l| {
                l.strip_prefix("STAT ")
                    .and_then(|l| l.strip_prefix(name))
                    .and_then(|v| v.strip_prefix(' '))
                    .map(str::to_owned)
            })
        };
        if setting("evictions").as_deref() != Some("off") {
            return Err(invalid(
                "the server evicts items under memory pressure, held locks included: start it \
                 with -M (it then refuses writes when full)",
            ));
        }
        if setting("cas_enabled").as_deref() != Some("yes") {
            return Err(invalid(
                "the server runs without CAS (-C): it cannot compare-and-set",
            ));
        }
        let mut pool: Vec<Mutex<Option<Conn>>> = (1..POOL).map(|_| Mutex::new(None)).collect();
        pool.push(Mutex::new(Some(conn)));
        Ok(MemcachedStorage {
            inner: Arc::new(Inner {
                address: self.address,
                prefix: self.prefix,
                timeout: self.timeout,
                pool,
                turn: AtomicUsize::new(0),
                seen: Observations::with_clock(self.clock),
                durability,
            }),
        })
    }
}

#[async_trait]
impl Storage for MemcachedStorage {
    fn name(&self) -> &str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::linearizable()
            .with_conditional_delete(true)
            .with_time_source(TimeSource::Observed)
            .with_durability(self.inner.durability)
            .with_round_trips(
                "1 / 1 / 1 when the record is known (the holder's renewal and release, its next \
                 acquisition): one CAS-checked meta set; otherwise a get first (2); a fresh \
                 key's first acquisition also reads the fencing floor before and after its \
                 create (4)",
            )
    }

    async fn now(&self) -> Result<Timestamp, StorageError> {
        Ok(self.inner.seen.now())
    }

    async fn get(&self, key: &str) -> Result<Option<Stored>, StorageError> {
        let item = self.item(key);
        match self.call("get", &format!("mg {item} v c"), None).await? {
            Reply::Miss => {
                self.inner.seen.forget(key);
                Ok(None)
            }
            Reply::Value { cas, data } => {
                let (stored_key, stored) = self.decode(&item, cas, &data)?;
                if stored_key != key {
                    return Err(StorageError::Corrupt {
                        key: key.to_owned(),
                        reason: "the item names another lock".to_owned(),
                    });
                }
                Ok(Some(stored))
            }
            other => Err(StorageError::backend(NAME, "get", format!("{other:?}"))),
        }
    }

    async fn list(&self, prefix: &str, page: &PageRequest) -> Result<Page, StorageError> {
        use futures_util::StreamExt;

        let items = self.items(prefix).await?;
        let reads = futures_util::stream::iter(items)
            .map(|item| async move {
                let got = self.call("list", &format!("mg {item} v c"), None).await;
                (item, got)
            })
            .buffer_unordered(POOL);
        let answers: Vec<_> = reads.collect().await;
        let mut rows = Vec::new();
        for (item, got) in answers {
            match got? {
                Reply::Miss => {} // released and swept since the dump
                Reply::Value { cas, data } => match self.decode(&item, cas, &data) {
                    Ok((key, stored)) => rows.push((key, Ok(stored))),
                    Err(StorageError::Corrupt { reason, .. }) => rows.push((item, Err(reason))),
                    Err(e) => return Err(e),
                },
                other => return Err(StorageError::backend(NAME, "list", format!("{other:?}"))),
            }
        }
        Ok(Page::from_unsorted_results(rows, prefix, page))
    }

    fn primitives(&self) -> Option<&dyn Primitives> {
        Some(self)
    }
}

#[async_trait]
impl Primitives for MemcachedStorage {
    fn known(&self, key: &str) -> Option<Stored> {
        self.inner.seen.known(key)
    }

    async fn create(&self, key: &str, record: &LockRecord) -> Result<Version, StorageError> {
        match self.set("create", key, record, "ME").await? {
            Ok(version) => Ok(version),
            Err(Reply::NotStored) => Err(StorageError::already_exists(key)),
            Err(other) => Err(StorageError::backend(NAME, "create", format!("{other:?}"))),
        }
    }

    async fn update(
        &self,
        key: &str,
        expected: &Version,
        record: &LockRecord,
    ) -> Result<Version, StorageError> {
        let cas = cas_of(key, expected)?;
        match self.set("update", key, record, &format!("C{cas}")).await? {
            Ok(version) => Ok(version),
            Err(Reply::Exists | Reply::NotFound) => Err(StorageError::conflict(key)),
            Err(other) => Err(StorageError::backend(NAME, "update", format!("{other:?}"))),
        }
    }

    async fn delete(&self, key: &str, expected: &Version) -> Result<(), StorageError> {
        let cas = cas_of(key, expected)?;
        match self
            .call("delete", &format!("md {} C{cas}", self.item(key)), None)
            .await?
        {
            Reply::Done { .. } => {
                self.inner.seen.forget(key);
                Ok(())
            }
            Reply::Exists | Reply::NotFound => Err(StorageError::conflict(key)),
            other => Err(StorageError::backend(NAME, "delete", format!("{other:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_carry_their_key() {
        let value = b"5:a/b:crecord";
        let (key, rest) = split_value(value).unwrap();
        assert_eq!((key.as_str(), rest), ("a/b:c", &b"record"[..]));
        for bad in [&b""[..], b"x:abc", b"9:abc", b"123456:a", b":abc"] {
            assert!(split_value(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn urls_are_checked_before_connecting() {
        let ok = MemcachedStorageBuilder::from_url(
            "memcached://127.0.0.1:11311?prefix=p:&timeout=1s&durability=volatile",
        )
        .unwrap();
        assert!(ok.allow_volatile);
        assert_eq!(ok.timeout, Duration::from_secs(1));
        let default_port = MemcachedStorageBuilder::from_url("memcached://cache").unwrap();
        assert_eq!(default_port.address, "cache:11211");
        for bad in [
            "redis://h:1",
            "memcached://a:1,b:2",
            "memcached://u@h:1",
            "memcached://h:1/path",
            "memcached://h:1?bucket=x",
            "memcached://h:1?durability=sometimes",
            "memcached://h:1?prefix=has%20space",
            "memcached://h:1?timeout=soon",
        ] {
            let e = MemcachedStorageBuilder::from_url(bad).unwrap_err();
            assert!(matches!(e, StorageError::Config { .. }), "{bad}: {e:?}");
        }
    }

    /// Long names get a hashed item key within memcached's 250 bytes; short ones stay readable.
    #[test]
    fn item_keys_fit_memcached() {
        let storage = MemcachedStorage {
            inner: Arc::new(Inner {
                address: String::new(),
                prefix: "p:".to_owned(),
                timeout: Duration::from_secs(1),
                pool: Vec::new(),
                turn: AtomicUsize::new(0),
                seen: Observations::new(),
                durability: Durability::Volatile,
            }),
        };
        assert_eq!(storage.item("deploy/prod"), "p:deploy=2Fprod");
        let long = "/".repeat(255);
        let item = storage.item(&long);
        assert!(
            item.starts_with("p:~") && item.len() == 2 + 1 + 64,
            "{item}"
        );
        assert_ne!(storage.item(&long), storage.item(&"/".repeat(254)));
    }

    /// No server needed: the refusal comes before any I/O.
    #[tokio::test]
    async fn every_memcached_is_refused_unless_volatility_is_accepted() {
        let e = MemcachedStorageBuilder::from_url("memcached://127.0.0.1:1")
            .unwrap()
            .open()
            .await
            .unwrap_err();
        assert!(
            matches!(&e, StorageError::Config { reason, .. } if reason.contains("restart forgets")),
            "{e:?}"
        );
    }
}
