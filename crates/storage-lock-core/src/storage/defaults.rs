//! The default lock operations, built only on the CAS primitives.
//!
//! Each one reads the record, applies a rule from [`super::ops`], and writes conditionally on
//! the version it read; a typed conflict means someone else wrote in between, so it reads again.

use std::time::Duration;

use super::ops::{self, AcquireDecision, FENCING_FLOOR_KEY};
use super::{
    AcquireOutcome, AcquireRequest, LockRecord, OwnerId, PageRequest, ReleaseOutcome, RenewOutcome,
    Storage, StorageError, Stored, SweepReport, Timestamp,
};

pub(super) async fn try_acquire<S: Storage + ?Sized>(
    s: &S,
    key: &str,
    req: &AcquireRequest,
) -> Result<AcquireOutcome, StorageError> {
    loop {
        let now = s.now().await?;
        let current = s.get(key).await?;
        let floor = match current {
            Some(_) => 0,
            None => s.fencing_floor().await?,
        };
        let record = match ops::decide_acquire(current.as_ref().map(|c| &c.record), floor, now, req)
        {
            AcquireDecision::Busy(outcome) => return Ok(outcome),
            AcquireDecision::Take(record) => record,
            AcquireDecision::Reenter { count, expires_at } => LockRecord {
                count,
                expires_at,
                ..current
                    .as_ref()
                    .map(|c| c.record.clone())
                    .expect("reentry needs a record")
            },
        };
        match write(s, key, current.as_ref(), &record).await {
            Ok(()) => return Ok(ops::acquired(&record)),
            Err(e) if e.is_cas_conflict() => continue,
            Err(e) => return Err(e),
        }
    }
}

pub(super) async fn renew<S: Storage + ?Sized>(
    s: &S,
    key: &str,
    owner: OwnerId,
    lease: Duration,
) -> Result<RenewOutcome, StorageError> {
    loop {
        let now = s.now().await?;
        let current = s.get(key).await?;
        let (Some(c), Some(expires_at)) = (
            current.as_ref(),
            ops::decide_renew(current.as_ref().map(|c| &c.record), owner, now, lease),
        ) else {
            return Ok(RenewOutcome::NotHeld);
        };
        let record = LockRecord {
            expires_at,
            ..c.record.clone()
        };
        match write(s, key, current.as_ref(), &record).await {
            Ok(()) => {
                return Ok(RenewOutcome::Renewed {
                    expires_at: record.expires_at,
                });
            }
            Err(e) if e.is_cas_conflict() => continue,
            Err(e) => return Err(e),
        }
    }
}

pub(super) async fn release<S: Storage + ?Sized>(
    s: &S,
    key: &str,
    owner: OwnerId,
) -> Result<ReleaseOutcome, StorageError> {
    loop {
        let now = s.now().await?;
        let current = s.get(key).await?;
        let (Some(c), Some(release)) = (
            current.as_ref(),
            ops::decide_release(current.as_ref().map(|c| &c.record), owner, now),
        ) else {
            return Ok(ReleaseOutcome::NotHeld);
        };
        let record = LockRecord {
            count: release.count,
            expires_at: release.expires_at,
            ..c.record.clone()
        };
        match write(s, key, current.as_ref(), &record).await {
            Ok(()) => {
                return Ok(ReleaseOutcome::Released {
                    remaining: record.count,
                });
            }
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

pub(super) async fn raise_fencing_floor<S: Storage + ?Sized>(
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
            Ok(()) => return Ok(to),
            Err(e) if e.is_cas_conflict() => continue,
            Err(e) => return Err(e),
        }
    }
}

pub(super) async fn sweep<S: Storage + ?Sized>(
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

/// Creates the record if there was none, else updates it conditionally on the version read.
async fn write<S: Storage + ?Sized>(
    s: &S,
    key: &str,
    current: Option<&Stored>,
    record: &LockRecord,
) -> Result<(), StorageError> {
    match current {
        None => s.create(key, record).await.map(drop),
        Some(c) => s.update(key, &c.version, record).await.map(drop),
    }
}
