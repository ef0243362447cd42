//! The stored lock record and the small value types around it.

use std::fmt;
use std::sync::Arc;

pub use crate::clock::Timestamp;

/// The identity of one holder: 128 random bits.
///
/// An owner id is the secret that renews and releases a hold; the engine draws a fresh one for
/// every [`crate::LockHandle`] from a cryptographically secure generator. The reentrant API
/// ([`crate::StorageLock::lock_reentrant`]) takes the caller's own.
///
/// Kept as two 64-bit halves (high, low), not a `u128`: that keeps its alignment, and so a
/// [`LockRecord`]'s, at 8 bytes (a `u128` is 16-aligned), which saves 8 bytes in every record a
/// storage keeps and in every handle. Ordering is that of the 128-bit number.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OwnerId([u64; 2]);

impl OwnerId {
    /// The owner written into the tombstone of a force-released hold
    /// ([`crate::StorageExt::force_release`]), so the evicted owner can be told *why* its hold
    /// is gone. Servers refuse it as a client-chosen owner.
    pub const NOBODY: Self = Self([0, 0]);

    /// A fresh random owner id (thread-local CSPRNG).
    pub fn random() -> Self {
        Self::from_u128(rand::random())
    }

    /// The owner id with the given bits.
    pub const fn from_u128(bits: u128) -> Self {
        Self([(bits >> 64) as u64, bits as u64])
    }

    /// The 128 bits of this id.
    pub const fn as_u128(self) -> u128 {
        ((self.0[0] as u128) << 64) | self.0[1] as u128
    }

    /// The 16 big-endian bytes of this id (how SQL backends store it).
    pub const fn to_bytes(self) -> [u8; 16] {
        self.as_u128().to_be_bytes()
    }

    /// The owner id stored as 16 big-endian bytes.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        Some(Self::from_u128(u128::from_be_bytes(bytes.try_into().ok()?)))
    }
}

impl fmt::Display for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.as_u128())
    }
}

impl fmt::Debug for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Only a prefix: the full id is a secret that renews and releases the hold.
        write!(f, "OwnerId({:08x}…)", self.0[0] >> 32)
    }
}

/// Parses exactly what [`OwnerId`]'s `Display` writes: 32 hexadecimal digits (either case),
/// nothing else — no sign, no `0x`, no whitespace, no shorter or longer string.
///
/// # Errors
/// [`ParseOwnerIdError`] for anything else. The all-zero id ([`OwnerId::NOBODY`]) parses;
/// whoever accepts owners from clients refuses it.
///
/// # Examples
/// ```
/// use storage_lock_core::OwnerId;
/// let id = OwnerId::random();
/// assert_eq!(id.to_string().parse::<OwnerId>(), Ok(id));
/// assert!("+1".parse::<OwnerId>().is_err());
/// assert!(format!(" {id}").parse::<OwnerId>().is_err());
/// ```
impl std::str::FromStr for OwnerId {
    type Err = ParseOwnerIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.len() != 32 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(ParseOwnerIdError(()));
        }
        u128::from_str_radix(s, 16)
            .map(Self::from_u128)
            .map_err(|_| ParseOwnerIdError(()))
    }
}

/// A string that is not an [`OwnerId`] (32 hexadecimal digits).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("an owner id is 32 hexadecimal digits")]
pub struct ParseOwnerIdError(());

/// Who holds a lock, for people and tools (never used for decisions).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HolderInfo {
    /// Host name of the holder.
    pub host: String,
    /// Process id of the holder.
    pub pid: u32,
    /// Free-form note (e.g. the command a CLI runs under the lock).
    pub note: Option<String>,
}

impl HolderInfo {
    /// Host name and pid of the current process, without a note.
    pub fn this_process() -> Self {
        let host = std::env::var("HOSTNAME")
            .ok()
            .filter(|h| !h.is_empty())
            .or_else(|| {
                std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .ok()
                    .map(|h| h.trim().to_owned())
            })
            .unwrap_or_else(|| "unknown".to_owned());
        Self {
            host,
            pid: std::process::id(),
            note: None,
        }
    }
}

/// One lock record as a storage keeps it.
///
/// `count == 0` is a **tombstone**: the lock is free, but the record (and so its fencing
/// counter) survives. A record with `count > 0` is held until `expires_at` on the storage clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockRecord {
    /// The current (or last) holder.
    pub owner: OwnerId,
    /// Reentrancy depth; 0 = released.
    pub count: u32,
    /// Fencing token of the current (or last) acquisition; strictly increasing per key.
    pub fencing: u64,
    /// When the current (or last) acquisition happened.
    pub acquired_at: Timestamp,
    /// When the hold lapses (for a tombstone: when it was released).
    pub expires_at: Timestamp,
    /// Who holds it (shared, so copying a record never copies the strings).
    pub holder: Option<Arc<HolderInfo>>,
}

