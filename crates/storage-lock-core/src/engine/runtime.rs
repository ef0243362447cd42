//! The runtime half of a [`crate::LockHandle`]: the hold's state machine (held → released | lost),
//! its local deadline on the boot clock, the `lost()` signal, the deadline timer, the auto-renew
//! watchdog and release on drop. The contract's [`crate::LockHandle`] is a thin, documented face over
//! one [`HoldRuntime`]; a provider supplies only the I/O ([`HoldIo`]).

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use once_cell::race::OnceBox;
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::clock::BootInstant;
use crate::contract::{LockError, RenewalResult, safety_margin};
use crate::engine::telemetry::{self, LostReason, Renewal};
use crate::small_key::SmallKey;
use crate::storage::{ReleaseOutcome, StorageError};

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
    /// The handle keeps the expiry to the millisecond (as storages count), rounded down.
    ///
    /// # Errors
    /// Any error means the outcome is unknown.
    async fn renew(&self, lease: Duration) -> Result<Option<SystemTime>, LockError>;
    /// What the watchdog (auto-renew) calls instead of [`Self::renew`]: the default is
    /// [`Self::renew`]; a provider that coalesces background renewals (the storage engine does,
    /// into [`crate::Storage::renew_many`] calls) overrides it. Explicit renewals never wait for
    /// a batch to fill; renewals of one handle run one at a time (an explicit one may wait for
    /// the watchdog's renewal in flight).
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

/// The internal side of a hold's I/O: [`HoldIo`] with the hold's fixed facts passed in, so
/// that the engine's backend need not keep a second copy of the key and the token. External
/// providers' [`HoldIo`]s are adapted by [`Io`].
#[async_trait]
pub(crate) trait Backend: Send + Sync + 'static {
    /// As [`HoldIo::renew`] (`background`: [`HoldIo::renew_in_background`]).
    async fn renew(
        &self,
        hold: &HoldCore,
        lease: Duration,
        background: bool,
    ) -> Result<Option<SystemTime>, LockError>;
    /// As [`HoldIo::release`]; the returned future does the I/O (see [`Releasing`]).
    fn release<'a>(&'a self, hold: &'a HoldCore) -> Releasing<'a>;
    /// As [`HoldIo::vouched_lease`].
    fn vouched_lease(&self) -> Option<Duration> {
        None
    }
    /// As [`HoldIo::on_lost`].
    fn on_lost(&self, _hold: &HoldCore) {}
    /// The owner the storage knows the hold by (`None` for a provider's [`HoldIo`]).
    fn owner(&self) -> Option<crate::storage::OwnerId> {
        None
    }
}

/// The future of [`Backend::release`]: the storage's own (already boxed) release future for
/// the engine's handles, so a release allocates no second future around it; a provider's
/// [`HoldIo::release`] future otherwise.
pub(crate) enum Releasing<'a> {
    Storage(BoxFuture<'a, Result<ReleaseOutcome, StorageError>>),
    Io(BoxFuture<'a, Result<(), LockError>>),
}

type BoxFuture<'a, T> = std::pin::Pin<Box<dyn Future<Output = T> + Send + 'a>>;

impl Future for Releasing<'_> {
    /// Whether the storage still had the hold as ours (`false`: it had been broken, swept or
    /// taken over; a provider's [`HoldIo::release`] cannot tell and answers `true`).
    type Output = Result<bool, LockError>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        match self.get_mut() {
            Self::Storage(f) => f.as_mut().poll(cx).map(|r| {
                r.map(|outcome| matches!(outcome, ReleaseOutcome::Released { .. }))
                    .map_err(Into::into)
            }),
            Self::Io(f) => f.as_mut().poll(cx).map(|r| r.map(|()| true)),
        }
    }
}

/// A provider's [`HoldIo`] as a [`Backend`].
pub(crate) struct Io<I>(pub(crate) I);

#[async_trait]
impl<I: HoldIo> Backend for Io<I> {
    async fn renew(
        &self,
        _hold: &HoldCore,
        lease: Duration,
        background: bool,
    ) -> Result<Option<SystemTime>, LockError> {
        if background {
            self.0.renew_in_background(lease).await
        } else {
            self.0.renew(lease).await
        }
    }
    fn release<'a>(&'a self, _hold: &'a HoldCore) -> Releasing<'a> {
        Releasing::Io(self.0.release())
    }
    fn vouched_lease(&self) -> Option<Duration> {
        self.0.vouched_lease()
    }
    fn on_lost(&self, _hold: &HoldCore) {
        self.0.on_lost();
    }
}

