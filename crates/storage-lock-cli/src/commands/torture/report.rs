//! `--report DIR`: the run's history as JSON lines, its verdict, and a timeline page.
//!
//! `report.html` is one self-contained file (inline CSS and SVG, no script, nothing fetched) so
//! it opens from disk in any browser and can be attached to a ticket. One lane per worker
//! process; each hold is a bar from the read that began its critical section to its write,
//! labelled with its fencing token and coloured by lock name; a stale write fenced off is drawn
//! hollow, a hold whose handle already said "lost" faded, a hold with a violation in red. Kills
//! and skewed restarts are marked on their lane, pauses shade their lane, cuts shade them all.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use super::register::{Event, Outcome, Tally};
use crate::exit::{self, Failure};

/// Holds drawn at most (a long run's page stays light); the history keeps them all.
const MAX_BARS: usize = 20_000;
const LANE: f64 = 28.0;
const LEFT: f64 = 150.0;
const TOP: f64 = 30.0;
/// Lock names take these colours in turn.
const PALETTE: [&str; 8] = [
    "#3b82f6", "#10b981", "#f59e0b", "#8b5cf6", "#06b6d4", "#ec4899", "#84cc16", "#f97316",
];

fn failure(dir: &Path, e: &std::io::Error) -> Failure {
    Failure::new(
        exit::INTERNAL,
        format!("cannot write the report to {}: {e}", dir.display()),
    )
}

/// Creates `dir` (before the run: a directory that cannot be written is found at once).
///
/// # Errors
/// It cannot be created.
pub(super) fn prepare(dir: &Path) -> Result<PathBuf, Failure> {
    std::fs::create_dir_all(dir).map_err(|e| failure(dir, &e))?;
    Ok(dir.to_path_buf())
}

/// Writes `history.jsonl`, `verdict.json` and `report.html` into `dir`.
///
/// # Errors
/// A file cannot be written.
pub(super) fn write(dir: &Path, verdict: &serde_json::Value, t: &Tally) -> Result<(), Failure> {
    let history = std::fs::File::create(dir.join("history.jsonl")).map_err(|e| failure(dir, &e))?;
    let mut history = std::io::BufWriter::new(history);
    for event in &t.history {
        serde_json::to_writer(&mut history, &event.to_json())
            .map_err(std::io::Error::from)
            .and_then(|()| history.write_all(b"\n"))
            .map_err(|e| failure(dir, &e))?;
    }
    history.flush().map_err(|e| failure(dir, &e))?;
    std::fs::write(
        dir.join("verdict.json"),
        format!(
            "{}\n",
            serde_json::to_string_pretty(verdict).unwrap_or_default()
        ),
    )
    .map_err(|e| failure(dir, &e))?;
    std::fs::write(dir.join("report.html"), html(verdict, t)).map_err(|e| failure(dir, &e))
}

/// `s` escaped for HTML text and attribute values.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// One hold as drawn.
struct Bar {
    worker: u32,
    name: String,
    token: u64,
    from: f64,
    to: f64,
    /// `None`: the worker never wrote (killed mid-hold, or the run ended).
    outcome: Option<Outcome>,
    lost_reported: bool,
    violated: bool,
    /// A reader's hold: drawn thinner.
    shared: bool,
}

/// The holds in progress: worker → name, token, start, shared.
type Open = HashMap<u32, (String, u64, f64, bool)>;

/// The bar of the hold that `(worker, name, token)` ended at `ms` (its start as the register
/// saw it, or `ms` if it did not).
fn ended(
    open: &mut Open,
    (worker, name, token, ms): (u32, &str, u64, f64),
    outcome: Outcome,
    lost_reported: bool,
    shared: bool,
) -> Bar {
    let from = open
        .remove(&worker)
        .filter(|(n, tk, _, _)| n == name && *tk == token)
        .map_or(ms, |(_, _, from, _)| from);
    Bar {
        worker,
        name: name.to_owned(),
        token,
        from,
        to: ms,
        outcome: Some(outcome),
        lost_reported,
        violated: outcome == Outcome::Violation,
        shared,
    }
}

