//! The lock kinds suite: multi-locks, semaphores, reader-writer locks, fair locks and leader
//! election ([`storage_lock_core::kinds`]) over a [`StorageLock`] on the given storage. Exclusion is checked as in the semantics suite, by
//! [`OverlapDetector`]s (one per name, one per permit slot), never by a synchronised counter.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use storage_lock_core::fault::FaultyStorage;
use storage_lock_core::kinds::{
    Election, FairLock, MAX_VALUE_LEN, Observed, RwLock, Semaphore, acquire_all, order_name,
    place_name, tickets_name,
};
use storage_lock_core::{
    AcquireOptions, LockError, LockEventKind, RenewalResult, Storage, StorageLock, Wait,
};
use tokio::time::{Instant, timeout};

use crate::{OverlapDetector, unique_prefix};

fn locks<S: Storage>(s: S) -> StorageLock<S> {
    StorageLock::new(s).expect("storage passes the capability gate")
}

fn opts(wait: Wait, lease: Duration) -> AcquireOptions {
    AcquireOptions::default().wait(wait).lease(lease)
}

/// Tasks take random pairs of three names, each pair in a random order, waiting without limit:
/// if the multi-lock waited while holding, two tasks taking `{a, b}` and `{b, a}` would wait on
/// each other for good (the 120 s bound fails the case); no two holders of a name overlap.
pub async fn multi_lock_in_any_order_neither_deadlocks_nor_overlaps<S: Storage>(s: S) {
    const TASKS: usize = 6;
    const ROUNDS: usize = 12;
    let l = locks(s);
    let prefix = unique_prefix("multi-order");
    let names: Vec<String> = ["a", "b", "c"]
        .iter()
        .map(|n| format!("{prefix}{n}"))
        .collect();
    let detectors: Arc<Vec<OverlapDetector>> =
        Arc::new((0..names.len()).map(|_| OverlapDetector::new()).collect());
    let sections: Arc<Vec<AtomicUsize>> =
        Arc::new((0..names.len()).map(|_| AtomicUsize::new(0)).collect());
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let (l, names, detectors, sections) = (
                l.clone(),
                names.clone(),
                detectors.clone(),
                sections.clone(),
            );
            tokio::spawn(async move {
                for r in 0..ROUNDS {
                    // Every pair in both orders, spread over tasks and rounds.
                    let skip = (t + r) % 3;
                    let mut pair: Vec<usize> = (0..3).filter(|&i| i != skip).collect();
                    if (t + r / 3) % 2 == 1 {
                        pair.reverse();
                    }
                    let asked: Vec<&str> = pair.iter().map(|&i| names[i].as_str()).collect();
                    let held =
                        acquire_all(&l, &asked, &opts(Wait::Forever, Duration::from_secs(30)))
                            .await
                            .expect("acquire_all")
                            .expect("Wait::Forever acquires");
                    let mut order: Vec<&str> = asked.clone();
                    order.sort_unstable();
                    let got: Vec<&str> = held.parts().iter().map(|p| p.name()).collect();
                    assert_eq!(got, order, "parts come sorted by name");
                    for &i in &pair {
                        let token = held
                            .part(&names[i])
                            .expect("a part per name")
                            .fencing_token();
                        detectors[i].critical_section(token).await;
                        sections[i].fetch_add(1, Ordering::Relaxed);
                    }
                    held.release().await.expect("release");
                }
            })
        })
        .collect();
    for t in tasks {
        timeout(Duration::from_secs(120), t)
            .await
            .expect("multi-locks deadlocked (or the machine stalled for 120 s)")
            .expect("task");
    }
    for (d, n) in detectors.iter().zip(sections.iter()) {
        d.assert_exclusive(n.load(Ordering::Relaxed) as u64);
    }
}

/// A multi-lock one of whose names is held takes none of them, and leaves none behind; while
/// it waits for that name it holds none of the others (never waiting while holding is what
/// keeps multi-locks free of deadlock); once the holder releases, it gets all of them.
pub async fn multi_lock_is_all_or_nothing<S: Storage>(s: S) {
    let l = locks(s);
    let prefix = unique_prefix("multi-all");
    let (a, b, c) = (
        format!("{prefix}a"),
        format!("{prefix}b"),
        format!("{prefix}c"),
    );
    let lease = Duration::from_secs(30);
    let blocker = l
        .try_acquire(&b, &opts(Wait::Never, lease))
        .await
        .unwrap()
        .expect("b is free");
    let none = acquire_all(&l, &[&c, &b, &a], &opts(Wait::Never, lease))
        .await
        .unwrap();
    assert!(
        none.is_none(),
        "b is held: the multi-lock must not be granted"
    );
    for name in [&a, &c] {
        let h = l
            .try_acquire(name, &opts(Wait::Never, lease))
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{name} was left held by a multi-lock that failed"));
        h.release().await.unwrap();
    }
    assert!(matches!(
        acquire_all(&l, &[], &opts(Wait::Never, lease)).await,
        Err(LockError::InvalidOptions { .. })
    ));
    assert!(matches!(
        acquire_all(&l, &[&a, " "], &opts(Wait::Never, lease)).await,
        Err(LockError::InvalidName { .. })
    ));
    let mut events = l.subscribe();
    let b_key = l.key_for(&b).unwrap().into_owned();
    let l2 = l.clone();
    let names = [c.clone(), b.clone(), a.clone()];
    let waiter = tokio::spawn(async move {
        let asked: Vec<&str> = names.iter().map(String::as_str).collect();
        acquire_all(
            &l2,
            &asked,
            &opts(Wait::For(Duration::from_secs(60)), lease),
        )
        .await
        .unwrap()
    });
    // The waiter found b busy in its pass without waiting (one `Contended`), released a, and
    // waits for b alone (the second): it must hold neither a nor c meanwhile.
    for _ in 0..2 {
        crate::semantics::until_event(&mut events, &b_key, LockEventKind::Contended).await;
    }
    for name in [&a, &c] {
        let h = l
            .try_acquire(name, &opts(Wait::Never, lease))
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{name} is held by a multi-lock that waits for b"));
        h.release().await.unwrap();
    }
    let blocked_token = blocker.fencing_token();
    blocker.release().await.unwrap();
    let all = timeout(Duration::from_secs(90), waiter)
        .await
        .expect("the waiting multi-lock returned")
        .unwrap()
        .expect("granted once b was released");
    let tokens = all.fencing_tokens();
    assert_eq!(
        tokens.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
        [a.as_str(), b.as_str(), c.as_str()]
    );
    assert!(tokens[1].1 > blocked_token, "b's token rose: {tokens:?}");
    all.release().await.unwrap();
}

