//! A byte form of [`LockRecord`]s and a safe alphabet for keys, for backends whose values are
//! opaque bytes and whose keys are restricted: etcd, NATS JetStream KV, object storage.
//!
//! Backends with typed columns (SQL, Redis hashes) store the fields as they are and do not use
//! this module.
//!
//! # The record format
//! One line of ASCII fields separated by single spaces, readable with `etcdctl get` or
//! `nats kv get`:
//!
//! ```text
//! sl1 <owner: 32 hex> <count> <fencing> <acquired_at ms> <expires_at ms> <nonce: 16 hex>[ h <pid> <len>:<host>[ n <len>:<note>]]
//! sl2 <owner: 32 hex> <count> <fencing> <acquired_at ms> <expires_at ms> <left ms> <nonce: 16 hex>[ h …]
//! ```
//!
//! `sl2` ([`encode_observed`]) adds the lease **left** when the record was written: the only
//! time a reader trusts in it (see [`super::observed`]); its two timestamps are the writer's,
//! for people. A reader of `sl1` (written by an older version) takes `expires_at −
//! acquired_at` as the lease left: never less than the truth, so never an early takeover. An
//! older version refuses `sl2` as an unknown format: it fails, it does not take a held lock.
//!
//! Host and note are length-prefixed (in bytes), so they may hold spaces and newlines. The
//! **nonce** makes two writes of equal records differ: storages whose version is a content hash
//! (an S3 ETag) would otherwise give them the same version, and a stale compare-and-set could
//! then win.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use super::{HolderInfo, LockRecord, OwnerId, StorageError, Timestamp};

const MAGIC: &str = "sl1";
const OBSERVED: &str = "sl2";

/// Encodes `record` with `nonce` (draw a fresh random one for every write whose version is a
/// content hash; any value otherwise).
///
/// # Examples
/// ```
/// use storage_lock_core::storage::encoding::{decode_record, encode_record};
/// use storage_lock_core::{LockRecord, OwnerId, Timestamp};
/// let record = LockRecord {
///     owner: OwnerId::from_u128(7),
///     count: 1,
///     fencing: 42,
///     acquired_at: Timestamp::from_millis(1_000),
///     expires_at: Timestamp::from_millis(31_000),
///     holder: None,
/// };
/// let bytes = encode_record(&record, 1);
/// assert_ne!(bytes, encode_record(&record, 2));
/// assert_eq!(decode_record("deploy", &bytes)?, record);
/// # Ok::<(), storage_lock_core::StorageError>(())
/// ```
pub fn encode_record(record: &LockRecord, nonce: u64) -> Vec<u8> {
    encode(record, None, nonce)
}

/// Encodes `record` as `sl2`, with `left`, the lease left at the write (see the module docs).
///
/// # Examples
/// ```
/// use std::time::Duration;
/// use storage_lock_core::storage::encoding::{decode_observed, encode_observed};
/// use storage_lock_core::{LockRecord, OwnerId, Timestamp};
/// let record = LockRecord {
///     owner: OwnerId::from_u128(7),
///     count: 1,
///     fencing: 42,
///     acquired_at: Timestamp::from_millis(1_000),
///     expires_at: Timestamp::from_millis(31_000),
///     holder: None,
/// };
/// let bytes = encode_observed(&record, Duration::from_secs(20), 1);
/// assert_eq!(decode_observed("deploy", &bytes)?, (record, Duration::from_secs(20)));
/// # Ok::<(), storage_lock_core::StorageError>(())
/// ```
pub fn encode_observed(record: &LockRecord, left: Duration, nonce: u64) -> Vec<u8> {
    encode(record, Some(left), nonce)
}

fn encode(record: &LockRecord, left: Option<Duration>, nonce: u64) -> Vec<u8> {
    let mut out = String::with_capacity(96);
    // Writing to a String cannot fail.
    let _ = write!(
        out,
        "{} {:032x} {} {} {} {}",
        if left.is_some() { OBSERVED } else { MAGIC },
        record.owner.as_u128(),
        record.count,
        record.fencing,
        record.acquired_at.as_millis(),
        record.expires_at.as_millis(),
    );
    if let Some(left) = left {
        let _ = write!(out, " {}", left.as_millis());
    }
    let _ = write!(out, " {nonce:016x}");
    if let Some(h) = &record.holder {
        let _ = write!(out, " h {} {}:{}", h.pid, h.host.len(), h.host);
        if let Some(note) = &h.note {
            let _ = write!(out, " n {}:{note}", note.len());
        }
    }
    out.into_bytes()
}

