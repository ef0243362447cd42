//! The command line, as clap types.

use std::ffi::OsString;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use storage_lock::Wait;

use crate::exit;

/// Exit codes and environment, shown at the end of `--help`.
const AFTER_HELP: &str = "\
Durations: seconds (10, 0.5) or with a unit (500ms, 30s, 2m, 1h 30m, 7d).

`run` stops the command by the lock's local deadline: SIGTERM to its process group at
deadline - kill-grace, SIGKILL at the deadline, also if `run` itself is killed or stopped (a
sentinel process watches it). Processes the command leaves in its group are stopped before the
lock is released. Pass $STORAGE_LOCK_FENCING_TOKEN to the protected resource: nothing can stop a
paused machine.

Exit codes:
  0        success (`run`: the command exited 0)
  N        `run`: the command's own exit code
  128+N    `run`: the command was killed by signal N, or the wait was interrupted by it
  2        usage error (bad arguments, unknown scheme, malformed URL, invalid name or token)
  65       the lock's stored record does not decode or its fencing token reached the
           storage's bound (use another name)
  69       storage unavailable (cannot be opened or reached, or an operation failed)
  75       not acquired: busy until the wait ran out (change with -E/--conflict-exit-code)
  76       lock lost (or found broken at release) while the command ran; token no longer
           holds its lock (renew/release)
  77       not allowed: a lock server refused the token or its grants (401/403)
  78       the storage's configuration cannot keep the guarantees (e.g. Redis without
           appendfsync always), `check`: its durability is unverified, a bad certificate
           file for serve --tls-*
  70       internal error (a bug: please report it)
  126/127  `run`: the command could not be executed / was not found

Environment:
  STORAGE_LOCK_URL   storage URL when --storage is not given
  XDG_STATE_HOME     default storage: $XDG_STATE_HOME/storage-lock/locks.db
                     (else $HOME/.local/state/storage-lock/locks.db), created on first use;
                     it differs per user and environment (cron!): -v shows the one in use
  RUST_LOG           log filter used with -v (tracing env-filter syntax)
`run` exports to the command: STORAGE_LOCK_NAME, STORAGE_LOCK_FENCING_TOKEN,
STORAGE_LOCK_EXPIRES_AT (RFC 3339, UTC, expiry at acquisition; renewals extend it).";

/// A distributed flock(1): hold a named lock in a shared storage while a command runs.
#[derive(Debug, Parser)]
#[command(name = "storage-lock", version, after_help = AFTER_HELP)]
pub struct Cli {
    /// Storage URL (`sqlite://PATH`, `memory:`, …). Default: an embedded SQLite file under
    /// $XDG_STATE_HOME (or ~/.local/state)/storage-lock/locks.db.
    #[arg(long, global = true, env = "STORAGE_LOCK_URL", value_name = "URL")]
    pub storage: Option<String>,
    /// No progress indicator or notices on stderr (errors are still reported).
    #[arg(short, long, global = true)]
    pub quiet: bool,
    /// Print the storage in use, and log to stderr via tracing (-v: debug, -vv: trace;
    /// RUST_LOG overrides).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a command while holding NAME (renewed automatically; released when it exits).
    Run(RunArgs),
    /// Take NAME and print a lease token for `renew` / `release` (the hold outlives this process).
    Acquire(AcquireArgs),
    /// Extend the hold of a lease token (exit 76 if it no longer holds the lock).
    Renew(RenewArgs),
    /// Release the hold of a lease token (exit 76 if it no longer holds the lock).
    Release(ReleaseArgs),
    /// Run a command while leader of election NAME: campaign (waiting until the seat is free
    /// unless -w/-n), publish --value to observers, run the command with the term in
    /// STORAGE_LOCK_FENCING_TOKEN, and stop it if the leadership is lost (as `run` does).
    Elect(ElectArgs),
    /// Print who leads election NAME (exit 0) or that the seat is vacant (exit 1); with --watch,
    /// a line per change, in term order, until interrupted.
    Leader(LeaderArgs),
    /// List held locks.
    List(ListArgs),
    /// Show the full record of one lock, including a released lock's last fencing token.
    Inspect(InspectArgs),
    /// Delete records of locks free for at least --older-than (the fencing floor is preserved).
    Sweep(SweepArgs),
    /// Admin: free NAME whoever holds it (a holder gone for good); asks first on a terminal.
    Break(BreakArgs),
    /// Show what the storage promises (clock, durability, capabilities); exit 78 if it cannot
    /// keep the lock's guarantees or its durability is unverified (accept that with
    /// durability=unverified in the URL).
    Check(CheckArgs),
    /// Serve the storage's locks on one port until SIGTERM / Ctrl-C: the HTTP JSON API
    /// (OpenAPI at /openapi.json), gRPC with sessions, a live web page at /ui, Prometheus
    /// metrics at /metrics; HTTPS with --tls-cert.
    Serve(ServeArgs),
    /// Fault-test the storage from the outside: worker processes contend on a few names and do
    /// a non-atomic read-modify-write under each hold on a fenced register this command keeps,
    /// while it kills and pauses them; prints what went wrong (exit 0: nothing, 1: violations).
    Torture(TortureArgs),
    /// Make a bearer token for `serve --auth`: its auth-file entry on stdout (append it to the
    /// file: `serve` reloads it), the secret on stderr or in --secret-file.
    Token(TokenArgs),
}

