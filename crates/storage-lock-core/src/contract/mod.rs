//! The contract's vocabulary: what every layer and every provider shares.
//!
//! * [`AcquireOptions`] / [`Wait`] — how long to wait, how long to hold, whether to auto-renew.
//! * [`Lease`] — a hold's length, checked once by one rule.
//! * [`KeyNormalizer`] — the pure mapping from lock names to storage keys.
//! * [`ProviderInfo`] — how strong the wiring is (process-local or not).
//! * [`Busy`] — who holds a lock an acquisition did not get.
//! * [`LockError`] — the one error type.
//!
//! The entry point, [`crate::DistributedLock`], is in [`crate::lock`]; the handle it returns,
//! [`crate::LockHandle`], with the runtime behind it, in [`crate::hold`]. Both build on this
//! module, which imports neither.

mod busy;
mod error;
mod lease;
mod name;
mod options;
mod provider;

pub use busy::Busy;
pub use error::LockError;
pub use lease::Lease;
pub use name::{KeyNormalizer, MAX_NAME_LEN, PrefixNormalizer, validate_key, validate_name};
pub use options::{AcquireOptions, DEFAULT_LEASE, Wait};
pub use provider::ProviderInfo;
