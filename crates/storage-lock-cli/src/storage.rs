//! Which storage the command talks to: `--storage URL`, `STORAGE_LOCK_URL`, or the embedded
//! default.
//!
//! The default is a SQLite file at `$XDG_STATE_HOME/storage-lock/locks.db` (an absolute
//! `XDG_STATE_HOME` only, as the XDG spec demands), else `$HOME/.local/state/storage-lock/locks.db`.
//! The file and its directory are created on first use, so two shells of one user on one host
//! exclude each other with nothing installed. Other users have other files: share a lock between
//! users by passing the same `--storage sqlite://PATH` (a file all of them can write).
//!
//! **The default file differs per user and per environment**: cron, systemd units and CI jobs
//! often run with another `HOME` (or `XDG_STATE_HOME`) than your interactive shell, and then
//! they lock a different file — they do not exclude each other. `-v` prints the storage in use
//! (for SQLite, the resolved absolute path); pass `--storage` explicitly wherever two
//! environments must share a lock.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use storage_lock::backend::{Capabilities, Durability, HolderInfo, Storage};
use storage_lock::{SqliteStorage, StorageLock};

use crate::exit::{self, Failure};

static VERBOSE: AtomicBool = AtomicBool::new(false);

/// With `-v` (and not `-q`), [`open`] prints the storage in use on stderr.
pub fn set_verbose(on: bool) {
    VERBOSE.store(on, Ordering::Relaxed);
}

/// An opened storage and the lock engine over it.
pub struct Opened {
    /// The storage, for listing and inspecting.
    pub storage: Arc<dyn Storage>,
    /// The engine, for acquiring, renewing and releasing.
    pub locks: StorageLock,
    /// The storage as shown to people: the URL without its password, a SQLite path resolved
    /// to an absolute one (a relative `sqlite://` path depends on the working directory).
    pub shown: String,
    /// The URL accepts a storage whose durability cannot be verified (`durability=unverified`,
    /// or `durability=volatile`, which accepts more): see [`accepts_unverified`].
    pub unverified_accepted: bool,
}

/// Opens the storage `url` names, or the default when `url` is `None`; holds are recorded with
/// `holder` (host, pid, and no note: notes come with each acquisition). Unless `quiet`, warns
/// on stderr when the storage is process-local (`memory:`): it excludes nothing across
/// processes; and when its durability is unverified (see [`accepts_unverified`]): a storage
/// that forgets acknowledged writes on a restart grants a held lock twice, and nothing else
/// would tell the user (the backend's own warning shows only with `-v`).
///
/// Errors: unknown scheme or malformed URL → usage; cannot open / not fit for locking → storage.
pub async fn open(url: Option<&str>, holder: HolderInfo, quiet: bool) -> Result<Opened, Failure> {
    let shown;
    let storage = match url {
        Some(url) => {
            check_url(url)?;
            check_sqlite_dir(url)?;
            shown = describe_url(url);
            if VERBOSE.load(Ordering::Relaxed) {
                eprintln!("storage-lock: storage: {shown}");
            }
            storage_lock::connect_storage(url)
                .await
                .map_err(|e| Failure::connect(&e))?
        }
        None => {
            let path = default_path()?;
            shown = format!("sqlite://{}", path.display());
            if VERBOSE.load(Ordering::Relaxed) {
                eprintln!(
                    "storage-lock: storage: sqlite://{} (the default for this user: \
                     $XDG_STATE_HOME or $HOME decide it; pass --storage to share a lock \
                     across users and environments)",
                    path.display()
                );
            }
            let storage = SqliteStorage::open(&path)
                .await
                .map_err(|e| Failure::storage("cannot open the default storage", &e))?;
            Arc::new(storage) as Arc<dyn Storage>
        }
    };
    tracing::debug!(storage = storage.name(), "storage opened");
    let caps = storage.capabilities();
    if !quiet && caps.process_local {
        eprintln!(
            "storage-lock: warning: storage {:?} is process-local; it excludes nothing across processes",
            storage.name()
        );
    }
    let unverified_accepted = url.is_some_and(accepts_unverified);
    if !quiet && caps.durability == Durability::Unverified && !unverified_accepted {
        eprintln!("storage-lock: warning: {}", unverified_warning(&caps));
    }
    let locks = StorageLock::builder_arc(storage.clone())
        .holder(holder)
        .build()
        .map_err(|e| Failure::lock("cannot use the storage", &e))?;
    Ok(Opened {
        storage,
        locks,
        shown,
        unverified_accepted,
    })
}

