//! The subcommands other than `run`, and what they share with it.

pub mod acquire;
pub mod admin;
pub mod inspect;
pub mod serve;
pub mod sweep;

use std::time::Duration;

use storage_lock::backend::Storage;

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

/// Prints (unless `quiet`) why `name` was not acquired: who holds it, for how much longer.
/// Best effort: a storage error only shortens the message.
pub async fn busy_notice(quiet: bool, storage: &dyn Storage, name: &str, waited: Duration) {
    if quiet {
        return;
    }
    let who = match (storage.now().await, storage.get(name).await) {
        (Ok(now), Ok(Some(s))) if s.record.is_held_at(now) => format!(
            ": held by {} with token {}, lease left {}",
            output::holder(s.record.holder.as_deref()),
            s.record.fencing,
            output::duration(s.record.expires_at.saturating_since(now)),
        ),
        _ => String::new(),
    };
    eprintln!(
        "storage-lock: lock {name:?} not acquired after {}{who}",
        output::duration(waited)
    );
}
