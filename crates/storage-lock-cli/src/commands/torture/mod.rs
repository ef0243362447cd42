//! `storage-lock torture`: a fault test of the user's own storage, from the outside.
//!
//! Worker processes (this binary, re-executed as [`WORKER`]) contend on a few lock names of the
//! storage. Under each hold a worker does a **non-atomic read-modify-write** of a counter kept by
//! a **checked register** this command serves on loopback: it reads the name's value, waits a
//! moment, and writes `value + 1` with the hold's fencing token. The register is fenced, as the
//! resources the lock protects should be: it refuses a write whose token is below the highest it
//! accepted for the name (a stale holder, fenced off: not a violation). Meanwhile this command
//! hurts the workers: `kill` (SIGKILL a worker, holding or not, and start a new one), `pause`
//! (SIGSTOP a worker for one and a half leases, then SIGCONT: it wakes up past its lease and
//! writes as if it still held the lock) and `cut` (the workers reach a network storage through
//! a loopback proxy of this command's, which closes every connection and blackholes new ones
//! for one and a half leases: holders cannot renew, nobody can acquire).
//!
//! # What counts as a violation
//! * **lost update**: a write with the highest token so far whose read is stale — another
//!   holder wrote between this holder's read and its write, and fencing did not stop it: two
//!   holds overlapped where it mattered.
//! * **repeated token**: a write with the same token as the last accepted one — two grants of
//!   the name carried one fencing token.
//!
//! Both are exact (no timing judgement): with a storage that keeps exclusion and fencing, neither
//! can happen whatever the faults. A storage that does not — processes that do not share it
//! (`memory:`), a store that forgets writes — shows them within seconds.
//!
//! # What it cannot cause
//! A failover, a disk loss or a network partition among the storage's own servers, a machine
//! pause, a cut of a cluster's connections (its clients learn the members' addresses past any
//! proxy): combine it with your own fault injection (restart your Redis, fail over your
//! PostgreSQL while it runs). Stale writes fenced off are reported, not counted as violations:
//! they are fencing doing its job.

mod proxy;
mod register;
mod worker;

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::net::TcpListener;
use tokio::process::{Child, Command};

use crate::cli::TortureArgs;
use crate::exit::{self, Failure};
use register::Tally;
pub use worker::worker_main;

/// The hidden subcommand a worker process runs.
pub const WORKER: &str = "__torture-worker";

/// The faults `--faults` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fault {
    /// SIGKILL a worker and start a new one.
    Kill,
    /// SIGSTOP a worker for one and a half leases, then SIGCONT.
    Pause,
    /// Close every worker's connection to the storage and blackhole new ones for one and a
    /// half leases (the workers reach a network storage through a proxy of this command's).
    Cut,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Self::Kill => "kill",
            Self::Pause => "pause",
            Self::Cut => "cut",
        }
    }
}

/// The lock kind the workers take (`--kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The exclusive lock.
    Exclusive,
    /// The fair lock ([`storage_lock::kinds::FairLock`]).
    Fair,
    /// A semaphore of N permits: each permit slot is checked as a name of its own (its holds
    /// exclude each other and their tokens rise).
    Semaphore(u32),
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Exclusive => f.write_str("exclusive"),
            Self::Fair => f.write_str("fair"),
            Self::Semaphore(n) => write!(f, "semaphore:{n}"),
        }
    }
}

/// Parses `--kind`: `exclusive`, `fair` or `semaphore:N` (N in 1..=64).
///
/// # Errors
/// Anything else, with the known kinds.
pub fn parse_kind(s: &str) -> Result<Kind, String> {
    match s {
        "exclusive" => Ok(Kind::Exclusive),
        "fair" => Ok(Kind::Fair),
        _ => match s.strip_prefix("semaphore:").map(str::parse::<u32>) {
            Some(Ok(n)) if (1..=64).contains(&n) => Ok(Kind::Semaphore(n)),
            _ => Err(format!(
                "unknown kind {s:?} (exclusive, fair or semaphore:N with N in 1..=64)"
            )),
        },
    }
}

/// The faults of a run, in the order they take turns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Faults(pub Vec<Fault>);

