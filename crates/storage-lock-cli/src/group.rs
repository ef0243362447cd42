//! The command's process group, the terminal's foreground group, and `CLOCK_BOOTTIME`.
//!
//! `run` always starts its command in a process group of its own, so every signal it sends
//! (forwarded, or to stop the command) reaches the command's descendants too, and a dead-man
//! switch outside that group ([`crate::sentinel`]) can stop the whole group if `run` itself
//! dies. What escapes: a descendant that moves to another process group or session (`setsid`,
//! a shell with job control).

use std::io::IsTerminal;
use std::os::fd::AsFd;

use nix::errno::Errno;
use nix::sys::signal::{SigSet, SigmaskHow, Signal, killpg, pthread_sigmask};
use nix::time::{ClockId, clock_gettime};
use nix::unistd::{Pid, getpgrp, tcgetpgrp, tcsetpgrp};

/// Now on `CLOCK_BOOTTIME`, in nanoseconds: monotonic and, unlike `CLOCK_MONOTONIC`, counting
/// the time the machine was suspended (the storage's clock counts it too).
pub fn boottime_nanos() -> Result<u128, Errno> {
    let now = clock_gettime(ClockId::CLOCK_BOOTTIME)?;
    let secs = u128::try_from(now.tv_sec()).map_err(|_| Errno::EINVAL)?;
    let nanos = u128::try_from(now.tv_nsec()).map_err(|_| Errno::EINVAL)?;
    Ok(secs * 1_000_000_000 + nanos)
}

/// A process group (identified by its leader's pid).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Group(pub Pid);

impl Group {
    /// Sends `signal` to every process of the group. Failure (the group is gone) is only
    /// logged.
    pub fn signal(self, signal: Signal) {
        if let Err(e) = killpg(self.0, signal) {
            tracing::debug!(?signal, pgid = %self.0, error = %e, "could not signal the group");
        }
    }

    /// Whether a live (not zombie) process is left in the group.
    ///
    /// Zombies do not count: an orphan's zombie stays until its new parent reaps it, which a
    /// container's init may never do. On Linux this reads `/proc`; elsewhere (or without
    /// `/proc`) any process, zombie or not, counts.
    pub fn alive(self) -> bool {
        if killpg(self.0, None::<Signal>) == Err(Errno::ESRCH) {
            return false;
        }
        match live_members(self.0) {
            Some(n) => n > 0,
            None => true,
        }
    }
}

/// The number of processes in group `pgid` that are not zombies, from `/proc`; `None` if
/// `/proc` cannot be read.
fn live_members(pgid: Pid) -> Option<usize> {
    let entries = std::fs::read_dir("/proc").ok()?;
    let mut live = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        // A process that vanished between listing and reading is simply not counted.
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        if let Some((state, pgrp)) = parse_stat(&stat)
            && pgrp == pgid.as_raw()
            && !matches!(state, 'Z' | 'X' | 'x')
        {
            live += 1;
        }
    }
    Some(live)
}

/// `(state, pgrp)` from `/proc/PID/stat` (`pid (comm) state ppid pgrp …`; `comm` may contain
/// spaces and parentheses, so parse after the last `)`).
fn parse_stat(stat: &str) -> Option<(char, i32)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let _ppid = fields.next()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some((state, pgrp))
}

/// The terminal `run` was started from, if its command should get it: stdin is a terminal
/// and this process is in the terminal's foreground process group (a `run … &` in the
/// background must not take the terminal from the shell).
///
/// While the command's group is in the foreground, `SIGTTOU` stays blocked in this thread, so
/// `run` (now a background process of the terminal) can still write its notices and give the
/// terminal back even if the terminal has `tostop` set.
#[derive(Debug)]
pub struct Terminal {
    /// The foreground group to give the terminal back to (this process's own).
    previous: Pid,
    /// Whether [`Self::give_to`] gave the terminal away (to take it back once).
    given: std::cell::Cell<bool>,
    /// Whether [`Self::give_to`] blocked `SIGTTOU` (to unblock it again).
    blocked: std::cell::Cell<bool>,
}

impl Terminal {
    /// `Some` if stdin is a terminal whose foreground group is this process's group.
    pub fn foreground() -> Option<Self> {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() {
            return None;
        }
        let fg = tcgetpgrp(stdin.as_fd()).ok()?;
        (fg == getpgrp()).then_some(Self {
            previous: fg,
            given: std::cell::Cell::new(false),
            blocked: std::cell::Cell::new(false),
        })
    }

