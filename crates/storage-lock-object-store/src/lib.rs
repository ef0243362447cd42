//! [`ObjectStoreStorage`]: storage-lock on object storage — Amazon S3 and S3-compatible stores,
//! Google Cloud Storage and Azure Blob Storage — through one implementation over
//! [`object_store`].
//!
//! * **Compare-and-set** is a conditional PUT: [`PutMode::Create`] (`If-None-Match: *`) to
//!   create, [`PutMode::Update`] (`If-Match: <ETag>`) to update. The version is the ETag.
//! * **A nonce in every write.** ETags are content hashes: two writes of equal bytes would get
//!   the same ETag, and a compare-and-set against the first could then succeed after the second.
//!   Every record this storage writes carries a fresh random nonce, so no two writes of a key
//!   share an ETag.
//! * **No conditional delete** exists in these APIs, so release writes a tombstone (as it does
//!   everywhere), and `sweep` is not supported ([`Capabilities::conditional_delete`] is false):
//!   a swept key could not keep its fencing token safely. Records of released locks stay; they
//!   are a few hundred bytes each.
//! * **Lock operations** are the engine's defaults: one conditional PUT on the ETag of the
//!   record this storage last wrote or read ([`Primitives::known`]), so a holder's renewal and
//!   release take one request; a record not known yet is read first (a GET, two requests).
//! * **Waiting** backs off with jitter: object stores deliver no change notifications that a
//!   client could wait on.
//! * **A lost race is checked before it is reported.** A conditional PUT retried after a lost
//!   answer (by the store's client, or a proxy) fails its own precondition; so a failed
//!   precondition is reported as a conflict only after a GET shows that the object is not the
//!   one this write tried to store (its nonce makes it unique). Stores opened from a URL also
//!   retry nothing: a failed request is an error of unknown outcome, which the engine resolves
//!   by reading the record.
//!
//! # Time: observed, never a wall clock
//! The object store APIs have no clock a client can read (a `Date` header has whole seconds and
//! `object_store` does not pass it on), so expiry is judged by observation
//! ([`TimeSource::Observed`]; the rule and its proof are in
//! [`storage_lock_core::storage::observed`]): a record carries the lease left when it was
//! written, and a contender judges it expired once it has seen that ETag unchanged for that long
//! on its own monotonic clock (the nonce makes every write's ETag new). No client's wall clock
//! decides anything, so a client whose clock runs ahead (or an NTP step) cannot take a held lock
//! early. The cost: a contender that first reads a hold abandoned by a crashed holder waits one
//! more lease from that read. Fencing tokens never repeat (they live in the record, which
//! release never deletes).
//!
//! # What holds where
//! * **Amazon S3** (conditional writes since 2024; strongly consistent reads), **Google Cloud
//!   Storage** (generation preconditions), **Azure Blob Storage** (ETag preconditions):
//!   linearizable per object and durable before they answer — **safe**.
//! * **S3-compatible stores**: safe only if a conditional PUT is *atomic* — of two racing
//!   writers with the same precondition exactly one may win. Some emulators check the
//!   precondition and write in two steps (the storage conformance suite's racing-writers case
//!   catches that); test yours with the suite before you trust it.
//! * **Not safe**: a bucket replicated to another region and failed over to (replication is
//!   asynchronous), or any store without conditional PUT (object_store refuses
//!   [`PutMode::Create`]/[`PutMode::Update`] there, so the storage fails instead of locking).
//!
//! # URLs
//! * **`s3://BUCKET[/PREFIX][?endpoint=http://host:port&region=R&timeout=2s]`** (feature
//!   `aws`): credentials and other settings come from the environment as in
//!   [`object_store::aws::AmazonS3Builder::from_env`] (`AWS_ACCESS_KEY_ID`,
//!   `AWS_SECRET_ACCESS_KEY`, …), never from the URL.
//! * **`azure://CONTAINER[/PREFIX][?account=A&endpoint=URL&emulator=true&timeout=2s]`** (feature
//!   `azure`): the account, its key and other settings come from the environment as in
//!   `MicrosoftAzureBuilder::from_env` (`AZURE_STORAGE_ACCOUNT_NAME`,
//!   `AZURE_STORAGE_ACCOUNT_KEY`, …); `account` in the URL names the account, never a key.
//!   `emulator=true` is **Azurite**: its published development account and key, and the
//!   `endpoint` (default `http://127.0.0.1:10000`) with the account as the URL's first path
//!   segment, as Azurite wants.
//!
//! For GCS, or a store configured beyond these options, build the store with `object_store` and
//! pass it to [`ObjectStoreStorage::new`].
//!
//! # Durability: Azurite
//! Amazon S3, GCS and Azure acknowledge a write once it is durable ([`Durability::Durable`]).
//! **Azurite**, Azure's emulator, is no safe lock store in either of its modes:
//! * by default it keeps blob metadata in memory and saves it every 5 s, so a SIGKILL or a crash
//!   forgets up to 5 s of acknowledged writes — held locks and fencing tokens (its conditional
//!   PUTs are atomic there: the conformance suite's racing-writers cases pass);
//! * with `AZURITE_DB` (metadata in a SQL database) it keeps what it acknowledged, but two
//!   racing `If-None-Match: *` creates can both succeed (seen here on MariaDB: the racing cases
//!   fail).
//!
//! So an `emulator=true` URL is refused ([`StorageError::Config`], the CLI's exit 78) unless it
//! says `durability=volatile`, and then opens as [`Durability::Volatile`]: fine for tests and
//! development, where a restart may break exclusion and fencing.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use futures_util::TryStreamExt;
use object_store::path::Path;
use object_store::{GetOptions, ObjectStore, PutMode, PutOptions, PutPayload, UpdateVersion};
use storage_lock_core::storage::encoding::{escape_key, unescape_key};
use storage_lock_core::storage::observed::Observations;
use storage_lock_core::{
    Capabilities, Clock, Durability, LockRecord, Page, PageRequest, Primitives, Storage,
    StorageError, Stored, TimeSource, Timestamp, Version,
};

