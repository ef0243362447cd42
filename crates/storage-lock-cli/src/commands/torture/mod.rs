//! `storage-lock torture`: a fault test of the user's own storage, from the outside.
//!
//! Worker processes (this binary, re-executed as [`WORKER`]) contend on a few lock names of the
//! storage. Under each hold a worker does a **non-atomic read-modify-write** of a counter kept by
//! a **checked register** this command serves on loopback: it reads the name's value, waits a
//! moment, and writes `value + 1` with the hold's fencing token. The register is fenced, as the
//! resources the lock protects should be: it keeps the highest token it saw for the name, on a
//! read or a write, and refuses a write whose token is below it (a stale holder, fenced off:
//! not a violation). A fence raised by reads too is what stops a holder that was paused after
//! its last check and writes once its successor has begun: a fence raised only by writes lets
//! that write in whenever the successor has not written yet. Meanwhile this command
//! hurts the workers: `kill` (SIGKILL a worker, holding or not, and start a new one), `pause`
//! (SIGSTOP a worker for one and a half leases, then SIGCONT: it wakes up past its lease and
//! writes as if it still held the lock), `cut` (the workers reach a network storage through
//! a loopback proxy of this command's, which closes every connection and blackholes new ones
//! for one and a half leases: holders cannot renew, nobody can acquire) and `skew` (replace a
//! worker with one whose wall clock runs an hour ahead or behind, under libfaketime; its
//! monotonic and boot clocks left alone, as an NTP step would: on a storage whose expiry is
//! its own decision, a skewed contender must find held locks busy).
//!
//! Before each write the worker asks its handle whether the hold is lost, and tells the
//! register, with the boot-clock time it asked at (one clock for every process on the
//! machine). A hold must turn lost before any later grant of its name is in force.
//!
//! # What counts as a violation
//! * **repeated token**: a write with the same token as the last accepted one — two grants of
//!   the name carried one fencing token.
//! * **lost hold not reported**: a handle said "not lost" after a later grant of its name had
//!   read the register — two holds believed themselves valid at once; or, where that later
//!   token was in use before this hold even began, **token went backwards**.
//! * with `--kind rw`, when the run ends: a reader and a writer whose intervals (from the
//!   first request to the last "not lost") overlap, and a writer whose token is not above that
//!   of a reader that read before it.
//!
//! All are exact (the timing ones compare readings of one clock, taken in a known order): with
//! a storage that keeps exclusion and fencing, none can happen whatever the faults. A storage
//! that does not — processes that do not share it (`memory:`), a store broken on purpose by
//! `--mutate` ([`mutant`]) — shows them within seconds.
//!
//! There is no separate "lost update" check, because it could never fire: a holder's read
//! raises the fence to its token, so a write that came between its read and its write either
//! carried a higher token (and this write is fenced off) or the same one (a repeated token).
//! Overlapping holds that matter show up as one of the violations above.
//!
//! # The report
//! `--report DIR` writes the run's history (`history.jsonl`: every read, write, fault and
//! violation with its time in milliseconds on the boot clock since the run began, which the
//! verdict's `started_unix_ms` puts on the wall clock), the verdict (`verdict.json`) and
//! `report.html`, a self-contained
//! timeline (one lane per worker process, holds as bars with their tokens, faults marked,
//! violations in red) that any browser opens from the file.
//!
//! # What it cannot cause
//! A failover, a disk loss or a network partition among the storage's own servers, a machine
//! pause, a cut of a cluster's connections (its clients learn the members' addresses past any
//! proxy): combine it with your own fault injection (restart your Redis, fail over your
//! PostgreSQL while it runs). Stale writes fenced off are reported, not counted as violations:
//! they are fencing doing its job.

pub mod mutant;
mod proxy;
mod register;
mod report;
mod worker;

use std::io::IsTerminal;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::net::TcpListener;
use tokio::process::{Child, Command};

