//! The lock semantics suite: the [`DistributedLock`] contract over a [`StorageLock`] on the
//! given storage. Cases named `matrix_*` are the rows of the contract's semantics matrix,
//! `checklist_*` the provider checklist; the rest cover the engine's extras.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use storage_lock_core::StorageExt;
use storage_lock_core::fault::{FaultyStorage, Op};
use storage_lock_core::{
    AcquireOptions, AcquireRequest, Capabilities, DistributedLock, LockError, LockEventKind,
    LockHandle, LockRecord, OwnerId, RenewRequest, RenewalResult, Storage, StorageLock, TimeSource,
    Timestamp, Wait,
};
use tokio::time::{Instant, timeout};
use tokio_util::sync::CancellationToken;

use crate::{OverlapDetector, cas, unique_prefix};

fn locks<S: Storage>(s: S) -> StorageLock<S> {
    StorageLock::new(s).expect("storage passes the capability gate")
}

fn opts(wait: Wait, lease: Duration) -> AcquireOptions {
    AcquireOptions::default().wait(wait).lease(lease)
}

/// Waits (up to 60 s: a loaded machine) until the engine behind `rx` reports `kind` for `key`:
/// a test synchronises on the event instead of sleeping for it.
pub(crate) async fn until_event(
    rx: &mut tokio::sync::broadcast::Receiver<storage_lock_core::LockEvent>,
    key: &str,
    kind: LockEventKind,
) {
    let wait = async {
        loop {
            match rx.recv().await {
                Ok(e) if e.kind == kind && &*e.key == key => return,
                Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(e) => panic!("the engine's events ended: {e}"),
            }
        }
    };
    timeout(Duration::from_secs(60), wait)
        .await
        .unwrap_or_else(|_| panic!("no {kind:?} event for {key} within 60 s"));
}

async fn hold(l: &impl DistributedLock, name: &str, lease: Duration) -> LockHandle {
    l.try_acquire(name, &opts(Wait::Never, lease))
        .await
        .unwrap()
        .expect("lock should be free")
}

/// Busy and out of wait budget is `Ok(None)` — at once for `Wait::Never`, after the budget for
/// `Wait::For`.
pub async fn matrix_busy_until_wait_runs_out_returns_none<S: Storage>(s: S) {
    let l = locks(s);
    let name = unique_prefix("busy");
    let _h = hold(&l, &name, Duration::from_secs(30)).await;
    assert!(
        l.try_acquire(&name, &AcquireOptions::default())
            .await
            .unwrap()
            .is_none()
    );
    let start = Instant::now();
    let r = l
        .try_acquire_for(&name, Duration::from_millis(200))
        .await
        .unwrap();
    assert!(r.is_none());
    assert!(start.elapsed() >= Duration::from_millis(200));
}

/// A cancelled wait ends with [`LockError::Cancelled`] (or a dropped future); the holder keeps
/// its lock.
pub async fn matrix_cancelled_wait_leaves_holder_intact<S: Storage>(s: S) {
    let l = locks(s);
    let name = unique_prefix("cancel");
    let h = hold(&l, &name, Duration::from_secs(30)).await;
    let cancel = CancellationToken::new();
    let mut events = l.subscribe();
    let waiter = {
        let (l, name, cancel) = (l.clone(), name.clone(), cancel.clone());
        tokio::spawn(async move {
            l.try_acquire(
                &name,
                &opts(Wait::Forever, Duration::from_secs(30)).cancel(cancel),
            )
            .await
        })
    };
    // Cancelled while it waits, not before it started.
    until_event(&mut events, &name, LockEventKind::Contended).await;
    cancel.cancel();
    let result = timeout(Duration::from_secs(5), waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(result, Err(LockError::Cancelled)), "{result:?}");
    // Dropping the future is the other way to cancel.
    let dropped = timeout(
        Duration::from_millis(50),
        l.try_acquire(&name, &opts(Wait::Forever, Duration::from_secs(30))),
    )
    .await;
    assert!(dropped.is_err());
    assert!(!h.is_lost());
    assert!(matches!(
        h.try_renew(None).await.unwrap(),
        RenewalResult::Renewed { .. }
    ));
    // A token cancelled up front stops before any attempt.
    let pre = CancellationToken::new();
    pre.cancel();
    let r = l
        .try_acquire(
            &unique_prefix("free"),
            &AcquireOptions::default().cancel(pre),
        )
        .await;
    assert!(matches!(r, Err(LockError::Cancelled)));
}

/// Empty, blank, over-long and control-character names are [`LockError::InvalidName`], raised
/// before any storage call.
pub async fn matrix_blank_name_rejected_before_storage<S: Storage>(s: S) {
    let faulty = Arc::new(FaultyStorage::new(s));
    let l = StorageLock::builder_arc(faulty.clone()).build().unwrap();
    let long = "x".repeat(storage_lock_core::MAX_NAME_LEN + 1);
    for name in ["", "   ", "\t\n", long.as_str(), "a\u{1f}b", "line\nbreak"] {
        let r = l.try_acquire(name, &AcquireOptions::default()).await;
        assert!(
            matches!(r, Err(LockError::InvalidName { .. })),
            "{name:?}: {r:?}"
        );
    }
    assert_eq!(
        faulty.total_calls(),
        0,
        "a storage call happened before validation"
    );
    let p = unique_prefix("maxlen");
    let max = p.clone() + &"y".repeat(storage_lock_core::MAX_NAME_LEN - p.len());
    assert!(
        l.try_acquire(&max, &AcquireOptions::default())
            .await
            .unwrap()
            .is_some()
    );
}