/// Parses `--faults`: a comma-separated list of `kill`, `pause`, `cut`, or `none`.
///
/// # Errors
/// An unknown fault, with the known ones.
pub fn parse_faults(s: &str) -> Result<Faults, String> {
    let mut faults = Vec::new();
    for f in s.split(',').map(str::trim).filter(|f| !f.is_empty()) {
        let fault = match f {
            "kill" => Fault::Kill,
            "pause" => Fault::Pause,
            "cut" => Fault::Cut,
            "none" => continue,
            other => {
                return Err(format!(
                    "unknown fault {other:?} (kill, pause, cut or none)"
                ));
            }
        };
        if !faults.contains(&fault) {
            faults.push(fault);
        }
    }
    Ok(Faults(faults))
}

/// `storage-lock torture`.
///
/// # Errors
/// Bad arguments (exit 2), a storage that cannot be opened (69), workers that cannot be
/// started (70).
pub async fn torture(args: TortureArgs, url: Option<&str>, quiet: bool) -> Result<u8, Failure> {
    let url = args.url.as_deref().or(url).map(str::to_owned);
    if !(1..=64).contains(&args.workers) {
        return Err(Failure::usage("--workers must be 1..=64"));
    }
    if !(1..=16).contains(&args.names) {
        return Err(Failure::usage("--names must be 1..=16"));
    }
    if args.lease < Duration::from_millis(100) {
        return Err(Failure::usage("--lease must be at least 100ms"));
    }
    // The storage must open here before workers start: a bad URL is one line, not N.
    let opened = crate::storage::open(
        url.as_deref(),
        storage_lock::backend::HolderInfo::this_process(),
        true,
    )
    .await?;
    let shown = opened.shown.clone();
    drop(opened);

    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| Failure::new(exit::INTERNAL, format!("cannot serve the register: {e}")))?;
    let register = listener
        .local_addr()
        .map_err(|e| Failure::new(exit::INTERNAL, format!("cannot serve the register: {e}")))?;
    let tally = Arc::new(Mutex::new(Tally::default()));
    let server = tokio::spawn(register::serve(listener, tally.clone()));
    let prefix = format!(
        "torture-{}-{:08x}/",
        std::process::id(),
        rand::random::<u32>()
    );
    // The proxy the workers reach the storage through, when the storage is on the network.
    let route = url.as_deref().map_or_else(
        || {
            Err(
                "cut needs a storage reached over the network, not the default SQLite file"
                    .to_owned(),
            )
        },
        proxy::route,
    );
    let faults = match &args.faults {
        Some(f) => f.0.clone(),
        None if route.is_ok() => vec![Fault::Kill, Fault::Pause, Fault::Cut],
        None => vec![Fault::Kill, Fault::Pause],
    };
    let proxy = if faults.contains(&Fault::Cut) {
        let route = route.map_err(Failure::usage)?;
        let proxy = proxy::Proxy::start(route.target.clone())
            .await
            .map_err(|e| Failure::new(exit::INTERNAL, format!("cannot start the proxy: {e}")))?;
        Some((route.through(proxy.addr), proxy))
    } else {
        None
    };
    let worker_url = proxy
        .as_ref()
        .map(|(through, _)| through.clone())
        .or_else(|| url.clone());
    if !quiet {
        eprintln!(
            "storage-lock: torturing {shown} for {}: {} workers taking {} locks on {} names, lease {}, faults {}",
            crate::output::duration(args.duration),
            args.workers,
            args.kind,
            args.names,
            crate::output::duration(args.lease),
            if faults.is_empty() {
                "none".to_owned()
            } else {
                faults
                    .iter()
                    .map(|f| f.name())
                    .collect::<Vec<_>>()
                    .join(",")
            }
        );
    }
    let spawn = |id: u32| -> Result<Child, Failure> {
        let exe = std::env::current_exe()
            .map_err(|e| Failure::new(exit::INTERNAL, format!("cannot start a worker: {e}")))?;
        let mut cmd = Command::new(exe);
        cmd.arg(WORKER)
            .arg(register.to_string())
            .arg(&prefix)
            .arg(args.names.to_string())
            .arg(args.lease.as_millis().to_string())
            .arg(id.to_string())
            .arg(args.kind.to_string())
            .arg(worker_url.as_deref().unwrap_or(""))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        cmd.spawn()
            .map_err(|e| Failure::new(exit::INTERNAL, format!("cannot start a worker: {e}")))
    };
    let mut workers = Vec::new();
    for id in 0..args.workers {
        workers.push(spawn(id)?);
    }
    let mut next_id = args.workers;
    let end = tokio::time::Instant::now() + args.duration;
    // A fault every 1.5 leases, on a random worker.
    let every = args.lease * 3 / 2;
    let mut round = 0_usize;
    while !faults.is_empty() {
        let at = tokio::time::Instant::now() + every;
        if at >= end {
            break;
        }
        tokio::time::sleep_until(at).await;
        let fault = faults[round % faults.len()];
        round += 1;
        let i = rand::random_range(0..workers.len());
        let Some(pid) = workers[i].id().and_then(|p| i32::try_from(p).ok()) else {
            continue;
        };
        match fault {
            Fault::Kill => {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                let _ = workers[i].wait().await;
                workers[i] = spawn(next_id)?;
                next_id += 1;
            }
            Fault::Pause => {
                let _ = kill(Pid::from_raw(pid), Signal::SIGSTOP);
                tokio::time::sleep(args.lease * 3 / 2).await;
                let _ = kill(Pid::from_raw(pid), Signal::SIGCONT);
            }
            Fault::Cut => {
                if let Some((_, proxy)) = &proxy {
                    proxy.cut_for(args.lease * 3 / 2).await;
                }
            }
        }
        *tally
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .faults
            .entry(fault.name())
            .or_default() += 1;
    }
    tokio::time::sleep_until(end).await;
    for w in &mut workers {
        let _ = w.start_kill();
    }
    for w in &mut workers {
        let _ = w.wait().await;
    }
    server.abort();
    let tally = std::mem::take(
        &mut *tally
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    Ok(verdict(&shown, &args, &faults, &tally))
}

