//! The acquire loop.
//!
//! ```text
//! try_acquire(name, opts)
//!   ├─ validate name + options, normalize → key           (no storage I/O before this point)
//!   └─ loop
//!        ├─ arm Storage::wait_for_change(key)             (only when a wait budget remains)
//!        ├─ sent_at = BootInstant::now()
//!        ├─ Storage::acquire_once(key, req), detached      (one round trip on overriding backends)
//!        ├─ Acquired → build LockHandle (local deadline from sent_at) → Some(handle)
//!        └─ Busy → out of budget? None : sleep until the earliest of
//!                  wait deadline · holder's expiry · change notification · jittered backoff
//! ```
//!
//! **Cancel safety.** Dropping a future does not stop a request that already left: a database
//! may apply an `INSERT` after the client gave up on it. So the storage call runs *detached*
//! (`detached`): inline in the caller's task, but if the caller drops its future while the call
//! is pending, the call moves to its own task and, when the answer arrives, that task releases
//! the grant itself — strictly *after* the grant, never racing it. Failures after a grant (building the handle) release the same way.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use crate::clock::BootInstant;

use super::StorageLock;
use super::backend::EngineHold;
use super::events::LockEventKind;
use crate::contract::{AcquireOptions, Busy, LockError, Wait};
use crate::hold::LockHandle;
use crate::hold::{GrantName, HoldGrant};
use crate::small_key::SmallKey;
use crate::storage::{
    AcquireOutcome, AcquireRequest, ChangeWait, HolderInfo, OwnerId, Storage, StorageError,
    Timestamp,
};
use crate::telemetry::{self, Finish};

/// Longest sleep between attempts when the storage delivers notifications (a safety net in case
/// one is lost, e.g. while a notification connection reconnects).
const NOTIFIED_RECHECK: Duration = Duration::from_secs(2);
/// First backoff step for storages without notifications; doubles up to [`BACKOFF_CAP`].
const BACKOFF_START: Duration = Duration::from_millis(1);
/// Largest backoff step.
const BACKOFF_CAP: Duration = Duration::from_millis(100);

/// What the loop returns on success.
pub(crate) struct Granted {
    pub fencing: u64,
    pub count: u32,
    pub expires_at: Timestamp,
    /// Time left when the storage decided.
    pub expires_in: Duration,
    pub sent_at: BootInstant,
    /// When the answer was taken in: the acquisition's latency ends and the hold's time starts.
    pub granted_at: BootInstant,
}

impl<S: Storage + ?Sized> StorageLock<S> {
    pub(crate) async fn acquire_handle(
        &self,
        name: &str,
        options: &AcquireOptions,
    ) -> Result<Result<LockHandle, Busy>, LockError> {
        options.validate()?;
        // Inline when short: the key needs no allocation of its own, here or in the handle.
        let key = SmallKey::new(&self.key_for(name)?);
        // Building a span (and an `Instrumented` wrapper) costs even when nobody listens.
        let span = tracing::level_enabled!(tracing::Level::DEBUG)
            .then(|| tracing::debug_span!("storage_lock.acquire", key = %key));
        let acquire = async {
            let req = self.request(OwnerId::random(), options, false);
            let granted = match self.acquire_loop(&key, &req, options, None).await? {
                Ok(granted) => granted,
                Err(busy) => return Ok(Err(busy)),
            };
            match self.start_hold(&key, name, req.owner, options, &granted) {
                Ok(handle) => Ok(Ok(handle)),
                Err(e) => {
                    // Release first, then report the original error.
                    self.release_refused_grant(&key, req.owner).await;
                    telemetry::hold_ended(Duration::ZERO);
                    Err(e)
                }
            }
        };
        match span {
            Some(span) => acquire.instrument(span).await,
            None => acquire.await,
        }
    }

