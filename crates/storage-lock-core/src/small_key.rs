//! [`SmallKey`]: a lock key kept inline when it is short, so that a held lock's handle and the
//! memory table's entry need no allocation of their own for it.

use std::fmt;
use std::hash::{BuildHasher, Hasher};

use smol_str::SmolStr;

/// A key: 24 bytes, inline up to 23 bytes ([`SmolStr`]; longer keys are shared, so a clone is
/// always cheap).
#[derive(Clone)]
pub(crate) struct SmallKey(SmolStr);

impl SmallKey {
    pub(crate) fn new(key: &str) -> Self {
        Self(SmolStr::new(key))
    }

    pub(crate) fn as_str(&self) -> &str {
        self.0.as_str()
    }

    /// Whether this is `key`.
    pub(crate) fn is(&self, key: &str) -> bool {
        self.as_str() == key
    }

    /// The hash of `key` under `state`, the same for a `SmallKey` and its `&str`.
    pub(crate) fn hash_str(state: &impl BuildHasher, key: &str) -> u64 {
        // One write of the bytes (no length prefix: a table compares keys anyway), half the
        // SipHash work of `hash_one(key)`.
        let mut h = state.build_hasher();
        h.write(key.as_bytes());
        h.finish()
    }

    pub(crate) fn hash_with(&self, state: &impl BuildHasher) -> u64 {
        Self::hash_str(state, self.as_str())
    }
}

/// A string type, as `String` is: `&SmallKey` works where a `&str` is wanted.
impl std::ops::Deref for SmallKey {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl fmt::Debug for SmallKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for SmallKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::SmallKey;

    #[test]
    fn keys_round_trip_inline_and_shared() {
        assert_eq!(std::mem::size_of::<SmallKey>(), 24);
        for key in [
            "",
            "a",
            "held-0000001",
            "ü-23-bytes-exactly-xyz",
            "x".repeat(24).as_str(),
        ] {
            let k = SmallKey::new(key);
            assert_eq!(k.as_str(), key);
            assert!(k.is(key));
            assert_eq!(k.0.is_heap_allocated(), key.len() > 23, "{key:?}");
            let state = std::collections::hash_map::RandomState::new();
            assert_eq!(k.hash_with(&state), SmallKey::hash_str(&state, key));
        }
    }
}
