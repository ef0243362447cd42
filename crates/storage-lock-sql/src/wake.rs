//! Cross-process wake-ups for SQLite: a directory next to the database file (`<file>-wake/`)
//! holding one small file per key bucket ([`key_bucket`]).
//!
//! * A release that frees a key writes one byte into its bucket's file (open, one write,
//!   close: a few microseconds, after the commit). Every process that can write the directory
//!   signals, whether or not it can watch.
//! * Each storage that has waiters watches the directory (inotify on Linux, through the
//!   `notify` crate) and wakes the waiters of the bucket a write names; they re-check the
//!   database. Keys sharing a bucket wake each other spuriously, which costs a re-check.
//! * The directory and its files get the database file's permissions (as SQLite gives its
//!   `-wal` and `-shm` files), so every user who can write the database can signal.
//! * Nothing here decides anything: a missed wake-up costs latency, never correctness. Waiters
//!   re-check at least every 2 s anyway (the engine's safety net for storages with
//!   notifications), which is the hand-off latency when a wake-up is missed: a key freed by a
//!   process of an older version (it does not signal), a directory this process cannot write
//!   (logged once as a warning). Releases and force releases (an `update` that frees a key)
//!   signal.
//! * Where the directory cannot be created or watched (no inotify instances left, say), the
//!   storage opens without notifications and its waiters back off as before (1 ms doubling to
//!   100 ms); it still signals for the others if it can.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use storage_lock_core::storage::key_bucket;
use storage_lock_core::{ChangeWait, NotificationSource, Notifications, SourceEvent, StorageError};
use tokio::sync::mpsc;

/// The wake-up directory of one database file, and the watcher of its waiters.
#[derive(Debug)]
pub(crate) struct Wake {
    dir: PathBuf,
    /// Unix permission bits for new files (the database file's).
    mode: Option<u32>,
    /// Set after the first failed signal was logged (at warn level, once).
    warned: AtomicBool,
    /// `None`: this process cannot watch; its waiters back off.
    hub: Option<Notifications<DirSource>>,
}

impl Wake {
    /// The wake-up directory for the database at `db` (created if missing, with the database
    /// file's permissions), or `None` (logged) if it cannot be created.
    pub(crate) fn open(db: &Path) -> Option<Self> {
        let mut name = db.file_name()?.to_owned();
        name.push("-wake");
        let dir = db.with_file_name(name);
        if let Err(e) = std::fs::create_dir_all(&dir) {
            tracing::warn!(dir = %dir.display(), error = %e,
                "no cross-process wake-ups for this SQLite file: waiters back off instead");
            return None;
        }
        let mode = file_mode(db);
        #[cfg(unix)]
        if let Some(mode) = mode {
            use std::os::unix::fs::PermissionsExt;
            // Directories need the search bit wherever the file has the read bit.
            let dir_mode = mode | ((mode & 0o444) >> 2);
            let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(dir_mode));
        }
        let hub = match watch(&dir) {
            Ok(_) => Some(Notifications::new(DirSource { dir: dir.clone() })),
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e,
                    "cannot watch for cross-process wake-ups: waiters here back off instead");
                None
            }
        };
        Some(Self {
            dir,
            mode,
            warned: AtomicBool::new(false),
            hub,
        })
    }

    /// Whether this process's waiters are woken (else they back off).
    pub(crate) fn watches(&self) -> bool {
        self.hub.is_some()
    }

    /// Tells every process watching that `key` may be free now (best effort).
    pub(crate) fn signal(&self, key: &str) {
        let path = self.dir.join(format!("{:02x}", key_bucket(key)));
        if let Err(e) = self.touch(&path)
            && !self.warned.swap(true, Ordering::Relaxed)
        {
            tracing::warn!(file = %path.display(), error = %e,
                "cannot signal a release to other processes: their waiters re-check every 2 s");
        }
    }

    fn touch(&self, path: &Path) -> std::io::Result<()> {
        use std::io::Write;
        let mut options = std::fs::OpenOptions::new();
        options.create(true).truncate(false).write(true);
        #[cfg(unix)]
        if let Some(mode) = self.mode {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(mode);
        }
        let mut file = options.open(path)?;
        #[cfg(unix)]
        if let Some(mode) = self.mode {
            // `mode` above is filtered by the umask; the database file's bits are what count.
            use std::os::unix::fs::PermissionsExt;
            if file.metadata()?.permissions().mode() & 0o777 != mode {
                let _ = file.set_permissions(std::fs::Permissions::from_mode(mode));
            }
        }
        file.write_all(&[1])
    }

    /// A notification for the next wake-up of `key`'s bucket.
    pub(crate) async fn arm(&self, key: &str) -> ChangeWait {
        match &self.hub {
            Some(hub) => hub.arm(key).await,
            None => ChangeWait::unsupported(),
        }
    }
}

/// The permission bits of the database file (Unix only).
fn file_mode(db: &Path) -> Option<u32> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(db)
            .ok()
            .map(|m| m.permissions().mode() & 0o777)
    }
    #[cfg(not(unix))]
    {
        let _ = db;
        None
    }
}

type Events = mpsc::UnboundedReceiver<notify::Result<notify::Event>>;

fn watch(dir: &Path) -> Result<(RecommendedWatcher, Events), String> {
    let (tx, rx) = mpsc::unbounded_channel();
    let mut watcher = notify::recommended_watcher(move |event| {
        let _ = tx.send(event);
    })
    .map_err(|e| e.to_string())?;
    watcher
        .watch(dir, RecursiveMode::NonRecursive)
        .map_err(|e| e.to_string())?;
    Ok((watcher, rx))
}

/// The directory watch behind a storage's [`Notifications`] hub.
#[derive(Debug)]
struct DirSource {
    dir: PathBuf,
}

#[async_trait::async_trait]
impl NotificationSource for DirSource {
    /// The watcher (kept alive) and its events.
    type Connection = (RecommendedWatcher, Events);

    async fn connect(&self) -> Result<Self::Connection, StorageError> {
        watch(&self.dir).map_err(|e| StorageError::backend("sqlite", "watch", e))
    }

    async fn next(&self, (_, events): &mut Self::Connection) -> SourceEvent {
        loop {
            let event = match events.recv().await {
                Some(Ok(event)) => event,
                Some(Err(_)) => return SourceEvent::MayHaveMissed,
                None => return SourceEvent::Disconnected,
            };
            if matches!(event.kind, notify::EventKind::Access(_)) {
                continue; // opened or read, not written
            }
            let mut buckets = event.paths.iter().filter_map(|p| {
                let name = p.file_name()?.to_str()?;
                u8::from_str_radix(name, 16)
                    .ok()
                    .filter(|_| name.len() == 2)
            });
            return match (buckets.next(), buckets.next()) {
                (Some(b), None) => SourceEvent::ChangedBucket(b),
                // Several files, or none we know (a rescan, an overflow): re-check all.
                _ => SourceEvent::MayHaveMissed,
            };
        }
    }
}