    /// The handle of a grant: its runtime started (watchdog, loss watch) and
    /// [`LockEventKind::Acquired`] sent. [`LockError::LeaseOutOfRange`], with nothing started,
    /// for an expiry past [`Timestamp::MAX`] (it cannot be shown as a `SystemTime`).
    pub(crate) fn start_hold(
        &self,
        key: &SmallKey,
        name: &str,
        owner: OwnerId,
        options: &AcquireOptions,
        granted: &Granted,
    ) -> Result<LockHandle, LockError> {
        if granted.expires_at > Timestamp::MAX {
            return Err(LockError::LeaseOutOfRange {
                lease: options.lease,
            });
        }
        let grant = HoldGrant {
            // The default normalizer maps a name to itself (and a prefix normalizer to a key
            // that ends with it): then the handle keeps no copy.
            name: GrantName::of(key.as_str(), name),
            key: key.clone(),
            fencing: granted.fencing,
            lease: options.lease,
            expires_ms: granted.expires_at.as_millis(),
            sent_at: granted.sent_at,
            auto_renew: options.auto_renew,
        };
        // Hold time (a metric) starts when the answer was taken in.
        let backend = EngineHold::new(self.holds.clone(), owner, granted.granted_at);
        let runtime = crate::hold::start_watched(grant, backend, Some(&self.shared.watchdogs));
        if self.watches_loss(options) {
            tokio::spawn(super::backend::watch_loss(
                runtime.clone(),
                self.holds.clone(),
                owner,
            ));
        }
        self.shared
            .events
            .emit(LockEventKind::Acquired, key.as_str(), Some(granted.fencing));
        Ok(LockHandle::from_runtime(runtime))
    }

    pub(crate) fn request(
        &self,
        owner: OwnerId,
        options: &AcquireOptions,
        reentrant: bool,
    ) -> AcquireRequest {
        let holder = match &options.note {
            None => self.shared.holder.clone(),
            Some(note) => Arc::new(HolderInfo {
                note: Some(note.clone()),
                ..(*self.shared.holder).clone()
            }),
        };
        AcquireRequest {
            owner,
            lease: options.lease,
            holder: Some(holder),
            reentrant,
        }
    }

