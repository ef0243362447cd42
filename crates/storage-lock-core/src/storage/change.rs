//! Change notifications for waiters.

use std::fmt;
use std::future::Future;
use std::pin::Pin;

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
