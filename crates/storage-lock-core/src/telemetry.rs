//! Metric names and recording helpers (the `metrics` facade: install any recorder, e.g. a
//! Prometheus exporter, to collect them; [`describe_metrics`] gives each its help text).
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `storage_lock_acquire_total` | counter | `result` = `acquired` / `timed_out` / `cancelled` / `error` |
//! | `storage_lock_acquire_seconds` | histogram | `result` |
//! | `storage_lock_contended_total` | counter | |
//! | `storage_lock_lost_total` | counter | `reason` = `expired` (no renewal confirmed it before its local deadline) / `refused` (a renewal found it not ours: broken, swept, taken over) / `taken_away` (the loss watch saw the record change) / `error` (an explicit renewal failed) |
//! | `storage_lock_renewals_total` | counter | `result` = `renewed` / `refused` / `error` |
//! | `storage_lock_storage_errors_total` | counter | `operation` = `acquire` (retried while waiting) / `renew` |
//! | `storage_lock_hold_seconds` | histogram | |
//! | `storage_lock_held` | gauge (handles held by this process; explicit-owner and reentrant holds are not counted: a lock server reports its holds itself) | |
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

/// Why a hold turned lost (the `reason` label of `storage_lock_lost_total`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum LostReason {
    Expired,
    Refused,
    TakenAway,
    Error,
}

pub(crate) fn lost(why: LostReason) {
    let reason = match why {
        LostReason::Expired => "expired",
        LostReason::Refused => "refused",
        LostReason::TakenAway => "taken_away",
        LostReason::Error => "error",
    };
    metrics::counter!("storage_lock_lost_total", "reason" => reason).increment(1);
}

/// How one renewal ended (the `result` label of `storage_lock_renewals_total`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Renewal {
    Renewed,
    Refused,
    Error,
}

pub(crate) fn renewal(how: Renewal) {
    let result = match how {
        Renewal::Renewed => "renewed",
        Renewal::Refused => "refused",
        Renewal::Error => {
            storage_error("renew");
            "error"
        }
    };
    metrics::counter!("storage_lock_renewals_total", "result" => result).increment(1);
}

/// A storage error the engine saw and handled (retried, or turned into a lost hold).
pub(crate) fn storage_error(operation: &'static str) {
    metrics::counter!("storage_lock_storage_errors_total", "operation" => operation).increment(1);
}

/// Gives every metric of the engine its help text (Prometheus `# HELP`) and unit. Call it once
/// after installing a recorder; a lock server does (`storage_lock_server::Server::metrics`).
///
/// # Examples
/// ```
/// storage_lock_core::describe_metrics(); // without a recorder: nothing happens
/// ```
pub fn describe_metrics() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "storage_lock_acquire_total",
        "Acquisitions that ended, by result (acquired, timed_out, cancelled, error)."
    );
    describe_histogram!(
        "storage_lock_acquire_seconds",
        Unit::Seconds,
        "Time from the start of an acquisition to its end, waiting included, by result."
    );
    describe_counter!(
        "storage_lock_contended_total",
        "Acquisition attempts that found the lock held by another owner."
    );
    describe_counter!(
        "storage_lock_lost_total",
        "Holds that turned lost, by reason (expired, refused, taken_away, error)."
    );
    describe_counter!(
        "storage_lock_renewals_total",
        "Renewals of holds, by result (renewed, refused, error)."
    );
    describe_counter!(
        "storage_lock_storage_errors_total",
        "Storage errors the engine handled, by operation (acquire: retried while waiting; renew)."
    );
    describe_histogram!(
        "storage_lock_hold_seconds",
        Unit::Seconds,
        "How long handles of this process held their lock (released or lost)."
    );
    describe_gauge!(
        "storage_lock_held",
        "Lock handles this process holds now (explicit-owner and reentrant holds not counted)."
    );
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