    /// Tries until acquired, out of budget, or cancelled. A grant that arrives after the caller
    /// dropped this future is released (one level, for reentrant requests; see the module docs).
    ///
    /// `resume`: the owner may already hold the key from an earlier request whose answer was
    /// lost (a client's retry): a busy answer is then checked against the record and the
    /// owner's hold adopted; and a grant abandoned by a dropped call is released only if no
    /// newer request of the owner has started (see `owned::Resumes`).
    pub(crate) async fn acquire_loop(
        &self,
        key: &SmallKey,
        req: &AcquireRequest,
        options: &AcquireOptions,
        resume: Option<Arc<super::owned::ResumeTicket>>,
    ) -> Result<Result<Granted, Busy>, LockError> {
        let boot_started = BootInstant::now();
        // `Wait::Never` makes one attempt and never sleeps: it reads no tokio clock (each clock
        // read is a noticeable part of an in-memory acquisition). For the others, `deadline` =
        // None means no limit.
        let (waits, started, deadline) = match options.wait {
            Wait::Never => (false, None, None),
            Wait::For(d) => {
                let started = Instant::now();
                (true, Some(started), started.checked_add(d)) // too far to represent = forever
            }
            Wait::Forever => (true, None, None),
        };
        let cancelled = || options.cancel.as_ref().is_some_and(|c| c.is_cancelled());
        // Latency on the boot clock: its reading at the end is also where a hold's time starts.
        let finish = |result: Finish| {
            let now = BootInstant::now();
            telemetry::acquire_finished(result, now.saturating_duration_since(boot_started));
            now
        };
        let mut attempt: u32 = 0;
        let mut failures: u32 = 0;
        // When a failed attempt may have been granted without our hearing of it: the instant
        // before it was sent.
        let mut uncertain_since: Option<BootInstant> = resume.is_some().then_some(boot_started);
        loop {
            if cancelled() {
                self.shared.events.emit(LockEventKind::Cancelled, key, None);
                finish(Finish::Cancelled);
                return Err(LockError::Cancelled);
            }
            let may_wait = waits
                && match (deadline, started) {
                    (Some(d), Some(started)) => d > started && Instant::now() < d,
                    _ => true,
                };
            let change = if may_wait {
                // No notification (e.g. the storage is unreachable): back off instead.
                self.storage
                    .as_ref()
                    .wait_for_change(key)
                    .await
                    .unwrap_or_else(|_| ChangeWait::unsupported())
            } else {
                ChangeWait::unsupported()
            };
            let sent_at = if attempt == 0 {
                boot_started
            } else {
                BootInstant::now()
            };
            let outcome = match self.try_acquire_detached(key, req, resume.clone()).await {
                Ok(outcome) => outcome,
                // While *waiting*, an unreachable storage is one more reason to wait: retry
                // with backoff until the budget ends (holding stays fail-closed elsewhere).
                Err(e @ StorageError::Backend { .. })
                    if waits && deadline.is_none_or(|d| Instant::now() + RETRY_START < d) =>
                {
                    failures = failures.saturating_add(1);
                    telemetry::storage_error("acquire");
                    // The request may have been applied although its answer was lost.
                    uncertain_since.get_or_insert(sent_at);
                    tracing::warn!(key = %key, error = %e, failures, "acquire failed; retrying while the wait lasts");
                    let mut wake = Instant::now() + retry_backoff(failures);
                    if let Some(d) = deadline {
                        wake = wake.min(d);
                    }
                    let cancel = options.cancel.clone().unwrap_or_default();
                    tokio::select! {
                        () = tokio::time::sleep_until(wake) => {}
                        () = cancel.cancelled() => {}
                    }
                    continue;
                }
                Err(e) => {
                    finish(Finish::Error);
                    return Err(e.into());
                }
            };
            if let (Some(since), AcquireOutcome::Busy { now, .. }) = (uncertain_since, &outcome) {
                match self.adopt_lost_grant(key, req, *now, since).await {
                    Adoption::Adopted(granted) => {
                        let granted_at = finish(Finish::Acquired);
                        let granted = Granted {
                            granted_at,
                            ..granted
                        };
                        return self.within_fencing_limit(key, req, granted).await.map(Ok);
                    }
                    // Someone else holds the key: no earlier attempt of ours left a live grant,
                    // so a later grant is this wait's own and its deadline counts from its own
                    // request (counting from the error made it expire at once: issue 26 #10).
                    Adoption::NotOurs => uncertain_since = None,
                    Adoption::Unknown => {}
                }
            }
            let busy = match outcome {
                AcquireOutcome::Acquired {
                    fencing,
                    count,
                    expires_at,
                } => {
                    let granted_at = finish(Finish::Acquired);
                    let granted = Granted {
                        fencing,
                        count,
                        expires_at,
                        expires_in: req.lease,
                        // After an attempt whose answer was lost, this grant may be that
                        // attempt's (a server adopts it for the retry): count from before it.
                        sent_at: uncertain_since.map_or(sent_at, |u| u.min(sent_at)),
                        granted_at,
                    };
                    return self.within_fencing_limit(key, req, granted).await.map(Ok);
                }
                AcquireOutcome::Busy {
                    expires_at,
                    now,
                    holder,
                } => Busy {
                    holder,
                    left: expires_at.saturating_since(now),
                },
            };
            let busy_for = busy.left;
            if attempt == 0 {
                self.shared.events.emit(LockEventKind::Contended, key, None);
                telemetry::contended();
            }
            // Out of budget (`Wait::Never` reads no clock for it): timed out.
            let Some(now) = waits
                .then(Instant::now)
                .filter(|now| deadline.is_none_or(|d| *now < d))
            else {
                self.shared.events.emit(LockEventKind::TimedOut, key, None);
                finish(Finish::TimedOut);
                return Ok(Err(busy));
            };
            // The holder's expiry on our clock; +1 ms for the storage's millisecond rounding.
            let mut wake = now + busy_for + Duration::from_millis(1);
            if let Some(d) = deadline {
                wake = wake.min(d);
            }
            wake = wake.min(
                now + if change.is_supported() {
                    NOTIFIED_RECHECK
                } else {
                    backoff(attempt)
                },
            );
            attempt = attempt.saturating_add(1);
            let cancel = options.cancel.clone().unwrap_or_default();
            tokio::select! {
                () = change.changed() => {}
                () = tokio::time::sleep_until(wake) => {}
                () = cancel.cancelled() => {} // reported at the top of the loop
            }
        }
    }
}