/// Zero lease, zero auto-renew, and auto-renew ≥ lease are [`LockError::InvalidOptions`], raised
/// before any storage call; so is renewing with a zero lease.
pub async fn matrix_invalid_options_rejected_before_storage<S: Storage>(s: S) {
    let faulty = Arc::new(FaultyStorage::new(s));
    let l = StorageLock::builder_arc(faulty.clone()).build().unwrap();
    let name = unique_prefix("options");
    let bad = [
        AcquireOptions::default().lease(Duration::ZERO),
        AcquireOptions::default().auto_renew(Duration::ZERO),
        AcquireOptions::default()
            .lease(Duration::from_secs(1))
            .auto_renew(Duration::from_secs(1)),
        AcquireOptions::default()
            .lease(Duration::from_secs(1))
            .auto_renew(Duration::from_secs(2)),
    ];
    for o in &bad {
        let r = l.try_acquire(&name, o).await;
        assert!(
            matches!(r, Err(LockError::InvalidOptions { .. })),
            "{o:?}: {r:?}"
        );
    }
    assert_eq!(faulty.total_calls(), 0);
    let h = hold(&l, &name, Duration::from_secs(30)).await;
    let before = faulty.calls(Op::Renew);
    let r = h.try_renew(Some(Duration::ZERO)).await;
    assert!(matches!(r, Err(LockError::InvalidOptions { .. })), "{r:?}");
    assert_eq!(faulty.calls(Op::Renew), before);
    assert!(!h.is_lost());
}

/// A lease that runs out turns the handle lost: `is_lost()`, `lost()` completes, `lost_token()`
/// is cancelled; the next holder gets a higher token.
pub async fn matrix_lease_expiry_marks_handle_lost<S: Storage>(s: S) {
    let l = locks(s);
    let name = unique_prefix("expiry");
    // The local deadline counts from when the request was sent, so a call slower than the lease
    // (a loaded emulator) correctly hands back a handle that is already lost. Such a run proves
    // nothing here: wait for that lease to run out and try again with a longer one.
    let mut lease = Duration::from_millis(300);
    let h = loop {
        let h = hold(&l, &name, lease).await;
        if !h.is_lost() || lease >= Duration::from_secs(8) {
            break h;
        }
        drop(h);
        tokio::time::sleep(lease).await;
        lease *= 2;
    };
    let token = h.lost_token();
    assert!(
        !h.is_lost(),
        "a {lease:?} lease was lost before the acquisition returned"
    );
    timeout(lease + Duration::from_millis(500), h.lost())
        .await
        .expect("lost() fired");
    assert!(h.is_lost());
    timeout(Duration::from_secs(1), token.cancelled())
        .await
        .expect("lost_token cancelled");
    assert_eq!(h.try_renew(None).await.unwrap(), RenewalResult::Lost);
    let next = l
        .try_acquire(&name, &opts(Wait::For(Duration::from_secs(2)), lease))
        .await
        .unwrap()
        .expect("expired lock is free");
    assert!(next.fencing_token() > h.fencing_token());
}

/// A renewal that cannot confirm the hold returns [`RenewalResult::Lost`] (not an error) and
/// turns the handle lost.
pub async fn matrix_renewal_failure_is_fail_closed<S: Storage>(s: S) {
    let faulty = Arc::new(FaultyStorage::new(s));
    let l = StorageLock::builder_arc(faulty.clone()).build().unwrap();
    let name = unique_prefix("failclosed");
    let h = hold(&l, &name, Duration::from_secs(30)).await;
    faulty.set_fail_renewals(true);
    assert_eq!(h.try_renew(None).await.unwrap(), RenewalResult::Lost);
    assert!(h.is_lost());
    timeout(Duration::from_secs(1), h.lost())
        .await
        .expect("lost() fired");
    faulty.set_fail_renewals(false);
    assert_eq!(
        h.try_renew(None).await.unwrap(),
        RenewalResult::Lost,
        "lost is terminal"
    );
    // Taken over after expiry: the storage says "not held".
    let name2 = unique_prefix("failclosed-takeover");
    let h2 = hold(&l, &name2, Duration::from_millis(200)).await;
    // Another owner takes it once the storage's clock says the lease is over.
    let _other = l
        .try_acquire(
            &name2,
            &opts(Wait::For(Duration::from_secs(60)), Duration::from_secs(30)),
        )
        .await
        .unwrap()
        .expect("taken over after the lease");
    assert_eq!(h2.try_renew(None).await.unwrap(), RenewalResult::Lost);
    assert!(h2.is_lost());
}

/// A second `release()` (and the drop after it) does no storage I/O.
pub async fn matrix_double_release_is_idempotent<S: Storage>(s: S) {
    let faulty = Arc::new(FaultyStorage::new(s));
    let l = StorageLock::builder_arc(faulty.clone()).build().unwrap();
    let h = hold(&l, &unique_prefix("idempotent"), Duration::from_secs(30)).await;
    h.release().await.unwrap();
    h.release().await.unwrap();
    drop(h);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(faulty.calls(Op::Release), 1);
}

