//! Change notifications for waiters.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use super::StorageError;

/// A notification armed by [`crate::Storage::wait_for_change`].
///
/// It is armed when returned: a change to the key after that moment completes
/// [`ChangeWait::changed`], even if the waiter only starts awaiting later. That is what makes
/// "arm, try, sleep" free of lost wake-ups. A storage without notifications returns
/// [`ChangeWait::unsupported`], and the engine falls back to jittered backoff.
pub struct ChangeWait(Option<Pin<Box<dyn Future<Output = ()> + Send + 'static>>>);

impl ChangeWait {
    /// A notification that completes when `fut` does.
    pub fn new(fut: impl Future<Output = ()> + Send + 'static) -> Self {
        Self(Some(Box::pin(fut)))
    }

    /// No notifications: [`Self::changed`] never completes.
    pub fn unsupported() -> Self {
        Self(None)
    }

    /// Whether this can ever complete.
    pub fn is_supported(&self) -> bool {
        self.0.is_some()
    }

    /// Completes when the key changed after this was armed (never, if unsupported).
    pub async fn changed(self) {
        match self.0 {
            Some(fut) => fut.await,
            None => std::future::pending().await,
        }
    }
}

impl fmt::Debug for ChangeWait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ChangeWait")
            .field(&if self.is_supported() {
                "armed"
            } else {
                "unsupported"
            })
            .finish()
    }
}

/// The waiters of one storage, by key: the helper behind notifying backends.
///
/// A backend's listener (PostgreSQL `LISTEN`, Redis `SUBSCRIBE`, a watch) calls
/// [`Waiters::wake`] with the key a release named, or [`Waiters::wake_all`] after
/// (re)connecting, when notifications may have been missed. [`Waiters::arm`] is what its
/// [`crate::Storage::wait_for_change`] returns.
#[derive(Debug, Default)]
pub struct Waiters {
    keys: Mutex<HashMap<String, watch::Sender<()>>>,
}

impl Waiters {
    /// A notification for the next change of `key`.
    pub fn arm(&self, key: &str) -> ChangeWait {
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        let mut rx = match keys.get(key) {
            Some(tx) => tx.subscribe(),
            None => {
                let (tx, rx) = watch::channel(());
                keys.insert(key.to_owned(), tx);
                rx
            }
        };
        rx.mark_unchanged();
        ChangeWait::new(async move {
            let _ = rx.changed().await;
        })
    }

    /// Wakes the waiters of `key` and forgets the key if nobody waits any more.
    pub fn wake(&self, key: &str) {
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tx) = keys.get(key) {
            tx.send_replace(());
            if tx.receiver_count() == 0 {
                keys.remove(key);
            }
        }
    }

    /// Wakes the waiters of every key in `bucket` (see [`key_bucket`]), for sources that can
    /// only say which bucket changed.
    pub fn wake_bucket(&self, bucket: u8) {
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        keys.retain(|key, tx| {
            if key_bucket(key) == bucket {
                tx.send_replace(());
            }
            tx.receiver_count() > 0
        });
    }

    /// Wakes every waiter (they re-check the storage) and drops keys nobody waits for.
    pub fn wake_all(&self) {
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        keys.retain(|_, tx| {
            tx.send_replace(());
            tx.receiver_count() > 0
        });
    }
}

/// The bucket of `key` among 256 (FNV-1a of its bytes, low byte), for notification channels
/// that cannot carry a key: the same in every process and every version of this crate (it is
/// part of the cross-process protocol of such backends).
///
/// # Examples
/// ```
/// use storage_lock_core::storage::key_bucket;
/// assert_eq!(key_bucket("jobs/7"), key_bucket("jobs/7"));
/// assert_eq!(key_bucket(""), 0x25); // FNV-1a offset basis, low byte
/// ```
pub fn key_bucket(key: &str) -> u8 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h.to_le_bytes()[0]
}

