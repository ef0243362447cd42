//! The dead-man switch of `run`: a small process that stops the command when `run` cannot.
//!
//! `run` stops its command by the lock's local deadline itself (see [`crate::run`]), but only
//! while it runs: killed (`kill -KILL`), it stops nothing; stopped (`SIGSTOP`, a debugger),
//! it stops nothing in time. So before starting the command, `run` starts this sentinel: the
//! same binary re-executed (`/proc/self/exe`, hidden subcommand `__sentinel`) in a process group
//! of its own (a signal to `run`'s group does not reach it), stdin a pipe from `run`, stdout
//! and stderr `/dev/null`. Over the pipe `run` sends, one line each:
//!
//! | line | meaning |
//! |---|---|
//! | `hold URL KEY OWNER` | what to release if `run` dies: the storage URL (`-`: the default), the key and the owner, each hex-encoded (sent before the command starts; through the pipe, never on a command line) |
//! | `pgid N` | the command's process group (sent right after starting the command) |
//! | `deadline NS` | the latest local deadline of the hold, as absolute `CLOCK_BOOTTIME` nanoseconds (the initial one is an argument) |
//! | `term` | `run` is stopping the command itself; no SIGTERM from the sentinel |
//! | `done` | the command and its group are gone: exit without signalling anything |
//!
//! The sentinel then, on `CLOCK_BOOTTIME` (which keeps counting while the machine is
//! suspended, as the storage's clock does):
//!
//! - **`run` died** (EOF on the pipe without `done`): SIGTERM to the command's group at once,
//!   SIGKILL after the kill grace or at the deadline, whichever comes first;
//! - **`run` stopped feeding it** (the deadline − grace passed without a later deadline):
//!   SIGTERM to the group (up to 100 ms after `run` itself would have, so normally only one
//!   is sent), SIGKILL at the deadline;
//! - exits once the group has no live process left, after the SIGKILL, or on `done`;
//! - when `run` died and the group is gone, **releases the hold** (it was told the owner), so
//!   the next holder gets the lock at once instead of after the lease, as with `flock` when
//!   its holder dies. Never while a process of the group may still run: the command is
//!   stopped first.
//!
//! What it cannot stop: a paused or frozen *machine* (every process stops, the storage's clock
//! does not), and processes that left the command's process group. Only the protected resource
//! rejecting stale fencing tokens (`$STORAGE_LOCK_FENCING_TOKEN`) stops those.

use std::io::{BufRead, Write};
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use nix::fcntl::{FcntlArg, OFlag, fcntl};
use nix::sys::signal::Signal;
use nix::unistd::Pid;
use storage_lock::backend::OwnerId;

use crate::group::{Group, boottime_nanos};

/// The hidden subcommand that runs the sentinel.
pub const SUBCOMMAND: &str = "__sentinel";

/// How often the sentinel checks whether the command's group is gone.
const POLL: Duration = Duration::from_millis(100);

// ---------------------------------------------------------------------------------------------
// The supervisor's side.

/// `run`'s end of the sentinel: the pipe and the child.
#[derive(Debug)]
pub struct Sentinel {
    child: Child,
    /// Closed (`None`) after `done` or a write error.
    pipe: Option<std::process::ChildStdin>,
    last_deadline: u128,
}

