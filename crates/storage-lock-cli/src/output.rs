//! Formatting shared by the subcommands: times, durations, holders, JSON records.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use storage_lock::backend::{HolderInfo, LockRecord, Timestamp};

/// Writes `line` and a newline to stdout. Unlike `println!`, a closed stdout (`| head`) is an
/// error to handle, not a panic.
pub fn emit(line: impl std::fmt::Display) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    out.flush()
}

/// RFC 3339 in UTC with milliseconds, e.g. `2026-05-01T12:00:00.123Z`. Total: a year past
/// 9999 (a lease of millions of years) is written with its sign and all its digits, as ISO 8601
/// extends years (`+2739966-01-01T00:00:00.000Z`); so is a time before year 0.
pub fn rfc3339(at: SystemTime) -> String {
    let millis = match at.duration_since(UNIX_EPOCH) {
        Ok(after) => i128::try_from(after.as_millis()).unwrap_or(i128::MAX),
        Err(before) => -i128::try_from(before.duration().as_millis()).unwrap_or(i128::MAX),
    };
    rfc3339_millis(millis)
}

/// A storage timestamp as RFC 3339 (total, see [`rfc3339`]).
pub fn timestamp(at: Timestamp) -> String {
    rfc3339_millis(i128::from(at.as_millis()))
}

/// Milliseconds since the Unix epoch as RFC 3339 UTC (proleptic Gregorian calendar).
fn rfc3339_millis(millis: i128) -> String {
    let secs = millis.div_euclid(1000);
    let ms = millis.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let day_secs = secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let year = if (0..=9999).contains(&year) {
        format!("{year:04}")
    } else {
        format!("{year:+05}")
    };
    format!(
        "{year}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{ms:03}Z",
        day_secs / 3600,
        day_secs % 3600 / 60,
        day_secs % 60
    )
}

/// (year, month, day) of the day `days` after 1970-01-01 (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i128) -> (i128, i128, i128) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i128::from(month <= 2);
    (year, month, day)
}

/// A duration for people: `12.3s`, `4m05s`, `2h03m`, `3d04h`.
pub fn duration(d: Duration) -> String {
    let secs = d.as_secs();
    if secs < 60 {
        format!("{:.1}s", d.as_secs_f64())
    } else if secs < 3600 {
        format!("{}m{:02}s", secs / 60, secs % 60)
    } else if secs < 86_400 {
        format!("{}h{:02}m", secs / 3600, (secs % 3600) / 60)
    } else {
        format!("{}d{:02}h", secs / 86_400, (secs % 86_400) / 3600)
    }
}

/// `host:pid (note)` or `unknown holder`, with control characters escaped ([`escape`]).
pub fn holder(holder: Option<&HolderInfo>) -> String {
    match holder {
        None => "unknown holder".into(),
        Some(h) => match &h.note {
            Some(note) => format!(
                "{}:{} ({})",
                escape(&h.host),
                h.pid,
                shorten(&escape(note), 40)
            ),
            None => format!("{}:{}", escape(&h.host), h.pid),
        },
    }
}

/// `s` with every character a terminal would act on escaped the way Rust escapes them
/// (`\n`, `\t`, `\u{1b}`, `\u{202e}`): control characters, format characters such as
/// bidirectional overrides, line and paragraph separators. So a stored name or note can never
/// start a new line in `list`, move the cursor or recolour the terminal. Quotes and backslashes
/// stay as they are.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '"' | '\'' | '\\') || c == ' ' {
            out.push(c);
        } else {
            out.extend(c.escape_debug());
        }
    }
    out
}

/// `s` in double quotes with control characters escaped, for messages (`"nightly"`).
pub fn quoted(s: &str) -> String {
    format!("{s:?}")
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
        "time_left_ms": if held { record.expires_at.as_millis().saturating_sub(now.as_millis()) } else { 0 },
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_is_total() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = UNIX_EPOCH + Duration::from_millis(1_777_636_800_123);
        assert_eq!(rfc3339(t), humantime::format_rfc3339_millis(t).to_string());
        assert_eq!(
            timestamp(Timestamp::from_millis(253_402_300_799_999)),
            "9999-12-31T23:59:59.999Z"
        );
        assert_eq!(
            timestamp(Timestamp::from_millis(253_402_300_800_000)),
            "+10000-01-01T00:00:00.000Z"
        );
        assert!(timestamp(Timestamp::from_millis(u64::MAX)).starts_with("+584556019-"));
        assert_eq!(
            rfc3339(UNIX_EPOCH - Duration::from_millis(1)),
            "1969-12-31T23:59:59.999Z"
        );
        if let Some(far) = UNIX_EPOCH.checked_add(Duration::from_secs(86_400 * 1_000_000_000)) {
            assert!(rfc3339(far).starts_with('+'));
        }
        for days in [0, 59, 60, 365, 10_957, 11_016, 2_932_896] {
            let t = UNIX_EPOCH + Duration::from_secs(days * 86_400);
            assert_eq!(rfc3339(t), humantime::format_rfc3339_millis(t).to_string());
        }
    }

    #[test]
    fn escape_neutralises_control_characters() {
        assert_eq!(escape("a\nb\tc\u{1b}[31m"), "a\\nb\\tc\\u{1b}[31m");
        assert_eq!(escape("x\u{202e}y\u{2028}"), "x\\u{202e}y\\u{2028}");
        assert_eq!(
            escape("nightly \"report\" ü \\ x"),
            "nightly \"report\" ü \\ x"
        );
        assert_eq!(quoted("a\nb"), "\"a\\nb\"");
    }

    #[test]
    fn durations_print_at_any_size() {
        assert_eq!(duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(duration(Duration::from_secs(90_000)), "1d01h");
        assert!(duration(Duration::MAX).ends_with('h'));
    }
}
