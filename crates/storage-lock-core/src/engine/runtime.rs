//! The runtime half of a [`crate::LockHandle`]: the hold's state machine (held → released | lost),
//! its local deadline on the boot clock, the `lost()` signal, the deadline timer, the auto-renew
//! watchdog and release on drop. The contract's [`crate::LockHandle`] is a thin, documented face over
//! one [`HoldRuntime`]; a provider supplies only the I/O ([`HoldIo`]).

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::clock::BootInstant;
use crate::contract::{LockError, RenewalResult, safety_margin};

/// The provider side of a [`crate::LockHandle`]: how to renew and release one hold.
///
/// The handle owns the state machine (held → released | lost), the local deadline, the `lost()`
/// signal, the watchdog and release-on-drop; a provider only does the I/O. Providers outside
/// this crate (a remote client, say) implement it and start handles with
/// [`crate::LockHandle::start`].
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::time::{Duration, SystemTime};
/// use storage_lock_core::clock::BootInstant;
/// use storage_lock_core::contract::{HoldGrant, HoldIo};
/// use storage_lock_core::{LockError, LockHandle};
///
/// struct Remote; // renews and releases over some protocol
/// #[async_trait::async_trait]
/// impl HoldIo for Remote {
///     async fn renew(&self, lease: Duration) -> Result<Option<SystemTime>, LockError> {
///         Ok(Some(SystemTime::now() + lease)) // what the remote side confirmed
///     }
///     async fn release(&self) -> Result<(), LockError> {
///         Ok(())
///     }
/// }
///
/// let sent_at = BootInstant::now(); // before the acquire request leaves
/// let lease = Duration::from_secs(10);
/// let grant = HoldGrant::new("jobs/7", 42, lease, SystemTime::now() + lease, sent_at);
/// let handle = LockHandle::start(grant, Remote);
/// assert_eq!(handle.fencing_token(), 42);
/// handle.release().await.unwrap();
/// # }
/// ```
#[async_trait]
pub trait HoldIo: Send + Sync + 'static {
    /// Extends the hold by `lease`. `Ok(Some(expiry))` if the storage confirmed the hold,
    /// `Ok(None)` if it is not held; errors mean "unknown" (the handle treats them fail-closed).
    ///
    /// # Errors
    /// Any error means the outcome is unknown.
    async fn renew(&self, lease: Duration) -> Result<Option<SystemTime>, LockError>;
    /// What the watchdog (auto-renew) calls instead of [`Self::renew`]: the default is
    /// [`Self::renew`]; a provider that coalesces background renewals (the storage engine does,
    /// into [`crate::Storage::renew_many`] calls) overrides it. Explicit renewals never wait for
    /// a batch.
    ///
    /// # Errors
    /// Any error means the outcome is unknown.
    async fn renew_in_background(&self, lease: Duration) -> Result<Option<SystemTime>, LockError> {
        self.renew(lease).await
    }
    /// Releases the hold (no-op if not held). Called at most once per handle.
    ///
    /// # Errors
    /// The release could not be confirmed (the lease still ends the hold).
    async fn release(&self) -> Result<(), LockError>;
    /// The longest lease a confirmed renewal vouches for, counted from before it was sent; the
    /// handle's local deadline after a renewal of `lease` is counted with the smaller of the two.
    /// `None` (the default): the renewal grants exactly the lease asked for.
    fn vouched_lease(&self) -> Option<Duration> {
        None
    }
    /// Called once when the handle turns lost.
    fn on_lost(&self) {}
}

/// Everything a handle and its background tasks share, in one allocation together with the
/// provider's backend (the unsized last field).
pub(crate) struct HoldRuntime<B: ?Sized = dyn HoldIo> {
    name: Arc<str>,
    key: Arc<str>,
    fencing: u64,
    lease: Duration,
    state: Mutex<State>,
    /// Created by the first `lost_token()` call only (most handles never need one).
    lost_token: OnceLock<CancellationToken>,
    /// Wakes `lost()` futures, the watchdog and the deadline timer when the handle ends
    /// (released or lost); they look at the state to tell which.
    ended: Notify,
    release_started: AtomicBool,
    timer_started: AtomicBool,
    backend: B,
}

