//! The engine's side of a [`crate::LockHandle`]: renew and release through the storage, and
//! the loss watch ([`watch_loss`]) that turns a broken hold lost at once.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use super::HoldContext;
use super::events::LockEventKind;
use crate::clock::BootInstant;
use crate::contract::LockError;
use crate::hold::{Backend, HoldCore, HoldRuntime, Releasing};
use crate::storage::{LockRecord, OwnerId, RenewOutcome, Storage, StorageError};
use crate::telemetry;

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
        self.end(hold, LockEventKind::Lost);
    }

    fn owner(&self) -> Option<OwnerId> {
        Some(self.owner)
    }
}

/// How long the loss watch waits before trying again after a storage error.
const WATCH_RETRY: Duration = Duration::from_secs(2);

/// Watches a held key until the hold ends: after every change of the key's record (and once
/// right after arming, for a change between the grant and the watch), reads the record and
/// turns the hold lost if it is not ours any more. Renewals stay the authority: this only makes
/// a break, a sweep or a takeover known before the next renewal would find it.
///
/// Correctness of the order: the notification is armed *before* the read, so a change after
/// the read wakes the next round; a change before it is in what the read sees.
pub(crate) async fn watch_loss<S: Storage + ?Sized>(
    hold: Arc<HoldRuntime>,
    via: Arc<HoldContext<S>>,
    owner: OwnerId,
) {
    let ended = hold.ended();
    let watch = async {
        let (key, fencing) = (hold.key(), hold.fencing());
        loop {
            let change = match via.storage.as_ref().wait_for_change(key).await {
                Ok(change) if change.is_supported() => change,
                Ok(_) => return, // no notifications: the renewals find out
                Err(e) => {
                    tracing::debug!(key, error = %e, "loss watch: cannot arm; retrying");
                    tokio::time::sleep(WATCH_RETRY).await;
                    continue;
                }
            };
            match via.storage.as_ref().get(key).await {
                Ok(stored) if !is_ours(stored.as_ref().map(|s| &s.record), owner, fencing) => {
                    tracing::info!(key, fencing, "the hold was broken, swept or taken over");
                    hold.taken_away();
                    return;
                }
                Ok(_) => change.changed().await,
                Err(e) => {
                    tracing::debug!(key, error = %e, "loss watch: cannot read; retrying");
                    tokio::time::sleep(WATCH_RETRY).await;
                }
            }
        }
    };
    tokio::select! {
        () = ended => {}
        () = watch => {}
    }
}

/// Whether `record` still is our hold: held, with our token, by our owner. A lock server
/// hides owners ([`OwnerId::NOBODY`]); there the token decides (a new holder gets a new one).
fn is_ours(record: Option<&LockRecord>, owner: OwnerId, fencing: u64) -> bool {
    record.is_some_and(|r| {
        r.count > 0 && r.fencing == fencing && (r.owner == owner || r.owner == OwnerId::NOBODY)
    })
}
