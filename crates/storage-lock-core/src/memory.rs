//! [`MemoryStorage`]: a process-local storage for coordinating tasks of one process.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use hashbrown::HashTable;
use tokio::sync::watch;

use crate::small_key::SmallKey;

use crate::clock::{Clock, SystemClock};
use crate::storage::TimeSource;
use crate::storage::ops::{self, AcquireDecision, FENCING_FLOOR_KEY};
use crate::storage::{
    AcquireAnyOutcome, AcquireManyOutcome, AcquireOutcome, AcquireRequest, Capabilities, CasWrite,
    ChangeWait, LockRecord, OwnerId, Page, PageRequest, Primitives, ReleaseOutcome, RenewOutcome,
    RenewRequest, Storage, StorageError, Stored, Timestamp, Version,
};

/// A storage in this process's memory: one table for any number of keys, change notifications
/// for waiters, and every lock operation done under one short mutex hold.
///
/// Exclusion holds among the tasks of **this process only** ([`Capabilities::process_local`]);
/// nothing survives a restart. Time comes from a [`Clock`] (default [`SystemClock`]; inject a
/// [`crate::ManualClock`] to test expiry without sleeping).
#[derive(Debug)]
pub struct MemoryStorage {
    table: Mutex<Table>,
    clock: Arc<dyn Clock>,
    time_source: TimeSource,
}

/// The records, and the change channels of the keys someone waits for.
///
/// Sized for a million held locks: each record is **one allocation** (an [`Entry`] of 88
/// bytes, its key inline when short) behind an 8-byte bucket. A hash table sits between half
/// and seven eighths full, so its bucket size counts up to twice per key; boxed entries keep
/// that at 8 bytes (plus one control byte). Change channels live apart, in `waiting`, since
/// most keys never have a waiter.
#[derive(Default)]
struct Table {
    entries: HashTable<Box<Entry>>,
    hasher: RandomState,
    /// Present for a key while someone may be waiting for a change of it.
    waiting: HashMap<Box<str>, watch::Sender<()>>,
    last_version: u64,
}

struct Entry {
    key: SmallKey,
    record: LockRecord,
    version: u64,
}

impl fmt::Debug for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Table")
            .field("keys", &self.entries.len())
            .field("waited_for", &self.waiting.len())
            .finish_non_exhaustive()
    }
}

impl Default for MemoryStorage {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStorage {
    /// An empty storage on the system clock.
    pub fn new() -> Self {
        Self {
            table: Mutex::new(Table::default()),
            clock: Arc::new(SystemClock),
            time_source: TimeSource::Server,
        }
    }

