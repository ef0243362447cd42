//! `list` and `inspect`: read-only views of the storage.
//!
//! Neither shows a full owner id (the secret of a hold): only its first 8 hex digits. Times left
//! are judged by the storage's clock ([`Storage::now`]), like the locks themselves.

use std::io::Write;
use storage_lock::backend::StorageExt;

use serde_json::Value;
use storage_lock::backend::{HolderInfo, LockRecord, PageRequest, Storage, Timestamp};
use storage_lock::kinds::Parts;

use super::validate_name;
use crate::cli::{InspectArgs, ListArgs};
use crate::exit::Failure;
use crate::{output, storage};

/// The locks held now whose name starts with `prefix`, in name order. A corrupt record is one
/// warning on stderr, not a failed listing.
async fn held_under(
    storage: &dyn Storage,
    prefix: &str,
    now: Timestamp,
    quiet: bool,
) -> Result<Vec<(String, LockRecord)>, Failure> {
    let mut held = Vec::new();
    let mut page = PageRequest::default();
    loop {
        let listed = storage
            .list_locks(prefix, &page)
            .await
            .map_err(|e| Failure::storage("cannot list locks", &e))?;
        held.extend(
            listed
                .entries
                .into_iter()
                .filter(|(_, s)| s.record.is_held_at(now))
                .map(|(key, s)| (key, s.record)),
        );
        for (key, why) in &listed.corrupt {
            if !quiet {
                eprintln!(
                    "storage-lock: warning: skipped lock {}: its record is corrupt ({})",
                    output::quoted(key),
                    output::escape(why)
                );
            }
        }
        match listed.next {
            Some(next) => page.after = Some(next),
            None => return Ok(held),
        }
    }
}

/// Runs `list`: the held locks whose name starts with the prefix, in name order.
pub async fn list(args: ListArgs, url: Option<&str>, quiet: bool) -> Result<u8, Failure> {
    let opened = storage::open(url, HolderInfo::this_process(), quiet).await?;
    let storage = opened.storage.as_ref();
    let now = storage
        .now()
        .await
        .map_err(|e| Failure::storage("cannot read the storage clock", &e))?;
    let held = held_under(storage, &args.prefix, now, quiet).await?;
    if args.json {
        let rows: Vec<Value> = held
            .iter()
            .map(|(key, record)| output::record_json(key, record, now))
            .collect();
        let _ = output::emit(Value::Array(rows));
        return Ok(0);
    }
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{:<30} {:>8} {:>10}  HOLDER", "NAME", "TOKEN", "LEFT");
    for (key, record) in &held {
        let _ = writeln!(
            out,
            "{:<30} {:>8} {:>10}  {}",
            output::escape(key),
            record.fencing,
            output::duration(record.expires_at.saturating_since(now)),
            output::holder(record.holder.as_deref()),
        );
    }
    Ok(0)
}

/// The parts as JSON fields of `inspect --json`.
fn parts_json(name: &str, parts: &Parts, map: &mut serde_json::Map<String, Value>) {
    use storage_lock::kinds::{place_name, readers_name, slot_name};
    let now = parts.now;
    let row = |full: String, r: &LockRecord, field: &str, n: u64| {
        let mut row = output::record_json(&full, r, now);
        if let Value::Object(m) = &mut row {
            m.insert(field.into(), n.into());
        }
        row
    };
    if let Some(sem) = &parts.semaphore {
        let held: Vec<Value> = sem
            .held
            .iter()
            .map(|(i, s)| row(slot_name(name, *i), &s.record, "slot", (*i).into()))
            .collect();
        map.insert(
            "semaphore".into(),
            serde_json::json!({ "permits": sem.limit, "held": held }),
        );
    }
    if let Some(readers) = &parts.readers {
        let of = readers_name(name);
        let held: Vec<Value> = readers
            .held
            .iter()
            .map(|(i, s)| row(slot_name(&of, *i), &s.record, "slot", (*i).into()))
            .collect();
        map.insert(
            "readers".into(),
            serde_json::json!({ "max": readers.limit, "held": held }),
        );
    }
    if !parts.queue.is_empty() {
        let queue: Vec<Value> = parts
            .queue
            .iter()
            .map(|w| {
                row(
                    place_name(name, w.place),
                    &w.stored.record,
                    "ticket",
                    w.ticket,
                )
            })
            .collect();
        map.insert("queue".into(), Value::Array(queue));
    }
}

