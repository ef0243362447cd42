//! `storage-lock run NAME -- CMD…`: hold a lock while a command runs.
//!
//! 1. Validates everything (name, `--lease`, `--renew`, `--kill-grace`) before opening the
//!    storage.
//! 2. Installs handlers for the forwarded signals (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1,
//!    SIGUSR2, SIGALRM), then waits for the lock (auto-renewed every `--renew`). One of them
//!    during the wait stops it (nothing is left held: the engine releases a grant that lands
//!    after the wait was dropped) and exits 128 + N. Busy until the wait ran out →
//!    `--conflict-exit-code` (75), silently under `--no-wait` unless `-v` (like `flock -n`).
//! 3. Starts the dead-man switch ([`crate::sentinel`]), then the command in a **process group
//!    of its own**, with `STORAGE_LOCK_NAME`, `STORAGE_LOCK_FENCING_TOKEN` and
//!    `STORAGE_LOCK_EXPIRES_AT` (RFC 3339 UTC, the expiry at acquisition) in its environment.
//! 4. While it runs: forwards the signals above to the command's group, and **stops the command
//!    by the lock's local deadline** ([`LockHandle::time_left`], re-read at least every 100 ms,
//!    so every renewal moves it): SIGTERM to the group at deadline − `--kill-grace`, SIGKILL at
//!    the deadline. A renewal is due long before (`--renew` + `--kill-grace` ≤ 90 % of the
//!    lease), so this happens only when renewals fail (storage unreachable, this process
//!    stopped) or the lock is lost (then SIGKILL at most `--kill-grace` after SIGTERM, never
//!    after the deadline). Exits 76 once the group is gone.
//! 5. When the command exits, processes it left in its group (`cmd &`) are stopped the same
//!    way (SIGTERM, SIGKILL after `--kill-grace`) before the lock is released, so nothing the
//!    command started runs unlocked; `--wait-for-group` waits for them instead (still bounded by
//!    the deadline). Then releases the lock and exits with the command's code (128 + N if
//!    signal N killed it).
//!
//! **If `run` itself is killed or stopped**, the sentinel — a separate process outside both
//! `run`'s and the command's process groups, fed the deadline after every renewal — stops the
//! command's group: SIGTERM at once and SIGKILL after `--kill-grace` if `run` died, SIGTERM at
//! deadline − grace and SIGKILL at the deadline if `run` stopped feeding it.
//!
//! **What no supervisor can stop**: a machine that is paused or frozen as a whole (VM pause,
//! suspend), whose processes all resume after the storage gave the lock to someone else;
//! processes that left the command's process group (`setsid`, job control). Pass
//! `$STORAGE_LOCK_FENCING_TOKEN` with every write to the protected resource and let it reject
//! tokens lower than the highest it has seen: that is what makes a late write harmless.
//!
//! **Terminals.** When stdin is a terminal and `run` is in its foreground group, the command's
//! group becomes the terminal's foreground group (`tcsetpgrp`) while it runs, so it reads from
//! the terminal and Ctrl-C / Ctrl-\ reach its whole group directly; the terminal is given back
//! when the command exits. Ctrl-Z stops the command's group but not `run`, which keeps renewing
//! (resume the command with `kill -CONT`); the deadline rules above still apply.

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use storage_lock::backend::HolderInfo;
use storage_lock::kinds::{ReadGuard, RwLock, WriteGuard};
use storage_lock::{AcquireOptions, Busy, LockError, LockHandle};
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::cli::RunArgs;
use crate::commands::{busy_notice, validate_lease, validate_name};
use crate::exit::{self, Failure};
use crate::group::{Group, Terminal, boottime_nanos};
use crate::sentinel::Sentinel;
use crate::signals::Signals;
use crate::{output, progress, storage};

