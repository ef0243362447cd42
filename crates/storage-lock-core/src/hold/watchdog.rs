//! Auto-renewal: a task per handle for providers outside the engine, and the engine's
//! [`Watchdogs`], one timer structure for all of its auto-renewed handles.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use super::HoldGrant;
use super::HoldRuntime;
use super::RenewalResult;
use super::grant::{SUSPEND_CHECK, wake_for};
use super::io::Backend;
use super::state::TIMER_STARTED;
use crate::clock::BootInstant;
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

/// Starts the runtime of a granted hold and, with auto-renew, its watchdog: an entry in
/// `watchdogs` (the engine's handles), else a task of its own.
pub(crate) fn start_watched(
    grant: HoldGrant,
    backend: impl Backend,
    watchdogs: Option<&Watchdogs>,
) -> Arc<HoldRuntime> {
    let auto_renew = grant.auto_renew;
    let shared = HoldRuntime::start(grant, backend);
    if let Some(every) = auto_renew {
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
/// * One scheduler per engine and tokio runtime (see `hold::per_runtime`): a hold is
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::clock::suspend::sleep_machine;
    use crate::{AcquireOptions, MemoryStorage, StorageLock, Wait};

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
}
