use std::time::Duration;

use crate::storage::StorageError;

/// Everything the lock API can fail with. Busy-and-timed-out is **not** an error (`Ok(None)`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// The lock name (or the key a normalizer made of it) is unusable. Raised before any storage
    /// call.
    #[error("invalid lock name {name:?}: {reason}")]
    InvalidName {
        /// The offending name (truncated to 80 characters).
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// An option is out of range. Raised before any storage call.
    #[error("invalid option `{option}`: {reason}")]
    InvalidOptions {
        /// The option's name.
        option: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The hold would end after [`crate::Timestamp::MAX`] (year 9999), which no expiry can
    /// represent. Leases have no other upper bound (a lease longer than a timer can sleep works).
    /// Nothing is held: the lease was refused before any storage call, or, if the storage's
    /// clock put the expiry past the limit, the grant was released before this error returned.
    #[error("a lease of {lease:?} would end after the year 9999, which cannot be represented")]
    LeaseOutOfRange {
        /// The requested lease.
        lease: Duration,
    },
    /// The key's next fencing token would come within [`crate::storage::FENCING_HEADROOM`] of the largest
    /// the storage represents ([`crate::storage::Capabilities::fencing_bound`]): the key cannot be
    /// granted again (use another name). Nothing is held: the grant was released before this
    /// error returned. A token this large comes from a record written by hand or corrupted,
    /// never from counting acquisitions.
    #[error(
        "lock key {key:?} reached fencing token {fencing}, within {headroom} of the storage's bound {bound}: it cannot be granted again; use another name",
        headroom = crate::storage::FENCING_HEADROOM
    )]
    FencingExhausted {
        /// The storage key.
        key: String,
        /// The token the storage granted (and the engine released).
        fencing: u64,
        /// The storage's [`crate::storage::Capabilities::fencing_bound`].
        bound: u64,
    },
    /// The acquisition's cancellation token fired while waiting. Existing holders are unaffected.
    #[error("lock acquisition was cancelled")]
    Cancelled,
    /// The storage refused to serve as a lock backend (see [`crate::StorageLockBuilder::skip_capability_check`]).
    #[error("storage {storage} cannot back a lock safely: {missing}")]
    Unsafe {
        /// The storage's name.
        storage: String,
        /// The missing capability.
        missing: &'static str,
    },
    /// The owner does not hold the lock (reentrant API).
    #[error("lock {name:?} is not held by this owner")]
    NotHeld {
        /// The lock name.
        name: String,
    },
    /// A semaphore of this name exists with another number of permits (its limit record says
    /// so): taking a permit would let more holders in than one of the two allows. Nothing is
    /// held. See [`crate::kinds::limit_key`] to change the number.
    #[error("semaphore {name:?} has {stored} permits in the storage, not {permits}")]
    SemaphoreLimitMismatch {
        /// The semaphore's name.
        name: String,
        /// The number of permits this semaphore was made with.
        permits: u32,
        /// The number the storage keeps for the name.
        stored: u64,
    },
    /// The storage failed; for acquisitions, anything the storage may have granted is being
    /// released in the background.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

impl LockError {
    pub(crate) fn invalid_name(name: &str, reason: &'static str) -> Self {
        Self::InvalidName {
            name: name.chars().take(80).collect(),
            reason,
        }
    }

    pub(crate) fn invalid_option(option: &'static str, reason: impl Into<String>) -> Self {
        Self::InvalidOptions {
            option,
            reason: reason.into(),
        }
    }
}
