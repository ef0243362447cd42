//! Lease tokens: what `acquire` prints and `renew` / `release` take back.
//!
//! Format: `v1.<owner>.<fencing>.<name-hex>` — `owner` is the 32 hex digits of the hold's
//! random 128-bit owner id, `fencing` the decimal fencing token, `name-hex` the lock name's
//! UTF-8 bytes in hex (so any name survives shells and the `.` separator).
//!
//! **The owner id is a secret**: whoever has the token can renew and release the hold. Keep it
//! out of logs; `list` and `inspect` never show more than its first 8 hex digits.

use std::fmt;
use std::str::FromStr;

use storage_lock::OwnerId;

/// The version tag every token starts with.
const VERSION: &str = "v1";

/// A parsed lease token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseToken {
    /// The lock name.
    pub name: String,
    /// The hold's owner id (the secret).
    pub owner: OwnerId,
    /// The hold's fencing token.
    pub fencing: u64,
}

impl fmt::Display for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{VERSION}.{}.{}.", self.owner, self.fencing)?;
        self.name.bytes().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl FromStr for LeaseToken {
    type Err = String;

    /// Parses a token; the error says which part is wrong (never echoing the secret).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut parts = s.trim().split('.');
        let (Some(version), Some(owner), Some(fencing), Some(name), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err("malformed lease token: expected v1.OWNER.FENCING.NAME".into());
        };
        if version != VERSION {
            return Err(format!(
                "unsupported lease token version {version:?} (expected {VERSION})"
            ));
        }
        if owner.len() != 32 || !owner.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err("malformed lease token: the owner part is not 32 hex digits".into());
        }
        let owner = owner
            .parse::<OwnerId>()
            .map_err(|_| "malformed lease token: bad owner part".to_owned())?;
        let fencing = fencing
            .parse::<u64>()
            .map_err(|_| "malformed lease token: the fencing part is not a number".to_owned())?;
        let name = decode_hex(name)
            .and_then(|bytes| String::from_utf8(bytes).ok())
            .ok_or_else(|| "malformed lease token: the name part is not hex UTF-8".to_owned())?;
        Ok(Self {
            name,
            owner,
            fencing,
        })
    }
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
            let token = LeaseToken {
                name: name.into(),
                owner: OwnerId::random(),
                fencing: 42,
            };
            let text = token.to_string();
            assert!(text.starts_with("v1."));
            assert_eq!(text.parse::<LeaseToken>(), Ok(token));
        }
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
        ] {
            assert!(bad.parse::<LeaseToken>().is_err(), "{bad:?}");
        }
    }
}
