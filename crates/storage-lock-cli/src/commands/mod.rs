//! The subcommands other than `run`, and what they share with it.

pub mod acquire;
pub mod admin;
pub mod elect;
pub mod inspect;
pub mod serve;
pub mod sweep;
pub mod torture;

use std::time::Duration;

use storage_lock::Busy;

use crate::exit::Failure;
use crate::output;

/// Checks a lock name before any storage is opened (empty, blank, over 255 bytes, control
/// characters → usage error).
pub fn validate_name(name: &str) -> Result<(), Failure> {
    storage_lock::backend::contract::validate_name(name).map_err(|e| Failure::usage(e.to_string()))
}

/// Checks a lease: at least 10 ms (storage timestamps have millisecond resolution).
pub fn validate_lease(flag: &str, lease: Duration) -> Result<(), Failure> {
    if lease < Duration::from_millis(10) {
        return Err(Failure::usage(format!(
            "{flag} must be at least 10ms (got {lease:?})"
        )));
    }
    Ok(())
}

/// Prints (unless `quiet`) why `name` was not acquired: who holds it, for how much longer,
/// as the storage's last busy answer said (no second read).
pub fn busy_notice(quiet: bool, busy: &Busy, name: &str, waited: Duration) {
    if quiet {
        return;
    }
    eprintln!(
        "storage-lock: lock {name:?} not acquired after {}: held by {}, lease left {}",
        output::duration(waited),
        output::holder(busy.holder.as_deref()),
        output::duration(busy.left),
    );
}
