//! `elect` and `leader`: leader election from the shell ([`storage_lock::kinds::Election`]).
//!
//! `elect NAME -- CMD` is `run` on the election's lock with the candidate's value as the
//! hold's note: the command runs only while this process leads, its term is
//! `$STORAGE_LOCK_FENCING_TOKEN`, and it is stopped when the leadership is lost — exactly
//! `run`'s guarantees, because a leadership *is* a hold. `leader NAME` reads the seat.

use std::io::Write;
use std::time::Duration;

use serde_json::json;
use storage_lock::backend::HolderInfo;
use storage_lock::kinds::{Election, Observed, validate_value};

use super::validate_name;
use crate::cli::{ElectArgs, LeaderArgs};
use crate::exit::{self, Failure};
use crate::signals::Signals;
use crate::{output, storage};

/// Exit code of `leader` for a vacant seat.
pub const VACANT: u8 = 1;

/// Runs `elect`: `run` with the value as the note.
pub async fn elect(
    args: ElectArgs,
    url: Option<&str>,
    quiet: bool,
    verbose: u8,
) -> Result<u8, Failure> {
    let ElectArgs { value, mut run } = args;
    let value = match (value, run.note.take()) {
        (Some(_), Some(_)) => {
            return Err(Failure::usage(
                "--value and --note both set the published value: give one",
            ));
        }
        (Some(v), None) | (None, Some(v)) => v,
        (None, None) => {
            let me = HolderInfo::this_process();
            format!("{}:{}", me.host, me.pid)
        }
    };
    validate_value(&value).map_err(|e| Failure::usage(format!("--value: {e}")))?;
    run.note = Some(value);
    crate::run::run_elected(run, url, quiet, verbose).await
}

/// Runs `leader`: the seat once (exit 0 with a leader, [`VACANT`] without), or every change
/// with `--watch` until a signal.
pub async fn leader(args: LeaderArgs, url: Option<&str>, quiet: bool) -> Result<u8, Failure> {
    validate_name(&args.name)?;
    let opened = storage::open(url, HolderInfo::this_process(), quiet).await?;
    let election = Election::new(&opened.locks, &args.name)
        .map_err(|e| Failure::lock("invalid election name", &e))?;
    if !args.watch {
        let seen = election
            .leader()
            .await
            .map_err(|e| Failure::lock("cannot read the election", &e))?;
        let _ = show(&args, &seen);
        return Ok(match seen {
            Observed::Leader { .. } => 0,
            Observed::Vacant { .. } => VACANT,
        });
    }
    let mut signals = Signals::new()?;
    let mut observer = election.observe();
    loop {
        tokio::select! {
            seen = observer.next() => match seen {
                // Nobody reads any more (`leader --watch | head -1`): done.
                Ok(seen) => if !show(&args, &seen) { return Ok(0) },
                // A watcher rides out a storage outage: one line, then it tries again.
                Err(e) => {
                    if !quiet {
                        eprintln!("storage-lock: warning: cannot read the election: {e}");
                    }
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            },
            signal = signals.recv() => return Ok(exit::signaled(signal as i32)),
        }
    }
}

/// Prints the seat; `false` if stdout is closed.
fn show(args: &LeaderArgs, seen: &Observed) -> bool {
    let line = match (seen, args.json) {
        (Observed::Leader { value, term }, true) => {
            json!({"name": args.name, "leader": value, "term": term.to_string()}).to_string()
        }
        (Observed::Vacant { after_term }, true) => {
            json!({"name": args.name, "leader": null, "term": after_term.to_string()}).to_string()
        }
        (Observed::Leader { value, term }, false) => {
            format!("{} (term {term})", output::escape(value))
        }
        (Observed::Vacant { after_term: 0 }, false) => "vacant".to_owned(),
        (Observed::Vacant { after_term }, false) => format!("vacant (after term {after_term})"),
    };
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").and_then(|()| out.flush()).is_ok()
}
