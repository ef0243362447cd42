//! [`FencedResource`]: the resource side of fencing tokens.
//!
//! A lease can lapse while its holder is paused (GC, SIGSTOP, a partition); the holder then
//! resumes believing it holds the lock while a newer holder writes too. The lock cannot stop the
//! stale write — the resource must: every write carries the writer's fencing token and the
//! resource rejects tokens lower than the highest it has accepted.
//!
//! In SQL the same check is one conditional statement on the protected row:
//!
//! ```sql
//! UPDATE account SET balance = $1, fence = $2
//!  WHERE id = $3 AND fence <= $2;   -- 0 rows affected = a stale holder; abort
//! ```

use std::sync::{Mutex, MutexGuard};

/// A write was refused because a newer holder has written already.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("stale fencing token {token}: the resource has accepted {highest}")]
pub struct StaleToken {
    /// The refused token.
    pub token: u64,
    /// The highest token accepted so far.
    pub highest: u64,
}

/// A value guarded by fencing tokens: a write with token `t` is accepted iff `t` is at least the
/// highest token accepted so far (one holder may write many times with its own token).
#[derive(Debug, Default)]
pub struct FencedResource<T> {
    inner: Mutex<Fenced<T>>,
}

#[derive(Debug, Default)]
struct Fenced<T> {
    value: T,
    highest: u64,
    rejected: u64,
}

impl<T> FencedResource<T> {
    /// A resource holding `value` that has accepted no token yet.
    pub fn new(value: T) -> Self {
        Self {
            inner: Mutex::new(Fenced {
                value,
                highest: 0,
                rejected: 0,
            }),
        }
    }

    fn inner(&self) -> MutexGuard<'_, Fenced<T>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Applies `write` iff `token` is not stale.
    pub fn write<R>(&self, token: u64, write: impl FnOnce(&mut T) -> R) -> Result<R, StaleToken> {
        let mut inner = self.inner();
        if token < inner.highest {
            inner.rejected += 1;
            return Err(StaleToken {
                token,
                highest: inner.highest,
            });
        }
        inner.highest = token;
        Ok(write(&mut inner.value))
    }

    /// Reads the value.
    pub fn read<R>(&self, read: impl FnOnce(&T) -> R) -> R {
        read(&self.inner().value)
    }

    /// The highest token accepted so far.
    pub fn highest_token(&self) -> u64 {
        self.inner().highest
    }

    /// How many writes were refused.
    pub fn rejected(&self) -> u64 {
        self.inner().rejected
    }
}