/// Everything a handle and its background tasks share, in one allocation together with the
/// provider's backend (the unsized last field).
pub(crate) struct HoldRuntime<B: ?Sized = dyn Backend> {
    core: HoldCore,
    backend: B,
}

/// A hold's facts and state, kept small: a million held locks cost a million of these.
///
/// * The state (held → released | lost) and the one-time flags share one atomic byte; the
///   expiry (milliseconds since the epoch, as storages count) and the local deadline
///   (nanoseconds on the boot clock) are atomic words, read without a lock. A renewal stores
///   them, then confirms only if the hold is still held (once ended, they mean nothing).
/// * The key is inline when short ([`SmallKey`]); the name is a suffix of it (the default
///   normalizer's key is the name; a prefix normalizer's ends with it) or kept in [`Extra`].
/// * What only some handles need — the `lost()` wake-up, the lost token, a name that is not a
///   suffix of the key — lives in [`Extra`], allocated on first use.
pub(crate) struct HoldCore {
    key: SmallKey,
    fencing: u64,
    /// The lease in nanoseconds; [`LEASE_ELSEWHERE`] for one of 584 years or more (kept in
    /// [`Extra`]).
    lease_ns: u64,
    expires_ms: AtomicU64,
    deadline_ns: AtomicU64,
    /// One pointer (a `OnceLock` would add a word for its state).
    extra: OnceBox<Extra>,
    /// Where the name starts in the key ([`NAME_ELSEWHERE`]: in [`Extra`]).
    name_at: u16,
    flags: AtomicU8,
}

/// `HoldCore::name_at` when the name is not a suffix of the key.
const NAME_ELSEWHERE: u16 = u16::MAX;

/// `HoldCore::lease_ns` when the lease does not fit 64 bits of nanoseconds.
const LEASE_ELSEWHERE: u64 = u64::MAX;

/// The parts of a hold most handles never need.
#[derive(Default)]
struct Extra {
    /// Wakes `lost()` futures, the deadline timer and a provider's watchdog task when the
    /// handle ends (released or lost); they look at the state to tell which.
    ended: Notify,
    /// Created by the first `lost_token()` call only.
    lost_token: OnceLock<CancellationToken>,
    /// The name, when it is not a suffix of the key.
    name: Option<Box<str>>,
    /// The lease, when it is 584 years or more.
    lease: Option<Duration>,
}

/// `HoldCore::flags`: the state in the low two bits, then one-time flags.
const STATE: u8 = 0b11;
const HELD: u8 = 0;
const RELEASED: u8 = 1;
const LOST: u8 = 2;
/// `release()` or drop ran (only the first does I/O).
const RELEASE_STARTED: u8 = 0b100;
/// A deadline timer or a watchdog task of the handle's own runs.
const TIMER_STARTED: u8 = 0b1000;
/// A renewal is in flight (see [`HoldRuntime::renewal_turn`]).
const RENEWING: u8 = 0b1_0000;
/// The backend has reported the hold's end (see [`HoldCore::first_end`]).
const END_REPORTED: u8 = 0b10_0000;

fn to_millis(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn from_millis(ms: u64) -> SystemTime {
    UNIX_EPOCH
        .checked_add(Duration::from_millis(ms))
        .unwrap_or(UNIX_EPOCH)
}

impl HoldCore {
    /// The storage key.
    pub(crate) fn key(&self) -> &SmallKey {
        &self.key
    }

    /// The fencing token.
    pub(crate) fn fencing(&self) -> u64 {
        self.fencing
    }

    /// True the first time only: for a backend that reports a hold's end once (metrics and an
    /// event), whichever of release and loss comes first. A bit of the hold's flags rather
    /// than a field of the backend's, so that the engine's handle fits a 128-byte allocation.
    pub(crate) fn first_end(&self) -> bool {
        !self.flag_was_set(END_REPORTED)
    }

    /// Sets the one-time `flag`; whether it was set already.
    fn flag_was_set(&self, flag: u8) -> bool {
        self.flags.fetch_or(flag, Ordering::AcqRel) & flag != 0
    }
}

/// What a provider knows right after the storage granted a hold: the input of
/// [`crate::LockHandle::start`].
#[derive(Clone)]
pub struct HoldGrant {
    pub(crate) name: GrantName,
    pub(crate) key: SmallKey,
    pub(crate) fencing: u64,
    pub(crate) lease: Duration,
    /// The expiry in milliseconds since the epoch, rounded down (as the handle keeps it).
    pub(crate) expires_ms: u64,
    /// Taken before the acquire request was sent.
    pub(crate) sent_at: BootInstant,
    pub(crate) auto_renew: Option<Duration>,
}

impl fmt::Debug for HoldGrant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HoldGrant")
            .field("name", &self.name_str())
            .field("key", &self.key.as_str())
            .field("fencing", &self.fencing)
            .field("lease", &self.lease)
            .field("expires_at", &from_millis(self.expires_ms))
            .field("sent_at", &self.sent_at)
            .field("auto_renew", &self.auto_renew)
            .finish()
    }
}

