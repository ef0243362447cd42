//! `storage-lock torture`: a fault test of the user's own storage, from the outside.
//!
//! Worker processes (this binary, re-executed as [`WORKER`]) contend on a few lock names of the
//! storage. Under each hold a worker does a **non-atomic read-modify-write** of a counter kept by
//! a **checked register** this command serves on loopback: it reads the name's value, waits a
//! moment, and writes `value + 1` with the hold's fencing token. The register is fenced, as the
//! resources the lock protects should be: it refuses a write whose token is below the highest it
//! accepted for the name (a stale holder, fenced off: not a violation). Meanwhile this command
//! hurts the workers: `kill` (SIGKILL a worker, holding or not, and start a new one) and `pause`
//! (SIGSTOP a worker for one and a half leases, then SIGCONT: it wakes up past its lease and
//! writes as if it still held the lock).
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
//! A failover, a disk loss or a network partition of the storage's own servers, a machine
//! pause: combine it with your own fault injection (restart your Redis, fail over your
//! PostgreSQL while it runs). Stale writes fenced off are reported, not counted as violations:
//! they are fencing doing its job.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};

use crate::cli::TortureArgs;
use crate::exit::{self, Failure};

/// The hidden subcommand a worker process runs.
pub const WORKER: &str = "__torture-worker";

/// The faults `--faults` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fault {
    /// SIGKILL a worker and start a new one.
    Kill,
    /// SIGSTOP a worker for one and a half leases, then SIGCONT.
    Pause,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Self::Kill => "kill",
            Self::Pause => "pause",
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

/// Parses `--faults`: a comma-separated list of `kill`, `pause`, or `none`.
///
/// # Errors
/// An unknown fault, with the known ones.
pub fn parse_faults(s: &str) -> Result<Faults, String> {
    let mut faults = Vec::new();
    for f in s.split(',').map(str::trim).filter(|f| !f.is_empty()) {
        let fault = match f {
            "kill" => Fault::Kill,
            "pause" => Fault::Pause,
            "none" => continue,
            other => return Err(format!("unknown fault {other:?} (kill, pause or none)")),
        };
        if !faults.contains(&fault) {
            faults.push(fault);
        }
    }
    Ok(Faults(faults))
}

/// What the register saw and the faults caused.
#[derive(Debug, Default)]
struct Tally {
    reads: u64,
    accepted: u64,
    fenced_off: u64,
    violations: Vec<String>,
    faults: HashMap<&'static str, u64>,
}

/// One name's state in the register.
#[derive(Debug, Default)]
struct Cell {
    value: u64,
    /// The highest token of an accepted write (0: none yet).
    token: u64,
}

/// The register's answer to one request line.
fn answer(cells: &mut HashMap<String, Cell>, tally: &mut Tally, line: &str) -> String {
    let parts: Vec<&str> = line.split_whitespace().collect();
    match parts.as_slice() {
        ["R", name] => {
            tally.reads += 1;
            cells
                .entry((*name).to_owned())
                .or_default()
                .value
                .to_string()
        }
        ["W", name, read, token, worker] => {
            let (Ok(read), Ok(token)) = (read.parse::<u64>(), token.parse::<u64>()) else {
                return "error".to_owned();
            };
            let cell = cells.entry((*name).to_owned()).or_default();
            if token < cell.token {
                tally.fenced_off += 1;
                return "stale".to_owned();
            }
            if token == cell.token {
                tally.violations.push(format!(
                    "repeated token: worker {worker} wrote {name:?} with token {token}, the token of the last accepted write"
                ));
                return "violation".to_owned();
            }
            if read != cell.value {
                tally.violations.push(format!(
                    "lost update: worker {worker} (token {token}) read {name:?} = {read}, but a write with token {} made it {} before this write",
                    cell.token, cell.value
                ));
                // Keep the register consistent with the accepted write: the next checks stay exact.
                cell.value = read;
            }
            cell.value += 1;
            cell.token = token;
            tally.accepted += 1;
            "ok".to_owned()
        }
        _ => "error".to_owned(),
    }
}

/// Serves the register on `listener` until the process ends.
async fn serve_register(listener: TcpListener, tally: Arc<Mutex<Tally>>) {
    let cells = Arc::new(Mutex::new(HashMap::new()));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let (cells, tally) = (cells.clone(), tally.clone());
        tokio::spawn(async move {
            let (read, mut write) = stream.into_split();
            let mut lines = BufReader::new(read).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let reply = {
                    let mut cells = cells
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    let mut tally = tally
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    answer(&mut cells, &mut tally, &line)
                };
                if write
                    .write_all(format!("{reply}\n").as_bytes())
                    .await
                    .is_err()
                {
                    break;
                }
            }
        });
    }
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
    let server = tokio::spawn(serve_register(listener, tally.clone()));
    let prefix = format!(
        "torture-{}-{:08x}/",
        std::process::id(),
        rand::random::<u32>()
    );
    let faults = args.faults.0.clone();
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
            .arg(url.as_deref().unwrap_or(""))
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