impl LockRecord {
    /// Whether the record grants the lock to its owner at `now`.
    pub fn is_held_at(&self, now: Timestamp) -> bool {
        self.count > 0 && self.expires_at > now
    }
}

/// The opaque version a storage attaches to a record; it guards compare-and-set.
///
/// Backends build it from what they have (a row version, an etcd `mod_revision`, an S3 ETag);
/// users of the lock API never see it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Version(VersionRepr);

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum VersionRepr {
    Number(u64),
    Text(String),
}

impl Version {
    /// A numeric version (row version, revision, counter).
    pub const fn from_u64(v: u64) -> Self {
        Self(VersionRepr::Number(v))
    }

    /// A fresh random 63-bit numeric version, for backends whose clients choose versions.
    pub fn random() -> Self {
        Self::from_u64(OwnerId::random().as_u128() as u64 >> 1)
    }

    /// A textual version (ETag and the like).
    pub fn from_text(v: impl Into<String>) -> Self {
        Self(VersionRepr::Text(v.into()))
    }

    /// The numeric version, if this is one.
    pub fn as_u64(&self) -> Option<u64> {
        match self.0 {
            VersionRepr::Number(n) => Some(n),
            VersionRepr::Text(_) => None,
        }
    }

    /// The textual version, if this is one.
    pub fn as_text(&self) -> Option<&str> {
        match &self.0 {
            VersionRepr::Text(t) => Some(t),
            VersionRepr::Number(_) => None,
        }
    }
}

/// A record together with the version that guards it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    /// The record.
    pub record: LockRecord,
    /// Its current version.
    pub version: Version,
}

/// Where a [`crate::Storage::list`] page starts and how long it may be.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PageRequest {
    /// Return only keys strictly greater than this one (the `next` of the previous page).
    pub after: Option<String>,
    /// At most this many entries (0 means the backend's default of 1000).
    pub limit: usize,
}

impl PageRequest {
    /// The effective limit (1000 when unset).
    pub fn effective_limit(&self) -> usize {
        if self.limit == 0 { 1000 } else { self.limit }
    }
}

/// One page of a listing, in ascending key order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Page {
    /// Keys and their records.
    pub entries: Vec<(String, Stored)>,
    /// Pass as [`PageRequest::after`] to get the next page; `None` on the last page.
    pub next: Option<String>,
    /// Keys in this page whose record could not be decoded, with why: reported, not fatal, so
    /// one bad record never hides every other lock from a listing or a sweep (a sweep leaves
    /// them alone).
    pub corrupt: Vec<(String, String)>,
}

impl Page {
    /// Like [`Self::from_sorted`] for rows some of which could not be decoded: those go to
    /// [`Self::corrupt`] (they count toward `limit`, so the cursor moves past them).
    pub fn from_sorted_results(
        mut rows: Vec<(String, Result<Stored, String>)>,
        limit: usize,
    ) -> Self {
        let limit = limit.max(1);
        let next = (rows.len() > limit).then(|| rows[limit - 1].0.clone());
        rows.truncate(limit);
        let mut page = Self {
            next,
            ..Self::default()
        };
        for (key, row) in rows {
            match row {
                Ok(stored) => page.entries.push((key, stored)),
                Err(why) => page.corrupt.push((key, why)),
            }
        }
        page
    }

    /// The page `req` asks for from a listing's rows in any order (a scan, a dump): the rows
    /// whose key starts with `prefix` and sorts after `req.after`, sorted, then as
    /// [`Self::from_sorted_results`].
    ///
    /// # Examples
    /// ```
    /// use storage_lock_core::{Page, PageRequest};
    /// let rows = vec![
    ///     ("b/2".to_owned(), Err("garbage".to_owned())),
    ///     ("a/1".to_owned(), Err("garbage".to_owned())),
    ///     ("b/1".to_owned(), Err("garbage".to_owned())),
    /// ];
    /// let page = Page::from_unsorted_results(rows, "b/", &PageRequest::default());
    /// assert_eq!(page.corrupt.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>(), ["b/1", "b/2"]);
    /// ```
    pub fn from_unsorted_results(
        mut rows: Vec<(String, Result<Stored, String>)>,
        prefix: &str,
        req: &PageRequest,
    ) -> Self {
        rows.retain(|(key, _)| {
            key.starts_with(prefix) && req.after.as_deref().is_none_or(|a| key.as_str() > a)
        });
        rows.sort_by(|a, b| a.0.cmp(&b.0));
        Self::from_sorted_results(rows, req.effective_limit())
    }