impl HoldGrant {
    /// The name (see [`GrantName`]).
    fn name_str(&self) -> &str {
        match &self.name {
            GrantName::Key => self.key.as_str(),
            GrantName::SuffixAt(at) => self.key.as_str().get(usize::from(*at)..).unwrap_or(""),
            GrantName::Other(name) => name,
        }
    }

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
        Self {
            key: SmallKey::new(name),
            name: GrantName::Key,
            fencing,
            lease,
            expires_ms: to_millis(expires_at),
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
        self.name = GrantName::of(key, self.name_str());
        self.key = SmallKey::new(key);
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

/// Where a hold's name is, given its key: kept apart only when the key does not end with it.
#[derive(Debug, Clone)]
pub(crate) enum GrantName {
    /// The name is the key (the default normalizer).
    Key,
    /// The name is the key from this byte on (a prefix normalizer).
    SuffixAt(u16),
    /// Any other normalizer's.
    Other(Box<str>),
}

impl GrantName {
    pub(crate) fn of(key: &str, name: &str) -> Self {
        match key.len().checked_sub(name.len()) {
            Some(0) if key == name => Self::Key,
            Some(at) if key.as_bytes()[at..] == *name.as_bytes() => u16::try_from(at)
                .ok()
                .filter(|at| *at != NAME_ELSEWHERE)
                .map_or_else(|| Self::Other(name.into()), Self::SuffixAt),
            _ => Self::Other(name.into()),
        }
    }
}

/// Whether a hold of `lease` from now ends by [`crate::Timestamp::MAX`] (judged on this host's
/// clock, in whole milliseconds as storages count; the storage's verdict comes with its expiry:
/// a grant whose expiry does not fit is released and refused, a renewal's turns the handle lost).
///
/// The wall clock is read once per process: every lease up to [`Timestamp::MAX`] minus that
/// reading minus a century fits for the next century (unless the clock jumps further ahead), so
/// ordinary leases pass without a clock read (this check runs on every acquisition); longer ones
/// are judged on a fresh reading.
///
/// [`Timestamp::MAX`]: crate::Timestamp::MAX
pub(crate) fn lease_representable(lease: Duration) -> Result<(), LockError> {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 86_400);
    static SURE_TO_FIT: OnceLock<Duration> = OnceLock::new();
    let room = || {
        // Fits iff floor_ms(now + lease) <= MAX, i.e. now + lease < MAX + 1 ms.
        let end = Duration::from_millis(crate::Timestamp::MAX.as_millis() + 1);
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        end.saturating_sub(now)
    };
    if lease < *SURE_TO_FIT.get_or_init(|| room().saturating_sub(CENTURY)) || lease < room() {
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
    fn state(&self) -> u8 {
        self.core.flags.load(Ordering::SeqCst) & STATE
    }

    /// Held → `to`; whether this call made the change.
    fn end_as(&self, to: u8) -> bool {
        self.core
            .flags
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |f| {
                (f & STATE == HELD).then_some((f & !STATE) | to)
            })
            .is_ok()
    }

    /// Sets `flag`; whether it was set already.
    fn flag_was_set(&self, flag: u8) -> bool {
        self.core.flag_was_set(flag)
    }

    /// The parts most handles never need, created on first use.
    ///
    /// Ordering with [`Self::wake_ended`]: a waiter takes this, then reads the state; an ender
    /// changes the state, then looks for this. The two `SeqCst` fences make sure at least one of
    /// them sees the other's write, so no waiter sleeps through the end of its hold.
    fn extra(&self) -> &Extra {
        let extra = self.core.extra.get_or_init(Box::default);
        std::sync::atomic::fence(Ordering::SeqCst);
        extra
    }

    /// After the state changed: wakes whoever waits for the end (see [`Self::extra`]).
    fn wake_ended(&self) {
        std::sync::atomic::fence(Ordering::SeqCst);
        if let Some(extra) = self.core.extra.get() {
            extra.ended.notify_waiters();
        }
    }

    /// Turns the handle lost if its local deadline has passed; returns whether it is lost.
    fn check_deadline(&self) -> bool {
        match self.state() {
            HELD => {
                let deadline = self.core.deadline_ns.load(Ordering::Acquire);
                if BootInstant::now().as_nanos() >= deadline {
                    self.mark_lost(LostReason::Expired);
                }
                self.state() == LOST
            }
            state => state == LOST,
        }
    }

    fn mark_lost(&self, why: LostReason) {
        if self.end_as(LOST) {
            telemetry::lost(why);
            std::sync::atomic::fence(Ordering::SeqCst);
            if let Some(token) = self.core.extra.get().and_then(|e| e.lost_token.get()) {
                token.cancel();
            }
            self.wake_ended();
            self.backend.on_lost(&self.core);
        }
    }

    fn mark_released(&self) {
        self.end_as(RELEASED);
        self.wake_ended();
    }

    /// One renewal. With `fail_on_error` (an explicit renewal), a storage error turns the
    /// handle lost; without it (the watchdog, which renews through
    /// [`HoldIo::renew_in_background`]), the error is reported as `Lost` so the caller can retry
    /// before the deadline.
    async fn renew(&self, lease: Duration, fail_on_error: bool) -> RenewalResult {
        if self.ending_or_lost() {
            return RenewalResult::Lost;
        }
        let Some(_turn) = self.renewal_turn().await else {
            return RenewalResult::Lost;
        };
        // The wait for the turn may have outlasted the hold.
        if self.ending_or_lost() {
            return RenewalResult::Lost;
        }
        let sent_at = BootInstant::now();
        let outcome = self.backend.renew(&self.core, lease, !fail_on_error).await;
        let confirmed = match outcome {
            Ok(Some(expires_at)) => {
                telemetry::renewal(Renewal::Renewed);
                expires_at
            }
            Ok(None) => {
                telemetry::renewal(Renewal::Refused);
                self.mark_lost(LostReason::Refused);
                return RenewalResult::Lost;
            }
            Err(e) => {
                telemetry::renewal(Renewal::Error);
                tracing::warn!(name = %self.name(), error = %e, "renewal could not confirm the hold");
                if fail_on_error {
                    self.mark_lost(LostReason::Error);
                }
                return RenewalResult::Lost;
            }
        };
        if self.state() != HELD {
            return RenewalResult::Lost;
        }
        let vouched = self.backend.vouched_lease().map_or(lease, |v| v.min(lease));
        let deadline = local_deadline(sent_at, vouched);
        self.core
            .deadline_ns
            .store(deadline.as_nanos(), Ordering::SeqCst);
        let ms = to_millis(confirmed);
        self.core.expires_ms.store(ms, Ordering::SeqCst);
        // The hold may have ended meanwhile (released, or lost by a check that read the old
        // deadline): then this renewal confirms nothing. Still held now = the renewal took
        // effect before any end.
        if self.state() != HELD {
            return RenewalResult::Lost;
        }
        RenewalResult::Renewed {
            expires_at: from_millis(ms),
        }
    }

    fn deadline(&self) -> Option<BootInstant> {
        let deadline = self.core.deadline_ns.load(Ordering::Acquire);
        (self.state() == HELD).then(|| BootInstant::from_nanos(deadline))
    }

    /// Released (or being released), or lost (its local deadline checked now).
    fn ending_or_lost(&self) -> bool {
        self.core.flags.load(Ordering::Acquire) & RELEASE_STARTED != 0 || self.check_deadline()
    }

    /// Waits until no other renewal of this handle is in flight, then takes the turn (given
    /// back when the guard drops, however the renewal ends); `None` if the hold ended
    /// meanwhile.
    ///
    /// Why one at a time: two renewals in flight together may reach the storage in one order
    /// and answer in the other, and the local deadline follows the answer that comes last. With
    /// different leases (the watchdog's and an explicit `try_renew(Some(1 s))`), that could leave
    /// the handle believing in a longer hold than the storage keeps — fail-open. One at a time,
    /// the last answer is the storage's state. (`overlapping_renewals_never_outlive_the_storage`)
    async fn renewal_turn(&self) -> Option<RenewalTurn<'_>> {
        loop {
            if self.core.flags.fetch_or(RENEWING, Ordering::SeqCst) & RENEWING == 0 {
                return Some(RenewalTurn(self));
            }
            // Woken by the turn's end (or the hold's): see `extra` for the ordering.
            let done = self.extra().ended.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            let flags = self.core.flags.load(Ordering::SeqCst);
            if flags & STATE != HELD {
                return None;
            }
            if flags & RENEWING != 0 {
                done.await;
            }
        }
    }
}