/// A multi-lock is lost as soon as one of its parts is: an admin breaks one name, its renewal
/// fails, and the whole handle reports lost.
pub async fn multi_lock_is_lost_when_a_part_is_lost<S: Storage>(s: S) {
    let l = locks(s);
    let prefix = unique_prefix("multi-lost");
    let (a, b) = (format!("{prefix}a"), format!("{prefix}b"));
    let held = acquire_all(&l, &[&a, &b], &opts(Wait::Never, Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("both free");
    let lost = held.lost();
    assert!(!held.is_lost());
    l.force_release(&b).await.unwrap().expect("b was held");
    let part = held.part(&b).expect("b is a part");
    assert_eq!(part.try_renew(None).await.unwrap(), RenewalResult::Lost);
    assert!(held.is_lost());
    timeout(Duration::from_secs(30), lost)
        .await
        .expect("lost() completes when a part is lost");
    held.release().await.unwrap();
}

/// Tasks contend for a semaphore of 3 permits: never more than 3 holders at once and no two
/// holders of one slot overlap. (That all 3 can be out together is
/// [`semaphore_takes_k_permits_all_or_nothing`]'s check: here it depends on timing.)
pub async fn semaphore_admits_at_most_its_permits<S: Storage>(s: S) {
    const PERMITS: u32 = 3;
    const TASKS: usize = 8;
    const ROUNDS: usize = 10;
    let l = locks(s);
    let sem = Semaphore::new(&l, &unique_prefix("sem-bound"), PERMITS).unwrap();
    let detectors: Arc<Vec<OverlapDetector>> =
        Arc::new((0..PERMITS).map(|_| OverlapDetector::new()).collect());
    let sections: Arc<Vec<AtomicUsize>> =
        Arc::new((0..PERMITS).map(|_| AtomicUsize::new(0)).collect());
    // How many hold a permit now, and the most ever: a measurement, not what excludes.
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (sem, detectors, sections, inside, most) = (
                sem.clone(),
                detectors.clone(),
                sections.clone(),
                inside.clone(),
                most.clone(),
            );
            tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let permit = sem
                        .acquire(&opts(Wait::Forever, Duration::from_secs(30)))
                        .await
                        .expect("acquire")
                        .expect("Wait::Forever acquires");
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    let (slot, token) = permit.fencing_token();
                    assert!(slot < PERMITS);
                    detectors[slot as usize].critical_section(token).await;
                    sections[slot as usize].fetch_add(1, Ordering::Relaxed);
                    // Stay a moment, so permits are out together.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    permit.release().await.expect("release");
                }
            })
        })
        .collect();
    for t in tasks {
        timeout(Duration::from_secs(180), t)
            .await
            .expect("the semaphore's waiters finished")
            .expect("task");
    }
    let most = most.load(Ordering::SeqCst);
    assert!(most <= PERMITS as usize, "{most} holders at once");
    let mut total = 0;
    for (d, n) in detectors.iter().zip(sections.iter()) {
        let n = n.load(Ordering::Relaxed) as u64;
        d.assert_exclusive(n);
        total += n;
    }
    assert_eq!(total, (TASKS * ROUNDS) as u64);
}

/// A permit whose holder vanished without giving it back (a crash: its release never reaches
/// the storage) comes back when its lease ends, and the next holder of that slot gets a higher
/// token.
pub async fn semaphore_permit_of_a_crashed_holder_comes_back<S: Storage>(s: S) {
    // The crashed holder reaches the storage through a fault injector that cuts it off for
    // good; the survivor uses the storage directly. (Not `mem::forget`: that would leak the
    // storage, and its connections, for the rest of the test binary.)
    let shared = Arc::new(s);
    let cut = Arc::new(FaultyStorage::new(shared.clone()));
    let crashed_side = StorageLock::builder_arc(cut.clone()).build().unwrap();
    let l = StorageLock::builder_arc(shared).build().unwrap();
    let name = unique_prefix("sem-crash");
    let lease = Duration::from_secs(1);
    let crashed = Semaphore::new(&crashed_side, &name, 1)
        .unwrap()
        .acquire(&opts(Wait::Never, lease))
        .await
        .unwrap()
        .expect("free");
    let (slot, token) = crashed.fencing_token();
    cut.set_outage(true);
    drop(crashed); // its release fails: the permit stays out until its lease ends
    let sem = Semaphore::new(&l, &name, 1).unwrap();
    let start = Instant::now();
    let back = sem
        .acquire(&opts(Wait::For(Duration::from_secs(60)), lease))
        .await
        .unwrap()
        .expect("the crashed holder's permit came back when its lease ended");
    assert!(start.elapsed() < Duration::from_secs(60));
    let (next_slot, next_token) = back.fencing_token();
    assert_eq!(next_slot, slot);
    assert!(next_token > token, "{next_token} after {token}");
    back.release().await.unwrap();
}

