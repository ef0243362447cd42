//! Lock events, delivered without blocking the hot path.
//!
//! Events go through a bounded [`tokio::sync::broadcast`] channel: emitting never waits, and a
//! subscriber that falls behind by more than [`EVENT_BUFFER`] events skips the oldest ones
//! (it sees `RecvError::Lagged`). Until someone subscribes, emitting costs one atomic load.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::sync::broadcast;

/// How many events a slow subscriber may fall behind before it loses the oldest.
pub const EVENT_BUFFER: usize = 1024;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum LockEventKind {
    /// A hold began.
    Acquired,
    /// An acquisition found the lock busy (once per acquisition).
    Contended,
    /// An acquisition gave up: busy until its wait budget ran out.
    TimedOut,
    /// An acquisition was cancelled while waiting.
    Cancelled,
    /// A hold was renewed.
    Renewed,
    /// A renewal failed (storage error or not held).
    RenewFailed,
    /// A hold was lost.
    Lost,
    /// A hold was released.
    Released,
    /// An admin force-released the hold ([`crate::StorageLock::force_release`]).
    ForceReleased,
}

/// One event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockEvent {
    /// What happened.
    pub kind: LockEventKind,
    /// The storage key it happened to.
    pub key: Arc<str>,
    /// The fencing token involved, if a hold was.
    pub fencing_token: Option<u64>,
}

#[derive(Debug)]
pub(crate) struct Events {
    tx: broadcast::Sender<LockEvent>,
    subscribed: AtomicBool,
}

impl Events {
    pub(crate) fn new() -> Self {
        Self {
            tx: broadcast::channel(EVENT_BUFFER).0,
            subscribed: AtomicBool::new(false),
        }
    }

    pub(crate) fn subscribe(&self) -> broadcast::Receiver<LockEvent> {
        self.subscribed.store(true, Ordering::Release);
        self.tx.subscribe()
    }

    /// Sends an event if anyone listens (the key is copied into the event only then).
    pub(crate) fn emit(&self, kind: LockEventKind, key: &str, fencing_token: Option<u64>) {
        if self.subscribed.load(Ordering::Acquire) && self.tx.receiver_count() > 0 {
            let _ = self.tx.send(LockEvent {
                kind,
                key: key.into(),
                fencing_token,
            });
        }
    }
}
