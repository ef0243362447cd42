//! The default lock operations, built only on the CAS primitives.
//!
//! Each one reads the record, applies a rule from [`super::ops`], and writes conditionally on
//! the version it read; a typed conflict means someone else wrote in between, so it reads again.
//! Where the storage knows the record already ([`Primitives::known`]) the first attempt decides
//! on that instead of reading: a current hint saves the read, a stale one costs a failed
//! compare-and-set, and a "busy" or "not held" decided on a hint is decided again on a read.
//! Where a refused compare-and-set carries the record as the storage holds it
//! ([`StorageError::with_current`]), the retry decides on that instead of reading: it is what a
//! read right after the refusal would return, so a lost race costs one request.

use std::time::Duration;

use super::StorageExt;
use super::ops::{self, AcquireDecision, FENCING_FLOOR_KEY};
use super::primitives_of;
use super::{
    AcquireAnyOutcome, AcquireManyOutcome, AcquireOutcome, AcquireRequest, CasWrite, LockRecord,
    OwnerId, PageRequest, Primitives, ReleaseOutcome, RenewOutcome, RenewRequest, Storage,
    StorageError, Stored, SweepReport, Timestamp, Version,
};

pub(super) async fn try_acquire<S: Primitives + ?Sized>(
    s: &S,
    key: &str,
    req: &AcquireRequest,
) -> Result<AcquireOutcome, StorageError> {
    let mut next = Basis::hint(s.known(key));
    loop {
        let now = s.now().await?;
        let (current, hinted) = next.take(s, key).await?;
        let record = match current.as_ref().map(|c| &c.record) {
            Some(rec) if rec.is_held_at(now) => {
                // Busy or reentry: the floor plays no part.
                match ops::decide_acquire(Some(rec), 0, now, req) {
                    AcquireDecision::Busy(_) if hinted => continue,
                    AcquireDecision::Busy(outcome) => return Ok(outcome),
                    AcquireDecision::Reenter { count, expires_at } => LockRecord {
                        count,
                        expires_at,
                        ..rec.clone()
                    },
                    AcquireDecision::Take(record) => record,
                }
            }
            // A new hold. A record that exists carries the key's highest token: every token
            // issued for the key since a sweep last deleted its record is on it, and a sweep
            // that deletes it after this read makes the compare-and-set below fail, so the
            // retry starts fresh. Only a fresh key must exceed every token a sweep deleted, so
            // only then is the floor read, after the record (see `decide_acquire`): one
            // request fewer for a key that was held before.
            Some(rec) => match ops::decide_acquire(Some(rec), 0, now, req) {
                AcquireDecision::Take(record) => record,
                other => unreachable!("a free key is always taken, not {other:?}"),
            },
            None => match ops::decide_acquire(None, s.fencing_floor().await?, now, req) {
                AcquireDecision::Take(record) => record,
                other => unreachable!("a free key is always taken, not {other:?}"),
            },
        };
        let version = match write(s, key, current.as_ref(), &record).await {
            Ok(version) => version,
            Err(e) if e.is_cas_conflict() => {
                next = Basis::after_conflict(&e);
                continue;
            }
            Err(e) => return Err(e),
        };
        if current.is_some() {
            return Ok(ops::acquired(&record));
        }
        // A create succeeds whenever the key is absent, even if, since the floor was read, the
        // key was created, released and swept by others (the sweep raising the floor above
        // their tokens): the token chosen may already have been issued. It is not issued yet
        // by this call, so check the floor again and move the token above it if needed.
        match settle_fresh_token(s, key, version, record).await? {
            Some(record) => return Ok(ops::acquired(&record)),
            None => continue,
        }
    }
}

/// What an attempt of a default lock operation decides on.
enum Basis {
    /// A read of the record.
    Read,
    /// What the storage knew already ([`Primitives::known`]): possibly stale, so a "busy" or
    /// "not held" decided on it is decided again on a read.
    Hint(Stored),
    /// The record a refused compare-and-set carried ([`StorageError::with_current`]): what the
    /// storage held when it refused, as good as a read.
    Carried(Stored),
}

