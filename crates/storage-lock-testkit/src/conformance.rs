//! The storage conformance suite: what every [`Storage`] must do, through its primitives and its
//! lock operations. Each case takes a fresh storage and panics on a violation.

use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use storage_lock_core::StorageExt;
use storage_lock_core::storage::ops::FENCING_FLOOR_KEY;
use storage_lock_core::{
    AcquireManyOutcome, AcquireOutcome, AcquireRequest, Clock, HolderInfo, LockRecord, OwnerId,
    PageRequest, ReleaseOutcome, RenewOutcome, RenewRequest, Storage, StorageError, Stored,
    SystemClock, Version,
};

use crate::{cas, unique_prefix};

/// Writers in the racing cases.
pub const RACERS: usize = 16;

fn record(owner: OwnerId, fencing: u64, holder: Option<HolderInfo>) -> LockRecord {
    let holder = holder.map(Arc::new);
    let now = SystemClock.now();
    LockRecord {
        owner,
        count: 1,
        fencing,
        acquired_at: now,
        expires_at: now.saturating_add(Duration::from_secs(30)),
        holder,
    }
}

fn request(owner: OwnerId, lease: Duration, reentrant: bool) -> AcquireRequest {
    AcquireRequest {
        owner,
        lease,
        holder: Some(Arc::new(HolderInfo {
            host: "conformance".into(),
            pid: 42,
            note: Some("suite".into()),
        })),
        reentrant,
    }
}

fn fencing_of(outcome: &AcquireOutcome) -> u64 {
    match outcome {
        AcquireOutcome::Acquired { fencing, .. } => *fencing,
        busy => panic!("expected Acquired, got {busy:?}"),
    }
}

/// `create` then `get` returns the same record, holder info included (with and without a note,
/// and with no holder at all).
pub async fn create_then_get<S: Storage>(s: S) {
    let p = unique_prefix("create_then_get");
    let with_note = record(
        OwnerId::random(),
        7,
        Some(HolderInfo {
            host: "host-a".into(),
            pid: 1234,
            note: Some("nightly backup ✓".into()),
        }),
    );
    let without_note = record(
        OwnerId::random(),
        8,
        Some(HolderInfo {
            host: "host-b".into(),
            pid: 1,
            note: None,
        }),
    );
    let anonymous = record(OwnerId::random(), 9, None);
    for (i, rec) in [with_note, without_note, anonymous].into_iter().enumerate() {
        let key = format!("{p}{i}");
        assert!(s.get(&key).await.unwrap().is_none());
        let v = cas(&s).create(&key, &rec).await.unwrap();
        let got = s.get(&key).await.unwrap().expect("created record");
        assert_eq!(got.record, rec);
        assert_eq!(got.version, v);
    }
}

/// A second `create` of one key is [`StorageError::AlreadyExists`] and changes nothing; a
/// record the refusal carries is the one stored.
pub async fn create_duplicate_is_already_exists<S: Storage>(s: S) {
    let key = unique_prefix("dup") + "k";
    let first = record(OwnerId::random(), 1, None);
    cas(&s).create(&key, &first).await.unwrap();
    let err = cas(&s)
        .create(&key, &record(OwnerId::random(), 2, None))
        .await
        .unwrap_err();
    assert!(matches!(err, StorageError::AlreadyExists { .. }), "{err:?}");
    let stored = s.get(&key).await.unwrap().unwrap();
    assert_eq!(stored.record, first);
    carries_the_stored_record(&err, &stored);
}

/// Panics unless the record `err` carries, if any ([`StorageError::with_current`]), is `stored`
/// (same version, same holder and token): what the default operations decide a retry on.
pub fn carries_the_stored_record(err: &StorageError, stored: &Stored) {
    if let Some(carried) = err.current() {
        assert_eq!(carried.version, stored.version, "{err:?}");
        assert_eq!(carried.record.owner, stored.record.owner, "{err:?}");
        assert_eq!(carried.record.fencing, stored.record.fencing, "{err:?}");
        assert_eq!(carried.record.count, stored.record.count, "{err:?}");
    }
}

/// `update` with a stale version, or of a missing key, is [`StorageError::Conflict`] (carrying,
/// if anything, the record stored); a successful update yields a new version.
pub async fn stale_update_is_conflict<S: Storage>(s: S) {
    let p = unique_prefix("stale_update");
    let key = format!("{p}k");
    let v1 = cas(&s)
        .create(&key, &record(OwnerId::random(), 1, None))
        .await
        .unwrap();
    let second = record(OwnerId::random(), 2, None);
    let v2 = cas(&s).update(&key, &v1, &second).await.unwrap();
    assert_ne!(v1, v2, "an update must change the version");
    let err = cas(&s)
        .update(&key, &v1, &record(OwnerId::random(), 3, None))
        .await
        .unwrap_err();
    assert!(matches!(err, StorageError::Conflict { .. }), "{err:?}");
    let stored = s.get(&key).await.unwrap().unwrap();
    assert_eq!(stored.record, second);
    carries_the_stored_record(&err, &stored);
    let err = cas(&s)
        .update(&format!("{p}missing"), &v2, &second)
        .await
        .unwrap_err();
    assert!(matches!(err, StorageError::Conflict { .. }), "{err:?}");
}

/// `delete` with a stale version is [`StorageError::Conflict`]; with the current one it removes
/// the record. Storages without conditional delete say [`StorageError::Unsupported`].
pub async fn stale_delete_is_conflict<S: Storage>(s: S) {
    let key = unique_prefix("stale_delete") + "k";
    let v1 = cas(&s)
        .create(&key, &record(OwnerId::random(), 1, None))
        .await
        .unwrap();
    let v2 = cas(&s)
        .update(&key, &v1, &record(OwnerId::random(), 2, None))
        .await
        .unwrap();
    if !s.capabilities().conditional_delete {
        let err = cas(&s).delete(&key, &v2).await.unwrap_err();
        assert!(matches!(err, StorageError::Unsupported { .. }), "{err:?}");
        return;
    }
    let err = cas(&s).delete(&key, &v1).await.unwrap_err();
    assert!(matches!(err, StorageError::Conflict { .. }), "{err:?}");
    assert!(s.get(&key).await.unwrap().is_some());
    cas(&s).delete(&key, &v2).await.unwrap();
    assert!(s.get(&key).await.unwrap().is_none());
    let err = cas(&s).delete(&key, &v2).await.unwrap_err();
    assert!(matches!(err, StorageError::Conflict { .. }), "{err:?}");
}

async fn race<S: Storage, T: Send + 'static>(
    s: Arc<S>,
    f: impl Fn(Arc<S>, usize) -> tokio::task::JoinHandle<T>,
) -> Vec<T> {
    let handles: Vec<_> = (0..RACERS).map(|i| f(s.clone(), i)).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.expect("racer panicked"));
    }
    out
}

/// [`RACERS`] concurrent `create`s of one key: exactly one wins, the rest are `AlreadyExists`.
pub async fn racing_creates_have_one_winner<S: Storage>(s: S) {
    let key = unique_prefix("racing_creates") + "k";
    let results = race(Arc::new(s), |s, i| {
        let key = key.clone();
        tokio::spawn(async move {
            cas(&s)
                .create(&key, &record(OwnerId::random(), i as u64, None))
                .await
        })
    })
    .await;
    let winners = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(winners, 1, "{results:?}");
    assert!(
        results
            .iter()
            .all(|r| r.as_ref().is_ok() || matches!(r, Err(StorageError::AlreadyExists { .. }))),
        "{results:?}"
    );
}

