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
//! # URL (feature `aws`)
//! `s3://BUCKET[/PREFIX][?endpoint=http://host:port&region=R&timeout=2s]`; credentials and other
//! settings come from the environment as in [`object_store::aws::AmazonS3Builder::from_env`]
//! (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, …), never from the URL. For GCS and Azure,
//! build the store with `object_store` and pass it to [`ObjectStoreStorage::new`].

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use futures_util::TryStreamExt;
use object_store::path::Path;
use object_store::{GetOptions, ObjectStore, PutMode, PutOptions, PutPayload, UpdateVersion};
use storage_lock_core::storage::encoding::{escape_key, unescape_key};
use storage_lock_core::storage::observed::Observations;
use storage_lock_core::{
    Capabilities, Clock, LockRecord, Page, PageRequest, Primitives, Storage, StorageError, Stored,
    TimeSource, Timestamp, Version,
};

const NAME: &str = "object-store";

/// Locks in an object store; see the [crate docs](crate).
#[derive(Clone)]
pub struct ObjectStoreStorage {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    seen: Arc<Observations>,
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
        }
    }

    /// The same storage timing its observations on `clock` (see the [crate docs](crate)): only
    /// its rate matters, and it must not step backwards.
    #[must_use]
    pub fn with_clock(mut self, clock: impl Clock) -> Self {
        self.seen = Arc::new(Observations::with_clock(clock));
        self
    }

    /// `ObjectStoreStorageBuilder::from_url(url)?.build()`: opens
    /// `s3://BUCKET[/PREFIX][?endpoint=URL&region=R&timeout=T]`; see
    /// [`ObjectStoreStorageBuilder::from_url`].
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
    #[cfg(feature = "aws")]
    pub fn from_url(url: &str) -> Result<Self, StorageError> {
        ObjectStoreStorageBuilder::from_url(url)?.build()
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

    /// A builder from `s3://BUCKET[/PREFIX][?endpoint=URL&region=R&timeout=T]`, with credentials
    /// and other settings from the environment. An `http://` endpoint is allowed as given (an
    /// emulator or a store on a private network). Requests are not retried (an outage surfaces
    /// within one `timeout`, default 2 s).
    ///
    /// # Errors
    /// [`StorageError::Config`] for another scheme, a missing bucket, an unknown option or what
    /// the S3 client rejects; nothing is contacted.
    ///
    /// # Examples
    /// ```
    /// use storage_lock_object_store::ObjectStoreStorageBuilder;
    /// let b = ObjectStoreStorageBuilder::from_url("s3://my-bucket/locks?timeout=5s")?;
    /// assert!(format!("{b:?}").contains("locks"));
    /// # Ok::<(), storage_lock_core::StorageError>(())
    /// ```
    #[cfg(feature = "aws")]
    pub fn from_url(url: &str) -> Result<Self, StorageError> {
        use std::time::Duration;

        use object_store::aws::AmazonS3Builder;
        use object_store::{ClientOptions, RetryConfig};
        use storage_lock_core::storage::url::UrlParts;

        let invalid = |reason: String| StorageError::config(NAME, reason);
        let mut u = UrlParts::parse(url).map_err(invalid)?;
        let bucket = match (u.scheme.as_str(), u.hosts.as_slice()) {
            ("s3", [bucket]) if u.user.is_none() => bucket.clone(),
            _ => return Err(invalid("expected s3://BUCKET[/PREFIX]".into())),
        };
        let timeout = u
            .take_duration("timeout")
            .map_err(invalid)?
            .unwrap_or(Duration::from_secs(2));
        let mut builder = AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .with_retry(RetryConfig {
                max_retries: 0,
                ..RetryConfig::default()
            })
            .with_client_options(
                ClientOptions::new()
                    .with_timeout(timeout)
                    .with_connect_timeout(timeout),
            );
        if let Some(endpoint) = u.take("endpoint") {
            builder = builder
                .with_allow_http(endpoint.starts_with("http://"))
                .with_endpoint(endpoint);
        }
        if let Some(region) = u.take("region") {
            builder = builder.with_region(region);
        }
        let prefix = std::mem::take(&mut u.path);
        u.finish(&["endpoint", "region", "timeout"])
            .map_err(invalid)?;
        let store = builder.build().map_err(|e| invalid(e.to_string()))?;
        Ok(Self::new()
            .store(Arc::new(store))
            .prefix(Path::from(prefix)))
    }

    /// A builder from `STORAGE_LOCK_S3_URL` (see [`Self::from_url`]).
    ///
    /// # Errors
    /// [`StorageError::Config`] if the variable is unset or its URL is invalid.
    #[cfg(feature = "aws")]
    pub fn from_env() -> Result<Self, StorageError> {
        let url = std::env::var("STORAGE_LOCK_S3_URL")
            .map_err(|_| StorageError::config(NAME, "STORAGE_LOCK_S3_URL is not set"))?;
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

    /// The storage.
    ///
    /// # Errors
    /// [`StorageError::Config`] if no store was set.
    pub fn build(self) -> Result<ObjectStoreStorage, StorageError> {
        let store = self
            .store
            .ok_or_else(|| StorageError::config(NAME, "no object store configured"))?;
        Ok(ObjectStoreStorage {
            store,
            prefix: self.prefix,
            seen: Arc::new(match self.clock {
                Some(clock) => Observations::with_clock(clock),
                None => Observations::new(),
            }),
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
        Capabilities::linearizable()
            .with_time_source(TimeSource::Observed)
            .with_round_trips(
                "1 / 1 / 1 when the record is known (the holder's renewal and release, its next \
                 acquisition of the key): one conditional PUT; otherwise a GET first (2); a fresh \
                 key's first acquisition also GETs the fencing floor before and after its create \
                 (4)",
            )
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
            ) => Err(StorageError::AlreadyExists {
                key: key.to_owned(),
            }),
            Err(e) => Err(err("create")(e)),
        }
    }

    async fn update(
        &self,
        key: &str,
        expected: &Version,
        record: &LockRecord,
    ) -> Result<Version, StorageError> {
        let conflict = || StorageError::Conflict {
            key: key.to_owned(),
        };
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
}