impl Basis {
    fn hint(known: Option<Stored>) -> Self {
        known.map_or(Self::Read, Self::Hint)
    }

    /// After a compare-and-set conflict: what it carried, else a read.
    fn after_conflict(e: &StorageError) -> Self {
        e.current().cloned().map_or(Self::Read, Self::Carried)
    }

    /// The record to decide on (the next attempt reads, unless a conflict says otherwise), and
    /// whether it was a hint.
    async fn take<S: Primitives + ?Sized>(
        &mut self,
        s: &S,
        key: &str,
    ) -> Result<(Option<Stored>, bool), StorageError> {
        match std::mem::replace(self, Self::Read) {
            Self::Hint(known) => Ok((Some(known), true)),
            Self::Carried(current) => Ok((Some(current), false)),
            Self::Read => Ok((s.get(key).await?, false)),
        }
    }
}

/// After `record` was created under `version`: if the fencing floor has reached its token,
/// raises the token above the floor (compare-and-set on `version`). `None` if the record
/// changed meanwhile (only possible once its lease ran out): acquire again.
async fn settle_fresh_token<S: Primitives + ?Sized>(
    s: &S,
    key: &str,
    version: Version,
    record: LockRecord,
) -> Result<Option<LockRecord>, StorageError> {
    let floor = s.fencing_floor().await?;
    if record.fencing > floor {
        return Ok(Some(record));
    }
    let record = LockRecord {
        fencing: floor.saturating_add(1),
        ..record
    };
    match s.update(key, &version, &record).await {
        Ok(_) => Ok(Some(record)),
        Err(e) if e.is_cas_conflict() => Ok(None),
        Err(e) => Err(e),
    }
}

pub(super) async fn renew<S: Primitives + ?Sized>(
    s: &S,
    key: &str,
    owner: OwnerId,
    lease: Duration,
) -> Result<RenewOutcome, StorageError> {
    let mut next = Basis::hint(s.known(key));
    loop {
        let now = s.now().await?;
        let (current, hinted) = next.take(s, key).await?;
        let (Some(c), Some(expires_at)) = (
            current.as_ref(),
            ops::decide_renew(current.as_ref().map(|c| &c.record), owner, now, lease),
        ) else {
            if hinted {
                continue;
            }
            return Ok(RenewOutcome::NotHeld);
        };
        let record = LockRecord {
            expires_at,
            ..c.record.clone()
        };
        match write(s, key, current.as_ref(), &record).await {
            Ok(_) => {
                return Ok(RenewOutcome::Renewed {
                    expires_at: record.expires_at,
                });
            }
            Err(e) if e.is_cas_conflict() => next = Basis::after_conflict(&e),
            Err(e) => return Err(e),
        }
    }
}

pub(super) async fn release<S: Primitives + ?Sized>(
    s: &S,
    key: &str,
    owner: OwnerId,
) -> Result<ReleaseOutcome, StorageError> {
    let mut next = Basis::hint(s.known(key));
    loop {
        let now = s.now().await?;
        let (current, hinted) = next.take(s, key).await?;
        let (Some(c), Some(release)) = (
            current.as_ref(),
            ops::decide_release(current.as_ref().map(|c| &c.record), owner, now),
        ) else {
            if hinted {
                continue;
            }
            return Ok(ReleaseOutcome::NotHeld);
        };
        let record = LockRecord {
            count: release.count,
            expires_at: release.expires_at,
            ..c.record.clone()
        };
        match write(s, key, current.as_ref(), &record).await {
            Ok(_) => {
                return Ok(ReleaseOutcome::Released {
                    remaining: record.count,
                    fencing: record.fencing,
                });
            }
            Err(e) if e.is_cas_conflict() => next = Basis::after_conflict(&e),
            Err(e) => return Err(e),
        }
    }
}

