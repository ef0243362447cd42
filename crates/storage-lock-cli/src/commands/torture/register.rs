//! The checked register: a counter per name that refuses writes with a stale fencing token,
//! records every read and write with the time it saw it, and reports what fencing could not
//! stop (see the [module docs](super)).
//!
//! # Protocol (one line per request, one line per answer)
//! * `R NAME TOKEN WORKER` → the name's value: the start of a hold's critical section. It
//!   raises the name's fence to `TOKEN`.
//! * `W NAME READ TOKEN WORKER CHECKED_NS LOST` → `ok`, `stale` (below the fence) or
//!   `violation` (the last accepted write's token):
//!   the hold's write of `READ + 1`; `CHECKED_NS` is the worker's boot-clock reading just
//!   before it asked its handle whether the hold is lost, `LOST` the answer (`1` or `0`).
//! * `S NAME TOKEN WORKER` → the name's value, and `E NAME TOKEN WORKER CHECKED_NS LOST` →
//!   `ok`: a shared (reader's) hold's start and end; it writes nothing.
//!
//! Each hold whose handle said "not lost" at its end was valid from its first request here to
//! that reading: its **interval**. When the run ends ([`Tally::finish`]) a reader's interval
//! that overlaps a writer's of the same name, and a writer whose token is not above that of a
//! reader that read before it while the writer was valid, are violations.
//!
//! Times are the machine's boot clock ([`boot_ns`]), one clock for every process here, so a
//! worker's reading and the register's compare exactly.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

/// Nanoseconds on the machine's boot clock (`CLOCK_BOOTTIME`: one clock for every process,
/// never stepped, counting suspend, the clock a handle's deadline is kept on); 0 if it cannot
/// be read.
pub(super) fn boot_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).map_or(0, |t| {
        u64::try_from(t.tv_sec())
            .unwrap_or(0)
            .saturating_mul(1_000_000_000)
            .saturating_add(u64::try_from(t.tv_nsec()).unwrap_or(0))
    })
}

/// At most this many history events are kept (a run of hours at full speed); past it the
/// checks go on and the history says it was cut short.
const MAX_EVENTS: usize = 2_000_000;

/// What a write came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Outcome {
    /// Accepted.
    Ok,
    /// Refused: a lower token than an accepted write's (fencing did its job).
    Stale,
    /// Its token repeated the last accepted write's.
    Violation,
}

/// One entry of the run's history (`--report DIR` writes them as JSON lines). `ms` is
/// milliseconds since the run started.
#[derive(Debug, Clone)]
pub(super) enum Event {
    /// A worker process started (`skew`: its wall clock's offset, when it runs skewed).
    Worker {
        ms: f64,
        worker: u32,
        skew: Option<String>,
    },
    /// A worker process was killed (by a fault, or at the end of the run).
    Exit { ms: f64, worker: u32 },
    /// A hold's critical section began: the worker read the name's value (`shared`: a
    /// reader's hold, which writes nothing).
    Read {
        ms: f64,
        worker: u32,
        name: String,
        token: u64,
        value: u64,
        shared: bool,
    },
    /// A reader's hold ended.
    ReadEnd {
        ms: f64,
        worker: u32,
        name: String,
        token: u64,
        lost_reported: bool,
    },
    /// A hold's write.
    Write {
        ms: f64,
        worker: u32,
        name: String,
        token: u64,
        read: u64,
        outcome: Outcome,
        lost_reported: bool,
    },
    /// A fault this command caused, on one worker or (`worker` absent) on all of them.
    Fault {
        ms: f64,
        fault: &'static str,
        worker: Option<u32>,
        until_ms: f64,
    },
    /// A violation, with the worker and token whose write showed it.
    Violation {
        ms: f64,
        worker: u32,
        name: String,
        token: u64,
        what: String,
    },
}

impl Outcome {
    fn name(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Stale => "stale",
            Self::Violation => "violation",
        }
    }
}

