//! `storage-lock run NAME -- CMD…`: hold a lock while a command runs.
//!
//! 1. Validates everything (name, `--lease`, `--renew` < `--lease`) before opening the storage.
//! 2. Installs SIGINT/SIGTERM/SIGHUP handlers, then waits for the lock (auto-renewed every
//!    `--renew`). A signal during the wait stops it (nothing is left held: the engine releases a
//!    grant that lands after the wait was dropped) and exits 128 + N. Busy until the wait ran out
//!    → `--conflict-exit-code` (75).
//! 3. Starts the command with `STORAGE_LOCK_NAME`, `STORAGE_LOCK_FENCING_TOKEN` and
//!    `STORAGE_LOCK_EXPIRES_AT` (RFC 3339 UTC, the expiry at acquisition) in its environment.
//! 4. While it runs: forwards SIGINT/SIGTERM/SIGHUP to it; if the lock is **lost** (renewal could
//!    not confirm the hold before the local deadline, e.g. storage unreachable or this process
//!    was paused past its lease), sends SIGTERM, then SIGKILL after `--kill-grace`, and exits 76
//!    once the command has ended.
//! 5. When the command exits, releases the lock and exits with the command's code (128 + N if a
//!    signal killed it).
//!
//! **Process groups.** When stdin is not a terminal (cron, CI, scripts), the command runs in a
//! process group of its own and signals go to that whole group, so its descendants stop too
//! when the lock is lost. When stdin is a terminal, the command stays in the terminal's
//! foreground group so it can read from it; the terminal then delivers Ctrl-C to it directly, so
//! SIGINT is not forwarded again, and signals reach the command itself but not its descendants.

use std::ffi::OsString;
use std::io::IsTerminal;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use storage_lock::{AcquireOptions, HolderInfo, LockHandle};
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::cli::RunArgs;
use crate::commands::{busy_notice, validate_lease, validate_name};
use crate::exit::{self, Failure};
use crate::signals::Signals;
use crate::{output, progress, storage};

/// Longest default note (the command line) stored with the hold.
const MAX_NOTE: usize = 200;

/// Runs `run`; returns the exit code.
pub async fn run(args: RunArgs, url: Option<&str>, quiet: bool) -> Result<u8, Failure> {
    validate_name(&args.name)?;
    validate_lease("--lease", args.lease)?;
    let renew = args.renew.unwrap_or(args.lease / 3);
    if renew.is_zero() || renew >= args.lease {
        return Err(Failure::usage(format!(
            "--renew ({}) must be greater than zero and shorter than --lease ({})",
            humantime::format_duration(renew),
            humantime::format_duration(args.lease),
        )));
    }
    let Some((program, program_args)) = args.command.split_first() else {
        return Err(Failure::usage("no command given after `--`"));
    };
    let note = args.note.clone().unwrap_or_else(|| {
        let line: Vec<_> = args.command.iter().map(|a| a.to_string_lossy()).collect();
        output::shorten(&line.join(" "), MAX_NOTE)
    });
    let options = AcquireOptions::default()
        .wait(args.wait.to_wait())
        .lease(args.lease)
        .auto_renew(renew)
        .note(note);

    let opened = storage::open(url, HolderInfo::this_process(), quiet).await?;
    let mut signals = Signals::new()?;
    let started = Instant::now();
    let acquire = progress::while_waiting(
        progress::enabled(quiet),
        opened.storage.as_ref(),
        &args.name,
        opened.locks.try_acquire(&args.name, &options),
    );
    let handle = tokio::select! {
        acquired = acquire => acquired.map_err(|e| Failure::lock("cannot acquire the lock", &e))?,
        signal = signals.recv() => {
            tracing::debug!(?signal, "interrupted while waiting");
            return Ok(exit::signaled(signal as i32));
        }
    };
    let Some(handle) = handle else {
        busy_notice(
            quiet,
            opened.storage.as_ref(),
            &args.name,
            started.elapsed(),
        )
        .await;
        return Ok(args.conflict_exit_code);
    };
    tracing::debug!(
        name = %args.name,
        fencing = handle.fencing_token(),
        waited = ?started.elapsed(),
        "acquired"
    );

    let interactive = std::io::stdin().is_terminal();
    let child = match spawn(program, program_args, &handle, interactive) {
        Ok(child) => child,
        Err(failure) => {
            release(&handle, quiet).await;
            return Err(failure);
        }
    };
    let code = supervise(child, &handle, &mut signals, &args, interactive, quiet).await;
    release(&handle, quiet).await;
    code
}