/// `torture`'s arguments.
#[derive(Debug, Args)]
pub struct TortureArgs {
    /// The storage to test (default: --storage, $STORAGE_LOCK_URL, or the default SQLite file).
    pub url: Option<String>,
    /// How long to run.
    #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "20s")]
    pub duration: Duration,
    /// How many worker processes contend (1-64).
    #[arg(long, value_name = "N", default_value_t = 4)]
    pub workers: u32,
    /// On how many lock names (1-16).
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub names: u32,
    /// The workers' lease (renewed at a third of it); a paused worker sleeps through one and
    /// a half.
    #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "2s")]
    pub lease: Duration,
    /// The lock kind the workers take: exclusive, fair, semaphore:N (each permit slot is
    /// checked as a name of its own), or rw (one take in three writes; readers are checked
    /// against writers).
    #[arg(long, value_name = "KIND", value_parser = crate::commands::torture::parse_kind, default_value = "exclusive")]
    pub kind: crate::commands::torture::Kind,
    /// Faults to cause, taking turns every one and a half leases: kill (SIGKILL a worker and
    /// start another), pause (SIGSTOP a worker past its lease, then SIGCONT), cut (close the
    /// workers' connections to a network storage and blackhole new ones past a lease), skew
    /// (replace a worker with one whose wall clock runs an hour ahead or behind; needs
    /// libfaketime), or none. Default: all that the storage and this machine allow.
    #[arg(long, value_name = "LIST", value_parser = crate::commands::torture::parse_faults)]
    pub faults: Option<crate::commands::torture::Faults>,
    /// Write the history (history.jsonl), the verdict (verdict.json) and a timeline to open
    /// in a browser (report.html) into this directory (created if missing).
    #[arg(long, value_name = "DIR")]
    pub report: Option<std::path::PathBuf>,
    /// Break the workers' storage on purpose, to see the tool fail: forget (one update in two
    /// acknowledged and not applied) or non-atomic (compare-and-set done as check-then-write).
    #[arg(long, value_name = "HOW", value_parser = crate::commands::torture::mutant::parse_mutation)]
    pub mutate: Option<crate::commands::torture::mutant::Mutation>,
    /// Print the verdict as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// `serve`'s arguments.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:7420", value_name = "ADDR")]
    pub listen: String,
    /// Require bearer tokens as this TOML file says (see `storage-lock token`); re-read on
    /// SIGHUP and when it changes (a file that does not parse keeps the tokens in force).
    #[arg(long, value_name = "FILE")]
    pub auth: Option<std::path::PathBuf>,
    /// Serve without auth on a non-loopback address (anyone who reaches the port may lock and
    /// release anything).
    #[arg(long)]
    pub insecure_no_auth: bool,
    /// Serve HTTPS (and gRPC over TLS) with this certificate chain (PEM, leaf first); needs
    /// --tls-key.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<std::path::PathBuf>,
    /// Require client certificates that chain to a CA in this PEM file (mutual TLS).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_client_ca: Option<std::path::PathBuf>,
}

