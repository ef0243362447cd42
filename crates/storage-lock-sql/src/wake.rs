//! Cross-process wake-ups for SQLite: a directory next to the database file (`<file>-wake/`)
//! holding one small file per key bucket ([`key_bucket`]).
//!
//! * A release that frees a key writes one byte into its bucket's file (one `pwrite` on a file
//!   kept open: a few microseconds, after the commit).
//! * Each storage that has waiters watches the directory (inotify on Linux, through the
//!   `notify` crate) and wakes the waiters of the bucket a write names; they re-check the
//!   database. Keys sharing a bucket wake each other spuriously, which costs a re-check.
//! * Nothing here decides anything: a lost or late wake-up costs latency (waiters also back off
//!   to the holder's expiry), never correctness.
//! * Where the directory cannot be created or watched (a read-only directory, no inotify
//!   instances left), the storage opens without notifications and waiters back off.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use storage_lock_core::storage::key_bucket;
use storage_lock_core::{ChangeWait, NotificationSource, Notifications, SourceEvent, StorageError};
use tokio::sync::mpsc;

/// The wake-up directory of one database file, and the watcher of its waiters.
#[derive(Debug)]
pub(crate) struct Wake {
    dir: PathBuf,
    /// Bucket files opened by releases so far.
    files: Mutex<HashMap<u8, File>>,
    hub: Notifications<DirSource>,
}

impl Wake {
    /// The wake-up directory for the database at `db` (created if missing), or `None` (logged)
    /// if it cannot be created or watched.
    pub(crate) fn open(db: &Path) -> Option<Arc<Self>> {
        let mut name = db.file_name()?.to_owned();
        name.push("-wake");
        let dir = db.with_file_name(name);
        let usable = std::fs::create_dir_all(&dir)
            .map_err(|e| e.to_string())
            .and_then(|()| watch(&dir).map(drop));
        if let Err(e) = usable {
            tracing::warn!(dir = %dir.display(), error = %e,
                "no cross-process wake-ups for this SQLite file: waiters back off instead");
            return None;
        }
        Some(Arc::new(Self {
            hub: Notifications::new(DirSource { dir: dir.clone() }),
            dir,
            files: Mutex::new(HashMap::new()),
        }))
    }

    /// Tells every process watching that `key` may be free now (best effort).
    pub(crate) fn signal(&self, key: &str) {
        let bucket = key_bucket(key);
        let mut files = self.files.lock().unwrap_or_else(|e| e.into_inner());
        let file = match files.entry(bucket) {
            std::collections::hash_map::Entry::Occupied(f) => f.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let opened = std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(self.dir.join(format!("{bucket:02x}")));
                match opened {
                    Ok(f) => v.insert(f),
                    Err(e) => {
                        tracing::debug!(error = %e, "wake-up file could not be opened");
                        return;
                    }
                }
            }
        };
        #[cfg(unix)]
        let written = std::os::unix::fs::FileExt::write_at(&*file, &[1], 0);
        #[cfg(windows)]
        let written = std::os::windows::fs::FileExt::seek_write(&*file, &[1], 0);
        #[cfg(not(any(unix, windows)))]
        let written = std::io::Write::write(file, &[1]);
        if let Err(e) = written {
            tracing::debug!(error = %e, "wake-up write failed");
            files.remove(&bucket);
        }
    }

    /// A notification for the next wake-up of `key`'s bucket.
    pub(crate) async fn arm(&self, key: &str) -> ChangeWait {
        self.hub.arm(key).await
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
