//! One attempt at several keys, all or nothing: [`DistributedLock::try_acquire_many`] on a
//! [`StorageLock`], the step a multi-lock ([`crate::kinds::acquire_all`]) repeats.
//!
//! ```text
//! try_acquire_many(names, opts)
//!   ├─ validate names + options, normalize → keys          (no storage I/O before this point)
//!   ├─ sent_at = BootInstant::now()
//!   ├─ Storage::acquire_many(keys, req), detached           (one round trip on overriding backends)
//!   ├─ Busy { index } → Err(index): nothing is held
//!   └─ Acquired → every grant checked (fencing limit, expiry) → one LockHandle per key
//! ```
//!
//! Every key gets the same owner: the keys differ, so each record still names one hold, and
//! each handle renews and releases its own key. Cancel safety is the single acquisition's:
//! grants that arrive after the caller dropped the future are all released, right after them.

use super::LockEventKind;
use std::time::Duration;

use super::StorageLock;
use super::acquire::{Granted, detached};
use crate::clock::BootInstant;
use crate::contract::{AcquireOptions, LockError, validate_name};
use crate::hold::LockHandle;
use crate::small_key::SmallKey;
use crate::storage::{
    AcquireAnyOutcome, AcquireManyOutcome, AcquireOutcome, OwnerId, Storage, Timestamp,
};
use crate::telemetry::{self, Finish};

impl<S: Storage + ?Sized> StorageLock<S> {
    /// See [`crate::DistributedLock::try_acquire_many`].
    pub(crate) async fn acquire_many_handles(
        &self,
        names: &[&str],
        options: &AcquireOptions,
    ) -> Result<Result<Vec<LockHandle>, usize>, LockError> {
        let keys = self.distinct_keys(names, options)?;
        let req = self.request(OwnerId::random(), options, false);
        let sent_at = BootInstant::now();
        let (storage, held_keys, asked) = (self.storage.clone(), keys.clone(), req.clone());
        let outcome = detached(
            async move {
                let keys: Vec<&str> = held_keys.iter().map(SmallKey::as_str).collect();
                let outcome = storage.as_ref().acquire_many(&keys, &asked).await;
                (outcome, storage, held_keys, asked.owner)
            },
            // Dropped before the answer was taken in: grants are given back, and after a
            // failed request every key (it may have been applied; the owner is this call's).
            |(outcome, storage, keys, owner)| async move {
                if matches!(outcome, Ok(AcquireManyOutcome::Acquired(_)) | Err(_)) {
                    release_keys(storage.as_ref(), &keys, owner).await;
                }
            },
        )
        .await
        .0;
        // A busy position outside the keys is a broken answer, handled as a failed request.
        let outcome = outcome.and_then(|o| match o {
            AcquireManyOutcome::Busy { index, .. } if index >= keys.len() => {
                Err(crate::StorageError::Corrupt {
                    key: keys
                        .first()
                        .map(|k| k.as_str().to_owned())
                        .unwrap_or_default(),
                    reason: format!(
                        "a multi-key acquisition of {} keys answered key {index} busy",
                        keys.len()
                    ),
                })
            }
            o => Ok(o),
        });
        let failed: LockError = match outcome {
            Ok(AcquireManyOutcome::Busy { index, .. }) => {
                self.refused(Some(&keys[index]), sent_at);
                return Ok(Err(index));
            }
            Ok(AcquireManyOutcome::Acquired(outcomes)) => {
                match self
                    .hold_grants(keys.clone(), names, outcomes, req.owner, options, sent_at)
                    .await
                {
                    Ok(handles) => return Ok(Ok(handles)),
                    Err(e) => e,
                }
            }
            Err(e) => {
                // The storage may have applied the request although its answer was lost: the
                // owner is this call's own, so releasing every key is safe either way.
                self.give_back_after_error(&keys, req.owner);
                e.into()
            }
        };
        telemetry::acquire_finished(
            Finish::Error,
            BootInstant::now().saturating_duration_since(sent_at),
        );
        Err(failed)
    }