#[derive(Debug, Clone, Copy)]
enum State {
    Held {
        expires_at: SystemTime,
        /// The local deadline, on the clock that counts suspended time.
        deadline: BootInstant,
    },
    Released {
        expires_at: SystemTime,
    },
    Lost {
        expires_at: SystemTime,
    },
}

/// What a provider knows right after the storage granted a hold: the input of
/// [`crate::LockHandle::start`].
#[derive(Debug, Clone)]
pub struct HoldGrant {
    pub(crate) name: Arc<str>,
    pub(crate) key: Arc<str>,
    pub(crate) fencing: u64,
    pub(crate) lease: Duration,
    pub(crate) expires_at: SystemTime,
    /// Taken before the acquire request was sent.
    pub(crate) sent_at: BootInstant,
    pub(crate) auto_renew: Option<Duration>,
}

impl HoldGrant {
    /// A grant of `name` with fencing token `fencing` for `lease`, which the authority says ends
    /// at `expires_at`; `sent_at` was taken *before* the acquire request was sent, and the
    /// handle's local deadline is `sent_at + lease − safety margin`. The key is the name and
    /// there is no auto-renew unless set.
    ///
    /// # Examples
    /// See [`HoldIo`].
    pub fn new(
        name: &str,
        fencing: u64,
        lease: Duration,
        expires_at: SystemTime,
        sent_at: BootInstant,
    ) -> Self {
        let name: Arc<str> = name.into();
        Self {
            key: name.clone(),
            name,
            fencing,
            lease,
            expires_at,
            sent_at,
            auto_renew: None,
        }
    }

    /// The key the provider stored the lock under, when it differs from the name.
    ///
    /// # Examples
    /// ```
    /// # use std::time::{Duration, SystemTime};
    /// # use storage_lock_core::{clock::BootInstant, contract::HoldGrant};
    /// let grant = HoldGrant::new("a/b", 1, Duration::from_secs(1), SystemTime::now(), BootInstant::now())
    ///     .key("locks/a/b");
    /// # let _ = grant;
    /// ```
    #[must_use]
    pub fn key(mut self, key: &str) -> Self {
        self.key = key.into();
        self
    }

    /// Renews every `period` in the background (the watchdog), as
    /// [`crate::AcquireOptions::auto_renew`].
    ///
    /// # Examples
    /// ```
    /// # use std::time::{Duration, SystemTime};
    /// # use storage_lock_core::{clock::BootInstant, contract::HoldGrant};
    /// let grant = HoldGrant::new("a", 1, Duration::from_secs(9), SystemTime::now(), BootInstant::now())
    ///     .auto_renew(Some(Duration::from_secs(3)));
    /// # let _ = grant;
    /// ```
    #[must_use]
    pub fn auto_renew(mut self, period: Option<Duration>) -> Self {
        self.auto_renew = period;
        self
    }
}

/// Whether a hold of `lease` from now ends by [`crate::Timestamp::MAX`] (judged on this host's
/// clock; the storage's verdict comes with its expiry, and a grant whose expiry does not fit is
/// refused there too).
///
/// The wall clock is read once per process: every lease up to [`Timestamp::MAX`] minus that
/// reading minus a century fits for the next century, so ordinary leases pass without a clock
/// read (this check runs on every acquisition); longer ones are judged on a fresh reading.
///
/// [`Timestamp::MAX`]: crate::Timestamp::MAX
pub(crate) fn lease_representable(lease: Duration) -> Result<(), LockError> {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 86_400);
    static SURE_TO_FIT: OnceLock<Duration> = OnceLock::new();
    let room = || {
        let max = Duration::from_millis(crate::Timestamp::MAX.as_millis());
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        max.saturating_sub(now)
    };
    if lease <= *SURE_TO_FIT.get_or_init(|| room().saturating_sub(CENTURY)) || lease <= room() {
        Ok(())
    } else {
        Err(LockError::LeaseOutOfRange { lease })
    }
}

