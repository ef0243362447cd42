//! [`Election`]: leader election whose term is the fencing token.

use std::fmt;
use std::future::Future;
use std::time::Duration;

use crate::contract::{AcquireOptions, LockError};
use crate::engine::StorageLock;
use crate::hold::LockHandle;
use crate::storage::{Storage, Timestamp};

/// The longest value a candidate may publish, in bytes.
pub const MAX_VALUE_LEN: usize = 4096;

/// Checks a candidate's value: at most [`MAX_VALUE_LEN`] bytes, no control characters (it is
/// printed one per line by `storage-lock leader`).
///
/// # Errors
/// [`LockError::InvalidOptions`] naming the rule.
///
/// # Examples
/// ```
/// use storage_lock_core::kinds::validate_value;
/// assert!(validate_value("10.0.0.7:8080").is_ok());
/// assert!(validate_value("two\nlines").is_err());
/// ```
pub fn validate_value(value: &str) -> Result<(), LockError> {
    if value.len() > MAX_VALUE_LEN || value.chars().any(char::is_control) {
        return Err(LockError::invalid_option(
            "value",
            format!("at most {MAX_VALUE_LEN} bytes without control characters"),
        ));
    }
    Ok(())
}

/// How often an [`Observer`] reads the seat at least: backends notify releases (what waiters
/// need) but not every grant, and some notify nothing, so a new leader is seen within this; a
/// release is seen at once where the storage notifies.
pub const OBSERVE_POLL: Duration = Duration::from_secs(1);

/// Leader election on one lock name: the leader is the lock's holder, its published value
/// rides in the holder's note, and its **term is the hold's fencing token** — strictly greater
/// than every earlier leader's, so a resource that fences on terms rejects a deposed leader's
/// writes. Cheap to clone.
///
/// Two leaders at once are impossible for the same reason two holders are: the seat is an
/// exclusive lock with a lease on the storage's clock, and a leader whose renewal cannot be
/// confirmed learns that it lost ([`Leadership::lost`]) before the lease ends and anyone else
/// can be granted the seat (Curator's `LeaderLatch` and etcd's `Campaign` can briefly have two
/// leaders after a session loss). A campaign does not start again by itself after a loss:
/// campaign again if you want the seat back.
///
/// # Examples
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), storage_lock_core::LockError> {
/// use storage_lock_core::kinds::{Election, Observed};
/// use storage_lock_core::{AcquireOptions, MemoryStorage, StorageLock};
/// let locks = StorageLock::new(MemoryStorage::new())?;
/// let election = Election::new(&locks, "scheduler")?;
/// let mut observer = election.observe();
/// assert!(matches!(observer.next().await?, Observed::Vacant { .. }));
/// let me = election.campaign("node-a:8080", &AcquireOptions::default()).await?.expect("seat free");
/// match observer.next().await? {
///     Observed::Leader { value, term } => assert_eq!((value.as_str(), term), ("node-a:8080", me.term())),
///     other => panic!("{other:?}"),
/// }
/// me.resign().await?;
/// assert!(matches!(observer.next().await?, Observed::Vacant { after_term } if after_term == me.term()));
/// # Ok(()) }
/// ```
pub struct Election<S: Storage + ?Sized = dyn Storage> {
    locks: StorageLock<S>,
    name: String,
}

impl<S: Storage + ?Sized> Clone for Election<S> {
    fn clone(&self) -> Self {
        Self {
            locks: self.locks.clone(),
            name: self.name.clone(),
        }
    }
}

impl<S: Storage + ?Sized> fmt::Debug for Election<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Election")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// What an [`Observer`] saw of the seat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observed {
    /// A leader holds the seat.
    Leader {
        /// The value it published with [`Election::campaign`].
        value: String,
        /// Its term (the fencing token of its hold).
        term: u64,
    },
    /// Nobody holds the seat.
    Vacant {
        /// The term of the last leader (0: never had one, or its record was swept).
        after_term: u64,
    },
}

impl<S: Storage + ?Sized> Election<S> {
    /// The election on lock name `name` over `locks`' storage. Touches no storage.
    ///
    /// # Errors
    /// [`LockError::InvalidName`] if `name` is not a valid lock name.
    pub fn new(locks: &StorageLock<S>, name: &str) -> Result<Self, LockError> {
        locks.key_for(name)?;
        Ok(Self {
            locks: locks.clone(),
            name: name.to_owned(),
        })
    }

    /// The seat's lock name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Campaigns for the seat with `value` (an address, a node id: what observers get), waiting
    /// as `options.wait` says. The leadership renews itself: without `options.auto_renew`, it
    /// renews every third of the lease. `Ok(None)`: another leader kept the seat until the wait
    /// budget ran out.
    ///
    /// # Errors
    /// [`LockError::InvalidOptions`] for a value longer than [`MAX_VALUE_LEN`] or holding
    /// control characters, or bad options — before any storage call; otherwise as
    /// [`crate::DistributedLock::try_acquire`].
    ///
    /// # Cancel safety
    /// As [`crate::DistributedLock::try_acquire`].
    pub async fn campaign(
        &self,
        value: &str,
        options: &AcquireOptions,
    ) -> Result<Option<Leadership>, LockError> {
        validate_value(value)?;
        let mut options = options.clone().note(value);
        if options.auto_renew.is_none() {
            let every = (options.lease / 3).max(Duration::from_nanos(1));
            options = options.auto_renew(every);
        }
        let handle = self.locks.try_acquire(&self.name, &options).await?;
        Ok(handle.map(|handle| Leadership {
            handle,
            value: value.to_owned(),
        }))
    }

