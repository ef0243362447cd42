//! Wrappers for tests: fault injection and call counting on top of a real storage, and a view
//! that hides a backend's lock-operation overrides so the default implementations run.
//!
//! These are the only "mocks" storage-lock uses: the data always lives in a real storage.

use std::io;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;

use crate::storage::primitives_of;
use crate::storage::{
    AcquireAnyOutcome, AcquireManyOutcome, AcquireOutcome, AcquireRequest, Capabilities, CasWrite,
    ChangeWait, LockRecord, OwnerId, Page, PageRequest, Primitives, ReleaseOutcome, RenewOutcome,
    RenewRequest, Storage, StorageError, Stored, Timestamp, Version,
};

/// One kind of [`Storage`] call, for [`FaultyStorage::calls`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Op {
    Now,
    Get,
    Create,
    Update,
    Delete,
    WriteAll,
    List,
    AcquireOnce,
    AcquireMany,
    AcquireAny,
    Renew,
    RenewMany,
    Release,
    WaitForChange,
}

const OPS: usize = 14;

/// A storage that counts calls and fails or slows them on demand.
#[derive(Debug)]
pub struct FaultyStorage<S> {
    inner: S,
    calls: [AtomicUsize; OPS],
    outage: AtomicBool,
    fail_renewals: AtomicBool,
    delay_micros: AtomicU64,
    lost_answers: AtomicUsize,
    /// (shortest lease, delay) of `set_slow_renew_answers`.
    slow_renew_answers: Mutex<Option<(Duration, Duration)>>,
    capabilities: Mutex<Option<Capabilities>>,
}

impl<S: Storage> FaultyStorage<S> {
    /// Wraps `inner`; no faults until switched on.
    pub fn new(inner: S) -> Self {
        Self {
            inner,
            calls: Default::default(),
            outage: AtomicBool::new(false),
            fail_renewals: AtomicBool::new(false),
            delay_micros: AtomicU64::new(0),
            lost_answers: AtomicUsize::new(0),
            slow_renew_answers: Mutex::new(None),
            capabilities: Mutex::new(None),
        }
    }

    /// Declares `caps` instead of the wrapped storage's capabilities (to test the capability
    /// gate); `None` restores them.
    pub fn set_capabilities(&self, caps: Option<Capabilities>) {
        *self.capabilities.lock().unwrap_or_else(|e| e.into_inner()) = caps;
    }

    /// The wrapped storage.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// While on, every call fails with a backend error (the storage is "unreachable").
    pub fn set_outage(&self, on: bool) {
        self.outage.store(on, Ordering::SeqCst);
    }

    /// While on, `renew` and `renew_many` fail with a backend error.
    pub fn set_fail_renewals(&self, on: bool) {
        self.fail_renewals.store(on, Ordering::SeqCst);
    }

    /// The next `n` `acquire_once` calls are applied by the wrapped storage, but their answers are
    /// "lost": the caller gets a backend error (a connection that broke after the request left).
    pub fn lose_next_acquire_answers(&self, n: usize) {
        self.lost_answers.store(n, Ordering::SeqCst);
    }

    /// Answers to `renew` calls for a lease of at least `min_lease` arrive `delay` late: the
    /// wrapped storage has applied them, the caller hears of it later (answers that overtake
    /// each other). `None` switches it off.
    pub fn set_slow_renew_answers(&self, slow: Option<(Duration, Duration)>) {
        *self
            .slow_renew_answers
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = slow;
    }

    /// Sleeps this long before every call (zero: yields once instead), widening race windows.
    pub fn set_delay(&self, delay: Duration) {
        self.delay_micros.store(
            u64::try_from(delay.as_micros()).unwrap_or(u64::MAX),
            Ordering::SeqCst,
        );
    }

    /// Calls of `op` so far.
    pub fn calls(&self, op: Op) -> usize {
        self.calls[op as usize].load(Ordering::SeqCst)
    }