    /// An attempt that took nothing, reported as a single attempt that does not wait reports
    /// it: contended and timed out (on the first busy key, if one is named).
    fn refused(&self, busy: Option<&SmallKey>, sent_at: BootInstant) {
        if let Some(key) = busy {
            let events = &self.shared.events;
            events.emit(LockEventKind::Contended, key, None);
            telemetry::contended();
            events.emit(LockEventKind::TimedOut, key, None);
        }
        telemetry::acquire_finished(
            Finish::TimedOut,
            BootInstant::now().saturating_duration_since(sent_at),
        );
    }

    /// The handles of the grants `outcomes` (one per key of `keys`, named `names`), once
    /// checked ([`Self::check_grants`]); grants refused by the check are released first, then
    /// the error reported.
    async fn hold_grants(
        &self,
        keys: Vec<SmallKey>,
        names: &[&str],
        outcomes: Vec<AcquireOutcome>,
        owner: OwnerId,
        options: &AcquireOptions,
        sent_at: BootInstant,
    ) -> Result<Vec<LockHandle>, LockError> {
        let granted_at = BootInstant::now();
        match self.check_grants(&keys, outcomes, options, sent_at, granted_at) {
            Ok(granted) => self.start_holds(&keys, names, owner, options, &granted),
            Err(e) => {
                let storage = self.storage.clone();
                detached(
                    async move { release_keys(storage.as_ref(), &keys, owner).await },
                    |()| async {},
                )
                .await;
                Err(e)
            }
        }
    }

    /// The handles of checked grants (see [`Self::check_grants`]), one per key.
    fn start_holds(
        &self,
        keys: &[SmallKey],
        names: &[&str],
        owner: OwnerId,
        options: &AcquireOptions,
        granted: &[Granted],
    ) -> Result<Vec<LockHandle>, LockError> {
        let mut handles = Vec::with_capacity(keys.len());
        for ((key, name), granted) in keys.iter().zip(names).zip(granted) {
            telemetry::acquire_finished(
                Finish::Acquired,
                granted
                    .granted_at
                    .saturating_duration_since(granted.sent_at),
            );
            // Checked: starting a hold cannot fail any more.
            handles.push(self.start_hold(key, name, owner, options, granted)?);
        }
        Ok(handles)
    }

    /// The grants of `outcomes` (one per key), if every one is a first grant whose fencing
    /// token is within the storage's limit and whose expiry can be shown; the error of the
    /// first that is not.
    fn check_grants(
        &self,
        keys: &[SmallKey],
        outcomes: Vec<AcquireOutcome>,
        options: &AcquireOptions,
        sent_at: BootInstant,
        granted_at: BootInstant,
    ) -> Result<Vec<Granted>, LockError> {
        if outcomes.len() != keys.len() {
            return Err(LockError::Storage(crate::StorageError::Corrupt {
                key: keys
                    .first()
                    .map(|k| k.as_str().to_owned())
                    .unwrap_or_default(),
                reason: format!(
                    "a multi-key acquisition of {} keys answered {} grants",
                    keys.len(),
                    outcomes.len()
                ),
            }));
        }
        let (limit, bound) = self.shared.fencing_limit;
        keys.iter()
            .zip(outcomes)
            .map(|(key, outcome)| {
                let AcquireOutcome::Acquired {
                    fencing,
                    count,
                    expires_at,
                } = outcome
                else {
                    return Err(LockError::Storage(crate::StorageError::Corrupt {
                        key: key.as_str().to_owned(),
                        reason: "a multi-key acquisition answered a busy key among its grants"
                            .to_owned(),
                    }));
                };
                if fencing > limit && count <= 1 {
                    tracing::error!(key = %key, fencing, bound, "fencing token near the storage's bound: grant refused");
                    return Err(LockError::FencingExhausted {
                        key: key.as_str().to_owned(),
                        fencing,
                        bound,
                    });
                }
                if expires_at > Timestamp::MAX {
                    return Err(LockError::LeaseOutOfRange {
                        lease: options.lease,
                    });
                }
                Ok(Granted {
                    fencing,
                    count,
                    expires_at,
                    expires_in: options.lease,
                    sent_at,
                    granted_at,
                })
            })
            .collect()
    }
}