/// Starts the command with the lock's environment.
fn spawn(
    program: &OsString,
    args: &[OsString],
    handle: &LockHandle,
    interactive: bool,
) -> Result<Child, Failure> {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("STORAGE_LOCK_NAME", handle.name())
        .env(
            "STORAGE_LOCK_FENCING_TOKEN",
            handle.fencing_token().to_string(),
        )
        .env(
            "STORAGE_LOCK_EXPIRES_AT",
            output::rfc3339(handle.expires_at()),
        );
    if !interactive {
        cmd.process_group(0);
    }
    cmd.spawn().map_err(|e| {
        let code = match e.kind() {
            std::io::ErrorKind::NotFound => exit::NOT_FOUND,
            _ => exit::CANNOT_EXECUTE,
        };
        Failure::new(
            code,
            format!("cannot run {}: {e}", program.to_string_lossy()),
        )
    })
}

/// Where signals for the command go.
#[derive(Clone, Copy)]
enum Target {
    /// The command's own process group (non-interactive).
    Group(Pid),
    /// The command only (interactive).
    Process(Pid),
}

impl Target {
    fn send(self, signal: Signal) {
        let sent = match self {
            Self::Group(pid) => killpg(pid, signal),
            Self::Process(pid) => kill(pid, signal),
        };
        // ESRCH: it has just exited; `wait` will report that.
        if let Err(e) = sent {
            tracing::debug!(?signal, error = %e, "could not signal the command");
        }
    }
}

/// Waits for the command, forwarding signals and stopping it if the lock is lost.
async fn supervise(
    mut child: Child,
    handle: &LockHandle,
    signals: &mut Signals,
    args: &RunArgs,
    interactive: bool,
    quiet: bool,
) -> Result<u8, Failure> {
    let target = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw)
        .map(|pid| {
            if interactive {
                Target::Process(pid)
            } else {
                Target::Group(pid)
            }
        });
    let lost = handle.lost();
    tokio::pin!(lost);
    let mut was_lost = false;
    let mut kill_at: Option<Instant> = None;
    let status = loop {
        tokio::select! {
            biased;
            status = child.wait() => break status,
            signal = signals.recv() => {
                if interactive && signal == Signal::SIGINT {
                    continue; // the terminal delivered it to the command already
                }
                tracing::debug!(?signal, "forwarding");
                if let Some(target) = target {
                    target.send(signal);
                }
            }
            () = &mut lost, if !was_lost => {
                was_lost = true;
                if !quiet {
                    eprintln!(
                        "storage-lock: lock {:?} lost (fencing token {}); stopping the command \
                         (SIGTERM, SIGKILL after {})",
                        handle.name(),
                        handle.fencing_token(),
                        humantime::format_duration(args.kill_grace),
                    );
                }
                if let Some(target) = target {
                    target.send(Signal::SIGTERM);
                }
                kill_at = Some(Instant::now() + args.kill_grace);
            }
            () = tokio::time::sleep_until(kill_at.unwrap_or_else(Instant::now)), if kill_at.is_some() => {
                kill_at = None;
                if let Some(target) = target {
                    target.send(Signal::SIGKILL);
                }
            }
        }
    };
    let status = status
        .map_err(|e| Failure::new(exit::INTERNAL, format!("cannot wait for the command: {e}")))?;
    if was_lost {
        return Err(Failure::new(
            exit::LOST,
            format!(
                "lock {:?} was lost while the command ran (fencing token {}); the command {}",
                handle.name(),
                handle.fencing_token(),
                describe(status),
            ),
        ));
    }
    Ok(code_of(status))
}

/// The exit code that reports `status`: its code, or 128 + N for signal N.
fn code_of(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(u8::MAX),
        (None, Some(signal)) => exit::signaled(signal),
        (None, None) => exit::INTERNAL,
    }
}

fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(signal)) => format!("was killed by signal {signal}"),
        (None, None) => "ended".into(),
    }
}

/// Releases the hold; a failure is only reported (the lease frees the lock anyway).
async fn release(handle: &LockHandle, quiet: bool) {
    if let Err(e) = handle.release().await
        && !quiet
    {
        eprintln!(
            "storage-lock: warning: could not release lock {:?} (it frees itself when its lease ends): {}",
            handle.name(),
            Failure::lock("release", &e),
        );
    }
}
