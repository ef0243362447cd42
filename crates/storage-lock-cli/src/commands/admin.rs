//! Operator commands: `break` (free a stuck lock) and `check` (what a storage promises).

use std::io::{BufRead, IsTerminal, Write};

use storage_lock::backend::{Durability, HolderInfo, TimeSource};

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

/// `check`'s verdict: `ok` (exit 0), `unverified` (the storage's durability could not be
/// read and the URL does not accept that: exit 78) or `unsafe` (it cannot keep the lock's
/// guarantees: exit 78).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Ok,
    Unverified,
    Unsafe,
}

/// Runs `check [URL]`: prints the storage it judged (the resolved URL, without a password),
/// the backend (for a lock server, the one behind it), its clock, durability and capabilities,
/// one per line or as one JSON object (`--json`), and the verdict. Exits 0 on `ok`; 78 when
/// the storage cannot keep the lock's guarantees (it can forget writes, it is process-local,
/// its compare-and-set is not linearizable, it has no clock) or when its durability is
/// unverified and the URL does not say `durability=unverified`. A storage that refuses to open
/// on such settings exits 78 with its reason.
pub async fn check(args: CheckArgs, url: Option<&str>, _quiet: bool) -> Result<u8, Failure> {
    let url = args.url.as_deref().or(url);
    // `check` reports what `open` would warn about itself.
    let opened = storage::open(url, HolderInfo::this_process(), true).await?;
    let caps = opened.storage.capabilities();
    let round_trips = caps
        .round_trips
        .unwrap_or("not stated by the backend (see its documentation)");
    let backend = opened.storage.name();
    let behind = opened
        .storage
        .delegated_admin()
        .map(|admin| admin.backend().to_owned());
    let mut problems = Vec::new();
    if !caps.linearizable_cas {
        problems.push("its compare-and-set is not linearizable".to_owned());
    }
    if caps.process_local {
        problems.push("it excludes nothing across processes".to_owned());
    }
    if caps.time_source == TimeSource::None {
        problems.push("it has no clock to judge expiry by".to_owned());
    }
    if caps.durability == Durability::Volatile || caps.process_local {
        problems.push("it can forget held locks and fencing tokens on a restart".to_owned());
    }
    let unverified = caps.durability == Durability::Unverified && !caps.process_local;
    let verdict = if !problems.is_empty() {
        Verdict::Unsafe
    } else if unverified && !opened.unverified_accepted {
        Verdict::Unverified
    } else {
        Verdict::Ok
    };
    let (clock, clock_text) = match caps.time_source {
        TimeSource::Server => ("storage", "the storage's own clock"),
        TimeSource::Observed => (
            "observed",
            "none shared: a contender takes a hold over only after seeing the same version of \
             it for the whole lease left in it, on its own monotonic clock (wall clocks play no \
             part)",
        ),
        TimeSource::Injected => (
            "client",
            "each client's own clock (one that runs ahead of the others by d ends their \
             holds up to d early: keep clocks in sync)",
        ),
        _ => ("none", "none"),
    };
    let (durability, durability_text) = if caps.process_local {
        (
            "volatile",
            "volatile (process-local: it lives as long as this process)".to_owned(),
        )
    } else {
        match caps.durability {
            Durability::Durable => (
                "durable",
                "durable (acknowledged writes survive a crash)".to_owned(),
            ),
            Durability::Unverified => (
                "unverified",
                format!("unverified ({})", storage::unverified_reason(&caps)),
            ),
            _ => (
                "volatile",
                "VOLATILE (accepted with durability=volatile: a restart can break exclusion and \
                 fencing)"
                    .to_owned(),
            ),
        }
    };
    let verdict_name = match verdict {
        Verdict::Ok => "ok",
        Verdict::Unverified => "unverified",
        Verdict::Unsafe => "unsafe",
    };
    if args.json {
        let value = serde_json::json!({
            "storage": opened.shown,
            "backend": backend,
            "server_storage": behind,
            "clock": clock,
            "durability": durability,
            "durability_note": if unverified { caps.durability_note } else { None },
            "unverified_accepted": unverified && opened.unverified_accepted,
            "linearizable_cas": caps.linearizable_cas,
            "process_local": caps.process_local,
            "conditional_delete": caps.conditional_delete,
            "change_notifications": caps.change_notifications,
            "round_trips": round_trips,
            "verdict": verdict_name,
            "problems": problems,
        });
        let _ = output::emit(value);
    } else {
        let yes_no = |b: bool| if b { "yes" } else { "no" };
        let backend_text = match &behind {
            Some(behind) => format!("{backend} (a lock server; its storage: {behind})"),
            None => backend.to_owned(),
        };
        let verdict_text = match verdict {
            Verdict::Ok if unverified => {
                "ok (durability unverified, accepted by durability=unverified in the URL)"
            }
            _ => verdict_name,
        };
        let lines = [
            format!("storage: {}", opened.shown),
            format!("backend: {backend_text}"),
            format!("clock: {clock_text}"),
            format!("durability: {durability_text}"),
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
            format!("round trips per acquire / renew / release: {round_trips}"),
            format!("verdict: {verdict_text}"),
        ];
        for line in lines {
            let _ = output::emit(line);
        }
    }
    match verdict {
        Verdict::Ok => Ok(0),
        Verdict::Unverified => Err(Failure::new(
            exit::CONFIG,
            storage::unverified_warning(&caps),
        )),
        Verdict::Unsafe => Err(Failure::new(
            exit::CONFIG,
            format!(
                "this storage cannot keep the lock's guarantees: {}",
                problems.join("; ")
            ),
        )),
    }
}
