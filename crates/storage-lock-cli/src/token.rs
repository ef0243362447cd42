//! Lease tokens: what `acquire` prints and `renew` / `release` take back.
//!
//! Format: `v2.<owner>.<fencing>.<lease-ms>.<name-hex>` — `owner` is the 32 hex digits of the
//! hold's random 128-bit owner id, `fencing` the decimal fencing token, `lease-ms` the lease
//! the hold was acquired with in decimal milliseconds (what `renew` extends by when `--lease`
//! is not given), `name-hex` the lock name's UTF-8 bytes in hex (so any name survives shells
//! and the `.` separator).
//!
//! Tokens of the first format, `v1.<owner>.<fencing>.<name-hex>`, are still accepted; they
//! carry no lease, so `renew` without `--lease` extends them by the old default, 30 s.
//!
//! **The owner id is a secret**: whoever has the token can renew and release the hold. Keep it
//! out of logs; `list` and `inspect` never show more than its first 8 hex digits.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use storage_lock::backend::OwnerId;

/// The version tag of the tokens `acquire` prints.
const VERSION: &str = "v2";
/// The version tag of the first format (no lease).
const VERSION_1: &str = "v1";
/// What `renew` extends a `v1` token by when `--lease` is not given (the old default).
pub const V1_DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// A parsed lease token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseToken {
    /// The lock name.
    pub name: String,
    /// The hold's owner id (the secret).
    pub owner: OwnerId,
    /// The hold's fencing token.
    pub fencing: u64,
    /// The lease the hold was acquired with (`None` for `v1` tokens).
    pub lease: Option<Duration>,
}

impl LeaseToken {
    /// What `renew` extends the hold by when no `--lease` is given.
    pub fn default_lease(&self) -> Duration {
        self.lease.unwrap_or(V1_DEFAULT_LEASE)
    }
}

impl fmt::Display for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.lease {
            Some(lease) => write!(
                f,
                "{VERSION}.{}.{}.{}.",
                self.owner,
                self.fencing,
                lease.as_millis()
            )?,
            None => write!(f, "{VERSION_1}.{}.{}.", self.owner, self.fencing)?,
        }
        self.name.bytes().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl FromStr for LeaseToken {
    type Err = String;

    /// Parses a token; the error says which part is wrong (never echoing the secret).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let parts: Vec<&str> = s.trim().split('.').collect();
        let (owner, fencing, lease, name) = match parts.as_slice() {
            [VERSION, owner, fencing, lease, name] => (owner, fencing, Some(lease), name),
            [VERSION_1, owner, fencing, name] => (owner, fencing, None, name),
            [version, ..] if *version != VERSION && *version != VERSION_1 => {
                return Err(format!(
                    "unsupported lease token version {:?} (expected {VERSION} or {VERSION_1})",
                    crate::output::shorten(version, 10)
                ));
            }
            _ => {
                return Err(
                    "malformed lease token: expected v2.OWNER.FENCING.LEASE.NAME (or \
                     v1.OWNER.FENCING.NAME)"
                        .into(),
                );
            }
        };
        let owner = owner
            .parse::<OwnerId>()
            .map_err(|_| "malformed lease token: the owner part is not 32 hex digits".to_owned())?;
        let fencing = fencing
            .parse::<u64>()
            .map_err(|_| "malformed lease token: the fencing part is not a number".to_owned())?;
        let lease = lease
            .map(|ms| {
                ms.parse::<u128>()
                    .ok()
                    .filter(|&ms| ms > 0)
                    .and_then(millis)
                    .ok_or_else(|| {
                        "malformed lease token: the lease part is not a number".to_owned()
                    })
            })
            .transpose()?;
        let name = decode_hex(name)
            .and_then(|bytes| String::from_utf8(bytes).ok())
            .ok_or_else(|| "malformed lease token: the name part is not hex UTF-8".to_owned())?;
        Ok(Self {
            name,
            owner,
            fencing,
            lease,
        })
    }
}

/// `ms` milliseconds, if a `Duration` can hold it.
fn millis(ms: u128) -> Option<Duration> {
    let secs = u64::try_from(ms / 1000).ok()?;
    let sub = u32::try_from(ms % 1000).ok()?;
    Some(Duration::new(secs, sub * 1_000_000))
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_any_name() {
        for name in ["job", "a.b.c", "nightly report ü", "x/y:z"] {
            for lease in [
                Some(Duration::from_secs(600)),
                Some(Duration::from_millis(10)),
                Some(Duration::from_secs(86_400 * 1_000_000_000)),
                None,
            ] {
                let token = LeaseToken {
                    name: name.into(),
                    owner: OwnerId::random(),
                    fencing: 42,
                    lease,
                };
                let text = token.to_string();
                assert!(text.starts_with(if lease.is_some() { "v2." } else { "v1." }));
                assert_eq!(text.parse::<LeaseToken>(), Ok(token));
            }
        }
    }

    #[test]
    fn v1_tokens_still_parse_with_the_old_default_lease() {
        let token: LeaseToken = "v1.0000000000000000000000000000002a.7.6a6f62"
            .parse()
            .unwrap();
        assert_eq!(
            (token.name.as_str(), token.fencing, token.lease),
            ("job", 7, None)
        );
        assert_eq!(token.default_lease(), Duration::from_secs(30));
        let token: LeaseToken = "v2.0000000000000000000000000000002a.7.600000.6a6f62"
            .parse()
            .unwrap();
        assert_eq!(token.default_lease(), Duration::from_secs(600));
    }

    #[test]
    fn rejects_malformed_tokens() {
        for bad in [
            "",
            "v1",
            "v2.00000000000000000000000000000000.1.6a",
            "v1.xyz.1.6a",
            "v1.00000000000000000000000000000000.x.6a",
            "v1.00000000000000000000000000000000.1.6",
            "v1.00000000000000000000000000000000.1.zz",
            "v1.00000000000000000000000000000000.1.6a.extra",
            "v1.+0000000000000000000000000000000.1.6a",
            "v2.00000000000000000000000000000000.1.6a",
            "v2.00000000000000000000000000000000.1.0.6a",
            "v2.00000000000000000000000000000000.1.x.6a",
            "v2.00000000000000000000000000000000.1.99999999999999999999999999.6a",
            "v2.00000000000000000000000000000000.1.1000.6a.extra",
        ] {
            assert!(bad.parse::<LeaseToken>().is_err(), "{bad:?}");
        }
    }
}