/// Acquisitions of one key made by [`matrix_fencing_strictly_increasing_across_release_expiry_and_sweep`]:
/// `STORAGE_LOCK_FENCING_ACQUISITIONS` or 2 000 (raise it for a soak; 10 000 took five minutes
/// of CI on the S3 emulator).
fn fencing_acquisitions() -> u32 {
    std::env::var("STORAGE_LOCK_FENCING_ACQUISITIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000)
}

/// Thousands of acquisitions of one key (`STORAGE_LOCK_FENCING_ACQUISITIONS`, default 2 000), through release, expiry
/// takeover (every 250th) and sweeps (every 500th): every token is strictly greater than the
/// one before.
pub async fn matrix_fencing_strictly_increasing_across_release_expiry_and_sweep<S: Storage>(s: S) {
    let l = locks(s);
    let prefix = unique_prefix("fencing");
    let name = format!("{prefix}k");
    let sweeps = l.storage().capabilities().conditional_delete;
    let mut last = 0u64;
    for i in 0..fencing_acquisitions() {
        let expire = i % 250 == 249;
        let lease = if expire {
            Duration::from_millis(30)
        } else {
            Duration::from_secs(30)
        };
        let h = l
            .try_acquire(&name, &opts(Wait::For(Duration::from_secs(5)), lease))
            .await
            .unwrap()
            .expect("free");
        let token = h.fencing_token();
        assert!(token > last, "acquisition {i}: token {token} after {last}");
        last = token;
        if expire {
            std::mem::forget(h); // never released: the next holder takes over after expiry
        } else {
            h.release().await.unwrap();
        }
        if sweeps && i % 500 == 499 {
            l.storage().sweep(&prefix, Duration::ZERO).await.unwrap();
        }
    }
}

/// The same key twice, even from the same task, waits and times out: not reentrant.
pub async fn matrix_same_key_twice_is_not_reentrant<S: Storage>(s: S) {
    let l = locks(s);
    let name = unique_prefix("notreentrant");
    let _h = hold(&l, &name, Duration::from_secs(30)).await;
    let again = l
        .try_acquire_for(&name, Duration::from_millis(100))
        .await
        .unwrap();
    assert!(again.is_none());
}

/// [`storage_lock_core::ProviderInfo`] tells the truth about process locality.
pub async fn checklist_provider_info_reports_process_locality<S: Storage>(s: S) {
    let caps = s.capabilities();
    let name = s.name().to_owned();
    let info = locks(s).provider();
    assert_eq!(info.process_local, caps.process_local);
    assert_eq!(info.name, name);
}

/// Holding one key never blocks another.
pub async fn checklist_different_keys_do_not_block<S: Storage>(s: S) {
    let l = locks(s);
    let p = unique_prefix("keys");
    let _a = hold(&l, &format!("{p}a"), Duration::from_secs(30)).await;
    let _b = hold(&l, &format!("{p}b"), Duration::from_secs(30)).await;
}

/// Renewing a released handle returns `Lost` without I/O and without making it lost.
pub async fn checklist_released_handle_renew_returns_lost_without_state_change<S: Storage>(s: S) {
    let faulty = Arc::new(FaultyStorage::new(s));
    let l = StorageLock::builder_arc(faulty.clone()).build().unwrap();
    let h = hold(&l, &unique_prefix("released"), Duration::from_secs(30)).await;
    let token = h.lost_token();
    h.release().await.unwrap();
    assert_eq!(h.try_renew(None).await.unwrap(), RenewalResult::Lost);
    assert_eq!(faulty.calls(Op::Renew), 0);
    assert!(!h.is_lost());
    assert!(!token.is_cancelled());
    assert!(
        timeout(Duration::from_millis(50), h.lost()).await.is_err(),
        "lost() fired after release"
    );
}

/// A failure after the storage granted the lock (here: a lease too long to represent as a
/// deadline) releases the grant before returning the error.
pub async fn checklist_failure_after_grant_releases_first<S: Storage>(s: S) {
    let l = locks(s);
    let name = unique_prefix("aftergrant");
    let r = l
        .try_acquire(&name, &opts(Wait::Never, Duration::MAX))
        .await;
    assert!(matches!(r, Err(LockError::LeaseOutOfRange { .. })), "{r:?}");
    let h = l
        .try_acquire(&name, &AcquireOptions::default())
        .await
        .unwrap();
    assert!(h.is_some(), "the failed grant was left held");
}

/// `expires_at()` is the storage clock at acquisition plus the lease, and moves on renewal.
pub async fn checklist_expires_at_is_storage_clock_plus_lease<S: Storage>(s: S) {
    let l = locks(s);
    let lease = Duration::from_secs(20);
    let before = l.storage().now().await.unwrap().to_system_time().unwrap();
    let h = hold(&l, &unique_prefix("expires"), lease).await;
    let after = l.storage().now().await.unwrap().to_system_time().unwrap();
    let slack = Duration::from_millis(5);
    assert!(h.expires_at() + slack >= before + lease && h.expires_at() <= after + lease + slack);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let first = h.expires_at();
    let RenewalResult::Renewed { expires_at } =
        h.try_renew(Some(Duration::from_secs(40))).await.unwrap()
    else {
        panic!("renewal failed")
    };
    // Renewed by 40 s a moment after a 20 s hold began: about 20 s later than before.
    assert!(
        expires_at >= first + Duration::from_secs(19)
            && expires_at >= after + Duration::from_secs(39)
            && expires_at <= SystemTime::now() + Duration::from_secs(40) + slack,
        "{first:?} → {expires_at:?}"
    );
    assert_eq!(h.expires_at(), expires_at);
    assert!(h.expires_at() > SystemTime::now());
}

/// A storage without linearizable CAS or without a time source is refused unless the caller
/// opts out explicitly.
pub async fn checklist_unsafe_storage_is_refused<S: Storage>(s: S) {
    let faulty = Arc::new(FaultyStorage::new(s));
    let real = faulty.capabilities();
    let weak: [Capabilities; 2] = [
        real.with_linearizable_cas(false),
        real.with_time_source(TimeSource::None),
    ];
    for caps in weak {
        faulty.set_capabilities(Some(caps));
        let r = StorageLock::builder_arc(faulty.clone()).build();
        assert!(matches!(r, Err(LockError::Unsafe { .. })), "{caps:?}");
        assert!(
            StorageLock::builder_arc(faulty.clone())
                .skip_capability_check()
                .build()
                .is_ok()
        );
    }
}

/// With auto-renew, a hold outlives several leases; others stay out until it is released.
pub async fn watchdog_keeps_lock_past_several_leases<S: Storage>(s: S) {
    let l = locks(s);
    let name = unique_prefix("watchdog");
    // Leases short enough to pass several, long enough for a loaded two-core machine (this
    // case runs next to `watchdog_batches_renewals_of_many_holds`).
    let lease = Duration::from_millis(1200);
    let h = l
        .try_acquire(
            &name,
            &opts(Wait::Never, lease).auto_renew(Duration::from_millis(300)),
        )
        .await
        .unwrap()
        .unwrap();
    let first_expiry = h.expires_at();
    tokio::time::sleep(lease * 3).await;
    assert!(!h.is_lost());
    assert!(h.expires_at() > first_expiry);
    assert!(
        l.try_acquire(&name, &AcquireOptions::default())
            .await
            .unwrap()
            .is_none()
    );
    h.release().await.unwrap();
    assert!(
        l.try_acquire(&name, &AcquireOptions::default())
            .await
            .unwrap()
            .is_some()
    );
}

/// With auto-renew and the storage unreachable, the handle turns lost no later than its local
/// deadline (fail-closed), without panicking; after the storage is back, acquisitions work.
pub async fn watchdog_outage_turns_handle_lost_by_local_deadline<S: Storage>(s: S) {
    let faulty = Arc::new(FaultyStorage::new(s));
    let l = StorageLock::builder_arc(faulty.clone()).build().unwrap();
    let name = unique_prefix("outage");
    let lease = Duration::from_millis(400);
    let h = l
        .try_acquire(
            &name,
            &opts(Wait::Never, lease).auto_renew(Duration::from_millis(100)),
        )
        .await
        .unwrap()
        .unwrap();
    let cut = Instant::now();
    faulty.set_outage(true);
    // The local deadline is at most `lease` after the acquisition was sent, which was before
    // `cut`: from then on the handle says lost, whatever the load (`is_lost` reads the clock;
    // only the wake-up of `lost()` waits for a timer, so it gets a loaded machine's slack).
    tokio::time::sleep_until(cut + lease).await;
    assert!(h.is_lost(), "not lost at its local deadline");
    timeout(Duration::from_secs(5), h.lost())
        .await
        .expect("lost() fired");
    faulty.set_outage(false);
    let next = l
        .try_acquire(&name, &opts(Wait::For(Duration::from_secs(2)), lease))
        .await
        .unwrap()
        .expect("acquirable after the outage");
    assert!(next.fencing_token() > h.fencing_token());
}

/// Holds in the batched-watchdog case.
pub const BATCHED_HOLDS: usize = 300;

/// [`BATCHED_HOLDS`] auto-renewed holds on one engine live through two leases: none is lost,
/// and their renewals reach the storage as `renew_many` calls carrying many keys each (counted
/// by the call-counting wrapper), never as one `renew` per key.
///
/// On a storage too slow to renew that many in a fraction of a second (an emulator), fewer
/// holds (at least 32) and a longer lease: one round of renewals must stay under ~150 ms, or it
/// starves the cases running next to this one on the same server, and the lease is at least
/// eight probe rounds and 4 s. The speed is judged by one `renew_many` of 32 probe keys.
pub async fn watchdog_batches_renewals_of_many_holds<S: Storage>(s: S) {
    let faulty = Arc::new(FaultyStorage::new(s));
    let l = StorageLock::builder_arc(faulty.clone()).build().unwrap();
    let name = unique_prefix("batched");
    let probe_owner = OwnerId::random();
    let probe_keys: Vec<String> = (0..32).map(|i| format!("{name}probe-{i}")).collect();
    let req = AcquireRequest {
        owner: probe_owner,
        lease: Duration::from_secs(30),
        holder: None,
        reentrant: false,
    };
    for k in &probe_keys {
        faulty.inner().acquire_once(k, &req).await.unwrap();
    }
    let renewals: Vec<RenewRequest<'_>> = probe_keys
        .iter()
        .map(|k| RenewRequest {
            key: k,
            owner: probe_owner,
            lease: Duration::from_secs(30),
        })
        .collect();
    let probe = Instant::now();
    faulty.inner().renew_many(&renewals).await.unwrap();
    let per_hold = probe.elapsed() / 32;
    for k in &probe_keys {
        faulty.inner().release(k, probe_owner).await.unwrap();
    }
    let holds = usize::try_from(Duration::from_millis(150).as_nanos() / per_hold.as_nanos().max(1))
        .unwrap_or(BATCHED_HOLDS)
        .clamp(32, BATCHED_HOLDS);
    eprintln!("{holds} holds ({per_hold:?} per key in a probe renew_many)");
    // Room for a loaded machine: a round may take several times the probe's (a 1.5 s lease
    // lost holds on the S3 emulator while a hundred other cases ran beside this one).
    let lease = (per_hold * holds as u32 * 8).max(Duration::from_secs(4));
    let every = lease / 3;
    let o = opts(Wait::Never, lease).auto_renew(every);
    let start = Instant::now();
    let mut handles = Vec::with_capacity(holds);
    let names: Vec<String> = (0..holds).map(|i| format!("{name}{i}")).collect();
    for chunk in names.chunks(16) {
        let acquired =
            futures_util::future::join_all(chunk.iter().map(|n| l.try_acquire(n, &o))).await;
        handles.extend(acquired.into_iter().map(|h| h.unwrap().expect("free")));
    }
    tokio::time::sleep(lease * 2).await;
    let elapsed = start.elapsed();
    for (i, h) in handles.iter().enumerate() {
        assert!(!h.is_lost(), "hold {i} was lost");
    }
    for (i, n) in names.iter().enumerate().step_by(50) {
        assert!(
            l.try_acquire(n, &AcquireOptions::default())
                .await
                .unwrap()
                .is_none(),
            "hold {i} is not held in the storage"
        );
    }
    let (single, batched) = (faulty.calls(Op::Renew), faulty.calls(Op::RenewMany));
    // One renewal per hold per period, at most: one `renew` per key would be this many calls.
    let rounds = elapsed.as_secs_f64() / every.as_secs_f64() + 1.0;
    let per_key_calls = rounds * holds as f64;
    assert_eq!(single, 0, "the watchdog renewed key by key");
    assert!(batched > 0);
    assert!(
        (batched as f64) * 10.0 <= per_key_calls,
        "{batched} renew_many calls in {elapsed:?} for {holds} holds: fewer than 10 keys per call"
    );
    for h in handles {
        h.release().await.unwrap();
    }
}

/// The reentrant API counts levels per owner and keeps one fencing token for all of them.
pub async fn reentrant_counts_levels_and_keeps_token<S: Storage>(s: S) {
    let l = locks(s);
    let name = unique_prefix("reentrant");
    let (a, b) = (OwnerId::random(), OwnerId::random());
    let o = AcquireOptions::default();
    let one = l.lock_reentrant(&name, a, &o).await.unwrap().unwrap();
    let two = l.lock_reentrant(&name, a, &o).await.unwrap().unwrap();
    assert_eq!((one.count, two.count), (1, 2));
    assert_eq!(one.fencing_token, two.fencing_token);
    assert_eq!(
        l.fencing_token(&name, a).await.unwrap(),
        Some(one.fencing_token)
    );
    assert_eq!(l.fencing_token(&name, b).await.unwrap(), None);
    assert!(l.lock_reentrant(&name, b, &o).await.unwrap().is_none());
    assert!(
        l.renew_reentrant(&name, a, Duration::from_secs(10))
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        l.renew_reentrant(&name, b, Duration::from_secs(10))
            .await
            .unwrap()
            .is_none()
    );
    // The one lease rule (`Lease`) holds here too: a lease past the year 9999 is refused
    // before any storage call, not turned into "not held".
    assert!(matches!(
        l.renew_reentrant(&name, a, Duration::MAX).await,
        Err(LockError::LeaseOutOfRange { .. })
    ));
    assert_eq!(l.unlock_reentrant(&name, a).await.unwrap(), 1);
    assert!(l.lock_reentrant(&name, b, &o).await.unwrap().is_none());
    assert_eq!(l.unlock_reentrant(&name, a).await.unwrap(), 0);
    assert!(matches!(
        l.unlock_reentrant(&name, a).await,
        Err(LockError::NotHeld { .. })
    ));
    let other = l.lock_reentrant(&name, b, &o).await.unwrap().unwrap();
    // The next token, or above the shared fencing floor if a sweep elsewhere raised it.
    crate::conformance::assert_next_token(
        l.storage().as_ref(),
        one.fencing_token,
        other.fencing_token,
    )
    .await;
    let r = l
        .lock_reentrant(&name, b, &o.clone().auto_renew(Duration::from_secs(1)))
        .await;
    assert!(matches!(r, Err(LockError::InvalidOptions { .. })));
}

/// Tasks contending for one lock never overlap: checked by an [`OverlapDetector`] (non-atomic
/// read-modify-write and a fenced resource), not by a synchronised counter.
pub async fn mutual_exclusion_under_contention<S: Storage>(s: S) {
    const TASKS: u64 = 8;
    const ROUNDS: u64 = 40;
    let l = locks(s);
    let name = unique_prefix("exclusion");
    let detector = Arc::new(OverlapDetector::new());
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (l, name, detector) = (l.clone(), name.clone(), detector.clone());
            tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let h = l
                        .try_acquire(&name, &opts(Wait::Forever, Duration::from_secs(30)))
                        .await
                        .unwrap()
                        .unwrap();
                    detector.critical_section(h.fencing_token()).await;
                    h.release().await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        timeout(Duration::from_secs(120), t).await.unwrap().unwrap();
    }
    detector.assert_exclusive(TASKS * ROUNDS);
}