    /// An empty storage on `clock` (its capabilities then say [`TimeSource::Injected`]).
    pub fn with_clock(clock: impl Clock) -> Self {
        Self {
            table: Mutex::new(Table::default()),
            clock: Arc::new(clock),
            time_source: TimeSource::Injected,
        }
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Table {
    fn entry(&self, key: &str) -> Option<&Entry> {
        let hash = SmallKey::hash_str(&self.hasher, key);
        self.entries.find(hash, |e| e.key.is(key)).map(|e| &**e)
    }

    fn current(&self, key: &str) -> Option<&LockRecord> {
        self.entry(key).map(|e| &e.record)
    }

    fn version_of(&self, key: &str) -> Option<u64> {
        self.entry(key).map(|e| e.version)
    }

    fn next_version(&mut self) -> u64 {
        self.last_version += 1;
        self.last_version
    }

    /// Stores `record` under `key` with a fresh version and wakes the key's waiters.
    fn put(&mut self, key: &str, record: LockRecord) -> u64 {
        let version = self.next_version();
        let hash = SmallKey::hash_str(&self.hasher, key);
        let Self {
            entries, hasher, ..
        } = self;
        match entries.find_mut(hash, |e| e.key.is(key)) {
            Some(entry) => {
                entry.record = record;
                entry.version = version;
            }
            None => {
                let entry = Box::new(Entry {
                    key: SmallKey::new(key),
                    record,
                    version,
                });
                entries.insert_unique(hash, entry, |e| e.key.hash_with(hasher));
            }
        }
        self.notify(key);
        version
    }

    /// Lets `change` edit the record under `key` in place (one lookup); if it reports a change,
    /// the record gets a fresh version and the key's waiters wake.
    fn modify(&mut self, key: &str, change: impl FnOnce(&mut LockRecord) -> bool) {
        let hash = SmallKey::hash_str(&self.hasher, key);
        let next = self.last_version + 1;
        if let Some(entry) = self.entries.find_mut(hash, |e| e.key.is(key))
            && change(&mut entry.record)
        {
            entry.version = next;
            self.last_version = next;
            self.notify(key);
        }
    }

    /// Removes `key`'s record and wakes its waiters.
    fn remove(&mut self, key: &str) {
        let hash = SmallKey::hash_str(&self.hasher, key);
        if let Ok(entry) = self.entries.find_entry(hash, |e| e.key.is(key)) {
            entry.remove();
        }
        self.notify(key);
    }

    /// Wakes whoever waits for a change of `key` (forgetting the channel once nobody does).
    fn notify(&mut self, key: &str) {
        if self.waiting.is_empty() {
            return;
        }
        if let Some(tx) = self.waiting.get(key) {
            if tx.receiver_count() == 0 {
                self.waiting.remove(key);
            } else {
                tx.send_replace(());
            }
        }
    }

    fn floor(&self) -> u64 {
        self.current(FENCING_FLOOR_KEY).map_or(0, |r| r.fencing)
    }
}

/// [`Storage::acquire_once`] on the locked table.
fn acquire_in(
    table: &mut Table,
    key: &str,
    req: &AcquireRequest,
    now: Timestamp,
) -> AcquireOutcome {
    let hash = SmallKey::hash_str(&table.hasher, key);
    let next = table.last_version + 1;
    if let Some(entry) = table.entries.find_mut(hash, |e| e.key.is(key)) {
        // One lookup for an existing key: decide and change the record in place.
        let record = &mut entry.record;
        let outcome = match ops::decide_acquire(Some(record), 0, now, req) {
            AcquireDecision::Busy(outcome) => return outcome,
            AcquireDecision::Take(taken) => {
                *record = taken;
                ops::acquired(record)
            }
            AcquireDecision::Reenter { count, expires_at } => {
                record.count = count;
                record.expires_at = expires_at;
                ops::acquired(record)
            }
        };
        entry.version = next;
        table.last_version = next;
        table.notify(key);
        return outcome;
    }
    match ops::decide_acquire(None, table.floor(), now, req) {
        AcquireDecision::Take(record) => {
            let outcome = ops::acquired(&record);
            table.put(key, record);
            outcome
        }
        other => unreachable!("a fresh key is always taken, not {other:?}"),
    }
}

/// [`Storage::release`] on the locked table.
fn release_in(table: &mut Table, key: &str, owner: OwnerId, now: Timestamp) -> ReleaseOutcome {
    let mut outcome = ReleaseOutcome::NotHeld;
    table.modify(key, |record| {
        if let Some(release) = ops::decide_release(Some(record), owner, now) {
            record.count = release.count;
            record.expires_at = release.expires_at;
            outcome = ReleaseOutcome::Released {
                remaining: release.count,
                fencing: record.fencing,
            };
            true
        } else {
            false
        }
    });
    outcome
}

fn renew_in(
    table: &mut Table,
    key: &str,
    owner: OwnerId,
    now: Timestamp,
    lease: Duration,
) -> RenewOutcome {
    let mut outcome = RenewOutcome::NotHeld;
    table.modify(key, |record| {
        if let Some(expires_at) = ops::decide_renew(Some(record), owner, now, lease) {
            record.expires_at = expires_at;
            outcome = RenewOutcome::Renewed { expires_at };
            true
        } else {
            false
        }
    });
    outcome
}

fn expect_version(expected: &Version) -> Option<u64> {
    expected.as_u64()
}

#[async_trait]
impl Storage for MemoryStorage {
    fn name(&self) -> &str {
        "memory"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::linearizable()
            .with_conditional_delete(true)
            .with_change_notifications(true)
            .with_process_local(true)
            .with_round_trips("0 (one mutex hold in this process)")
            .with_time_source(self.time_source)
    }

    async fn now(&self) -> Result<Timestamp, StorageError> {
        Ok(self.clock.now())
    }

    async fn get(&self, key: &str) -> Result<Option<Stored>, StorageError> {
        let table = self.table();
        Ok(table.entry(key).map(|e| Stored {
            record: e.record.clone(),
            version: Version::from_u64(e.version),
        }))
    }

    async fn list(&self, prefix: &str, page: &PageRequest) -> Result<Page, StorageError> {
        let table = self.table();
        let mut entries: Vec<(String, Stored)> = table
            .entries
            .iter()
            .filter(|e| e.key.as_str().starts_with(prefix))
            .filter(|e| page.after.as_deref().is_none_or(|a| e.key.as_str() > a))
            .map(|e| {
                (
                    e.key.as_str().to_owned(),
                    Stored {
                        record: e.record.clone(),
                        version: Version::from_u64(e.version),
                    },
                )
            })
            .collect();
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let limit = page.effective_limit();
        Ok(Page::from_sorted(entries, limit))
    }

    async fn acquire_once(
        &self,
        key: &str,
        req: &AcquireRequest,
    ) -> Result<AcquireOutcome, StorageError> {
        let now = self.clock.now();
        Ok(acquire_in(&mut self.table(), key, req, now))
    }

    /// Every key under one lock of the table, on one reading of the clock: nobody sees part of
    /// them taken. The keys are looked at before anything is written, so a busy answer changes
    /// nothing.
    async fn acquire_many(
        &self,
        keys: &[&str],
        req: &AcquireRequest,
    ) -> Result<AcquireManyOutcome, StorageError> {
        let now = self.clock.now();
        let mut table = self.table();
        for (index, key) in keys.iter().enumerate() {
            if let AcquireDecision::Busy(outcome) =
                ops::decide_acquire(table.current(key), 0, now, req)
            {
                return Ok(AcquireManyOutcome::Busy { index, outcome });
            }
        }
        let mut taken = Vec::with_capacity(keys.len());
        for (index, key) in keys.iter().enumerate() {
            match acquire_in(&mut table, key, req, now) {
                outcome @ AcquireOutcome::Acquired { .. } => taken.push(outcome),
                // Only a key given twice gets here: its first grant makes the second busy.
                outcome => {
                    for given_back in &keys[..index] {
                        release_in(&mut table, given_back, req.owner, now);
                    }
                    return Ok(AcquireManyOutcome::Busy { index, outcome });
                }
            }
        }
        Ok(AcquireManyOutcome::Acquired(taken))
    }

    /// The gate and every key looked at under one lock of the table, on one reading of the
    /// clock; the first `need` free ones are taken only if there are that many.
    async fn acquire_any(
        &self,
        keys: &[&str],
        need: usize,
        gate: Option<&str>,
        req: &AcquireRequest,
    ) -> Result<AcquireAnyOutcome, StorageError> {
        let now = self.clock.now();
        let mut table = self.table();
        let gate = match gate.map(|g| ops::decide_gate(table.current(g))) {
            Some(ops::GateDecision::Held) => return Ok(AcquireAnyOutcome::GateHeld),
            Some(ops::GateDecision::Passes(token)) => token,
            Some(ops::GateDecision::PassesWithFloor) => table.floor(),
            None => 0,
        };
        let (mut free, mut busy) = (Vec::with_capacity(need), Vec::new());
        for (index, key) in keys.iter().enumerate() {
            match ops::decide_acquire(table.current(key), 0, now, req) {
                AcquireDecision::Busy(outcome) => busy.push((index, outcome)),
                _ if free.len() < need => free.push(index),
                _ => {}
            }
        }
        if free.len() < need {
            return Ok(AcquireAnyOutcome::Busy(busy));
        }
        let taken = free
            .into_iter()
            .map(|index| (index, acquire_in(&mut table, keys[index], req, now)))
            .collect();
        Ok(AcquireAnyOutcome::Acquired { taken, gate })
    }

    async fn renew(
        &self,
        key: &str,
        owner: OwnerId,
        lease: Duration,
    ) -> Result<RenewOutcome, StorageError> {
        let now = self.clock.now();
        Ok(renew_in(&mut self.table(), key, owner, now, lease))
    }

    /// All keys under one lock of the table, on one reading of the clock.
    async fn renew_many(
        &self,
        renewals: &[RenewRequest<'_>],
    ) -> Result<Vec<Result<RenewOutcome, StorageError>>, StorageError> {
        let now = self.clock.now();
        let mut table = self.table();
        Ok(renewals
            .iter()
            .map(|r| Ok(renew_in(&mut table, r.key, r.owner, now, r.lease)))
            .collect())
    }

    async fn release(&self, key: &str, owner: OwnerId) -> Result<ReleaseOutcome, StorageError> {
        let now = self.clock.now();
        Ok(release_in(&mut self.table(), key, owner, now))
    }

    async fn wait_for_change(&self, key: &str) -> Result<ChangeWait, StorageError> {
        let mut table = self.table();
        let mut rx = match table.waiting.get(key) {
            Some(tx) => tx.subscribe(),
            None => {
                let (tx, rx) = watch::channel(());
                table.waiting.insert(key.into(), tx);
                rx
            }
        };
        Ok(ChangeWait::new(async move {
            let _ = rx.changed().await;
        }))
    }

    fn primitives(&self) -> Option<&dyn Primitives> {
        Some(self)
    }
}

#[async_trait]
impl Primitives for MemoryStorage {
    async fn create(&self, key: &str, record: &LockRecord) -> Result<Version, StorageError> {
        let mut table = self.table();
        if table.current(key).is_some() {
            return Err(StorageError::already_exists(key));
        }
        Ok(Version::from_u64(table.put(key, record.clone())))
    }

    async fn update(
        &self,
        key: &str,
        expected: &Version,
        record: &LockRecord,
    ) -> Result<Version, StorageError> {
        let mut table = self.table();
        if table.version_of(key).is_none() || table.version_of(key) != expect_version(expected) {
            return Err(StorageError::conflict(key));
        }
        Ok(Version::from_u64(table.put(key, record.clone())))
    }

    async fn delete(&self, key: &str, expected: &Version) -> Result<(), StorageError> {
        let mut table = self.table();
        if table.version_of(key).is_none() || table.version_of(key) != expect_version(expected) {
            return Err(StorageError::conflict(key));
        }
        table.remove(key);
        Ok(())
    }

    fn writes_all_at_once(&self) -> bool {
        true
    }

    /// Every condition checked, then every record written, under one lock of the table.
    async fn write_all(&self, writes: &[CasWrite<'_>]) -> Result<Vec<Version>, StorageError> {
        let mut table = self.table();
        for w in writes {
            match (w.expected, table.version_of(w.key)) {
                (None, None) => {}
                (None, Some(_)) => return Err(StorageError::already_exists(w.key)),
                (Some(expected), found) if found.is_some() && found == expect_version(expected) => {
                }
                (Some(_), _) => return Err(StorageError::conflict(w.key)),
            }
        }
        Ok(writes
            .iter()
            .map(|w| Version::from_u64(table.put(w.key, w.record.clone())))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{ManualClock, StorageLock};

    fn request(lease: Duration) -> AcquireRequest {
        AcquireRequest {
            owner: OwnerId::random(),
            lease,
            holder: None,
            reentrant: false,
        }
    }

    /// A held lock costs the table one allocation of this (88 bytes: 96 in glibc's size
    /// classes) and an 8-byte bucket; `benches/holds.rs` measures the whole cost per hold.
    #[cfg(target_pointer_width = "64")]
    #[test]
    fn an_entry_stays_small() {
        let entry = std::mem::size_of::<Entry>();
        assert!(entry <= 88, "Entry is {entry} bytes");
    }

    /// With a manual clock, expiry is decided by the storage clock alone: no sleeping, and the
    /// takeover gets the next fencing token.
    #[tokio::test]
    async fn manual_clock_decides_expiry() {
        let clock = ManualClock::new(Timestamp::from_millis(1_000_000));
        let s = MemoryStorage::with_clock(clock.clone());
        let lease = Duration::from_secs(10);
        let first = s.acquire_once("k", &request(lease)).await.unwrap();
        let AcquireOutcome::Acquired { fencing, .. } = first else {
            panic!("{first:?}")
        };
        clock.advance(lease - Duration::from_millis(1));
        let busy = s.acquire_once("k", &request(lease)).await.unwrap();
        assert_eq!(busy.busy_for(), Some(Duration::from_millis(1)));
        clock.advance(Duration::from_millis(1));
        let next = s.acquire_once("k", &request(lease)).await.unwrap();
        assert!(matches!(next, AcquireOutcome::Acquired { fencing: f, .. } if f == fencing + 1));
    }

    /// A handle's expiry is the storage clock plus the lease, whatever the wall clock says.
    #[tokio::test]
    async fn handle_expiry_comes_from_the_storage_clock() {
        let clock = ManualClock::new(Timestamp::from_millis(5_000));
        let locks = StorageLock::new(MemoryStorage::with_clock(clock)).unwrap();
        let h = locks
            .try_acquire_for("k", Duration::ZERO)
            .await
            .unwrap()
            .unwrap();
        let expected = Timestamp::from_millis(5_000)
            .saturating_add(crate::contract::DEFAULT_LEASE)
            .to_system_time()
            .unwrap();
        assert_eq!(h.expires_at(), expected);
    }
}