/// `token`'s arguments.
#[derive(Debug, Args)]
pub struct TokenArgs {
    /// The token's name (shown in logs and in the audit line of admin actions).
    pub name: String,
    /// The lock-name prefix the token may use (default: every name).
    #[arg(long, default_value = "")]
    pub prefix: String,
    /// What it may do there: read, lock (includes read) or admin (includes lock).
    #[arg(long, default_value = "lock", value_parser = ["read", "lock", "admin"])]
    pub allow: String,
    /// Write the secret token to this file (mode 0600) instead of stderr.
    #[arg(long, value_name = "FILE")]
    pub secret_file: Option<std::path::PathBuf>,
}

/// How long to wait for a busy lock (default: forever, like flock(1)).
#[derive(Debug, Clone, Copy, Args)]
#[group(multiple = false)]
pub struct WaitArgs {
    /// Wait at most DUR for a busy lock: seconds (`10`, `0.5`) or with a unit (`500ms`, `30s`,
    /// `2m`); at most 100 years.
    #[arg(short, long, value_name = "DUR", value_parser = parse_wait)]
    pub wait: Option<Duration>,
    /// Fail at once if the lock is busy (silently, like `flock -n`, unless -v).
    #[arg(short, long)]
    pub no_wait: bool,
    /// Wait until the lock is free (the default).
    #[arg(long)]
    pub wait_forever: bool,
}

impl WaitArgs {
    /// The wait these flags select (forever when none is given).
    pub fn to_wait(self) -> Wait {
        match (self.wait, self.no_wait) {
            (Some(d), _) => Wait::For(d),
            (None, true) => Wait::Never,
            (None, false) => Wait::Forever,
        }
    }
}

/// `run`'s arguments.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The lock name.
    pub name: String,
    /// How long to wait.
    #[command(flatten)]
    pub wait: WaitArgs,
    /// How long a hold lasts without renewal; a crashed holder frees the lock after this.
    #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "30s")]
    pub lease: Duration,
    /// Renewal interval (default: a third of the lease; --renew + --kill-grace must be at most
    /// 90% of the lease).
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub renew: Option<Duration>,
    /// Note stored with the hold, shown to every user by `list` and `inspect` (default: the
    /// program name only, never its arguments).
    #[arg(long, value_name = "TEXT")]
    pub note: Option<String>,
    /// The command gets SIGTERM this long before the lock's local deadline, SIGKILL at it
    /// (default: 10s, at most a quarter of the lease; at most half the lease).
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub kill_grace: Option<Duration>,
    /// After the command exits, wait for the rest of its process group instead of stopping it
    /// (the lock is held meanwhile).
    #[arg(long)]
    pub wait_for_group: bool,
    /// Exit code when the lock is not acquired in time (like `flock -E`).
    #[arg(short = 'E', long, value_name = "N", default_value_t = exit::CONFLICT)]
    pub conflict_exit_code: u8,
    /// Exclusive lock (the default, like flock -x): no other run of NAME, shared or
    /// exclusive, runs meanwhile.
    #[arg(short = 'x', long)]
    pub exclusive: bool,
    /// Shared lock (like flock -s): shared runs of NAME run together (16 at most), never with
    /// an exclusive one; a waiting exclusive run keeps new shared runs out. Through a lock
    /// server's URL too.
    #[arg(short = 's', long, conflicts_with = "exclusive")]
    pub shared: bool,
    /// Run this command string with `sh -c` (like `flock -c`) instead of CMD.
    #[arg(
        short = 'c',
        long = "command",
        id = "shell_command",
        value_name = "STRING",
        conflicts_with = "command"
    )]
    pub shell_command: Option<OsString>,
    /// The command and its arguments (after `--`).
    #[arg(
        required_unless_present = "shell_command",
        last = true,
        value_name = "CMD"
    )]
    pub command: Vec<OsString>,
}

impl RunArgs {
    /// The program and its arguments: `sh -c STRING` for `-c`, else CMD.
    pub fn argv(&self) -> Vec<OsString> {
        match &self.shell_command {
            Some(string) => vec!["sh".into(), "-c".into(), string.clone()],
            None => self.command.clone(),
        }
    }
}