/// The default `--kill-grace` when the lease allows it.
const DEFAULT_KILL_GRACE: Duration = Duration::from_secs(10);
/// How often the deadline is re-read at most (and fed to the sentinel).
const MAX_POLL: Duration = Duration::from_millis(100);
/// How often a command's leftover group is checked while it is being stopped.
const DRAIN_POLL: Duration = Duration::from_millis(20);
/// After SIGKILL, how long to wait for the group to vanish before releasing anyway (a process
/// in uninterruptible sleep dies when it wakes up; nothing can be done about it meanwhile).
const AFTER_KILL: Duration = Duration::from_secs(1);

/// `run`'s validated timing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// The lease.
    pub lease: Duration,
    /// The renewal interval.
    pub renew: Duration,
    /// SIGTERM this long before the local deadline; SIGKILL at it.
    pub kill_grace: Duration,
}

impl Timing {
    /// Checks `--lease`, `--renew` and `--kill-grace` (see the README for the rules):
    /// `0 < renew < lease`, `kill_grace ≤ lease / 2`, `renew + kill_grace ≤ 90 % of lease`.
    /// The default kill grace is 10 s, at most a quarter of the lease and at most what the
    /// last rule leaves.
    pub fn new(
        lease: Duration,
        renew: Option<Duration>,
        kill_grace: Option<Duration>,
    ) -> Result<Self, Failure> {
        validate_lease("--lease", lease)?;
        let fmt = |d: Duration| humantime::format_duration(d).to_string();
        let renew = renew.unwrap_or(lease / 3);
        if renew.is_zero() || renew >= lease {
            return Err(Failure::usage(format!(
                "--renew ({}) must be greater than zero and shorter than --lease ({})",
                fmt(renew),
                fmt(lease),
            )));
        }
        let room = lease - lease / 10;
        let kill_grace = kill_grace.unwrap_or_else(|| {
            DEFAULT_KILL_GRACE
                .min(lease / 4)
                .min(room.saturating_sub(renew))
        });
        if kill_grace > lease / 2 {
            return Err(Failure::usage(format!(
                "--kill-grace ({}) must be at most half of --lease ({})",
                fmt(kill_grace),
                fmt(lease),
            )));
        }
        if renew.checked_add(kill_grace).is_none_or(|sum| sum > room) {
            return Err(Failure::usage(format!(
                "--renew ({}) + --kill-grace ({}) must be at most 90% of --lease ({}), so a \
                 renewal lands before the command is told to stop",
                fmt(renew),
                fmt(kill_grace),
                fmt(lease),
            )));
        }
        Ok(Self {
            lease,
            renew,
            kill_grace,
        })
    }

    /// How often to re-read the deadline: at most 100 ms, and often enough that a renewal is
    /// seen well before deadline − grace.
    fn poll(self) -> Duration {
        let slack = (self.lease - self.lease / 10).saturating_sub(self.renew + self.kill_grace)
            + self.lease / 20;
        (slack / 4).clamp(Duration::from_millis(1), MAX_POLL)
    }
}

/// Runs `run`; returns the exit code.
pub async fn run(
    args: RunArgs,
    url: Option<&str>,
    quiet: bool,
    verbose: u8,
) -> Result<u8, Failure> {
    hold_and_run(args, url, quiet, verbose, false).await
}

/// Runs `elect`'s command: as [`run`], holding the name's exclusive lock itself (the election's
/// seat), never its reader-writer lock.
pub async fn run_elected(
    args: RunArgs,
    url: Option<&str>,
    quiet: bool,
    verbose: u8,
) -> Result<u8, Failure> {
    if args.shared {
        return Err(Failure::usage(
            "elect takes no -s: a candidate holds the election's seat alone",
        ));
    }
    hold_and_run(args, url, quiet, verbose, true).await
}

