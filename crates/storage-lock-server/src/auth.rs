//! Bearer tokens with per-prefix permissions, loaded from a TOML file.
//!
//! ```toml
//! # Who may do what. Tokens are stored as hex SHA-256 hashes, never in clear
//! # (`storage-lock token` prints a fresh token and its entry).
//! [[token]]
//! name = "deployer"                     # shown in logs and the audit line of admin actions
//! sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
//! grants = [
//!   { prefix = "deploy/", allow = "lock" },   # acquire / renew / release under deploy/
//!   { prefix = "", allow = "read" },          # list and read every lock
//! ]
//! ```
//!
//! Permissions are cumulative: `read` (list, get) ⊂ `lock` (acquire, renew, release) ⊂
//! `admin` (force-release). A request needs a grant whose prefix starts the lock name (byte-wise)
//! at the needed level. Presented tokens are hashed and compared with every entry in constant
//! time. Without a valid token: 401; with a token that lacks the grant: 403. Either way nothing
//! changes.

use std::path::Path;
use std::sync::{Arc, RwLock};

use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// What a grant allows; each level includes the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Permission {
    /// List locks and read their records.
    Read,
    /// Acquire, renew and release locks (and read).
    Lock,
    /// Force-release locks held by others (and everything else).
    Admin,
}

