//! One background task per tokio runtime, fed through a channel: what the engine's renewal
//! batcher and watchdog scheduler run on.
//!
//! A task lives on the runtime of the calls that feed it, so an engine shared by several
//! runtimes never makes one runtime's holds depend on another runtime being driven (a
//! current-thread runtime entered only now and then, one shutting down). The task starts with
//! the first message from its runtime, and a runtime that shut down is replaced by a new task at
//! the next message.

use std::future::Future;
use std::sync::Mutex;

use tokio::runtime::{Handle, Id};
use tokio::sync::mpsc::{
    UnboundedReceiver, UnboundedSender, WeakUnboundedSender, unbounded_channel,
};

pub(crate) struct PerRuntime<T> {
    senders: Mutex<Vec<(Id, UnboundedSender<T>)>>,
}

impl<T> Default for PerRuntime<T> {
    fn default() -> Self {
        Self {
            senders: Mutex::new(Vec::new()),
        }
    }
}

impl<T: Send + 'static> PerRuntime<T> {
    /// Sends `msg` to the current runtime's task, starting it with `start(weak sender,
    /// receiver)` if there is none (or it is gone). The task ends when its receiver reports
    /// every strong sender gone: hold only the weak one inside it.
    ///
    /// # Panics
    /// Outside a tokio runtime (as `tokio::spawn` does).
    pub(crate) fn send<F, Fut>(&self, msg: T, start: F)
    where
        F: FnOnce(WeakUnboundedSender<T>, UnboundedReceiver<T>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let runtime = Handle::current();
        let id = runtime.id();
        let mut senders = self.senders.lock().unwrap_or_else(|e| e.into_inner());
        let msg = match senders.iter().find(|(i, _)| *i == id) {
            Some((_, tx)) => match tx.send(msg) {
                Ok(()) => return,
                Err(back) => back.0, // its task is gone with its runtime's shutdown
            },
            None => msg,
        };
        senders.retain(|(i, tx)| *i != id && !tx.is_closed());
        let (tx, rx) = unbounded_channel();
        runtime.spawn(start(tx.downgrade(), rx));
        // The receiver was just created and is alive.
        let _ = tx.send(msg);
        senders.push((id, tx));
    }
}