/// [`run`]; `plain`: hold the name's exclusive lock, not its reader-writer lock.
async fn hold_and_run(
    args: RunArgs,
    url: Option<&str>,
    quiet: bool,
    verbose: u8,
    plain: bool,
) -> Result<u8, Failure> {
    validate_name(&args.name)?;
    let timing = Timing::new(args.lease, args.renew, args.kill_grace)?;
    let argv = args.argv();
    let Some((program, program_args)) = argv.split_first() else {
        return Err(Failure::usage("no command given after `--`"));
    };
    let note = args.note.clone().unwrap_or_else(|| default_note(program));
    let options = AcquireOptions::default()
        .wait(args.wait.to_wait())
        .lease(timing.lease)
        .auto_renew(timing.renew)
        .note(note);

    let opened = storage::open(url, HolderInfo::this_process(), quiet).await?;
    let mode = if plain {
        Mode::Plain
    } else {
        Mode::of(&args, &opened)?
    };
    let mut signals = Signals::new()?;
    let started = Instant::now();
    let acquire = progress::while_waiting(
        progress::enabled(quiet),
        opened.storage.as_ref(),
        &args.name,
        mode.acquire(&opened, &args.name, &options),
    );
    let held = tokio::select! {
        acquired = acquire => acquired.map_err(|e| Failure::lock("cannot acquire the lock", &e))?,
        signal = signals.recv() => {
            tracing::debug!(?signal, "interrupted while waiting");
            return Ok(exit::signaled(signal as i32));
        }
    };
    let held = match held {
        Ok(held) => held,
        Err(busy) => {
            // Like `flock -n`: a busy lock under --no-wait is an expected outcome, silent
            // unless -v.
            let silent = args.wait.no_wait && verbose == 0;
            let busy = match busy {
                Some(busy) => Some(busy),
                None => mode.busy(&opened, &args.name).await,
            };
            let waited = started.elapsed();
            match busy {
                Some(busy) => busy_notice(quiet || silent, &busy, &args.name, waited),
                None if quiet || silent => {}
                None => eprintln!(
                    "storage-lock: lock {:?} not acquired after {}: held by shared (-s) runs",
                    args.name,
                    output::duration(waited),
                ),
            }
            return Ok(args.conflict_exit_code);
        }
    };
    let handle = held.handle();
    let token = held.fencing_token();
    tracing::debug!(
        name = %args.name,
        ?mode,
        fencing = token,
        waited = ?started.elapsed(),
        "acquired"
    );

    let mut sentinel = match start_sentinel(handle, &args.name, timing) {
        Ok(sentinel) => sentinel,
        Err(failure) => {
            release(handle, &args.name, quiet).await;
            return Err(failure);
        }
    };
    if let Some(owner) = handle.owner() {
        sentinel.hold(url, handle.key(), owner);
    }
    let terminal = Terminal::foreground();
    let child = match spawn(program, program_args, &held, &args.name, terminal.is_some()) {
        Ok(child) => child,
        Err(failure) => {
            sentinel.done();
            release(handle, &args.name, quiet).await;
            return Err(failure);
        }
    };
    let Some(group) = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(|id| Group(Pid::from_raw(id)))
    else {
        sentinel.done();
        release(handle, &args.name, quiet).await;
        return Err(Failure::new(
            exit::INTERNAL,
            "the command has no process id",
        ));
    };
    sentinel.watch(group);
    if let Some(terminal) = &terminal {
        terminal.give_to(group);
    }
    let mut supervisor = Supervisor {
        handle,
        name: &args.name,
        token,
        group,
        sentinel: &mut sentinel,
        terminal: terminal.as_ref(),
        timing,
        wait_for_group: args.wait_for_group,
        quiet,
    };
    let code = supervisor.supervise(child, &mut signals).await;
    if let Some(terminal) = &terminal {
        terminal.take_back();
    }
    sentinel.done();
    let ours = release(handle, &args.name, quiet).await;
    match code {
        // The hold was broken, swept or taken over after the last renewal (or on a storage
        // without change notifications): the command ran part of its time without the lock.
        Ok(code) if ours == Some(false) => Err(Failure::new(
            exit::LOST,
            format!(
                "lock {} was no longer held by this run when the command ended (broken, swept \
                 or taken over; fencing token {}); the command exited with {code}",
                output::quoted(&args.name),
                token,
            ),
        )),
        code => code,
    }
}

