//! What a storage can promise.

/// Where a storage's [`crate::Storage::now`] comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TimeSource {
    /// The storage's own clock (a database server, a Redis `TIME`, the host of an embedded file).
    Server,
    /// A [`crate::Clock`] injected at construction; its drift bound is the injector's promise.
    Injected,
    /// No clock is shared: a client judges a record expired once it has seen that version of
    /// it unchanged for the lease the writer left in it, timed on its own monotonic clock
    /// (see [`crate::storage::observed`]). No client's wall clock plays a part (etcd, NATS
    /// JetStream KV, object storage).
    Observed,
    /// None: the storage cannot judge expiry.
    None,
}

/// Whether a storage keeps what it acknowledged across a crash or restart of its server.
///
/// A storage that forgets an acknowledged write can hand a held lock to a second holder and
/// issue a fencing token again. Backends set what they can for their own sessions and read the
/// rest of the server's settings when they open; they refuse to open on settings that can forget
/// writes unless the caller accepted that explicitly (`?durability=volatile` in the URL).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Durability {
    /// Every acknowledged write survives a crash of the server (checked at open, or true by
    /// construction). For a process-local storage: as long as the process that holds it.
    Durable,
    /// What decides it could not be seen (a managed service that hides its settings, a setting
    /// that clients cannot read); [`Capabilities::durability_note`] says what. A warning was
    /// logged once at open. Durable only if the operator made it so; one who did says so with
    /// `?durability=unverified` in the URL (the CLI warns, and `check` fails, until then).
    Unverified,
    /// The caller accepted a storage that can forget writes on a restart: exclusion and
    /// fencing can break then.
    Volatile,
}

impl Durability {
    /// The verdict of a backend's check at open: `problem` names the setting that can lose
    /// writes (`None`: durable). A problem is a [`crate::StorageError::Config`] unless
    /// `allow_volatile`, then [`Durability::Volatile`].
    ///
    /// # Errors
    /// [`crate::StorageError::Config`] when a problem was found and volatility was not accepted.
    pub fn judge(
        backend: &str,
        problem: Option<String>,
        allow_volatile: bool,
    ) -> Result<Self, super::StorageError> {
        match problem {
            None => Ok(Self::Durable),
            Some(_) if allow_volatile => Ok(Self::Volatile),
            Some(problem) => Err(super::StorageError::config(
                backend,
                format!(
                    "the server can forget held locks and fencing tokens: {problem}. Fix that \
                     setting, or accept that exclusion and fencing can break on a restart with \
                     `?durability=volatile`"
                ),
            )),
        }
    }
}

/// How far below a storage's [`Capabilities::fencing_bound`] the engine stops granting: 2^32
/// tokens. Reaching it takes a record written by hand or corrupted (counting acquisitions, 2^63
/// tokens last millions of years); the headroom keeps such a key's typed refusal far from the
/// point where the storage would fail, wrap or (Redis scripts count in doubles) round a token
/// back to one already handed out, even while refused grants keep moving it forward.
pub const FENCING_HEADROOM: u64 = 1 << 32;