pub(super) async fn force_release<S: Primitives + ?Sized>(
    s: &S,
    key: &str,
    fencing: Option<u64>,
) -> Result<Option<LockRecord>, StorageError> {
    loop {
        let now = s.now().await?;
        let Some(current) = s.get(key).await? else {
            return Ok(None);
        };
        if !current.record.is_held_at(now) || fencing.is_some_and(|f| f != current.record.fencing) {
            return Ok(None);
        }
        let tombstone = LockRecord {
            owner: OwnerId::NOBODY,
            count: 0,
            expires_at: current.record.expires_at.min(now),
            ..current.record.clone()
        };
        match s.update(key, &current.version, &tombstone).await {
            Ok(_) => return Ok(Some(current.record)),
            Err(e) if e.is_cas_conflict() => continue,
            Err(e) => return Err(e),
        }
    }
}

pub(super) async fn fencing_floor<S: Storage + ?Sized>(s: &S) -> Result<u64, StorageError> {
    Ok(s.get(FENCING_FLOOR_KEY)
        .await?
        .map_or(0, |stored| stored.record.fencing))
}

pub(super) async fn raise_fencing_floor<S: Primitives + ?Sized>(
    s: &S,
    to: u64,
) -> Result<u64, StorageError> {
    loop {
        let current = s.get(FENCING_FLOOR_KEY).await?;
        if let Some(c) = &current
            && c.record.fencing >= to
        {
            return Ok(c.record.fencing);
        }
        let now = s.now().await?;
        let record = LockRecord {
            owner: OwnerId::from_u128(0),
            count: 0,
            fencing: to,
            acquired_at: now,
            expires_at: now,
            holder: None,
        };
        match write(s, FENCING_FLOOR_KEY, current.as_ref(), &record).await {
            Ok(_) => return Ok(to),
            Err(e) if e.is_cas_conflict() => continue,
            Err(e) => return Err(e),
        }
    }
}

pub(super) async fn sweep<S: Primitives + ?Sized>(
    s: &S,
    prefix: &str,
    older_than: Duration,
) -> Result<SweepReport, StorageError> {
    if !s.capabilities().conditional_delete {
        return Err(StorageError::Unsupported {
            backend: s.name().to_owned(),
            operation: "sweep (needs conditional delete)",
        });
    }
    let now = s.now().await?;
    let cutoff = Timestamp::from_millis(
        now.as_millis()
            .saturating_sub(u64::try_from(older_than.as_millis()).unwrap_or(u64::MAX)),
    );
    let mut victims = Vec::new();
    let mut page = PageRequest::default();
    loop {
        let listed = s.list_locks(prefix, &page).await?;
        victims.extend(
            listed
                .entries
                .into_iter()
                .filter(|(_, st)| !st.record.is_held_at(now) && st.record.expires_at <= cutoff),
        );
        match listed.next {
            Some(next) => page.after = Some(next),
            None => break,
        }
    }
    let max_token = victims.iter().map(|(_, st)| st.record.fencing).max();
    let floor = match max_token {
        Some(token) => s.raise_fencing_floor(token).await?,
        None => s.fencing_floor().await?,
    };
    let mut deleted = 0;
    for (key, stored) in &victims {
        match s.delete(key, &stored.version).await {
            Ok(()) => deleted += 1,
            Err(e) if e.is_cas_conflict() => {} // re-acquired meanwhile: keep it
            Err(e) => return Err(e),
        }
    }
    Ok(SweepReport { deleted, floor })
}

/// Creates the record if there was none, else updates it conditionally on the version read;
/// returns the new version.
async fn write<S: Primitives + ?Sized>(
    s: &S,
    key: &str,
    current: Option<&Stored>,
    record: &LockRecord,
) -> Result<Version, StorageError> {
    match current {
        None => s.create(key, record).await,
        Some(c) => s.update(key, &c.version, record).await,
    }
}