/// The note stored when `--note` is not given: the program's file name, never its arguments
/// (they may hold secrets, and `list` shows notes to everyone who can read the storage).
fn default_note(program: &OsString) -> String {
    let path = std::path::Path::new(program);
    let name = path.file_name().unwrap_or(program.as_os_str());
    output::shorten(&name.to_string_lossy(), 100)
}

/// Starts the dead-man switch with the hold's current deadline. Refuses to go on without it.
fn start_sentinel(handle: &LockHandle, name: &str, timing: Timing) -> Result<Sentinel, Failure> {
    let boot = boottime_nanos()
        .map_err(|e| Failure::new(exit::INTERNAL, format!("cannot read CLOCK_BOOTTIME: {e}")))?;
    let Some(left) = handle.time_left() else {
        return Err(Failure::new(
            exit::LOST,
            format!(
                "lock {} was lost before the command could start",
                output::quoted(name)
            ),
        ));
    };
    Sentinel::start(boot.saturating_add(left.as_nanos()), timing.kill_grace).map_err(|e| {
        Failure::new(
            exit::INTERNAL,
            format!("cannot start the dead-man switch (the command was not started): {e}"),
        )
    })
}

/// Starts the command with the lock's environment, in a process group of its own; with
/// `foreground`, through [`crate::group::FOREGROUND_EXEC`], so that its group is the terminal's
/// foreground group before the command runs.
fn spawn(
    program: &OsString,
    args: &[OsString],
    held: &Held,
    name: &str,
    foreground: bool,
) -> Result<Child, Failure> {
    // Without this binary's path the command starts directly and gets the terminal a moment
    // after it starts.
    let trampoline = foreground
        .then(|| crate::group::own_binary().ok())
        .flatten();
    let mut cmd = match &trampoline {
        Some(exe) => {
            let mut cmd = Command::new(exe);
            cmd.arg(crate::group::FOREGROUND_EXEC).arg(program);
            cmd
        }
        None => Command::new(program),
    };
    cmd.args(args)
        .env("STORAGE_LOCK_NAME", name)
        .env(
            "STORAGE_LOCK_FENCING_TOKEN",
            held.fencing_token().to_string(),
        )
        .env(
            "STORAGE_LOCK_EXPIRES_AT",
            output::rfc3339(held.handle().expires_at()),
        )
        .process_group(0);
    cmd.spawn().map_err(|e| Failure::cannot_run(program, &e))
}

/// How `run` holds its name, like flock(1) holds a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `-s`: one of many readers of the name's reader-writer lock ([`RwLock::read`]).
    Shared,
    /// The default and `-x`: the writer of the name's reader-writer lock ([`RwLock::write`]):
    /// it waits for shared runs, and shared runs wait for it.
    Exclusive,
    /// `elect`, and the default and `-x` on a storage that cannot keep a reader-writer lock's
    /// limit record (none of the CLI's: every one has compare-and-set primitives, or is a lock
    /// server's URL whose server keeps it): the exclusive lock of the name, the reader-writer
    /// lock's gate.
    Plain,
}

impl Mode {
    /// The mode `args` ask for, on `opened`'s storage.
    fn of(args: &RunArgs, opened: &storage::Opened) -> Result<Self, Failure> {
        // Through a lock server's URL too: its server keeps the readers' limit record.
        let rw =
            opened.storage.primitives().is_some() || opened.storage.delegated_admin().is_some();
        match (args.shared, rw) {
            (true, true) => Ok(Self::Shared),
            (true, false) => Err(Failure::usage(format!(
                "shared (-s) runs need a storage that keeps a reader-writer lock's limit \
                 record; {} cannot",
                opened.shown
            ))),
            (false, true) => Ok(Self::Exclusive),
            (false, false) => Ok(Self::Plain),
        }
    }