/// The promises a storage makes; [`crate::StorageLock::new`] checks the ones safety rests on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Concurrent conditional writes to one key: exactly one wins, and a win is visible to every
    /// later read. Declare it only for configurations that really are linearizable: a single SQL
    /// primary, a single Redis primary, etcd, NATS JetStream, S3 with conditional PUT. Not:
    /// asynchronous replicas with failover, eventually consistent reads.
    pub linearizable_cas: bool,
    /// `delete(key, expected)` is conditional and atomic (needed by `sweep`).
    pub conditional_delete: bool,
    /// Where [`crate::Storage::now`] comes from.
    pub time_source: TimeSource,
    /// [`crate::Storage::wait_for_change`] delivers notifications (otherwise waiters back off):
    /// a waiter hears of a key freed by a release or by any other write that leaves it free
    /// (a force release), from any client of the storage.
    pub change_notifications: bool,
    /// Exclusion holds only inside one process.
    pub process_local: bool,
    /// Whether acknowledged writes survive a crash (see [`Durability`]).
    pub durability: Durability,
    /// With [`Durability::Unverified`]: what the backend could not see, and so what the
    /// operator must make sure of (shown by `storage-lock check` and warned about by the CLI).
    pub durability_note: Option<&'static str>,
    /// The largest fencing token the storage represents exactly (a `BIGINT` column: 2^63 − 1;
    /// Redis scripts, whose numbers are doubles: 2^53 − 1; `u64::MAX` by default). The engine
    /// refuses a grant whose token is within [`FENCING_HEADROOM`] of it
    /// (`LockError::FencingExhausted`, the grant released), well before the storage
    /// could fail, wrap or round.
    pub fencing_bound: u64,
    /// Records come back with their owner hidden ([`crate::OwnerId::NOBODY`]): a lock server
    /// keeps owners secret, so a caller cannot tell its own hold from another's by reading.
    pub owners_hidden: bool,
    /// Round trips per acquire / renew / release, with how, for people (`storage-lock check`
    /// prints it); `None` if the backend does not say.
    pub round_trips: Option<&'static str>,
}

impl Capabilities {
    /// Linearizable CAS and a server clock, nothing else; add the rest with the `with_*` setters
    /// (the struct is `#[non_exhaustive]`, so other crates cannot build it literally).
    pub const fn linearizable() -> Self {
        Self {
            linearizable_cas: true,
            conditional_delete: false,
            time_source: TimeSource::Server,
            change_notifications: false,
            process_local: false,
            durability: Durability::Durable,
            durability_note: None,
            fencing_bound: u64::MAX,
            owners_hidden: false,
            round_trips: None,
        }
    }

    /// Sets [`Self::owners_hidden`].
    pub const fn with_owners_hidden(mut self, yes: bool) -> Self {
        self.owners_hidden = yes;
        self
    }

    /// Sets [`Self::round_trips`].
    pub const fn with_round_trips(mut self, how: &'static str) -> Self {
        self.round_trips = Some(how);
        self
    }

    /// Sets [`Self::fencing_bound`].
    pub const fn with_fencing_bound(mut self, bound: u64) -> Self {
        self.fencing_bound = bound;
        self
    }

    /// The largest fencing token the engine grants on this storage: [`Self::fencing_bound`]
    /// less [`FENCING_HEADROOM`].
    pub const fn fencing_limit(&self) -> u64 {
        self.fencing_bound.saturating_sub(FENCING_HEADROOM)
    }

    /// Sets [`Self::durability`] to [`Durability::Unverified`] with its
    /// [`Self::durability_note`]: what the operator must make sure of.
    pub const fn with_unverified_durability(mut self, note: &'static str) -> Self {
        self.durability = Durability::Unverified;
        self.durability_note = Some(note);
        self
    }

    /// Sets [`Self::durability`].
    pub const fn with_durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// Sets [`Self::conditional_delete`].
    pub const fn with_conditional_delete(mut self, yes: bool) -> Self {
        self.conditional_delete = yes;
        self
    }

    /// Sets [`Self::time_source`].
    pub const fn with_time_source(mut self, source: TimeSource) -> Self {
        self.time_source = source;
        self
    }

    /// Sets [`Self::change_notifications`].
    pub const fn with_change_notifications(mut self, yes: bool) -> Self {
        self.change_notifications = yes;
        self
    }

    /// Sets [`Self::process_local`].
    pub const fn with_process_local(mut self, yes: bool) -> Self {
        self.process_local = yes;
        self
    }

    /// Sets [`Self::linearizable_cas`].
    pub const fn with_linearizable_cas(mut self, yes: bool) -> Self {
        self.linearizable_cas = yes;
        self
    }
}