/// One [`Storage::renew`] per key, all at once (the engine sends at most
/// [`crate::RENEW_BATCH`]), answers in request order: the call takes about one renewal's time,
/// however many keys it carries.
pub(super) async fn renew_many<S: Storage + ?Sized>(
    s: &S,
    renewals: &[RenewRequest<'_>],
) -> Vec<Result<RenewOutcome, StorageError>> {
    // The futures are built before the await (a combinator holding the closure across it would
    // not be `Send` for every lifetime).
    let calls: Vec<_> = renewals
        .iter()
        .map(|r| s.renew(r.key, r.owner, r.lease))
        .collect();
    futures_util::future::join_all(calls).await
}

/// [`Storage::acquire_many`] key by key: [`Storage::acquire_once`] on each in order; at the
/// first busy key (or error), the keys taken so far are released, in reverse order.
pub(super) async fn acquire_many<S: Storage + ?Sized>(
    s: &S,
    keys: &[&str],
    req: &AcquireRequest,
) -> Result<AcquireManyOutcome, StorageError> {
    let mut taken = Vec::with_capacity(keys.len());
    for (index, key) in keys.iter().enumerate() {
        let failed = match s.acquire_once(key, req).await {
            Ok(outcome @ AcquireOutcome::Acquired { .. }) => {
                taken.push(outcome);
                continue;
            }
            Ok(outcome) => Ok(AcquireManyOutcome::Busy { index, outcome }),
            Err(e) => Err(e),
        };
        give_back(s, &keys[..index], req.owner).await;
        return failed;
    }
    Ok(AcquireManyOutcome::Acquired(taken))
}

/// Write attempts of [`acquire_many_at_once`] refused by a concurrent write before it takes the
/// keys one by one instead.
const AT_ONCE_ATTEMPTS: u32 = 8;

/// [`Storage::acquire_many`] on primitives that write several keys at once: every key decided
/// by [`ops::decide_acquire`] on what the storage knows ([`Primitives::known`]) or reads, then
/// one [`Primitives::write_all`]. A busy key decided on a hint is read again; one busy on a
/// read ends the call with nothing written. A refused write (someone wrote one of the keys
/// since) starts over on reads. A fresh key's token is checked against the fencing floor after
/// the write, as [`try_acquire`] does.
pub(super) async fn acquire_many_at_once<S: Primitives + ?Sized>(
    s: &S,
    keys: &[&str],
    req: &AcquireRequest,
) -> Result<AcquireManyOutcome, StorageError> {
    let mut use_hints = true;
    'attempt: for _ in 0..AT_ONCE_ATTEMPTS {
        let now = s.now().await?;
        let mut current: Vec<Option<Stored>> = Vec::with_capacity(keys.len());
        let mut records: Vec<LockRecord> = Vec::with_capacity(keys.len());
        for (index, key) in keys.iter().enumerate() {
            let hint = use_hints.then(|| s.known(key)).flatten();
            let hinted = hint.is_some();
            let mut stored = match hint {
                Some(hint) => Some(hint),
                None => s.get(key).await?,
            };
            let mut planned = planned_write(stored.as_ref(), now, req);
            if hinted && planned.is_err() {
                stored = s.get(key).await?;
                planned = planned_write(stored.as_ref(), now, req);
            }
            match planned {
                Ok(record) => records.push(record),
                Err(outcome) => return Ok(AcquireManyOutcome::Busy { index, outcome }),
            }
            current.push(stored);
        }
        if current.iter().any(Option::is_none) {
            // Fresh keys start above the floor (read after the records, as `decide_acquire`
            // requires).
            let above = s.fencing_floor().await?.saturating_add(1);
            for (record, _) in records
                .iter_mut()
                .zip(&current)
                .filter(|(_, c)| c.is_none())
            {
                record.fencing = record.fencing.max(above);
            }
        }
        let writes: Vec<CasWrite<'_>> = keys
            .iter()
            .zip(&current)
            .zip(&records)
            .map(|((key, c), record)| CasWrite {
                key,
                expected: c.as_ref().map(|c| &c.version),
                record,
            })
            .collect();
        let versions = match s.write_all(&writes).await {
            Ok(versions) => versions,
            Err(e) if e.is_cas_conflict() => {
                use_hints = false;
                continue;
            }
            // Not for this many keys (a transaction's size limit): one by one.
            Err(StorageError::Unsupported { .. }) => break,
            Err(e) => return Err(e),
        };
        let mut granted = Vec::with_capacity(keys.len());
        for (((key, c), record), version) in keys.iter().zip(&current).zip(records).zip(versions) {
            if c.is_some() {
                granted.push(ops::acquired(&record));
                continue;
            }
            match settle_fresh_token(s, key, version, record).await {
                Ok(Some(record)) => granted.push(ops::acquired(&record)),
                // The fresh record changed meanwhile (its lease ran out): give every key back
                // and start over.
                Ok(None) => {
                    give_back(s, keys, req.owner).await;
                    use_hints = false;
                    continue 'attempt;
                }
                // Every key is held: give them back before the error returns.
                Err(e) => {
                    give_back(s, keys, req.owner).await;
                    return Err(e);
                }
            }
        }
        return Ok(AcquireManyOutcome::Acquired(granted));
    }
    acquire_many(s, keys, req).await
}