/// [`RACERS`] concurrent `update`s from the same version: exactly one wins, the rest conflict.
pub async fn racing_updates_have_one_winner<S: Storage>(s: S) {
    let key = unique_prefix("racing_updates") + "k";
    let v = cas(&s)
        .create(&key, &record(OwnerId::random(), 0, None))
        .await
        .unwrap();
    let results = race(Arc::new(s), |s, i| {
        let (key, v) = (key.clone(), v.clone());
        tokio::spawn(async move {
            cas(&s)
                .update(&key, &v, &record(OwnerId::random(), i as u64, None))
                .await
        })
    })
    .await;
    assert_eq!(
        results.iter().filter(|r| r.is_ok()).count(),
        1,
        "{results:?}"
    );
    assert!(
        results
            .iter()
            .all(|r| r.is_ok() || matches!(r, Err(StorageError::Conflict { .. }))),
        "{results:?}"
    );
}

/// [`RACERS`] concurrent `acquire_once`s of a free key by different owners: exactly one acquires.
pub async fn racing_acquires_have_one_winner<S: Storage>(s: S) {
    let key = unique_prefix("racing_acquires") + "k";
    let results = race(Arc::new(s), |s, _| {
        let key = key.clone();
        tokio::spawn(async move {
            s.acquire_once(
                &key,
                &request(OwnerId::random(), Duration::from_secs(30), false),
            )
            .await
            .unwrap()
        })
    })
    .await;
    let winners: Vec<_> = results
        .iter()
        .filter(|r| matches!(r, AcquireOutcome::Acquired { .. }))
        .collect();
    assert_eq!(winners.len(), 1, "{results:?}");
    assert!(fencing_of(winners[0]) >= 1);
}