/// The page.
fn html(verdict: &serde_json::Value, t: &Tally) -> String {
    // Lanes in order of the workers' starts.
    let mut lanes: Vec<(u32, Option<String>)> = Vec::new();
    let mut end_ms: f64 = verdict["seconds"].as_f64().unwrap_or(0.0) * 1000.0;
    let mut open: Open = HashMap::new();
    let mut bars: Vec<Bar> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    let mut violated: Vec<(u32, u64, String, f64)> = Vec::new();
    for event in &t.history {
        match event {
            Event::Worker { worker, skew, .. } => lanes.push((*worker, skew.clone())),
            Event::Exit { ms, worker } => {
                // A hold its worker never finished ends with the worker.
                if let Some((name, token, from, shared)) = open.remove(worker) {
                    bars.push(Bar {
                        worker: *worker,
                        name,
                        token,
                        from,
                        to: *ms,
                        outcome: None,
                        lost_reported: false,
                        violated: false,
                        shared,
                    });
                }
            }
            Event::Read {
                ms,
                worker,
                name,
                token,
                shared,
                ..
            } => {
                end_ms = end_ms.max(*ms);
                if !names.contains(name) {
                    names.push(name.clone());
                }
                open.insert(*worker, (name.clone(), *token, *ms, *shared));
            }
            Event::ReadEnd {
                ms,
                worker,
                name,
                token,
                lost_reported,
            } => {
                end_ms = end_ms.max(*ms);
                let end = (*worker, name.as_str(), *token, *ms);
                bars.push(ended(&mut open, end, Outcome::Ok, *lost_reported, true));
            }
            Event::Write {
                ms,
                worker,
                name,
                token,
                outcome,
                lost_reported,
                ..
            } => {
                end_ms = end_ms.max(*ms);
                let end = (*worker, name.as_str(), *token, *ms);
                bars.push(ended(&mut open, end, *outcome, *lost_reported, false));
            }
            Event::Fault { until_ms, .. } => end_ms = end_ms.max(*until_ms),
            Event::Violation {
                ms,
                worker,
                name,
                token,
                ..
            } => violated.push((*worker, *token, name.clone(), *ms)),
        }
    }
    for (worker, (name, token, from, shared)) in open {
        bars.push(Bar {
            worker,
            name,
            token,
            from,
            to: end_ms,
            outcome: None,
            lost_reported: false,
            violated: false,
            shared,
        });
    }
    for bar in &mut bars {
        bar.violated |= violated
            .iter()
            .any(|(w, tk, n, _)| *w == bar.worker && *tk == bar.token && *n == bar.name);
    }
    let lane_of: HashMap<u32, usize> = lanes
        .iter()
        .enumerate()
        .map(|(i, (w, _))| (*w, i))
        .collect();
    let end_ms = end_ms.max(1.0);
    // About 60 px a second, within bounds a browser scrolls comfortably.
    let width = (end_ms / 1000.0 * 60.0).clamp(900.0, 20_000.0);
    let x = |ms: f64| LEFT + ms / end_ms * width;
    #[allow(clippy::cast_precision_loss)]
    let lanes_height = lanes.len() as f64 * LANE;
    let height = TOP + lanes_height + 10.0;
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" id="timeline" width="{:.0}" height="{height:.0}" font-family="ui-monospace,monospace" font-size="11">"#,
        LEFT + width + 20.0
    );
    // Lanes and their labels.
    for (i, (worker, skew)) in lanes.iter().enumerate() {
        #[allow(clippy::cast_precision_loss)]
        let y = TOP + i as f64 * LANE;
        let _ = write!(
            svg,
            r##"<rect class="lane" x="{LEFT}" y="{y:.1}" width="{width:.1}" height="{LANE}" fill="{}"/><text x="6" y="{:.1}" fill="#334155">worker {worker}{}</text>"##,
            if i % 2 == 0 { "#f8fafc" } else { "#f1f5f9" },
            y + LANE / 2.0 + 4.0,
            skew.as_deref()
                .map(|s| format!(" (clock {s})"))
                .unwrap_or_default()
        );
    }
    // The time axis: a tick every second (every ten past a minute).
    let step = if end_ms > 60_000.0 { 10_000.0 } else { 1_000.0 };
    let mut tick = 0.0;
    while tick <= end_ms {
        let _ = write!(
            svg,
            r##"<line x1="{0:.1}" x2="{0:.1}" y1="{1}" y2="{2:.1}" stroke="#cbd5e1" stroke-width="0.5"/><text x="{0:.1}" y="{3}" text-anchor="middle" fill="#64748b">{4}s</text>"##,
            x(tick),
            TOP - 4.0,
            TOP + lanes_height,
            TOP - 8.0,
            tick / 1000.0
        );
        tick += step;
    }
    // Faults under the holds: pauses and cuts shade, kills and skews mark.
    for event in &t.history {
        let Event::Fault {
            ms,
            fault,
            worker,
            until_ms,
        } = event
        else {
            continue;
        };
        let lane = worker.and_then(|w| lane_of.get(&w).copied());
        #[allow(clippy::cast_precision_loss)]
        let (y, h) = match lane {
            Some(l) => (TOP + l as f64 * LANE, LANE),
            None => (TOP, lanes_height),
        };
        let title = format!(
            "{fault}{} from {ms:.0} ms to {until_ms:.0} ms",
            worker
                .map(|w| format!(" of worker {w}"))
                .unwrap_or_default()
        );
        match *fault {
            "pause" | "cut" => {
                let _ = write!(
                    svg,
                    r#"<rect class="fault {fault}" x="{:.1}" y="{y:.1}" width="{:.1}" height="{h:.1}" fill="{}" fill-opacity="0.35"><title>{}</title></rect>"#,
                    x(*ms),
                    (x(*until_ms) - x(*ms)).max(2.0),
                    if *fault == "pause" {
                        "#facc15"
                    } else {
                        "#60a5fa"
                    },
                    esc(&title)
                );
            }
            _ => {
                let _ = write!(
                    svg,
                    r##"<text class="fault {fault}" x="{:.1}" y="{:.1}" fill="#0f172a" font-size="14" text-anchor="middle">{}<title>{}</title></text>"##,
                    x(*ms),
                    y + h / 2.0 + 5.0,
                    if *fault == "kill" { "✕" } else { "±" },
                    esc(&title)
                );
            }
        }
    }
    // The holds.
    for bar in bars.iter().take(MAX_BARS) {
        let Some(&lane) = lane_of.get(&bar.worker) else {
            continue;
        };
        // A reader's bar is the lower half of the lane's.
        let (top, tall) = if bar.shared {
            (LANE / 2.0, LANE / 2.0 - 5.0)
        } else {
            (5.0, LANE - 10.0)
        };
        #[allow(clippy::cast_precision_loss)]
        let y = TOP + lane as f64 * LANE + top;
        let colour = if bar.violated {
            "#dc2626"
        } else {
            PALETTE[names.iter().position(|n| *n == bar.name).unwrap_or(0) % PALETTE.len()]
        };
        let (fill, stroke, class) = match bar.outcome {
            _ if bar.violated => (colour, colour, "hold violation"),
            Some(Outcome::Stale) => ("none", colour, "hold stale"),
            None => ("none", colour, "hold unfinished"),
            _ if bar.shared => (colour, colour, "hold shared"),
            _ => (colour, colour, "hold"),
        };
        let (x0, x1) = (x(bar.from), x(bar.to));
        let w = (x1 - x0).max(2.0);
        let title = format!(
            "{}{} token {}: {:.0}–{:.0} ms, {}{}",
            if bar.shared { "read of " } else { "" },
            bar.name,
            bar.token,
            bar.from,
            bar.to,
            match bar.outcome {
                Some(Outcome::Ok) if bar.shared => "read ended",
                Some(Outcome::Ok) => "write accepted",
                Some(Outcome::Stale) => "stale write fenced off",
                Some(Outcome::Violation) => "write with a repeated token",
                None => "no write (killed or cut short)",
            },
            if bar.lost_reported {
                ", the handle had said lost"
            } else {
                ""
            }
        );
        let _ = write!(
            svg,
            r#"<rect class="{class}" x="{x0:.1}" y="{y:.1}" width="{w:.1}" height="{tall:.1}" rx="2" fill="{fill}" fill-opacity="{}" stroke="{stroke}" stroke-dasharray="{}"><title>{}</title></rect>"#,
            if bar.lost_reported { "0.35" } else { "0.85" },
            if bar.outcome.is_none() { "3 2" } else { "none" },
            esc(&title)
        );
        #[allow(clippy::cast_precision_loss)]
        if !bar.shared && w > 7.0 * (bar.token.to_string().len() as f64) {
            let _ = write!(
                svg,
                r##"<text x="{:.1}" y="{:.1}" fill="{}" pointer-events="none">{}</text>"##,
                x0 + 3.0,
                y + LANE / 2.0,
                if fill == "none" { "#0f172a" } else { "#ffffff" },
                bar.token
            );
        }
    }
    // Violations: a red line across every lane.
    for (worker, token, name, ms) in &violated {
        let _ = write!(
            svg,
            r##"<line class="violation-mark" x1="{0:.1}" x2="{0:.1}" y1="{1}" y2="{2:.1}" stroke="#dc2626" stroke-width="1.5"><title>violation: worker {3} token {4} of {5}</title></line>"##,
            x(*ms),
            TOP,
            TOP + lanes_height,
            worker,
            token,
            esc(name)
        );
    }
    svg.push_str("</svg>");

    let ok = verdict["verdict"] == "ok";
    let mut page = String::new();
    let _ = write!(
        page,
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>storage-lock torture: {storage}</title>
<style>
body {{ font: 14px system-ui, sans-serif; margin: 20px; color: #0f172a; }}
h1 {{ font-size: 20px; margin: 0 0 4px; }}
.verdict {{ display: inline-block; padding: 4px 10px; border-radius: 4px; font-weight: 600; color: #fff; }}
.ok {{ background: #16a34a; }} .violated {{ background: #dc2626; }}
dl {{ display: grid; grid-template-columns: max-content auto; gap: 2px 14px; }}
dt {{ color: #64748b; }} dd {{ margin: 0; }}
.scroll {{ overflow-x: auto; border: 1px solid #e2e8f0; border-radius: 4px; }}
.legend span {{ margin-right: 14px; }} .sw {{ display: inline-block; width: 14px; height: 10px; vertical-align: middle; margin-right: 4px; border: 1px solid #475569; }}
li.violation {{ color: #b91c1c; font-family: ui-monospace, monospace; }}
</style></head><body>
<h1>storage-lock torture</h1>
<p><span class="verdict {class}" id="verdict">{verdict}</span> {storage}</p>
<dl>
<dt>ran</dt><dd>{seconds} s, {workers} workers taking {kind} locks on {names} names, lease {lease} ms{mutated}</dd>
<dt>grants</dt><dd>{grants} (writes accepted {accepted}, stale writes fenced off {stale}, by holds that knew they were lost {lost})</dd>
<dt>faults</dt><dd>{faults}</dd>
<dt>violations</dt><dd id="violation-count">{nviol}</dd>
</dl>
<p class="legend"><span><i class="sw" style="background:#3b82f6"></i>hold (token), colour per lock name; a reader's in the lower half</span><span><i class="sw" style="background:none"></i>stale write fenced off</span><span><i class="sw" style="background:#3b82f6;opacity:.35"></i>handle had said lost</span><span><i class="sw" style="background:#dc2626"></i>violation</span><span><i class="sw" style="background:#facc15;opacity:.5"></i>pause</span><span><i class="sw" style="background:#60a5fa;opacity:.5"></i>cut</span><span>✕ kill</span><span>± skewed clock (a worker started with its wall clock an hour off)</span></p>
<div class="scroll">{svg}</div>
"#,
        storage = esc(verdict["storage"].as_str().unwrap_or_default()),
        class = if ok { "ok" } else { "violated" },
        verdict = if ok { "ok" } else { "VIOLATED" },
        seconds = verdict["seconds"],
        workers = verdict["workers"],
        kind = esc(verdict["kind"].as_str().unwrap_or_default()),
        names = verdict["names"],
        lease = verdict["lease_ms"],
        mutated = verdict["mutated"]
            .as_str()
            .map(|m| format!(", the storage mutated ({})", esc(m)))
            .unwrap_or_default(),
        grants = t.reads,
        accepted = t.accepted,
        stale = t.fenced_off,
        lost = t.lost_reported,
        faults = esc(&verdict["faults"]
            .as_object()
            .map(|f| {
                f.iter()
                    .map(|(k, n)| format!("{k} {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "none".to_owned())),
        nviol = t.violations.len(),
    );
    if bars.len() > MAX_BARS {
        let _ = write!(
            page,
            "<p>The timeline shows the first {MAX_BARS} of {} holds; history.jsonl has them all.</p>",
            bars.len()
        );
    }
    if t.history_cut {
        page.push_str("<p>The history was cut short: the run outgrew its memory bound.</p>");
    }
    if !t.violations.is_empty() {
        page.push_str("<h2>Violations</h2><ol>");
        for v in &t.violations {
            let _ = write!(page, r#"<li class="violation">{}</li>"#, esc(v));
        }
        page.push_str("</ol>");
    }
    page.push_str("</body></html>\n");
    page
}
