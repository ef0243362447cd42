//! The engine's side of a [`crate::LockHandle`]: renew and release through the storage.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use super::events::LockEventKind;
use super::runtime::HoldIo;
use super::{EngineShared, telemetry};
use crate::clock::BootInstant;
use crate::contract::LockError;
use crate::storage::{OwnerId, RenewOutcome, Storage, StorageError};

pub(crate) struct EngineHold<S: Storage + ?Sized> {
    storage: Arc<S>,
    engine: Arc<EngineShared>,
    key: Arc<str>,
    owner: OwnerId,
    fencing: u64,
    acquired: BootInstant,
    ended: AtomicBool,
}

impl<S: Storage + ?Sized> EngineHold<S> {
    pub(crate) fn new(
        storage: Arc<S>,
        engine: Arc<EngineShared>,
        key: Arc<str>,
        owner: OwnerId,
        fencing: u64,
        acquired: BootInstant,
    ) -> Self {
        Self {
            storage,
            engine,
            key,
            owner,
            fencing,
            acquired,
            ended: AtomicBool::new(false),
        }
    }

    fn end(&self, kind: LockEventKind) {
        if !self.ended.swap(true, Ordering::AcqRel) {
            telemetry::hold_ended(BootInstant::now().saturating_duration_since(self.acquired));
            self.engine.events.emit(kind, &self.key, Some(self.fencing));
        }
    }
}

impl<S: Storage + ?Sized> EngineHold<S> {
    fn renewed(
        &self,
        outcome: Result<RenewOutcome, StorageError>,
    ) -> Result<Option<SystemTime>, LockError> {
        let kind = match outcome {
            Ok(RenewOutcome::Renewed { .. }) => LockEventKind::Renewed,
            _ => LockEventKind::RenewFailed,
        };
        self.engine.events.emit(kind, &self.key, Some(self.fencing));
        match outcome? {
            RenewOutcome::Renewed { expires_at } => Ok(expires_at.to_system_time()),
            RenewOutcome::NotHeld => Ok(None),
        }
    }
}

#[async_trait]
impl<S: Storage + ?Sized> HoldIo for EngineHold<S> {
    async fn renew(&self, lease: Duration) -> Result<Option<SystemTime>, LockError> {
        let outcome = self
            .storage
            .as_ref()
            .renew(&self.key, self.owner, lease)
            .await;
        self.renewed(outcome)
    }

    async fn renew_in_background(&self, lease: Duration) -> Result<Option<SystemTime>, LockError> {
        let outcome = self
            .engine
            .renewals
            .renew(&self.storage, &self.key, self.owner, lease)
            .await;
        self.renewed(outcome)
    }

    async fn release(&self) -> Result<(), LockError> {
        self.end(LockEventKind::Released);
        self.storage.as_ref().release(&self.key, self.owner).await?;
        Ok(())
    }

    fn on_lost(&self) {
        telemetry::lost();
        self.end(LockEventKind::Lost);
    }
}