impl<S: Storage + ?Sized> StorageLock<S> {
    /// The grant, if its fencing token is within the storage's limit; else the grant released
    /// (one level: a first grant, since a deeper level's token was checked when it was first
    /// granted) and [`LockError::FencingExhausted`].
    async fn within_fencing_limit(
        &self,
        key: &SmallKey,
        req: &AcquireRequest,
        granted: Granted,
    ) -> Result<Granted, LockError> {
        let (limit, bound) = self.shared.fencing_limit;
        if granted.fencing <= limit || granted.count > 1 {
            return Ok(granted);
        }
        self.release_refused_grant(key, req.owner).await;
        tracing::error!(key = %key, fencing = granted.fencing, bound, "fencing token near the storage's bound: grant refused");
        Err(LockError::FencingExhausted {
            key: key.as_str().to_owned(),
            fencing: granted.fencing,
            bound,
        })
    }

    /// Releases a grant the engine refuses to hand out (one level of `owner`'s hold of `key`),
    /// to completion even if the caller's future is dropped meanwhile; a failure is logged and
    /// leaves the grant to its lease.
    async fn release_refused_grant(&self, key: &SmallKey, owner: OwnerId) {
        let (storage, released_key) = (self.storage.clone(), key.clone());
        let released = detached(
            async move { storage.as_ref().release(released_key.as_str(), owner).await },
            |_| async {},
        )
        .await;
        if let Err(e) = released {
            tracing::warn!(key = %key, error = %e, "release of a refused grant failed");
        }
    }
}

/// First retry delay after a storage error while waiting; doubles up to [`RETRY_CAP`].
const RETRY_START: Duration = Duration::from_millis(50);
/// Longest retry delay after storage errors while waiting.
const RETRY_CAP: Duration = Duration::from_secs(2);

/// Jittered exponential backoff after `failures` consecutive storage errors.
fn retry_backoff(failures: u32) -> Duration {
    jittered(RETRY_START, RETRY_CAP, failures.saturating_sub(1))
}

impl<S: Storage + ?Sized> StorageLock<S> {
    /// Whether a hold acquired with `options` gets a loss watch (see
    /// [`AcquireOptions::watch_loss`]): as asked, or by default when auto-renewed on a shared
    /// storage with change notifications.
    fn watches_loss(&self, options: &AcquireOptions) -> bool {
        let caps = self.storage.as_ref().capabilities();
        caps.change_notifications
            && options
                .watch_loss
                .unwrap_or(options.auto_renew.is_some() && !caps.process_local)
    }

    /// After an attempt whose answer was lost, the storage may report the key busy *because of
    /// our own grant*: a plain (non-reentrant) request of the same owner is refused. If the
    /// record shows our owner holding one level, that is our grant: adopt it, with the local
    /// deadline counted from before the uncertain attempt was sent.
    ///
    /// [`Adoption::NotOurs`] when the record shows no live hold of our owner: then no earlier
    /// attempt of this call holds the key. (An earlier request the storage applies only *after*
    /// this answer — a dead connection's request processed out of order — is not covered; a
    /// later busy answer naming our owner is not adopted then, which delays, never
    /// double-grants.)
    async fn adopt_lost_grant(
        &self,
        key: &str,
        req: &AcquireRequest,
        now: Timestamp,
        sent_at: BootInstant,
    ) -> Adoption {
        if req.reentrant {
            return Adoption::Unknown;
        }
        let stored = match self.storage.as_ref().get(key).await {
            Ok(Some(stored)) => stored,
            Ok(None) => return Adoption::NotOurs,
            Err(_) => return Adoption::Unknown,
        };
        let rec = stored.record;
        if rec.owner != req.owner || !rec.is_held_at(now) {
            return Adoption::NotOurs;
        }
        if rec.count != 1 {
            return Adoption::Unknown;
        }
        Adoption::Adopted(Granted {
            fencing: rec.fencing,
            count: rec.count,
            expires_at: rec.expires_at,
            expires_in: rec.expires_at.saturating_since(now),
            sent_at,
            granted_at: sent_at, // replaced by the caller's reading
        })
    }
}

/// What [`StorageLock::adopt_lost_grant`] found.
enum Adoption {
    /// The record is our owner's single level: our lost grant.
    Adopted(Granted),
    /// The key is free or someone else's: no earlier attempt of ours holds it.
    NotOurs,
    /// The record could not be read, or the request is reentrant: nothing is known.
    Unknown,
}