/// The parts as lines of `inspect`.
fn parts_text(out: &mut impl Write, parts: &Parts) {
    let now = parts.now;
    let line = |out: &mut dyn Write, label: String, r: &LockRecord| {
        let _ = writeln!(
            out,
            "  {label:<13}token {}, {} left, holder {}",
            r.fencing,
            output::duration(r.expires_at.saturating_since(now)),
            output::holder(r.holder.as_deref())
        );
    };
    if let Some(sem) = &parts.semaphore {
        let _ = writeln!(
            out,
            "semaphore:     {} permits, {} held",
            sem.limit,
            sem.held.len()
        );
        for (slot, s) in &sem.held {
            line(out, format!("permit {slot}:"), &s.record);
        }
    }
    if let Some(readers) = &parts.readers {
        let _ = writeln!(
            out,
            "readers:       {} of {} reading (a reader-writer lock; its writer holds the lock itself)",
            readers.held.len(),
            readers.limit
        );
        for (slot, s) in &readers.held {
            line(out, format!("reader {slot}:"), &s.record);
        }
    }
    if !parts.queue.is_empty() {
        let _ = writeln!(
            out,
            "queue:         {} waiting (a fair lock), in ticket order",
            parts.queue.len()
        );
        for w in &parts.queue {
            line(out, format!("ticket {}:", w.ticket), &w.stored.record);
        }
    }
}

/// Runs `inspect`: the full record of one lock (held, released or expired), or a note that the
/// storage has no record of it; and what the lock kinds keep beside it (a semaphore's permits,
/// a reader-writer lock's readers, a fair lock's queue).
pub async fn inspect(args: InspectArgs, url: Option<&str>, quiet: bool) -> Result<u8, Failure> {
    validate_name(&args.name)?;
    let opened = storage::open(url, HolderInfo::this_process(), quiet).await?;
    let storage: &dyn Storage = opened.storage.as_ref();
    let now = storage
        .now()
        .await
        .map_err(|e| Failure::storage("cannot read the storage clock", &e))?;
    let stored = storage
        .get(&args.name)
        .await
        .map_err(|e| Failure::storage("cannot read the lock", &e))?;
    let floor = storage
        .fencing_floor()
        .await
        .map_err(|e| Failure::storage("cannot read the fencing floor", &e))?;
    let parts = storage_lock::kinds::parts(&opened.locks, &args.name)
        .await
        .map_err(|e| Failure::lock("cannot read the lock's parts", &e))?;
    let Some(stored) = stored else {
        if args.json {
            let mut value = serde_json::json!({ "name": args.name, "state": "absent", "held": false, "fencing_floor": floor, "storage": opened.shown });
            if let Value::Object(map) = &mut value {
                parts_json(&args.name, &parts, map);
            }
            let _ = output::emit(value);
        } else if parts.is_empty() {
            let _ = output::emit(format_args!(
                "{}: no record (never taken, or swept) in {}; a first hold gets a fencing token above {floor}",
                output::escape(&args.name),
                opened.shown
            ));
        } else {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "name:          {}", output::escape(&args.name));
            let _ = writeln!(out, "state:         no record of the lock itself");
            parts_text(&mut out, &parts);
            let _ = writeln!(out, "storage:       {}", opened.shown);
        }
        return Ok(0);
    };
    let record = &stored.record;
    if args.json {
        let mut value = output::record_json(&args.name, record, now);
        if let Value::Object(map) = &mut value {
            map.insert("fencing_floor".into(), floor.into());
            map.insert("storage".into(), opened.shown.clone().into());
            parts_json(&args.name, &parts, map);
        }
        let _ = output::emit(value);
        return Ok(0);
    }
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "name:          {}", output::escape(&args.name));
    let _ = writeln!(out, "state:         {}", output::state(record, now));
    let _ = writeln!(out, "fencing token: {}", record.fencing);
    let _ = writeln!(out, "count:         {}", record.count);
    let _ = writeln!(out, "owner:         {}…", output::owner_prefix(record));
    let _ = writeln!(
        out,
        "acquired at:   {}",
        output::timestamp(record.acquired_at)
    );
    let label = if record.count == 0 {
        "released at:"
    } else {
        "expires at:"
    };
    let _ = writeln!(out, "{label:<15}{}", output::timestamp(record.expires_at));
    if record.is_held_at(now) {
        let left = record.expires_at.saturating_since(now);
        let _ = writeln!(out, "time left:     {}", output::duration(left));
    }
    let _ = writeln!(
        out,
        "holder:        {}",
        output::holder(record.holder.as_deref())
    );
    parts_text(&mut out, &parts);
    let _ = writeln!(out, "fencing floor: {floor}");
    let _ = writeln!(out, "storage:       {}", opened.shown);
    Ok(0)
}
