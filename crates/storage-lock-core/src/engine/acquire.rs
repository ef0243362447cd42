//! The acquire loop.
//!
//! ```text
//! try_acquire(name, opts)
//!   ├─ validate name + options, normalize → key           (no storage I/O before this point)
//!   └─ loop
//!        ├─ arm Storage::wait_for_change(key)             (only when a wait budget remains)
//!        ├─ sent_at = Instant::now(); arm release-on-drop guard
//!        ├─ Storage::try_acquire(key, req)                (one round trip on overriding backends)
//!        ├─ Acquired → build LockHandle (local deadline from sent_at) → disarm guard → Some(handle)
//!        └─ Busy → out of budget? None : sleep until the earliest of
//!                  wait deadline · holder's expiry · change notification · jittered backoff
//! ```
//!
//! **Cancel safety.** From just before the storage call until the handle exists, a guard owns
//! the possible grant: if the future is dropped (or the call fails, so its outcome is unknown),
//! the guard spawns a release for the fresh owner id. Releasing a grant that never happened is a
//! no-op, because that owner id was never stored.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument;

use super::events::LockEventKind;
use super::hold::EngineHold;
use super::{StorageLock, telemetry};
use crate::contract::{AcquireOptions, Grant, LockError, LockHandle, Wait};
use crate::storage::{AcquireOutcome, AcquireRequest, ChangeWait, OwnerId, Storage, Timestamp};

/// Longest sleep between attempts when the storage delivers notifications (a safety net in case
/// one is lost, e.g. while a notification connection reconnects).
const NOTIFIED_RECHECK: Duration = Duration::from_secs(2);
/// First backoff step for storages without notifications; doubles up to [`BACKOFF_CAP`].
const BACKOFF_START: Duration = Duration::from_millis(1);
/// Largest backoff step.
const BACKOFF_CAP: Duration = Duration::from_millis(250);

/// What the loop returns on success.
pub(crate) struct Granted<S: Storage + ?Sized> {
    pub fencing: u64,
    pub count: u32,
    pub expires_at: Timestamp,
    pub sent_at: Instant,
    pub guard: ReleaseGuard<S>,
}

impl<S: Storage + ?Sized> StorageLock<S> {
    pub(crate) async fn acquire_handle(
        &self,
        name: &str,
        options: &AcquireOptions,
    ) -> Result<Option<LockHandle>, LockError> {
        options.validate()?;
        let key = self.key_for(name)?;
        let span = tracing::debug_span!("storage_lock.acquire", key = %key);
        async {
            let req = self.request(OwnerId::random(), options, false);
            let Some(granted) = self.acquire_loop(&key, &req, options, true).await? else {
                return Ok(None);
            };
            let backend = Arc::new(EngineHold::new(
                self.storage.clone(),
                self.shared.clone(),
                key.clone(),
                req.owner,
                granted.fencing,
            ));
            let built = granted
                .expires_at
                .to_system_time()
                .ok_or(LockError::LeaseOutOfRange {
                    lease: options.lease,
                })
                .and_then(|expires_at| {
                    let grant = Grant {
                        name: name.to_owned(),
                        key: key.clone(),
                        fencing: granted.fencing,
                        lease: options.lease,
                        expires_at,
                        sent_at: granted.sent_at,
                        auto_renew: options.auto_renew,
                    };
                    LockHandle::new(grant, backend)
                });
            match built {
                Ok(handle) => {
                    granted.guard.disarm();
                    self.shared
                        .events
                        .emit(LockEventKind::Acquired, &key, Some(granted.fencing));
                    Ok(Some(handle))
                }
                Err(e) => {
                    // Release first, then report the original error. If this await is cancelled,
                    // the still-armed guard releases in the background.
                    if let Err(release_err) = self.storage.release(&key, req.owner).await {
                        tracing::warn!(error = %release_err, "release after a failed grant failed");
                    } else {
                        granted.guard.disarm();
                    }
                    telemetry::hold_ended(Duration::ZERO);
                    Err(e)
                }
            }
        }
        .instrument(span)
        .await
    }

    pub(crate) fn request(
        &self,
        owner: OwnerId,
        options: &AcquireOptions,
        reentrant: bool,
    ) -> AcquireRequest {
        let mut holder = self.shared.holder.clone();
        if options.note.is_some() {
            holder.note.clone_from(&options.note);
        }
        AcquireRequest {
            owner,
            lease: options.lease,
            holder: Some(holder),
            reentrant,
        }
    }