/// Thousands of acquire futures dropped at random points (before, during and after the storage
/// call) leave no holder behind once the background releases have run: the lock is free again
/// long before any of their 30 s leases could lapse.
pub async fn cancel_safety_dropped_acquires_leave_no_holder<S: Storage>(s: S) {
    let faulty = Arc::new(FaultyStorage::new(s));
    let l = StorageLock::builder_arc(faulty.clone()).build().unwrap();
    let name = unique_prefix("cancelsafety");
    let o = opts(
        Wait::For(Duration::from_millis(20)),
        Duration::from_secs(30),
    );
    let mut acquired = 0;
    for i in 0..2_000u32 {
        let fut = l.try_acquire(&name, &o);
        tokio::select! {
            biased;
            () = drop_point(i) => {}
            r = fut => {
                if let Some(h) = r.unwrap() {
                    acquired += 1;
                    if i % 2 == 0 { h.release().await.unwrap() } // else dropped: background release
                }
            }
        }
    }
    assert!(
        acquired > 0,
        "no acquisition ever completed; the test exercised nothing"
    );
    // Every grant was made with a 30 s lease. A leaked one would keep the lock busy far longer
    // than the 5 s we wait here; abandoned grants are released as soon as they land.
    let start = Instant::now();
    let h = l
        .try_acquire(
            &name,
            &opts(Wait::For(Duration::from_secs(5)), Duration::from_secs(30)),
        )
        .await
        .unwrap();
    assert!(h.is_some(), "a dropped acquisition left the lock held");
    assert!(start.elapsed() < Duration::from_secs(5));
}