const NAME: &str = "object-store";

/// Locks in an object store; see the [crate docs](crate).
#[derive(Clone)]
pub struct ObjectStoreStorage {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    seen: Arc<Observations>,
    durability: Durability,
}

impl fmt::Debug for ObjectStoreStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObjectStoreStorage")
            .field("store", &self.store.to_string())
            .field("prefix", &self.prefix.as_ref())
            .finish_non_exhaustive()
    }
}

impl ObjectStoreStorage {
    /// Locks under `prefix` in `store`, observations timed on [`MonotonicClock`](storage_lock_core::MonotonicClock).
    ///
    /// Prefer a store that does not retry requests (`RetryConfig { max_retries: 0, .. }`), so
    /// that an outage surfaces within one request timeout; retries are safe either way (see the
    /// [crate docs](crate)). The store must support conditional PUT ([`PutMode::Create`] and
    /// [`PutMode::Update`]): object_store's in-memory store does (within one process, handy in
    /// tests), its local-file store does not support updates.
    ///
    /// # Examples
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::sync::Arc;
    /// use storage_lock_core::{DistributedLock, StorageLock};
    /// use storage_lock_object_store::ObjectStoreStorage;
    /// let store = Arc::new(object_store::memory::InMemory::new());
    /// let locks = StorageLock::new(ObjectStoreStorage::new(store, "locks"))?;
    /// let held = locks.try_acquire_for("nightly", std::time::Duration::ZERO).await?.expect("free");
    /// held.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn new(store: Arc<dyn ObjectStore>, prefix: impl Into<Path>) -> Self {
        Self {
            store,
            prefix: prefix.into(),
            seen: Arc::new(Observations::new()),
            durability: Durability::Durable,
        }
    }

    /// The same storage timing its observations on `clock` (see the [crate docs](crate)): only
    /// its rate matters, and it must not step backwards.
    #[must_use]
    pub fn with_clock(mut self, clock: impl Clock) -> Self {
        self.seen = Arc::new(Observations::with_clock(clock));
        self
    }

    /// `ObjectStoreStorageBuilder::from_url(url)?.build()`: opens an `s3://` or `azure://` URL
    /// (see the [crate docs](crate#urls) and [`ObjectStoreStorageBuilder::from_url`]).
    ///
    /// # Errors
    /// As [`ObjectStoreStorageBuilder::from_url`].
    ///
    /// # Examples
    /// ```
    /// use storage_lock_object_store::ObjectStoreStorage;
    /// let s = ObjectStoreStorage::from_url("s3://my-bucket/locks?region=eu-west-1")?;
    /// assert!(format!("{s:?}").contains("locks"));
    /// assert!(ObjectStoreStorage::from_url("s3://b?secret=x").is_err());
    /// # Ok::<(), storage_lock_core::StorageError>(())
    /// ```
    #[cfg(any(feature = "aws", feature = "azure"))]
    pub fn from_url(url: &str) -> Result<Self, StorageError> {
        ObjectStoreStorageBuilder::from_url(url)?.build()
    }

    /// The store this storage writes through (the one given to [`Self::new`] or built from a
    /// URL): for a baseline measured on the same client, or for objects of your own. Writing
    /// under this storage's prefix breaks its locks.
    ///
    /// # Examples
    /// ```
    /// use std::sync::Arc;
    /// use storage_lock_object_store::ObjectStoreStorage;
    /// let store = Arc::new(object_store::memory::InMemory::new());
    /// let storage = ObjectStoreStorage::new(store.clone(), "locks");
    /// assert_eq!(storage.object_store().to_string(), store.to_string());
    /// ```
    pub fn object_store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    /// A builder: from a URL, the environment, or any `object_store` store.
    pub fn builder() -> ObjectStoreStorageBuilder {
        ObjectStoreStorageBuilder::default()
    }

    fn path(&self, key: &str) -> Path {
        self.prefix.clone().join(escape_key(key))
    }

    /// One conditional PUT of `record` (with a fresh nonce).
    async fn put(
        &self,
        key: &str,
        record: &LockRecord,
        mode: PutMode,
    ) -> Result<Version, object_store::Error> {
        let (bytes, written) = self.seen.encode(record, rand::random());
        let version = self.put_bytes(key, bytes, mode).await?;
        self.seen.wrote(key, &version, written);
        Ok(version)
    }

    async fn put_bytes(
        &self,
        key: &str,
        bytes: Vec<u8>,
        mode: PutMode,
    ) -> Result<Version, object_store::Error> {
        let opts = PutOptions {
            mode,
            ..PutOptions::default()
        };
        let path = self.path(key);
        let err = match self
            .store
            .put_opts(&path, PutPayload::from(bytes.clone()), opts)
            .await
        {
            Ok(put) => return Ok(version_of(put.e_tag, put.version)),
            Err(e) => e,
        };
        if !matches!(
            err,
            object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. }
        ) {
            return Err(err);
        }
        // Lost the race — or won it on an attempt whose answer was lost and lost against
        // ourselves on a retry. The nonce tells: only this write stored these bytes.
        match self.store.get_opts(&path, GetOptions::default()).await {
            Ok(got) => {
                let version = version_of(got.meta.e_tag.clone(), got.meta.version.clone());
                match got.bytes().await {
                    Ok(stored) if stored.as_ref() == bytes.as_slice() => Ok(version),
                    Ok(_) => Err(err),
                    Err(e) => Err(e),
                }
            }
            Err(object_store::Error::NotFound { .. }) => Err(err),
            Err(e) => Err(e),
        }
    }
}

