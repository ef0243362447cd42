//! Which storage the command talks to: `--storage URL`, `STORAGE_LOCK_URL`, or the embedded
//! default.
//!
//! The default is a SQLite file at `$XDG_STATE_HOME/storage-lock/locks.db` (an absolute
//! `XDG_STATE_HOME` only, as the XDG spec demands), else `$HOME/.local/state/storage-lock/locks.db`.
//! The file and its directory are created on first use, so two shells of one user on one host
//! exclude each other with nothing installed. Other users have other files: share a lock between
//! users by passing the same `--storage sqlite://PATH` (a file all of them can write).

use std::path::PathBuf;
use std::sync::Arc;

use storage_lock::{HolderInfo, SqliteStorage, Storage, StorageLock};

use crate::exit::Failure;

/// An opened storage and the lock engine over it.
pub struct Opened {
    /// The storage, for listing and inspecting.
    pub storage: Arc<dyn Storage>,
    /// The engine, for acquiring, renewing and releasing.
    pub locks: StorageLock,
}

/// Opens the storage `url` names, or the default when `url` is `None`; holds are recorded with
/// `holder` (host, pid, and no note: notes come with each acquisition). Unless `quiet`, warns
/// on stderr when the storage is process-local (`memory:`): it excludes nothing across
/// processes.
///
/// Errors: unknown scheme or malformed URL → usage; cannot open / not fit for locking → storage.
pub async fn open(url: Option<&str>, holder: HolderInfo, quiet: bool) -> Result<Opened, Failure> {
    let storage = match url {
        Some(url) => storage_lock::connect_storage(url)
            .await
            .map_err(|e| Failure::connect(&e))?,
        None => {
            let path = default_path()?;
            let storage = SqliteStorage::open(&path)
                .await
                .map_err(|e| Failure::storage("cannot open the default storage", &e))?;
            Arc::new(storage) as Arc<dyn Storage>
        }
    };
    tracing::debug!(storage = storage.name(), "storage opened");
    if !quiet && storage.capabilities().process_local {
        eprintln!(
            "storage-lock: warning: storage {:?} is process-local; it excludes nothing across processes",
            storage.name()
        );
    }
    let locks = StorageLock::builder_arc(storage.clone())
        .holder(holder)
        .build()
        .map_err(|e| Failure::lock("cannot use the storage", &e))?;
    Ok(Opened { storage, locks })
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
