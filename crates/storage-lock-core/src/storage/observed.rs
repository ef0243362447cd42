//! Expiry judged by observation, for stores that have no clock a client can read: etcd, NATS
//! JetStream KV, object storage ([`TimeSource::Observed`](super::TimeSource::Observed)).
//!
//! A lease lock must decide *when* a hold is over. Where the store has no clock, the obvious
//! answer — write an expiry time and let every client compare it with its own wall clock —
//! makes exclusion depend on every client's NTP: a contender whose clock runs a minute ahead
//! takes a held lock a minute early. [`Observations`] takes wall clocks out of it.
//!
//! # The rule
//! A record carries the **lease left** when it was written (`left`; see
//! [`encode_observed`]), not a time. A client judges version `V` of a record expired once it
//! has seen `V` unchanged for `left`, timed on its **own monotonic clock** from the moment the
//! read that first showed it `V` *returned*. A write changes the version (every backend's
//! versions never repeat for a key), so a renewal restarts every observer's count. The writer
//! of `V` counts from the moment it encoded `V`, which is earlier: it judges its own hold over
//! first.
//!
//! # Why no contender takes a hold before its holder's deadline
//! Let the holder's engine take its local deadline `d = s + lease` at instant `s`, before it
//! asks; the storage decides at `n ≥ s` that the hold ends at `n + lease` and encodes at
//! `e ≥ n`, writing `left = lease − (e − n)`; the store applies the write at `w ≥ e`. A
//! contender's read that shows `V` is served after `w` and returns at `c ≥ w`, so it judges
//! `V` expired no earlier than `c + left ≥ e + left = n + lease ≥ d`. It then writes
//! conditionally on `V`: if the holder renewed in between, that write fails. Only the clocks'
//! *rates* enter (each interval is measured on one machine's monotonic clock), as in any lease
//! lock; their offsets and steps do not.
//!
//! # What it costs
//! A client that first reads a hold long after its holder died still waits `left` from that
//! read: up to one lease of extra wait for a lock abandoned by a crashed holder. A released
//! lock (a tombstone) is free at once, and a client that was already waiting saw the last
//! renewal and so waits no longer than on a store with a clock.
//!
//! # The last record known, as a hint
//! Each entry also keeps the record as last written or seen (by a read, a write of this client,
//! or a change notification: [`Self::saw`](Observations::saw)). [`crate::Primitives::known`]
//! hands it to the default lock operations, which try their compare-and-set on its version
//! before they read: the holder's renewal and release, and a waiter's acquisition after a
//! change notification, take one request instead of two. A hint is never trusted for a "no":
//! a busy or not-held decision made on it is made again on a fresh read.
//!
//! # Memory
//! One entry per key read (its version, when it was first seen, and the record), dropped all at
//! once past [`MAX_REMEMBERED`] keys: forgetting only makes a client wait longer, never less.

use super::encoding::{decode_observed, encode_observed};
use super::{LockRecord, StorageError, Timestamp, Version};
use crate::clock::{Clock, MonotonicClock};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

/// How many keys an [`Observations`] remembers before it forgets them all.
pub const MAX_REMEMBERED: usize = 100_000;

/// When this client first saw which version of each key; see the [module docs](self).
///
/// A backend keeps one per storage (shared by its clones), encodes every write with
/// [`Self::encode`], tells [`Self::wrote`] the version a write made, decodes every read with
/// [`Self::read`], and answers [`crate::Storage::now`] with [`Self::now`].
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use storage_lock_core::storage::observed::Observations;
/// use storage_lock_core::{LockRecord, ManualClock, OwnerId, Timestamp, Version};
///
/// let clock = ManualClock::new(Timestamp::from_millis(1_000));
/// let seen = Observations::with_clock(clock.clone());
/// let hold = LockRecord {
///     owner: OwnerId::from_u128(1),
///     count: 1,
///     fencing: 1,
///     acquired_at: seen.now(),
///     expires_at: seen.now().saturating_add(Duration::from_secs(10)),
///     holder: None,
/// };
/// // Written by another client; this one first reads it after 5 s of its own clock…
/// let (bytes, _) = Observations::with_clock(clock.clone()).encode(&hold, 0);
/// clock.advance(Duration::from_secs(5));
/// let v = Version::from_u64(7);
/// let read = seen.read("k", &v, &bytes, seen.now())?;
/// // …and counts the whole lease from then, whatever the writer's clock said.
/// assert_eq!(read.expires_at, Timestamp::from_millis(16_000));
/// clock.advance(Duration::from_secs(10));
/// assert!(!seen.read("k", &v, &bytes, seen.now())?.is_held_at(seen.now()));
/// # Ok::<(), storage_lock_core::StorageError>(())
/// ```
pub struct Observations {
    clock: Arc<dyn Clock>,
    seen: Mutex<HashMap<Box<str>, Seen>>,
}