    /// Takes the hold: `Err(Some(busy))` when the storage said who holds it, `Err(None)` when
    /// the wait ran out without saying (see [`Self::busy`]).
    async fn acquire(
        self,
        opened: &storage::Opened,
        name: &str,
        options: &AcquireOptions,
    ) -> Result<Result<Held, Option<Busy>>, LockError> {
        let rw = || RwLock::new(&opened.locks, name);
        Ok(match self {
            Self::Plain => opened
                .locks
                .try_acquire_or_busy(name, options)
                .await?
                .map(Held::Plain)
                .map_err(Some),
            Self::Exclusive => rw()?.write(options).await?.map(Held::Write).ok_or(None),
            Self::Shared => rw()?.read(options).await?.map(Held::Read).ok_or(None),
        })
    }

    /// Who keeps `name` from this mode, as far as one read of its gate tells: an exclusive
    /// run that holds or waits (its holder and lease), else (`None`) shared runs.
    async fn busy(self, opened: &storage::Opened, name: &str) -> Option<Busy> {
        let key = opened.locks.key_for(name).ok()?;
        let gate = opened.storage.get(&key).await.ok()??;
        let now = opened.storage.now().await.ok()?;
        (gate.record.count > 0 && gate.record.expires_at > now).then(|| Busy {
            holder: gate.record.holder.clone(),
            left: gate.record.expires_at.saturating_since(now),
        })
    }
}

/// A run's hold.
enum Held {
    Plain(LockHandle),
    Write(WriteGuard),
    Read(ReadGuard),
}

impl Held {
    /// The hold renewed, watched and released: the gate, or a shared run's reader slot.
    fn handle(&self) -> &LockHandle {
        match self {
            Self::Plain(h) => h,
            Self::Write(w) => w.handle(),
            Self::Read(r) => r.handle(),
        }
    }

    /// The run's fencing token (a shared run's: its read's, see [`RwLock`]).
    fn fencing_token(&self) -> u64 {
        match self {
            Self::Plain(h) => h.fencing_token(),
            Self::Write(w) => w.fencing_token(),
            Self::Read(r) => r.fencing_token(),
        }
    }
}

/// Why `run` is stopping the command's group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    /// Renewals were not confirmed and the deadline − grace came.
    Deadline,
    /// The hold is lost.
    Lost,
    /// The command exited and left processes in its group.
    Leftovers,
}

/// The state of one supervised command.
struct Supervisor<'a> {
    handle: &'a LockHandle,
    /// The run's lock name (a shared run's hold is one of its reader slots).
    name: &'a str,
    /// The run's fencing token (a shared run's is its read's, not its slot's).
    token: u64,
    group: Group,
    sentinel: &'a mut Sentinel,
    terminal: Option<&'a Terminal>,
    timing: Timing,
    wait_for_group: bool,
    quiet: bool,
}

/// What the supervisor has done so far.
#[derive(Debug, Default)]
struct Stopping {
    /// Why SIGTERM was sent (`None`: not sent).
    why: Option<Why>,
    /// When to send SIGKILL.
    kill_at: Option<Instant>,
    /// When SIGKILL was sent.
    killed_at: Option<Instant>,
}

