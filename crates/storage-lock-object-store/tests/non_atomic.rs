//! The storage conformance suite's racing-writers cases catch an object store whose
//! conditional PUT is not atomic (it checks the precondition, then writes, as some S3
//! emulators do): a fault-injection wrapper over object_store's in-memory store, next to the
//! same cases passing on the atomic store itself.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::stream::BoxStream;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{
    CopyOptions, GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMode, PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};
use storage_lock_object_store::ObjectStoreStorage;
use storage_lock_testkit::conformance;

/// An `ObjectStore` impl for `$ty` with the given `put_opts`; every other method is forwarded
/// to the wrapped `InMemory` (`.0`): the fault wrappers below change conditional PUTs only.
macro_rules! object_store_with_put {
    ($ty:ty, $($put:tt)*) => {
        #[async_trait]
        impl ObjectStore for $ty {
        $($put)*

        async fn put_multipart_opts(
            &self,
            location: &Path,
            opts: PutMultipartOptions,
        ) -> Result<Box<dyn MultipartUpload>> {
            self.0.put_multipart_opts(location, opts).await
        }

        async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
            self.0.get_opts(location, options).await
        }

        fn delete_stream(
            &self,
            locations: BoxStream<'static, Result<Path>>,
        ) -> BoxStream<'static, Result<Path>> {
            self.0.delete_stream(locations)
        }

        fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
            self.0.list(prefix)
        }

        async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
            self.0.list_with_delimiter(prefix).await
        }

        async fn copy_opts(&self, from: &Path, to: &Path, options: CopyOptions) -> Result<()> {
            self.0.copy_opts(from, to, options).await
        }
        }
    };
}

/// Conditional PUTs in two steps — a HEAD that checks the precondition, a pause, then an
/// unconditional write — so that racing writers can all pass the check.
#[derive(Debug, Default)]
struct CheckThenWrite(InMemory);

impl fmt::Display for CheckThenWrite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CheckThenWrite({})", self.0)
    }
}

object_store_with_put!(
    CheckThenWrite,
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        let current = self
            .0
            .get_opts(location, GetOptions::default().with_head(true))
            .await;
        let path = location.to_string();
        match (&opts.mode, current) {
            (PutMode::Create, Ok(_)) => {
                return Err(object_store::Error::AlreadyExists {
                    path,
                    source: "exists".into(),
                });
            }
            (PutMode::Update(v), Ok(got)) if got.meta.e_tag != v.e_tag => {
                return Err(object_store::Error::Precondition {
                    path,
                    source: "etag".into(),
                });
            }
            (PutMode::Update(_), Err(_)) => {
                return Err(object_store::Error::Precondition {
                    path,
                    source: "missing".into(),
                });
            }
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        let overwrite = PutOptions {
            mode: PutMode::Overwrite,
            ..opts
        };
        self.0.put_opts(location, payload, overwrite).await
    }
);

/// Every conditional PUT is sent twice, as a client or proxy retrying after a lost answer
/// would: the first lands, the second fails its precondition against the first, and that
/// second answer is what the caller sees.
#[derive(Debug, Default)]
struct RetriedAfterLostAnswer(InMemory);

impl fmt::Display for RetriedAfterLostAnswer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RetriedAfterLostAnswer({})", self.0)
    }
}

object_store_with_put!(
    RetriedAfterLostAnswer,
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        let first = self
            .0
            .put_opts(location, payload.clone(), opts.clone())
            .await;
        match (first, &opts.mode) {
            (Ok(_), PutMode::Create | PutMode::Update(_)) => {
                self.0.put_opts(location, payload, opts).await
            }
            (other, _) => other,
        }
    }
);

/// A write that landed is never reported as a lost race because its retry lost against it:
/// the nonce identifies the stored object as this write's own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_write_that_landed_is_not_reported_as_lost() {
    use storage_lock_core::{LockRecord, OwnerId, Storage, Timestamp};
    let s = storage(RetriedAfterLostAnswer::default());
    let record = LockRecord {
        owner: OwnerId::from_u128(3),
        count: 1,
        fencing: 1,
        acquired_at: Timestamp::from_millis(1),
        expires_at: Timestamp::from_millis(2),
        holder: None,
    };
    let v1 = storage_lock_testkit::cas(&s)
        .create("k", &record)
        .await
        .expect("create landed");
    let v2 = storage_lock_testkit::cas(&s)
        .update("k", &v1, &record)
        .await
        .expect("update landed");
    assert_eq!(s.get("k").await.unwrap().unwrap().version, v2);
    // A real conflict is still one.
    assert!(
        storage_lock_testkit::cas(&s)
            .update("k", &v1, &record)
            .await
            .is_err()
    );
    assert!(
        storage_lock_testkit::cas(&s)
            .create("k", &record)
            .await
            .is_err()
    );
    // And the whole semantics of a lock hold on such a store.
    conformance::racing_creates_have_one_winner(storage(RetriedAfterLostAnswer::default())).await;
    conformance::racing_updates_have_one_winner(storage(RetriedAfterLostAnswer::default())).await;
}

/// Runs `case` on its own task; `true` if it failed (panicked).
async fn fails<F>(case: F) -> bool
where
    F: Future<Output = ()> + Send + 'static,
{
    tokio::spawn(case).await.is_err_and(|e| e.is_panic())
}

fn storage(store: impl ObjectStore) -> ObjectStoreStorage {
    ObjectStoreStorage::new(Arc::new(store), "locks")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_writers_case_catches_a_check_then_write_store() {
    let non_atomic = || storage(CheckThenWrite::default());
    assert!(
        fails(conformance::racing_creates_have_one_winner(non_atomic())).await,
        "racing creates on a check-then-write store must fail the case"
    );
    assert!(
        fails(conformance::racing_updates_have_one_winner(non_atomic())).await,
        "racing updates on a check-then-write store must fail the case"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_writers_case_passes_on_an_atomic_store() {
    conformance::racing_creates_have_one_winner(storage(InMemory::new())).await;
    conformance::racing_updates_have_one_winner(storage(InMemory::new())).await;
}
