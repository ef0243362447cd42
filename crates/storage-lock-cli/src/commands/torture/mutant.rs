//! `--mutate`: the workers' storage broken on purpose, so that a run shows the tool can fail.
//!
//! A checker that never fails proves nothing. These wrappers sit between the workers' lock
//! engine and the real storage, expose only its compare-and-set primitives (so the engine's
//! default lock operations run on them) and break the contract the way real stores break it:
//! * **`forget`**: one update in two is acknowledged and never applied, as a store that loses
//!   acknowledged writes (a cache without persistence, a replica that answered before it
//!   replicated) does.
//! * **`non-atomic`**: compare-and-set done as check-then-write: an update reads the current
//!   version, compares it, thinks for a moment, then writes over whatever is there, as code
//!   that "locks" with a read and a write does.
//!
//! Either makes `torture` report violations within seconds (its tests assert that it does).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use storage_lock::backend::{
    Capabilities, HolderInfo, LockRecord, Page, PageRequest, Primitives, Storage, Stored,
    Timestamp, Version,
};
use storage_lock::{LockError, StorageError, StorageLock};

/// How `--mutate` breaks the storage (see the [module docs](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mutation {
    /// One update in two is acknowledged and not applied.
    Forget,
    /// Compare-and-set done as check-then-write.
    NonAtomic,
}

impl Mutation {
    /// The name `--mutate` takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::Forget => "forget",
            Self::NonAtomic => "non-atomic",
        }
    }
}

/// Parses `--mutate`: `forget` or `non-atomic`.
///
/// # Errors
/// Anything else, with the known mutations.
pub fn parse_mutation(s: &str) -> Result<Mutation, String> {
    match s {
        "forget" => Ok(Mutation::Forget),
        "non-atomic" => Ok(Mutation::NonAtomic),
        _ => Err(format!("unknown mutation {s:?} (forget or non-atomic)")),
    }
}

/// How long a non-atomic update thinks between its check and its write.
const THINK: Duration = Duration::from_millis(20);

#[derive(Debug)]
struct Mutant {
    inner: Arc<dyn Storage>,
    mutation: Mutation,
    updates: AtomicU64,
}

impl Mutant {
    fn inner(&self) -> Result<&dyn Primitives, StorageError> {
        self.inner
            .primitives()
            .ok_or_else(|| StorageError::Unsupported {
                backend: self.inner.name().to_owned(),
                operation: "compare-and-set primitives (--mutate)",
            })
    }
}

/// The workers' engine over `storage` broken as `mutation` says.
///
/// # Errors
/// The engine refuses the storage.
pub fn locks(storage: Arc<dyn Storage>, mutation: Mutation) -> Result<StorageLock, LockError> {
    let mutant: Arc<dyn Storage> = Arc::new(Mutant {
        inner: storage,
        mutation,
        updates: AtomicU64::new(0),
    });
    StorageLock::builder_arc(mutant)
        .holder(HolderInfo::this_process())
        .build()
}

#[async_trait]
impl Storage for Mutant {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities().with_change_notifications(false)
    }
    async fn now(&self) -> Result<Timestamp, StorageError> {
        self.inner.now().await
    }
    async fn get(&self, key: &str) -> Result<Option<Stored>, StorageError> {
        self.inner.get(key).await
    }
    async fn list(&self, prefix: &str, page: &PageRequest) -> Result<Page, StorageError> {
        self.inner.list(prefix, page).await
    }
    fn primitives(&self) -> Option<&dyn Primitives> {
        Some(self)
    }
}

#[async_trait]
impl Primitives for Mutant {
    async fn create(&self, key: &str, record: &LockRecord) -> Result<Version, StorageError> {
        self.inner()?.create(key, record).await
    }

    async fn update(
        &self,
        key: &str,
        expected: &Version,
        record: &LockRecord,
    ) -> Result<Version, StorageError> {
        let inner = self.inner()?;
        match self.mutation {
            Mutation::Forget => {
                if self.updates.fetch_add(1, Ordering::Relaxed) % 2 == 1 {
                    // Acknowledged, not applied: the version is still the expected one.
                    return Ok(expected.clone());
                }
                inner.update(key, expected, record).await
            }
            Mutation::NonAtomic => {
                // The check...
                match self.inner.get(key).await? {
                    Some(current) if current.version == *expected => {}
                    _ => return inner.update(key, expected, record).await,
                }
                tokio::time::sleep(THINK).await;
                // ...and, later, a write over whatever is there now.
                match self.inner.get(key).await? {
                    Some(now) => inner.update(key, &now.version, record).await,
                    None => inner.create(key, record).await,
                }
            }
        }
    }

    async fn delete(&self, key: &str, expected: &Version) -> Result<(), StorageError> {
        self.inner()?.delete(key, expected).await
    }
}