/// The longest a timer is set for: later deadlines are capped (a lease of centuries still
/// works; its timer simply never fires within the process's life).
const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);

/// The longest a deadline timer sleeps before it looks at the boot clock again: tokio's timers
/// run on the monotonic clock, which stands still while the machine is suspended, so after a
/// resume a handle notices its passed deadline within this long (and `is_lost()` at once).
const SUSPEND_CHECK: Duration = Duration::from_secs(1);

/// When a timer waiting for `deadline` wakes up (on tokio's clock).
fn wake_for(deadline: BootInstant) -> Instant {
    let left = deadline.saturating_duration_since(BootInstant::now());
    Instant::now() + left.min(SUSPEND_CHECK)
}

fn local_deadline(sent_at: BootInstant, lease: Duration) -> BootInstant {
    let wanted = lease - safety_margin(lease);
    // `Instant + Duration` must never overflow; if even the cap does not fit, fail closed.
    sent_at
        .checked_add(wanted.min(FAR_FUTURE))
        .unwrap_or(sent_at)
}

impl HoldRuntime {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Turns the handle lost if its local deadline has passed; returns whether it is lost.
    fn check_deadline(&self) -> bool {
        let expired = match *self.state() {
            State::Held { deadline, .. } => BootInstant::now() >= deadline,
            State::Lost { .. } => return true,
            State::Released { .. } => return false,
        };
        if expired {
            self.mark_lost();
        }
        expired
    }

    fn mark_lost(&self) {
        let mut state = self.state();
        if let State::Held { expires_at, .. } = *state {
            *state = State::Lost { expires_at };
            drop(state);
            if let Some(token) = self.lost_token.get() {
                token.cancel();
            }
            self.ended.notify_waiters();
            self.backend.on_lost();
        }
    }

    fn mark_released(&self) {
        let mut state = self.state();
        if let State::Held { expires_at, .. } = *state {
            *state = State::Released { expires_at };
        }
        drop(state);
        self.ended.notify_waiters();
    }

    /// One renewal. With `fail_on_error` (an explicit renewal), a storage error turns the
    /// handle lost; without it (the watchdog, which renews through
    /// [`HoldIo::renew_in_background`]), the error is reported as `Lost` so the caller can retry
    /// before the deadline.
    async fn renew(&self, lease: Duration, fail_on_error: bool) -> RenewalResult {
        if self.release_started.load(Ordering::Acquire) || self.check_deadline() {
            return RenewalResult::Lost;
        }
        let sent_at = BootInstant::now();
        let outcome = if fail_on_error {
            self.backend.renew(lease).await
        } else {
            self.backend.renew_in_background(lease).await
        };
        let confirmed = match outcome {
            Ok(Some(expires_at)) => expires_at,
            Ok(None) => {
                self.mark_lost();
                return RenewalResult::Lost;
            }
            Err(e) => {
                tracing::warn!(name = %self.name, error = %e, "renewal could not confirm the hold");
                if fail_on_error {
                    self.mark_lost();
                }
                return RenewalResult::Lost;
            }
        };
        let mut state = self.state();
        match &mut *state {
            State::Held {
                expires_at,
                deadline,
            } => {
                let vouched = self.backend.vouched_lease().map_or(lease, |v| v.min(lease));
                *deadline = local_deadline(sent_at, vouched);
                *expires_at = confirmed;
                RenewalResult::Renewed {
                    expires_at: confirmed,
                }
            }
            _ => RenewalResult::Lost,
        }
    }

    fn deadline(&self) -> Option<BootInstant> {
        match *self.state() {
            State::Held { deadline, .. } => Some(deadline),
            _ => None,
        }
    }
}