/// Decodes what [`encode_record`] or [`encode_observed`] wrote under `key` (the lease left, if
/// any, is dropped).
///
/// # Errors
/// [`StorageError::Corrupt`] (naming `key` and what is wrong) for anything else; never panics.
pub fn decode_record(key: &str, bytes: &[u8]) -> Result<LockRecord, StorageError> {
    decode_observed(key, bytes).map(|(record, _)| record)
}

/// Decodes what [`encode_observed`] (or [`encode_record`]) wrote under `key`, with the lease
/// left at the write (for `sl1`: `expires_at − acquired_at`, an upper bound).
///
/// # Errors
/// As [`decode_record`].
pub fn decode_observed(key: &str, bytes: &[u8]) -> Result<(LockRecord, Duration), StorageError> {
    let corrupt = |reason: &str| StorageError::Corrupt {
        key: key.to_owned(),
        reason: format!("not a storage-lock record: {reason}"),
    };
    let text = std::str::from_utf8(bytes).map_err(|_| corrupt("not UTF-8"))?;
    let mut cur = Cursor(text);
    let observed = match cur.word() {
        Some(MAGIC) => false,
        Some(OBSERVED) => true,
        _ => return Err(corrupt("unknown format")),
    };
    let owner = cur
        .word()
        .and_then(|w| w.parse::<OwnerId>().ok())
        .ok_or_else(|| corrupt("bad owner"))?;
    let count = cur.number::<u32>().ok_or_else(|| corrupt("bad count"))?;
    let fencing = cur
        .number::<u64>()
        .ok_or_else(|| corrupt("bad fencing token"))?;
    let acquired_at = cur
        .number::<u64>()
        .ok_or_else(|| corrupt("bad acquired_at"))?;
    let expires_at = cur
        .number::<u64>()
        .ok_or_else(|| corrupt("bad expires_at"))?;
    let left = if observed {
        Duration::from_millis(
            cur.number::<u64>()
                .ok_or_else(|| corrupt("bad lease left"))?,
        )
    } else {
        Duration::from_millis(expires_at.saturating_sub(acquired_at))
    };
    cur.word()
        .filter(|w| w.len() == 16 && u64::from_str_radix(w, 16).is_ok())
        .ok_or_else(|| corrupt("bad nonce"))?;
    let holder = match cur.word() {
        None => None,
        Some("h") => {
            let pid = cur.number::<u32>().ok_or_else(|| corrupt("bad pid"))?;
            let host = cur.sized().ok_or_else(|| corrupt("bad host"))?.to_owned();
            let note = match cur.word() {
                None => None,
                Some("n") => Some(cur.sized().ok_or_else(|| corrupt("bad note"))?.to_owned()),
                Some(_) => return Err(corrupt("unexpected field after the host")),
            };
            Some(Arc::new(HolderInfo { host, pid, note }))
        }
        Some(_) => return Err(corrupt("unexpected field after the nonce")),
    };
    if !cur.0.is_empty() {
        return Err(corrupt("trailing bytes"));
    }
    let record = LockRecord {
        owner,
        count,
        fencing,
        acquired_at: Timestamp::from_millis(acquired_at),
        expires_at: Timestamp::from_millis(expires_at),
        holder,
    };
    Ok((record, left))
}

struct Cursor<'a>(&'a str);

impl<'a> Cursor<'a> {
    /// The next space-separated word (the leading space is consumed); `None` at the end only.
    fn word(&mut self) -> Option<&'a str> {
        if self.0.is_empty() {
            return None;
        }
        let rest = self.0.strip_prefix(' ').unwrap_or(self.0);
        let end = rest.find(' ').unwrap_or(rest.len());
        let (w, tail) = rest.split_at(end);
        self.0 = tail;
        Some(w)
    }

    fn number<T: std::str::FromStr>(&mut self) -> Option<T> {
        self.word()
            .filter(|w| w.bytes().all(|b| b.is_ascii_digit()))?
            .parse()
            .ok()
    }

    /// `<len>:<len bytes>` after a space.
    fn sized(&mut self) -> Option<&'a str> {
        let rest = self.0.strip_prefix(' ')?;
        let (len, tail) = rest.split_once(':')?;
        if len.is_empty() || !len.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let len: usize = len.parse().ok()?;
        let value = tail.get(..len)?;
        self.0 = &tail[len..];
        Some(value)
    }
}