pub(crate) async fn drop_point(i: u32) {
    match i % 10 {
        0 => std::future::pending().await,
        1..=5 => {
            for _ in 0..rand::random::<u32>() % 12 {
                tokio::task::yield_now().await;
            }
        }
        _ => tokio::time::sleep(Duration::from_micros(rand::random::<u64>() % 4_000)).await,
    }
}

/// A waiter gets the lock soon after the holder releases it (not at the holder's expiry), with
/// the next fencing token.
pub async fn handoff_on_release<S: Storage>(s: S) {
    let s = Arc::new(s);
    let l = locks(s.clone());
    let name = unique_prefix("handoff");
    let h = hold(&l, &name, Duration::from_secs(60)).await;
    let mut events = l.subscribe();
    let waiter = {
        let (l, name) = (l.clone(), name.clone());
        tokio::spawn(async move {
            l.try_acquire(
                &name,
                &opts(Wait::For(Duration::from_secs(30)), Duration::from_secs(30)),
            )
            .await
            .unwrap()
            .map(|h| (h.fencing_token(), Instant::now()))
        })
    };
    // Released while the waiter waits (it found the lock busy).
    until_event(&mut events, &name, LockEventKind::Contended).await;
    let released = Instant::now();
    h.release().await.unwrap();
    let (token, got) = timeout(Duration::from_secs(5), waiter)
        .await
        .expect("hand-off took longer than 5 s")
        .unwrap()
        .expect("waiter acquired");
    crate::conformance::assert_next_token(&s, h.fencing_token(), token).await;
    assert!(got.duration_since(released) < Duration::from_secs(2));
}