impl Event {
    /// The event as one JSON object (a line of `history.jsonl`), `{"event": KIND, ...}`.
    pub(super) fn to_json(&self) -> serde_json::Value {
        use serde_json::json;
        match self {
            Self::Worker { ms, worker, skew } => {
                json!({"event": "worker", "ms": ms, "worker": worker, "skew": skew})
            }
            Self::Exit { ms, worker } => json!({"event": "exit", "ms": ms, "worker": worker}),
            Self::Read {
                ms,
                worker,
                name,
                token,
                value,
                shared,
            } => json!({"event": "read", "ms": ms, "worker": worker, "name": name,
                        "token": token, "value": value, "shared": shared}),
            Self::ReadEnd {
                ms,
                worker,
                name,
                token,
                lost_reported,
            } => json!({"event": "read_end", "ms": ms, "worker": worker, "name": name,
                        "token": token, "lost_reported": lost_reported}),
            Self::Write {
                ms,
                worker,
                name,
                token,
                read,
                outcome,
                lost_reported,
            } => json!({"event": "write", "ms": ms, "worker": worker, "name": name,
                        "token": token, "read": read, "outcome": outcome.name(),
                        "lost_reported": lost_reported}),
            Self::Fault {
                ms,
                fault,
                worker,
                until_ms,
            } => json!({"event": "fault", "ms": ms, "fault": fault, "worker": worker,
                        "until_ms": until_ms}),
            Self::Violation {
                ms,
                worker,
                name,
                token,
                what,
            } => json!({"event": "violation", "ms": ms, "worker": worker, "name": name,
                        "token": token, "what": what}),
        }
    }
}

/// What the register saw and the faults caused.
#[derive(Debug, Default)]
pub(super) struct Tally {
    pub(super) reads: u64,
    pub(super) accepted: u64,
    pub(super) fenced_off: u64,
    /// Writes whose holder's handle already said "lost" (its hold was over, it wrote anyway to
    /// test fencing).
    pub(super) lost_reported: u64,
    pub(super) violations: Vec<String>,
    pub(super) faults: HashMap<&'static str, u64>,
    pub(super) history: Vec<Event>,
    /// The history reached [`MAX_EVENTS`].
    pub(super) history_cut: bool,
    /// When the run started, on the boot clock, and on the wall clock (Unix milliseconds: the
    /// history's times are relative to it).
    pub(super) start_ns: u64,
    pub(super) started_unix_ms: u64,
    /// Each worker's hold in progress: name, token, shared, first request (boot clock).
    open: HashMap<u32, (String, u64, bool, u64)>,
    /// The holds that ended, with what their handles said.
    intervals: Vec<Interval>,
}

/// A hold from its first request to the register to its end (see the module docs).
#[derive(Debug, Clone)]
struct Interval {
    name: String,
    worker: u32,
    token: u64,
    shared: bool,
    from: u64,
    to: u64,
    /// The handle said "not lost" at `to`: the hold was valid all along.
    valid: bool,
}

impl Tally {
    /// A tally for a run starting now.
    pub(super) fn starting_now() -> Self {
        Self {
            start_ns: boot_ns(),
            started_unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            ..Self::default()
        }
    }

    /// `ns` on the boot clock as milliseconds since the run started.
    pub(super) fn ms(&self, ns: u64) -> f64 {
        // Precision to the microsecond is plenty for a timeline.
        #[allow(clippy::cast_precision_loss)]
        let ms = ns.saturating_sub(self.start_ns) as f64 / 1e6;
        ms
    }

    /// Milliseconds since the run started, now.
    pub(super) fn now_ms(&self) -> f64 {
        self.ms(boot_ns())
    }

    /// Adds `event` to the history, unless it is full.
    pub(super) fn record(&mut self, event: Event) {
        if self.history.len() < MAX_EVENTS {
            self.history.push(event);
        } else {
            self.history_cut = true;
        }
    }

    /// A hold's end: its interval, if the register saw its start.
    fn close(&mut self, worker: u32, name: &str, token: u64, to: u64, valid: bool) {
        if let Some((n, t, shared, from)) = self.open.remove(&worker)
            && n == name
            && t == token
            && self.intervals.len() < MAX_EVENTS
        {
            self.intervals.push(Interval {
                name: n,
                worker,
                token,
                shared,
                from,
                to,
                valid,
            });
        }
    }

