//! Types and helpers of the wire format that the API and its error bodies share.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use storage_lock_core::HolderInfo;
use utoipa::ToSchema;

/// Whole milliseconds of `d` (saturating).
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Who holds a lock (for people and tools; never used for decisions).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Holder {
    /// Host name of the holder.
    #[schema(max_length = 255)]
    pub host: String,
    /// Process id of the holder.
    pub pid: u32,
    /// Free-form note.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 1024)]
    pub note: Option<String>,
}

impl From<&HolderInfo> for Holder {
    fn from(h: &HolderInfo) -> Self {
        Self {
            host: h.host.clone(),
            pid: h.pid,
            note: h.note.clone(),
        }
    }
}