/// Prints the verdict: exit 0 when nothing went wrong and something was exercised, else 1.
fn verdict(shown: &str, args: &TortureArgs, faults: &[Fault], t: &Tally) -> u8 {
    let ok = t.violations.is_empty() && t.accepted > 0;
    let faults_done: Vec<String> = faults
        .iter()
        .map(|f| {
            format!(
                "{} {}",
                f.name(),
                t.faults.get(f.name()).copied().unwrap_or(0)
            )
        })
        .collect();
    if args.json {
        let json = serde_json::json!({
            "storage": shown,
            "verdict": if ok { "ok" } else { "violated" },
            "seconds": args.duration.as_secs_f64(),
            "workers": args.workers,
            "kind": args.kind.to_string(),
            "names": args.names,
            "lease_ms": u64::try_from(args.lease.as_millis()).unwrap_or(u64::MAX),
            "grants": t.reads,
            "writes_accepted": t.accepted,
            "stale_writes_fenced_off": t.fenced_off,
            "faults": t.faults,
            "violations": t.violations,
        });
        println!("{json}");
    } else {
        println!("storage:    {shown}");
        println!(
            "ran:        {} with {} workers taking {} locks on {} names, lease {}",
            crate::output::duration(args.duration),
            args.workers,
            args.kind,
            args.names,
            crate::output::duration(args.lease)
        );
        println!(
            "faults:     {}",
            if faults_done.is_empty() {
                "none".to_owned()
            } else {
                faults_done.join(", ")
            }
        );
        println!(
            "grants:     {} (writes accepted {}, stale writes fenced off {})",
            t.reads, t.accepted, t.fenced_off
        );
        println!("violations: {}", t.violations.len());
        for v in t.violations.iter().take(20) {
            println!("  {v}");
        }
        if t.violations.len() > 20 {
            println!("  … and {} more", t.violations.len() - 20);
        }
        if ok {
            println!("verdict:    ok: no two holds overlapped unfenced, no fencing token repeated");
        } else if t.violations.is_empty() {
            println!("verdict:    nothing was exercised (no write reached the register)");
        } else {
            println!("verdict:    VIOLATED: this storage did not keep exclusion and fencing");
        }
    }
    if ok { 0 } else { 1 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_parse() {
        assert_eq!(
            parse_faults("kill,pause"),
            Ok(Faults(vec![Fault::Kill, Fault::Pause]))
        );
        assert_eq!(parse_faults("none"), Ok(Faults(vec![])));
        assert_eq!(parse_faults("pause, pause"), Ok(Faults(vec![Fault::Pause])));
        assert_eq!(parse_faults("cut"), Ok(Faults(vec![Fault::Cut])));
        assert!(parse_faults("skew").is_err());
    }

    #[test]
    fn kinds_parse_and_print_back() {
        for kind in [Kind::Exclusive, Kind::Fair, Kind::Semaphore(3)] {
            assert_eq!(parse_kind(&kind.to_string()), Ok(kind));
        }
        for bad in ["rw", "semaphore:0", "semaphore:65", "semaphore:x"] {
            assert!(parse_kind(bad).is_err(), "{bad}");
        }
    }
}