    /// Calls of any kind so far.
    pub fn total_calls(&self) -> usize {
        self.calls.iter().map(|c| c.load(Ordering::SeqCst)).sum()
    }

    async fn enter(&self, op: Op) -> Result<(), StorageError> {
        self.calls[op as usize].fetch_add(1, Ordering::SeqCst);
        match self.delay_micros.load(Ordering::SeqCst) {
            0 => tokio::task::yield_now().await,
            us => tokio::time::sleep(Duration::from_micros(us)).await,
        }
        let injected = self.outage.load(Ordering::SeqCst)
            || (matches!(op, Op::Renew | Op::RenewMany)
                && self.fail_renewals.load(Ordering::SeqCst));
        if injected {
            return Err(StorageError::backend(
                self.inner.name(),
                "injected fault",
                io::Error::new(io::ErrorKind::ConnectionRefused, "injected outage"),
            ));
        }
        Ok(())
    }
}

// Every method wrapped: one left out would bypass the counting and the faults.
#[deny(clippy::missing_trait_methods)]
#[async_trait]
impl<S: Storage> Storage for FaultyStorage<S> {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn capabilities(&self) -> Capabilities {
        self.capabilities
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .unwrap_or_else(|| self.inner.capabilities())
    }
    async fn now(&self) -> Result<Timestamp, StorageError> {
        self.enter(Op::Now).await?;
        self.inner.now().await
    }
    async fn get(&self, key: &str) -> Result<Option<Stored>, StorageError> {
        self.enter(Op::Get).await?;
        self.inner.get(key).await
    }
    async fn list(&self, prefix: &str, page: &PageRequest) -> Result<Page, StorageError> {
        self.enter(Op::List).await?;
        self.inner.list(prefix, page).await
    }
    async fn acquire_once(
        &self,
        key: &str,
        req: &AcquireRequest,
    ) -> Result<AcquireOutcome, StorageError> {
        self.enter(Op::AcquireOnce).await?;
        let outcome = self.inner.acquire_once(key, req).await;
        let lose = self
            .lost_answers
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if lose {
            return Err(StorageError::backend(
                self.inner.name(),
                "injected fault",
                io::Error::new(io::ErrorKind::ConnectionReset, "answer lost"),
            ));
        }
        outcome
    }
    async fn acquire_many(
        &self,
        keys: &[&str],
        req: &AcquireRequest,
    ) -> Result<AcquireManyOutcome, StorageError> {
        self.enter(Op::AcquireMany).await?;
        self.inner.acquire_many(keys, req).await
    }
    async fn acquire_any(
        &self,
        keys: &[&str],
        need: usize,
        gate: Option<&str>,
        req: &AcquireRequest,
    ) -> Result<AcquireAnyOutcome, StorageError> {
        self.enter(Op::AcquireAny).await?;
        self.inner.acquire_any(keys, need, gate, req).await
    }
    async fn renew(
        &self,
        key: &str,
        owner: OwnerId,
        lease: Duration,
    ) -> Result<RenewOutcome, StorageError> {
        self.enter(Op::Renew).await?;
        let outcome = self.inner.renew(key, owner, lease).await;
        let slow = *self
            .slow_renew_answers
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some((min_lease, delay)) = slow
            && lease >= min_lease
        {
            tokio::time::sleep(delay).await;
        }
        outcome
    }
    async fn renew_many(
        &self,
        renewals: &[RenewRequest<'_>],
    ) -> Result<Vec<Result<RenewOutcome, StorageError>>, StorageError> {
        self.enter(Op::RenewMany).await?;
        self.inner.renew_many(renewals).await
    }
    async fn release(&self, key: &str, owner: OwnerId) -> Result<ReleaseOutcome, StorageError> {
        self.enter(Op::Release).await?;
        self.inner.release(key, owner).await
    }
    async fn wait_for_change(&self, key: &str) -> Result<ChangeWait, StorageError> {
        self.enter(Op::WaitForChange).await?;
        self.inner.wait_for_change(key).await
    }
    fn delegated_admin(&self) -> Option<&dyn crate::storage::DelegatedAdmin> {
        self.inner.delegated_admin()
    }

    fn primitives(&self) -> Option<&dyn Primitives> {
        // Only what the wrapped storage has.
        self.inner.primitives().map(|_| self as &dyn Primitives)
    }
}

#[async_trait]
impl<S: Storage> Primitives for FaultyStorage<S> {
    async fn create(&self, key: &str, record: &LockRecord) -> Result<Version, StorageError> {
        self.enter(Op::Create).await?;
        primitives_of(&self.inner, "create")?
            .create(key, record)
            .await
    }