/// Turns the handle lost at its local deadline (moved by renewals) unless released first.
async fn deadline_timer(shared: Arc<HoldRuntime>) {
    loop {
        let ended = shared.ended.notified();
        tokio::pin!(ended);
        ended.as_mut().enable();
        let Some(deadline) = shared.deadline() else {
            return;
        };
        tokio::select! {
            () = ended => return,
            () = tokio::time::sleep_until(wake_for(deadline)) => { shared.check_deadline(); }
        }
    }
}

/// `at` moved back onto the process-wide grid of `every / 8` (at most that much earlier), so
/// that watchdogs with the same period renew at the same instants and their renewals can share
/// one storage call (see `engine::renewals`).
fn aligned(at: Instant, every: Duration) -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    let step = (every / 8).as_nanos().max(1);
    let since = at.saturating_duration_since(epoch).as_nanos();
    let back = u64::try_from(since % step).unwrap_or(0);
    at.checked_sub(Duration::from_nanos(back)).unwrap_or(at)
}

/// What a watchdog does next (see [`HoldRuntime::watch_step`]).
enum Step {
    /// The hold ended (released or lost): stop watching.
    Stop,
    /// Nothing to do before the next renewal or the local deadline.
    Wait {
        next: Instant,
        deadline: BootInstant,
    },
    /// Renew now.
    Renew,
}

impl HoldRuntime {
    /// The watchdog's decision now, its next renewal being due at `next`.
    fn watch_step(&self, next: Instant) -> Step {
        if self.release_started.load(Ordering::Acquire) || self.check_deadline() {
            return Step::Stop;
        }
        match self.deadline() {
            None => Step::Stop,
            Some(deadline) if Instant::now() < next => Step::Wait { next, deadline },
            Some(_) => Step::Renew,
        }
    }

    /// One watchdog renewal: the time of the next one (soon after a failure, to retry before
    /// the local deadline), or `None` when the watch ends (a renewal still unanswered at the
    /// local deadline cannot save the hold).
    async fn watch_renew(&self, every: Duration) -> Option<Instant> {
        let deadline = self.deadline()?;
        let left = deadline.saturating_duration_since(BootInstant::now());
        match tokio::time::timeout(left, self.renew(self.lease, false)).await {
            Ok(RenewalResult::Renewed { .. }) => Some(aligned(Instant::now() + every, every)),
            Ok(RenewalResult::Lost) => {
                Some(Instant::now() + (every / 4).max(Duration::from_millis(5)))
            }
            Err(_) => {
                self.check_deadline();
                None
            }
        }
    }
}

/// A watchdog task of its own, for handles of providers outside the engine (the engine's
/// handles are watched by its [`Watchdogs`]): renews every `every` (on a shared grid: see
/// [`aligned`]); on storage errors retries quickly until the local deadline, then the deadline
/// check turns the handle lost. Ends when the handle is released or lost.
async fn watchdog(shared: Arc<HoldRuntime>, every: Duration) {
    let mut next = aligned(Instant::now() + every, every);
    loop {
        let ended = shared.ended.notified();
        tokio::pin!(ended);
        ended.as_mut().enable();
        match shared.watch_step(next) {
            Step::Stop => return,
            Step::Wait { next, deadline } => tokio::select! {
                () = ended => return,
                () = tokio::time::sleep_until(next.min(wake_for(deadline))) => {}
            },
            Step::Renew => match shared.watch_renew(every).await {
                Some(at) => next = at,
                None => return,
            },
        }
    }
}

