//! The contract: what application code depends on, whatever the backend.
//!
//! * [`DistributedLock`] — the entry point (object-safe: `Arc<dyn DistributedLock>`).
//! * [`AcquireOptions`] / [`Wait`] — how long to wait, how long to hold, whether to auto-renew.
//! * [`LockHandle`] — one hold: fencing token, authoritative expiry, `lost()` signal, fail-closed
//!   renewal, idempotent release (and release on drop).
//! * [`KeyNormalizer`] — the pure mapping from lock names to storage keys.
//! * [`ProviderInfo`] — how strong the wiring is (process-local or not).
//! * [`HoldIo`] / [`HoldGrant`] — for providers that are not a [`crate::Storage`] (a remote
//!   client): supply a hold's renew/release I/O and get a [`LockHandle`] with every guarantee
//!   above from [`LockHandle::start`].
//! * [`LockError`] — the one error type.
//!
//! Semantics in brief (each is a named test in `storage-lock-testkit`):
//!
//! | situation | result |
//! |---|---|
//! | busy and the wait budget ran out | `Ok(None)`, not an error |
//! | wait cancelled | `Err(LockError::Cancelled)` (or the dropped future); the holder is unaffected |
//! | blank / too long / control characters in the name | `Err(LockError::InvalidName)` before any storage call |
//! | invalid options | `Err(LockError::InvalidOptions)` before any storage call |
//! | lease ran out | handle is lost: `is_lost()`, `lost()` completes |
//! | renewal cannot confirm the hold | `RenewalResult::Lost`, never a transport error |
//! | second `release()` | no second storage call |
//! | fencing token | strictly increasing per key, across processes |
//! | same key twice from the same task | waits / times out: not reentrant |

mod error;
mod handle;
mod lock;
mod name;
mod options;
mod provider;

pub use crate::engine::runtime::{HoldGrant, HoldIo};
pub use error::LockError;
pub use handle::{LockHandle, RenewalResult, safety_margin};
pub use lock::DistributedLock;
pub use name::{KeyNormalizer, MAX_NAME_LEN, PrefixNormalizer, validate_key, validate_name};
pub use options::{AcquireOptions, DEFAULT_LEASE, Wait};
pub use provider::ProviderInfo;