/// A waiter whose holder never releases gets the lock when the holder's lease runs out, well
/// before its own wait budget.
pub async fn waiter_acquires_when_holder_expires<S: Storage>(s: S) {
    let l = locks(s);
    let name = unique_prefix("expirywait");
    let h = hold(&l, &name, Duration::from_millis(300)).await;
    std::mem::forget(h);
    let start = Instant::now();
    let got = l
        .try_acquire(
            &name,
            &opts(Wait::For(Duration::from_secs(10)), Duration::from_secs(30)),
        )
        .await
        .unwrap();
    assert!(got.is_some());
    // At the holder's expiry (0.3 s), not at the end of the 10 s budget: the bound leaves a
    // loaded machine room and still tells the two apart.
    assert!(
        start.elapsed() < Duration::from_secs(8),
        "{:?}",
        start.elapsed()
    );
}

/// Dropping an unreleased handle releases it in the background.
pub async fn dropped_handle_releases_in_background<S: Storage>(s: S) {
    let l = locks(s);
    let name = unique_prefix("drop");
    drop(hold(&l, &name, Duration::from_secs(60)).await);
    let start = Instant::now();
    let got = l
        .try_acquire_for(&name, Duration::from_secs(10))
        .await
        .unwrap();
    assert!(got.is_some());
    // Released in the background at once, not at the 60 s lease (nor the 10 s budget).
    assert!(
        start.elapsed() < Duration::from_secs(8),
        "{:?}",
        start.elapsed()
    );
}

/// Listeners see acquired, contended, timed out, renewed, released and lost events.
pub async fn events_are_emitted<S: Storage>(s: S) {
    let l = locks(s);
    let mut rx = l.subscribe();
    let name = unique_prefix("events");
    let h = hold(&l, &name, Duration::from_secs(30)).await;
    assert!(
        l.try_acquire(&name, &AcquireOptions::default())
            .await
            .unwrap()
            .is_none()
    );
    h.try_renew(None).await.unwrap();
    h.release().await.unwrap();
    let short = hold(&l, &name, Duration::from_millis(100)).await;
    short.lost().await;
    let mut kinds = Vec::new();
    while let Ok(e) = rx.try_recv() {
        kinds.push(e.kind);
    }
    use LockEventKind::*;
    for k in [Acquired, Contended, TimedOut, Renewed, Released, Lost] {
        assert!(kinds.contains(&k), "missing {k:?} in {kinds:?}");
    }
}

