use std::borrow::Cow;
use std::fmt;

use super::LockError;

/// The longest lock name (and normalized key) accepted, in bytes.
///
/// 255 bytes fit every backend's key column or key space (a MySQL `VARCHAR(255)` primary key
/// included) with room for a normalizer's prefix within [`validate_key`]'s limit of twice this.
pub const MAX_NAME_LEN: usize = 255;

/// Checks a lock name: not empty, not all whitespace, at most [`MAX_NAME_LEN`] bytes, and no
/// control characters (they are reserved for internal keys). The engine runs it before any
/// storage call.
///
/// # Errors
/// [`LockError::InvalidName`] saying which rule the name breaks.
///
/// # Examples
/// ```
/// use storage_lock_core::contract::validate_name;
/// assert!(validate_name("orders/42").is_ok());
/// assert!(validate_name("   ").is_err());
/// assert!(validate_name("line\nbreak").is_err());
/// ```
pub fn validate_name(name: &str) -> Result<(), LockError> {
    if name.trim().is_empty() {
        return Err(LockError::invalid_name(
            name,
            "must not be empty or whitespace",
        ));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(LockError::invalid_name(
            name,
            "longer than MAX_NAME_LEN (255 bytes)",
        ));
    }
    if has_control(name) {
        return Err(LockError::invalid_name(
            name,
            "must not contain control characters",
        ));
    }
    Ok(())
}

fn has_control(s: &str) -> bool {
    if s.is_ascii() {
        s.bytes().any(|b| b.is_ascii_control())
    } else {
        s.chars().any(char::is_control)
    }
}

/// Checks a key produced by a [`KeyNormalizer`]: not empty, at most `2 * MAX_NAME_LEN` bytes, no
/// control characters.
///
/// # Errors
/// [`LockError::InvalidName`] when the normalizer broke its contract.
///
/// # Examples
/// ```
/// use storage_lock_core::contract::validate_key;
/// assert!(validate_key("tenant-a/orders/42").is_ok());
/// assert!(validate_key("").is_err());
/// ```
pub fn validate_key(key: &str) -> Result<(), LockError> {
    if key.is_empty() || key.len() > 2 * MAX_NAME_LEN || has_control(key) {
        return Err(LockError::invalid_name(
            key,
            "the key normalizer produced an empty, over-long or control-character key",
        ));
    }
    Ok(())
}

/// Maps an application lock name to a storage key.
///
/// **Contract:** pure and deterministic — the same name under the same configuration always
/// yields the same key. Never add nonces or timestamps (two acquisitions of one name would land
/// on different keys and exclude nothing), never map unrelated names to one constant (everything
/// would block everything). Reading configuration (a tenant, a namespace) is fine as long as it
/// is stable for the life of the normalizer.
pub trait KeyNormalizer: fmt::Debug + Send + Sync + 'static {
    /// The key for `name` (already validated by [`validate_name`]); borrow `name` itself when
    /// the key is the name.
    ///
    /// # Examples
    /// ```
    /// use storage_lock_core::{KeyNormalizer, PrefixNormalizer};
    /// let n = PrefixNormalizer::new("tenant-a/");
    /// assert_eq!(n.normalize("orders/42"), "tenant-a/orders/42");
    /// ```
    fn normalize<'a>(&self, name: &'a str) -> Cow<'a, str>;
}

/// The default normalizer: `prefix + name`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrefixNormalizer {
    prefix: String,
}

impl PrefixNormalizer {
    /// A normalizer that prepends `prefix` (keys of several applications sharing one storage
    /// stay apart).
    ///
    /// # Examples
    /// ```
    /// use storage_lock_core::{MemoryStorage, PrefixNormalizer, StorageLock};
    /// let locks = StorageLock::builder(MemoryStorage::new())
    ///     .normalizer(PrefixNormalizer::new("billing/"))
    ///     .build()
    ///     .unwrap();
    /// assert_eq!(locks.key_for("nightly").unwrap(), "billing/nightly");
    /// ```
    pub fn new(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
        }
    }
}

impl KeyNormalizer for PrefixNormalizer {
    fn normalize<'a>(&self, name: &'a str) -> Cow<'a, str> {
        if self.prefix.is_empty() {
            return Cow::Borrowed(name);
        }
        let mut key = String::with_capacity(self.prefix.len() + name.len());
        key.push_str(&self.prefix);
        key.push_str(name);
        Cow::Owned(key)
    }
}
