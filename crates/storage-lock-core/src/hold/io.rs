//! The I/O seam of a hold: what a provider supplies ([`HoldIo`]: renew and release) and how the
//! runtime calls it (`Backend`, which the engine implements directly for its own holds).

use std::future::Future;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;

use super::HoldCore;
use crate::contract::LockError;
use crate::storage::{ReleaseOutcome, StorageError};
/// The provider side of a [`crate::LockHandle`]: how to renew and release one hold.
///
/// The handle owns the state machine (held → released | lost), the local deadline, the `lost()`
/// signal, the watchdog and release-on-drop; a provider only does the I/O. Providers outside
/// this crate (a remote client, say) implement it and start handles with
/// [`crate::LockHandle::start`].
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::time::{Duration, SystemTime};
/// use storage_lock_core::clock::BootInstant;
/// use storage_lock_core::hold::{HoldGrant, HoldIo};
/// use storage_lock_core::{LockError, LockHandle};
///
/// struct Remote; // renews and releases over some protocol
/// #[async_trait::async_trait]
/// impl HoldIo for Remote {
///     async fn renew(&self, lease: Duration) -> Result<Option<SystemTime>, LockError> {
///         Ok(Some(SystemTime::now() + lease)) // what the remote side confirmed
///     }
///     async fn release(&self) -> Result<(), LockError> {
///         Ok(())
///     }
/// }
///
/// let sent_at = BootInstant::now(); // before the acquire request leaves
/// let lease = Duration::from_secs(10);
/// let grant = HoldGrant::new("jobs/7", 42, lease, SystemTime::now() + lease, sent_at);
/// let handle = LockHandle::start(grant, Remote);
/// assert_eq!(handle.fencing_token(), 42);
/// handle.release().await.unwrap();
/// # }
/// ```
#[async_trait]
pub trait HoldIo: Send + Sync + 'static {
    /// Extends the hold by `lease`. `Ok(Some(expiry))` if the storage confirmed the hold,
    /// `Ok(None)` if it is not held; errors mean "unknown" (the handle treats them fail-closed).
    /// The handle keeps the expiry to the millisecond (as storages count), rounded down.
    ///
    /// # Errors
    /// Any error means the outcome is unknown.
    async fn renew(&self, lease: Duration) -> Result<Option<SystemTime>, LockError>;
    /// What the watchdog (auto-renew) calls instead of [`Self::renew`]: the default is
    /// [`Self::renew`]; a provider that coalesces background renewals (the storage engine does,
    /// into [`crate::Storage::renew_many`] calls) overrides it. Explicit renewals never wait for
    /// a batch to fill; renewals of one handle run one at a time (an explicit one may wait for
    /// the watchdog's renewal in flight).
    ///
    /// # Errors
    /// Any error means the outcome is unknown.
    async fn renew_in_background(&self, lease: Duration) -> Result<Option<SystemTime>, LockError> {
        self.renew(lease).await
    }
    /// Releases the hold (no-op if not held). Called at most once per handle.
    ///
    /// # Errors
    /// The release could not be confirmed (the lease still ends the hold).
    async fn release(&self) -> Result<(), LockError>;
    /// The longest lease a confirmed renewal vouches for, counted from before it was sent; the
    /// handle's local deadline after a renewal of `lease` is counted with the smaller of the two.
    /// `None` (the default): the renewal grants exactly the lease asked for.
    fn vouched_lease(&self) -> Option<Duration> {
        None
    }
    /// Called once when the handle turns lost.
    fn on_lost(&self) {}
}

/// The internal side of a hold's I/O: [`HoldIo`] with the hold's fixed facts passed in, so
/// that the engine's backend need not keep a second copy of the key and the token. External
/// providers' [`HoldIo`]s are adapted by [`Io`].
#[async_trait]
pub(crate) trait Backend: Send + Sync + 'static {
    /// As [`HoldIo::renew`] (`background`: [`HoldIo::renew_in_background`]).
    async fn renew(
        &self,
        hold: &HoldCore,
        lease: Duration,
        background: bool,
    ) -> Result<Option<SystemTime>, LockError>;
    /// As [`HoldIo::release`]; the returned future does the I/O (see [`Releasing`]).
    fn release<'a>(&'a self, hold: &'a HoldCore) -> Releasing<'a>;
    /// As [`HoldIo::vouched_lease`].
    fn vouched_lease(&self) -> Option<Duration> {
        None
    }
    /// As [`HoldIo::on_lost`].
    fn on_lost(&self, _hold: &HoldCore) {}
    /// The owner the storage knows the hold by (`None` for a provider's [`HoldIo`]).
    fn owner(&self) -> Option<crate::storage::OwnerId> {
        None
    }
}

/// The future of [`Backend::release`]: the storage's own (already boxed) release future for
/// the engine's handles, so a release allocates no second future around it; a provider's
/// [`HoldIo::release`] future otherwise.
pub(crate) enum Releasing<'a> {
    Storage(BoxFuture<'a, Result<ReleaseOutcome, StorageError>>),
    Io(BoxFuture<'a, Result<(), LockError>>),
}

type BoxFuture<'a, T> = std::pin::Pin<Box<dyn Future<Output = T> + Send + 'a>>;

impl Future for Releasing<'_> {
    /// Whether the storage still had the hold as ours (`false`: it had been broken, swept or
    /// taken over; a provider's [`HoldIo::release`] cannot tell and answers `true`).
    type Output = Result<bool, LockError>;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        match self.get_mut() {
            Self::Storage(f) => f.as_mut().poll(cx).map(|r| {
                r.map(|outcome| matches!(outcome, ReleaseOutcome::Released { .. }))
                    .map_err(Into::into)
            }),
            Self::Io(f) => f.as_mut().poll(cx).map(|r| r.map(|()| true)),
        }
    }
}

/// A provider's [`HoldIo`] as a [`Backend`].
pub(crate) struct Io<I>(pub(crate) I);

#[async_trait]
impl<I: HoldIo> Backend for Io<I> {
    async fn renew(
        &self,
        _hold: &HoldCore,
        lease: Duration,
        background: bool,
    ) -> Result<Option<SystemTime>, LockError> {
        if background {
            self.0.renew_in_background(lease).await
        } else {
            self.0.renew(lease).await
        }
    }
    fn release<'a>(&'a self, _hold: &'a HoldCore) -> Releasing<'a> {
        Releasing::Io(self.0.release())
    }
    fn vouched_lease(&self) -> Option<Duration> {
        self.0.vouched_lease()
    }
    fn on_lost(&self, _hold: &HoldCore) {
        self.0.on_lost();
    }
}