/// A worker process: `__torture-worker REGISTER PREFIX NAMES LEASE_MS ID KIND URL` (an empty
/// URL: the default storage). Returns its exit code.
pub fn worker_main(args: &[String]) -> u8 {
    let [register, prefix, names, lease_ms, id, kind, url] = args else {
        eprintln!("storage-lock: {WORKER} is internal to `storage-lock torture`");
        return exit::USAGE;
    };
    let (Ok(names), Ok(lease_ms), Ok(kind)) = (
        names.parse::<u32>(),
        lease_ms.parse::<u64>(),
        parse_kind(kind),
    ) else {
        return exit::USAGE;
    };
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return exit::INTERNAL;
    };
    let url = (!url.is_empty()).then_some(url.as_str());
    let lease = Duration::from_millis(lease_ms);
    runtime.block_on(async move {
        match work(register, prefix, names, lease, id, kind, url).await {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("storage-lock: torture worker {id}: {e}");
                exit::INTERNAL
            }
        }
    })
}

/// A worker's hold: a lock's or a semaphore permit's.
enum Held {
    Lock(storage_lock::LockHandle),
    Permit(storage_lock::kinds::Permit),
}

impl Held {
    async fn release(self) {
        let _ = match self {
            Self::Lock(h) => h.release().await,
            Self::Permit(p) => p.release().await,
        };
    }
}

/// Takes `name` as `kind` says: the hold, the name the register checks (a semaphore's slot
/// is a name of its own) and the token; `None` when it stayed busy.
async fn take(
    locks: &storage_lock::StorageLock,
    kind: Kind,
    name: &str,
    options: &storage_lock::AcquireOptions,
) -> Result<Option<(Held, String, u64)>, storage_lock::LockError> {
    use storage_lock::kinds::{FairLock, Semaphore, slot_name};
    Ok(match kind {
        Kind::Exclusive => locks
            .try_acquire(name, options)
            .await?
            .map(|h| (h.fencing_token(), Held::Lock(h)))
            .map(|(t, h)| (h, name.to_owned(), t)),
        Kind::Fair => FairLock::new(locks, name)?
            .acquire(options)
            .await?
            .map(|h| (h.fencing_token(), Held::Lock(h)))
            .map(|(t, h)| (h, name.to_owned(), t)),
        Kind::Semaphore(n) => Semaphore::new(locks, name, n)?
            .acquire(options)
            .await?
            .map(|p| {
                let (slot, token) = p.fencing_token();
                (Held::Permit(p), slot_name(name, slot), token)
            }),
    })
}

/// A worker's loop: take a random name, read the register, wait, write with the token,
/// release; until the register goes away.
async fn work(
    register: &str,
    prefix: &str,
    names: u32,
    lease: Duration,
    id: &str,
    kind: Kind,
    url: Option<&str>,
) -> Result<(), String> {
    let opened = crate::storage::open(url, storage_lock::backend::HolderInfo::this_process(), true)
        .await
        .map_err(|e| e.to_string())?;
    let stream = TcpStream::connect(register)
        .await
        .map_err(|e| format!("the register: {e}"))?;
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    let options = storage_lock::AcquireOptions::default()
        .lease(lease)
        .auto_renew(lease / 3)
        .wait(storage_lock::Wait::For(lease * 4));
    loop {
        let name = format!("{prefix}{}", rand::random_range(0..names));
        let (held, checked, token) = match take(&opened.locks, kind, &name, &options).await {
            Ok(Some(taken)) => taken,
            Ok(None) => continue,
            // A storage error under faults: try again (the verdict counts grants, not tries).
            Err(_) => {
                tokio::time::sleep(lease / 10).await;
                continue;
            }
        };
        write
            .write_all(format!("R {checked}\n").as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let Some(value) = lines.next_line().await.map_err(|e| e.to_string())? else {
            return Ok(());
        };
        // Stay a moment: a pause or a kill lands inside holds, and holders meet.
        tokio::time::sleep(Duration::from_millis(rand::random_range(
            0..=lease_ms_tenth(lease),
        )))
        .await;
        write
            .write_all(format!("W {checked} {value} {token} {id}\n").as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        if lines
            .next_line()
            .await
            .map_err(|e| e.to_string())?
            .is_none()
        {
            return Ok(());
        }
        held.release().await;
    }
}

/// A tenth of `lease` in milliseconds.
fn lease_ms_tenth(lease: Duration) -> u64 {
    u64::try_from(lease.as_millis() / 10).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_register_fences_stale_writes_and_reports_what_fencing_missed() {
        let (mut cells, mut t) = (HashMap::new(), Tally::default());
        assert_eq!(answer(&mut cells, &mut t, "R a"), "0");
        assert_eq!(answer(&mut cells, &mut t, "W a 0 5 w1"), "ok");
        // A stale holder (lower token) is refused: fencing did its job.
        assert_eq!(answer(&mut cells, &mut t, "W a 0 4 w2"), "stale");
        assert!(t.violations.is_empty());
        // The same token twice: two grants with one token.
        assert_eq!(answer(&mut cells, &mut t, "W a 1 5 w3"), "violation");
        // A higher token whose read is stale: two holds overlapped unfenced.
        assert_eq!(answer(&mut cells, &mut t, "W a 0 6 w4"), "ok");
        assert_eq!(t.violations.len(), 2, "{:?}", t.violations);
        assert_eq!((t.accepted, t.fenced_off), (2, 1));
        assert_eq!(answer(&mut cells, &mut t, "nonsense"), "error");
    }

    #[test]
    fn faults_parse() {
        assert_eq!(
            parse_faults("kill,pause"),
            Ok(Faults(vec![Fault::Kill, Fault::Pause]))
        );
        assert_eq!(parse_faults("none"), Ok(Faults(vec![])));
        assert_eq!(parse_faults("pause, pause"), Ok(Faults(vec![Fault::Pause])));
        assert!(parse_faults("cut").is_err());
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