/// `elect`'s arguments: `run`'s, plus the value published to observers.
#[derive(Debug, Args)]
pub struct ElectArgs {
    /// The value observers see (`storage-lock leader NAME`): an address, a node id (default:
    /// HOST:PID). Stored as the hold's note, so `list` and `inspect` show it too.
    #[arg(long, value_name = "TEXT")]
    pub value: Option<String>,
    /// As `run`.
    #[command(flatten)]
    pub run: RunArgs,
}

/// `leader`'s arguments.
#[derive(Debug, Args)]
pub struct LeaderArgs {
    /// The election's name (the lock name its candidates `elect` on).
    pub name: String,
    /// Print a line each time the seat changes (a new leader, a vacancy), in term order, until
    /// interrupted.
    #[arg(long)]
    pub watch: bool,
    /// Print JSON objects: `{"name", "leader": VALUE or null, "term"}` (`term`: the leader's,
    /// or the last leader's for a vacant seat; a string, like every fencing token).
    #[arg(long)]
    pub json: bool,
}

/// `acquire`'s arguments.
#[derive(Debug, Args)]
pub struct AcquireArgs {
    /// The lock name.
    pub name: String,
    /// How long to wait.
    #[command(flatten)]
    pub wait: WaitArgs,
    /// How long the hold lasts unless renewed with `renew`.
    #[arg(long, value_name = "DUR", value_parser = parse_duration, default_value = "30s")]
    pub lease: Duration,
    /// Note stored with the hold, shown by `list` and `inspect`.
    #[arg(long, value_name = "TEXT")]
    pub note: Option<String>,
    /// Exit code when the lock is not acquired in time (like `flock -E`).
    #[arg(short = 'E', long, value_name = "N", default_value_t = exit::CONFLICT)]
    pub conflict_exit_code: u8,
    /// Print a JSON object (acquired: true, token, name, fencing_token, expires_at) instead of
    /// the bare token; when not acquired, `{"acquired": false, "name": …}`.
    #[arg(long)]
    pub json: bool,
}

/// `renew`'s arguments.
#[derive(Debug, Args)]
pub struct RenewArgs {
    /// The lease token printed by `acquire`.
    pub token: String,
    /// The new lease, counted from now (default: the lease the hold was acquired with, which
    /// the token carries; 30s for tokens of the older `v1` format).
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub lease: Option<Duration>,
    /// Print a JSON object instead of the bare expiry.
    #[arg(long)]
    pub json: bool,
}

/// `release`'s arguments.
#[derive(Debug, Args)]
pub struct ReleaseArgs {
    /// The lease token printed by `acquire` (with `--force`: the lock NAME).
    pub token: String,
    /// Admin: free the lock NAME whoever holds it — the same as `break NAME`.
    #[arg(long)]
    pub force: bool,
    /// With `--force`: do not ask (required when stdin is not a terminal).
    #[arg(long, short = 'y', requires = "force")]
    pub yes: bool,
}

/// `list`'s arguments.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only locks whose name starts with this.
    #[arg(default_value = "")]
    pub prefix: String,
    /// Print a JSON array.
    #[arg(long)]
    pub json: bool,
}

/// `inspect`'s arguments.
#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The lock name.
    pub name: String,
    /// Print a JSON object.
    #[arg(long)]
    pub json: bool,
}

/// `sweep`'s arguments.
#[derive(Debug, Args)]
pub struct SweepArgs {
    /// Delete records that have been free for at least this long.
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub older_than: Duration,
    /// Only locks whose name starts with this.
    #[arg(default_value = "")]
    pub prefix: String,
}

/// `break`'s arguments.
#[derive(Debug, Args)]
pub struct BreakArgs {
    /// The lock to free.
    pub name: String,
    /// Do not ask (required when stdin is not a terminal).
    #[arg(long, short = 'y')]
    pub yes: bool,
}

/// `check`'s arguments.
#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The storage to check (default: --storage, $STORAGE_LOCK_URL, or the default SQLite file).
    pub url: Option<String>,
    /// One JSON object: storage, backend, server_storage, clock, durability, durability_note,
    /// capabilities, round_trips, verdict (ok, unverified, unsafe) and problems.
    #[arg(long)]
    pub json: bool,
}

/// The longest `--wait` (100 years of 365.25 days): longer waits are `--wait-forever`.
pub const MAX_WAIT: Duration = Duration::from_secs(36_525 * 86_400);