/// The watchdogs of one engine's auto-renewed handles on **one timer structure** (a binary heap
/// in one task) instead of a task per handle: ~64 bytes per watched hold instead of a task's
/// few hundred, and one timer wake-up per due instant instead of one per hold.
///
/// * Each entry holds its handle weakly: a dropped handle leaves the heap at its next due time.
/// * A due renewal runs in a short task of its own (so a slow storage delays nobody else) and
///   hands the entry back with its next due time; renewals due at the same instant reach the
///   storage together (see `engine::renewals`).
/// * Local deadlines: an entry is also due at its hold's local deadline, and every
///   [`SUSPEND_CHECK`] the scheduler compares the boot clock with tokio's: after a suspend it
///   re-checks every hold at once (tokio's clock stood still meanwhile).
/// * One scheduler per engine and tokio runtime (see `engine::per_runtime`): a hold is
///   watched on the runtime that acquired it. The scheduler ends when the engine and all its
///   handles are gone; if its runtime shuts down first, its holds are no longer renewed and
///   turn lost at their local deadlines (fail-closed), as a task per handle would.
#[derive(Default)]
pub(crate) struct Watchdogs {
    schedulers: super::per_runtime::PerRuntime<Watch>,
}

struct Watch {
    /// When to look at the hold again.
    at: Instant,
    /// When its next renewal is due.
    next: Instant,
    every: Duration,
    hold: std::sync::Weak<HoldRuntime>,
}

impl PartialEq for Watch {
    fn eq(&self, other: &Self) -> bool {
        self.at == other.at
    }
}
impl Eq for Watch {}
impl PartialOrd for Watch {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Watch {
    /// Reversed: the earliest entry is the greatest, on top of the (max-)heap.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other.at.cmp(&self.at)
    }
}

/// When a scheduled hold must be looked at: its next renewal or its local deadline, on tokio's
/// clock (suspends are caught by the scheduler's own check).
fn look_at(next: Instant, deadline: BootInstant) -> Instant {
    next.min(Instant::now() + deadline.saturating_duration_since(BootInstant::now()))
}

impl Watchdogs {
    /// Watches `hold`, renewing it every `every`.
    pub(crate) fn watch(&self, hold: &Arc<HoldRuntime>, every: Duration) {
        let next = aligned(Instant::now() + every, every);
        let at = hold.deadline().map_or(next, |d| look_at(next, d));
        let entry = Watch {
            at,
            next,
            every,
            hold: Arc::downgrade(hold),
        };
        self.schedulers.send(entry, schedule);
    }
}

async fn schedule(
    tx: tokio::sync::mpsc::WeakUnboundedSender<Watch>,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Watch>,
) {
    let mut heap = std::collections::BinaryHeap::<Watch>::new();
    let (mut tokio_then, mut boot_then) = (Instant::now(), BootInstant::now());
    loop {
        let check = tokio_then + SUSPEND_CHECK;
        let wake = heap.peek().map_or(check, |w| w.at.min(check));
        tokio::select! {
            got = rx.recv() => match got {
                Some(w) => {
                    heap.push(w);
                    // A burst of acquisitions: take what is queued in one go.
                    while let Ok(w) = rx.try_recv() {
                        heap.push(w);
                    }
                }
                None => return, // the engine and every handle that could come back are gone
            },
            () = tokio::time::sleep_until(wake) => {}
        }
        let (tokio_now, boot_now) = (Instant::now(), BootInstant::now());
        if tokio_now >= check {
            let tokio_passed = tokio_now.saturating_duration_since(tokio_then);
            let boot_passed = boot_now.saturating_duration_since(boot_then);
            let suspended = boot_passed > tokio_passed + Duration::from_millis(100);
            (tokio_then, boot_then) = (tokio_now, boot_now);
            if suspended {
                // Every local deadline may have passed: look at every hold now.
                let all = std::mem::take(&mut heap);
                for w in all {
                    visit(w, &mut heap, &tx);
                }
                continue;
            }
        }
        while heap.peek().is_some_and(|w| w.at <= tokio_now) {
            if let Some(w) = heap.pop() {
                visit(w, &mut heap, &tx);
            }
        }
    }
}