use crate::cli::TortureArgs;
use crate::exit::{self, Failure};
use register::{Event, Tally};
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
    /// Replace a worker with one whose wall clock runs an hour ahead or behind (libfaketime).
    Skew,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Self::Kill => "kill",
            Self::Pause => "pause",
            Self::Cut => "cut",
            Self::Skew => "skew",
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
    /// The reader-writer lock ([`storage_lock::kinds::RwLock`]): one take in three writes;
    /// readers are checked against writers when the run ends.
    Rw,
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Exclusive => f.write_str("exclusive"),
            Self::Fair => f.write_str("fair"),
            Self::Semaphore(n) => write!(f, "semaphore:{n}"),
            Self::Rw => f.write_str("rw"),
        }
    }
}

/// Parses `--kind`: `exclusive`, `fair`, `semaphore:N` (N in 1..=64) or `rw`.
///
/// # Errors
/// Anything else, with the known kinds.
pub fn parse_kind(s: &str) -> Result<Kind, String> {
    match s {
        "exclusive" => Ok(Kind::Exclusive),
        "fair" => Ok(Kind::Fair),
        "rw" => Ok(Kind::Rw),
        _ => match s.strip_prefix("semaphore:").map(str::parse::<u32>) {
            Some(Ok(n)) if (1..=64).contains(&n) => Ok(Kind::Semaphore(n)),
            _ => Err(format!(
                "unknown kind {s:?} (exclusive, fair, rw or semaphore:N with N in 1..=64)"
            )),
        },
    }
}

/// The faults of a run, in the order they take turns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Faults(pub Vec<Fault>);

/// Parses `--faults`: a comma-separated list of `kill`, `pause`, `cut`, `skew`, or `none`.
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
            "skew" => Fault::Skew,
            "none" => continue,
            other => {
                return Err(format!(
                    "unknown fault {other:?} (kill, pause, cut, skew or none)"
                ));
            }
        };
        if !faults.contains(&fault) {
            faults.push(fault);
        }
    }
    Ok(Faults(faults))
}

/// libfaketime's preload library, if it is installed: `STORAGE_LOCK_LIBFAKETIME`, else
/// `libfaketime.so.1` under `/usr/lib/<multiarch>/faketime/` (Debian's `faketime` package),
/// `/usr/lib/faketime/` or `/usr/local/lib/faketime/`.
///
/// It is preloaded directly ([`skewed_clock_env`]), not through the `faketime` wrapper, so the
/// skewed process is the worker itself: its PID names what libfaketime leaves in `/dev/shm`,
/// which torture removes when it kills the worker (see `Worker::forget_faketime`).
pub fn libfaketime() -> Option<std::path::PathBuf> {
    if let Some(path) = std::env::var_os("STORAGE_LOCK_LIBFAKETIME") {
        return Some(path.into());
    }
    let multiarch = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.path().join("faketime"));
    multiarch
        .chain(["/usr/lib/faketime", "/usr/local/lib/faketime"].map(std::path::PathBuf::from))
        .map(|dir| dir.join("libfaketime.so.1"))
        .find(|path| path.is_file())
}