    /// The checks that need the whole run: readers against writers (see the module docs).
    pub(super) fn finish(&mut self) {
        let mut by_name: HashMap<&str, Vec<&Interval>> = HashMap::new();
        for i in &self.intervals {
            by_name.entry(&i.name).or_default().push(i);
        }
        let mut found = Vec::new();
        for holds in by_name.values_mut() {
            if !holds.iter().any(|h| h.shared) {
                continue;
            }
            holds.sort_by_key(|h| h.from);
            for (k, w) in holds.iter().enumerate() {
                if w.shared || !w.valid {
                    continue;
                }
                for r in holds.iter().filter(|r| r.shared) {
                    if r.valid && r.from < w.to && w.from < r.to {
                        found.push((
                            r.from.max(w.from),
                            r.worker,
                            r.name.clone(),
                            r.token,
                            format!(
                                "reader and writer overlapped: worker {}'s read (token {}) of {:?} and worker {}'s write (token {}) both held at {:.1} ms",
                                r.worker,
                                r.token,
                                r.name,
                                w.worker,
                                w.token,
                                self.ms(r.from.max(w.from))
                            ),
                        ));
                    }
                }
                if let Some(r) = holds[..k].iter().rfind(|r| r.shared && r.token >= w.token) {
                    found.push((
                        w.from,
                        w.worker,
                        w.name.clone(),
                        w.token,
                        format!(
                            "writer token not above an earlier reader's: worker {}'s write of {:?} (token {}) began at {:.1} ms, after worker {}'s read with token {}",
                            w.worker,
                            w.name,
                            w.token,
                            self.ms(w.from),
                            r.worker,
                            r.token
                        ),
                    ));
                }
            }
        }
        found.sort_by_key(|f| f.0);
        for (at, worker, name, token, what) in found {
            let ms = self.ms(at);
            self.violation(ms, worker, &name, token, what);
        }
    }

    fn violation(&mut self, ms: f64, worker: u32, name: &str, token: u64, what: String) {
        self.record(Event::Violation {
            ms,
            worker,
            name: name.to_owned(),
            token,
            what: what.clone(),
        });
        self.violations.push(what);
    }
}

/// One name's state in the register.
#[derive(Debug, Default)]
struct Cell {
    value: u64,
    /// The highest token of an accepted write (0: none yet).
    token: u64,
    /// The highest token seen in a read or an accepted write: a write below it is stale.
    fence: u64,
    /// Who made that write, and when (boot-clock nanoseconds).
    writer: u32,
    written: u64,
    /// The first read of each token (boot-clock nanoseconds) and its worker: when each grant
    /// was already in force.
    reads: BTreeMap<u64, (u64, u32)>,
}