/// The turn of one renewal of a handle ([`HoldRuntime::renewal_turn`]).
struct RenewalTurn<'a>(&'a HoldRuntime);

impl Drop for RenewalTurn<'_> {
    fn drop(&mut self) {
        self.0.core.flags.fetch_and(!RENEWING, Ordering::SeqCst);
        self.0.wake_ended();
    }
}

/// Turns the handle lost at its local deadline (moved by renewals) unless released first.
async fn deadline_timer(shared: Arc<HoldRuntime>) {
    loop {
        let ended = shared.extra().ended.notified();
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
    let epoch = epoch();
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
        if self.ending_or_lost() {
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
        match tokio::time::timeout(left, self.renew(self.lease(), false)).await {
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
        let ended = shared.extra().ended.notified();
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
/// in one task) instead of a task per handle: ~40 bytes per watched hold instead of a task's
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

/// 40 bytes (times as [`Tick`]s): with a million auto-renewed holds, the heap is a large part
/// of what each one costs.
struct Watch {
    /// When to look at the hold again.
    at: Tick,
    /// When its next renewal is due.
    next: Tick,
    /// The renewal period in nanoseconds (periods beyond 584 years are cut to that: renewing
    /// early is safe).
    every_ns: u64,
    hold: std::sync::Weak<HoldRuntime>,
}

/// The first instant of tokio's clock this process asked for: the origin of [`Tick`]s and of
/// the renewal grid ([`aligned`]).
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// An instant of tokio's clock in 8 bytes: signed nanoseconds from [`epoch`] (saturating at
/// ±292 years). Signed because a runtime whose clock is paused (tests) may be behind the
/// instant another runtime set the epoch at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Tick(i64);

impl Tick {
    fn of(at: Instant) -> Self {
        let epoch = epoch();
        let signed = |d: Duration| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
        match at.checked_duration_since(epoch) {
            Some(after) => Self(signed(after)),
            None => Self(-signed(epoch.saturating_duration_since(at))),
        }
    }

    fn instant(self) -> Instant {
        let epoch = epoch();
        let by = Duration::from_nanos(self.0.unsigned_abs());
        if self.0 >= 0 {
            epoch + by
        } else {
            // `at` was representable, so `epoch - (epoch - at)` is.
            epoch.checked_sub(by).unwrap_or(epoch)
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
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
fn look_at(next: Instant, deadline: BootInstant) -> Tick {
    Tick::of(next.min(Instant::now() + deadline.saturating_duration_since(BootInstant::now())))
}

impl Watchdogs {
    /// Watches `hold`, renewing it every `every`.
    pub(crate) fn watch(&self, hold: &Arc<HoldRuntime>, every: Duration) {
        let next = aligned(Instant::now() + every, every);
        let at = hold.deadline().map_or(Tick::of(next), |d| look_at(next, d));
        let entry = Watch {
            at,
            next: Tick::of(next),
            every_ns: nanos(every),
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
        let wake = heap.peek().map_or(check, |w| w.at.instant().min(check));
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
                let mut later = Vec::with_capacity(heap.len());
                for w in std::mem::take(&mut heap) {
                    visit(w, &mut later, &tx);
                }
                heap.extend(later);
                continue;
            }
        }
        let now = Tick::of(tokio_now);
        // Entries put back go in after the round, so that none can be visited twice in it.
        let mut later = Vec::new();
        while heap.peek().is_some_and(|w| w.at <= now) {
            if let Some(w) = heap.pop() {
                visit(w, &mut later, &tx);
            }
        }
        heap.extend(later);
    }
}

/// Looks at one due entry: drops it, puts it back for later (into `later`), or starts its
/// renewal.
fn visit(w: Watch, later: &mut Vec<Watch>, tx: &tokio::sync::mpsc::WeakUnboundedSender<Watch>) {
    let Some(hold) = w.hold.upgrade() else { return };
    match hold.watch_step(w.next.instant()) {
        Step::Stop => {}
        Step::Wait { next, deadline } => later.push(Watch {
            at: look_at(next, deadline),
            ..w
        }),
        Step::Renew => {
            let Some(tx) = tx.upgrade() else { return };
            tokio::spawn(async move {
                let every = Duration::from_nanos(w.every_ns);
                if let Some(next) = hold.watch_renew(every).await
                    && let Some(deadline) = hold.deadline()
                {
                    let _ = tx.send(Watch {
                        at: look_at(next, deadline),
                        next: Tick::of(next),
                        every_ns: w.every_ns,
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
        backend: impl Backend,
        watchdogs: Option<&Watchdogs>,
    ) -> Arc<HoldRuntime> {
        let deadline = local_deadline(grant.sent_at, grant.lease);
        let (name_at, name) = match grant.name {
            GrantName::Key => (0, None),
            GrantName::SuffixAt(at) => (at, None),
            GrantName::Other(name) => (NAME_ELSEWHERE, Some(name)),
        };
        let lease_ns = u64::try_from(grant.lease.as_nanos())
            .ok()
            .filter(|ns| *ns != LEASE_ELSEWHERE);
        let lease = lease_ns.is_none().then_some(grant.lease);
        let extra = if name.is_some() || lease.is_some() {
            OnceBox::with_value(Box::new(Extra {
                name,
                lease,
                ..Extra::default()
            }))
        } else {
            OnceBox::new()
        };
        let shared: Arc<HoldRuntime> = Arc::new(HoldRuntime {
            core: HoldCore {
                key: grant.key,
                fencing: grant.fencing,
                lease_ns: lease_ns.unwrap_or(LEASE_ELSEWHERE),
                expires_ms: AtomicU64::new(grant.expires_ms),
                deadline_ns: AtomicU64::new(deadline.as_nanos()),
                extra,
                name_at,
                flags: AtomicU8::new(HELD),
            },
            backend,
        });
        if let Some(every) = grant.auto_renew {
            match watchdogs {
                Some(w) => w.watch(&shared, every),
                None => {
                    shared.flag_was_set(TIMER_STARTED);
                    tokio::spawn(watchdog(shared.clone(), every));
                }
            }
        }
        shared
    }

    pub(crate) fn name(&self) -> &str {
        let key = self.core.key.as_str();
        match self.core.name_at {
            NAME_ELSEWHERE => self
                .core
                .extra
                .get()
                .and_then(|e| e.name.as_deref())
                .unwrap_or(key),
            at => key.get(usize::from(at)..).unwrap_or(key),
        }
    }

    pub(crate) fn key(&self) -> &str {
        self.core.key.as_str()
    }

    pub(crate) fn fencing(&self) -> u64 {
        self.core.fencing
    }

    pub(crate) fn owner(&self) -> Option<crate::storage::OwnerId> {
        self.backend.owner()
    }

    pub(crate) fn lease(&self) -> Duration {
        match self.core.lease_ns {
            LEASE_ELSEWHERE => self
                .core
                .extra
                .get()
                .and_then(|e| e.lease)
                .unwrap_or(Duration::from_nanos(LEASE_ELSEWHERE)),
            ns => Duration::from_nanos(ns),
        }
    }

    pub(crate) fn expires_at(&self) -> SystemTime {
        from_millis(self.core.expires_ms.load(Ordering::Acquire))
    }

    pub(crate) fn time_left(&self) -> Option<Duration> {
        if self.check_deadline() {
            return None;
        }
        self.deadline()
            .map(|d| d.saturating_duration_since(BootInstant::now()))
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.check_deadline()
    }

    pub(crate) fn lost(self: &Arc<Self>) -> impl Future<Output = ()> + Send + 'static {
        self.end(false)
    }

    /// Completes when the hold ends, released or lost.
    pub(crate) fn ended(self: &Arc<Self>) -> impl Future<Output = ()> + Send + 'static {
        self.end(true)
    }

    /// The hold's record stopped being ours (broken, swept, taken over: seen by the engine's
    /// loss watch): lost now, before its deadline. Nothing if it already ended.
    pub(crate) fn taken_away(&self) {
        self.mark_lost(LostReason::TakenAway);
    }

    /// Completes when the hold is lost, or also when released with `released_too`.
    fn end(self: &Arc<Self>, released_too: bool) -> impl Future<Output = ()> + Send + 'static {
        let shared = self.clone();
        async move {
            loop {
                let notified = shared.extra().ended.notified();
                tokio::pin!(notified);
                notified.as_mut().enable();
                let deadline = match shared.state() {
                    HELD => match shared.deadline() {
                        Some(deadline) => deadline,
                        None => continue, // ended just now: look again
                    },
                    LOST => return,
                    _ if released_too => return,
                    _ => std::future::pending().await,
                };
                tokio::select! {
                    () = notified => {}
                    () = tokio::time::sleep_until(wake_for(deadline)) => { shared.check_deadline(); }
                }
            }
        }
    }

    pub(crate) fn lost_token(self: &Arc<Self>) -> CancellationToken {
        let token = self
            .extra()
            .lost_token
            .get_or_init(CancellationToken::new)
            .clone();
        // `mark_lost` may have run before the token existed (see `extra` for the ordering).
        std::sync::atomic::fence(Ordering::SeqCst);
        if self.state() == LOST {
            token.cancel();
        }
        if !self.flag_was_set(TIMER_STARTED) {
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
        let lease = lease.unwrap_or_else(|| self.lease());
        lease_representable(lease)?;
        Ok(self.renew(lease, true).await)
    }

    pub(crate) async fn release(&self) -> Result<(), LockError> {
        // Not `release_checked`: judging the deadline reads the clock, which a plain release
        // (every engine cycle) does not need.
        if self.flag_was_set(RELEASE_STARTED) {
            return Ok(());
        }
        self.mark_released();
        self.backend.release(&self.core).await.map(|_| ())
    }

    /// Releases; whether the hold was still ours until then: not lost, and the storage still
    /// had it under our owner (see [`Releasing`]). A second call answers from the state.
    pub(crate) async fn release_checked(&self) -> Result<bool, LockError> {
        if self.flag_was_set(RELEASE_STARTED) {
            return Ok(self.state() != LOST);
        }
        let lost = self.check_deadline();
        self.mark_released();
        let ours = self.backend.release(&self.core).await?;
        Ok(ours && !lost)
    }

    /// The handle was dropped: release in the background unless already released.
    pub(crate) fn dropped(self: &Arc<Self>) {
        if self.flag_was_set(RELEASE_STARTED) {
            return;
        }
        self.mark_released();
        let shared = self.clone();
        // Without a runtime the hold simply lapses at its lease.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = shared.backend.release(&shared.core).await {
                    tracing::warn!(error = %e, "background release of a dropped lock handle failed");
                }
            });
        }
    }
}

impl fmt::Debug for HoldRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state() {
            HELD => "held",
            RELEASED => "released",
            _ => "lost",
        };
        f.debug_struct("LockHandle")
            .field("name", &self.name())
            .field("key", &self.key())
            .field("fencing_token", &self.core.fencing)
            .field("state", &state)
            .field("expires_at", &self.expires_at())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::clock::suspend::sleep_machine;
    use crate::{AcquireOptions, MemoryStorage, RenewalResult, StorageLock, Wait};

    /// The compact handle keeps every fact exactly, whichever way it stores it: a name that is
    /// the key, a suffix of it or neither; a key inline or boxed; a lease in nanoseconds or one
    /// too long for them.
    #[tokio::test(flavor = "current_thread")]
    async fn a_handle_reports_what_it_was_granted() {
        #[derive(Debug)]
        struct Upper;
        impl crate::KeyNormalizer for Upper {
            fn normalize<'a>(&self, name: &'a str) -> std::borrow::Cow<'a, str> {
                name.to_uppercase().into()
            }
        }
        let long_name = "n".repeat(40);
        let centuries = Duration::from_secs(86_400 * 365 * 1000);
        let cases: Vec<(StorageLock<MemoryStorage>, &str, &str)> = vec![
            (
                StorageLock::new(MemoryStorage::new()).unwrap(),
                "jobs/1",
                "jobs/1",
            ),
            (
                StorageLock::new(MemoryStorage::new()).unwrap(),
                &long_name,
                &long_name,
            ),
            (
                StorageLock::builder(MemoryStorage::new())
                    .normalizer(crate::PrefixNormalizer::new("billing/"))
                    .build()
                    .unwrap(),
                "jobs/1",
                "billing/jobs/1",
            ),
            (
                StorageLock::builder(MemoryStorage::new())
                    .normalizer(Upper)
                    .build()
                    .unwrap(),
                "jobs/1",
                "JOBS/1",
            ),
        ];
        for (locks, name, key) in cases {
            for lease in [Duration::from_millis(1500), centuries] {
                let opts = AcquireOptions::default().wait(Wait::Never).lease(lease);
                let h = locks.try_acquire(name, &opts).await.unwrap().unwrap();
                assert_eq!((h.name(), h.key(), h.lease()), (name, key, lease));
                let stored = crate::Storage::get(locks.storage().as_ref(), key)
                    .await
                    .unwrap()
                    .unwrap()
                    .record;
                assert_eq!(h.fencing_token(), stored.fencing);
                assert_eq!(h.expires_at(), stored.expires_at.to_system_time().unwrap());
                assert!(!h.is_lost() && h.time_left().is_some());
                h.release().await.unwrap();
                assert!(!h.is_lost() && h.time_left().is_none());
            }
        }
    }

    /// Two renewals of one handle in flight at once, with different leases: a long one whose
    /// answer is slow and a short one after it. The storage applies the long one, then the
    /// short one (its expiry is now ~1 s away); the long one's answer arrives last. The local
    /// deadline must follow what the storage holds (≤ 1 s), not the answer that came last
    /// (30 s): renewals of one handle run one at a time.
    #[tokio::test(flavor = "current_thread")]
    async fn overlapping_renewals_never_outlive_the_storage() {
        use crate::Storage;
        // Answers to renewals of 10 s or more arrive 300 ms late.
        let storage = crate::fault::FaultyStorage::new(MemoryStorage::new());
        storage.set_slow_renew_answers(Some((Duration::from_secs(10), Duration::from_millis(300))));
        let locks = StorageLock::new(storage).unwrap();
        let opts = AcquireOptions::default()
            .wait(Wait::Never)
            .lease(Duration::from_secs(30));
        let h = locks.try_acquire("overlap", &opts).await.unwrap().unwrap();
        let long = h.try_renew(Some(Duration::from_secs(30)));
        let short = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            h.try_renew(Some(Duration::from_secs(1))).await
        };
        let (long, short) = tokio::join!(long, short);
        assert!(matches!(long.unwrap(), RenewalResult::Renewed { .. }));
        assert!(matches!(short.unwrap(), RenewalResult::Renewed { .. }));
        let stored = locks
            .storage()
            .get("overlap")
            .await
            .unwrap()
            .unwrap()
            .record;
        let storage_left = stored
            .expires_at
            .saturating_since(locks.storage().now().await.unwrap());
        let left = h.time_left().expect("held");
        assert!(
            left <= storage_left,
            "local deadline in {left:?}, the storage's expiry in {storage_left:?}"
        );
    }

    /// Ticks keep instants on either side of the epoch (a paused runtime's clock may be behind
    /// it) and keep their order.
    #[test]
    fn ticks_round_trip_around_the_epoch() {
        use super::{Tick, epoch};
        let epoch = epoch();
        let later = epoch + Duration::from_millis(1500);
        let earlier = epoch.checked_sub(Duration::from_millis(700));
        assert_eq!(Tick::of(later).instant(), later);
        assert_eq!(Tick::of(epoch).instant(), epoch);
        if let Some(earlier) = earlier {
            assert_eq!(Tick::of(earlier).instant(), earlier);
            assert!(Tick::of(earlier) < Tick::of(epoch) && Tick::of(epoch) < Tick::of(later));
        }
    }

    /// An auto-renewed hold costs one of these in its engine's heap besides its handle.
    #[cfg(target_pointer_width = "64")]
    #[test]
    fn a_watchdog_entry_stays_small() {
        // Two ticks, the period, and a weak pointer to the (unsized) handle runtime.
        assert!(std::mem::size_of::<super::Watch>() <= 40);
    }

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