impl<S: Storage + ?Sized> StorageLock<S> {
    /// The keys of `names`, after the checks a request at several keys makes before any
    /// storage call: valid options and names, no two names of one key, no cancelled token.
    fn distinct_keys(
        &self,
        names: &[&str],
        options: &AcquireOptions,
    ) -> Result<Vec<SmallKey>, LockError> {
        options.validate()?;
        let mut keys = Vec::with_capacity(names.len());
        for name in names {
            validate_name(name)?;
            keys.push(SmallKey::new(&self.key_for(name)?));
        }
        // Two names of one key (a normalizer's doing) are two locks of one key: never held
        // together, so waiting for them would never end. Refused before any request.
        let mut seen = std::collections::HashMap::with_capacity(keys.len());
        for (i, key) in keys.iter().enumerate() {
            if let Some(first) = seen.insert(key.as_str(), i) {
                return Err(LockError::invalid_option(
                    "names",
                    format!(
                        "{:?} and {:?} are one lock (key {:?}): they can never be held together",
                        names[first],
                        names[i],
                        key.as_str()
                    ),
                ));
            }
        }
        if options.cancel.as_ref().is_some_and(|c| c.is_cancelled()) {
            if let Some(key) = keys.first() {
                self.shared.events.emit(LockEventKind::Cancelled, key, None);
            }
            telemetry::acquire_finished(Finish::Cancelled, Duration::ZERO);
            return Err(LockError::Cancelled);
        }
        Ok(keys)
    }

    /// One attempt at `need` of `names`, any of them, all or nothing, never waiting (a
    /// semaphore's step: [`Storage::acquire_any`], one round trip on overriding backends),
    /// only while the lock `gate`, if given, has no holder (a reader-writer lock's read).
    /// `Ok(Ok(_))`: the handles, with the position of each name taken, by position, and the
    /// gate's fencing token; `Ok(Err(_))`: nothing is held, because fewer than `need` were
    /// free (with the names found held and how long each hold lasts unless renewed, by
    /// position) or the gate is held.
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] for a `need` of 0 or above the number of names, two names
    /// of one key, or bad options; [`LockError::InvalidName`]; [`LockError::Cancelled`]; as
    /// [`crate::DistributedLock::try_acquire`] otherwise.
    ///
    /// # Cancel safety
    /// As a single acquisition's: grants that arrive after the caller dropped the future are
    /// released right after them.
    pub(crate) async fn acquire_any_handles(
        &self,
        names: &[&str],
        need: usize,
        gate: Option<&str>,
        options: &AcquireOptions,
    ) -> Result<AnyAttempt, LockError> {
        if need == 0 || need > names.len() {
            return Err(LockError::invalid_option(
                "permits",
                format!("taking {need} of {} names", names.len()),
            ));
        }
        let keys = self.distinct_keys(names, options)?;
        let gate = match gate {
            Some(name) => {
                validate_name(name)?;
                Some(SmallKey::new(&self.key_for(name)?))
            }
            None => None,
        };
        let gated = gate.is_some();
        let req = self.request(OwnerId::random(), options, false);
        let sent_at = BootInstant::now();
        let (storage, asked_keys, asked) = (self.storage.clone(), keys.clone(), req.clone());
        let outcome = detached(
            async move {
                let keys: Vec<&str> = asked_keys.iter().map(SmallKey::as_str).collect();
                let gate = gate.as_ref().map(SmallKey::as_str);
                let outcome = storage
                    .as_ref()
                    .acquire_any(&keys, need, gate, &asked)
                    .await;
                (outcome, storage, asked_keys, asked.owner)
            },
            // As in `acquire_many_handles`: grants given back, every key after a failure.
            |(outcome, storage, keys, owner)| async move {
                match outcome {
                    Ok(AcquireAnyOutcome::Acquired { taken, .. }) => {
                        let taken: Vec<SmallKey> = taken
                            .iter()
                            .filter_map(|&(i, _)| keys.get(i).cloned())
                            .collect();
                        release_keys(storage.as_ref(), &taken, owner).await;
                    }
                    Err(_) => release_keys(storage.as_ref(), &keys, owner).await,
                    Ok(_) => {}
                }
            },
        )
        .await
        .0;
        let outcome = outcome.and_then(|o| checked_positions(&keys, need, gated, o));
        let failed: LockError = match outcome {
            Ok(AcquireAnyOutcome::Busy(busy)) => {
                self.refused(busy.first().map(|&(i, _)| &keys[i]), sent_at);
                let left = busy
                    .into_iter()
                    .map(|(i, o)| (i, o.busy_for().unwrap_or_default()))
                    .collect();
                return Ok(Err(AnyRefused::Busy(left)));
            }
            Ok(AcquireAnyOutcome::GateHeld) => {
                self.refused(None, sent_at);
                return Ok(Err(AnyRefused::GateHeld));
            }
            Ok(AcquireAnyOutcome::Acquired { taken, gate }) => {
                let (positions, outcomes): (Vec<usize>, Vec<AcquireOutcome>) =
                    taken.into_iter().unzip();
                let keys: Vec<SmallKey> = positions.iter().map(|&i| keys[i].clone()).collect();
                let names: Vec<&str> = positions.iter().map(|&i| names[i]).collect();
                match self
                    .hold_grants(keys, &names, outcomes, req.owner, options, sent_at)
                    .await
                {
                    Ok(handles) => {
                        return Ok(Ok((positions.into_iter().zip(handles).collect(), gate)));
                    }
                    Err(e) => e,
                }
            }
            Err(e) => {
                self.give_back_after_error(&keys, req.owner);
                e.into()
            }
        };
        telemetry::acquire_finished(
            Finish::Error,
            BootInstant::now().saturating_duration_since(sent_at),
        );
        Err(failed)
    }

    /// After a failed multi-key request: releases `owner`'s grant of every key in the
    /// background (the request may have been applied although its answer was lost; the owner
    /// is the call's own, so a key it never got is left alone).
    fn give_back_after_error(&self, keys: &[SmallKey], owner: OwnerId) {
        if tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let (storage, keys) = (self.storage.clone(), keys.to_vec());
        tokio::spawn(async move { release_keys(storage.as_ref(), &keys, owner).await });
    }
}

