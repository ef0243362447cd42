//! The signals `run` handles: SIGINT, SIGTERM and SIGHUP.
//!
//! Once [`Signals::new`] has run, these signals no longer terminate this process: `run` forwards
//! them to its command (or, while still waiting, stops waiting and exits 128 + N), so the lock is
//! always released before exiting.

use nix::sys::signal::Signal;
use tokio::signal::unix::{SignalKind, signal};

use crate::exit::{Failure, INTERNAL};

/// Listeners for the handled signals.
pub struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs the handlers (needs a tokio runtime).
    pub fn new() -> Result<Self, Failure> {
        let listen = |kind: SignalKind| {
            signal(kind).map_err(|e| {
                Failure::new(INTERNAL, format!("cannot install a signal handler: {e}"))
            })
        };
        Ok(Self {
            int: listen(SignalKind::interrupt())?,
            term: listen(SignalKind::terminate())?,
            hup: listen(SignalKind::hangup())?,
        })
    }

    /// The next handled signal to arrive. Cancel safe.
    pub async fn recv(&mut self) -> Signal {
        tokio::select! {
            _ = self.int.recv() => Signal::SIGINT,
            _ = self.term.recv() => Signal::SIGTERM,
            _ = self.hup.recv() => Signal::SIGHUP,
        }
    }
}