/// Whether `url` says that its operator made sure of what the backend could not verify:
/// `durability=unverified` in its query (or `durability=volatile`, which accepts a storage
/// known to forget writes, so an unverified one too). Without it, a storage of
/// [`Durability::Unverified`] gets a warning on every command and fails `check` (exit 78).
pub fn accepts_unverified(url: &str) -> bool {
    url.split_once('?').is_some_and(|(_, query)| {
        query
            .split(['&', '#'])
            .any(|p| p == "durability=unverified" || p == "durability=volatile")
    })
}

/// Why a storage of [`Durability::Unverified`] is unverified: its backend's note, or a
/// generic reason for a backend that gives none.
pub fn unverified_reason(caps: &Capabilities) -> &'static str {
    caps.durability_note
        .unwrap_or("the backend could not read the settings that decide it")
}

/// The one-line warning (and `check`'s reason) for a storage of [`Durability::Unverified`].
pub fn unverified_warning(caps: &Capabilities) -> String {
    format!(
        "durability unverified: {}; a storage that forgets acknowledged writes on a restart \
         grants a held lock twice and repeats fencing tokens. Once you made sure, say so with \
         durability=unverified in the URL",
        unverified_reason(caps)
    )
}

/// The default SQLite file (see the module docs).
pub fn default_path() -> Result<PathBuf, Failure> {
    let state = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| {
            std::env::var_os("HOME")
                .map(PathBuf::from)
                .filter(|p| p.is_absolute())
                .map(|home| home.join(".local").join("state"))
        })
        .ok_or_else(|| {
            Failure::usage(format!(
                "no storage: pass --storage URL (schemes: {}) or set STORAGE_LOCK_URL, \
                 or set HOME for the default SQLite file",
                known_schemes()
            ))
        })?;
    Ok(state.join("storage-lock").join("locks.db"))
}

/// The URL schemes this build knows, for messages.
pub fn known_schemes() -> String {
    storage_lock::schemes().collect::<Vec<_>>().join(", ")
}

/// The network schemes whose URLs have an authority (`//[user[:password]@]host[:port]`).
const NETWORK_SCHEMES: &[&str] = &[
    "postgres",
    "postgresql",
    "mysql",
    "mariadb",
    "redis",
    "rediss",
    "http",
    "https",
];