/// The register's answer to one request line, seen at `now_ns`.
fn answer(cells: &mut HashMap<String, Cell>, t: &mut Tally, line: &str, now_ns: u64) -> String {
    let parts: Vec<&str> = line.split_whitespace().collect();
    let ms = t.ms(now_ns);
    match parts.as_slice() {
        [op @ ("R" | "S"), name, token, worker] => {
            let (Ok(token), Ok(worker)) = (token.parse::<u64>(), worker.parse::<u32>()) else {
                return "error".to_owned();
            };
            let shared = *op == "S";
            t.reads += 1;
            let cell = cells.entry((*name).to_owned()).or_default();
            cell.reads.entry(token).or_insert((now_ns, worker));
            cell.fence = cell.fence.max(token);
            let value = cell.value;
            t.open
                .insert(worker, ((*name).to_owned(), token, shared, now_ns));
            t.record(Event::Read {
                ms,
                worker,
                name: (*name).to_owned(),
                token,
                value,
                shared,
            });
            value.to_string()
        }
        ["E", name, token, worker, checked_ns, lost] => {
            let (Ok(token), Ok(worker), Ok(checked_ns)) = (
                token.parse::<u64>(),
                worker.parse::<u32>(),
                checked_ns.parse::<u64>(),
            ) else {
                return "error".to_owned();
            };
            let lost = *lost == "1";
            t.close(worker, name, token, checked_ns, !lost);
            t.record(Event::ReadEnd {
                ms,
                worker,
                name: (*name).to_owned(),
                token,
                lost_reported: lost,
            });
            "ok".to_owned()
        }
        ["W", name, read, token, worker, checked_ns, lost] => {
            let (Ok(read), Ok(token), Ok(worker), Ok(checked_ns)) = (
                read.parse::<u64>(),
                token.parse::<u64>(),
                worker.parse::<u32>(),
                checked_ns.parse::<u64>(),
            ) else {
                return "error".to_owned();
            };
            let lost = *lost == "1";
            // When this hold's critical section began (its read), if the register saw it.
            let began = t
                .open
                .get(&worker)
                .filter(|(n, tk, _, _)| n == name && *tk == token)
                .map_or(now_ns, |&(_, _, _, from)| from);
            let cell = cells.entry((*name).to_owned()).or_default();
            // A later grant of the name was in force (its holder had read) before this
            // holder's handle said "not lost": two holds believed themselves valid at once.
            let unreported = if lost {
                None
            } else {
                cell.reads
                    .range(token.saturating_add(1)..)
                    .map(|(&later, &(at, by))| (later, at, by))
                    .filter(|&(_, at, _)| at < checked_ns)
                    .min_by_key(|&(_, at, _)| at)
            };
            let outcome = if token < cell.fence {
                Outcome::Stale
            } else if token == cell.token {
                Outcome::Violation
            } else {
                Outcome::Ok
            };
            let (other, other_ms) = (cell.writer, cell.written);
            if outcome == Outcome::Ok {
                // A write under a fence its own read raised: nothing came between (see the
                // module docs), so `read` is the value.
                cell.value = read + 1;
                cell.token = token;
                cell.fence = token;
                cell.writer = worker;
                cell.written = now_ns;
            }
            t.record(Event::Write {
                ms,
                worker,
                name: (*name).to_owned(),
                token,
                read,
                outcome,
                lost_reported: lost,
            });
            let (began_ms, other_ms) = (t.ms(began), t.ms(other_ms));
            match outcome {
                Outcome::Stale => t.fenced_off += 1,
                Outcome::Violation => t.violation(
                    ms,
                    worker,
                    name,
                    token,
                    format!(
                        "repeated token: worker {worker} (hold from {began_ms:.1} ms) wrote {name:?} with token {token} at {ms:.1} ms, the token of worker {other}'s accepted write at {other_ms:.1} ms"
                    ),
                ),
                Outcome::Ok => t.accepted += 1,
            }
            if lost {
                t.lost_reported += 1;
            }
            t.close(worker, name, token, checked_ns, !lost);
            if let Some((later, at, by)) = unreported {
                let (at_ms, checked) = (t.ms(at), t.ms(checked_ns));
                let what = if at < began {
                    // The later token was in use before this hold even began: the grants'
                    // tokens went down.
                    format!(
                        "token went backwards: worker {worker} was granted {name:?} with token {token} (hold from {began_ms:.1} ms) after worker {by} held it with token {later} at {at_ms:.1} ms"
                    )
                } else {
                    format!(
                        "lost hold not reported: worker {worker}'s handle (token {token}, hold from {began_ms:.1} ms) of {name:?} said it still held at {checked:.1} ms, but worker {by} held it with token {later} from {at_ms:.1} ms"
                    )
                };
                t.violation(ms, worker, name, token, what);
            }
            outcome.name().to_owned()
        }
        _ => "error".to_owned(),
    }
}