/// A *waiting* acquisition rides out a storage outage: it retries with backoff until its wait
/// budget ends (it used to fail on the first connection error), and gets the lock once the
/// storage is back and the holder's lease ran out.
pub async fn waiting_acquire_rides_out_a_storage_outage<S: Storage>(s: S) {
    let faulty = Arc::new(FaultyStorage::new(s));
    let l = StorageLock::builder_arc(faulty.clone()).build().unwrap();
    let name = unique_prefix("outage_wait");
    let holder = hold(&l, &name, Duration::from_millis(1500)).await;
    faulty.set_outage(true);
    let waiter = {
        let (l, name) = (l.clone(), name.clone());
        tokio::spawn(async move {
            l.try_acquire(
                &name,
                &opts(Wait::For(Duration::from_secs(15)), Duration::from_secs(30)),
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        !waiter.is_finished(),
        "the waiter gave up during the outage"
    );
    faulty.set_outage(false);
    let got = timeout(Duration::from_secs(15), waiter)
        .await
        .expect("the waiter hung")
        .unwrap()
        .expect("the waiter failed instead of waiting")
        .expect("the waiter got nothing");
    assert!(got.fencing_token() > holder.fencing_token());
    got.release().await.unwrap();
}

/// A hold broken by an admin turns lost within one notification round trip on a shared
/// storage with change notifications (long before its next renewal, 50 s away here), and its
/// release says it was not ours any more (on every storage).
pub async fn a_broken_hold_is_lost_at_once_and_release_says_so<S: Storage>(s: S) {
    let l = locks(s);
    let name = unique_prefix("broken");
    let caps = l.storage().capabilities();
    let watched = caps.change_notifications && !caps.process_local;
    let o = opts(Wait::Never, Duration::from_secs(60)).auto_renew(Duration::from_secs(50));
    let h = l.try_acquire(&name, &o).await.unwrap().expect("free");
    let broken = Instant::now();
    l.storage().force_release(h.key()).await.unwrap();
    if watched {
        timeout(Duration::from_secs(30), h.lost())
            .await
            .expect("the broken hold was not noticed before its next renewal");
        eprintln!("broken -> lost in {:?}", broken.elapsed());
    }
    assert!(
        !h.release_checked().await.unwrap(),
        "release said the broken hold was still ours"
    );
    let next = hold(&l, &name, Duration::from_secs(5)).await;
    assert!(next.fencing_token() > h.fencing_token());
    assert!(
        next.release_checked().await.unwrap(),
        "an intact hold is ours"
    );
}

/// Storage errors during a wait do not shorten the grant that ends it: the grant's local
/// deadline counts from its own request, not from the earlier failed one (it did, so a
/// waiter that saw one error got a hold that was already lost, and `run` stopped its command at
/// once). The holder keeps the key for longer than the waiter's lease after the outage.
pub async fn grant_after_storage_errors_keeps_its_full_lease<S: Storage>(s: S) {
    let faulty = Arc::new(FaultyStorage::new(s));
    let l = StorageLock::builder_arc(faulty.clone()).build().unwrap();
    let name = unique_prefix("errors_then_grant");
    let holder = hold(&l, &name, Duration::from_secs(60)).await;
    let lease = Duration::from_secs(2);
    faulty.set_outage(true);
    let before = faulty.calls(Op::AcquireOnce);
    let waiter = {
        let (l, name) = (l.clone(), name.clone());
        tokio::spawn(async move {
            l.try_acquire(&name, &opts(Wait::For(Duration::from_secs(60)), lease))
                .await
        })
    };
    eventually("the waiter to fail against the outage", || {
        faulty.calls(Op::AcquireOnce) > before
    })
    .await;
    faulty.set_outage(false);
    let errors_at = Instant::now();
    let after = faulty.calls(Op::AcquireOnce);
    eventually("the waiter to find the key busy", || {
        faulty.calls(Op::AcquireOnce) > after
    })
    .await;
    // Longer than the waiter's lease since its last error, then hand over.
    tokio::time::sleep_until(errors_at + lease + lease / 2).await;
    holder.release().await.unwrap();
    let got = timeout(Duration::from_secs(30), waiter)
        .await
        .expect("the waiter hung")
        .unwrap()
        .expect("the waiter failed instead of waiting")
        .expect("the waiter got nothing");
    assert!(
        !got.is_lost() && got.time_left().is_some_and(|left| !left.is_zero()),
        "the grant was lost on arrival: its deadline counted from the storage error"
    );
    got.release().await.unwrap();
}

/// Polls `done` every 5 ms until it holds (at most 30 s: a loaded machine).
///
/// # Panics
/// If it never does.
async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let give_up = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < give_up, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// An attempt applied by the storage whose answer was lost (the connection broke on the way
/// back) is not a lock held by nobody: the next attempt finds the grant under its own owner
/// and adopts it, instead of waiting for its own lease to run out.
pub async fn grant_with_a_lost_answer_is_adopted<S: Storage>(s: S) {
    let faulty = Arc::new(FaultyStorage::new(s));
    let l = StorageLock::builder_arc(faulty.clone()).build().unwrap();
    let name = unique_prefix("lost_answer");
    faulty.lose_next_acquire_answers(1);
    let got = timeout(
        Duration::from_secs(10),
        l.try_acquire(
            &name,
            &opts(Wait::For(Duration::from_secs(5)), Duration::from_secs(60)),
        ),
    )
    .await
    .expect("hung")
    .expect("no error while the wait lasts")
    .expect("the grant whose answer was lost was not adopted");
    let stored = faulty.inner().get(got.key()).await.unwrap().unwrap();
    assert_eq!(stored.record.fencing, got.fencing_token());
    got.release().await.unwrap();
    assert!(
        l.try_acquire(&name, &opts(Wait::Never, Duration::from_secs(5)))
            .await
            .unwrap()
            .is_some(),
        "released, so free"
    );
}

/// Leases have no upper bound but the representable one: a lease of centuries works (its
/// timer is capped, nothing overflows), and a lease ending after the year 9999 is
/// [`LockError::LeaseOutOfRange`] with nothing left held (it crashed the CLI after taking the
/// lock, and left a record that broke `list` for everyone).
pub async fn huge_leases_work_or_fail_typed_without_holding<S: Storage>(s: S) {
    let l = locks(s);
    let name = unique_prefix("huge_lease");
    let centuries = Duration::from_secs(86_400 * 365 * 1000);
    let h = l
        .try_acquire(&name, &opts(Wait::Never, centuries))
        .await
        .unwrap()
        .expect("a 1000-year lease is granted");
    assert!(!h.is_lost());
    let left = h
        .expires_at()
        .duration_since(SystemTime::now())
        .unwrap_or_default();
    assert!(left > centuries - Duration::from_secs(86_400), "{left:?}");
    assert!(
        h.time_left()
            .is_some_and(|t| t > Duration::from_secs(86_400))
    );
    let absurd = Duration::from_secs(86_400 * 1_000_000_000);
    assert!(matches!(
        h.try_renew(Some(absurd)).await,
        Err(LockError::LeaseOutOfRange { .. })
    ));
    assert!(!h.is_lost(), "a refused renewal changes nothing");
    assert!(matches!(
        h.try_renew(None).await.unwrap(),
        RenewalResult::Renewed { .. }
    ));
    h.release().await.unwrap();
    let r = l.try_acquire(&name, &opts(Wait::Never, absurd)).await;
    assert!(matches!(r, Err(LockError::LeaseOutOfRange { .. })), "{r:?}");
    let r = l
        .try_acquire(&name, &opts(Wait::Never, Duration::MAX))
        .await;
    assert!(matches!(r, Err(LockError::LeaseOutOfRange { .. })), "{r:?}");
    assert!(
        l.try_acquire(&name, &opts(Wait::Never, Duration::from_secs(5)))
            .await
            .unwrap()
            .is_some(),
        "nothing may be left held"
    );
}

/// Fencing tokens stop well before the largest one the storage represents
/// ([`storage_lock_core::Capabilities::fencing_bound`]: 2^63 − 1 in a `BIGINT` column, 2^53 − 1
/// where Redis scripts count in doubles and `2^53 + 1` rounds back to a token already handed
/// out): a key whose next token would pass [`storage_lock_core::Capabilities::fencing_limit`]
/// is refused with [`LockError::FencingExhausted`] naming the key, nothing is left held, and
/// a key one token below still gets the limit itself.
pub async fn fencing_tokens_stop_well_before_the_storage_bound<S: Storage>(s: S) {
    let caps = s.capabilities();
    let (limit, bound) = (caps.fencing_limit(), caps.fencing_bound);
    assert!(limit < bound, "the limit leaves headroom");
    let l = locks(s);
    let prefix = unique_prefix("fencing_bound");
    let free_record = |fencing| LockRecord {
        owner: OwnerId::NOBODY,
        count: 0,
        fencing,
        acquired_at: Timestamp::from_millis(1),
        expires_at: Timestamp::from_millis(1),
        holder: None,
    };
    let at_limit = format!("{prefix}at-limit");
    let key = l.key_for(&at_limit).unwrap().into_owned();
    cas(l.storage())
        .create(&key, &free_record(limit))
        .await
        .unwrap();
    let r = l
        .try_acquire(&at_limit, &opts(Wait::Never, Duration::from_secs(30)))
        .await;
    match r {
        Err(LockError::FencingExhausted {
            key: k,
            fencing,
            bound: b,
        }) => {
            assert_eq!((k.as_str(), fencing, b), (key.as_str(), limit + 1, bound));
        }
        other => panic!("a token past the limit must be refused: {other:?}"),
    }
    let stored = l.storage().get(&key).await.unwrap().expect("record kept");
    let now = l.storage().now().await.unwrap();
    assert!(
        !stored.record.is_held_at(now),
        "the refused grant was released: {stored:?}"
    );
    let below = format!("{prefix}below");
    let below_key = l.key_for(&below).unwrap().into_owned();
    cas(l.storage())
        .create(&below_key, &free_record(limit - 1))
        .await
        .unwrap();
    let h = hold(&l, &below, Duration::from_secs(30)).await;
    assert_eq!(h.fencing_token(), limit, "the limit itself is granted");
    h.release().await.unwrap();
    // Leave no near-bound record behind where the storage can delete (a sweep would lift the
    // fencing floor to it).
    for k in [key, below_key] {
        if let Ok(Some(s)) = l.storage().get(&k).await {
            let _ = cas(l.storage()).delete(&k, &s.version).await;
        }
    }
}

/// A `release()` whose future is dropped before it finished (a `timeout` around it, a
/// cancelled task) still releases: the lock is free again long before its 30 s lease could
/// lapse, at every drop point, including after the request went out.
pub async fn cancelled_release_still_releases<S: Storage>(s: S) {
    let l = locks(s);
    let name = unique_prefix("cancelled-release");
    let lease = Duration::from_secs(30);
    for i in 0..40u32 {
        let h = l
            .try_acquire(&name, &opts(Wait::For(Duration::from_secs(10)), lease))
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("round {i}: a cancelled release left the lock held"));
        tokio::select! {
            biased;
            () = drop_point(i) => {}
            r = h.release() => r.unwrap(),
        }
        drop(h);
    }
    let h = l
        .try_acquire(&name, &opts(Wait::For(Duration::from_secs(10)), lease))
        .await
        .unwrap()
        .expect("a cancelled release left the lock held");
    h.release().await.unwrap();
}