    /// The page of at most `limit` entries from `entries` (sorted by key, holding up to one
    /// more than `limit` to tell whether another page follows). A `limit` of 0 is taken as 1,
    /// so that a page always makes progress.
    pub fn from_sorted(mut entries: Vec<(String, Stored)>, limit: usize) -> Self {
        let limit = limit.max(1);
        let next = (entries.len() > limit).then(|| entries[limit - 1].0.clone());
        entries.truncate(limit);
        Self {
            entries,
            next,
            corrupt: Vec::new(),
        }
    }

    /// The page of at most `limit` records read by `read` from `names` (candidate keys in any
    /// order, e.g. from a listing that returns names only; sorted here), skipping names whose
    /// record is gone by the time it is read, so a key deleted meanwhile never ends a listing
    /// early. A record that `read` reports as [`crate::StorageError::Corrupt`] goes to
    /// [`Self::corrupt`] (one bad record never hides the others). Reads up to 16 names at a
    /// time, and stops once `limit + 1` records are found.
    ///
    /// # Errors
    /// The first error of `read` other than a corrupt record.
    pub async fn gather<F, Fut>(
        mut names: Vec<String>,
        limit: usize,
        read: F,
    ) -> Result<Self, super::StorageError>
    where
        F: Fn(String) -> Fut,
        Fut: std::future::Future<Output = Result<Option<Stored>, super::StorageError>>,
    {
        use futures_util::StreamExt;
        names.sort_unstable();
        let limit = limit.max(1);
        let mut rows = Vec::with_capacity(names.len().min(limit + 1));
        let mut reads = futures_util::stream::iter(names)
            .map(|name| {
                let got = read(name.clone());
                async move { (name, got.await) }
            })
            .buffered(16);
        while let Some((name, got)) = reads.next().await {
            match got {
                Ok(Some(stored)) => rows.push((name, Ok(stored))),
                Ok(None) => {}
                Err(super::StorageError::Corrupt { reason, .. }) => rows.push((name, Err(reason))),
                Err(e) => return Err(e),
            }
            if rows.len() > limit {
                break;
            }
        }
        Ok(Self::from_sorted_results(rows, limit))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only what `Display` writes parses: a sign, a `0x`, whitespace or a short id used to
    /// pass `u128::from_str_radix` (`"+1"` was owner 1).
    #[test]
    fn owner_ids_parse_strictly() {
        let id = OwnerId::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
        assert_eq!(id.to_string().parse::<OwnerId>(), Ok(id));
        assert_eq!(id.to_string().to_uppercase().parse::<OwnerId>(), Ok(id));
        let thirty_one = "1".repeat(31);
        for bad in [
            "",
            "1",
            "+1",
            &format!("+{thirty_one}"),
            &format!("0x{}", "1".repeat(30)),
            &format!(" {thirty_one}"),
            &"1".repeat(33),
            &"g".repeat(32),
        ] {
            assert!(bad.parse::<OwnerId>().is_err(), "{bad:?} parsed");
        }
    }

    fn stored() -> Stored {
        Stored {
            record: LockRecord {
                owner: OwnerId::from_u128(1),
                count: 0,
                fencing: 1,
                acquired_at: Timestamp::from_millis(0),
                expires_at: Timestamp::from_millis(0),
                holder: None,
            },
            version: Version::from_u64(1),
        }
    }

    #[tokio::test]
    async fn gather_skips_names_gone_before_their_read_without_ending_the_listing() {
        let names = ["a", "b", "c", "d"].map(str::to_owned).to_vec();
        let page = Page::gather(names, 2, |n| async move {
            Ok((n != "a" && n != "c").then(stored))
        })
        .await
        .unwrap();
        let keys: Vec<_> = page.entries.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["b", "d"]);
        assert_eq!(page.next, None);
        let names = ["a", "b", "c", "d"].map(str::to_owned).to_vec();
        let page = Page::gather(names, 1, |n| async move { Ok((n != "a").then(stored)) })
            .await
            .unwrap();
        assert_eq!(page.entries.len(), 1);
        assert_eq!(page.next.as_deref(), Some("b"));
    }
}
