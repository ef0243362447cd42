//! Change notifications for waiters.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;

use tokio::sync::watch;

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

    /// Wakes every waiter (they re-check the storage) and drops keys nobody waits for.
    pub fn wake_all(&self) {
        let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
        keys.retain(|_, tx| {
            tx.send_replace(());
            tx.receiver_count() > 0
        });
    }
}
