//! The engine's side of a [`crate::LockHandle`]: renew and release through the storage.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use super::events::LockEventKind;
use super::runtime::{Backend, HoldCore, Releasing};
use super::{HoldContext, telemetry};
use crate::clock::BootInstant;
use crate::contract::LockError;
use crate::storage::{OwnerId, RenewOutcome, Storage, StorageError};

/// What the engine keeps per hold besides the runtime's [`HoldCore`] (which has the key and the
/// token): the storage, the engine, the owner secret and when the hold began. 32 bytes: that
/// its end was reported is a bit of the core's flags ([`HoldCore::first_end`]).
pub(crate) struct EngineHold<S: Storage + ?Sized> {
    via: Arc<HoldContext<S>>,
    owner: OwnerId,
    /// When the hold began, on the boot clock (the hold-time metric).
    acquired_ns: u64,
}

impl<S: Storage + ?Sized> EngineHold<S> {
    pub(crate) fn new(via: Arc<HoldContext<S>>, owner: OwnerId, acquired: BootInstant) -> Self {
        Self {
            via,
            owner,
            acquired_ns: acquired.as_nanos(),
        }
    }

    fn end(&self, hold: &HoldCore, kind: LockEventKind) {
        if hold.first_end() {
            let acquired = BootInstant::from_nanos(self.acquired_ns);
            telemetry::hold_ended(BootInstant::now().saturating_duration_since(acquired));
            let key = hold.key().as_str();
            self.via.engine.events.emit(kind, key, Some(hold.fencing()));
        }
    }

    fn renewed(
        &self,
        hold: &HoldCore,
        outcome: Result<RenewOutcome, StorageError>,
    ) -> Result<Option<SystemTime>, LockError> {
        let kind = match outcome {
            Ok(RenewOutcome::Renewed { .. }) => LockEventKind::Renewed,
            _ => LockEventKind::RenewFailed,
        };
        let key = hold.key().as_str();
        self.via.engine.events.emit(kind, key, Some(hold.fencing()));
        match outcome? {
            RenewOutcome::Renewed { expires_at } => Ok(expires_at.to_system_time()),
            RenewOutcome::NotHeld => Ok(None),
        }
    }
}

#[async_trait]
impl<S: Storage + ?Sized> Backend for EngineHold<S> {
    async fn renew(
        &self,
        hold: &HoldCore,
        lease: Duration,
        background: bool,
    ) -> Result<Option<SystemTime>, LockError> {
        let outcome = if background {
            self.via
                .engine
                .renewals
                .renew(&self.via.storage, hold.key(), self.owner, lease)
                .await
        } else {
            let key = hold.key().as_str();
            self.via
                .storage
                .as_ref()
                .renew(key, self.owner, lease)
                .await
        };
        self.renewed(hold, outcome)
    }

    fn release<'a>(&'a self, hold: &'a HoldCore) -> Releasing<'a> {
        self.end(hold, LockEventKind::Released);
        let key = hold.key().as_str();
        Releasing::Storage(self.via.storage.as_ref().release(key, self.owner))
    }

    fn on_lost(&self, hold: &HoldCore) {
        telemetry::lost();
        self.end(hold, LockEventKind::Lost);
    }
}
