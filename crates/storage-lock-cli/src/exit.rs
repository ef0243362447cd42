//! Exit codes and the one error type every subcommand returns.
//!
//! The codes are part of the command-line interface and stay stable:
//!
//! | code | meaning |
//! |---|---|
//! | child's | `run`: the command ran; its own exit code is passed through |
//! | 128 + N | `run`: the command was killed by signal N (or the wait was interrupted by signal N) |
//! | 0 | any other subcommand succeeded |
//! | 2 | usage error: bad arguments, unknown scheme, malformed URL, invalid name, invalid token, `--renew` / `--kill-grace` not fitting the lease, `-s` through a lock server's URL or with `elect` |
//! | 65 | the lock's stored data makes it unusable: its record does not decode, or its fencing token reached the storage's bound (use another name; retrying does not help) (`EX_DATAERR`) |
//! | 69 | storage unavailable: cannot be opened, reached, or refused an operation |
//! | 75 | not acquired: the lock was busy until the wait ran out (`run`, `acquire`; `--conflict-exit-code` changes it) |
//! | 76 | lock lost or not held: `run` lost the lock (or could not renew it in time) while the command ran; `renew`/`release` of a token that no longer holds it (released, or its lease ran out) |
//! | 77 | not allowed: a lock server refused the token (401) or its grants do not cover the operation (403) (`EX_NOPERM`) |
//! | 78 | the storage's configuration is invalid or cannot keep the guarantees (`EX_CONFIG`) |
//! | 70 | internal error (a bug: please report it) |
//! | 126 | `run`: the command was found but could not be started |
//! | 127 | `run`: the command was not found |

use std::fmt;

use storage_lock::{ConnectError, LockError, StorageError};

/// Bad arguments or bad input (the same code clap uses).
pub const USAGE: u8 = 2;
/// The lock's stored data makes it unusable: a record that does not decode, a fencing token
/// at the storage's bound (`EX_DATAERR`); retrying does not help.
pub const DATA: u8 = 65;
/// The storage cannot be opened or reached, or failed an operation (`EX_UNAVAILABLE`).
pub const STORAGE: u8 = 69;
/// The storage's configuration is invalid or cannot keep the lock's guarantees (a server that
/// can forget writes, a process-local storage in `check`) (`EX_CONFIG`).
pub const CONFIG: u8 = 78;
/// Not allowed: the storage (a lock server) refused the credentials or the operation
/// (`EX_NOPERM`).
pub const DENIED: u8 = 77;
/// The lock was busy until the wait budget ran out (`EX_TEMPFAIL`); the default of
/// `--conflict-exit-code`.
pub const CONFLICT: u8 = 75;
/// The lock was lost while the command ran, or a token no longer holds its lock.
pub const LOST: u8 = 76;
/// An internal error: a bug (`EX_SOFTWARE`).
pub const INTERNAL: u8 = 70;
/// The command exists but could not be executed (as in POSIX shells).
pub const CANNOT_EXECUTE: u8 = 126;
/// The command was not found (as in POSIX shells).
pub const NOT_FOUND: u8 = 127;

/// The exit code for "ended by signal `signal`" (128 + N, as shells report it).
pub fn signaled(signal: i32) -> u8 {
    u8::try_from(128 + signal.clamp(0, 127)).unwrap_or(u8::MAX)
}

/// A failure to report: one line on stderr (`storage-lock: error: …`) and an exit code.
#[derive(Debug)]
pub struct Failure {
    /// The process exit code.
    pub code: u8,
    /// What went wrong, for people; printed on a single line.
    pub message: String,
}

impl Failure {
    /// A failure with `code` and `message`.
    pub fn new(code: u8, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// A usage error.
    pub fn usage(message: impl Into<String>) -> Self {
        Self::new(USAGE, message)
    }

    /// A command that could not be started: [`NOT_FOUND`] (127) if it does not exist, else
    /// [`CANNOT_EXECUTE`] (126), as shells answer.
    pub fn cannot_run(program: &std::ffi::OsStr, e: &std::io::Error) -> Self {
        let code = match e.kind() {
            std::io::ErrorKind::NotFound => NOT_FOUND,
            _ => CANNOT_EXECUTE,
        };
        Self::new(
            code,
            format!(
                "cannot run {}: {e}",
                crate::output::escape(&program.to_string_lossy())
            ),
        )
    }

    /// A storage failure while doing `what`.
    pub fn storage(what: &str, error: &StorageError) -> Self {
        let code = match error {
            StorageError::Config { .. } => CONFIG,
            StorageError::Denied { .. } => DENIED,
            StorageError::Corrupt { .. } => DATA,
            _ => STORAGE,
        };
        Self::new(code, format!("{what}: {error}"))
    }

    /// A lock API failure while doing `what`, classified by kind.
    pub fn lock(what: &str, error: &LockError) -> Self {
        let code = match error {
            LockError::InvalidName { .. }
            | LockError::InvalidOptions { .. }
            | LockError::LeaseOutOfRange { .. } => USAGE,
            LockError::NotHeld { .. } => LOST,
            LockError::Storage(StorageError::Denied { .. }) => DENIED,
            LockError::Storage(StorageError::Corrupt { .. })
            | LockError::FencingExhausted { .. } => DATA,
            _ => STORAGE,
        };
        Self::new(code, format!("{what}: {error}"))
    }

    /// A failure to open the storage at `url`.
    pub fn connect(error: &ConnectError) -> Self {
        match error {
            ConnectError::UnknownScheme { .. } | ConnectError::InvalidUrl { .. } => {
                Self::usage(error.to_string())
            }
            ConnectError::Lock(e) => Self::lock("cannot use the storage", e),
            ConnectError::Storage(
                e @ (StorageError::Config { .. } | StorageError::Denied { .. }),
            ) => Self::storage("cannot use the storage", e),
            _ => Self::new(STORAGE, format!("cannot open the storage: {error}")),
        }
    }

    /// The message flattened to one line (driver errors may contain newlines).
    pub fn one_line(&self) -> String {
        self.message
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.one_line())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_codes_follow_the_shell() {
        assert_eq!(signaled(15), 143);
        assert_eq!(signaled(9), 137);
    }

    #[test]
    fn messages_are_one_line() {
        let f = Failure::new(STORAGE, "a\nb\t c");
        assert_eq!(f.to_string(), "a b c");
    }
}