    async fn update(
        &self,
        key: &str,
        expected: &Version,
        record: &LockRecord,
    ) -> Result<Version, StorageError> {
        self.enter(Op::Update).await?;
        primitives_of(&self.inner, "update")?
            .update(key, expected, record)
            .await
    }

    async fn delete(&self, key: &str, expected: &Version) -> Result<(), StorageError> {
        self.enter(Op::Delete).await?;
        primitives_of(&self.inner, "delete")?
            .delete(key, expected)
            .await
    }

    fn known(&self, key: &str) -> Option<Stored> {
        self.inner.primitives()?.known(key)
    }

    fn writes_all_at_once(&self) -> bool {
        self.inner
            .primitives()
            .is_some_and(|p| p.writes_all_at_once())
    }

    async fn write_all(&self, writes: &[CasWrite<'_>]) -> Result<Vec<Version>, StorageError> {
        self.enter(Op::WriteAll).await?;
        primitives_of(&self.inner, "write_all")?
            .write_all(writes)
            .await
    }
}

/// A view of a storage that exposes only its primitives, so the **default** lock operations
/// (and backoff instead of notifications) run on top of it. The suites run every backend both
/// through this view and directly.
#[derive(Debug)]
pub struct PrimitivesOnly<S>(pub S);

#[async_trait]
impl<S: Storage> Storage for PrimitivesOnly<S> {
    fn name(&self) -> &str {
        self.0.name()
    }
    fn capabilities(&self) -> Capabilities {
        self.0.capabilities().with_change_notifications(false)
    }
    async fn now(&self) -> Result<Timestamp, StorageError> {
        self.0.now().await
    }
    async fn get(&self, key: &str) -> Result<Option<Stored>, StorageError> {
        self.0.get(key).await
    }
    async fn list(&self, prefix: &str, page: &PageRequest) -> Result<Page, StorageError> {
        self.0.list(prefix, page).await
    }

    fn primitives(&self) -> Option<&dyn Primitives> {
        // Only what the wrapped storage has.
        self.0.primitives().map(|_| self as &dyn Primitives)
    }
}

#[async_trait]
impl<S: Storage> Primitives for PrimitivesOnly<S> {
    async fn create(&self, key: &str, record: &LockRecord) -> Result<Version, StorageError> {
        primitives_of(&self.0, "create")?.create(key, record).await
    }

    async fn update(
        &self,
        key: &str,
        expected: &Version,
        record: &LockRecord,
    ) -> Result<Version, StorageError> {
        primitives_of(&self.0, "update")?
            .update(key, expected, record)
            .await
    }

    async fn delete(&self, key: &str, expected: &Version) -> Result<(), StorageError> {
        primitives_of(&self.0, "delete")?
            .delete(key, expected)
            .await
    }

    fn known(&self, key: &str) -> Option<Stored> {
        self.0.primitives()?.known(key)
    }

    fn writes_all_at_once(&self) -> bool {
        self.0.primitives().is_some_and(|p| p.writes_all_at_once())
    }

    async fn write_all(&self, writes: &[CasWrite<'_>]) -> Result<Vec<Version>, StorageError> {
        primitives_of(&self.0, "write_all")?.write_all(writes).await
    }
}