/// What a [`NotificationSource`] heard next.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SourceEvent {
    /// The record under this key changed.
    Changed(String),
    /// A record under some key of this bucket changed (see [`key_bucket`]).
    ChangedBucket(u8),
    /// Notifications may have been missed (an undecodable message, a reconnect inside the
    /// driver): every waiter re-checks.
    MayHaveMissed,
    /// The connection is gone: the hub reconnects, and every waiter re-checks.
    Disconnected,
}

/// Where a [`Notifications`] hub gets its change notifications from: a backend's listening
/// connection (PostgreSQL `LISTEN`, Redis `SUBSCRIBE`, …).
#[async_trait::async_trait]
pub trait NotificationSource: Send + Sync + 'static {
    /// A connection that is listening.
    type Connection: Send + 'static;
    /// Opens a connection and starts listening; the error is logged and retried with backoff.
    async fn connect(&self) -> Result<Self::Connection, StorageError>;
    /// The next event on the connection.
    async fn next(&self, conn: &mut Self::Connection) -> SourceEvent;
}

/// One listening connection per storage, multiplexed over every waiting key, re-established
/// after failures. Backends keep one in an `Arc` and return [`Notifications::arm`] from
/// [`crate::Storage::wait_for_change`]. The listener task starts with the first waiter and
/// stops when the hub is dropped.
#[derive(Debug)]
pub struct Notifications<N: NotificationSource> {
    source: Arc<N>,
    shared: Arc<HubShared>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

#[derive(Debug)]
struct HubShared {
    waiters: Waiters,
    /// `true` while the connection is listening.
    ready: watch::Sender<bool>,
}

impl<N: NotificationSource> Notifications<N> {
    /// A hub over `source`; nothing connects until the first [`Self::arm`].
    pub fn new(source: N) -> Self {
        Self {
            source: Arc::new(source),
            shared: Arc::new(HubShared {
                waiters: Waiters::default(),
                ready: watch::channel(false).0,
            }),
            task: Mutex::new(None),
        }
    }

    /// Arms a notification for `key`. Starts the listener on first use and waits up to one
    /// second for it to listen (so no release between arming and waiting can be missed); if it
    /// is not listening, returns [`ChangeWait::unsupported`] and the waiter backs off instead.
    pub async fn arm(&self, key: &str) -> ChangeWait {
        {
            let mut task = self.task.lock().unwrap_or_else(|e| e.into_inner());
            if task.is_none() {
                *task = Some(tokio::spawn(listen(
                    self.source.clone(),
                    self.shared.clone(),
                )));
            }
        }
        let mut ready = self.shared.ready.subscribe();
        let listening =
            tokio::time::timeout(std::time::Duration::from_secs(1), ready.wait_for(|r| *r))
                .await
                .is_ok_and(|r| r.is_ok());
        if listening {
            self.shared.waiters.arm(key)
        } else {
            ChangeWait::unsupported()
        }
    }
}

impl<N: NotificationSource> Drop for Notifications<N> {
    fn drop(&mut self) {
        if let Some(task) = self
            .task
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            task.abort();
        }
    }
}

async fn listen<N: NotificationSource>(source: Arc<N>, shared: Arc<HubShared>) {
    let mut backoff = std::time::Duration::from_millis(50);
    loop {
        let mut conn = match source.connect().await {
            Ok(conn) => conn,
            Err(e) => {
                tracing::warn!(error = %e, "notification connection failed; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(std::time::Duration::from_secs(5));
                continue;
            }
        };
        backoff = std::time::Duration::from_millis(50);
        shared.ready.send_replace(true);
        shared.waiters.wake_all(); // anything missed while disconnected
        loop {
            match source.next(&mut conn).await {
                SourceEvent::Changed(key) => shared.waiters.wake(&key),
                SourceEvent::ChangedBucket(b) => shared.waiters.wake_bucket(b),
                SourceEvent::MayHaveMissed => shared.waiters.wake_all(),
                SourceEvent::Disconnected => {
                    shared.ready.send_replace(false);
                    shared.waiters.wake_all();
                    break;
                }
            }
        }
    }
}
