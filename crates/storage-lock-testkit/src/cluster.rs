//! Contention across a fault: clients of one replicated store take turns on one lock while a
//! test kills, stops or restarts members of the store, and the check that exclusion and fencing
//! held throughout.
//!
//! [`contention_survives`] is the check; the fault is the caller's (`SIGKILL` of an etcd leader,
//! `SIGSTOP` of a member, …), started and stopped on processes the test owns.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use storage_lock_core::{AcquireOptions, FencedResource, LockHandle, Storage, StorageLock, Wait};
use tokio::sync::Mutex;
use tokio::time::{Instant, sleep};

/// What [`contention_survives`] saw.
#[derive(Debug, Clone, Default)]
pub struct ContentionReport {
    /// Critical sections entered before the fault completed.
    pub before: u64,
    /// Critical sections entered after it.
    pub after: u64,
    /// Holds that turned lost inside their critical section (renewals failed during the fault).
    pub lost: u64,
    /// Acquisitions that failed with a storage error (expected while members are down).
    pub errors: u64,
}

/// Shared by the contenders: a multi-step critical section whose steps are non-atomic
/// read-modify-writes, a flag for "someone is inside", and a fenced resource.
#[derive(Default)]
struct Section {
    inside: AtomicBool,
    overlaps: AtomicUsize,
    value: AtomicU64,
    steps: AtomicU64,
    fenced: FencedResource<u64>,
    /// Tokens in the order their holders entered.
    order: Mutex<Vec<u64>>,
}

impl Section {
    /// Up to `steps` steps, each a fenced write and a non-atomic increment; the holder leaves as
    /// soon as its handle says lost. Returns whether it was lost inside.
    async fn run(&self, handle: &LockHandle, steps: u32) -> bool {
        if self.inside.swap(true, Ordering::SeqCst) {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        self.order.lock().await.push(handle.fencing_token());
        let mut lost = false;
        for _ in 0..steps {
            if handle.is_lost() {
                lost = true;
                break;
            }
            let _ = self.fenced.write(handle.fencing_token(), |n| *n += 1);
            let v = self.value.load(Ordering::SeqCst);
            sleep(Duration::from_millis(2)).await;
            self.value.store(v + 1, Ordering::SeqCst);
            self.steps.fetch_add(1, Ordering::SeqCst);
        }
        self.inside.store(false, Ordering::SeqCst);
        lost
    }
}

/// Runs one contender per storage in `clients` (each its own client of the store: its own
/// connections, watch and hints) on one lock name until `fault` has completed and every
/// contender has entered the critical section `after_fault` more times between them; then
/// checks that no two critical sections overlapped, no lost update happened, no stale token
/// reached the fenced resource, and the tokens rose strictly in the order holders entered.
///
/// Holds are short-leased (2 s, renewed every 300 ms) and each critical section takes about
/// 20 steps of 2 ms, so a fault that stops renewals mid-section is caught by a holder that
/// must leave (lost) before anyone else may enter.
///
/// # Panics
/// When a check fails, or if the contenders make no progress within 120 s after the fault.
pub async fn contention_survives<S, F>(
    clients: Vec<S>,
    fault: F,
    after_fault: u64,
) -> ContentionReport
where
    S: Storage,
    F: Future<Output = ()>,
{
    let name = format!("cluster-{:016x}", rand::random::<u64>());
    let section = Arc::new(Section::default());
    let stop = Arc::new(AtomicBool::new(false));
    let faulted = Arc::new(AtomicBool::new(false));
    let (before, after, lost, errors) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let mut tasks = Vec::new();
    for storage in clients {
        let lock = StorageLock::new(storage).expect("a lock over the storage");
        let (name, section, stop, faulted) =
            (name.clone(), section.clone(), stop.clone(), faulted.clone());
        let (before, after, lost, errors) =
            (before.clone(), after.clone(), lost.clone(), errors.clone());
        tasks.push(tokio::spawn(async move {
            let opts = AcquireOptions::default()
                .wait(Wait::For(Duration::from_secs(5)))
                .lease(Duration::from_secs(2))
                .auto_renew(Duration::from_millis(300));
            while !stop.load(Ordering::SeqCst) {
                match lock.try_acquire(&name, &opts).await {
                    Ok(Some(handle)) => {
                        let was_faulted = faulted.load(Ordering::SeqCst);
                        if section.run(&handle, 20).await {
                            lost.fetch_add(1, Ordering::SeqCst);
                        }
                        if was_faulted {
                            after.fetch_add(1, Ordering::SeqCst);
                        } else {
                            before.fetch_add(1, Ordering::SeqCst);
                        }
                        let _ = handle.release().await;
                    }
                    Ok(None) => {}
                    Err(_) => {
                        errors.fetch_add(1, Ordering::SeqCst);
                        sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        }));
    }
    // Contention first, then the fault while it goes on.
    let started = Instant::now();
    while before.load(Ordering::SeqCst) < 5 {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no contender got the lock before the fault"
        );
        sleep(Duration::from_millis(20)).await;
    }
    fault.await;
    faulted.store(true, Ordering::SeqCst);
    let recovered = Instant::now();
    while after.load(Ordering::SeqCst) < after_fault {
        assert!(
            recovered.elapsed() < Duration::from_secs(120),
            "the contenders made {} grants in 120 s after the fault",
            after.load(Ordering::SeqCst)
        );
        sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.expect("a contender panicked");
    }

    assert_eq!(
        section.overlaps.load(Ordering::SeqCst),
        0,
        "critical sections overlapped"
    );
    assert_eq!(
        section.value.load(Ordering::SeqCst),
        section.steps.load(Ordering::SeqCst),
        "an update was lost: two holders were inside at once"
    );
    assert_eq!(
        section.fenced.rejected(),
        0,
        "a stale fencing token reached the resource"
    );
    let order = section.order.lock().await.clone();
    for pair in order.windows(2) {
        assert!(
            pair[1] > pair[0],
            "token {} entered after {}: tokens must rise in the order holders enter ({order:?})",
            pair[1],
            pair[0]
        );
    }
    ContentionReport {
        before: before.load(Ordering::SeqCst),
        after: after.load(Ordering::SeqCst),
        lost: lost.load(Ordering::SeqCst),
        errors: errors.load(Ordering::SeqCst),
    }
}

/// `lone`, a client that reaches only a member cut off from the majority, is granted nothing
/// while `cut` lasts (each attempt waits up to 3 s and must end in an error or "busy"); after
/// `heal` it is granted the lock within 60 s.
///
/// # Panics
/// When the cut-off client is granted the lock, or the healed one is not.
pub async fn a_minority_grants_nothing<S, C, H>(lone: S, cut: C, heal: H)
where
    S: Storage,
    C: Future<Output = ()>,
    H: Future<Output = ()>,
{
    let lock = StorageLock::new(lone).expect("a lock over the storage");
    let name = format!("minority-{:016x}", rand::random::<u64>());
    let opts = AcquireOptions::default()
        .wait(Wait::For(Duration::from_secs(3)))
        .lease(Duration::from_secs(5));
    cut.await;
    for attempt in 0..3 {
        if let Ok(Some(h)) = lock.try_acquire(&name, &opts).await {
            panic!(
                "attempt {attempt}: a member without a quorum granted the lock (token {})",
                h.fencing_token()
            );
        }
    }
    heal.await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match lock.try_acquire(&name, &opts).await {
            Ok(Some(h)) => {
                let _ = h.release().await;
                return;
            }
            other => assert!(
                Instant::now() < deadline,
                "the healed member grants nothing: {:?}",
                other.map(|h| h.is_some())
            ),
        }
    }
}
