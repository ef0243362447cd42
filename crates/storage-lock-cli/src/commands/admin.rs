//! Operator commands: `break` (free a stuck lock) and `check` (what a storage promises).

use std::io::{BufRead, IsTerminal, Write};

use storage_lock::{Durability, HolderInfo, TimeSource};

use crate::cli::{BreakArgs, CheckArgs};
use crate::commands::validate_name;
use crate::exit::{self, Failure};
use crate::{output, storage};

/// Runs `break NAME`: shows the holder, asks on a terminal (else needs `--yes`), frees the lock
/// whoever holds it. The fencing token is kept, so the next holder's token is higher; the evicted
/// holder notices at its next renewal. Prints `broke NAME (held by …, fencing token N)` or
/// `NAME was not held`.
pub async fn break_lock(args: BreakArgs, url: Option<&str>, quiet: bool) -> Result<u8, Failure> {
    validate_name(&args.name)?;
    let interactive = std::io::stdin().is_terminal();
    if !args.yes && !interactive {
        return Err(Failure::usage(
            "break frees a lock whoever holds it: pass --yes (stdin is not a terminal to ask on)",
        ));
    }
    let opened = storage::open(url, HolderInfo::this_process(), quiet).await?;
    let current = opened
        .storage
        .get(&args.name)
        .await
        .map_err(|e| Failure::storage("cannot read the lock", &e))?;
    let now = opened
        .storage
        .now()
        .await
        .map_err(|e| Failure::storage("cannot read the storage clock", &e))?;
    let Some(held) = current.filter(|c| c.record.is_held_at(now)) else {
        let _ = output::emit(format_args!("{} was not held", output::quoted(&args.name)));
        return Ok(0);
    };
    let who = format!(
        "{} (fencing token {}, {} left)",
        output::holder(held.record.holder.as_deref()),
        held.record.fencing,
        output::duration(held.record.expires_at.saturating_since(now)),
    );
    if !args.yes {
        eprint!(
            "storage-lock: break {} held by {who}? [y/N] ",
            output::quoted(&args.name)
        );
        let _ = std::io::stderr().flush();
        let mut answer = String::new();
        let _ = std::io::stdin().lock().read_line(&mut answer);
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            return Err(Failure::new(exit::CONFLICT, "not broken"));
        }
    }
    match opened.locks.force_release(&args.name).await {
        Ok(Some(ended)) => {
            let _ = output::emit(format_args!(
                "broke {} (held by {}, fencing token {})",
                output::quoted(&args.name),
                output::holder(ended.holder.as_deref()),
                ended.fencing
            ));
            Ok(0)
        }
        Ok(None) => {
            let _ = output::emit(format_args!("{} was not held", output::quoted(&args.name)));
            Ok(0)
        }
        Err(e) => Err(Failure::lock("cannot break the lock", &e)),
    }
}

/// What each backend documents about its lock operations' round trips.
fn round_trips(backend: &str) -> &'static str {
    match backend {
        "memory" => "0 (one mutex hold in this process)",
        "sqlite" => "1 / 1 / 1 (one statement each)",
        "postgres" => "1 / 1 / 1 (one statement each, on the server clock; a busy acquire 2)",
        "mysql" => "2 / 1 / 1 (no RETURNING from an upsert)",
        "redis" => "1 / 1 / 1 (one Lua script each, on Redis TIME)",
        _ => "see the backend's documentation",
    }
}

/// Runs `check [URL]`: prints the backend, its clock, durability and capabilities, one per
/// line; exits 78 if the storage cannot keep the lock's guarantees (it can forget writes, it is
/// process-local, its compare-and-set is not linearizable, it has no clock) and 0 otherwise.
/// A storage that refuses to open on such settings exits 78 with its reason.
pub async fn check(args: CheckArgs, url: Option<&str>, quiet: bool) -> Result<u8, Failure> {
    let url = args.url.as_deref().or(url);
    let opened = storage::open(url, HolderInfo::this_process(), quiet).await?;
    let caps = opened.storage.capabilities();
    let clock = match caps.time_source {
        TimeSource::Server => "the storage's own clock",
        TimeSource::Injected => "an injected clock",
        _ => "none",
    };
    let durability = match caps.durability {
        Durability::Durable => "durable (acknowledged writes survive a crash)",
        Durability::Unverified => "unverified (the server's settings could not be read)",
        _ => {
            "VOLATILE (accepted with durability=volatile: a restart can break exclusion and fencing)"
        }
    };
    let yes_no = |b: bool| if b { "yes" } else { "no" };
    let lines = [
        format!("backend: {}", opened.storage.name()),
        format!("clock: {clock}"),
        format!("durability: {durability}"),
        format!(
            "linearizable compare-and-set: {}",
            yes_no(caps.linearizable_cas)
        ),
        format!(
            "exclusion across processes: {}",
            yes_no(!caps.process_local)
        ),
        format!(
            "conditional delete (sweep): {}",
            yes_no(caps.conditional_delete)
        ),
        format!(
            "change notifications (hand-off without polling): {}",
            yes_no(caps.change_notifications)
        ),
        format!(
            "round trips per acquire / renew / release: {}",
            round_trips(opened.storage.name())
        ),
    ];
    for line in lines {
        let _ = output::emit(line);
    }
    let mut problems = Vec::new();
    if !caps.linearizable_cas {
        problems.push("its compare-and-set is not linearizable");
    }
    if caps.process_local {
        problems.push("it excludes nothing across processes");
    }
    if caps.time_source == TimeSource::None {
        problems.push("it has no clock to judge expiry by");
    }
    if caps.durability == Durability::Volatile {
        problems.push("it can forget held locks and fencing tokens on a restart");
    }
    if problems.is_empty() {
        let _ = output::emit("verdict: ok");
        Ok(0)
    } else {
        Err(Failure::new(
            exit::CONFIG,
            format!(
                "this storage cannot keep the lock's guarantees: {}",
                problems.join("; ")
            ),
        ))
    }
}