impl Sentinel {
    /// Starts the sentinel with the hold's current local deadline (absolute `CLOCK_BOOTTIME`
    /// nanoseconds) and the kill grace.
    pub fn start(deadline: u128, grace: Duration) -> std::io::Result<Self> {
        let exe = crate::group::own_binary()?;
        let mut child = Command::new(exe)
            .arg0("storage-lock-sentinel")
            .arg(SUBCOMMAND)
            .arg(deadline.to_string())
            .arg(grace.as_nanos().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .env_remove("RUST_LOG")
            .process_group(0)
            .spawn()?;
        let pipe = child.stdin.take();
        if let Some(pipe) = &pipe {
            // Never block `run` on a sentinel that does not read (stopped): drop the update.
            let fd = pipe.as_fd();
            let flags = fcntl(fd, FcntlArg::F_GETFL).map_err(std::io::Error::from)?;
            fcntl(
                fd,
                FcntlArg::F_SETFL(OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK),
            )
            .map_err(std::io::Error::from)?;
        }
        Ok(Self {
            child,
            pipe,
            last_deadline: deadline,
        })
    }

    /// Tells the sentinel what to release if `run` dies: the storage (`None`: the default), the
    /// key and the owner.
    pub fn hold(&mut self, url: Option<&str>, key: &str, owner: OwnerId) {
        let url = url.map_or_else(|| "-".to_owned(), |u| hex(u.as_bytes()));
        self.send(&format!("hold {url} {} {owner}", hex(key.as_bytes())));
    }

    /// Tells the sentinel the command's process group.
    pub fn watch(&mut self, group: Group) {
        self.send(&format!("pgid {}", group.0.as_raw()));
    }

    /// Tells the sentinel the latest local deadline (sent only if it moved by over 1 ms).
    pub fn deadline(&mut self, deadline: u128) {
        if deadline.abs_diff(self.last_deadline) > 1_000_000 {
            self.last_deadline = deadline;
            self.send(&format!("deadline {deadline}"));
        }
    }

    /// Tells the sentinel `run` is sending SIGTERM itself.
    pub fn terminating(&mut self) {
        self.send("term");
    }

    /// Tells the sentinel to exit without signalling, and reaps it.
    pub fn done(mut self) {
        self.send("done");
        self.pipe = None;
        // It exits at once on `done` (or on EOF, with nothing left to signal).
        for _ in 0..50 {
            match self.child.try_wait() {
                Ok(None) => std::thread::sleep(Duration::from_millis(2)),
                _ => return,
            }
        }
        tracing::debug!("the sentinel did not exit yet; leaving it");
    }

    fn send(&mut self, line: &str) {
        let Some(pipe) = &mut self.pipe else { return };
        if let Err(e) = pipe.write_all(format!("{line}\n").as_bytes()) {
            tracing::warn!(error = %e, "cannot reach the sentinel");
            if e.kind() != std::io::ErrorKind::WouldBlock {
                self.pipe = None;
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The sentinel process.

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<String> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let bytes = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect::<Option<Vec<u8>>>()?;
    String::from_utf8(bytes).ok()
}

/// What `run` holds (the `hold` line), to release when `run` dies.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Held {
    /// `None`: the default storage.
    url: Option<String>,
    key: String,
    owner: OwnerId,
}

/// A line from `run`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Msg {
    Hold(Held),
    Group(Pid),
    Deadline(u128),
    Term,
    Done,
    /// The pipe closed (or failed) without `done`: `run` is gone.
    Eof,
}

fn parse_line(line: &str) -> Option<Msg> {
    let mut words = line.split_whitespace();
    let msg = match (words.next()?, words.next()) {
        ("hold", Some(url)) => {
            let (key, owner) = (words.next()?, words.next()?);
            Msg::Hold(Held {
                url: if url == "-" { None } else { Some(unhex(url)?) },
                key: unhex(key)?,
                owner: owner.parse().ok()?,
            })
        }
        ("pgid", Some(n)) => Msg::Group(Pid::from_raw(n.parse().ok().filter(|&n| n > 1)?)),
        ("deadline", Some(n)) => Msg::Deadline(n.parse().ok()?),
        ("term", None) => Msg::Term,
        ("done", None) => Msg::Done,
        _ => return None,
    };
    Some(msg)
}

/// What the sentinel knows and has done.
#[derive(Debug)]
struct Watch {
    group: Option<Group>,
    /// Local deadline, `CLOCK_BOOTTIME` ns.
    deadline: u128,
    grace: u128,
    /// Set when `run` died: SIGTERM now, SIGKILL at most `grace` later.
    orphaned_at: Option<u128>,
    term_sent: bool,
}

/// What to do at `now`.
#[derive(Debug, PartialEq, Eq)]
enum Action {
    Nothing,
    Term,
    Kill,
}

impl Watch {
    fn term_at(&self) -> u128 {
        if let Some(at) = self.orphaned_at {
            return at;
        }
        // A little after `run` itself would send SIGTERM, so normally only one is sent.
        let lag = (self.grace / 10).min(POLL.as_nanos());
        self.deadline.saturating_sub(self.grace).saturating_add(lag)
    }

    fn kill_at(&self) -> u128 {
        match self.orphaned_at {
            Some(at) => self.deadline.min(at.saturating_add(self.grace)),
            None => self.deadline,
        }
    }

    fn action(&self, now: u128) -> Action {
        if self.group.is_none() {
            Action::Nothing
        } else if now >= self.kill_at() {
            Action::Kill
        } else if now >= self.term_at() && !self.term_sent {
            Action::Term
        } else {
            Action::Nothing
        }
    }

    /// How long to sleep at most before the next action (or the next liveness check).
    fn next_wake(&self, now: u128) -> Duration {
        let mut next = self.kill_at();
        if !self.term_sent {
            next = next.min(self.term_at());
        }
        let wait = next.saturating_sub(now).min(POLL.as_nanos());
        Duration::from_nanos(u64::try_from(wait).unwrap_or(0))
    }
}

/// Runs the sentinel (`storage-lock __sentinel DEADLINE_NS GRACE_NS`); returns the exit code.
pub fn main(args: &[String]) -> u8 {
    let (Some(deadline), Some(grace)) = (
        args.first().and_then(|s| s.parse::<u128>().ok()),
        args.get(1).and_then(|s| s.parse::<u128>().ok()),
    ) else {
        eprintln!("storage-lock: {SUBCOMMAND} is internal to `storage-lock run`");
        return crate::exit::USAGE;
    };
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if let Some(msg) = parse_line(&line)
                && tx.send(msg).is_err()
            {
                return;
            }
        }
        let _ = tx.send(Msg::Eof);
    });
    let mut watch = Watch {
        group: None,
        deadline,
        grace,
        orphaned_at: None,
        term_sent: false,
    };
    let mut held = None;
    loop {
        // Fail closed: without a clock, act as if every deadline had passed.
        let now = boottime_nanos().unwrap_or(u128::MAX);
        if let Some(group) = watch.group {
            if !group.alive() {
                release_if_orphaned(&watch, held.as_ref());
                return 0;
            }
            match watch.action(now) {
                Action::Nothing => {}
                Action::Term => {
                    group.signal(Signal::SIGTERM);
                    watch.term_sent = true;
                }
                Action::Kill => {
                    group.signal(Signal::SIGKILL);
                    if watch.orphaned_at.is_some() {
                        // SIGKILL is not instant: release only once nothing of it runs.
                        for _ in 0..100 {
                            if !group.alive() {
                                release_if_orphaned(&watch, held.as_ref());
                                break;
                            }
                            std::thread::sleep(Duration::from_millis(20));
                        }
                    }
                    return 0;
                }
            }
        }
        match rx.recv_timeout(watch.next_wake(now)) {
            Ok(Msg::Hold(h)) => held = Some(h),
            Ok(Msg::Group(pgid)) => watch.group = Some(Group(pgid)),
            Ok(Msg::Deadline(d)) => watch.deadline = d,
            Ok(Msg::Term) => watch.term_sent = true,
            Ok(Msg::Done) => return 0,
            Ok(Msg::Eof) | Err(RecvTimeoutError::Disconnected) => {
                if watch.group.is_none() {
                    return 0; // nothing was started
                }
                if watch.orphaned_at.is_none() {
                    watch.orphaned_at = Some(now);
                    watch.term_sent = false; // a SIGTERM now, even if one went out before
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
        }
    }
}

/// After `run` died and its command's group is gone: releases the hold `run` had, so the
/// next holder need not wait for the lease. Best effort (10 s at most): if it fails, the lease
/// still ends the hold.
fn release_if_orphaned(watch: &Watch, held: Option<&Held>) {
    let (Some(_), Some(held)) = (watch.orphaned_at, held) else {
        return;
    };
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return;
    };
    runtime.block_on(async {
        let release = async {
            let opened = crate::storage::open(
                held.url.as_deref(),
                storage_lock::backend::HolderInfo::this_process(),
                true,
            )
            .await
            .ok()?;
            opened.storage.release(&held.key, held.owner).await.ok()
        };
        let _ = tokio::time::timeout(Duration::from_secs(10), release).await;
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u128 = 1_000_000;

    #[test]
    fn hold_lines_round_trip() {
        let line = |url: Option<&str>| {
            let url = url.map_or_else(|| "-".to_owned(), |u| hex(u.as_bytes()));
            format!("hold {url} {} {:032x}", hex("a b/ü".as_bytes()), 42u128)
        };
        let want = |url: Option<&str>| {
            Some(Msg::Hold(Held {
                url: url.map(str::to_owned),
                key: "a b/ü".into(),
                owner: OwnerId::from_u128(42),
            }))
        };
        assert_eq!(parse_line(&line(None)), want(None));
        let url = "postgres://u:p w@h/db?x=1";
        assert_eq!(parse_line(&line(Some(url))), want(Some(url)));
        for bad in [
            "hold",
            "hold - 6",
            "hold - 6 x",
            "hold 6 61 2a",
            "hold - 6g 2a",
        ] {
            assert_eq!(parse_line(bad), None, "{bad:?}");
        }
    }

    fn watch(deadline: u128, grace: u128) -> Watch {
        Watch {
            group: Some(Group(Pid::from_raw(12345))),
            deadline,
            grace,
            orphaned_at: None,
            term_sent: false,
        }
    }

    #[test]
    fn lines_parse() {
        assert_eq!(parse_line("pgid 42"), Some(Msg::Group(Pid::from_raw(42))));
        assert_eq!(parse_line("deadline 7"), Some(Msg::Deadline(7)));
        assert_eq!(parse_line("term"), Some(Msg::Term));
        assert_eq!(parse_line("done"), Some(Msg::Done));
        for bad in [
            "",
            "pgid",
            "pgid 1",
            "pgid -5",
            "deadline x",
            "done now",
            "kill",
        ] {
            assert_eq!(parse_line(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_stopped_supervisor_gets_sigterm_before_and_sigkill_at_the_deadline() {
        let w = watch(10_000 * MS, 1_000 * MS);
        assert_eq!(w.action(8_999 * MS), Action::Nothing);
        // SIGTERM up to 100 ms after deadline − grace.
        assert_eq!(w.action(9_100 * MS), Action::Term);
        assert_eq!(w.action(10_000 * MS), Action::Kill);
    }

    #[test]
    fn a_dead_supervisor_gets_sigterm_now_and_sigkill_after_the_grace_or_deadline() {
        let mut w = watch(10_000 * MS, 1_000 * MS);
        w.orphaned_at = Some(2_000 * MS);
        assert_eq!(w.action(2_000 * MS), Action::Term);
        w.term_sent = true;
        assert_eq!(w.action(2_999 * MS), Action::Nothing);
        assert_eq!(w.action(3_000 * MS), Action::Kill);
        let mut w = watch(10_000 * MS, 5_000 * MS);
        w.orphaned_at = Some(9_000 * MS);
        assert_eq!(w.kill_at(), 10_000 * MS, "never after the deadline");
    }

    #[test]
    fn nothing_is_signalled_before_the_group_is_known() {
        let mut w = watch(0, 0);
        w.group = None;
        assert_eq!(w.action(u128::MAX), Action::Nothing);
    }
}