/// The environment that runs a process with its wall clock `skew` away (`+3600s`, `-1h`) under
/// `lib` ([`libfaketime`]): the wall clock only; the monotonic and boot clocks, which time
/// holds, stay true (as under an NTP step).
pub fn skewed_clock_env(
    lib: &std::path::Path,
    skew: &str,
) -> [(&'static str, std::ffi::OsString); 3] {
    [
        ("LD_PRELOAD", lib.into()),
        ("FAKETIME", skew.into()),
        ("DONT_FAKE_MONOTONIC", "1".into()),
    ]
}

/// A running worker process and its id (its lane in the report).
/// A worker process, alone in a process group of its own, and signalled as a group, so that
/// nothing it starts outlives a kill or escapes a pause. Dropping it kills the group.
struct Worker {
    id: u32,
    child: Child,
    /// The PID of a worker under libfaketime (see [`Worker::forget_faketime`]).
    skewed: Option<u32>,
}

impl Worker {
    /// libfaketime 0.9.10 keeps a POSIX semaphore and a shared-memory segment named after the
    /// process's PID in `/dev/shm` and removes them only when the process exits on its own; a
    /// killed skewed worker leaves them behind, and a later process under libfaketime that is
    /// given the same PID fails at start (`sem_open: File exists`, seen in a CI run). Removing
    /// the names once the worker is killed leaves nothing behind.
    fn forget_faketime(&self) {
        if let Some(pid) = self.skewed {
            let _ = std::fs::remove_file(format!("/dev/shm/sem.faketime_sem_{pid}"));
            let _ = std::fs::remove_file(format!("/dev/shm/faketime_shm_{pid}"));
        }
    }

    /// Sends `signal` to the worker's process group (nothing once it was reaped).
    fn signal(&self, signal: Signal) {
        if let Some(pid) = self.child.id().and_then(|p| i32::try_from(p).ok()) {
            let _ = killpg(Pid::from_raw(pid), signal);
        }
    }

    /// Kills the worker's whole group and reaps the worker.
    async fn kill(&mut self) {
        self.signal(Signal::SIGKILL);
        let _ = self.child.wait().await;
        self.forget_faketime();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.signal(Signal::SIGKILL);
        self.forget_faketime();
    }
}

/// How to start worker processes.
struct Spawner {
    exe: std::path::PathBuf,
    /// The fixed arguments after the id: see [`worker::worker_main`].
    register: String,
    prefix: String,
    names: String,
    lease_ms: String,
    kind: String,
    mutation: String,
    url: String,
    libfaketime: Option<std::path::PathBuf>,
    next_id: u32,
    tally: Arc<Mutex<Tally>>,
}

impl Spawner {
    /// Starts a worker, with its wall clock `skew` away (`+3600s`, `-3600s`) when given.
    fn spawn(&mut self, skew: Option<String>) -> Result<Worker, Failure> {
        let id = self.next_id;
        self.next_id += 1;
        let mut cmd = Command::new(&self.exe);
        if let (Some(skew), Some(lib)) = (&skew, &self.libfaketime) {
            cmd.envs(skewed_clock_env(lib, skew));
        }
        cmd.arg(WORKER)
            .args([&self.register, &self.prefix, &self.names, &self.lease_ms])
            .arg(id.to_string())
            .args([&self.kind, &self.mutation, &self.url])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .kill_on_drop(true);
        let child = cmd
            .spawn()
            .map_err(|e| Failure::new(exit::INTERNAL, format!("cannot start a worker: {e}")))?;
        let mut tally = lock(&self.tally);
        let ms = tally.now_ms();
        let skewed = skew.is_some().then(|| child.id()).flatten();
        tally.record(Event::Worker {
            ms,
            worker: id,
            skew,
        });
        Ok(Worker { id, child, skewed })
    }
}

/// Records that `worker`'s process is gone.
fn exited(tally: &Mutex<Tally>, worker: u32) {
    let mut tally = lock(tally);
    let ms = tally.now_ms();
    tally.record(Event::Exit { ms, worker });
}

/// The tally, whoever panicked while holding it.
fn lock(tally: &Mutex<Tally>) -> std::sync::MutexGuard<'_, Tally> {
    tally
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `storage-lock torture`.
///
/// # Errors
/// Bad arguments (exit 2), a storage that cannot be opened (69), workers that cannot be
/// started or a report that cannot be written (70).
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
    if args.mutate.is_some() && opened.storage.primitives().is_none() {
        return Err(Failure::usage(
            "--mutate breaks a storage's compare-and-set primitives; a lock server's URL has none (mutate the storage behind it)",
        ));
    }
    drop(opened);
    let libfaketime = libfaketime();
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
        None => [Fault::Kill, Fault::Pause, Fault::Cut, Fault::Skew]
            .into_iter()
            .filter(|f| match f {
                Fault::Cut => route.is_ok(),
                Fault::Skew => libfaketime.is_some(),
                _ => true,
            })
            .collect(),
    };
    if faults.contains(&Fault::Skew) && libfaketime.is_none() {
        return Err(Failure::usage(
            "skew needs libfaketime (Debian: apt install faketime; or STORAGE_LOCK_LIBFAKETIME=/path/to/libfaketime.so.1)",
        ));
    }
    let report_dir = match &args.report {
        Some(dir) => Some(report::prepare(dir)?),
        None => None,
    };

    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| Failure::new(exit::INTERNAL, format!("cannot serve the register: {e}")))?;
    let register = listener
        .local_addr()
        .map_err(|e| Failure::new(exit::INTERNAL, format!("cannot serve the register: {e}")))?;
    let tally = Arc::new(Mutex::new(Tally::starting_now()));
    let server = tokio::spawn(register::serve(listener, tally.clone()));
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
    let fault_names = if faults.is_empty() {
        "none".to_owned()
    } else {
        faults
            .iter()
            .map(|f| f.name())
            .collect::<Vec<_>>()
            .join(",")
    };
    if !quiet {
        eprintln!(
            "storage-lock: torturing {shown} for {}: {} workers taking {} locks on {} names, lease {}, faults {fault_names}{}",
            crate::output::duration(args.duration),
            args.workers,
            args.kind,
            args.names,
            crate::output::duration(args.lease),
            args.mutate
                .map(|m| format!(", the storage mutated ({})", m.name()))
                .unwrap_or_default(),
        );
    }
    let mut spawner = Spawner {
        exe: std::env::current_exe()
            .map_err(|e| Failure::new(exit::INTERNAL, format!("cannot start a worker: {e}")))?,
        register: register.to_string(),
        prefix: format!(
            "torture-{}-{:08x}/",
            std::process::id(),
            rand::random::<u32>()
        ),
        names: args.names.to_string(),
        lease_ms: args.lease.as_millis().to_string(),
        kind: args.kind.to_string(),
        mutation: args
            .mutate
            .map_or("none", mutant::Mutation::name)
            .to_owned(),
        url: worker_url.unwrap_or_default(),
        libfaketime,
        next_id: 0,
        tally: tally.clone(),
    };
    let mut workers = Vec::new();
    for _ in 0..args.workers {
        workers.push(spawner.spawn(None)?);
    }
    let progress = (!quiet && !args.json && std::io::stderr().is_terminal())
        .then(|| tokio::spawn(progress(tally.clone(), args.duration)));
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
        let mut target = workers[i].id;
        let start = lock(&tally).now_ms();
        let on_worker = match fault {
            Fault::Kill | Fault::Skew => {
                workers[i].kill().await;
                exited(&tally, target);
                // An hour either way: past any lease, so a wall clock that decided anything
                // would decide wrong.
                let skew = (fault == Fault::Skew).then(|| {
                    if round.is_multiple_of(2) {
                        "+3600s"
                    } else {
                        "-3600s"
                    }
                    .to_owned()
                });
                workers[i] = spawner.spawn(skew)?;
                if fault == Fault::Skew {
                    // The skewed clock is the fault, on the new worker's lane.
                    target = workers[i].id;
                }
                true
            }
            Fault::Pause => {
                workers[i].signal(Signal::SIGSTOP);
                tokio::time::sleep(args.lease * 3 / 2).await;
                workers[i].signal(Signal::SIGCONT);
                true
            }
            Fault::Cut => {
                if let Some((_, proxy)) = &proxy {
                    proxy.cut_for(args.lease * 3 / 2).await;
                }
                false
            }
        };
        let mut tally = lock(&tally);
        let until_ms = tally.now_ms();
        tally.record(Event::Fault {
            ms: start,
            fault: fault.name(),
            worker: on_worker.then_some(target),
            until_ms,
        });
        *tally.faults.entry(fault.name()).or_default() += 1;
    }
    tokio::time::sleep_until(end).await;
    for w in &mut workers {
        w.kill().await;
        exited(&tally, w.id);
    }
    server.abort();
    if let Some(progress) = progress {
        progress.abort();
        eprint!("\r\x1b[2K");
    }
    let mut tally = std::mem::take(&mut *lock(&tally));
    tally.finish();
    let (ok, json) = summary(&shown, &args, &faults, &tally);
    if let Some(dir) = &report_dir {
        report::write(dir, &json, &tally)?;
        if !quiet {
            eprintln!(
                "storage-lock: report written to {}",
                dir.join("report.html").display()
            );
        }
    }
    if args.json {
        println!("{json}");
    } else {
        print_verdict(&json, &tally, ok);
    }
    Ok(if ok { 0 } else { 1 })
}