/// What [`StorageLock::acquire_any_handles`] gives: the handles with their positions and the
/// gate's fencing token, or why nothing was taken.
pub(crate) type AnyAttempt = Result<(Vec<(usize, LockHandle)>, u64), AnyRefused>;

/// Why [`StorageLock::acquire_any_handles`] took nothing.
#[derive(Debug)]
pub(crate) enum AnyRefused {
    /// Too few names were free: the positions found held, with the time each hold has left.
    Busy(Vec<(usize, Duration)>),
    /// The gate has a holder.
    GateHeld,
}

/// `outcome`, if its positions are within `keys`, distinct and ascending, a grant names `need`
/// of them, a busy answer leaves fewer than `need` free (else a semaphore would try again at
/// once, forever), and a held gate was asked about; a broken answer is a failed request.
fn checked_positions(
    keys: &[SmallKey],
    need: usize,
    gated: bool,
    outcome: AcquireAnyOutcome,
) -> Result<AcquireAnyOutcome, crate::StorageError> {
    let positions: Vec<usize> = match &outcome {
        AcquireAnyOutcome::Acquired { taken, .. } => taken.iter().map(|&(i, _)| i).collect(),
        AcquireAnyOutcome::Busy(busy) => busy.iter().map(|&(i, _)| i).collect(),
        AcquireAnyOutcome::GateHeld => Vec::new(),
    };
    let ascending = positions.windows(2).all(|w| w[0] < w[1]);
    let within = positions.last().is_none_or(|&i| i < keys.len());
    let counted = match outcome {
        AcquireAnyOutcome::Acquired { .. } => positions.len() == need,
        AcquireAnyOutcome::GateHeld => gated,
        AcquireAnyOutcome::Busy(_) => keys.len().saturating_sub(positions.len()) < need,
    };
    if ascending && within && counted {
        return Ok(outcome);
    }
    Err(crate::StorageError::Corrupt {
        key: keys
            .first()
            .map(|k| k.as_str().to_owned())
            .unwrap_or_default(),
        reason: format!(
            "an attempt at {need} of {} keys answered positions {positions:?}",
            keys.len()
        ),
    })
}