/// `key` in the alphabet `[A-Za-z0-9_-]` plus `=XX` escapes (each other byte as `=` and two
/// upper-case hex digits): a valid NATS KV key token and S3/GCS/Azure object name for every
/// lock name. Escaping is per byte, so it keeps prefixes: `a` is a prefix of `b` exactly when
/// `escape_key(a)` is a prefix of `escape_key(b)`.
///
/// # Examples
/// ```
/// use storage_lock_core::storage::encoding::{escape_key, unescape_key};
/// assert_eq!(escape_key("deploy/prod.eu"), "deploy=2Fprod=2Eeu");
/// assert_eq!(unescape_key("deploy=2Fprod=2Eeu").as_deref(), Some("deploy/prod.eu"));
/// ```
pub fn escape_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "={b:02X}");
        }
    }
    out
}

/// The key [`escape_key`] made `escaped` from; `None` if `escaped` is not exactly such an output
/// (`=41` is not: `escape_key` writes `A` for it), so no two stored names map to one key.
pub fn unescape_key(escaped: &str) -> Option<String> {
    let mut bytes = Vec::with_capacity(escaped.len());
    let mut it = escaped.bytes();
    while let Some(b) = it.next() {
        match b {
            b'=' => {
                let hex = [it.next()?, it.next()?];
                let hex = std::str::from_utf8(&hex).ok()?;
                if hex.bytes().any(|c| c.is_ascii_lowercase()) {
                    return None;
                }
                bytes.push(u8::from_str_radix(hex, 16).ok()?);
            }
            b if b.is_ascii_alphanumeric() || b == b'_' || b == b'-' => bytes.push(b),
            _ => return None,
        }
    }
    let key = String::from_utf8(bytes).ok()?;
    (escape_key(&key) == escaped).then_some(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(holder: Option<HolderInfo>) -> LockRecord {
        LockRecord {
            owner: OwnerId::from_u128(u128::MAX - 5),
            count: 3,
            fencing: u64::MAX,
            acquired_at: Timestamp::from_millis(1),
            expires_at: Timestamp::MAX,
            holder: holder.map(Arc::new),
        }
    }

    #[test]
    fn records_round_trip_with_awkward_holders() {
        for holder in [
            None,
            Some(HolderInfo {
                host: String::new(),
                pid: 0,
                note: None,
            }),
            Some(HolderInfo {
                host: "a b:c".into(),
                pid: u32::MAX,
                note: Some(" n 3:x\nnext ünïcode ".into()),
            }),
            Some(HolderInfo {
                host: "h".into(),
                pid: 1,
                note: Some(String::new()),
            }),
        ] {
            let r = record(holder);
            assert_eq!(decode_record("k", &encode_record(&r, 9)).unwrap(), r);
        }
    }

    #[test]
    fn garbage_is_corrupt_not_a_panic() {
        let good = encode_record(
            &record(Some(HolderInfo {
                host: "host".into(),
                pid: 4,
                note: Some("note".into()),
            })),
            1,
        );
        // Every truncation (only a cut before the optional holder or note parses) and a few
        // mutations of a good record.
        for end in 0..good.len() {
            if decode_record("k", &good[..end]).is_ok() {
                assert!(good[end..].starts_with(b" h ") || good[end..].starts_with(b" n "));
            }
        }
        for bad in [
            &b"\xff\xfe"[..],
            b"sl2 x",
            b"sl1 00 1 1 1 1 0000000000000000",
            b"sl1 0000000000000000000000000000000a -1 1 1 1 0000000000000000",
            b"sl1 0000000000000000000000000000000a 1 1 1 1 0000000000000000 h 1 99:x",
            b"sl1 0000000000000000000000000000000a 1 1 1 1 0000000000000000 z",
            b"sl1 0000000000000000000000000000000a 1 1 1 1 0000000000000000 h 1 1:x n 1:yy",
        ] {
            let err = decode_record("k", bad).unwrap_err();
            assert!(matches!(err, StorageError::Corrupt { .. }), "{err}");
        }
    }

    #[test]
    fn keys_escape_to_a_safe_alphabet_and_back() {
        for key in [
            "a",
            "deploy/prod",
            "x.y z",
            "=3D",
            "ünï",
            "\u{1f}storage-lock:fencing-floor",
            "..",
        ] {
            let e = escape_key(key);
            assert!(
                e.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'='),
                "{e}"
            );
            assert_eq!(unescape_key(&e).as_deref(), Some(key));
        }
        assert!(escape_key("ab/c").starts_with(&escape_key("ab/")));
        for bad in ["=", "=4", "=zz", "=4a", "a.b", "=FF", "=41", "=5F"] {
            assert_eq!(unescape_key(bad), None, "{bad}");
        }
    }
}
