//! A hold: the runtime behind every [`LockHandle`], whatever provides the lock.
//!
//! A handle's guarantees (fencing token, authoritative expiry, the local deadline, the `lost()`
//! signal, fail-closed renewal, release on drop) do not depend on where the lock lives, so they
//! are built once, here, over a small I/O seam: the engine supplies renew and release through
//! its [`crate::Storage`] (`engine::backend`), a provider outside this crate through
//! [`HoldIo`] (a lock server's session client does).
//!
//! The layer sits above the contract's vocabulary ([`crate::contract`]: options, errors, names)
//! and below the engine; nothing here knows a storage.
//!
//! | file | what |
//! |---|---|
//! | `handle` | [`LockHandle`], the documented face, and [`RenewalResult`] |
//! | `grant` | [`HoldGrant`] (what a provider knows right after a grant), [`safety_margin`], the local deadline, which leases fit |
//! | `io` | [`HoldIo`] for providers, `Backend` for the engine |
//! | `state` | `HoldCore`: a hold's facts and state packed into one atomic byte and two words |
//! | `runtime` | `HoldRuntime`: the state machine (held → released \| lost), renewals one at a time, the deadline timer, release |
//! | `watchdog` | auto-renewal: a task per provider handle, one timer heap per engine (`Watchdogs`) |
//! | `per_runtime` | one background task per tokio runtime (the watchdog scheduler and the engine's renewal batcher) |
//!
//! # Why the local deadline is safe
//!
//! A hold's local deadline is `sent_at + lease − safety_margin(lease)`, on the boot clock, with
//! `sent_at` read *before* the acquire or renew request left. The storage computed the expiry
//! later, from its own clock: `expiry ≥ t_storage(arrival) + lease`. As long as the two clocks'
//! rates differ by less than 1 % (the margin's first part) and timestamps are rounded to the
//! millisecond (its 2 ms), the holder's deadline passes before the storage's expiry, so a
//! holder never believes it holds what the storage already gave away. The boot clock keeps
//! counting through a suspend; tokio's timers do not, so timers wake at least every second to
//! compare (`SUSPEND_CHECK`).

mod grant;
mod handle;
mod io;
pub(crate) mod per_runtime;
mod runtime;
mod state;
mod watchdog;

pub(crate) use grant::GrantName;
pub use grant::{HoldGrant, safety_margin};
pub use handle::{LockHandle, RenewalResult};
pub use io::HoldIo;
pub(crate) use io::{Backend, Releasing};
pub(crate) use runtime::HoldRuntime;
pub(crate) use state::HoldCore;
pub(crate) use watchdog::{Watchdogs, start_watched};