impl Supervisor<'_> {
    /// Waits for the command and its group, forwarding signals and stopping them by the
    /// deadline (see the module docs).
    async fn supervise(&mut self, mut child: Child, signals: &mut Signals) -> Result<u8, Failure> {
        let grace = self.timing.kill_grace;
        let lost = self.handle.lost();
        tokio::pin!(lost);
        let mut is_lost = false;
        let mut deadline = Instant::now().checked_add(self.handle.time_left().unwrap_or_default());
        let mut status: Option<ExitStatus> = None;
        let mut stop = Stopping::default();
        loop {
            let now = Instant::now();
            if !is_lost {
                match self.refresh() {
                    Some(d) => deadline = d,
                    None => is_lost = true,
                }
            }
            // Decide.
            if is_lost && stop.why != Some(Why::Lost) {
                let kill_at = min_opt(deadline, now.checked_add(grace));
                self.stop(&mut stop, Why::Lost, kill_at);
            } else if stop.why.is_none_or(|w| w == Why::Leftovers)
                && deadline
                    .and_then(|d| d.checked_sub(grace))
                    .is_some_and(|t| now >= t)
            {
                self.stop(&mut stop, Why::Deadline, deadline);
            }
            if let Some(kill_at) = stop.kill_at
                && stop.killed_at.is_none()
                && now >= kill_at
            {
                tracing::debug!(pgid = %self.group.0, "SIGKILL");
                self.group.signal(Signal::SIGKILL);
                stop.killed_at = Some(now);
            }
            if status.is_some() {
                let given_up = stop
                    .killed_at
                    .is_some_and(|k| now.saturating_duration_since(k) >= AFTER_KILL);
                if given_up || !self.group.alive() {
                    break;
                }
            }
            // Sleep until the next thing to do.
            let poll = if status.is_some() {
                DRAIN_POLL
            } else {
                self.timing.poll()
            };
            let mut wake = now.checked_add(poll).unwrap_or(now);
            if stop.why.is_none_or(|w| w == Why::Leftovers)
                && let Some(term_at) = deadline.and_then(|d| d.checked_sub(grace))
            {
                wake = wake.min(term_at);
            }
            if stop.killed_at.is_none()
                && let Some(kill_at) = stop.kill_at
            {
                wake = wake.min(kill_at);
            }
            tokio::select! {
                biased;
                exited = child.wait(), if status.is_none() => {
                    let exited = exited.map_err(|e| {
                        Failure::new(exit::INTERNAL, format!("cannot wait for the command: {e}"))
                    })?;
                    status = Some(exited);
                    if let Some(terminal) = self.terminal {
                        terminal.take_back();
                    }
                    if stop.why.is_none() && !self.wait_for_group && self.group.alive() {
                        let kill_at = min_opt(deadline, Instant::now().checked_add(grace));
                        self.stop(&mut stop, Why::Leftovers, kill_at);
                    }
                }
                signal = signals.recv() => {
                    tracing::debug!(?signal, "forwarding");
                    self.group.signal(signal);
                }
                () = &mut lost, if !is_lost => is_lost = true,
                () = tokio::time::sleep_until(wake) => {}
            }
        }
        let status = status.unwrap_or_else(|| ExitStatus::from_raw(0));
        match stop.why {
            Some(why @ (Why::Lost | Why::Deadline)) => Err(Failure::new(
                exit::LOST,
                format!(
                    "lock {} {} while the command ran (fencing token {}); the command {}",
                    output::quoted(self.name),
                    if why == Why::Lost {
                        "was lost"
                    } else {
                        "could not be renewed in time"
                    },
                    self.token,
                    describe(status),
                ),
            )),
            _ if is_lost || self.handle.time_left().is_none() => Err(Failure::new(
                exit::LOST,
                format!(
                    "lock {} was lost while the command ran (fencing token {}); the command {}",
                    output::quoted(self.name),
                    self.token,
                    describe(status),
                ),
            )),
            _ => Ok(code_of(status)),
        }
    }

    /// Re-reads the local deadline and feeds it to the sentinel; `None` if the hold is lost.
    /// `Some(None)`: a deadline too far to represent (no deadline).
    fn refresh(&mut self) -> Option<Option<Instant>> {
        // Both clocks are read before `time_left`, so both deadlines err early, never late.
        let now = Instant::now();
        let boot = boottime_nanos().ok();
        let left = self.handle.time_left()?;
        if let Some(boot) = boot {
            self.sentinel.deadline(boot.saturating_add(left.as_nanos()));
        }
        Some(now.checked_add(left))
    }

    /// Sends SIGTERM to the group (unless sent already) and schedules SIGKILL no later than
    /// `kill_at`.
    fn stop(&mut self, stop: &mut Stopping, why: Why, kill_at: Option<Instant>) {
        let first = stop.why.is_none();
        stop.why = Some(why);
        stop.kill_at = match (stop.kill_at, kill_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        if !self.quiet {
            let name = output::quoted(self.name);
            let token = self.token;
            let grace = humantime::format_duration(self.timing.kill_grace);
            match why {
                Why::Lost => eprintln!(
                    "storage-lock: lock {name} lost (fencing token {token}); stopping the command \
                     (SIGTERM, then SIGKILL)"
                ),
                Why::Deadline => eprintln!(
                    "storage-lock: lock {name} not renewed in time (fencing token {token}); \
                     stopping the command (SIGTERM, SIGKILL in {grace})"
                ),
                Why::Leftovers => eprintln!(
                    "storage-lock: the command exited but left processes in its group; stopping \
                     them before releasing {name} (SIGTERM, SIGKILL after {grace}; \
                     --wait-for-group waits for them instead)"
                ),
            }
        }
        if first || why == Why::Lost {
            self.sentinel.terminating();
            tracing::debug!(pgid = %self.group.0, ?why, "SIGTERM");
            self.group.signal(Signal::SIGTERM);
        }
    }
}