/// [`Storage::acquire_any`] key by key: [`Storage::acquire_once`] on each in order until `need`
/// are taken; when the keys run out first, or a request fails, the keys taken are released.
/// The gate is read after the keys are taken.
pub(super) async fn acquire_any<S: Storage + ?Sized>(
    s: &S,
    keys: &[&str],
    need: usize,
    gate: Option<&str>,
    req: &AcquireRequest,
) -> Result<AcquireAnyOutcome, StorageError> {
    let mut taken: Vec<(usize, AcquireOutcome)> = Vec::with_capacity(need);
    let mut busy = Vec::new();
    for (index, key) in keys.iter().enumerate() {
        if taken.len() == need {
            break;
        }
        match s.acquire_once(key, req).await {
            Ok(outcome @ AcquireOutcome::Acquired { .. }) => taken.push((index, outcome)),
            Ok(outcome) => busy.push((index, outcome)),
            Err(e) => {
                give_back_taken(s, keys, &taken, req.owner).await;
                return Err(e);
            }
        }
    }
    if taken.len() < need {
        give_back_taken(s, keys, &taken, req.owner).await;
        return Ok(AcquireAnyOutcome::Busy(busy));
    }
    let Some(gate) = gate else {
        return Ok(AcquireAnyOutcome::Acquired { taken, gate: 0 });
    };
    let passed = match s.get(gate).await {
        Ok(stored) => gate_token(s, stored.as_ref().map(|g| &g.record)).await,
        Err(e) => Err(e),
    };
    match passed {
        Ok(Some(gate)) => Ok(AcquireAnyOutcome::Acquired { taken, gate }),
        refused => {
            give_back_taken(s, keys, &taken, req.owner).await;
            refused.map(|_| AcquireAnyOutcome::GateHeld)
        }
    }
}

/// The token a reader passes the gate `record` with ([`ops::decide_gate`]; the fencing floor
/// read when it has no record), or `None` when it is held.
pub(crate) async fn gate_token<S: Storage + ?Sized>(
    s: &S,
    record: Option<&LockRecord>,
) -> Result<Option<u64>, StorageError> {
    match ops::decide_gate(record) {
        ops::GateDecision::Held => Ok(None),
        ops::GateDecision::Passes(token) => Ok(Some(token)),
        ops::GateDecision::PassesWithFloor => crate::StorageExt::fencing_floor(s).await.map(Some),
    }
}

async fn give_back_taken<S: Storage + ?Sized>(
    s: &S,
    keys: &[&str],
    taken: &[(usize, AcquireOutcome)],
    owner: OwnerId,
) {
    let taken: Vec<&str> = taken
        .iter()
        .filter_map(|&(i, _)| keys.get(i).copied())
        .collect();
    give_back(s, &taken, owner).await;
}