    /// Makes `group` the terminal's foreground group (so it reads from the terminal and gets
    /// Ctrl-C, Ctrl-\ directly), then wakes it in case it already stopped on `SIGTTIN`.
    pub fn give_to(&self, group: Group) {
        let mut old = SigSet::empty();
        match pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&ttou()), Some(&mut old)) {
            Ok(()) => self.blocked.set(!old.contains(Signal::SIGTTOU)),
            Err(e) => {
                tracing::debug!(error = %e, "cannot block SIGTTOU; the command stays in the background");
                return;
            }
        }
        set_foreground(group.0);
        self.given.set(true);
        group.signal(Signal::SIGCONT);
    }

    /// Gives the terminal back to this process's group (idempotent).
    pub fn take_back(&self) {
        if self.given.replace(false) {
            set_foreground(self.previous);
        }
        if self.blocked.replace(false) {
            let _ = pthread_sigmask(SigmaskHow::SIG_UNBLOCK, Some(&ttou()), None);
        }
    }
}

fn ttou() -> SigSet {
    let mut set = SigSet::empty();
    set.add(Signal::SIGTTOU);
    set
}

/// The hidden subcommand `run` starts its command through when the command gets the terminal:
/// `storage-lock __foreground-exec PROGRAM ARGS…`.
///
/// `run` makes the command's group the terminal's foreground group right after starting it,
/// but the command may already be running by then (and find itself in the background: a
/// shell would disable job control, a `read` would stop on `SIGTTIN`). So the child takes the
/// terminal itself before it becomes the command: [`foreground_exec`] runs in the new process
/// group, gives it the terminal, then `exec`s the program (same pid, same group). Doing this in
/// the child without a second program would need a `pre_exec` hook, which is `unsafe`.
pub const FOREGROUND_EXEC: &str = "__foreground-exec";

/// The body of [`FOREGROUND_EXEC`]: takes the terminal for this process's group, then replaces
/// this process with `args[0]` run with the rest of `args`. Returns only on failure, with the
/// exit code `run` uses for a command that cannot be started (127 not found, 126 otherwise).
pub fn foreground_exec(args: &[std::ffi::OsString]) -> u8 {
    use std::os::unix::process::CommandExt;
    let Some((program, rest)) = args.split_first() else {
        eprintln!("storage-lock: {FOREGROUND_EXEC} is internal to `storage-lock run`");
        return crate::exit::USAGE;
    };
    let mut old = SigSet::empty();
    if pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&ttou()), Some(&mut old)).is_ok() {
        set_foreground(getpgrp());
        let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&old), None);
    }
    let e = std::process::Command::new(program).args(rest).exec();
    let failure = crate::exit::Failure::cannot_run(program, &e);
    eprintln!("storage-lock: error: {failure}");
    failure.code
}

/// This binary, to start a hidden subcommand with. `/proc/self/exe` works even if the binary
/// was replaced or deleted since it started.
///
/// # Errors
/// When neither `/proc/self/exe` nor [`std::env::current_exe`] names it.
pub fn own_binary() -> std::io::Result<std::path::PathBuf> {
    let proc = std::path::Path::new("/proc/self/exe");
    if proc.exists() {
        Ok(proc.to_path_buf())
    } else {
        std::env::current_exe()
    }
}

/// `tcsetpgrp` on stdin (with `SIGTTOU` blocked by the caller).
fn set_foreground(pgid: Pid) {
    if let Err(e) = tcsetpgrp(std::io::stdin().as_fd(), pgid) {
        tracing::debug!(%pgid, error = %e, "cannot set the terminal's foreground group");
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn stat_lines_parse_after_the_command_name() {
        assert_eq!(
            parse_stat("42 (a) b (c)) S 1 4242 4242 0 -1"),
            Some(('S', 4242))
        );
        assert_eq!(parse_stat("7 (zz) Z 1 7 7"), Some(('Z', 7)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn this_process_group_is_alive() {
        assert!(Group(getpgrp()).alive());
    }

    #[test]
    fn boottime_advances() {
        let a = boottime_nanos().unwrap();
        std::thread::sleep(Duration::from_millis(2));
        assert!(boottime_nanos().unwrap() > a);
    }
}
