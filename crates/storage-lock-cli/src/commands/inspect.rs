//! `list` and `inspect`: read-only views of the storage.
//!
//! Neither shows a full owner id (the secret of a hold): only its first 8 hex digits. Times left
//! are judged by the storage's clock ([`Storage::now`]), like the locks themselves.

use std::io::Write;
use storage_lock::backend::StorageExt;

use serde_json::Value;
use storage_lock::backend::{HolderInfo, PageRequest, Storage};

use super::validate_name;
use crate::cli::{InspectArgs, ListArgs};
use crate::exit::Failure;
use crate::{output, storage};

/// Runs `list`: the held locks whose name starts with the prefix, in name order.
pub async fn list(args: ListArgs, url: Option<&str>, quiet: bool) -> Result<u8, Failure> {
    let opened = storage::open(url, HolderInfo::this_process(), quiet).await?;
    let storage = opened.storage.as_ref();
    let now = storage
        .now()
        .await
        .map_err(|e| Failure::storage("cannot read the storage clock", &e))?;
    let mut held = Vec::new();
    let mut page = PageRequest::default();
    loop {
        let listed = storage
            .list_locks(&args.prefix, &page)
            .await
            .map_err(|e| Failure::storage("cannot list locks", &e))?;
        held.extend(
            listed
                .entries
                .into_iter()
                .filter(|(_, s)| s.record.is_held_at(now))
                .map(|(key, s)| (key, s.record)),
        );
        // One bad record is one line on stderr, not a failed listing.
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
            None => break,
        }
    }
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

/// Runs `inspect`: the full record of one lock (held, released or expired), or a note that the
/// storage has no record of it.
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
    let Some(stored) = stored else {
        if args.json {
            let _ = output::emit(
                serde_json::json!({ "name": args.name, "state": "absent", "held": false, "fencing_floor": floor, "storage": opened.shown }),
            );
        } else {
            let _ = output::emit(format_args!(
                "{}: no record (never taken, or swept) in {}; a first hold gets a fencing token above {floor}",
                output::escape(&args.name),
                opened.shown
            ));
        }
        return Ok(0);
    };
    let record = &stored.record;
    if args.json {
        let mut value = output::record_json(&args.name, record, now);
        if let Value::Object(map) = &mut value {
            map.insert("fencing_floor".into(), floor.into());
            map.insert("storage".into(), opened.shown.clone().into());
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
    let _ = writeln!(out, "fencing floor: {floor}");
    let _ = writeln!(out, "storage:       {}", opened.shown);
    Ok(0)
}