/// A semaphore of a name that exists with another number of permits is refused with a typed
/// error, before it holds anything; invalid numbers are refused before any storage call.
pub async fn semaphore_with_another_limit_is_refused<S: Storage>(s: S) {
    let l = locks(s);
    let name = unique_prefix("sem-limit");
    let three = Semaphore::new(&l, &name, 3).unwrap();
    let p = three
        .acquire(&opts(Wait::Never, Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("free");
    let four = Semaphore::new(&l, &name, 4).unwrap();
    match four
        .acquire(&opts(Wait::Never, Duration::from_secs(30)))
        .await
    {
        Err(LockError::SemaphoreLimitMismatch {
            permits: 4,
            stored: 3,
            ..
        }) => {}
        other => panic!("expected SemaphoreLimitMismatch, got {other:?}"),
    }
    // The same number from another semaphore value agrees.
    let again = Semaphore::new(&l, &name, 3).unwrap();
    let q = again
        .acquire(&opts(Wait::Never, Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("2 of 3 free");
    assert_ne!(p.slot(), q.slot());
    for bad in [0, storage_lock_core::kinds::MAX_PERMITS + 1] {
        assert!(matches!(
            Semaphore::new(&l, &name, bad),
            Err(LockError::InvalidOptions { .. })
        ));
    }
    assert!(matches!(
        Semaphore::new(&l, " ", 3),
        Err(LockError::InvalidName { .. })
    ));
    p.release().await.unwrap();
    q.release().await.unwrap();
}

/// Taking k permits is all or nothing: with 2 of 3 out, taking 2 gets none and leaves the free
/// one free; taking more than the semaphore has is an error.
pub async fn semaphore_takes_k_permits_all_or_nothing<S: Storage>(s: S) {
    let l = locks(s);
    let sem = Semaphore::new(&l, &unique_prefix("sem-k"), 3).unwrap();
    let o = opts(Wait::Never, Duration::from_secs(30));
    let two = sem.acquire_many(2, &o).await.unwrap().expect("3 free");
    assert_eq!(two.parts().len(), 2);
    assert!(sem.acquire_many(2, &o).await.unwrap().is_none());
    let last = sem
        .acquire(&o)
        .await
        .unwrap()
        .expect("the failed attempt left the free permit free");
    assert!(sem.acquire(&o).await.unwrap().is_none(), "all 3 out");
    for bad in [0, 4] {
        assert!(matches!(
            sem.acquire_many(bad, &o).await,
            Err(LockError::InvalidOptions { .. })
        ));
    }
    last.release().await.unwrap();
    two.release().await.unwrap();
    let all = sem.acquire_many(3, &o).await.unwrap().expect("all 3 back");
    let slots: Vec<u32> = all.parts().iter().map(|p| p.slot()).collect();
    assert_eq!(slots, [0, 1, 2]);
    all.release().await.unwrap();
}

/// Leaders follow each other with rising terms (each term the hold's fencing token), an
/// observer reports them in term order with the vacancy between, and a busy seat is not granted
/// to a second candidate; bad values are refused before any storage call.
pub async fn election_terms_rise_and_observers_see_them_in_order<S: Storage>(s: S) {
    let l = locks(s);
    let election = Election::new(&l, &unique_prefix("election")).unwrap();
    let o = opts(Wait::Never, Duration::from_secs(30));
    for bad in ["line\nbreak".to_owned(), "x".repeat(MAX_VALUE_LEN + 1)] {
        assert!(matches!(
            election.campaign(&bad, &o).await,
            Err(LockError::InvalidOptions { .. })
        ));
    }
    let mut observer = election.observe();
    let first = timeout(Duration::from_secs(60), observer.next())
        .await
        .expect("the first next() answers at once")
        .unwrap();
    assert!(matches!(first, Observed::Vacant { .. }), "{first:?}");
    let a = election
        .campaign("a", &o)
        .await
        .unwrap()
        .expect("seat free");
    assert_eq!(a.value(), "a");
    let seen = timeout(Duration::from_secs(60), observer.next())
        .await
        .expect("the observer saw the leader")
        .unwrap();
    assert_eq!(
        seen,
        Observed::Leader {
            value: "a".into(),
            term: a.term()
        }
    );
    assert!(
        election.campaign("b", &o).await.unwrap().is_none(),
        "seat taken"
    );
    let candidate = election.clone();
    let b = tokio::spawn(async move {
        candidate
            .campaign(
                "b",
                &opts(Wait::For(Duration::from_secs(60)), Duration::from_secs(30)),
            )
            .await
    });
    a.resign().await.unwrap();
    let b = timeout(Duration::from_secs(90), b)
        .await
        .expect("b's campaign ended")
        .unwrap()
        .unwrap()
        .expect("b got the seat once a resigned");
    assert!(b.term() > a.term(), "{} after {}", b.term(), a.term());
    // Whatever the observer saw in between, it saw it in term order and ends at b.
    let mut last = (a.term(), true);
    loop {
        let next = timeout(Duration::from_secs(60), observer.next())
            .await
            .expect("the observer saw b")
            .unwrap();
        match next {
            Observed::Leader { value, term } => {
                assert!(term > last.0, "term {term} after {}", last.0);
                last = (term, true);
                if value == "b" {
                    assert_eq!(term, b.term());
                    break;
                }
            }
            Observed::Vacant { after_term } => {
                assert!(last.1, "two vacancies in a row");
                assert_eq!(after_term, last.0);
                last.1 = false;
            }
        }
    }
    assert_eq!(
        election.leader().await.unwrap(),
        Observed::Leader {
            value: "b".into(),
            term: b.term()
        }
    );
    b.resign().await.unwrap();
}

/// A leader cut off from the storage (its renewals fail) learns that it lost before the seat
/// falls vacant; the observer then reports the vacancy after its term, and the next leader's
/// term is higher.
pub async fn election_a_cut_off_leader_loses_before_the_seat_is_vacant<S: Storage>(s: S) {
    let faulty = Arc::new(FaultyStorage::new(s));
    let l = StorageLock::builder_arc(faulty.clone()).build().unwrap();
    let election = Election::new(&l, &unique_prefix("election-cut")).unwrap();
    let a = election
        .campaign("a", &opts(Wait::Never, Duration::from_secs(2)))
        .await
        .unwrap()
        .expect("seat free");
    let mut observer = election.observe();
    assert_eq!(
        observer.next().await.unwrap(),
        Observed::Leader {
            value: "a".into(),
            term: a.term()
        }
    );
    faulty.set_fail_renewals(true);
    let vacant = timeout(Duration::from_secs(60), observer.next())
        .await
        .expect("the seat fell vacant")
        .unwrap();
    assert!(
        a.is_lost(),
        "the seat fell vacant while its leader thought it led"
    );
    assert_eq!(
        vacant,
        Observed::Vacant {
            after_term: a.term()
        }
    );
    faulty.set_fail_renewals(false);
    let b = election
        .campaign("b", &opts(Wait::Never, Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("the vacant seat is free");
    assert!(b.term() > a.term());
    b.resign().await.unwrap();
}

/// Multi-lock acquisitions dropped at random points (before, during and after their storage
/// calls, between parts) leave no part held: both names are free again long before any of
/// their 30 s leases could lapse.
pub async fn multi_lock_dropped_acquisitions_leave_nothing_held<S: Storage>(s: S) {
    let l = locks(s);
    let prefix = unique_prefix("multi-cancel");
    let (a, b) = (format!("{prefix}a"), format!("{prefix}b"));
    let o = opts(
        Wait::For(Duration::from_millis(20)),
        Duration::from_secs(30),
    );
    let names = [b.as_str(), a.as_str()];
    let mut granted = 0;
    for i in 0..300u32 {
        tokio::select! {
            biased;
            () = crate::semantics::drop_point(i) => {}
            r = acquire_all(&l, &names, &o) => {
                if let Some(held) = r.unwrap() {
                    granted += 1;
                    if i % 2 == 0 { held.release().await.unwrap() } // else dropped
                }
            }
        }
    }
    assert!(
        granted > 0,
        "no acquisition completed; the case exercised nothing"
    );
    let both = acquire_all(
        &l,
        &[&a, &b],
        &opts(Wait::For(Duration::from_secs(10)), Duration::from_secs(30)),
    )
    .await
    .unwrap()
    .expect("a part of a dropped multi-lock was left held");
    both.release().await.unwrap();
}

/// Semaphore acquisitions (of one permit and of two at once) dropped at random points leave no
/// permit out: all of them can be taken together soon after.
pub async fn semaphore_dropped_acquisitions_leave_no_permit_out<S: Storage>(s: S) {
    let l = locks(s);
    let sem = Semaphore::new(&l, &unique_prefix("sem-cancel"), 2).unwrap();
    let o = opts(
        Wait::For(Duration::from_millis(20)),
        Duration::from_secs(30),
    );
    let mut granted = 0;
    for i in 0..300u32 {
        let k = 1 + i % 2;
        tokio::select! {
            biased;
            () = crate::semantics::drop_point(i) => {}
            r = sem.acquire_many(k, &o) => {
                if let Some(held) = r.unwrap() {
                    granted += 1;
                    if i % 4 < 2 { held.release().await.unwrap() } // else dropped
                }
            }
        }
    }
    assert!(
        granted > 0,
        "no acquisition completed; the case exercised nothing"
    );
    let all = sem
        .acquire_many(
            2,
            &opts(Wait::For(Duration::from_secs(10)), Duration::from_secs(30)),
        )
        .await
        .unwrap()
        .expect("a dropped acquisition left a permit out");
    all.release().await.unwrap();
}

/// Readers and writers of one [`RwLock`] contend without limit: no reader ever sees a write in
/// progress or a write during its read (a torn-write detector: writers store their token in two
/// steps, readers compare both at the start and the end of their read), writers never overlap
/// (an [`OverlapDetector`]), every writer's token is greater than every earlier reader's, and
/// every reader's token is at least the last writer's.
pub async fn rwlock_readers_never_see_a_write_and_writers_exclude_each_other<S: Storage>(s: S) {
    const WRITERS: usize = 2;
    const READERS: usize = 4;
    const ROUNDS: usize = 6;
    struct Shared {
        first: AtomicU64,
        second: AtomicU64,
        readers_inside: AtomicUsize,
        max_reader_token: AtomicU64,
        writers: OverlapDetector,
        writes: AtomicUsize,
    }
    let l = locks(s);
    let rw = RwLock::with_max_readers(&l, &unique_prefix("rw-overlap"), 3).unwrap();
    let shared = Arc::new(Shared {
        first: AtomicU64::new(0),
        second: AtomicU64::new(0),
        readers_inside: AtomicUsize::new(0),
        max_reader_token: AtomicU64::new(0),
        writers: OverlapDetector::new(),
        writes: AtomicUsize::new(0),
    });
    let o = opts(Wait::Forever, Duration::from_secs(30));
    let mut tasks = Vec::new();
    for _ in 0..WRITERS {
        let (rw, shared, o) = (rw.clone(), shared.clone(), o.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let w = rw.write(&o).await.expect("write").expect("Wait::Forever");
                let token = w.fencing_token();
                let readers_max = shared.max_reader_token.load(Ordering::SeqCst);
                assert!(
                    token > readers_max,
                    "writer token {token} after reader token {readers_max}"
                );
                assert_eq!(
                    shared.readers_inside.load(Ordering::SeqCst),
                    0,
                    "a reader inside a write"
                );
                shared.writers.critical_section(token).await;
                // A write in two steps, with a pause between: a reader in between sees it torn.
                shared.first.store(token, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(5)).await;
                shared.second.store(token, Ordering::SeqCst);
                assert_eq!(
                    shared.readers_inside.load(Ordering::SeqCst),
                    0,
                    "a reader inside a write"
                );
                shared.writes.fetch_add(1, Ordering::Relaxed);
                w.release().await.expect("release");
            }
        }));
    }
    for _ in 0..READERS {
        let (rw, shared, o) = (rw.clone(), shared.clone(), o.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                let r = rw.read(&o).await.expect("read").expect("Wait::Forever");
                shared.readers_inside.fetch_add(1, Ordering::SeqCst);
                let token = r.fencing_token();
                shared.max_reader_token.fetch_max(token, Ordering::SeqCst);
                let before = (
                    shared.first.load(Ordering::SeqCst),
                    shared.second.load(Ordering::SeqCst),
                );
                assert_eq!(before.0, before.1, "a reader saw a write in progress");
                assert!(
                    token >= before.0,
                    "reader token {token} below the last writer's {}",
                    before.0
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
                let after = (
                    shared.first.load(Ordering::SeqCst),
                    shared.second.load(Ordering::SeqCst),
                );
                assert_eq!(before, after, "a write happened during a read");
                shared.readers_inside.fetch_sub(1, Ordering::SeqCst);
                r.release().await.expect("release");
            }
        }));
    }
    for t in tasks {
        timeout(Duration::from_secs(180), t)
            .await
            .expect("the RW lock's readers and writers finished (or the machine stalled)")
            .expect("task");
    }
    shared
        .writers
        .assert_exclusive(shared.writes.load(Ordering::Relaxed) as u64);
}

/// Readers share; a try to write while they read fails and leaves the gate free; a writer that
/// waits keeps new readers out (writer preference) and gets in once the readers leave, with a
/// token above theirs; a reader that waited behind it gets a token at least the writer's.
pub async fn rwlock_a_waiting_writer_keeps_new_readers_out<S: Storage>(s: S) {
    let l = locks(s);
    let name = unique_prefix("rw-prefer");
    let rw = RwLock::new(&l, &name).unwrap();
    let now = opts(Wait::Never, Duration::from_secs(60));
    let r1 = rw.read(&now).await.unwrap().expect("free");
    let r2 = rw.read(&now).await.unwrap().expect("readers share");
    assert!(rw.write(&now).await.unwrap().is_none(), "readers are in");
    let r3 = rw
        .read(&now)
        .await
        .unwrap()
        .expect("the failed try to write left the gate free");
    r3.release().await.unwrap();

    let gate = l.key_for(&name).unwrap().into_owned();
    let mut events = l.subscribe();
    let writer = {
        let rw = rw.clone();
        tokio::spawn(async move {
            rw.write(&opts(
                Wait::For(Duration::from_secs(60)),
                Duration::from_secs(60),
            ))
            .await
        })
    };
    crate::semantics::until_event(&mut events, &gate, LockEventKind::Acquired).await;
    // The writer holds the gate and waits for r1 and r2: a new reader waits behind it.
    assert!(
        rw.read(&opts(
            Wait::For(Duration::from_millis(300)),
            Duration::from_secs(60)
        ))
        .await
        .unwrap()
        .is_none(),
        "a reader got in past a waiting writer"
    );
    let late_reader = {
        let rw = rw.clone();
        tokio::spawn(async move {
            rw.read(&opts(
                Wait::For(Duration::from_secs(60)),
                Duration::from_secs(60),
            ))
            .await
        })
    };
    let reader_tokens = [r1.fencing_token(), r2.fencing_token()];
    r1.release().await.unwrap();
    r2.release().await.unwrap();
    let w = timeout(Duration::from_secs(90), writer)
        .await
        .expect("the writer finished")
        .unwrap()
        .unwrap()
        .expect("the writer got in once the readers left");
    for t in reader_tokens {
        assert!(
            w.fencing_token() > t,
            "writer {} after reader {t}",
            w.fencing_token()
        );
    }
    w.release().await.unwrap();
    let r = timeout(Duration::from_secs(90), late_reader)
        .await
        .expect("the late reader finished")
        .unwrap()
        .unwrap()
        .expect("the late reader got in after the writer");
    assert!(r.fencing_token() >= w.fencing_token());
    r.release().await.unwrap();
}

/// A writer and a reader that vanish without releasing (a crash: their releases never reach
/// the storage) hold others off only until their leases end: a reader gets in after the dead
/// writer's lease, with a token at least the writer's; a writer gets in after the dead reader's
/// lease, with a token above the reader's.
pub async fn rwlock_a_crashed_writer_or_reader_lapses_with_its_lease<S: Storage>(s: S) {
    let shared = Arc::new(s);
    let cut_writer = Arc::new(FaultyStorage::new(shared.clone()));
    let cut_reader = Arc::new(FaultyStorage::new(shared.clone()));
    let l = StorageLock::builder_arc(shared).build().unwrap();
    let name = unique_prefix("rw-crash");
    let lease = Duration::from_secs(1);
    let side = |cut: &Arc<FaultyStorage<Arc<S>>>| {
        let locks = StorageLock::builder_arc(cut.clone()).build().unwrap();
        RwLock::with_max_readers(&locks, &name, 2).unwrap()
    };
    let rw = RwLock::with_max_readers(&l, &name, 2).unwrap();
    let patient = opts(Wait::For(Duration::from_secs(60)), lease);

    let dead_writer = side(&cut_writer)
        .write(&opts(Wait::Never, lease))
        .await
        .unwrap()
        .expect("free");
    let writer_token = dead_writer.fencing_token();
    cut_writer.set_outage(true);
    drop(dead_writer);
    let r = rw
        .read(&patient)
        .await
        .unwrap()
        .expect("the dead writer's gate lapsed");
    assert!(r.fencing_token() >= writer_token);
    r.release().await.unwrap();

    let dead_reader = side(&cut_reader)
        .read(&opts(Wait::Never, lease))
        .await
        .unwrap()
        .expect("free");
    let reader_token = dead_reader.fencing_token();
    cut_reader.set_outage(true);
    drop(dead_reader);
    let w = rw
        .write(&patient)
        .await
        .unwrap()
        .expect("the dead reader's slot lapsed");
    assert!(w.fencing_token() > reader_token);
    w.release().await.unwrap();
}

/// Reads and writes dropped at random points leave nothing held: a write gets in soon after,
/// long before any of their 30 s leases could lapse.
pub async fn rwlock_dropped_acquisitions_leave_nothing_held<S: Storage>(s: S) {
    let l = locks(s);
    let rw = RwLock::with_max_readers(&l, &unique_prefix("rw-cancel"), 2).unwrap();
    let o = opts(
        Wait::For(Duration::from_millis(20)),
        Duration::from_secs(30),
    );
    let mut granted = 0;
    for i in 0..200u32 {
        tokio::select! {
            biased;
            () = crate::semantics::drop_point(i) => {}
            done = async {
                if i % 2 == 0 {
                    rw.read(&o).await.map(|g| g.map(|_held| ()))
                } else {
                    rw.write(&o).await.map(|g| g.map(|_held| ()))
                }
            } => {
                if done.unwrap().is_some() {
                    granted += 1; // dropped at once: released in the background
                }
            }
        }
    }
    assert!(
        granted > 0,
        "no acquisition completed; the case exercised nothing"
    );
    let w = rw
        .write(&opts(
            Wait::For(Duration::from_secs(10)),
            Duration::from_secs(30),
        ))
        .await
        .unwrap()
        .expect("a dropped acquisition left a hold behind");
    w.release().await.unwrap();
}

/// Bad numbers and names are refused before any storage call, bad options before any storage
/// call of a read or a write, and an RW lock of a name set up with another number of readers
/// is refused with a typed error, holding nothing.
pub async fn rwlock_bad_input_and_another_max_readers_are_refused<S: Storage>(s: S) {
    let l = locks(s);
    let name = unique_prefix("rw-input");
    for bad in [0, storage_lock_core::kinds::MAX_PERMITS + 1] {
        assert!(matches!(
            RwLock::with_max_readers(&l, &name, bad),
            Err(LockError::InvalidOptions { .. })
        ));
    }
    assert!(matches!(
        RwLock::new(&l, " "),
        Err(LockError::InvalidName { .. })
    ));
    let three = RwLock::with_max_readers(&l, &name, 3).unwrap();
    let zero_lease = opts(Wait::Never, Duration::ZERO);
    assert!(matches!(
        three.read(&zero_lease).await,
        Err(LockError::InvalidOptions { .. })
    ));
    assert!(matches!(
        three.write(&zero_lease).await,
        Err(LockError::InvalidOptions { .. })
    ));
    let now = opts(Wait::Never, Duration::from_secs(30));
    three
        .read(&now)
        .await
        .unwrap()
        .expect("free")
        .release()
        .await
        .unwrap();
    let four = RwLock::with_max_readers(&l, &name, 4).unwrap();
    for result in [
        four.read(&now).await.map(|g| g.is_some()),
        four.write(&now).await.map(|g| g.is_some()),
    ] {
        match result {
            Err(LockError::SemaphoreLimitMismatch {
                permits: 4,
                stored: 3,
                ..
            }) => {}
            other => panic!("expected SemaphoreLimitMismatch, got {other:?}"),
        }
    }
    let w = three
        .write(&now)
        .await
        .unwrap()
        .expect("nothing was left held");
    w.release().await.unwrap();
    // A write on a name no reader used sets no reader limit: the first reader does.
    let fresh = unique_prefix("rw-fresh");
    let w = RwLock::with_max_readers(&l, &fresh, 4)
        .unwrap()
        .write(&now)
        .await
        .unwrap()
        .expect("free");
    w.release().await.unwrap();
    let five = RwLock::with_max_readers(&l, &fresh, 5).unwrap();
    let r = five
        .read(&now)
        .await
        .unwrap()
        .expect("free, and 5 is the first limit");
    r.release().await.unwrap();
}

/// How many waiters hold a place in `fair`'s queue (places held with a ticket), read off the
/// storage.
async fn queued<S: Storage + ?Sized>(l: &StorageLock<S>, fair: &FairLock<S>) -> usize {
    let mut n = 0;
    for i in 0..fair.max_waiters() {
        let key = l.key_for(&place_name(fair.name(), i)).unwrap().into_owned();
        let seen = l.storage().get(&key).await.expect("read a place");
        if seen.is_some_and(|s| {
            s.record.count > 0
                && s.record
                    .holder
                    .as_ref()
                    .and_then(|h| h.note.as_deref())
                    .is_some_and(|n| n.starts_with("fair-ticket "))
        }) {
            n += 1;
        }
    }
    n
}

/// Waits until `n` waiters are queued in `fair` (a condition on the storage, polled; the bound
/// is for a loaded machine).
async fn until_queued<S: Storage + ?Sized>(l: &StorageLock<S>, fair: &FairLock<S>, n: usize) {
    timeout(Duration::from_secs(90), async {
        while queued(l, fair).await != n {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{n} waiters never stood in the queue"));
}

/// Waiters that arrive one after another while the lock is held get it in that order, each
/// with a higher token than the one before, never two at once (an overlap detector in each
/// hold); then tasks contending at once all get it, never overlapping.
pub async fn fair_lock_serves_waiters_in_arrival_order<S: Storage>(s: S) {
    const WAITERS: usize = 5;
    let l = locks(s);
    let fair = FairLock::new(&l, &unique_prefix("fair-order")).unwrap();
    let lease = Duration::from_secs(60);
    let detector = Arc::new(OverlapDetector::new());
    let served = Arc::new(std::sync::Mutex::new(Vec::new()));
    let holder = fair
        .acquire(&opts(Wait::Never, lease))
        .await
        .unwrap()
        .expect("free");
    let mut waiters = Vec::new();
    for i in 0..WAITERS {
        let (mine, detector, served) = (fair.clone(), detector.clone(), served.clone());
        waiters.push(tokio::spawn(async move {
            let h = mine
                .acquire(&opts(Wait::For(Duration::from_secs(120)), lease))
                .await
                .unwrap()
                .expect("served within the wait");
            served.lock().unwrap().push((i, h.fencing_token()));
            detector.critical_section(h.fencing_token()).await;
            h.release().await.unwrap();
        }));
        // The next waiter arrives once this one stands in the queue.
        until_queued(&l, &fair, i + 1).await;
    }
    holder.release().await.unwrap();
    for w in waiters {
        timeout(Duration::from_secs(180), w)
            .await
            .expect("the waiters were served")
            .expect("waiter");
    }
    let served = served.lock().unwrap().clone();
    let order: Vec<usize> = served.iter().map(|(i, _)| *i).collect();
    assert_eq!(
        order,
        (0..WAITERS).collect::<Vec<_>>(),
        "served out of order"
    );
    assert!(
        served.windows(2).all(|w| w[1].1 > w[0].1),
        "tokens did not rise: {served:?}"
    );
    assert!(served[0].1 > holder.fencing_token());
    detector.assert_exclusive(WAITERS as u64);

    // Everyone at once: all served, one at a time.
    const TASKS: usize = 4;
    const ROUNDS: usize = 5;
    let detector = Arc::new(OverlapDetector::new());
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (fair, detector) = (fair.clone(), detector.clone());
            tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let h = fair
                        .acquire(&opts(Wait::Forever, lease))
                        .await
                        .unwrap()
                        .expect("Wait::Forever acquires");
                    detector.critical_section(h.fencing_token()).await;
                    h.release().await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        timeout(Duration::from_secs(180), t)
            .await
            .expect("the contenders finished")
            .expect("task");
    }
    detector.assert_exclusive((TASKS * ROUNDS) as u64);
    assert_eq!(queued(&l, &fair).await, 0, "a place was left held");
}

/// With a waiter queued ahead (its place held), a try finds the lock busy although nobody holds
/// it, and a waiter that arrives waits for the one ahead, not for the lock: it is served only
/// once the waiter ahead gives its place up.
pub async fn fair_lock_nobody_jumps_the_queue<S: Storage>(s: S) {
    let l = locks(s);
    let fair = FairLock::with_max_waiters(&l, &unique_prefix("fair-jump"), 4).unwrap();
    let lease = Duration::from_secs(60);
    // The dispenser's next tickets: an existing key's token rises by one a grant.
    let dispenser = l
        .try_acquire(&tickets_name(fair.name()), &opts(Wait::Never, lease))
        .await
        .unwrap()
        .expect("free");
    let next = dispenser.fencing_token() + 1;
    dispenser.release().await.unwrap();
    // A waiter ahead of every ticket the dispenser gives (ticket 0), in a place the next two
    // tickets (the two waiters below) do not take.
    let place = u32::try_from((next + 2) % 4).unwrap();
    let ahead = l
        .try_acquire(
            &place_name(fair.name(), place),
            &opts(Wait::Never, lease).note("fair-ticket 0"),
        )
        .await
        .unwrap()
        .expect("free");
    assert!(
        fair.acquire(&opts(Wait::Never, lease))
            .await
            .unwrap()
            .is_none(),
        "a try jumped a queued waiter"
    );
    assert!(
        fair.acquire(&opts(Wait::For(Duration::from_millis(300)), lease))
            .await
            .unwrap()
            .is_none(),
        "a waiter was served ahead of a queued one"
    );
    assert_eq!(
        queued(&l, &fair).await,
        1,
        "the timed-out waiter left its place held"
    );
    let behind = {
        let fair = fair.clone();
        tokio::spawn(async move {
            fair.acquire(&opts(Wait::For(Duration::from_secs(120)), lease))
                .await
        })
    };
    until_queued(&l, &fair, 2).await;
    ahead.release().await.unwrap();
    let h = timeout(Duration::from_secs(180), behind)
        .await
        .expect("the waiter behind was served")
        .unwrap()
        .unwrap()
        .expect("served once the waiter ahead left");
    h.release().await.unwrap();
    assert_eq!(queued(&l, &fair).await, 0);
}

/// A waiter that vanishes without giving its place up (a crash: its release and renewals never
/// reach the storage) keeps the waiters behind it only until its lease ends.
pub async fn fair_lock_a_dead_waiter_loses_its_place_with_its_lease<S: Storage>(s: S) {
    let shared = Arc::new(s);
    let cut = Arc::new(FaultyStorage::new(shared.clone()));
    let l = StorageLock::builder_arc(shared).build().unwrap();
    let name = unique_prefix("fair-dead");
    let fair = FairLock::new(&l, &name).unwrap();
    let doomed = FairLock::new(
        &StorageLock::builder_arc(cut.clone()).build().unwrap(),
        &name,
    )
    .unwrap();
    let holder = fair
        .acquire(&opts(Wait::Never, Duration::from_secs(60)))
        .await
        .unwrap()
        .expect("free");
    let dead = tokio::spawn(async move {
        doomed
            .acquire(&opts(Wait::Forever, Duration::from_secs(1)))
            .await
    });
    until_queued(&l, &fair, 1).await;
    cut.set_outage(true);
    dead.abort();
    let _ = dead.await;
    let live = {
        let fair = fair.clone();
        tokio::spawn(async move {
            fair.acquire(&opts(
                Wait::For(Duration::from_secs(120)),
                Duration::from_secs(60),
            ))
            .await
        })
    };
    holder.release().await.unwrap();
    let h = timeout(Duration::from_secs(180), live)
        .await
        .expect("the live waiter was served")
        .unwrap()
        .unwrap()
        .expect("the dead waiter's place lapsed");
    assert!(h.fencing_token() > holder.fencing_token());
    h.release().await.unwrap();
}

/// Acquisitions dropped at random points leave nothing held and no place taken: a try gets the
/// lock at once afterwards (it would find a left-over place and answer busy).
pub async fn fair_lock_dropped_acquisitions_leave_nothing_held<S: Storage>(s: S) {
    let l = locks(s);
    let fair = FairLock::with_max_waiters(&l, &unique_prefix("fair-cancel"), 4).unwrap();
    let o = opts(
        Wait::For(Duration::from_millis(20)),
        Duration::from_secs(30),
    );
    let mut granted = 0;
    let mut others = Vec::new();
    for i in 0..120u32 {
        // Every few rounds someone holds the lock, so acquisitions queue.
        if i % 8 == 0 {
            others.push(
                fair.acquire(&opts(Wait::Never, Duration::from_secs(30)))
                    .await
                    .unwrap(),
            );
        }
        tokio::select! {
            biased;
            () = crate::semantics::drop_point(i) => {}
            done = fair.acquire(&o) => {
                if done.unwrap().is_some() {
                    granted += 1; // dropped at once: released in the background
                }
            }
        }
        if i % 8 == 4 {
            for h in others.drain(..).flatten() {
                h.release().await.unwrap();
            }
        }
    }
    for h in others.into_iter().flatten() {
        h.release().await.unwrap();
    }
    assert!(
        granted > 0,
        "no acquisition completed; the case exercised nothing"
    );
    let h = timeout(Duration::from_secs(90), async {
        loop {
            // Background releases of the dropped ones may still be on their way.
            if let Some(h) = fair
                .acquire(&opts(
                    Wait::For(Duration::from_secs(10)),
                    Duration::from_secs(30),
                ))
                .await
                .unwrap()
            {
                if queued(&l, &fair).await == 0 {
                    return h;
                }
                h.release().await.unwrap();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("a dropped acquisition left a place or a hold behind");
    h.release().await.unwrap();
}

/// Bad numbers, names and options are refused before any storage call, holding nothing.
pub async fn fair_lock_bad_input_is_refused<S: Storage>(s: S) {
    let l = locks(s);
    let name = unique_prefix("fair-input");
    for bad in [0, storage_lock_core::kinds::MAX_WAITERS + 1] {
        assert!(matches!(
            FairLock::with_max_waiters(&l, &name, bad),
            Err(LockError::InvalidOptions { .. })
        ));
    }
    assert!(matches!(
        FairLock::new(&l, " "),
        Err(LockError::InvalidName { .. })
    ));
    let fair = FairLock::new(&l, &name).unwrap();
    assert!(matches!(
        fair.acquire(&opts(Wait::Never, Duration::ZERO)).await,
        Err(LockError::InvalidOptions { .. })
    ));
    let h = fair
        .acquire(&opts(Wait::Never, Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("nothing was left held");
    h.release().await.unwrap();
}

/// A FIFO reader-writer lock serves readers and writers in the order they arrived while a
/// writer wrote: reader, writer, reader, writer, reader — each writer after the reader before
/// it, each reader after the writer before it (not beside an earlier reader past a waiting
/// writer), writers' tokens above every earlier reader's.
pub async fn rwlock_fifo_serves_readers_and_writers_in_arrival_order<S: Storage>(s: S) {
    const PLAN: [bool; 5] = [false, true, false, true, false]; // true: a writer
    let l = locks(s);
    let name = unique_prefix("rw-fifo");
    let rw = RwLock::with_max_readers(&l, &name, 4)
        .unwrap()
        .fifo()
        .unwrap();
    assert!(rw.is_fifo());
    let order = FairLock::new(&l, &order_name(&name)).unwrap();
    let order_key = l.key_for(order.name()).unwrap().into_owned();
    let lease = Duration::from_secs(60);
    let first = rw
        .write(&opts(Wait::Never, lease))
        .await
        .unwrap()
        .expect("free");
    let served = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (i, writer) in PLAN.into_iter().enumerate() {
        let (rw, served) = (rw.clone(), served.clone());
        tasks.push(tokio::spawn(async move {
            let o = opts(Wait::For(Duration::from_secs(120)), lease);
            if writer {
                let w = rw.write(&o).await.unwrap().expect("served");
                served.lock().unwrap().push((i, writer, w.fencing_token()));
                w.release().await.unwrap();
            } else {
                let r = rw.read(&o).await.unwrap().expect("served");
                served.lock().unwrap().push((i, writer, r.fencing_token()));
                r.release().await.unwrap();
            }
        }));
        // The next one arrives once this one waits: the first at the front (holding the order
        // lock), the others in its queue.
        if i == 0 {
            timeout(Duration::from_secs(90), async {
                while l
                    .storage()
                    .get(&order_key)
                    .await
                    .unwrap()
                    .is_none_or(|s| s.record.count == 0)
                {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            })
            .await
            .expect("the first reader reached the front");
        } else {
            until_queued(&l, &order, i).await;
        }
    }
    first.release().await.unwrap();
    for t in tasks {
        timeout(Duration::from_secs(180), t)
            .await
            .expect("everyone was served")
            .expect("task");
    }
    let served = served.lock().unwrap().clone();
    let arrival: Vec<usize> = served.iter().map(|(i, _, _)| *i).collect();
    assert_eq!(
        arrival,
        (0..PLAN.len()).collect::<Vec<_>>(),
        "served out of order"
    );
    for (k, (_, writer, token)) in served.iter().enumerate() {
        if *writer {
            for (_, _, before) in &served[..k] {
                assert!(
                    token > before,
                    "a writer's token {token} after {before}: {served:?}"
                );
            }
        }
    }
}