/// Looks at one due entry: drops it, puts it back for later, or starts its renewal.
fn visit(
    w: Watch,
    heap: &mut std::collections::BinaryHeap<Watch>,
    tx: &tokio::sync::mpsc::WeakUnboundedSender<Watch>,
) {
    let Some(hold) = w.hold.upgrade() else { return };
    match hold.watch_step(w.next) {
        Step::Stop => {}
        Step::Wait { next, deadline } => heap.push(Watch {
            at: look_at(next, deadline),
            ..w
        }),
        Step::Renew => {
            let Some(tx) = tx.upgrade() else { return };
            tokio::spawn(async move {
                if let Some(next) = hold.watch_renew(w.every).await
                    && let Some(deadline) = hold.deadline()
                {
                    let _ = tx.send(Watch {
                        at: look_at(next, deadline),
                        next,
                        every: w.every,
                        hold: w.hold,
                    });
                }
            });
        }
    }
}

impl HoldRuntime {
    /// Starts the runtime of a granted hold (and its watchdog, with auto-renew: a task of its
    /// own, or an entry in `watchdogs`).
    pub(crate) fn start(
        grant: HoldGrant,
        backend: impl HoldIo,
        watchdogs: Option<&Watchdogs>,
    ) -> Arc<HoldRuntime> {
        let deadline = local_deadline(grant.sent_at, grant.lease);
        let shared: Arc<HoldRuntime> = Arc::new(HoldRuntime {
            name: grant.name,
            key: grant.key,
            fencing: grant.fencing,
            lease: grant.lease,
            state: Mutex::new(State::Held {
                expires_at: grant.expires_at,
                deadline,
            }),
            lost_token: OnceLock::new(),
            ended: Notify::new(),
            release_started: AtomicBool::new(false),
            timer_started: AtomicBool::new(false),
            backend,
        });
        if let Some(every) = grant.auto_renew {
            match watchdogs {
                Some(w) => w.watch(&shared, every),
                None => {
                    shared.timer_started.store(true, Ordering::Relaxed);
                    tokio::spawn(watchdog(shared.clone(), every));
                }
            }
        }
        shared
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    pub(crate) fn fencing(&self) -> u64 {
        self.fencing
    }

    pub(crate) fn lease(&self) -> Duration {
        self.lease
    }

    pub(crate) fn expires_at(&self) -> SystemTime {
        match *self.state() {
            State::Held { expires_at, .. }
            | State::Released { expires_at }
            | State::Lost { expires_at } => expires_at,
        }
    }

    pub(crate) fn time_left(&self) -> Option<Duration> {
        if self.check_deadline() {
            return None;
        }
        self.deadline()
            .map(|d| d.saturating_duration_since(BootInstant::now()))
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.check_deadline();
        matches!(*self.state(), State::Lost { .. })
    }

    pub(crate) fn lost(self: &Arc<Self>) -> impl Future<Output = ()> + Send + 'static {
        let shared = self.clone();
        async move {
            loop {
                let notified = shared.ended.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                let state = *shared.state();
                let deadline = match state {
                    State::Held { deadline, .. } => deadline,
                    State::Lost { .. } => return,
                    State::Released { .. } => std::future::pending().await,
                };
                tokio::select! {
                    () = notified => {}
                    () = tokio::time::sleep_until(wake_for(deadline)) => { shared.check_deadline(); }
                }
            }
        }
    }

    pub(crate) fn lost_token(self: &Arc<Self>) -> CancellationToken {
        let token = self.lost_token.get_or_init(CancellationToken::new).clone();
        // `mark_lost` may have run before the token existed.
        if matches!(*self.state(), State::Lost { .. }) {
            token.cancel();
        }
        if !self.timer_started.swap(true, Ordering::AcqRel) {
            tokio::spawn(deadline_timer(self.clone()));
        }
        token
    }