/// Parses a duration: bare seconds (`10`, `0.5`, as flock(1) takes them) or humantime with
/// units (`500ms`, `30s`, `2m`, `1h 30m`, `7d`). No upper bound here: the values that only the
/// CLI uses are bounded where they are used (`--wait` ≤ 100 years, `--kill-grace` ≤ half the
/// lease).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if let Some(d) = parse_seconds(s) {
        return d;
    }
    humantime::parse_duration(s).map_err(|e| {
        format!("{e} (expected seconds, e.g. 10 or 0.5, or a duration such as 500ms, 30s, 2m)")
    })
}

/// `--wait`: a duration of at most [`MAX_WAIT`].
fn parse_wait(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d > MAX_WAIT {
        return Err("at most 100 years (use --wait-forever to wait without limit)".into());
    }
    Ok(d)
}

/// `DIGITS[.DIGITS]` as seconds (`None` if `s` is not of that form).
fn parse_seconds(s: &str) -> Option<Result<Duration, String>> {
    let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
    let digits = |p: &str| p.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() || !digits(whole) || !digits(frac) || (s.ends_with('.')) {
        return None;
    }
    let Ok(secs) = whole.parse::<u64>() else {
        return Some(Err(format!("{s} seconds is too large")));
    };
    if frac.len() > 9 {
        return Some(Err("at most 9 decimal places (nanoseconds)".into()));
    }
    let nanos = format!("{frac:0<9}").parse::<u32>().unwrap_or(0);
    Some(Ok(Duration::new(secs, nanos)))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn run_takes_the_command_after_dashes() {
        let cli = Cli::try_parse_from([
            "storage-lock",
            "run",
            "job",
            "--no-wait",
            "--",
            "echo",
            "--lease",
        ])
        .expect("valid");
        let Command::Run(run) = cli.command else {
            panic!("not run")
        };
        assert!(run.wait.no_wait);
        assert_eq!(run.command, ["echo", "--lease"]);
        assert_eq!(run.lease, Duration::from_secs(30));
    }

    #[test]
    fn wait_flags_exclude_each_other() {
        let r = Cli::try_parse_from([
            "storage-lock",
            "acquire",
            "job",
            "--no-wait",
            "--wait",
            "1s",
        ]);
        assert!(r.is_err());
    }

    #[test]
    fn durations_are_bare_seconds_or_humantime() {
        let ok = |s: &str| parse_duration(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        assert_eq!(ok("10"), Duration::from_secs(10));
        assert_eq!(ok("0.5"), Duration::from_millis(500));
        assert_eq!(ok("1.000000001"), Duration::new(1, 1));
        assert_eq!(ok("500ms"), Duration::from_millis(500));
        assert_eq!(ok("2m"), Duration::from_secs(120));
        assert_eq!(ok("1000000000d"), Duration::from_secs(86_400_000_000_000));
        for bad in [
            "",
            "1.",
            ".5",
            "-1",
            "1.0000000001",
            "99999999999999999999",
            "5x",
            "1e3",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?}");
        }
        assert!(parse_wait("100y").is_ok());
        assert!(parse_wait("101y").is_err());
        assert!(parse_wait("500000000000y").is_err());
    }

    #[test]
    fn flock_short_options() {
        let cli = Cli::try_parse_from([
            "storage-lock",
            "run",
            "job",
            "-w",
            "10",
            "-E",
            "3",
            "-c",
            "echo hi",
        ])
        .expect("valid");
        let Command::Run(run) = cli.command else {
            panic!("not run")
        };
        assert_eq!(run.wait.wait, Some(Duration::from_secs(10)));
        assert_eq!(run.conflict_exit_code, 3);
        assert_eq!(run.argv(), ["sh", "-c", "echo hi"]);
        let cli =
            Cli::try_parse_from(["storage-lock", "run", "job", "-n", "--", "true"]).expect("valid");
        let Command::Run(run) = cli.command else {
            panic!("not run")
        };
        assert!(run.wait.no_wait);
        assert!(
            Cli::try_parse_from(["storage-lock", "run", "job", "-c", "x", "--", "true"]).is_err()
        );
        assert!(Cli::try_parse_from(["storage-lock", "run", "job"]).is_err());
    }
}
