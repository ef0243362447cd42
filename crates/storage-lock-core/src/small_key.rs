//! [`SmallKey`]: a lock key kept inline when it is short, so that a held lock's handle and the
//! memory table's entry need no allocation of their own for it.

use std::fmt;
use std::hash::{BuildHasher, Hash, Hasher};

/// The longest key kept inline (24 bytes in all, the size of a `String`).
const INLINE: usize = 22;

/// A key: inline up to 22 bytes, boxed beyond. Cheap to clone when inline (a copy).
#[derive(Clone)]
pub(crate) enum SmallKey {
    Inline { len: u8, bytes: [u8; INLINE] },
    Heap(Box<str>),
}

impl SmallKey {
    pub(crate) fn new(key: &str) -> Self {
        match u8::try_from(key.len()) {
            Ok(len) if key.len() <= INLINE => {
                let mut bytes = [0; INLINE];
                bytes[..key.len()].copy_from_slice(key.as_bytes());
                Self::Inline { len, bytes }
            }
            _ => Self::Heap(key.into()),
        }
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        match self {
            Self::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Self::Heap(s) => s.as_bytes(),
        }
    }

    pub(crate) fn as_str(&self) -> &str {
        match self {
            // The bytes are a whole `&str` copied in `new`: always valid UTF-8.
            Self::Inline { .. } => std::str::from_utf8(self.as_bytes()).unwrap_or_default(),
            Self::Heap(s) => s,
        }
    }

    /// Whether this is `key` (compares bytes: no UTF-8 check).
    pub(crate) fn is(&self, key: &str) -> bool {
        self.as_bytes() == key.as_bytes()
    }

    /// The hash of `key` under `state`, the same for a `SmallKey` and its `&str`.
    pub(crate) fn hash_str(state: &impl BuildHasher, key: &str) -> u64 {
        let mut h = state.build_hasher();
        key.as_bytes().hash(&mut h);
        h.finish()
    }

    pub(crate) fn hash_with(&self, state: &impl BuildHasher) -> u64 {
        let mut h = state.build_hasher();
        self.as_bytes().hash(&mut h);
        h.finish()
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
    fn keys_round_trip_inline_and_boxed() {
        assert_eq!(std::mem::size_of::<SmallKey>(), 24);
        for key in [
            "",
            "a",
            "held-0000001",
            "ü-22-bytes-exactly-xy",
            "x".repeat(23).as_str(),
        ] {
            let k = SmallKey::new(key);
            assert_eq!(k.as_str(), key);
            assert!(k.is(key));
            assert_eq!(
                matches!(k, SmallKey::Inline { .. }),
                key.len() <= 22,
                "{key:?}"
            );
            let state = std::collections::hash_map::RandomState::new();
            assert_eq!(k.hash_with(&state), SmallKey::hash_str(&state, key));
        }
    }
}