/// Releases `owner`'s grant of every key (to completion, even if the caller stops waiting); a
/// failure is logged and leaves that grant to its lease.
async fn release_keys<S: Storage + ?Sized>(storage: &S, keys: &[SmallKey], owner: OwnerId) {
    let releases = keys.iter().map(|key| async move {
        if let Err(e) = storage.release(key.as_str(), owner).await {
            tracing::warn!(key = %key, error = %e, "release of a refused multi-key grant failed");
        }
    });
    futures_util::future::join_all(releases).await;
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use crate::fault::{FaultyStorage, Op};
    use crate::kinds::acquire_all;
    use crate::{AcquireOptions, DistributedLock, KeyNormalizer, MemoryStorage, StorageLock};

    fn locks() -> StorageLock<FaultyStorage<MemoryStorage>> {
        StorageLock::new(FaultyStorage::new(MemoryStorage::new())).unwrap()
    }

    /// On a storage that takes several keys at once, a multi-lock's attempt is one storage
    /// call, granted or busy, and a busy one leaves every name free.
    #[tokio::test]
    async fn a_multi_lock_attempt_is_one_storage_call() {
        let l = locks();
        let opts = AcquireOptions::default();
        let all = acquire_all(&l, &["c", "a", "b"], &opts)
            .await
            .unwrap()
            .expect("free");
        assert_eq!(l.storage().calls(Op::AcquireMany), 1);
        assert_eq!(l.storage().calls(Op::AcquireOnce), 0);
        let tokens: Vec<_> = all.fencing_tokens().into_iter().map(|(n, _)| n).collect();
        assert_eq!(tokens, ["a", "b", "c"]);
        let b = all.part("b").unwrap().fencing_token();
        drop(all.parts()[0].release().await);
        let busy = l.try_acquire_many(&["a", "b"], &opts).await.unwrap();
        assert_eq!(busy.err(), Some(1), "b is still held");
        assert_eq!(l.storage().calls(Op::AcquireMany), 2);
        let a = l
            .try_acquire("a", &opts)
            .await
            .unwrap()
            .expect("a left free");
        all.release().await.unwrap();
        let again = l.try_acquire_many(&["b"], &opts).await.unwrap().unwrap();
        assert!(again[0].fencing_token() > b);
        drop((a, again));
    }

    /// A semaphore's attempt is one storage call however many of its slots are out: the
    /// last free slot is found and taken at once, and a full semaphore answers every slot
    /// busy, with nothing taken.
    #[tokio::test]
    async fn a_semaphore_attempt_is_one_storage_call() {
        let l = locks();
        let opts = AcquireOptions::default();
        let sem = crate::kinds::Semaphore::new(&l, "pool", 8).unwrap();
        let mut permits = Vec::new();
        for _ in 0..7 {
            permits.push(sem.acquire(&opts).await.unwrap().expect("free"));
        }
        let before = l.storage().calls(Op::AcquireAny);
        let last = sem.acquire(&opts).await.unwrap().expect("one slot left");
        assert_eq!(l.storage().calls(Op::AcquireAny), before + 1);
        assert_eq!(l.storage().calls(Op::AcquireOnce), 0);
        let mut slots: Vec<u32> = permits.iter().map(|p| p.slot()).collect();
        slots.push(last.slot());
        slots.sort_unstable();
        assert_eq!(slots, (0..8).collect::<Vec<_>>());
        assert!(sem.acquire(&opts).await.unwrap().is_none());
        assert_eq!(l.storage().calls(Op::AcquireAny), before + 2);
        let two = sem.acquire_many(2, &opts).await.unwrap();
        assert!(two.is_none(), "all or nothing");
        last.release().await.unwrap();
        assert!(sem.acquire_many(2, &opts).await.unwrap().is_none());
        let one = sem
            .acquire(&opts)
            .await
            .unwrap()
            .expect("the released slot");
        assert_eq!(l.storage().calls(Op::AcquireOnce), 0);
        drop((one, permits));
    }

    /// A bad `need` is refused before any storage call, and a busy answer names every busy
    /// position with the time its hold has left.
    #[tokio::test]
    async fn an_attempt_at_any_names_checks_need_and_reports_every_busy_name() {
        let l = locks();
        let opts = AcquireOptions::default();
        for need in [0, 3] {
            let bad = l.acquire_any_handles(&["a", "b"], need, None, &opts).await;
            assert!(
                matches!(bad, Err(crate::LockError::InvalidOptions { .. })),
                "{bad:?}"
            );
        }
        assert_eq!(l.storage().total_calls(), 0);
        let b = l.try_acquire("b", &opts).await.unwrap().unwrap();
        let d = l.try_acquire("d", &opts).await.unwrap().unwrap();
        let busy = l
            .acquire_any_handles(&["a", "b", "c", "d"], 3, None, &opts)
            .await
            .unwrap()
            .unwrap_err();
        let super::AnyRefused::Busy(busy) = busy else {
            panic!("no gate was given: {busy:?}")
        };
        let positions: Vec<usize> = busy.iter().map(|&(i, _)| i).collect();
        assert_eq!(positions, [1, 3]);
        assert!(
            busy.iter()
                .all(|&(_, left)| left > std::time::Duration::ZERO)
        );
        let taken = l
            .acquire_any_handles(&["a", "b", "c", "d"], 2, None, &opts)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(taken.1, 0, "no gate");
        let taken = taken.0;
        let positions: Vec<usize> = taken.iter().map(|(i, _)| *i).collect();
        assert_eq!(positions, [0, 2]);
        assert_eq!(taken[1].1.name(), "c");
        // With a gate: nothing while the gate is held; its token once it is free.
        let gate = l.try_acquire("gate", &opts).await.unwrap().unwrap();
        let held = l
            .acquire_any_handles(&["a", "c", "e"], 1, Some("gate"), &opts)
            .await
            .unwrap();
        assert!(matches!(held, Err(super::AnyRefused::GateHeld)), "{held:?}");
        let token = gate.fencing_token();
        gate.release().await.unwrap();
        let (taken_e, at) = l
            .acquire_any_handles(&["a", "c", "e"], 1, Some("gate"), &opts)
            .await
            .unwrap()
            .unwrap();
        assert_eq!((taken_e[0].0, at), (2, token));
        drop((b, d, taken, taken_e));
    }

    #[derive(Debug)]
    struct Lower;
    impl KeyNormalizer for Lower {
        fn normalize<'a>(&self, name: &'a str) -> Cow<'a, str> {
            Cow::Owned(name.to_lowercase())
        }
    }

    /// Two names of one key are never held together: refused, typed, before any storage call
    /// (waiting for them would never end); so is an attempt whose cancel token fired.
    #[tokio::test]
    async fn two_names_of_one_key_and_a_cancelled_attempt_are_refused_without_a_request() {
        let l = StorageLock::builder(FaultyStorage::new(MemoryStorage::new()))
            .normalizer(Lower)
            .build()
            .unwrap();
        let opts = AcquireOptions::default();
        let twice = l.try_acquire_many(&["A", "b", "a"], &opts).await;
        assert!(
            matches!(twice, Err(crate::LockError::InvalidOptions { .. })),
            "{twice:?}"
        );
        let all = acquire_all(&l, &["A", "a"], &opts.clone().wait(crate::Wait::Forever)).await;
        assert!(
            matches!(all, Err(crate::LockError::InvalidOptions { .. })),
            "{all:?}"
        );
        let cancel = tokio_util::sync::CancellationToken::new();
        cancel.cancel();
        let cancelled = l
            .try_acquire_many(&["x", "y"], &opts.clone().cancel(cancel))
            .await;
        assert!(
            matches!(cancelled, Err(crate::LockError::Cancelled)),
            "{cancelled:?}"
        );
        assert_eq!(l.storage().total_calls(), 0);
    }
}
