use std::sync::Arc;
use std::time::Duration;

use crate::storage::HolderInfo;

/// Why an acquisition came back without the lock: who holds it, and for how long at most,
/// as the storage answered the last attempt. Callers get it without reading the record again
/// ([`crate::StorageLock::try_acquire_or_busy`], [`crate::StorageLock::acquire_as`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Busy {
    /// Who holds it, as the holder described itself (host, pid, note), if the storage keeps it.
    pub holder: Option<Arc<HolderInfo>>,
    /// How long the current hold lasts unless its holder renews it, as the storage judged it.
    pub left: Duration,
}