/// Backoff between attempts on a busy storage without notifications: 1 ms · 2^attempt ≤ 100 ms.
fn backoff(attempt: u32) -> Duration {
    jittered(BACKOFF_START, BACKOFF_CAP, attempt)
}

/// Exponential backoff with jitter: uniform in [step/2, step], step = `start` · 2^`doublings`
/// ≤ `cap`.
fn jittered(start: Duration, cap: Duration, doublings: u32) -> Duration {
    let step = start.saturating_mul(1u32 << doublings.min(16)).min(cap);
    let half = step / 2;
    half + half.mul_f64(rand::random::<f64>())
}

impl<S: Storage + ?Sized> StorageLock<S> {
    /// [`Storage::acquire_once`], run by [`detached`]: if this future is dropped and the storage
    /// grants anyway, the grant is released right after it.
    async fn try_acquire_detached(
        &self,
        key: &SmallKey,
        req: &AcquireRequest,
        resume: Option<Arc<super::owned::ResumeTicket>>,
    ) -> Result<AcquireOutcome, StorageError> {
        let (storage, key, req) = (self.storage.clone(), key.clone(), req.clone());
        let (outcome, ..) = detached(
            async move {
                let outcome = storage.as_ref().acquire_once(key.as_str(), &req).await;
                (outcome, storage, key, req.owner, resume)
            },
            |(outcome, storage, key, owner, resume)| async move {
                let Ok(AcquireOutcome::Acquired { .. }) = outcome else {
                    return;
                };
                if resume.as_ref().is_some_and(|t| !t.is_latest()) {
                    tracing::debug!(key = %key, "abandoned grant left to the owner's retry");
                    return;
                }
                if let Err(e) = storage.as_ref().release(key.as_str(), owner).await {
                    tracing::warn!(key = %key, error = %e, "release of an abandoned grant failed");
                }
            },
        )
        .await;
        outcome
    }
}

/// Runs `fut` to completion even if the caller stops waiting.
///
/// `fut` runs inline, in the caller's task (no spawn, no channel on the normal path). If the
/// caller drops its future while `fut` is still pending, the pending `fut` moves to a spawned
/// task and its result goes to `abandoned` there, exactly once.
pub(crate) fn detached<T, F, A, AF>(fut: F, abandoned: A) -> Detached<T, A>
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
    A: FnOnce(T) -> AF + Send + 'static,
    AF: Future<Output = ()> + Send + 'static,
{
    Detached {
        fut: Some(Box::pin(fut)),
        abandoned: Some(abandoned),
    }
}

/// The future of [`detached`].
pub(crate) struct Detached<T, A>
where
    T: Send + 'static,
    A: Abandon<T>,
{
    fut: Option<Pin<Box<dyn Future<Output = T> + Send>>>,
    abandoned: Option<A>,
}

/// What [`detached`] does with a result nobody waits for any more.
pub(crate) trait Abandon<T>: Send + 'static {
    /// Handles `value` in the background.
    fn spawn(self, fut: Pin<Box<dyn Future<Output = T> + Send>>, rt: tokio::runtime::Handle);
}

impl<T, A, AF> Abandon<T> for A
where
    T: Send + 'static,
    A: FnOnce(T) -> AF + Send + 'static,
    AF: Future<Output = ()> + Send + 'static,
{
    fn spawn(self, fut: Pin<Box<dyn Future<Output = T> + Send>>, rt: tokio::runtime::Handle) {
        rt.spawn(async move { self(fut.await).await });
    }
}

impl<T: Send + 'static, A: Abandon<T>> Future for Detached<T, A> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<T> {
        let Some(fut) = self.fut.as_mut() else {
            panic!("Detached polled after completion");
        };
        let v = std::task::ready!(fut.as_mut().poll(cx));
        self.fut = None;
        Poll::Ready(v)
    }
}

// `Detached` never pins `abandoned` and keeps `fut` boxed, so it can move freely.
impl<T: Send + 'static, A: Abandon<T>> Unpin for Detached<T, A> {}

impl<T: Send + 'static, A: Abandon<T>> Drop for Detached<T, A> {
    fn drop(&mut self) {
        let (Some(fut), Some(abandoned)) = (self.fut.take(), self.abandoned.take()) else {
            return;
        };
        // Without a runtime the request cannot be finished; its lease bounds the damage.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            abandoned.spawn(fut, rt);
        }
    }
}