    pub(crate) async fn try_renew(
        &self,
        lease: Option<Duration>,
    ) -> Result<RenewalResult, LockError> {
        if lease.is_some_and(|l| l.is_zero()) {
            return Err(LockError::invalid_option(
                "lease",
                "must be greater than zero",
            ));
        }
        let lease = lease.unwrap_or(self.lease);
        lease_representable(lease)?;
        Ok(self.renew(lease, true).await)
    }

    pub(crate) async fn release(&self) -> Result<(), LockError> {
        if self.release_started.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.mark_released();
        self.backend.release().await
    }

    /// The handle was dropped: release in the background unless already released.
    pub(crate) fn dropped(self: &Arc<Self>) {
        if self.release_started.swap(true, Ordering::AcqRel) {
            return;
        }
        self.mark_released();
        let shared = self.clone();
        // Without a runtime the hold simply lapses at its lease.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = shared.backend.release().await {
                    tracing::warn!(error = %e, "background release of a dropped lock handle failed");
                }
            });
        }
    }
}

impl fmt::Debug for HoldRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockHandle")
            .field("name", &self.name)
            .field("key", &self.key)
            .field("fencing_token", &self.fencing)
            .field("state", &*self.state())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::clock::suspend::sleep_machine;
    use crate::{AcquireOptions, MemoryStorage, StorageLock, Wait};

    /// An auto-renewed hold (watched by the engine's one timer structure, not a task of its
    /// own) whose machine was suspended past its lease is found lost by the scheduler within
    /// [`super::SUSPEND_CHECK`], without anyone asking the handle: its `Lost` event arrives.
    #[tokio::test(flavor = "current_thread")]
    async fn the_watchdog_scheduler_notices_a_suspend() {
        use crate::LockEventKind;
        let locks = StorageLock::new(MemoryStorage::new()).unwrap();
        let mut events = locks.subscribe();
        let opts = AcquireOptions::default()
            .wait(Wait::Never)
            .lease(Duration::from_secs(60))
            .auto_renew(Duration::from_secs(20));
        let h = locks.try_acquire("watched", &opts).await.unwrap().unwrap();
        // Let the scheduler take the entry, then "suspend" for 2 minutes.
        tokio::time::sleep(Duration::from_millis(20)).await;
        sleep_machine(Duration::from_secs(120));
        let lost = tokio::time::timeout(super::SUSPEND_CHECK + Duration::from_millis(500), async {
            loop {
                let e = events.recv().await.unwrap();
                if e.kind == LockEventKind::Lost {
                    return e;
                }
            }
        })
        .await
        .expect("the scheduler must find the hold lost within SUSPEND_CHECK of the resume");
        assert_eq!(lost.fencing_token, Some(h.fencing_token()));
    }

    /// A holder whose machine was suspended past its lease wakes knowing it lost the lock:
    /// tokio's monotonic clock stood still, so a deadline kept on it would still be ahead.
    /// `is_lost()` sees it at once, `lost()` within [`super::SUSPEND_CHECK`].
    #[tokio::test(flavor = "current_thread")]
    async fn a_suspend_past_the_deadline_is_noticed() {
        let locks = StorageLock::new(MemoryStorage::new()).unwrap();
        let opts = AcquireOptions::default()
            .wait(Wait::Never)
            .lease(Duration::from_secs(60));
        let watched = locks.try_acquire("watched", &opts).await.unwrap().unwrap();
        let checked = locks.try_acquire("checked", &opts).await.unwrap().unwrap();
        let lost = watched.lost();
        tokio::pin!(lost);
        // Let the `lost()` future arm its timer, then "suspend" for 2 minutes.
        assert!(
            tokio::time::timeout(Duration::from_millis(20), &mut lost)
                .await
                .is_err()
        );
        sleep_machine(Duration::from_secs(120));
        assert!(checked.is_lost(), "is_lost() must see the suspend at once");
        assert_eq!(checked.time_left(), None);
        tokio::time::timeout(super::SUSPEND_CHECK + Duration::from_millis(500), lost)
            .await
            .expect("lost() must fire within SUSPEND_CHECK of the resume");
    }
}
