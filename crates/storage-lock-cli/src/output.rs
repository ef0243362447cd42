//! Formatting shared by the subcommands: times, durations, holders, JSON records.

use std::time::{Duration, SystemTime};

use serde_json::{Value, json};
use storage_lock::{HolderInfo, LockRecord, Timestamp};

/// Writes `line` and a newline to stdout. Unlike `println!`, a closed stdout (`| head`) is an
/// error to handle, not a panic.
pub fn emit(line: impl std::fmt::Display) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()
}

/// RFC 3339 in UTC with milliseconds, e.g. `2026-05-01T12:00:00.123Z`.
pub fn rfc3339(at: SystemTime) -> String {
    humantime::format_rfc3339_millis(at).to_string()
}

/// A storage timestamp as RFC 3339 (falls back to Unix milliseconds if unrepresentable).
pub fn timestamp(at: Timestamp) -> String {
    at.to_system_time()
        .map_or_else(|| format!("{}ms", at.as_millis()), rfc3339)
}

/// A duration for people: `12.3s`, `4m05s`, `2h03m`.
pub fn duration(d: Duration) -> String {
    let secs = d.as_secs();
    if secs < 60 {
        format!("{:.1}s", d.as_secs_f64())
    } else if secs < 3600 {
        format!("{}m{:02}s", secs / 60, secs % 60)
    } else {
        format!("{}h{:02}m", secs / 3600, (secs % 3600) / 60)
    }
}

/// `host:pid (note)` or `unknown holder`.
pub fn holder(holder: Option<&HolderInfo>) -> String {
    match holder {
        None => "unknown holder".into(),
        Some(h) => match &h.note {
            Some(note) => format!("{}:{} ({})", h.host, h.pid, shorten(note, 40)),
            None => format!("{}:{}", h.host, h.pid),
        },
    }
}

/// `s` cut to at most `max` characters, with `…` when cut.
pub fn shorten(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// The first 8 hex digits of an owner id: enough to tell holds apart, useless for renewing.
pub fn owner_prefix(record: &LockRecord) -> String {
    format!("{:08x}", record.owner.as_u128() >> 96)
}

/// The JSON form of a record as `list` and `inspect` print it.
pub fn record_json(name: &str, record: &LockRecord, now: Timestamp) -> Value {
    let held = record.is_held_at(now);
    let holder = record.holder.as_deref();
    json!({
        "name": name,
        "held": held,
        "state": state(record, now),
        "fencing_token": record.fencing,
        "count": record.count,
        "owner_prefix": owner_prefix(record),
        "acquired_at": timestamp(record.acquired_at),
        "expires_at": timestamp(record.expires_at),
        "expires_at_unix_ms": record.expires_at.as_millis(),
        "time_left_ms": if held { record.expires_at.saturating_since(now).as_millis() } else { 0 },
        "holder": holder.map(|h| json!({ "host": h.host, "pid": h.pid, "note": h.note })),
    })
}

/// `held`, `released` (a tombstone) or `expired` (the holder let its lease run out).
pub fn state(record: &LockRecord, now: Timestamp) -> &'static str {
    if record.is_held_at(now) {
        "held"
    } else if record.count == 0 {
        "released"
    } else {
        "expired"
    }
}
