//! The hold's state machine (held → released | lost): its local deadline on the boot clock, the
//! `lost()` signal, the deadline timer, explicit renewals and release (also on drop).

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use once_cell::race::OnceBox;
use tokio_util::sync::CancellationToken;

use super::RenewalResult;
use super::grant::{GrantName, HoldGrant, local_deadline, wake_for};
use super::io::Backend;
use super::state::{
    Extra, HELD, HoldCore, LEASE_ELSEWHERE, LOST, NAME_ELSEWHERE, RELEASE_STARTED, RELEASED,
    RENEWING, STATE, TIMER_STARTED, from_millis, to_millis,
};
use crate::clock::BootInstant;
use crate::contract::LockError;
use crate::telemetry::{self, LostReason, Renewal};

/// Everything a handle and its background tasks share, in one allocation together with the
/// provider's backend (the unsized last field).
pub(crate) struct HoldRuntime<B: ?Sized = dyn Backend> {
    pub(super) core: HoldCore,
    backend: B,
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
    pub(super) fn flag_was_set(&self, flag: u8) -> bool {
        self.core.flag_was_set(flag)
    }

    /// The parts most handles never need, created on first use.
    ///
    /// Ordering with [`Self::wake_ended`]: a waiter takes this, then reads the state; an ender
    /// changes the state, then looks for this. The two `SeqCst` fences make sure at least one of
    /// them sees the other's write, so no waiter sleeps through the end of its hold.
    pub(super) fn extra(&self) -> &Extra {
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
    pub(super) fn check_deadline(&self) -> bool {
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
    /// [`super::HoldIo::renew_in_background`]), the error is reported as `Lost` so the caller can retry
    /// before the deadline.
    pub(super) async fn renew(&self, lease: Duration, fail_on_error: bool) -> RenewalResult {
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

    pub(super) fn deadline(&self) -> Option<BootInstant> {
        let deadline = self.core.deadline_ns.load(Ordering::Acquire);
        (self.state() == HELD).then(|| BootInstant::from_nanos(deadline))
    }

    /// Released (or being released), or lost (its local deadline checked now).
    pub(super) fn ending_or_lost(&self) -> bool {
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

impl HoldRuntime {
    /// Starts the runtime of a granted hold, without its watchdog (see
    /// [`super::watchdog::start_watched`]).
    pub(super) fn start(grant: HoldGrant, backend: impl Backend) -> Arc<HoldRuntime> {
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
        // The handle's own lease was checked when it was granted.
        let lease = match lease {
            Some(lease) => crate::contract::Lease::new(lease)?.get(),
            None => self.lease(),
        };
        Ok(self.renew(lease, true).await)
    }

    /// Releases (a second call does nothing). Cancel safe: if the caller drops this future
    /// before the storage answered, the release goes on in the background, as for a dropped
    /// handle (a release is owner-checked, so sending it twice is harmless).
    pub(crate) async fn release(self: &Arc<Self>) -> Result<(), LockError> {
        // Not `release_checked`: judging the deadline reads the clock, which a plain release
        // (every engine cycle) does not need.
        if self.flag_was_set(RELEASE_STARTED) {
            return Ok(());
        }
        self.mark_released();
        let unfinished = Unfinished(Some(self.clone()));
        let released = self.backend.release(&self.core).await;
        unfinished.done();
        released.map(|_| ())
    }

    /// Releases; whether the hold was still ours until then: not lost, and the storage still
    /// had it under our owner (see [`Releasing`]). A second call answers from the state.
    /// Cancel safe as [`Self::release`].
    pub(crate) async fn release_checked(self: &Arc<Self>) -> Result<bool, LockError> {
        if self.flag_was_set(RELEASE_STARTED) {
            return Ok(self.state() != LOST);
        }
        let lost = self.check_deadline();
        self.mark_released();
        let unfinished = Unfinished(Some(self.clone()));
        let ours = self.backend.release(&self.core).await;
        unfinished.done();
        Ok(ours? && !lost)
    }

    /// The handle was dropped: release in the background unless already released.
    pub(crate) fn dropped(self: &Arc<Self>) {
        if self.flag_was_set(RELEASE_STARTED) {
            return;
        }
        self.mark_released();
        self.release_in_background();
    }

    /// Sends the release from a task of its own (without a runtime, the hold simply lapses at
    /// its lease).
    fn release_in_background(self: &Arc<Self>) {
        let shared = self.clone();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = shared.backend.release(&shared.core).await {
                    tracing::warn!(error = %e, "background release of a lock handle failed");
                }
            });
        }
    }
}

/// A release in flight: dropped before [`Unfinished::done`] (its caller's future was
/// cancelled), it sends the release again from the background, so a cancelled `release()`
/// never leaves the hold to lapse at its lease.
struct Unfinished(Option<Arc<HoldRuntime>>);

impl Unfinished {
    fn done(mut self) {
        self.0 = None;
    }
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.release_in_background();
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

    /// A holder whose machine was suspended past its lease wakes knowing it lost the lock:
    /// tokio's monotonic clock stood still, so a deadline kept on it would still be ahead.
    /// `is_lost()` sees it at once, `lost()` within [`super::grant::SUSPEND_CHECK`].
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
        tokio::time::timeout(
            super::super::grant::SUSPEND_CHECK + Duration::from_millis(500),
            lost,
        )
        .await
        .expect("lost() must fire within SUSPEND_CHECK of the resume");
    }
}
