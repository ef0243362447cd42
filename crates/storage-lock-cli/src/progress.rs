//! The one-line progress indicator shown while waiting for a busy lock.
//!
//! Shown only when stderr is a terminal and `-q` is not given: every ~200 ms it reads the lock's
//! record ([`Storage::get`], in parallel with the acquisition, never delaying it) and rewrites one
//! line with who holds the lock, how long we have waited and the time left on the holder's
//! lease, cut to the terminal's width (so it never wraps). The line is erased when the wait
//! ends. Read errors just skip an update.

use std::future::Future;
use std::io::{IsTerminal, Write};
use std::time::Duration;

use storage_lock::backend::Storage;
use tokio::time::Instant;

use crate::output;

/// How often the indicator refreshes.
const EVERY: Duration = Duration::from_millis(200);
/// Longest line written when the terminal's width is unknown.
const MAX_LINE: usize = 100;

/// The width the line may take: one less than stderr's terminal width (a line filling the last
/// column wraps on some terminals, and wrapping defeats `\r`), or [`MAX_LINE`] if unknown; re-read at
/// every update, so resizing the window is followed.
fn line_width() -> usize {
    match rustix::termios::tcgetwinsize(std::io::stderr()) {
        Ok(size) if size.ws_col > 0 => usize::from(size.ws_col).saturating_sub(1).max(1),
        _ => MAX_LINE,
    }
}

/// Whether the indicator should be shown.
pub fn enabled(quiet: bool) -> bool {
    !quiet && std::io::stderr().is_terminal()
}

/// Awaits `wait`, showing the indicator for lock `name` meanwhile if `show`.
pub async fn while_waiting<T>(
    show: bool,
    storage: &dyn Storage,
    name: &str,
    wait: impl Future<Output = T>,
) -> T {
    if !show {
        return wait.await;
    }
    tokio::pin!(wait);
    let started = Instant::now();
    let mut shown = false;
    // The first update comes after one period, so an uncontended acquire prints nothing.
    let mut tick = tokio::time::interval_at(started + EVERY, EVERY);
    let out = loop {
        tokio::select! {
            biased;
            out = &mut wait => break out,
            _ = tick.tick() => {
                if let Some(line) = status_line(storage, name, started.elapsed()).await {
                    draw(&line);
                    shown = true;
                }
            }
        }
    };
    if shown {
        draw("");
    }
    out
}

async fn status_line(storage: &dyn Storage, name: &str, waited: Duration) -> Option<String> {
    let now = storage.now().await.ok()?;
    let record = storage.get(name).await.ok()?.map(|s| s.record);
    let line = match record.filter(|r| r.is_held_at(now)) {
        Some(r) => format!(
            "storage-lock: waiting {} for {}: held by {}, token {}, lease left {}",
            output::duration(waited),
            output::quoted(name),
            output::holder(r.holder.as_deref()),
            r.fencing,
            output::duration(r.expires_at.saturating_since(now)),
        ),
        None => format!(
            "storage-lock: waiting {} for {}: free, retrying",
            output::duration(waited),
            output::quoted(name)
        ),
    };
    Some(output::shorten(&line, line_width()))
}

/// Replaces the current terminal line with `line` (no newline).
fn draw(line: &str) {
    let mut err = std::io::stderr().lock();
    // Best effort: a closed stderr must not fail the acquisition.
    let _ = write!(err, "\r\x1b[2K{line}");
    let _ = err.flush();
}