/// [`Storage::acquire_many`] takes every key or none: a busy key is reported by position,
/// with the holder's expiry, and the others are left free; once free, every key is taken,
/// each above its earlier token and each held by the one owner; of many racing calls for the
/// same keys, one takes them all.
pub async fn acquire_many_takes_every_key_or_none<S: Storage>(s: S) {
    let p = unique_prefix("acquire_many");
    let keys: Vec<String> = ["a", "b", "c"].iter().map(|k| format!("{p}{k}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let lease = Duration::from_secs(30);
    let (x, y) = (OwnerId::random(), OwnerId::random());
    let held_b = fencing_of(
        &s.acquire_once(keys[1], &request(x, lease, false))
            .await
            .unwrap(),
    );
    match s
        .acquire_many(&keys, &request(y, lease, false))
        .await
        .unwrap()
    {
        AcquireManyOutcome::Busy { index, outcome } => {
            assert_eq!(index, 1, "{outcome:?}");
            assert!(
                outcome.busy_for().is_some_and(|left| left > Duration::ZERO),
                "{outcome:?}"
            );
        }
        other => panic!("b is held: {other:?}"),
    }
    let now = s.now().await.unwrap();
    for key in [keys[0], keys[2]] {
        if let Some(stored) = s.get(key).await.unwrap() {
            let rec = stored.record;
            assert!(
                rec.owner != y || !rec.is_held_at(now),
                "{key} left held: {rec:?}"
            );
        }
    }
    s.release(keys[1], x).await.unwrap();
    let granted = match s
        .acquire_many(&keys, &request(y, lease, false))
        .await
        .unwrap()
    {
        AcquireManyOutcome::Acquired(granted) => granted,
        other => panic!("every key is free: {other:?}"),
    };
    assert_eq!(granted.len(), keys.len(), "{granted:?}");
    assert!(fencing_of(&granted[1]) > held_b, "{granted:?}");
    let now = s.now().await.unwrap();
    for (key, grant) in keys.iter().zip(&granted) {
        let rec = s.get(key).await.unwrap().expect("taken").record;
        assert!(
            rec.owner == y && rec.count == 1 && rec.is_held_at(now),
            "{key}: {rec:?}"
        );
        assert_eq!(rec.fencing, fencing_of(grant), "{key}");
    }
    for key in &keys {
        assert!(matches!(
            s.release(key, y).await.unwrap(),
            ReleaseOutcome::Released { .. }
        ));
    }
    let owned: Vec<String> = keys.iter().map(|k| (*k).to_owned()).collect();
    let results = race(Arc::new(s), |s, _| {
        let owned = owned.clone();
        tokio::spawn(async move {
            let keys: Vec<&str> = owned.iter().map(String::as_str).collect();
            s.acquire_many(&keys, &request(OwnerId::random(), lease, false))
                .await
                .unwrap()
        })
    })
    .await;
    let winners = results
        .iter()
        .filter(|r| matches!(r, AcquireManyOutcome::Acquired(_)))
        .count();
    assert_eq!(winners, 1, "{results:?}");
}

/// [`Storage::acquire_any`] takes `need` of the keys, the first free ones in the order given,
/// or none: with two of four keys held, three are refused with both held keys reported (and
/// the free ones left free), two are the free ones, each held by the one owner with the token
/// it was granted; of many racing calls for one key each, as many win as keys are free, each
/// a different key.
pub async fn acquire_any_takes_the_first_free_keys_or_none<S: Storage>(s: S) {
    use storage_lock_core::AcquireAnyOutcome;
    let p = unique_prefix("acquire_any");
    let keys: Vec<String> = ["a", "b", "c", "d"]
        .iter()
        .map(|k| format!("{p}{k}"))
        .collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let lease = Duration::from_secs(30);
    let (x, y) = (OwnerId::random(), OwnerId::random());
    for key in [keys[1], keys[3]] {
        s.acquire_once(key, &request(x, lease, false))
            .await
            .unwrap();
    }
    match s
        .acquire_any(&keys, 3, None, &request(y, lease, false))
        .await
        .unwrap()
    {
        AcquireAnyOutcome::Busy(busy) => {
            let positions: Vec<usize> = busy.iter().map(|(i, _)| *i).collect();
            assert_eq!(positions, [1, 3], "{busy:?}");
            for (_, outcome) in &busy {
                assert!(
                    outcome.busy_for().is_some_and(|left| left > Duration::ZERO),
                    "{outcome:?}"
                );
            }
        }
        other => panic!("only two keys are free: {other:?}"),
    }
    let now = s.now().await.unwrap();
    for key in [keys[0], keys[2]] {
        if let Some(stored) = s.get(key).await.unwrap() {
            let rec = stored.record;
            assert!(
                rec.owner != y || !rec.is_held_at(now),
                "{key} left held: {rec:?}"
            );
        }
    }
    let taken = match s
        .acquire_any(&keys, 2, None, &request(y, lease, false))
        .await
        .unwrap()
    {
        AcquireAnyOutcome::Acquired { taken, gate: 0 } => taken,
        other => panic!("a and c are free: {other:?}"),
    };
    let positions: Vec<usize> = taken.iter().map(|(i, _)| *i).collect();
    assert_eq!(positions, [0, 2], "{taken:?}");
    let now = s.now().await.unwrap();
    for (i, grant) in &taken {
        let rec = s.get(keys[*i]).await.unwrap().expect("taken").record;
        assert!(
            rec.owner == y && rec.count == 1 && rec.is_held_at(now),
            "{}: {rec:?}",
            keys[*i]
        );
        assert_eq!(rec.fencing, fencing_of(grant), "{}", keys[*i]);
        s.release(keys[*i], y).await.unwrap();
    }
    let owned: Vec<String> = keys.iter().map(|k| (*k).to_owned()).collect();
    let results = race(Arc::new(s), |s, _| {
        let owned = owned.clone();
        tokio::spawn(async move {
            let keys: Vec<&str> = owned.iter().map(String::as_str).collect();
            s.acquire_any(&keys, 1, None, &request(OwnerId::random(), lease, false))
                .await
                .unwrap()
        })
    })
    .await;
    let mut won: Vec<usize> = results
        .iter()
        .filter_map(|r| match r {
            AcquireAnyOutcome::Acquired { taken, .. } if taken.len() == 1 => Some(taken[0].0),
            AcquireAnyOutcome::Acquired { taken, .. } => {
                panic!("one key asked, {taken:?} given")
            }
            other => {
                assert!(matches!(other, AcquireAnyOutcome::Busy(_)), "{other:?}");
                None
            }
        })
        .collect();
    won.sort_unstable();
    assert_eq!(won, [0, 2], "{results:?}");
}

/// [`Storage::acquire_any`] with a gate takes keys only while the gate has no holder: a gate
/// never held lets them be taken (with a token below its first holder's), a held gate's answer
/// is `GateHeld` with nothing taken, once the gate is released the keys are taken with the
/// released hold's token, and after a sweep deleted the gate's record with a token no lower.
pub async fn acquire_any_with_a_gate_takes_nothing_while_the_gate_is_held<S: Storage>(s: S) {
    use storage_lock_core::AcquireAnyOutcome;
    let p = unique_prefix("acquire_any_gate");
    let (gate, a, b) = (format!("{p}gate"), format!("{p}a"), format!("{p}b"));
    let keys = [a.as_str(), b.as_str()];
    let lease = Duration::from_secs(30);
    let (x, y) = (OwnerId::random(), OwnerId::random());
    let fresh = s
        .acquire_any(&keys, 1, Some(&gate), &request(y, lease, false))
        .await
        .unwrap();
    let AcquireAnyOutcome::Acquired {
        taken,
        gate: never_held,
    } = fresh
    else {
        panic!("a gate never held is free: {fresh:?}");
    };
    s.release(keys[taken[0].0], y).await.unwrap();
    let token = fencing_of(
        &s.acquire_once(&gate, &request(x, lease, false))
            .await
            .unwrap(),
    );
    assert!(
        never_held < token,
        "a gate's first holder gets a token above the one readers passed it with"
    );
    let held = s
        .acquire_any(&keys, 1, Some(&gate), &request(y, lease, false))
        .await
        .unwrap();
    assert_eq!(held, AcquireAnyOutcome::GateHeld);
    let now = s.now().await.unwrap();
    for key in keys {
        if let Some(stored) = s.get(key).await.unwrap() {
            assert!(
                stored.record.owner != y || !stored.record.is_held_at(now),
                "{key} taken past a held gate: {stored:?}"
            );
        }
    }
    s.release(&gate, x).await.unwrap();
    let passed = s
        .acquire_any(&keys, 2, Some(&gate), &request(y, lease, false))
        .await
        .unwrap();
    match passed {
        AcquireAnyOutcome::Acquired { taken, gate } => {
            assert_eq!(gate, token, "the released gate's token");
            assert_eq!(taken.len(), 2, "{taken:?}");
        }
        other => panic!("the gate is free: {other:?}"),
    }
    // A sweep deletes the released gate's record: a gate without a record passes with the
    // floor, never below the token of its last holder.
    if !s.capabilities().conditional_delete {
        return;
    }
    for key in keys {
        s.release(key, y).await.unwrap();
    }
    s.sweep(&p, Duration::ZERO).await.unwrap();
    assert!(s.get(&gate).await.unwrap().is_none(), "the sweep took it");
    let swept = s
        .acquire_any(&keys, 1, Some(&gate), &request(y, lease, false))
        .await
        .unwrap();
    match swept {
        AcquireAnyOutcome::Acquired { gate, .. } => assert!(
            gate >= token,
            "a swept gate passed with {gate}, below its last holder's {token}"
        ),
        other => panic!("the gate is free: {other:?}"),
    }
}

/// Where the primitives write several keys at once ([`Primitives::write_all`]; a service
/// that turns out not to have the call makes the storage say so from then on): every write
/// or none (a stale version or an existing key refuses all, typed, and writes nothing), each
/// key then read back with its new version; and a multi-key acquisition of keys the storage
/// knows is that one write and no read.
///
/// [`Primitives::write_all`]: storage_lock_core::Primitives::write_all
pub async fn write_all_is_all_or_nothing<S: Storage>(s: S) {
    if s.primitives().is_none_or(|p| !p.writes_all_at_once()) {
        return;
    }
    use storage_lock_core::CasWrite;
    use storage_lock_core::fault::{FaultyStorage, Op, PrimitivesOnly};
    let p = unique_prefix("write_all");
    let (a, b, c) = (format!("{p}a"), format!("{p}b"), format!("{p}c"));
    let first = record(OwnerId::random(), 1, None);
    let va = cas(&s).create(&a, &first).await.unwrap();
    let second = record(OwnerId::random(), 2, None);
    let vb = cas(&s).create(&b, &second).await.unwrap();
    let stale = cas(&s).update(&b, &vb, &second).await.unwrap();
    assert_ne!(stale, vb);
    let new = record(OwnerId::random(), 3, None);
    for refused in [
        // b's version is stale; c is new.
        vec![
            CasWrite {
                key: &c,
                expected: None,
                record: &new,
            },
            CasWrite {
                key: &b,
                expected: Some(&vb),
                record: &new,
            },
        ],
        // a exists.
        vec![
            CasWrite {
                key: &c,
                expected: None,
                record: &new,
            },
            CasWrite {
                key: &a,
                expected: None,
                record: &new,
            },
        ],
    ] {
        let err = cas(&s).write_all(&refused).await.unwrap_err();
        if matches!(err, StorageError::Unsupported { .. }) {
            // A service that turns out not to have the call (an emulator): the storage must
            // have learned it, so that multi-locks stop asking.
            assert!(!cas(&s).writes_all_at_once(), "{err:?}");
            return;
        }
        assert!(err.is_cas_conflict(), "{err:?}");
        assert!(
            s.get(&c).await.unwrap().is_none(),
            "c was written by a refused write_all"
        );
        assert_eq!(s.get(&b).await.unwrap().unwrap().record, second);
    }
    let versions = cas(&s)
        .write_all(&[
            CasWrite {
                key: &a,
                expected: Some(&va),
                record: &new,
            },
            CasWrite {
                key: &c,
                expected: None,
                record: &new,
            },
        ])
        .await
        .unwrap();
    for (key, version) in [&a, &c].into_iter().zip(&versions) {
        let stored = s.get(key).await.unwrap().unwrap();
        assert_eq!((&stored.version, &stored.record), (version, &new), "{key}");
    }

    // Known keys: one write, no read.
    let counted = PrimitivesOnly(FaultyStorage::new(s));
    let keys: Vec<String> = ["x", "y"].iter().map(|k| format!("{p}{k}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let lease = Duration::from_secs(30);
    let owner = OwnerId::random();
    let taken = counted
        .acquire_many(&keys, &request(owner, lease, false))
        .await
        .unwrap();
    assert!(
        matches!(taken, AcquireManyOutcome::Acquired(_)),
        "{taken:?}"
    );
    for key in &keys {
        counted.release(key, owner).await.unwrap();
    }
    let known = keys.iter().all(|k| cas(&counted).known(k).is_some());
    let single =
        |c: &PrimitivesOnly<FaultyStorage<S>>| c.0.calls(Op::Create) + c.0.calls(Op::Update);
    let (gets, writes, singles) = (
        counted.0.calls(Op::Get),
        counted.0.calls(Op::WriteAll),
        single(&counted),
    );
    let taken = counted
        .acquire_many(&keys, &request(OwnerId::random(), lease, false))
        .await
        .unwrap();
    assert!(
        matches!(taken, AcquireManyOutcome::Acquired(_)),
        "{taken:?}"
    );
    assert_eq!(counted.0.calls(Op::WriteAll), writes + 1);
    assert_eq!(single(&counted), singles, "a key was written on its own");
    if known {
        assert_eq!(counted.0.calls(Op::Get), gets, "a known key was read");
    }
}

/// Release writes a tombstone (count 0, fencing kept) instead of deleting, and the next
/// acquisition gets the next token.
pub async fn release_writes_tombstone<S: Storage>(s: S) {
    let key = unique_prefix("tombstone") + "k";
    let a = OwnerId::random();
    let first = fencing_of(
        &s.acquire_once(&key, &request(a, Duration::from_secs(30), false))
            .await
            .unwrap(),
    );
    assert_eq!(
        s.release(&key, OwnerId::random()).await.unwrap(),
        ReleaseOutcome::NotHeld,
        "a stranger cannot release"
    );
    assert_eq!(
        s.release(&key, a).await.unwrap(),
        ReleaseOutcome::Released {
            remaining: 0,
            fencing: first
        },
        "a release says what it released"
    );
    let tomb = s.get(&key).await.unwrap().expect("tombstone kept").record;
    assert_eq!(tomb.count, 0);
    assert_eq!(tomb.fencing, first);
    assert_eq!(s.release(&key, a).await.unwrap(), ReleaseOutcome::NotHeld);
    let next = s
        .acquire_once(
            &key,
            &request(OwnerId::random(), Duration::from_secs(30), false),
        )
        .await
        .unwrap();
    assert_next_token(&s, first, fencing_of(&next)).await;
}

/// `list_locks` returns exactly the keys under a prefix, in order, across pages, without
/// internal keys.
pub async fn list_by_prefix_in_pages<S: Storage>(s: S) {
    let p = unique_prefix("list");
    let mut keys: Vec<String> = (0..5).map(|i| format!("{p}k{i}")).collect();
    for k in keys.iter().rev() {
        cas(&s)
            .create(k, &record(OwnerId::random(), 1, None))
            .await
            .unwrap();
    }
    cas(&s)
        .create(&p, &record(OwnerId::random(), 1, None))
        .await
        .unwrap();
    cas(&s)
        .create(
            &format!("{}other", unique_prefix("list")),
            &record(OwnerId::random(), 1, None),
        )
        .await
        .unwrap();
    s.raise_fencing_floor(1).await.unwrap();
    keys.insert(0, p.clone());
    let mut seen = Vec::new();
    let mut page = PageRequest {
        after: None,
        limit: 2,
    };
    loop {
        let got = s.list_locks(&p, &page).await.unwrap();
        assert!(got.entries.len() <= 2);
        seen.extend(got.entries.into_iter().map(|(k, _)| k));
        match got.next {
            Some(next) => page.after = Some(next),
            None => break,
        }
    }
    assert_eq!(seen, keys);
    let everything = s.list_locks("", &PageRequest::default()).await.unwrap();
    assert!(
        everything
            .entries
            .iter()
            .all(|(k, _)| k != FENCING_FLOOR_KEY)
    );
}

/// The storage clock does not run backwards across reads and is within ten minutes of this
/// host's clock (all servers in these tests run on loopback).
pub async fn clock_is_sane<S: Storage>(s: S) {
    let mut last = s.now().await.unwrap();
    for _ in 0..20 {
        let now = s.now().await.unwrap();
        assert!(
            now >= last,
            "storage clock went backwards: {last:?} → {now:?}"
        );
        last = now;
    }
    let here = SystemClock.now();
    let skew = here.saturating_since(last).max(last.saturating_since(here));
    assert!(
        skew < Duration::from_secs(600),
        "storage clock is {skew:?} off"
    );
}

/// Only the owner's live hold renews; an expired one does not, even if nobody took it.
pub async fn renew_requires_owner_and_live_hold<S: Storage>(s: S) {
    let p = unique_prefix("renew");
    let a = OwnerId::random();
    // The owner renews within a short lease.
    let s = &s;
    let (key, _, ()) =
        within_a_short_lease(&p, Duration::from_millis(300), |key, lease| async move {
            let acquired = s
                .acquire_once(&key, &request(a, lease, false))
                .await
                .unwrap();
            let AcquireOutcome::Acquired { expires_at, .. } = acquired else {
                panic!("{acquired:?}")
            };
            assert_eq!(
                s.renew(&key, OwnerId::random(), Duration::from_secs(5))
                    .await
                    .unwrap(),
                RenewOutcome::NotHeld
            );
            match s.renew(&key, a, Duration::from_secs(5)).await.unwrap() {
                RenewOutcome::Renewed { expires_at: later } => {
                    assert!(later > expires_at);
                    Ok(())
                }
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    match s.renew(&key, a, Duration::from_millis(100)).await.unwrap() {
        RenewOutcome::Renewed { .. } => {}
        other => panic!("{other:?}"),
    }
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert_eq!(
        s.renew(&key, a, Duration::from_secs(5)).await.unwrap(),
        RenewOutcome::NotHeld
    );
    assert_eq!(
        s.renew(&format!("{key}-missing"), a, Duration::from_secs(5))
            .await
            .unwrap(),
        RenewOutcome::NotHeld
    );
}

/// `renew_many` answers each key in request order with what `renew` would have answered:
/// the owner's live holds are extended by their own leases; another owner's hold, a missing
/// key, a tombstone and an expired hold are `NotHeld`, and none of them keeps the others from
/// being renewed. An empty call is an empty answer. A key asked for by two owners in one call
/// is renewed for its holder only.
pub async fn renew_many_decides_each_key_on_its_own<S: Storage>(s: S) {
    let p = unique_prefix("renew_many");
    let (a, b) = (OwnerId::random(), OwnerId::random());
    let key = |i: usize| format!("{p}k{i}");
    let take = |k: String, owner, lease| {
        let s = &s;
        async move {
            match s
                .acquire_once(&k, &request(owner, lease, false))
                .await
                .unwrap()
            {
                AcquireOutcome::Acquired { expires_at, .. } => expires_at,
                busy => panic!("{busy:?}"),
            }
        }
    };
    // Long enough to outlast the setup on a slow backend (an emulator); key 4's 100 ms are
    // meant to run out.
    let short = Duration::from_secs(3);
    let first = take(key(0), a, short).await;
    take(key(1), b, Duration::from_secs(30)).await;
    take(key(3), a, Duration::from_secs(30)).await;
    s.release(&key(3), a).await.unwrap();
    take(key(4), a, Duration::from_millis(100)).await;
    take(key(5), a, short).await;
    tokio::time::sleep(Duration::from_millis(200)).await; // key 4 expires
    let keys: Vec<String> = (0..6).map(key).collect();
    let lease = |i: usize| match i {
        5 => Duration::from_secs(20),
        _ => Duration::from_secs(5),
    };
    let requests: Vec<RenewRequest<'_>> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| RenewRequest {
            key: k,
            owner: a,
            lease: lease(i),
        })
        .collect();
    let answers: Vec<RenewOutcome> = s
        .renew_many(&requests)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(answers.len(), 6, "{answers:?}");
    let renewed = |o: &RenewOutcome| match o {
        RenewOutcome::Renewed { expires_at } => *expires_at,
        other => panic!("expected Renewed, got {other:?} in {answers:?}"),
    };
    let (e0, e5) = (renewed(&answers[0]), renewed(&answers[5]));
    assert!(e0 > first, "{answers:?}");
    assert!(
        e5 >= e0.saturating_add(Duration::from_secs(14)),
        "each key gets its own lease: {answers:?}"
    );
    for i in [1, 2, 3, 4] {
        assert_eq!(answers[i], RenewOutcome::NotHeld, "key {i}: {answers:?}");
    }
    // What was renewed is stored: the records carry the new expiries.
    for (i, expiry) in [(0, e0), (5, e5)] {
        let rec = s.get(&key(i)).await.unwrap().expect("record").record;
        assert!(rec.count == 1 && rec.owner == a, "{rec:?}");
        assert_eq!(rec.expires_at, expiry, "key {i}");
    }
    assert!(s.renew_many(&[]).await.unwrap().is_empty());

    // One key asked for by its holder and by another owner in the same call: only the holder's
    // request is renewed, whatever the order (an answer must never come from another owner's
    // row: that would keep a lost hold alive).
    let k = key(0);
    for (first, second) in [(b, a), (a, b)] {
        let both = [
            RenewRequest {
                key: &k,
                owner: first,
                lease: Duration::from_secs(5),
            },
            RenewRequest {
                key: &k,
                owner: second,
                lease: Duration::from_secs(5),
            },
        ];
        let answers: Vec<RenewOutcome> = s
            .renew_many(&both)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        let holder_is_first = first == a;
        assert_eq!(
            matches!(answers[0], RenewOutcome::Renewed { .. }),
            holder_is_first,
            "{answers:?}"
        );
        assert_eq!(
            matches!(answers[1], RenewOutcome::Renewed { .. }),
            !holder_is_first,
            "{answers:?}"
        );
    }
}

/// An expired hold is free: another owner takes it with the next fencing token.
pub async fn expired_hold_is_taken_over_with_next_token<S: Storage>(s: S) {
    let p = unique_prefix("takeover");
    // A short lease, checked busy before it runs out.
    let s = &s;
    let (key, lease, first) =
        within_a_short_lease(&p, Duration::from_millis(100), |key, lease| async move {
            let first = fencing_of(
                &s.acquire_once(&key, &request(OwnerId::random(), lease, false))
                    .await
                    .unwrap(),
            );
            let busy = s
                .acquire_once(
                    &key,
                    &request(OwnerId::random(), Duration::from_secs(30), false),
                )
                .await
                .unwrap();
            match busy {
                AcquireOutcome::Busy { .. } => Ok(first),
                taken => Err(format!("taken: {taken:?}")),
            }
        })
        .await;
    tokio::time::sleep(lease * 2).await;
    let second = s
        .acquire_once(
            &key,
            &request(OwnerId::random(), Duration::from_secs(30), false),
        )
        .await
        .unwrap();
    assert_next_token(s, first, fencing_of(&second)).await;
}

/// Runs `attempt(key, lease)` on a fresh key under `p` with a short `lease`, which must check
/// something before the lease runs out, and returns the key, the lease and what the attempt
/// returned. An attempt that fails (`Err`) is a failed test when it ended within the lease
/// (measured from before it began, so from before the lease began); on a machine too loaded to
/// check within the lease it proves nothing, and runs again on a fresh key with a lease twice
/// as long (up to 10 s).
async fn within_a_short_lease<T, F, Fut>(
    p: &str,
    mut lease: Duration,
    mut attempt: F,
) -> (String, Duration, T)
where
    F: FnMut(String, Duration) -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    loop {
        let key = format!("{p}k{}", lease.as_millis());
        let sent = tokio::time::Instant::now();
        match attempt(key.clone(), lease).await {
            Ok(value) => return (key, lease, value),
            Err(what) => assert!(
                sent.elapsed() >= lease && lease < Duration::from_secs(10),
                "{what} {:?} into a {lease:?} lease",
                sent.elapsed()
            ),
        }
        lease *= 2;
    }
}

/// The token after `previous` on one key is `previous + 1`, unless the per-storage fencing
/// floor (raised by sweeps of *other* keys sharing the storage) has passed `previous`: then the
/// default operations, which take `max(previous, floor) + 1`, may jump above the floor. Always
/// strictly greater.
pub async fn assert_next_token<S: Storage>(s: &S, previous: u64, next: u64) {
    let floor = s.fencing_floor().await.unwrap();
    if floor <= previous {
        assert_eq!(next, previous + 1, "floor {floor}");
    } else {
        assert!(
            next > previous,
            "token {next} after {previous} (floor {floor})"
        );
    }
}

/// Reentrant requests of the owner add levels and keep the token; release removes one level at
/// a time; a non-reentrant request of the same owner is busy.
pub async fn reentrant_acquire_counts_levels<S: Storage>(s: S) {
    let key = unique_prefix("reentrant") + "k";
    let a = OwnerId::random();
    let lease = Duration::from_secs(30);
    let first = s
        .acquire_once(&key, &request(a, lease, true))
        .await
        .unwrap();
    let second = s
        .acquire_once(&key, &request(a, lease, true))
        .await
        .unwrap();
    let (
        AcquireOutcome::Acquired {
            fencing: f1,
            count: 1,
            ..
        },
        AcquireOutcome::Acquired {
            fencing: f2,
            count: 2,
            ..
        },
    ) = (&first, &second)
    else {
        panic!("{first:?} {second:?}")
    };
    assert_eq!(f1, f2);
    let same_owner_plain = s
        .acquire_once(&key, &request(a, lease, false))
        .await
        .unwrap();
    assert!(matches!(same_owner_plain, AcquireOutcome::Busy { .. }));
    let other = s
        .acquire_once(&key, &request(OwnerId::random(), lease, true))
        .await
        .unwrap();
    assert!(matches!(other, AcquireOutcome::Busy { .. }));
    assert_eq!(
        s.release(&key, a).await.unwrap(),
        ReleaseOutcome::Released {
            remaining: 1,
            fencing: *f1
        }
    );
    let other = s
        .acquire_once(&key, &request(OwnerId::random(), lease, true))
        .await
        .unwrap();
    assert!(matches!(other, AcquireOutcome::Busy { .. }));
    assert_eq!(
        s.release(&key, a).await.unwrap(),
        ReleaseOutcome::Released {
            remaining: 0,
            fencing: *f1
        }
    );
    let b = s
        .acquire_once(&key, &request(OwnerId::random(), lease, true))
        .await
        .unwrap();
    assert_next_token(&s, *f1, fencing_of(&b)).await;
}

/// A busy answer names the holder and when its hold lapses.
pub async fn busy_reports_holder_and_expiry<S: Storage>(s: S) {
    let key = unique_prefix("busy") + "k";
    let lease = Duration::from_secs(10);
    s.acquire_once(&key, &request(OwnerId::random(), lease, false))
        .await
        .unwrap();
    let busy = s
        .acquire_once(&key, &request(OwnerId::random(), lease, false))
        .await
        .unwrap();
    let AcquireOutcome::Busy { holder, .. } = &busy else {
        panic!("{busy:?}")
    };
    assert_eq!(holder.as_ref().map(|h| h.pid), Some(42));
    assert_eq!(
        holder.as_ref().and_then(|h| h.note.as_deref()),
        Some("suite")
    );
    let left = busy.busy_for().unwrap();
    assert!(
        left <= lease && left > lease - Duration::from_secs(5),
        "{left:?}"
    );
}

/// Fresh keys start above the fencing floor; the floor never goes down.
pub async fn fresh_keys_start_above_floor<S: Storage>(s: S) {
    let floor = s.fencing_floor().await.unwrap();
    let raised = s.raise_fencing_floor(floor + 1000).await.unwrap();
    assert!(raised >= floor + 1000);
    assert!(
        s.raise_fencing_floor(1).await.unwrap() >= raised,
        "the floor went down"
    );
    let key = unique_prefix("floor") + "k";
    let token = fencing_of(
        &s.acquire_once(
            &key,
            &request(OwnerId::random(), Duration::from_secs(30), false),
        )
        .await
        .unwrap(),
    );
    assert!(token > raised, "fresh key got {token}, floor is {raised}");
}

/// Sweeping old tombstones raises the floor first, so a swept key's next token is still higher.
pub async fn sweep_keeps_fencing_monotonic<S: Storage>(s: S) {
    let p = unique_prefix("sweep");
    let key = format!("{p}k");
    let a = OwnerId::random();
    let mut last = 0;
    for _ in 0..3 {
        last = fencing_of(
            &s.acquire_once(&key, &request(a, Duration::from_secs(30), false))
                .await
                .unwrap(),
        );
        s.release(&key, a).await.unwrap();
    }
    let held = format!("{p}held");
    s.acquire_once(&held, &request(a, Duration::from_secs(30), false))
        .await
        .unwrap();
    if !s.capabilities().conditional_delete {
        let err = s.sweep(&p, Duration::ZERO).await.unwrap_err();
        assert!(matches!(err, StorageError::Unsupported { .. }));
        return;
    }
    let report = s.sweep(&p, Duration::ZERO).await.unwrap();
    assert_eq!(report.deleted, 1, "only the tombstone goes: {report:?}");
    assert!(report.floor >= last);
    assert!(s.get(&key).await.unwrap().is_none());
    assert!(
        s.get(&held).await.unwrap().is_some(),
        "a live hold was swept"
    );
    let next = fencing_of(
        &s.acquire_once(&key, &request(a, Duration::from_secs(30), false))
            .await
            .unwrap(),
    );
    assert!(
        next > last,
        "token went from {last} to {next} across a sweep"
    );
}

/// Grants made by [`sweeps_racing_acquisitions_keep_tokens_increasing`]:
/// `STORAGE_LOCK_SWEEP_RACE_GRANTS` or 1500 (raise it for a soak).
fn sweep_race_grants() -> usize {
    std::env::var("STORAGE_LOCK_SWEEP_RACE_GRANTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1500)
}

/// Acquisitions racing sweeps: every sweep deletes the tombstones it finds (after raising the
/// fencing floor), so most acquisitions create a fresh record and read the floor while a sweep
/// may be raising it. Per key, the tokens of successive grants must strictly increase. A floor
/// read that does not conflict with the floor raise lets a delayed acquisition re-issue a token
/// already issued.
pub async fn sweeps_racing_acquisitions_keep_tokens_increasing<S: Storage>(s: S) {
    if !s.capabilities().conditional_delete {
        return; // nothing is ever deleted, so nothing can race a deletion
    }
    let s = Arc::new(s);
    let p = unique_prefix("sweep_race");
    let keys: Vec<String> = (0..2).map(|i| format!("{p}k{i}")).collect();
    let logs: Arc<Vec<std::sync::Mutex<Vec<u64>>>> =
        Arc::new(keys.iter().map(|_| Default::default()).collect());
    let target = sweep_race_grants();
    let granted = Arc::new(AtomicUsize::new(0));
    // Sweeps completed so far: acquirers go on until some have raced them (on a fast storage
    // the grants could otherwise all land before a sweeper is first scheduled).
    let swept = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut sweepers = Vec::new();
    for _ in 0..2 {
        let (s, p, swept, stop) = (s.clone(), p.clone(), swept.clone(), stop.clone());
        sweepers.push(tokio::spawn(async move {
            while !stop.load(Relaxed) {
                s.sweep(&p, Duration::ZERO).await.unwrap();
                swept.fetch_add(1, Relaxed);
                tokio::task::yield_now().await;
            }
        }));
    }
    let mut tasks = Vec::new();
    for worker in 0..6 {
        let (s, keys, logs) = (s.clone(), keys.clone(), logs.clone());
        let (granted, swept) = (granted.clone(), swept.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = worker;
            while granted.load(Relaxed) < target || swept.load(Relaxed) < 2 {
                i += 1;
                let k = i % keys.len();
                let owner = OwnerId::random();
                let req = request(owner, Duration::from_secs(30), false);
                match s.acquire_once(&keys[k], &req).await.unwrap() {
                    AcquireOutcome::Acquired { fencing, .. } => {
                        // Appended while held: the log is in grant order.
                        logs[k].lock().unwrap().push(fencing);
                        granted.fetch_add(1, Relaxed);
                        s.release(&keys[k], owner).await.unwrap();
                    }
                    AcquireOutcome::Busy { .. } => tokio::task::yield_now().await,
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    stop.store(true, Relaxed);
    for t in sweepers {
        t.await.unwrap();
    }
    let sweeps = swept.load(Relaxed);
    assert!(granted.load(Relaxed) >= target);
    assert!(sweeps >= 2, "no sweep raced the acquisitions");
    for (key, log) in keys.iter().zip(logs.iter()) {
        let log = log.lock().unwrap();
        for pair in log.windows(2) {
            assert!(
                pair[1] > pair[0],
                "{key}: token {} was granted after {} ({} grants, {sweeps} sweeps): a sweep \
                 raced an acquisition and an old token was issued again",
                pair[1],
                pair[0],
                log.len()
            );
        }
    }
}

/// `force_release` (admin) frees a key whoever holds it, returns the hold it ended, keeps the
/// fencing token so the next acquisition's is higher, and turns the evicted owner's renewals
/// into `NotHeld`. A free key reports `None` and stays as it is.
pub async fn force_release_frees_a_held_key_and_keeps_fencing<S: Storage>(s: S) {
    let key = unique_prefix("force") + "k";
    let a = OwnerId::random();
    let lease = Duration::from_secs(600);
    let token = fencing_of(
        &s.acquire_once(&key, &request(a, lease, false))
            .await
            .unwrap(),
    );
    let ended = s.force_release(&key).await.unwrap().expect("it was held");
    assert_eq!((ended.owner, ended.fencing), (a, token));
    assert_eq!(ended.holder.as_ref().map(|h| h.pid), Some(42));
    let tombstone = s.get(&key).await.unwrap().expect("a tombstone").record;
    assert_eq!(
        (tombstone.owner, tombstone.count, tombstone.fencing),
        (OwnerId::NOBODY, 0, token),
        "the tombstone tells the evicted owner it was force-released"
    );
    assert_eq!(
        s.renew(&key, a, lease).await.unwrap(),
        RenewOutcome::NotHeld
    );
    assert!(
        s.force_release(&key).await.unwrap().is_none(),
        "already free"
    );
    let b = OwnerId::random();
    let next = fencing_of(
        &s.acquire_once(&key, &request(b, lease, false))
            .await
            .unwrap(),
    );
    assert_next_token(&s, token, next).await;
    assert!(
        s.force_release(&format!("{key}-missing"))
            .await
            .unwrap()
            .is_none()
    );
}

/// Keys are compared as bytes on every backend: names that differ only by trailing spaces, by
/// case, or by Unicode normalization form are different locks (MariaDB's PAD SPACE collation
/// made `rv-pad` and `rv-pad ` one lock), and `list` returns each under its own key.
pub async fn keys_differing_by_padding_case_or_normalization_are_distinct<S: Storage>(s: S) {
    let p = unique_prefix("distinct");
    let names = [
        "rv-pad",
        "rv-pad ",
        "rv-pad  ",
        "RV-PAD",
        "caf\u{e9}",
        "cafe\u{301}",
    ];
    let lease = Duration::from_secs(30);
    for name in names {
        let key = format!("{p}{name}");
        let got = s
            .acquire_once(&key, &request(OwnerId::random(), lease, false))
            .await
            .unwrap();
        assert!(
            matches!(got, AcquireOutcome::Acquired { .. }),
            "{key:?} was taken as the same lock as an earlier name: {got:?}"
        );
    }
    let listed = s.list_locks(&p, &PageRequest::default()).await.unwrap();
    let keys: Vec<&str> = listed.entries.iter().map(|(k, _)| &k[p.len()..]).collect();
    let mut expected = names.to_vec();
    expected.sort_unstable();
    assert_eq!(keys, expected, "byte order, each key as written");
}

/// A listing with a page size of 0 does not panic.
pub async fn list_with_page_size_zero_makes_progress<S: Storage>(s: S) {
    let p = unique_prefix("page0");
    for k in ["a", "b"] {
        cas(&s)
            .create(&format!("{p}{k}"), &record(OwnerId::random(), 1, None))
            .await
            .unwrap();
    }
    let page = storage_lock_core::Page::from_sorted(Vec::new(), 0);
    assert!(page.entries.is_empty() && page.next.is_none());
    let listed = s
        .list(
            &p,
            &PageRequest {
                limit: 0,
                ..PageRequest::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(listed.entries.len(), 2, "0 means the default page size");
}

/// A fresh key held by a fresh owner for 60 s with a waiter on it, as the engine waits: a
/// change wait armed, then an attempt refused as busy (what tells some backends, e.g.
/// PostgreSQL, that freeing the key must notify). `None` if the storage does not declare
/// change notifications; its wait must then say it is unsupported.
async fn held_with_a_waiter<S: Storage>(
    s: &S,
    prefix: &str,
) -> Option<(String, OwnerId, storage_lock_core::ChangeWait)> {
    let key = unique_prefix(prefix) + "k";
    let a = OwnerId::random();
    s.acquire_once(&key, &request(a, Duration::from_secs(60), false))
        .await
        .unwrap();
    let change = s.wait_for_change(&key).await.unwrap();
    if !s.capabilities().change_notifications {
        assert!(!change.is_supported(), "a wait without the capability");
        return None;
    }
    assert!(
        change.is_supported(),
        "declared, but the wait is unsupported"
    );
    // Let a listener connection come up before the change it must report.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let busy = s
        .acquire_once(
            &key,
            &request(OwnerId::random(), Duration::from_secs(60), false),
        )
        .await
        .unwrap();
    assert!(matches!(busy, AcquireOutcome::Busy { .. }), "{busy:?}");
    Some((key, a, change))
}

/// The promise of [`storage_lock_core::Capabilities::change_notifications`] covers every way a
/// key becomes free, not only `release`: an administrator's `force_release` (a tombstone written
/// with the `update` primitive) wakes a waiter too, so the lock passes on at once instead of at
/// the waiter's next re-check (the engine re-checks every 2 s).
pub async fn force_release_wakes_waiters<S: Storage>(s: S) {
    let Some((key, a, change)) = held_with_a_waiter(&s, "force-wake").await else {
        return;
    };
    let ended = s.force_release(&key).await.unwrap().expect("it was held");
    assert_eq!(ended.owner, a);
    tokio::time::timeout(Duration::from_secs(5), change.changed())
        .await
        .expect("no notification within 5 s of a force release (the hold had 60 s left)");
}

/// [`storage_lock_core::Capabilities::change_notifications`] is a promise: a storage that
/// declares it wakes a waiter — armed with `wait_for_change`, then refused as busy — when the
/// holder releases (well before the hold's expiry); one that does not returns an unsupported
/// wait (waiters back off).
pub async fn declared_change_notifications_are_delivered<S: Storage>(s: S) {
    let Some((key, a, change)) = held_with_a_waiter(&s, "notify").await else {
        return;
    };
    s.release(&key, a).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), change.changed())
        .await
        .expect("no notification within 5 s of the release (the hold had 60 s left)");
}

/// One record that does not decode is one bad row. The test holds `prefix + "a-lock"` through
/// `s` and calls `write_garbage(prefix + "b-garbage")`, which writes bytes that are no
/// storage-lock record under that key with the backend's own client; listing `prefix` then
/// reports the garbage key in [`storage_lock_core::Page::corrupt`] and lists the held lock, and
/// (where the storage can sweep) a sweep skips the garbage instead of failing. Not part of the
/// macro's suites: writing raw bytes needs each backend's own client.
pub async fn a_corrupt_record_is_one_bad_row<S, F, Fut>(s: S, write_garbage: F)
where
    S: Storage,
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let prefix = unique_prefix("corrupt");
    let good = format!("{prefix}a-lock");
    let bad = format!("{prefix}b-garbage");
    let req = request(OwnerId::random(), Duration::from_secs(30), false);
    let held = fencing_of(&s.acquire_once(&good, &req).await.unwrap());
    write_garbage(bad.clone()).await;
    let page = s
        .list(&prefix, &PageRequest::default())
        .await
        .expect("one bad record does not fail the listing");
    let keys: Vec<&str> = page.entries.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, [good.as_str()], "{page:?}");
    assert_eq!(page.corrupt.len(), 1, "{page:?}");
    assert_eq!(page.corrupt[0].0, bad, "{page:?}");
    let locks = s
        .list_locks(&prefix, &PageRequest::default())
        .await
        .expect("listing locks skips the bad record");
    assert_eq!(locks.entries.len(), 1, "{locks:?}");
    assert_eq!(
        s.release(&good, req.owner).await.unwrap(),
        ReleaseOutcome::Released {
            remaining: 0,
            fencing: held
        }
    );
    if s.capabilities().conditional_delete {
        s.sweep(&prefix, Duration::ZERO)
            .await
            .expect("a sweep skips the bad record");
    }
}

/// A clock that reads `by` ahead of [`storage_lock_core::MonotonicClock`]: a client whose wall
/// clock runs ahead (or was stepped forward) when its process started.
#[derive(Debug, Clone, Copy)]
pub struct Ahead(pub Duration);

impl Clock for Ahead {
    fn now(&self) -> storage_lock_core::Timestamp {
        storage_lock_core::MonotonicClock
            .now()
            .saturating_add(self.0)
    }
}

/// No wall clock decides expiry: `ahead`, a second client of the same store whose clock runs
/// an hour ahead of `holder`'s ([`Ahead`]), finds a held lock busy for (about) the lease the
/// holder took, not an hour less; once that short lease has run out it takes the lock, and its
/// token is higher. For every storage whose expiry is the storage's own clock or observed
/// ([`storage_lock_core::TimeSource::Server`] / [`storage_lock_core::TimeSource::Observed`]);
/// a storage that compares an injected clock across clients fails it by design.
pub async fn a_contender_whose_clock_runs_ahead_finds_a_held_lock_busy<S: Storage, T: Storage>(
    holder: S,
    ahead: T,
) {
    let key = unique_prefix("skew") + "k";
    let lease = Duration::from_millis(1500);
    let first = fencing_of(
        &holder
            .acquire_once(&key, &request(OwnerId::random(), lease, false))
            .await
            .unwrap(),
    );
    let contender = request(OwnerId::random(), Duration::from_secs(30), false);
    let busy = ahead.acquire_once(&key, &contender).await.unwrap();
    let left = busy
        .busy_for()
        .unwrap_or_else(|| panic!("a contender an hour ahead took a held lock: {busy:?}"));
    // At most the lease, plus the read's own time (the contender counts from the answer).
    assert!(
        left > Duration::from_millis(500) && left <= lease + Duration::from_secs(5),
        "the contender sees {left:?} left of a {lease:?} lease"
    );
    // Liveness: once the lease has run out on the contender's own clock, it takes the lock.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let second = loop {
        match ahead.acquire_once(&key, &contender).await.unwrap() {
            AcquireOutcome::Acquired { fencing, .. } => break fencing,
            busy => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "a lease of {lease:?} never ran out for the contender: {busy:?}"
                );
                tokio::time::sleep(
                    busy.busy_for()
                        .unwrap_or_default()
                        .max(Duration::from_millis(10)),
                )
                .await;
            }
        }
    };
    assert!(second > first, "token {second} after {first}");
}

/// For a storage that keeps the records it wrote as hints ([`storage_lock_core::Primitives::known`]):
/// the holder's renewal and release, and its next acquisition of the key it released, are one
/// compare-and-set each, with no read; a stranger's attempt on a stale hint still reads before
/// it answers.
pub async fn a_known_record_saves_the_read<S: Storage>(s: S) {
    use storage_lock_core::fault::{FaultyStorage, Op, PrimitivesOnly};
    // The default operations over the counted primitives (and the storage's hints).
    let counted = Arc::new(FaultyStorage::new(s));
    let s = PrimitivesOnly(counted.clone());
    let key = unique_prefix("hint") + "k";
    let a = OwnerId::random();
    let lease = Duration::from_secs(30);
    let first = fencing_of(
        &s.acquire_once(&key, &request(a, lease, false))
            .await
            .unwrap(),
    );
    let reads = counted.calls(Op::Get);
    let writes = counted.calls(Op::Update);
    assert!(matches!(
        s.renew(&key, a, lease).await.unwrap(),
        RenewOutcome::Renewed { .. }
    ));
    assert_eq!(
        s.release(&key, a).await.unwrap(),
        ReleaseOutcome::Released {
            remaining: 0,
            fencing: first
        }
    );
    let second = fencing_of(
        &s.acquire_once(&key, &request(a, lease, false))
            .await
            .unwrap(),
    );
    assert_eq!(second, first + 1);
    assert_eq!(
        counted.calls(Op::Get) - reads,
        0,
        "the hint saved every read"
    );
    assert_eq!(
        counted.calls(Op::Update) - writes,
        3,
        "one compare-and-set each"
    );
    // A stranger's hint says "held": it reads before it answers busy.
    let busy = s
        .acquire_once(&key, &request(OwnerId::random(), lease, false))
        .await
        .unwrap();
    assert!(busy.busy_for().is_some(), "{busy:?}");
    assert_eq!(
        counted.calls(Op::Get) - reads,
        1,
        "busy is answered on a read"
    );
}

/// For a storage whose change notifications carry records into its hints (etcd's and NATS's
/// watch): a waiter woken by the holder's release knows the freed record without reading it,
/// and takes the lock with one compare-and-set and no read.
pub async fn a_woken_waiter_takes_the_lock_in_one_request<S: Storage, T: Storage>(
    holder: S,
    waiter: T,
) {
    use storage_lock_core::fault::{FaultyStorage, Op, PrimitivesOnly};
    let key = unique_prefix("woken") + "k";
    let (a, b) = (OwnerId::random(), OwnerId::random());
    let lease = Duration::from_secs(30);
    let first = fencing_of(
        &holder
            .acquire_once(&key, &request(a, lease, false))
            .await
            .unwrap(),
    );
    let counted = Arc::new(FaultyStorage::new(waiter));
    let w = PrimitivesOnly(counted.clone());
    let busy = w
        .acquire_once(&key, &request(b, lease, false))
        .await
        .unwrap();
    assert!(busy.busy_for().is_some(), "{busy:?}");
    let freed = || {
        counted
            .primitives()
            .and_then(|p| p.known(&key))
            .is_some_and(|k| k.record.count == 0)
    };
    let mut wait = counted.wait_for_change(&key).await.unwrap();
    assert!(
        wait.is_supported(),
        "the storage must deliver notifications"
    );
    holder.release(&key, a).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !freed() {
        tokio::time::timeout_at(deadline, wait.changed())
            .await
            .expect("the release reached the waiter's hint within 30 s");
        wait = counted.wait_for_change(&key).await.unwrap();
    }
    let reads = counted.calls(Op::Get);
    let second = fencing_of(
        &w.acquire_once(&key, &request(b, lease, false))
            .await
            .unwrap(),
    );
    assert_eq!(second, first + 1);
    assert_eq!(
        counted.calls(Op::Get) - reads,
        0,
        "the woken waiter read nothing"
    );
}

/// For a storage whose refused compare-and-set carries the record it found
/// ([`StorageError::with_current`]: etcd's `Txn` failure branch, DynamoDB's
/// `ReturnValuesOnConditionCheckFailure`): a contender that lost the race on a stale hint
/// answers busy from the refusal, with no read, and a refused `create` and `update` carry the
/// stored record. `loser` must be a second client of `winner`'s storage (its own hints).
pub async fn a_lost_race_costs_one_request<S: Storage, T: Storage>(winner: S, loser: T) {
    use storage_lock_core::fault::{FaultyStorage, Op, PrimitivesOnly};
    let key = unique_prefix("lost_race") + "k";
    let (a, b) = (OwnerId::random(), OwnerId::random());
    let lease = Duration::from_secs(30);
    let counted = Arc::new(FaultyStorage::new(loser));
    let l = PrimitivesOnly(counted.clone());
    // The loser held the key and released it: its hint says "free".
    let first = fencing_of(
        &l.acquire_once(&key, &request(b, lease, false))
            .await
            .unwrap(),
    );
    l.release(&key, b).await.unwrap();
    // Meanwhile the winner took it (nothing is waiting, so no notification refreshes the
    // loser's hint).
    let second = fencing_of(
        &winner
            .acquire_once(&key, &request(a, lease, false))
            .await
            .unwrap(),
    );
    assert_eq!(second, first + 1);
    let (reads, writes) = (counted.calls(Op::Get), counted.calls(Op::Update));
    let busy = l
        .acquire_once(&key, &request(b, lease, false))
        .await
        .unwrap();
    assert!(busy.busy_for().is_some(), "{busy:?}");
    assert_eq!(
        (
            counted.calls(Op::Get) - reads,
            counted.calls(Op::Update) - writes
        ),
        (0, 1),
        "one refused compare-and-set, no read"
    );
    // Both refusals carry what is stored.
    let stored = winner.get(&key).await.unwrap().unwrap();
    let refused = cas(&*counted)
        .create(&key, &record(b, 1, None))
        .await
        .unwrap_err();
    assert!(refused.current().is_some(), "{refused:?}");
    carries_the_stored_record(&refused, &stored);
    let stale = Version::from_u64(1);
    let refused = cas(&*counted)
        .update(&key, &stale, &record(b, 1, None))
        .await
        .unwrap_err();
    assert!(refused.current().is_some(), "{refused:?}");
    carries_the_stored_record(&refused, &stored);
}
