//! The reentrant API: holds counted per explicit owner id.
//!
//! Unlike [`crate::DistributedLock`] (never reentrant), these calls let one owner — a job id, a
//! worker id — take the same lock several times; each [`StorageLock::lock_reentrant`] adds a
//! level, each [`StorageLock::unlock_reentrant`] removes one, and the key is free at zero. The
//! fencing token is assigned when the first level is taken and kept by reentry. There is no
//! handle and no watchdog: the owner renews with [`StorageLock::renew_reentrant`].
//!
//! Cancel safety: if a `lock_reentrant` future is dropped and the storage grants the level
//! anyway, exactly that level is released right after the grant.

use std::time::{Duration, SystemTime};

use super::StorageLock;
use crate::contract::{AcquireOptions, LockError};
use crate::storage::{OwnerId, ReleaseOutcome, RenewOutcome, Storage};

/// One successful [`StorageLock::lock_reentrant`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReentrantHold {
    /// The hold's fencing token (same for every level).
    pub fencing_token: u64,
    /// Levels held now.
    pub count: u32,
    /// The authoritative expiry (storage clock).
    pub expires_at: SystemTime,
}

impl<S: Storage + ?Sized> StorageLock<S> {
    /// Takes one level of `name` for `owner`, waiting per `options.wait`. `Ok(None)` if another
    /// owner held it until the wait budget ran out. `options.auto_renew` must be unset.
    pub async fn lock_reentrant(
        &self,
        name: &str,
        owner: OwnerId,
        options: &AcquireOptions,
    ) -> Result<Option<ReentrantHold>, LockError> {
        options.validate()?;
        if options.auto_renew.is_some() {
            return Err(LockError::InvalidOptions {
                option: "auto_renew",
                reason: "the reentrant API has no watchdog; call renew_reentrant".into(),
            });
        }
        let key = crate::small_key::SmallKey::new(&self.key_for(name)?);
        let req = self.request(owner, options, true);
        let Ok(granted) = self.acquire_loop(&key, &req, options, None).await? else {
            return Ok(None);
        };
        crate::telemetry::not_a_handle();
        let expires_at = self
            .expiry_or_release(key.as_str(), owner, &granted, options.lease)
            .await?;
        Ok(Some(ReentrantHold {
            fencing_token: granted.fencing,
            count: granted.count,
            expires_at,
        }))
    }

    /// The expiry of a grant of an explicit owner as a `SystemTime`; if it cannot be represented,
    /// the level just taken is released first and [`LockError::LeaseOutOfRange`] reported.
    pub(super) async fn expiry_or_release(
        &self,
        key: &str,
        owner: OwnerId,
        granted: &super::acquire::Granted,
        lease: Duration,
    ) -> Result<SystemTime, LockError> {
        if let Some(expires_at) = granted.expires_at.to_system_time() {
            return Ok(expires_at);
        }
        if let Err(e) = self.storage.as_ref().release(key, owner).await {
            tracing::warn!(error = %e, "release after an unrepresentable expiry failed");
        }
        Err(LockError::LeaseOutOfRange { lease })
    }

    /// Removes one level of `owner`'s hold; returns the levels left (0 = the key is free).
    /// [`LockError::NotHeld`] if `owner` holds no level.
    pub async fn unlock_reentrant(&self, name: &str, owner: OwnerId) -> Result<u32, LockError> {
        let key = self.key_for(name)?;
        match self.storage.as_ref().release(&key, owner).await? {
            ReleaseOutcome::Released { remaining, .. } => Ok(remaining),
            ReleaseOutcome::NotHeld => Err(LockError::NotHeld {
                name: name.to_owned(),
            }),
        }
    }

    /// Extends `owner`'s live hold to `now + lease`; `Ok(None)` if not held (fail-closed).
    pub async fn renew_reentrant(
        &self,
        name: &str,
        owner: OwnerId,
        lease: Duration,
    ) -> Result<Option<SystemTime>, LockError> {
        crate::contract::Lease::new(lease)?;
        let key = self.key_for(name)?;
        Ok(
            match self.storage.as_ref().renew(&key, owner, lease).await? {
                RenewOutcome::Renewed { expires_at } => expires_at.to_system_time(),
                RenewOutcome::NotHeld => None,
            },
        )
    }

    /// The fencing token of `owner`'s live hold of `name`, if it has one.
    pub async fn fencing_token(
        &self,
        name: &str,
        owner: OwnerId,
    ) -> Result<Option<u64>, LockError> {
        let key = self.key_for(name)?;
        let now = self.storage.as_ref().now().await?;
        Ok(self
            .storage
            .as_ref()
            .get(&key)
            .await?
            .map(|s| s.record)
            .filter(|r| r.owner == owner && r.is_held_at(now))
            .map(|r| r.fencing))
    }
}
