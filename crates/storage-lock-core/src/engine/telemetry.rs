//! Metric names and recording helpers (the `metrics` facade: install any recorder, e.g. a
//! Prometheus exporter, to collect them).
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `storage_lock_acquire_total` | counter | `result` = `acquired` / `timed_out` / `cancelled` / `error` |
//! | `storage_lock_acquire_seconds` | histogram | `result` |
//! | `storage_lock_contended_total` | counter | |
//! | `storage_lock_lost_total` | counter | |
//! | `storage_lock_hold_seconds` | histogram | |
//! | `storage_lock_held` | gauge (handles held by this process; explicit-owner and reentrant holds are not counted) | |
//!
//! Durations are measured on the boot clock ([`crate::clock::BootInstant`]): they include time
//! the machine spent suspended, and a paused tokio clock does not affect them.

use std::time::Duration;

/// How an acquisition ended.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Finish {
    Acquired,
    TimedOut,
    Cancelled,
    Error,
}

/// Records the end of one acquisition. Label values are literals so that, with no recorder
/// installed, recording allocates nothing.
pub(crate) fn acquire_finished(result: Finish, took: Duration) {
    let secs = took.as_secs_f64();
    match result {
        Finish::Acquired => {
            metrics::counter!("storage_lock_acquire_total", "result" => "acquired").increment(1);
            metrics::histogram!("storage_lock_acquire_seconds", "result" => "acquired")
                .record(secs);
            metrics::gauge!("storage_lock_held").increment(1.0);
        }
        Finish::TimedOut => {
            metrics::counter!("storage_lock_acquire_total", "result" => "timed_out").increment(1);
            metrics::histogram!("storage_lock_acquire_seconds", "result" => "timed_out")
                .record(secs);
        }
        Finish::Cancelled => {
            metrics::counter!("storage_lock_acquire_total", "result" => "cancelled").increment(1);
            metrics::histogram!("storage_lock_acquire_seconds", "result" => "cancelled")
                .record(secs);
        }
        Finish::Error => {
            metrics::counter!("storage_lock_acquire_total", "result" => "error").increment(1);
            metrics::histogram!("storage_lock_acquire_seconds", "result" => "error").record(secs);
        }
    }
}

pub(crate) fn contended() {
    metrics::counter!("storage_lock_contended_total").increment(1);
}

pub(crate) fn lost() {
    metrics::counter!("storage_lock_lost_total").increment(1);
}

/// Records the end of a hold (released or lost).
/// A grant that does not become a handle of this process (explicit-owner and reentrant holds:
/// their owner renews and releases them, maybe from elsewhere): not counted as held here.
pub(crate) fn not_a_handle() {
    metrics::gauge!("storage_lock_held").decrement(1.0);
}

pub(crate) fn hold_ended(held_for: Duration) {
    metrics::gauge!("storage_lock_held").decrement(1.0);
    metrics::histogram!("storage_lock_hold_seconds").record(held_for.as_secs_f64());
}