/// Configures an [`ObjectStoreStorage`], the way the other backends' builders do: from a URL
/// (`from_url`, on the core's one URL vocabulary), from the environment (`from_env`), or from
/// any `object_store` store (`store`), then `with_*`-style setters and `build` (or `open`, which
/// contacts nothing either: the first request is the first lock operation).
#[derive(Clone, Default)]
#[must_use = "a builder does nothing until `build` or `open`"]
pub struct ObjectStoreStorageBuilder {
    store: Option<Arc<dyn ObjectStore>>,
    prefix: Path,
    clock: Option<Arc<dyn Clock>>,
    /// Why the store can forget acknowledged writes (an Azurite URL), judged at `build`.
    forgets: Option<&'static str>,
    allow_volatile: bool,
}

impl fmt::Debug for ObjectStoreStorageBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObjectStoreStorageBuilder")
            .field("store", &self.store.as_ref().map(|s| s.to_string()))
            .field("prefix", &self.prefix.as_ref())
            .finish_non_exhaustive()
    }
}

impl ObjectStoreStorageBuilder {
    /// A builder with no store yet (set one with [`Self::store`]), no prefix, observations timed
    /// on [`MonotonicClock`](storage_lock_core::MonotonicClock).
    pub fn new() -> Self {
        Self::default()
    }