/// Releases `owner`'s hold of every key (with the storage's own release); a failure leaves
/// that hold to its lease.
async fn give_back<S: Storage + ?Sized>(s: &S, keys: &[&str], owner: OwnerId) {
    for key in keys {
        if let Err(e) = s.release(key, owner).await {
            tracing::warn!(key = %key, error = %e, "a multi-key acquisition could not give a key back; it lapses with its lease");
        }
    }
}

/// The record [`ops::decide_acquire`] writes over `stored` (a fresh key's token as if the
/// floor were 0), or the busy answer.
fn planned_write(
    stored: Option<&Stored>,
    now: Timestamp,
    req: &AcquireRequest,
) -> Result<LockRecord, AcquireOutcome> {
    let rec = stored.map(|c| &c.record);
    match (ops::decide_acquire(rec, 0, now, req), rec) {
        (AcquireDecision::Take(record), _) => Ok(record),
        (AcquireDecision::Reenter { count, expires_at }, Some(rec)) => Ok(LockRecord {
            count,
            expires_at,
            ..rec.clone()
        }),
        (AcquireDecision::Busy(outcome), _) => Err(outcome),
        // A reentry needs a record; without one, `decide_acquire` takes the key.
        (AcquireDecision::Reenter { .. }, None) => Err(AcquireOutcome::Busy {
            expires_at: now,
            now,
            holder: None,
        }),
    }
}

/// [`StorageExt::semaphore_limit`] on the primitives: read the limit record, and create it if
/// absent and asked to (a lost race reads the winner's).
pub(super) async fn semaphore_limit<S: Storage + ?Sized>(
    storage: &S,
    key: &str,
    permits: Option<u64>,
) -> Result<Option<u64>, StorageError> {
    let limit = crate::kinds::limit_key(key);
    loop {
        if let Some(stored) = storage.get(&limit).await? {
            return Ok(Some(stored.record.fencing));
        }
        let Some(permits) = permits else {
            return Ok(None);
        };
        let now = storage.now().await?;
        let record = LockRecord {
            owner: OwnerId::NOBODY,
            count: 0,
            fencing: permits,
            acquired_at: now,
            expires_at: now,
            holder: None,
        };
        match primitives_of(storage, "semaphore_limit")?
            .create(&limit, &record)
            .await
        {
            Ok(_) => return Ok(Some(permits)),
            // Another party of the name wrote it first: read what it wrote.
            Err(StorageError::AlreadyExists { .. }) => {}
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use crate::MemoryStorage;
    use crate::fault::{FaultyStorage, Op, PrimitivesOnly};
    use crate::storage::{AcquireOutcome, AcquireRequest, OwnerId, Storage};

    /// The default acquisition reads the fencing floor only for a fresh key: a key whose
    /// record exists takes one read and one compare-and-set (etcd, NATS and S3 took a second
    /// read for it), and its next token is still the next one.
    #[tokio::test(flavor = "current_thread")]
    async fn only_a_fresh_key_reads_the_fencing_floor() {
        let counted = Arc::new(FaultyStorage::new(MemoryStorage::new()));
        let s = PrimitivesOnly(counted.clone());
        let req = |owner| AcquireRequest {
            owner,
            lease: Duration::from_secs(30),
            holder: None,
            reentrant: false,
        };
        let token = |o: AcquireOutcome| match o {
            AcquireOutcome::Acquired { fencing, .. } => fencing,
            busy => panic!("{busy:?}"),
        };
        let a = OwnerId::random();
        let gets = counted.calls(Op::Get);
        let first = token(s.acquire_once("k", &req(a)).await.unwrap());
        assert_eq!(
            counted.calls(Op::Get) - gets,
            3,
            "a fresh key: the record, the floor, the floor again after the create"
        );
        s.release("k", a).await.unwrap();
        let gets = counted.calls(Op::Get);
        let second = token(s.acquire_once("k", &req(OwnerId::random())).await.unwrap());
        assert_eq!(
            counted.calls(Op::Get) - gets,
            1,
            "a known key: the record only"
        );
        assert_eq!(second, first + 1);
    }
}