/// Redraws a one-line progress bar on stderr (a terminal's) until aborted.
async fn progress(tally: Arc<Mutex<Tally>>, duration: Duration) {
    let start = tokio::time::Instant::now();
    loop {
        let done = start.elapsed().min(duration);
        let line = {
            let t = lock(&tally);
            let width = 30_u32;
            let filled =
                u32::try_from(done.as_millis() * u128::from(width) / duration.as_millis().max(1))
                    .unwrap_or(width);
            format!(
                "\r\x1b[2K[{}{}] {}/{}  grants {}  faults {}  violations {}",
                "#".repeat(filled as usize),
                ".".repeat((width - filled.min(width)) as usize),
                crate::output::duration(Duration::from_secs(done.as_secs())),
                crate::output::duration(duration),
                t.reads,
                t.faults.values().sum::<u64>(),
                t.violations.len()
            )
        };
        eprint!("{line}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The verdict as JSON, and whether it is good: nothing went wrong and something was exercised.
fn summary(
    shown: &str,
    args: &TortureArgs,
    faults: &[Fault],
    t: &Tally,
) -> (bool, serde_json::Value) {
    let ok = t.violations.is_empty() && t.accepted > 0;
    let json = serde_json::json!({
        "storage": shown,
        "verdict": if ok { "ok" } else { "violated" },
        "seconds": args.duration.as_secs_f64(),
        "started_unix_ms": t.started_unix_ms,
        "workers": args.workers,
        "kind": args.kind.to_string(),
        "names": args.names,
        "lease_ms": u64::try_from(args.lease.as_millis()).unwrap_or(u64::MAX),
        "mutated": args.mutate.map(mutant::Mutation::name),
        "grants": t.reads,
        "writes_accepted": t.accepted,
        "stale_writes_fenced_off": t.fenced_off,
        "writes_by_holds_reported_lost": t.lost_reported,
        "faults": faults
            .iter()
            .map(|f| (f.name(), t.faults.get(f.name()).copied().unwrap_or(0)))
            .collect::<std::collections::BTreeMap<_, _>>(),
        "violations": t.violations,
    });
    (ok, json)
}

/// Prints the verdict for people (one screen).
fn print_verdict(v: &serde_json::Value, t: &Tally, ok: bool) {
    println!("storage:    {}", v["storage"].as_str().unwrap_or_default());
    println!(
        "ran:        {} with {} workers taking {} locks on {} names, lease {}{}",
        crate::output::duration(Duration::from_secs_f64(
            v["seconds"].as_f64().unwrap_or(0.0)
        )),
        v["workers"],
        v["kind"].as_str().unwrap_or_default(),
        v["names"],
        crate::output::duration(Duration::from_millis(v["lease_ms"].as_u64().unwrap_or(0))),
        v["mutated"]
            .as_str()
            .map(|m| format!(", the storage mutated ({m})"))
            .unwrap_or_default()
    );
    let faults: Vec<String> = v["faults"]
        .as_object()
        .map(|f| f.iter().map(|(k, n)| format!("{k} {n}")).collect())
        .unwrap_or_default();
    println!(
        "faults:     {}",
        if faults.is_empty() {
            "none".to_owned()
        } else {
            faults.join(", ")
        }
    );
    println!(
        "grants:     {} (writes accepted {}, stale writes fenced off {}, by holds that knew they were lost {})",
        t.reads, t.accepted, t.fenced_off, t.lost_reported
    );
    println!("violations: {}", t.violations.len());
    for v in t.violations.iter().take(20) {
        println!("  {v}");
    }
    if t.violations.len() > 20 {
        println!("  … and {} more", t.violations.len() - 20);
    }
    if ok {
        println!(
            "verdict:    ok: no two holds overlapped unfenced, no fencing token repeated, every lost hold knew it"
        );
    } else if t.violations.is_empty() {
        println!("verdict:    nothing was exercised (no write reached the register)");
    } else {
        println!("verdict:    VIOLATED: this storage did not keep exclusion and fencing");
    }
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
        assert_eq!(parse_faults("skew"), Ok(Faults(vec![Fault::Skew])));
        assert!(parse_faults("flood").is_err());
    }

    #[test]
    fn kinds_parse_and_print_back() {
        for kind in [Kind::Exclusive, Kind::Fair, Kind::Semaphore(3), Kind::Rw] {
            assert_eq!(parse_kind(&kind.to_string()), Ok(kind));
        }
        for bad in ["rwx", "semaphore:0", "semaphore:65", "semaphore:x"] {
            assert!(parse_kind(bad).is_err(), "{bad}");
        }
    }
}