/// The earlier of two optional instants (`None` = never).
fn min_opt(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
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

/// Releases the hold; whether it was still ours until then (`None`: the release failed, and
/// a warning was printed unless quiet: the lease frees the lock anyway).
async fn release(handle: &LockHandle, name: &str, quiet: bool) -> Option<bool> {
    match handle.release_checked().await {
        Ok(ours) => Some(ours),
        Err(e) => {
            if !quiet {
                eprintln!(
                    "storage-lock: warning: could not release lock {} (it frees itself when its lease ends): {}",
                    output::quoted(name),
                    Failure::lock("release", &e),
                );
            }
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);
    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_default_kill_grace_adapts_to_the_lease() {
        let t = Timing::new(30 * S, None, None).unwrap();
        assert_eq!((t.renew, t.kill_grace), (10 * S, 7500 * MS));
        let t = Timing::new(120 * S, None, None).unwrap();
        assert_eq!(t.kill_grace, 10 * S);
        let t = Timing::new(S, Some(800 * MS), None).unwrap();
        assert_eq!(t.kill_grace, 100 * MS, "what --renew leaves");
        assert!(t.poll() >= MS && t.poll() <= MAX_POLL);
    }

    #[test]
    fn the_kill_grace_must_fit_inside_the_lease() {
        assert!(Timing::new(30 * S, None, Some(15 * S)).is_ok());
        for (lease, renew, grace) in [
            (30 * S, None, Some(16 * S)),
            (30 * S, Some(20 * S), Some(8 * S)),
            (S, Some(950 * MS), None),
            (30 * S, None, Some(Duration::MAX)),
            (30 * S, Some(Duration::MAX), None),
        ] {
            let e = Timing::new(lease, renew, grace).unwrap_err();
            assert_eq!(e.code, exit::USAGE, "{lease:?} {renew:?} {grace:?}");
        }
    }

    #[test]
    fn huge_leases_are_valid_timing() {
        let lease = Duration::from_secs(86_400 * 1_000_000_000);
        let t = Timing::new(lease, None, None).unwrap();
        assert_eq!(t.kill_grace, 10 * S);
        assert_eq!(t.poll(), MAX_POLL);
    }

    #[test]
    fn the_default_note_is_the_program_name_only() {
        assert_eq!(default_note(&"/usr/bin/pg_dump".into()), "pg_dump");
        assert_eq!(default_note(&"sh".into()), "sh");
    }
}