    /// The seat now: one read.
    ///
    /// # Errors
    /// [`LockError::Storage`] if the storage fails.
    pub async fn leader(&self) -> Result<Observed, LockError> {
        Ok(self.read().await?.0)
    }

    /// Follows the seat: see [`Observer`].
    pub fn observe(&self) -> Observer<S> {
        Observer {
            election: self.clone(),
            last: None,
        }
    }

    /// The seat, and how long until the leader's lease ends unless renewed.
    async fn read(&self) -> Result<(Observed, Option<Duration>), LockError> {
        let key = self.locks.key_for(&self.name)?;
        let storage = self.locks.storage();
        let stored = storage.get(&key).await?;
        let now: Timestamp = storage.now().await?;
        Ok(match stored {
            Some(s) if s.record.is_held_at(now) => (
                Observed::Leader {
                    value: s
                        .record
                        .holder
                        .as_ref()
                        .and_then(|h| h.note.clone())
                        .unwrap_or_default(),
                    term: s.record.fencing,
                },
                Some(s.record.expires_at.saturating_since(now)),
            ),
            Some(s) => (
                Observed::Vacant {
                    after_term: s.record.fencing,
                },
                None,
            ),
            None => (Observed::Vacant { after_term: 0 }, None),
        })
    }
}

/// Follows an election's seat ([`Election::observe`]): each [`Observer::next`] returns the
/// seat as soon as it differs from what the last call returned — a new leader, or a vacancy.
///
/// **In term order**: a leader is reported only with a term greater than every leader reported
/// before, and a vacancy only after a leader (or first). An observer reports states, not every
/// event: a leader whose whole term fell between two reads is not seen. It wakes on the
/// storage's change notifications and at the leader's expiry, and reads at least every
/// [`OBSERVE_POLL`].
pub struct Observer<S: Storage + ?Sized = dyn Storage> {
    election: Election<S>,
    last: Option<Observed>,
}

impl<S: Storage + ?Sized> fmt::Debug for Observer<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Observer")
            .field("election", &self.election)
            .field("last", &self.last)
            .finish()
    }
}

impl<S: Storage + ?Sized> Observer<S> {
    /// The seat, once it differs from the last state returned (at once on the first call).
    ///
    /// # Errors
    /// [`LockError::Storage`] if the storage fails; the observer stays usable (call again).
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped call changes nothing.
    ///
    /// # Examples
    /// See [`Election`].
    pub async fn next(&mut self) -> Result<Observed, LockError> {
        let key = self.election.locks.key_for(&self.election.name)?;
        loop {
            // Armed before the read: a change after the read wakes us.
            let change = self.election.locks.storage().wait_for_change(&key).await?;
            let (seen, left) = self.election.read().await?;
            if self.is_news(&seen) {
                self.last = Some(seen.clone());
                return Ok(seen);
            }
            // Backends notify releases (what waiters need), not every grant: a vacancy is seen
            // at once, a new leader within OBSERVE_POLL. Expiry writes nothing, so wake when
            // the lease would end, too.
            let wake = left.map_or(OBSERVE_POLL, |left| {
                left.min(OBSERVE_POLL) + Duration::from_millis(1)
            });
            tokio::select! {
                () = change.changed() => {}
                () = sleep_at_most(wake) => {}
            }
        }
    }

    /// Whether `seen` is to be reported after `self.last`, in term order.
    fn is_news(&self, seen: &Observed) -> bool {
        let last_term = match &self.last {
            None => return true,
            Some(Observed::Leader { term, .. }) => *term,
            Some(Observed::Vacant { after_term }) => *after_term,
        };
        match (seen, &self.last) {
            (Observed::Leader { term, .. }, _) => *term > last_term,
            (Observed::Vacant { .. }, Some(Observed::Leader { .. })) => true,
            (Observed::Vacant { .. }, _) => false,
        }
    }
}

fn sleep_at_most(d: Duration) -> impl Future<Output = ()> {
    // A year stands for "no timer": no deadline overflows.
    tokio::time::sleep(d.min(Duration::from_secs(365 * 24 * 3600)))
}

/// The seat, held: a leader's hold of the election's lock. Dropping it resigns in the
/// background.
#[must_use = "dropping a Leadership resigns in the background; keep it while you lead"]
pub struct Leadership {
    handle: LockHandle,
    value: String,
}

impl Leadership {
    /// The term: the hold's fencing token, greater than every earlier leader's. Pass it with
    /// every write a leader makes, and let the resource reject lower ones.
    pub fn term(&self) -> u64 {
        self.handle.fencing_token()
    }

    /// The value published.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// The hold: lease, renewal, expiry.
    pub fn handle(&self) -> &LockHandle {
        &self.handle
    }

    /// Whether the leadership is lost (see [`LockHandle::is_lost`]).
    pub fn is_lost(&self) -> bool {
        self.handle.is_lost()
    }

    /// Completes when the leadership is lost: stop acting as leader.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.handle.lost()
    }

    /// Gives the seat up.
    ///
    /// # Errors
    /// As [`LockHandle::release`].
    pub async fn resign(&self) -> Result<(), LockError> {
        self.handle.release().await
    }
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("value", &self.value)
            .field("handle", &self.handle)
            .finish()
    }
}