/// What is known of one key: the version, when this client first saw it, and the record with
/// its `expires_at` on this client's clock.
struct Seen {
    version: Version,
    first_seen: Timestamp,
    record: LockRecord,
}

impl fmt::Debug for Observations {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Observations")
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}

impl Default for Observations {
    fn default() -> Self {
        Self::with_clock(MonotonicClock)
    }
}

/// What [`Observations::encode`] hands to [`Observations::wrote`]: when the write's lease
/// started counting, and the record as this client reads it back.
#[derive(Debug, Clone)]
#[must_use = "pass it to `Observations::wrote` once the write is acknowledged"]
pub struct Written(Timestamp, LockRecord);

impl Observations {
    /// Observations timed on [`MonotonicClock`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Observations timed on `clock` (tests inject a [`crate::ManualClock`]). Only its rate
    /// matters; it must not step backwards.
    pub fn with_clock(clock: impl Clock) -> Self {
        Self {
            clock: Arc::new(clock),
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// This client's clock: the `now` of [`crate::Storage::now`].
    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// The bytes to write for `record` (whose `expires_at` is on [`Self::now`]'s clock), with a
    /// `nonce` as in [`encode_observed`].
    pub fn encode(&self, record: &LockRecord, nonce: u64) -> (Vec<u8>, Written) {
        let now = self.now();
        let left = record.expires_at.saturating_since(now);
        let mine = LockRecord {
            expires_at: now.saturating_add(left),
            ..record.clone()
        };
        (encode_observed(record, left, nonce), Written(now, mine))
    }

    /// Records that the write encoded as `written` made `version` of `key`.
    pub fn wrote(&self, key: &str, version: &Version, written: Written) {
        self.remember(key, version.clone(), written.0, written.1);
    }

    /// The record last written, read or seen under `key`, with its version, as [`Self::read`]
    /// returned it (see the [module docs](self) for how it may be used).
    pub fn known(&self, key: &str) -> Option<super::Stored> {
        self.lock().get(key).map(|seen| super::Stored {
            record: seen.record.clone(),
            version: seen.version.clone(),
        })
    }

    /// A change notification carried `version` of `key` (`bytes`): remembered as a read that
    /// returned now, unless a later numeric version is known already (notifications can trail
    /// this client's own writes). Bytes that are not a record are ignored.
    pub fn saw(&self, key: &str, version: &Version, bytes: &[u8]) {
        if let (Some(new), Some(known)) = (
            version.as_u64(),
            self.lock().get(key).and_then(|s| s.version.as_u64()),
        ) && new < known
        {
            return;
        }
        let _ = self.read(key, version, bytes, self.now());
    }

    /// `key` is gone (deleted): nothing is known of it.
    pub fn forget(&self, key: &str) {
        self.lock().remove(key);
    }

    /// Decodes `bytes`, read as `version` of `key` by a request that returned at `received`
    /// (take [`Self::now`] after the answer arrived), with `expires_at` on this client's clock:
    /// when it first saw `version`, plus the lease left in it.
    ///
    /// # Errors
    /// [`StorageError::Corrupt`] for bytes that are not a record.
    pub fn read(
        &self,
        key: &str,
        version: &Version,
        bytes: &[u8],
        received: Timestamp,
    ) -> Result<LockRecord, StorageError> {
        let (mut record, left) = decode_observed(key, bytes)?;
        let first_seen = match self.lock().get(key) {
            Some(seen) if seen.version == *version => seen.first_seen,
            _ => received,
        };
        record.expires_at = first_seen.saturating_add(left);
        self.remember(key, version.clone(), first_seen, record.clone());
        Ok(record)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Box<str>, Seen>> {
        // The map holds plain values: a panic elsewhere cannot leave it half-updated.
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn remember(&self, key: &str, version: Version, first_seen: Timestamp, record: LockRecord) {
        let mut seen = self.lock();
        if seen.len() >= MAX_REMEMBERED && !seen.contains_key(key) {
            seen.clear();
        }
        seen.insert(
            key.into(),
            Seen {
                version,
                first_seen,
                record,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{ManualClock, OwnerId};

    fn hold(at: Timestamp, lease: Duration) -> LockRecord {
        LockRecord {
            owner: OwnerId::from_u128(1),
            count: 1,
            fencing: 1,
            acquired_at: at,
            expires_at: at.saturating_add(lease),
            holder: None,
        }
    }

    /// A contender whose wall clock is an hour ahead of the writer's still waits the whole
    /// lease from its first sight of the record: only elapsed time on its own clock counts.
    #[test]
    fn a_contender_an_hour_ahead_still_waits_the_lease() {
        let writer = ManualClock::new(Timestamp::from_millis(1_000_000));
        let ahead = ManualClock::new(Timestamp::from_millis(1_000_000 + 3_600_000));
        let (bytes, _) = Observations::with_clock(writer).encode(
            &hold(Timestamp::from_millis(1_000_000), Duration::from_secs(30)),
            0,
        );
        let seen = Observations::with_clock(ahead.clone());
        let v = Version::from_u64(1);
        assert!(
            seen.read("k", &v, &bytes, seen.now())
                .unwrap()
                .is_held_at(seen.now())
        );
        ahead.advance(Duration::from_millis(29_999));
        assert!(
            seen.read("k", &v, &bytes, seen.now())
                .unwrap()
                .is_held_at(seen.now())
        );
        ahead.advance(Duration::from_millis(1));
        assert!(
            !seen
                .read("k", &v, &bytes, seen.now())
                .unwrap()
                .is_held_at(seen.now())
        );
    }

    /// A new version (a renewal) restarts the count; the writer counts from its write.
    #[test]
    fn a_renewal_restarts_the_count_and_the_writer_counts_from_its_write() {
        let clock = ManualClock::new(Timestamp::from_millis(0));
        let seen = Observations::with_clock(clock.clone());
        let lease = Duration::from_secs(10);
        let (bytes, written) = seen.encode(&hold(seen.now(), lease), 0);
        seen.wrote("k", &Version::from_u64(1), written);
        clock.advance(Duration::from_secs(4));
        let mine = seen
            .read("k", &Version::from_u64(1), &bytes, seen.now())
            .unwrap();
        assert_eq!(mine.expires_at, Timestamp::from_millis(10_000));
        let renewed = seen
            .read("k", &Version::from_u64(2), &bytes, seen.now())
            .unwrap();
        assert_eq!(renewed.expires_at, Timestamp::from_millis(14_000));
    }

    /// Forgetting everything past the bound only makes a client wait longer.
    #[test]
    fn forgetting_only_lengthens_the_wait() {
        let clock = ManualClock::new(Timestamp::from_millis(0));
        let seen = Observations::with_clock(clock.clone());
        let (bytes, _) = seen.encode(&hold(seen.now(), Duration::from_secs(1)), 0);
        let v = Version::from_u64(1);
        seen.read("k", &v, &bytes, seen.now()).unwrap();
        clock.advance(Duration::from_secs(2));
        for i in 0..MAX_REMEMBERED {
            seen.remember(
                &format!("other{i}"),
                v.clone(),
                seen.now(),
                hold(seen.now(), Duration::ZERO),
            );
        }
        assert!(
            seen.read("k", &v, &bytes, seen.now())
                .unwrap()
                .is_held_at(seen.now())
        );
    }
}