    /// Tries until acquired, out of budget, or cancelled. With `guard_grant`, a dropped call
    /// releases whatever it may have been granted (see the module docs).
    pub(crate) async fn acquire_loop(
        &self,
        key: &str,
        req: &AcquireRequest,
        options: &AcquireOptions,
        guard_grant: bool,
    ) -> Result<Option<Granted<S>>, LockError> {
        let started = Instant::now();
        let deadline = match options.wait {
            Wait::None => Some(started),
            Wait::For(d) => started.checked_add(d), // too far to represent = forever
            Wait::Forever => None,
        };
        let cancelled = || options.cancel.as_ref().is_some_and(|c| c.is_cancelled());
        let finish = |result: &'static str| telemetry::acquire_finished(result, started.elapsed());
        let mut attempt: u32 = 0;
        loop {
            if cancelled() {
                self.shared.events.emit(LockEventKind::Cancelled, key, None);
                finish("cancelled");
                return Err(LockError::Cancelled);
            }
            let may_wait = deadline.is_none_or(|d| Instant::now() < d);
            let change = if may_wait {
                self.storage.wait_for_change(key).await?
            } else {
                ChangeWait::unsupported()
            };
            let guard = ReleaseGuard::arm(&self.storage, key, req.owner, guard_grant);
            let sent_at = Instant::now();
            let outcome = match self.storage.try_acquire(key, req).await {
                Ok(outcome) => outcome,
                Err(e) => {
                    finish("error");
                    return Err(e.into());
                }
            };
            let busy_for = match outcome {
                AcquireOutcome::Acquired {
                    fencing,
                    count,
                    expires_at,
                } => {
                    finish("acquired");
                    return Ok(Some(Granted {
                        fencing,
                        count,
                        expires_at,
                        sent_at,
                        guard,
                    }));
                }
                busy @ AcquireOutcome::Busy { .. } => busy.busy_for().unwrap_or_default(),
            };
            guard.disarm();
            if attempt == 0 {
                self.shared.events.emit(LockEventKind::Contended, key, None);
                telemetry::contended();
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                self.shared.events.emit(LockEventKind::TimedOut, key, None);
                finish("timed_out");
                return Ok(None);
            }
            // The holder's expiry on our clock; +1 ms for the storage's millisecond rounding.
            let mut wake = now + busy_for + Duration::from_millis(1);
            if let Some(d) = deadline {
                wake = wake.min(d);
            }
            wake = wake.min(
                now + if change.is_supported() {
                    NOTIFIED_RECHECK
                } else {
                    backoff(attempt)
                },
            );
            attempt = attempt.saturating_add(1);
            let cancel = options.cancel.clone().unwrap_or_default();
            tokio::select! {
                () = change.changed() => {}
                () = tokio::time::sleep_until(wake) => {}
                () = cancel.cancelled() => {} // reported at the top of the loop
            }
        }
    }
}

/// Full-jitter exponential backoff: uniform in [step/2, step], step = 1 ms · 2^attempt ≤ 250 ms.
fn backoff(attempt: u32) -> Duration {
    let step = BACKOFF_START
        .saturating_mul(1u32 << attempt.min(16))
        .min(BACKOFF_CAP);
    let half = step / 2;
    half + half.mul_f64(rand::random::<f64>())
}

/// Releases a possible grant in the background unless disarmed (see the module docs).
pub(crate) struct ReleaseGuard<S: Storage + ?Sized> {
    armed: Option<(Arc<S>, String, OwnerId)>,
}

impl<S: Storage + ?Sized> ReleaseGuard<S> {
    fn arm(storage: &Arc<S>, key: &str, owner: OwnerId, enabled: bool) -> Self {
        Self {
            armed: enabled.then(|| (storage.clone(), key.to_owned(), owner)),
        }
    }

    /// The grant is owned by someone else now (a handle) or there was none.
    pub(crate) fn disarm(mut self) {
        self.armed = None;
    }
}

impl<S: Storage + ?Sized> Drop for ReleaseGuard<S> {
    fn drop(&mut self) {
        let Some((storage, key, owner)) = self.armed.take() else {
            return;
        };
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = storage.release(&key, owner).await {
                    tracing::warn!(key = %key, error = %e, "background release of an abandoned acquisition failed");
                }
            });
        }
    }
}
