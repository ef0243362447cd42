//! `sweep`: delete records of locks that have been free for a while.
//!
//! Uses [`storage_lock::backend::StorageExt::sweep`]: before deleting, the storage raises its fencing floor
//! above the deleted records' tokens, so a swept lock's next holder still gets a higher fencing
//! token than any earlier one. Held locks are never deleted. Needs a storage with conditional
//! delete (SQLite has it); others fail with a storage error (exit 69).

use storage_lock::backend::HolderInfo;
use storage_lock::backend::StorageExt;

use crate::cli::SweepArgs;
use crate::exit::Failure;
use crate::{output, storage};

/// Runs `sweep`: prints `deleted N record(s); fencing floor F`.
pub async fn sweep(args: SweepArgs, url: Option<&str>, quiet: bool) -> Result<u8, Failure> {
    let opened = storage::open(url, HolderInfo::this_process(), quiet).await?;
    let report = opened
        .storage
        .sweep(&args.prefix, args.older_than)
        .await
        .map_err(|e| Failure::storage("cannot sweep", &e))?;
    let _ = output::emit(format_args!(
        "deleted {} record(s); fencing floor {}",
        report.deleted, report.floor
    ));
    Ok(0)
}