/// Rejects malformed network URLs as usage errors before a driver sees them (a driver reports
/// them as storage errors): a missing `//`, a port that is not a number from 1 to 65535, a Redis
/// database that is not a number.
pub fn check_url(url: &str) -> Result<(), Failure> {
    let Some((scheme, rest)) = url.split_once(':') else {
        return Ok(()); // the facade reports it
    };
    if !NETWORK_SCHEMES
        .iter()
        .any(|s| s.eq_ignore_ascii_case(scheme))
    {
        return Ok(());
    }
    let shown = describe_url(url);
    let Some(rest) = rest.strip_prefix("//") else {
        return Err(Failure::usage(format!(
            "invalid storage URL {shown:?}: expected {scheme}://[USER[:PASSWORD]@]HOST[:PORT]/…"
        )));
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    let port = match host_port.strip_prefix('[') {
        // [IPv6]:port
        Some(v6) => match v6.split_once(']') {
            Some((_, after)) => after.strip_prefix(':'),
            None => {
                return Err(Failure::usage(format!(
                    "invalid storage URL {shown:?}: unclosed [ in the host"
                )));
            }
        },
        None => host_port.split_once(':').map(|(_, p)| p),
    };
    if scheme.to_ascii_lowercase().starts_with("redis") {
        let db = rest[authority.len()..]
            .split(['?', '#'])
            .next()
            .unwrap_or("")
            .trim_start_matches('/');
        if !db.is_empty() && db.parse::<u32>().is_err() {
            return Err(Failure::usage(format!(
                "invalid storage URL {shown:?}: the database {db:?} is not a number"
            )));
        }
    }
    if let Some(port) = port
        && !port.is_empty()
        && port.parse::<u16>().ok().is_none_or(|p| p == 0)
    {
        return Err(Failure::usage(format!(
            "invalid storage URL {shown:?}: the port {port:?} is not a number from 1 to 65535"
        )));
    }
    Ok(())
}

/// `url` without its password (`postgres://u:***@h/db`), for messages; SQLite paths resolved
/// to absolute ones.
pub fn describe_url(url: &str) -> String {
    if let Some(path) = url.strip_prefix("sqlite://") {
        let (path, query) = path.split_once('?').map_or((path, ""), |(p, q)| (p, q));
        let abs = std::path::absolute(path).unwrap_or_else(|_| PathBuf::from(path));
        let query = if query.is_empty() {
            String::new()
        } else {
            format!("?{query}")
        };
        return format!("sqlite://{}{query}", abs.display());
    }
    storage_lock::backend::redact_url(url)
}

/// An explicit `sqlite://` URL whose directory does not exist is refused (exit 69): a typo in
/// it would otherwise create a fresh directory and a fresh lock file that excludes nobody
/// (the library creates missing directories; only the default file's is created here).
fn check_sqlite_dir(url: &str) -> Result<(), Failure> {
    let Some(rest) = url.strip_prefix("sqlite://") else {
        return Ok(());
    };
    // The path as the backend reads it (percent-decoded); a bad encoding is the URL's error,
    // which opening reports.
    let Ok(path) =
        storage_lock::backend::storage::url::percent_decode(rest.split('?').next().unwrap_or(rest))
    else {
        return Ok(());
    };
    let path = std::path::Path::new(&path);
    match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) if !dir.is_dir() => Err(Failure::new(
            exit::STORAGE,
            format!(
                "the directory of {} does not exist (create it first: a mistyped path would \
                 give a lock file that excludes nobody)",
                path.display()
            ),
        )),
        _ => Ok(()),
    }
}

/// Whether `storage` shows who owns a record (a lock server keeps owners secret).
pub fn shows_owners(storage: &dyn Storage) -> bool {
    !storage.capabilities().owners_hidden
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_network_urls_are_usage_errors() {
        for bad in [
            "postgres://u@h:port/db",
            "postgres://u@h:99999/db",
            "mysql://root@127.0.0.1:0/test",
            "redis:127.0.0.1:6379",
            "postgres://u@[::1/db",
            "redis://127.0.0.1:6379/abc",
        ] {
            assert_eq!(
                check_url(bad).unwrap_err().code,
                crate::exit::USAGE,
                "{bad}"
            );
        }
        for good in [
            "postgres://u:p@h:5432/db",
            "postgres:///db?host=/run/postgresql",
            "postgres://u@[::1]:5432/db",
            "redis://127.0.0.1/",
            "redis://127.0.0.1:6379/3?prefix=x",
            "sqlite:///tmp/x.db",
            "memory:",
        ] {
            assert!(check_url(good).is_ok(), "{good}");
        }
    }

    #[test]
    fn only_the_query_accepts_unverified_durability() {
        assert!(accepts_unverified(
            "nats://h:4222?bucket=b&durability=unverified"
        ));
        assert!(accepts_unverified("redis://h/?durability=volatile"));
        assert!(!accepts_unverified("redis://h/?durability=durable"));
        assert!(!accepts_unverified("redis://h/"));
        assert!(!accepts_unverified(
            "sqlite:///tmp/durability=unverified.db"
        ));
    }

    #[test]
    fn passwords_are_hidden() {
        assert_eq!(
            describe_url("postgres://u:secret@h:5432/db?x=1"),
            "postgres://u:***@h:5432/db?x=1"
        );
        assert_eq!(describe_url("redis://:pw@h/"), "redis://:***@h/");
        assert!(describe_url("sqlite://rel.db").starts_with("sqlite:///"));
    }
}