/// Serves the register on `listener` until the process ends.
pub(super) async fn serve(listener: TcpListener, tally: Arc<Mutex<Tally>>) {
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
                    // Read under the locks: the register's times are in its order of requests.
                    let now = boot_ns();
                    answer(&mut cells, &mut tally, &line, now)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_register_fences_stale_writes_and_reports_what_fencing_missed() {
        let (mut cells, mut t) = (HashMap::new(), Tally::default());
        assert_eq!(answer(&mut cells, &mut t, "R a 5 1", 1_000), "0");
        assert_eq!(answer(&mut cells, &mut t, "W a 0 5 1 1500 0", 1_600), "ok");
        // Worker 2 (token 6) reads and checks its handle; paused, it writes only after worker 3
        // (token 7) has read: the read raised the fence, so the late write is fenced off, and
        // worker 3's write is not lost. Nothing to report: the handle said "not lost" before
        // token 7 was in use.
        assert_eq!(answer(&mut cells, &mut t, "R a 6 2", 2_000), "1");
        assert_eq!(answer(&mut cells, &mut t, "R a 7 3", 4_000), "1");
        assert_eq!(
            answer(&mut cells, &mut t, "W a 1 6 2 2500 0", 4_500),
            "stale"
        );
        assert_eq!(answer(&mut cells, &mut t, "W a 1 7 3 4800 0", 5_000), "ok");
        assert!(t.violations.is_empty(), "{:?}", t.violations);
        // The same token twice: two grants with one token.
        assert_eq!(answer(&mut cells, &mut t, "R a 7 4", 6_000), "2");
        assert_eq!(
            answer(&mut cells, &mut t, "W a 2 7 4 6500 0", 7_000),
            "violation"
        );
        assert_eq!(t.violations.len(), 1, "{:?}", t.violations);
        assert!(t.violations[0].starts_with("repeated token: worker 4"));
        assert_eq!((t.accepted, t.fenced_off), (2, 1));
        assert_eq!(answer(&mut cells, &mut t, "nonsense", 8_000), "error");
    }

    #[test]
    fn readers_and_writers_are_checked_against_each_other_when_the_run_ends() {
        let (mut cells, mut t) = (HashMap::new(), Tally::default());
        // Writer 1 (token 5) holds 1000..2000; reader 2 (token 5, the phase after it) reads
        // 2500..3000: fine.
        assert_eq!(answer(&mut cells, &mut t, "R a 5 1", 1_000), "0");
        assert_eq!(answer(&mut cells, &mut t, "W a 0 5 1 2000 0", 2_100), "ok");
        assert_eq!(answer(&mut cells, &mut t, "S a 5 2", 2_500), "1");
        assert_eq!(answer(&mut cells, &mut t, "E a 5 2 3000 0", 3_000), "ok");
        // Writer 3 (token 6) holds 4000..5000, reader 4 says it held 4500..5500: overlap.
        assert_eq!(answer(&mut cells, &mut t, "R a 6 3", 4_000), "1");
        assert_eq!(answer(&mut cells, &mut t, "S a 5 4", 4_500), "1");
        assert_eq!(answer(&mut cells, &mut t, "W a 1 6 3 5000 0", 5_000), "ok");
        assert_eq!(answer(&mut cells, &mut t, "E a 5 4 5500 0", 5_500), "ok");
        // A reader that knew it was lost overlaps nothing.
        assert_eq!(answer(&mut cells, &mut t, "S a 6 5", 4_600), "2");
        assert_eq!(answer(&mut cells, &mut t, "E a 6 5 5600 1", 5_600), "ok");
        // Writer 6 with token 6, after a reader with token 6 read: token not above it.
        assert_eq!(answer(&mut cells, &mut t, "R a 6 6", 7_000), "2");
        assert_eq!(
            answer(&mut cells, &mut t, "W a 2 6 6 7500 0", 7_500),
            "violation"
        );
        let before = t.violations.len();
        t.finish();
        let found = &t.violations[before..];
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(
            found[0].starts_with("reader and writer overlapped: worker 4"),
            "{found:?}"
        );
        assert!(found[1].starts_with("writer token not above"), "{found:?}");
    }

    #[test]
    fn a_handle_that_says_held_after_a_later_grant_read_is_a_violation() {
        let (mut cells, mut t) = (HashMap::new(), Tally::default());
        assert_eq!(answer(&mut cells, &mut t, "R a 7 1", 1_000), "0");
        // Token 8 was granted and read at 2000, while token 7's handle still said "not lost"
        // at 2500: two holds believed themselves valid at once.
        assert_eq!(answer(&mut cells, &mut t, "R a 8 2", 2_000), "0");
        assert_eq!(
            answer(&mut cells, &mut t, "W a 0 7 1 2500 0", 3_000),
            "stale"
        );
        assert_eq!(t.violations.len(), 1, "{:?}", t.violations);
        assert!(
            t.violations[0].starts_with("lost hold not reported: worker 1"),
            "{:?}",
            t.violations
        );
        // Token 8's own write: no later grant, nothing to report.
        assert_eq!(answer(&mut cells, &mut t, "W a 1 8 2 1900 0", 4_000), "ok");
        assert_eq!(t.violations.len(), 1, "{:?}", t.violations);
        // Token 6 granted after token 8 was in use: the tokens went backwards.
        assert_eq!(answer(&mut cells, &mut t, "R a 6 3", 5_000), "2");
        assert_eq!(
            answer(&mut cells, &mut t, "W a 2 6 3 5500 0", 6_000),
            "stale"
        );
        assert_eq!(t.violations.len(), 2, "{:?}", t.violations);
        assert!(
            t.violations[1].starts_with("token went backwards: worker 3"),
            "{:?}",
            t.violations
        );
        // Said "lost": fenced off, nothing to report.
        assert_eq!(answer(&mut cells, &mut t, "R a 6 4", 6_500), "2");
        assert_eq!(
            answer(&mut cells, &mut t, "W a 2 6 4 7000 1", 7_000),
            "stale"
        );
        assert_eq!(t.violations.len(), 2);
        assert_eq!(t.lost_reported, 1);
    }
}