    /// A builder from an `s3://` or `azure://` URL (see the [crate docs](crate#urls)), with
    /// credentials and other settings from the environment. An `http://` endpoint is allowed as
    /// given (an emulator or a store on a private network). Requests are not retried (an outage
    /// surfaces within one `timeout`, default 2 s). `durability=volatile|unverified` is accepted
    /// as on every backend; an Azurite URL needs `durability=volatile` (see the
    /// [crate docs](crate#durability-azurite)).
    ///
    /// # Errors
    /// [`StorageError::Config`] for a scheme this build lacks (features `aws`, `azure`), a
    /// missing bucket or container, an unknown option, what the store's client rejects, or an
    /// Azurite URL without `durability=volatile`; nothing is contacted.
    ///
    /// # Examples
    /// ```
    /// use storage_lock_object_store::ObjectStoreStorageBuilder;
    /// let b = ObjectStoreStorageBuilder::from_url("s3://my-bucket/locks?timeout=5s")?;
    /// assert!(format!("{b:?}").contains("locks"));
    /// # Ok::<(), storage_lock_core::StorageError>(())
    /// ```
    #[cfg(any(feature = "aws", feature = "azure"))]
    pub fn from_url(url: &str) -> Result<Self, StorageError> {
        use storage_lock_core::storage::url::{UrlParts, allow_volatile};

        let invalid = |reason: String| StorageError::config(NAME, reason);
        let mut u = UrlParts::parse(url).map_err(invalid)?;
        let timeout = u
            .take_duration("timeout")
            .map_err(invalid)?
            .unwrap_or(std::time::Duration::from_secs(2));
        let durability = u.take("durability");
        let allow_volatile = durability
            .as_deref()
            .map(allow_volatile)
            .transpose()
            .map_err(invalid)?
            .unwrap_or(false);
        let (store, forgets): (Arc<dyn ObjectStore>, Option<&'static str>) = match u.scheme.as_str()
        {
            #[cfg(feature = "aws")]
            "s3" => (url_stores::s3(&mut u, timeout)?, None),
            #[cfg(feature = "azure")]
            "azure" => {
                let (store, emulator) = url_stores::azure(&mut u, timeout)?;
                (store, emulator.then_some(AZURITE_FORGETS))
            }
            other => {
                return Err(invalid(format!(
                    "unknown scheme {other:?} (this build opens {})",
                    url_stores::SCHEMES.join(", ")
                )));
            }
        };
        let prefix = std::mem::take(&mut u.path);
        u.finish(&[]).map_err(invalid)?;
        let mut builder = Self::new()
            .store(store)
            .prefix(Path::from(prefix))
            .allow_volatile(allow_volatile);
        builder.forgets = forgets;
        Ok(builder)
    }

    /// A builder from the URL in `STORAGE_LOCK_S3_URL` (feature `aws`) or, when that is unset,
    /// `STORAGE_LOCK_AZURE_URL` (feature `azure`); see [`Self::from_url`].
    ///
    /// # Errors
    /// [`StorageError::Config`] if no such variable is set or its URL is invalid.
    #[cfg(any(feature = "aws", feature = "azure"))]
    pub fn from_env() -> Result<Self, StorageError> {
        let vars = [
            #[cfg(feature = "aws")]
            "STORAGE_LOCK_S3_URL",
            #[cfg(feature = "azure")]
            "STORAGE_LOCK_AZURE_URL",
        ];
        let url = vars
            .iter()
            .find_map(|var| std::env::var(var).ok())
            .ok_or_else(|| {
                StorageError::config(NAME, format!("{} is not set", vars.join(" or ")))
            })?;
        Self::from_url(&url)
    }

    /// The store (its conditional PUT must be atomic: see [`ObjectStoreStorage::new`]).
    pub fn store(mut self, store: Arc<dyn ObjectStore>) -> Self {
        self.store = Some(store);
        self
    }

    /// Where under the store the lock records live.
    pub fn prefix(mut self, prefix: impl Into<Path>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The clock this client times its observations on (default [`MonotonicClock`](storage_lock_core::MonotonicClock); see the
    /// [crate docs](crate)): only its rate matters, and it must not step backwards.
    pub fn clock(mut self, clock: impl Clock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Accepts a store that can forget acknowledged writes (an Azurite URL; `durability=volatile`
    /// in a URL): the storage then opens as [`Durability::Volatile`] instead of being refused.
    pub fn allow_volatile(mut self, yes: bool) -> Self {
        self.allow_volatile = yes;
        self
    }

    /// The storage.
    ///
    /// # Errors
    /// [`StorageError::Config`] if no store was set, or for a store known to forget
    /// acknowledged writes (an Azurite URL) unless [`Self::allow_volatile`].
    pub fn build(self) -> Result<ObjectStoreStorage, StorageError> {
        let store = self
            .store
            .ok_or_else(|| StorageError::config(NAME, "no object store configured"))?;
        let durability =
            Durability::judge(NAME, self.forgets.map(str::to_owned), self.allow_volatile)?;
        Ok(ObjectStoreStorage {
            store,
            prefix: self.prefix,
            seen: Arc::new(match self.clock {
                Some(clock) => Observations::with_clock(clock),
                None => Observations::new(),
            }),
            durability,
        })
    }

    /// [`Self::build`], for the same call shape as the other backends' builders (nothing is
    /// contacted).
    ///
    /// # Errors
    /// As [`Self::build`].
    pub async fn open(self) -> Result<ObjectStoreStorage, StorageError> {
        self.build()
    }
}

/// Why an Azurite URL is refused without `durability=volatile` (see the crate docs).
#[cfg(feature = "azure")]
const AZURITE_FORGETS: &str = "Azurite keeps blob metadata in memory between saves every 5 s \
                               (and with AZURITE_DB, its conditional PUTs are not atomic)";

/// The stores a URL names, one function per scheme (`from_url` keeps the options every scheme
/// shares).
#[cfg(any(feature = "aws", feature = "azure"))]
mod url_stores {
    use std::sync::Arc;
    use std::time::Duration;

    use object_store::{ClientOptions, ObjectStore, RetryConfig};
    use storage_lock_core::StorageError;
    use storage_lock_core::storage::url::UrlParts;

    use super::NAME;

    /// The schemes this build opens.
    pub(super) const SCHEMES: &[&str] = &[
        #[cfg(feature = "aws")]
        "s3",
        #[cfg(feature = "azure")]
        "azure",
    ];

    fn invalid(reason: impl Into<String>) -> StorageError {
        StorageError::config(NAME, reason.into())
    }

    /// No retries (an outage surfaces within one `timeout`; see the crate docs) and `timeout`
    /// for connecting and for each request.
    fn client(timeout: Duration) -> (RetryConfig, ClientOptions) {
        let retry = RetryConfig {
            max_retries: 0,
            ..RetryConfig::default()
        };
        let options = ClientOptions::new()
            .with_timeout(timeout)
            .with_connect_timeout(timeout);
        (retry, options)
    }

    /// The one host of `scheme://HOST[/…]`: a bucket or a container.
    fn only_host(u: &UrlParts, what: &str) -> Result<String, StorageError> {
        match u.hosts.as_slice() {
            [host] if u.user.is_none() => Ok(host.clone()),
            _ => Err(invalid(format!("expected {}://{what}[/PREFIX]", u.scheme))),
        }
    }

    /// `s3://BUCKET[/PREFIX][?endpoint=URL&region=R]`.
    #[cfg(feature = "aws")]
    pub(super) fn s3(
        u: &mut UrlParts,
        timeout: Duration,
    ) -> Result<Arc<dyn ObjectStore>, StorageError> {
        use object_store::aws::AmazonS3Builder;

        let (retry, options) = client(timeout);
        let mut builder = AmazonS3Builder::from_env()
            .with_bucket_name(only_host(u, "BUCKET")?)
            .with_retry(retry)
            .with_client_options(options);
        if let Some(endpoint) = u.take("endpoint") {
            builder = builder
                .with_allow_http(endpoint.starts_with("http://"))
                .with_endpoint(endpoint);
        }
        if let Some(region) = u.take("region") {
            builder = builder.with_region(region);
        }
        let store = builder.build().map_err(|e| invalid(e.to_string()))?;
        Ok(Arc::new(store))
    }

    /// Azurite's development account and its key, both published in Azurite's documentation
    /// (every Azurite has them): not a secret.
    #[cfg(feature = "azure")]
    const AZURITE_ACCOUNT: &str = "devstoreaccount1";
    #[cfg(feature = "azure")]
    const AZURITE_KEY: &str =
        "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

    /// `azure://CONTAINER[/PREFIX][?account=A&endpoint=URL&emulator=true]`, and whether it is
    /// the emulator.
    #[cfg(feature = "azure")]
    pub(super) fn azure(
        u: &mut UrlParts,
        timeout: Duration,
    ) -> Result<(Arc<dyn ObjectStore>, bool), StorageError> {
        use object_store::azure::MicrosoftAzureBuilder;

        let (retry, options) = client(timeout);
        let mut builder = MicrosoftAzureBuilder::from_env()
            .with_container_name(only_host(u, "CONTAINER")?)
            .with_retry(retry)
            .with_client_options(options);
        let emulator = match u.take("emulator").as_deref() {
            None | Some("false") => false,
            Some("true") => true,
            Some(other) => {
                return Err(invalid(format!(
                    "emulator must be true or false, not {other:?}"
                )));
            }
        };
        let account = u.take("account");
        let endpoint = u.take("endpoint");
        if emulator {
            // Azurite serves path-style URLs: the account is the first path segment (what
            // object_store's own emulator mode does, on an endpoint from the URL rather than
            // from a process-wide variable).
            // An account of the emulator's own (`AZURITE_ACCOUNTS`) brings its key in the
            // environment, as a real account's does.
            if account.is_none() {
                builder = builder.with_access_key(AZURITE_KEY);
            }
            let account = account.unwrap_or_else(|| AZURITE_ACCOUNT.to_owned());
            let endpoint = endpoint.unwrap_or_else(|| "http://127.0.0.1:10000".to_owned());
            builder = builder
                .with_allow_http(endpoint.starts_with("http://"))
                .with_endpoint(format!("{}/{account}", endpoint.trim_end_matches('/')))
                .with_account(account);
        } else {
            if let Some(account) = account {
                builder = builder.with_account(account);
            }
            if let Some(endpoint) = endpoint {
                builder = builder
                    .with_allow_http(endpoint.starts_with("http://"))
                    .with_endpoint(endpoint);
            }
        }
        let store = builder.build().map_err(|e| invalid(e.to_string()))?;
        Ok((Arc::new(store), emulator))
    }
}

/// The version: the ETag (and the object version, where the store keeps versions).
fn version_of(e_tag: Option<String>, version: Option<String>) -> Version {
    match version {
        Some(v) => Version::from_text(format!("{}\n{v}", e_tag.unwrap_or_default())),
        None => Version::from_text(e_tag.unwrap_or_default()),
    }
}

fn update_version(v: &Version) -> Option<UpdateVersion> {
    let text = v.as_text()?;
    let (e_tag, version) = match text.split_once('\n') {
        Some((e, v)) => (e, Some(v.to_owned())),
        None => (text, None),
    };
    Some(UpdateVersion {
        e_tag: (!e_tag.is_empty()).then(|| e_tag.to_owned()),
        version,
    })
}

fn err(operation: &'static str) -> impl Fn(object_store::Error) -> StorageError {
    move |e| StorageError::backend(NAME, operation, e)
}

#[async_trait]
impl Storage for ObjectStoreStorage {
    fn name(&self) -> &str {
        NAME
    }

    fn capabilities(&self) -> Capabilities {
        let caps = Capabilities::linearizable()
            .with_time_source(TimeSource::Observed)
            .with_round_trips(
                "1 / 1 / 1 when the record is known (the holder's renewal and release, its next \
                 acquisition of the key): one conditional PUT; otherwise a GET first (2); a fresh \
                 key's first acquisition also GETs the fencing floor before and after its create \
                 (4)",
            );
        caps.with_durability(self.durability)
    }

    async fn now(&self) -> Result<Timestamp, StorageError> {
        Ok(self.seen.now())
    }

    async fn get(&self, key: &str) -> Result<Option<Stored>, StorageError> {
        let got = match self
            .store
            .get_opts(&self.path(key), GetOptions::default())
            .await
        {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => {
                self.seen.forget(key);
                return Ok(None);
            }
            Err(e) => return Err(err("get")(e)),
        };
        let version = version_of(got.meta.e_tag.clone(), got.meta.version.clone());
        let bytes = got.bytes().await.map_err(err("get"))?;
        let record = self.seen.read(key, &version, &bytes, self.seen.now())?;
        Ok(Some(Stored { record, version }))
    }

    async fn list(&self, prefix: &str, page: &PageRequest) -> Result<Page, StorageError> {
        let wanted = escape_key(prefix);
        let dir = self.prefix.clone();
        let names: Vec<String> = self
            .store
            .list(Some(&dir))
            .try_filter_map(|meta| {
                let name = meta
                    .location
                    .prefix_match(&dir)
                    .and_then(|mut parts| {
                        let first = parts.next()?;
                        parts.next().is_none().then(|| first.as_ref().to_owned())
                    })
                    .filter(|escaped| escaped.starts_with(&wanted))
                    .and_then(|escaped| unescape_key(&escaped))
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

    fn primitives(&self) -> Option<&dyn Primitives> {
        Some(self)
    }
}

#[async_trait]
impl Primitives for ObjectStoreStorage {
    fn known(&self, key: &str) -> Option<Stored> {
        self.seen.known(key)
    }

    async fn create(&self, key: &str, record: &LockRecord) -> Result<Version, StorageError> {
        match self.put(key, record, PutMode::Create).await {
            Ok(v) => Ok(v),
            // Some stores answer a failed If-None-Match with 412 rather than 409.
            Err(
                object_store::Error::AlreadyExists { .. }
                | object_store::Error::Precondition { .. },
            ) => Err(StorageError::already_exists(key)),
            Err(e) => Err(err("create")(e)),
        }
    }

    async fn update(
        &self,
        key: &str,
        expected: &Version,
        record: &LockRecord,
    ) -> Result<Version, StorageError> {
        let conflict = || StorageError::conflict(key);
        let Some(expected) = update_version(expected) else {
            return Err(conflict());
        };
        match self.put(key, record, PutMode::Update(expected)).await {
            Ok(v) => Ok(v),
            Err(
                object_store::Error::Precondition { .. } | object_store::Error::NotFound { .. },
            ) => Err(conflict()),
            Err(e) => Err(err("update")(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_round_trip_with_and_without_object_versions() {
        for (e, v) in [
            (Some("\"abc\""), None),
            (Some("\"abc\""), Some("v1")),
            (None, Some("v2")),
        ] {
            let version = version_of(e.map(str::to_owned), v.map(str::to_owned));
            let u = update_version(&version).unwrap();
            assert_eq!(u.e_tag.as_deref(), e);
            assert_eq!(u.version.as_deref(), v);
        }
        assert!(update_version(&Version::from_u64(1)).is_none());
    }

    /// Azurite forgets or races (crate docs): refused unless the URL accepts volatility; the
    /// service itself is durable; nothing is contacted either way.
    #[cfg(feature = "azure")]
    #[test]
    fn azure_urls_refuse_the_emulator_unless_volatility_is_accepted() {
        let caps = |url: &str| ObjectStoreStorage::from_url(url).map(|s| s.capabilities());
        let emulator = "azure://c/locks?endpoint=http://127.0.0.1:10000&emulator=true";
        let refused = caps(emulator).unwrap_err();
        assert!(
            matches!(&refused, StorageError::Config { reason, .. } if reason.contains("Azurite")),
            "{refused:?}"
        );
        let unverified = format!("{emulator}&durability=unverified");
        assert!(
            caps(&unverified).is_err(),
            "unverified is no acceptance of a known loss"
        );
        let volatile = caps(&format!("{emulator}&durability=volatile")).unwrap();
        assert_eq!(volatile.durability, Durability::Volatile);
        let service = caps("azure://c?account=acct&durability=volatile").unwrap();
        assert_eq!(service.durability, Durability::Durable);
        for bad in [
            "azure://c?emulator=yes",
            "azure://?emulator=true&durability=volatile",
            "azure://c?emulator=true&durability=volatile&key=secret",
            "azure://c?emulator=true&durability=sometimes",
        ] {
            let e = caps(bad).unwrap_err();
            assert!(matches!(e, StorageError::Config { .. }), "{bad}: {e:?}");
            assert!(!e.to_string().contains("secret"), "{bad}: {e}");
        }
    }
}