impl Permission {
    /// The lowercase name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Lock => "lock",
            Self::Admin => "admin",
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileGrant {
    prefix: String,
    allow: Permission,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileToken {
    name: String,
    sha256: String,
    #[serde(default)]
    grants: Vec<FileGrant>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    token: Vec<FileToken>,
}

#[derive(Debug)]
struct Entry {
    name: String,
    hash: [u8; 32],
    grants: Vec<(String, Permission)>,
}

/// The server's tokens (see the module docs for the file format).
#[derive(Debug, Default)]
pub struct Auth {
    entries: Vec<Arc<Entry>>,
}

/// The tokens a running server checks, replaceable while it serves ([`AuthHandle::replace`]:
/// `storage-lock serve` re-reads its auth file on SIGHUP and when the file changes). A request
/// is judged by the tokens current when it arrived; a replaced token stops working for the
/// next request.
#[derive(Debug, Clone)]
pub struct AuthHandle(Arc<RwLock<Arc<Auth>>>);

impl AuthHandle {
    pub(crate) fn new(auth: Auth) -> Self {
        Self(Arc::new(RwLock::new(Arc::new(auth))))
    }

    /// The tokens in force.
    pub fn current(&self) -> Arc<Auth> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Puts `auth` in force for every request from now on.
    pub fn replace(&self, auth: Auth) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(auth);
    }
}

/// A malformed auth file.
#[derive(Debug, thiserror::Error)]
#[error("auth file {path}: {reason}")]
pub struct AuthFileError {
    path: String,
    reason: String,
}

/// The caller a valid token identifies, with its grants as they were when it was
/// authenticated (a reload does not change a request in flight).
#[derive(Debug, Clone)]
pub struct Principal {
    entry: Arc<Entry>,
}

impl Principal {
    /// The token's name from the auth file.
    pub fn name(&self) -> &str {
        &self.entry.name
    }
}

impl Auth {
    /// Reads and checks an auth file.
    ///
    /// # Errors
    /// The file cannot be read, is not valid TOML of the documented shape, or holds a hash that
    /// is not 64 hex digits or a duplicate one.
    pub fn from_file(path: &Path) -> Result<Self, AuthFileError> {
        let err = |reason: String| AuthFileError {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
        Self::from_toml(&text).map_err(err)
    }

    /// Parses the TOML text of an auth file.
    ///
    /// # Errors
    /// As [`Auth::from_file`], as a message.
    ///
    /// # Examples
    /// ```
    /// use storage_lock_server::{Auth, Permission, hash_token};
    /// let toml = format!(
    ///     "[[token]]\nname = \"ci\"\nsha256 = \"{}\"\ngrants = [{{ prefix = \"ci/\", allow = \"lock\" }}]\n",
    ///     hash_token("s3cret"),
    /// );
    /// let auth = Auth::from_toml(&toml).unwrap();
    /// let ci = auth.authenticate("s3cret").expect("a known token");
    /// assert!(auth.allows(&ci, "ci/build", Permission::Lock));
    /// assert!(!auth.allows(&ci, "prod/deploy", Permission::Read));
    /// assert!(auth.authenticate("guess").is_none());
    /// ```
    pub fn from_toml(text: &str) -> Result<Self, String> {
        let file: File = toml::from_str(text).map_err(|e| e.message().to_owned())?;
        let mut entries: Vec<Arc<Entry>> = Vec::with_capacity(file.token.len());
        for t in file.token {
            let hash = parse_hash(&t.sha256)
                .ok_or_else(|| format!("token {:?}: sha256 must be 64 hex digits", t.name))?;
            if entries.iter().any(|e| e.hash == hash) {
                return Err(format!("token {:?}: the same hash appears twice", t.name));
            }
            entries.push(Arc::new(Entry {
                name: t.name,
                hash,
                grants: t.grants.into_iter().map(|g| (g.prefix, g.allow)).collect(),
            }));
        }
        Ok(Self { entries })
    }

    /// The principal `token` identifies, if any (compared in constant time with every entry).
    pub fn authenticate(&self, token: &str) -> Option<Principal> {
        let presented: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        for (i, e) in self.entries.iter().enumerate() {
            if bool::from(e.hash.ct_eq(&presented)) {
                found = Some(i);
            }
        }
        found.map(|index| Principal {
            entry: self.entries[index].clone(),
        })
    }

    /// Whether `who` may do `needed` on the lock `name` (by the grants `who` was
    /// authenticated with).
    pub fn allows(&self, who: &Principal, name: &str, needed: Permission) -> bool {
        who.entry
            .grants
            .iter()
            .any(|(prefix, level)| *level >= needed && name.starts_with(prefix.as_str()))
    }

    /// The number of tokens.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there is no token (every request is refused).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The hex SHA-256 of a bearer token: what an auth file stores.
///
/// # Examples
/// ```
/// assert_eq!(storage_lock_server::hash_token("test").len(), 64);
/// ```
pub fn hash_token(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn parse_hash(hex: &str) -> Option<[u8; 32]> {
    let bytes = hex.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        let s = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth() -> Auth {
        Auth::from_toml(&format!(
            r#"
[[token]]
name = "reader"
sha256 = "{}"
grants = [{{ prefix = "", allow = "read" }}]
[[token]]
name = "ops"
sha256 = "{}"
grants = [{{ prefix = "jobs/", allow = "admin" }}]
"#,
            hash_token("r"),
            hash_token("o")
        ))
        .unwrap()
    }

    #[test]
    fn levels_are_cumulative_and_prefixes_bytewise() {
        let a = auth();
        let r = a.authenticate("r").unwrap();
        let o = a.authenticate("o").unwrap();
        assert!(a.allows(&r, "anything", Permission::Read));
        assert!(!a.allows(&r, "anything", Permission::Lock));
        assert!(a.allows(&o, "jobs/1", Permission::Read));
        assert!(a.allows(&o, "jobs/1", Permission::Admin));
        assert!(!a.allows(&o, "Jobs/1", Permission::Read));
        assert!(!a.allows(&o, "jobs", Permission::Read));
    }

    #[test]
    fn bad_files_are_refused_with_a_reason() {
        assert!(Auth::from_toml("[[token]]\nname='x'\nsha256='zz'\n").is_err());
        assert!(Auth::from_toml("[[token]]\nname='x'\nsha256='00'\nextra=1\n").is_err());
        let h = hash_token("a");
        let dup = format!("[[token]]\nname='x'\nsha256='{h}'\n[[token]]\nname='y'\nsha256='{h}'\n");
        assert!(Auth::from_toml(&dup).unwrap_err().contains("twice"));
        let bad_level =
            format!("[[token]]\nname='x'\nsha256='{h}'\ngrants=[{{prefix='', allow='root'}}]\n");
        assert!(Auth::from_toml(&bad_level).is_err());
    }
}
