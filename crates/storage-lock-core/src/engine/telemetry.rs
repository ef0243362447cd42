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
//! | `storage_lock_held` | gauge | |

use std::time::Duration;

/// Records the end of one acquisition.
pub(crate) fn acquire_finished(result: &'static str, took: Duration) {
    metrics::counter!("storage_lock_acquire_total", "result" => result).increment(1);
    metrics::histogram!("storage_lock_acquire_seconds", "result" => result)
        .record(took.as_secs_f64());
    if result == "acquired" {
        metrics::gauge!("storage_lock_held").increment(1.0);
    }
}

pub(crate) fn contended() {
    metrics::counter!("storage_lock_contended_total").increment(1);
}

pub(crate) fn lost() {
    metrics::counter!("storage_lock_lost_total").increment(1);
}

/// Records the end of a hold (released or lost).
pub(crate) fn hold_ended(held_for: Duration) {
    metrics::gauge!("storage_lock_held").decrement(1.0);
    metrics::histogram!("storage_lock_hold_seconds").record(held_for.as_secs_f64());
}
