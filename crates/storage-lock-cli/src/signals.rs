//! The signals `run` handles: SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2 and SIGALRM.
//!
//! Once [`Signals::new`] has run, these signals no longer terminate this process: `run` forwards
//! them to its command's process group (or, while still waiting for the lock, stops waiting and
//! exits 128 + N, as their default action would), so the lock is always released before
//! exiting and the command is never left running unlocked.

use nix::sys::signal::Signal;
use tokio::signal::unix::{SignalKind, signal};

use crate::exit::{Failure, INTERNAL};

/// The handled signals, in the order [`Signals::recv`] checks them.
pub const HANDLED: [Signal; 7] = [
    Signal::SIGINT,
    Signal::SIGTERM,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGALRM,
];

/// Listeners for the handled signals.
pub struct Signals {
    listeners: Vec<(Signal, tokio::signal::unix::Signal)>,
}

impl Signals {
    /// Installs the handlers (needs a tokio runtime).
    pub fn new() -> Result<Self, Failure> {
        let listeners = HANDLED
            .iter()
            .map(|&sig| {
                signal(SignalKind::from_raw(sig as i32))
                    .map(|listener| (sig, listener))
                    .map_err(|e| {
                        Failure::new(INTERNAL, format!("cannot install a signal handler: {e}"))
                    })
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { listeners })
    }

    /// The next handled signal to arrive. Cancel safe.
    pub async fn recv(&mut self) -> Signal {
        std::future::poll_fn(|cx| {
            for (sig, listener) in &mut self.listeners {
                if listener.poll_recv(cx).is_ready() {
                    return std::task::Poll::Ready(*sig);
                }
            }
            std::task::Poll::Pending
        })
        .await
    }
}
