//! The live web page at `/ui`: held locks with their holders, fencing tokens and time left,
//! updated over server-sent events; a page per lock with its record, what the lock kinds keep
//! beside it (a semaphore's permits, a reader-writer lock's readers, a fair lock's queue) and
//! recent events; an admin force-release with confirmation.
//!
//! * **Server-rendered** (maud escapes every value: a name or note `<script>` shows as text), no
//!   build step, no external fonts or scripts: it works offline. With JavaScript off the pages
//!   render and refresh by reload; with it, ~60 lines of inline script apply the snapshots of
//!   `/ui/events` (SSE, every 500 ms) with `textContent` and count time left down.
//! * **Sign-in** with the same bearer tokens as the API: a form that sets an `HttpOnly`,
//!   `SameSite=Strict` cookie (path `/ui`) holding an opaque session id — never the token; the
//!   session (12 h, kept in this server process: sign in again on another replica) maps to the
//!   token. The page shows only what the token may `read`, and the force-release button only
//!   where it is `admin`. Without `--auth` there is nothing to sign in to (as with the API,
//!   everyone may do everything).
//! * **Force-release** posts a form that carries a CSRF token (an HMAC of the session under a
//!   secret of this server process) and the fencing token the operator saw; it asks for
//!   confirmation naming the holder and the token (a dialog with JavaScript, a confirmation page
//!   without). It goes through the same operation as the API, so it is logged on the
//!   `storage_lock::audit` target with who did it, and the fencing token moves forward.
//! * **Counters** (held, acquisitions/s over the last 10 s, contention and losses in the last
//!   minute) and per-lock events come from the events of this server's engine: what this server
//!   saw, not what other replicas did. "Expiring" means less than 10 % of the hold's span
//!   (acquired → expiry) is left.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::Form;
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use maud::{DOCTYPE, Markup, PreEscaped, html};
use serde::Deserialize;
use storage_lock_core::{LockEventKind, StorageExt};

use storage_lock_wire::{LockState, MAX_NOTE_BYTES, MAX_PAGE, millis, rfc3339};

use crate::auth::Permission;
use crate::service::{self, Caller, LockService, LockView};

type Shared = State<Arc<LockService>>;

const COOKIE: &str = "sl_session";
/// How often `/ui/events` sends a snapshot.
const SNAPSHOT_EVERY: Duration = Duration::from_millis(500);

fn kind_name(k: LockEventKind) -> &'static str {
    match k {
        LockEventKind::Acquired => "acquired",
        LockEventKind::Contended => "contended",
        LockEventKind::TimedOut => "timed out",
        LockEventKind::Cancelled => "cancelled",
        LockEventKind::Renewed => "renewed",
        LockEventKind::RenewFailed => "renewal refused (lost)",
        LockEventKind::Lost => "lost",
        LockEventKind::Released => "released",
        LockEventKind::ForceReleased => "force-released",
        _ => "other",
    }
}

/// Who looks at the page.
struct Viewer {
    caller: Caller,
    auth: bool,
    /// The CSRF token of this session (in every form the page posts).
    csrf: String,
}

fn cookie_token(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.to_owned())
}

impl Viewer {
    /// Whether a form post carries this session's CSRF token and does not come from another
    /// site (see [`same_origin`]).
    fn posted_here(&self, csrf: &str, headers: &HeaderMap) -> bool {
        let token_ok: bool =
            subtle::ConstantTimeEq::ct_eq(self.csrf.as_bytes(), csrf.as_bytes()).into();
        token_ok && same_origin(headers)
    }

    /// The viewer; `None` when the server has auth and the cookie is missing or no longer
    /// valid (pages then send the sign-in page).
    fn of(st: &LockService, headers: &HeaderMap) -> Option<Self> {
        let session = cookie_token(headers);
        let token = session
            .as_deref()
            .and_then(|id| st.recorder.session_token(id));
        let value = token.as_ref().map(|t| format!("Bearer {t}"));
        let caller = Caller::from_authorization(st, value.as_deref()).ok()?;
        let csrf = st.recorder.csrf(session.as_deref().unwrap_or("anonymous"));
        Some(Self {
            caller,
            auth: st.auth.is_some(),
            csrf,
        })
    }
}

pub(crate) fn routes() -> Router<Arc<LockService>> {
    Router::new()
        .route("/ui", get(locks_page))
        .route("/ui/", get(|| async { Redirect::to("/ui") }))
        .route("/ui/locks/{name}", get(lock_page))
        .route("/ui/locks/{name}/force-release", post(force_release))
        .route("/ui/events", get(events))
        .route("/ui/login", get(login_page).post(login))
        .route("/ui/logout", post(logout))
        .layer(axum::middleware::map_response(page_headers))
}

/// No framing (clickjacking), nothing loaded from elsewhere, nothing cached, no referrer to
/// other sites (`no-referrer` would make browsers send `Origin: null` on our own forms).
async fn page_headers(mut res: Response) -> Response {
    let h = res.headers_mut();
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; \
             connect-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; \
             base-uri 'none'",
        ),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    res
}

/// Percent-encodes a lock name as one path segment.
fn segment(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

const STYLE: &str = r#"
:root { --bg:#f7f7f5; --fg:#1d2125; --muted:#667; --line:#e2e2de; --held:#1f7a3f; --held-bg:#e3f4e8;
  --warn:#a15c00; --warn-bg:#fff1d6; --free:#6b7280; --free-bg:#eef0f2; --accent:#2251c7; --danger:#b42318; }
* { box-sizing: border-box; }
body { margin:0; font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;
  background:var(--bg); color:var(--fg); }
header { display:flex; align-items:center; gap:1rem; padding:.8rem 1.5rem; background:#fff; border-bottom:1px solid var(--line); }
header h1 { font-size:1.1rem; margin:0; } header h1 a { color:inherit; text-decoration:none; }
header .who { margin-left:auto; color:var(--muted); font-size:.9rem; display:flex; gap:.6rem; align-items:center; }
main { max-width:1200px; margin:0 auto; padding:1.2rem 1.5rem 3rem; }
.counters { display:grid; grid-template-columns:repeat(4,minmax(0,1fr)); gap:.8rem; margin-bottom:1.2rem; }
.counter { background:#fff; border:1px solid var(--line); border-radius:10px; padding:.7rem 1rem; }
.counter b { display:block; font-size:1.6rem; font-variant-numeric:tabular-nums; }
.counter span { color:var(--muted); font-size:.85rem; }
form.filter { display:flex; gap:.5rem; margin-bottom:1rem; flex-wrap:wrap; }
input[type=text], input[type=password] { font:inherit; padding:.45rem .6rem; border:1px solid #c9c9c4; border-radius:7px; min-width:14rem; }
button, .button { font:inherit; padding:.45rem .9rem; border-radius:7px; border:1px solid #c9c9c4; background:#fff; cursor:pointer; color:inherit; text-decoration:none; }
button.danger { background:var(--danger); color:#fff; border-color:var(--danger); }
table { width:100%; border-collapse:collapse; background:#fff; border:1px solid var(--line); border-radius:10px; overflow:hidden; }
th, td { text-align:left; padding:.55rem .8rem; border-bottom:1px solid var(--line); vertical-align:top; }
th { font-size:.8rem; text-transform:uppercase; letter-spacing:.04em; color:var(--muted); background:#fbfbfa; }
th a { color:inherit; }
td.num, th.num { text-align:right; font-variant-numeric:tabular-nums; }
td.name a { color:var(--accent); font-weight:600; word-break:break-all; }
.note { color:var(--muted); word-break:break-word; }
.badge { display:inline-block; padding:.1rem .55rem; border-radius:99px; font-size:.8rem; font-weight:600; }
.held .badge, .badge.held { background:var(--held-bg); color:var(--held); }
.expiring .badge, .badge.expiring { background:var(--warn-bg); color:var(--warn); }
.badge.free, .badge.released, .badge.expired { background:var(--free-bg); color:var(--free); }
tr.held td.left { color:var(--held); font-weight:600; }
tr.expiring td.left { color:var(--warn); font-weight:600; }
tr.held td.left::before, tr.expiring td.left::before { content:"● "; font-size:.8em; }
.empty { padding:2rem; text-align:center; color:var(--muted); }
dl { display:grid; grid-template-columns:max-content 1fr; gap:.4rem 1.2rem; background:#fff; border:1px solid var(--line); border-radius:10px; padding:1rem 1.2rem; }
dt { color:var(--muted); } dd { margin:0; word-break:break-all; font-variant-numeric:tabular-nums; }
.flash { padding:.6rem 1rem; border-radius:8px; background:var(--held-bg); color:var(--held); margin-bottom:1rem; }
.flash.error { background:#fde8e7; color:var(--danger); }
section { margin-top:1.5rem; } h2 { font-size:1rem; }
@media (max-width: 700px) {
  header { padding:.7rem 1rem; } main { padding:1rem; }
  .counters { grid-template-columns:repeat(2,minmax(0,1fr)); }
  table, thead, tbody, tr, td { display:block; } thead { display:none; }
  tr { border-bottom:1px solid var(--line); padding:.4rem 0; } td { border:0; padding:.2rem .9rem; }
  td.num { text-align:left; } td[data-label]::before { content:attr(data-label) ": "; color:var(--muted); font-size:.85rem; }
  dl { grid-template-columns:1fr; }
}
"#;

fn page(title: &str, viewer: &Viewer, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " — storage-lock" }
                style { (PreEscaped(STYLE)) }
            }
            body {
                header {
                    h1 { a href="/ui" { "storage-lock" } }
                    div.who {
                        @if viewer.auth {
                            span { "signed in as " b { (viewer.caller.who()) } }
                            form method="post" action="/ui/logout" {
                                input type="hidden" name="csrf" value=(viewer.csrf.clone());
                                button type="submit" { "Sign out" }
                            }
                        }
                    }
                }
                main { (body) }
            }
        }
    }
}

#[derive(Deserialize)]
pub(crate) struct LocksQuery {
    prefix: Option<String>,
    sort: Option<String>,
}

/// A held lock as the page shows it.
#[derive(serde::Serialize)]
struct Row {
    name: String,
    href: String,
    holder: String,
    note: String,
    token: String,
    acquired_at: String,
    left_ms: u64,
    span_ms: u64,
}

#[derive(serde::Serialize)]
struct Snapshot {
    rows: Vec<Row>,
    held: usize,
    rate: String,
    contended: usize,
    lost: usize,
    /// The storage could not be listed: the table is not to be trusted.
    error: Option<String>,
    /// More records than the page reads: the table shows the first ones.
    capped: bool,
}

/// The span "expiring" is measured against: from the last grant or renewal this server saw
/// (about one lease), else from the acquisition (exact for a hold never renewed).
fn span_ms(st: &LockService, key: &str, l: &LockView) -> u64 {
    let Some(expires) = l.expires_at else {
        return 0;
    };
    let from = match (st.recorder.last_grant(key), l.acquired_at) {
        (Some(seen), Some(acquired)) => seen.max(acquired),
        (seen, acquired) => match seen.or(acquired) {
            Some(t) => t,
            None => return 0,
        },
    };
    millis(expires.duration_since(from).unwrap_or_default())
}

/// Pages of the listing the table reads at most (so at most this × 1000 records).
const MAX_PAGES: usize = 20;

async fn snapshot(st: &LockService, viewer: &Viewer, prefix: &str, by_name: bool) -> Snapshot {
    let mut rows: Vec<Row> = Vec::new();
    let mut cursor = None;
    let mut error = None;
    let mut capped = false;
    for page in 0.. {
        if page == MAX_PAGES {
            capped = true;
            break;
        }
        let q = service::List {
            prefix: prefix.to_owned(),
            cursor: cursor.take(),
            limit: Some(MAX_PAGE),
        };
        let list = match st.list(&viewer.caller, q).await {
            Ok(list) => list,
            Err(e) => {
                error = Some(e.message().to_owned());
                break;
            }
        };
        rows.extend(
            list.locks
                .into_iter()
                .filter(|l| l.state == LockState::Held)
                .map(|l| {
                    let key = st
                        .locks
                        .key_for(&l.name)
                        .map(|k| k.into_owned())
                        .unwrap_or_default();
                    Row {
                        href: format!("/ui/locks/{}", segment(&l.name)),
                        holder: l
                            .holder
                            .as_ref()
                            .map(|h| format!("{}:{}", h.host, h.pid))
                            .unwrap_or_default(),
                        note: l
                            .holder
                            .as_ref()
                            .and_then(|h| h.note.clone())
                            .unwrap_or_default(),
                        token: l.fencing.map(|t| t.to_string()).unwrap_or_default(),
                        acquired_at: l.acquired_at.map(rfc3339).unwrap_or_default(),
                        left_ms: l.expires_in.map(millis).unwrap_or(0),
                        span_ms: span_ms(st, &key, &l),
                        name: l.name,
                    }
                }),
        );
        match list.next_cursor {
            Some(next) => cursor = Some(next),
            None => break,
        }
    }
    if by_name {
        rows.sort_by(|a, b| a.name.cmp(&b.name));
    } else {
        rows.sort_by_key(|r| r.left_ms);
    }
    let now = SystemTime::now();
    // Only events of locks this viewer may read.
    let readable = |key: &str| viewer.caller.may(st, key, Permission::Read);
    let count = |secs: u64, kinds: &[LockEventKind]| {
        st.recorder
            .count_since(now - Duration::from_secs(secs), kinds, readable)
    };
    Snapshot {
        held: rows.len(),
        rows,
        rate: format!("{:.1}", count(10, &[LockEventKind::Acquired]) as f64 / 10.0),
        contended: count(60, &[LockEventKind::Contended]),
        // A holder that learned it lost (a refused renewal, a lost session lock); a
        // force-release shows up as the evicted holder's refused renewal.
        lost: count(60, &[LockEventKind::RenewFailed, LockEventKind::Lost]),
        error,
        capped,
    }
}

fn left_text(ms: u64) -> String {
    if ms >= 3_600_000 {
        format!("{}h {:02}m", ms / 3_600_000, ms / 60_000 % 60)
    } else if ms >= 60_000 {
        format!("{}m {:02}s", ms / 60_000, ms / 1000 % 60)
    } else {
        format!("{:.1}s", ms as f64 / 1000.0)
    }
}

fn row_class(r: &Row) -> &'static str {
    if r.span_ms > 0 && r.left_ms * 10 < r.span_ms {
        "expiring"
    } else {
        "held"
    }
}

const SCRIPT: &str = r#"
(function () {
  var table = document.getElementById('locks');
  if (!table || !window.EventSource) return;
  var tbody = table.querySelector('tbody');
  var received = Date.now();
  function fmt(ms) {
    if (ms >= 3600000) return Math.floor(ms / 3600000) + 'h ' + String(Math.floor(ms / 60000) % 60).padStart(2, '0') + 'm';
    if (ms >= 60000) return Math.floor(ms / 60000) + 'm ' + String(Math.floor(ms / 1000) % 60).padStart(2, '0') + 's';
    return (ms / 1000).toFixed(1) + 's';
  }
  function cell(tr, label, cls, text) {
    var td = document.createElement('td');
    td.className = cls; td.setAttribute('data-label', label); td.textContent = text; tr.appendChild(td); return td;
  }
  var err = document.getElementById('err');
  function render(d) {
    received = Date.now();
    if (d.error) { err.hidden = false; err.textContent = 'The storage could not be read: ' + d.error; return; }
    err.hidden = true;
    ['held', 'rate', 'contended', 'lost'].forEach(function (k) { document.getElementById('c-' + k).textContent = d[k]; });
    tbody.textContent = '';
    if (d.rows.length === 0) {
      var tr = document.createElement('tr'); var td = cell(tr, '', 'empty', 'No lock is held.'); td.colSpan = 6; tbody.appendChild(tr); return;
    }
    d.rows.forEach(function (r) {
      var tr = document.createElement('tr');
      tr.dataset.left = r.left_ms; tr.dataset.span = r.span_ms; tr.dataset.name = r.name;
      var name = cell(tr, 'Lock', 'name', '');
      var a = document.createElement('a'); a.href = r.href; a.textContent = r.name; name.appendChild(a);
      cell(tr, 'Holder', 'holder', r.holder);
      cell(tr, 'Note', 'note', r.note);
      cell(tr, 'Fencing token', 'num token', r.token);
      cell(tr, 'Acquired', 'acquired', r.acquired_at);
      cell(tr, 'Time left', 'num left', fmt(r.left_ms));
      tbody.appendChild(tr);
    });
    tick();
  }
  function tick() {
    var gone = Date.now() - received;
    tbody.querySelectorAll('tr[data-left]').forEach(function (tr) {
      var left = Math.max(0, Number(tr.dataset.left) - gone), span = Number(tr.dataset.span);
      tr.className = span > 0 && left * 10 < span ? 'expiring' : 'held';
      tr.querySelector('td.left').textContent = fmt(left);
    });
  }
  var es = new EventSource(table.dataset.events);
  es.addEventListener('locks', function (e) { render(JSON.parse(e.data)); });
  es.onerror = function () { err.hidden = false; err.textContent = 'Live updates interrupted; retrying…'; };
  setInterval(tick, 100);
})();
"#;

async fn locks_page(
    State(st): Shared,
    headers: HeaderMap,
    Query(q): Query<LocksQuery>,
) -> Response {
    st.recorder.start(&st.locks);
    let Some(viewer) = Viewer::of(&st, &headers) else {
        return Redirect::to("/ui/login").into_response();
    };
    let prefix = q.prefix.unwrap_or_default();
    let by_name = q.sort.as_deref() == Some("name");
    let snap = snapshot(&st, &viewer, &prefix, by_name).await;
    let events = format!(
        "/ui/events?prefix={}{}",
        segment(&prefix),
        if by_name { "&sort=name" } else { "" }
    );
    let sort_link = |sort: &str| format!("/ui?prefix={}&sort={sort}", segment(&prefix));
    let body = html! {
        div.counters {
            div.counter { b #c-held { (snap.held) } span { "held" } }
            div.counter { b #c-rate { (snap.rate) } span { "acquisitions/s (10 s)" } }
            div.counter { b #c-contended { (snap.contended) } span { "contended (1 min)" } }
            div.counter { b #c-lost { (snap.lost) } span { "lost or broken (1 min)" } }
        }
        div #err .flash.error hidden[snap.error.is_none()] {
            @if let Some(e) = &snap.error { "The storage could not be read: " (e) }
        }
        @if snap.capped { p.note { "Showing the held locks among the first 20 000 records; narrow the prefix to see the rest." } }
        form.filter method="get" action="/ui" {
            input type="text" name="prefix" value=(prefix) placeholder="filter by name prefix" aria-label="name prefix";
            @if by_name { input type="hidden" name="sort" value="name"; }
            button type="submit" { "Filter" }
            a.button href="/ui" { "All" }
        }
        table #locks data-events=(events) {
            thead { tr {
                th { a href=(sort_link("name")) { "Lock" } }
                th { "Holder" } th { "Note" } th.num { "Fencing token" } th { "Acquired" }
                th.num { a href=(sort_link("left")) { "Time left" } }
            } }
            tbody {
                @if snap.rows.is_empty() {
                    tr { td.empty colspan="6" { "No lock is held." } }
                }
                @for r in &snap.rows {
                    tr class=(row_class(r)) data-left=(r.left_ms) data-span=(r.span_ms) data-name=(r.name) {
                        td.name data-label="Lock" { a href=(r.href) { (r.name) } }
                        td.holder data-label="Holder" { (r.holder) }
                        td.note data-label="Note" { (r.note) }
                        td.num.token data-label="Fencing token" { (r.token) }
                        td.acquired data-label="Acquired" { (r.acquired_at) }
                        td.num.left data-label="Time left" { (left_text(r.left_ms)) }
                    }
                }
            }
        }
        script { (PreEscaped(SCRIPT)) }
    };
    Html(page("Locks", &viewer, body).into_string()).into_response()
}

/// `/ui/events`: a snapshot of the locks table every 500 ms, as `event: locks`.
async fn events(State(st): Shared, headers: HeaderMap, Query(q): Query<LocksQuery>) -> Response {
    st.recorder.start(&st.locks);
    let Some(viewer) = Viewer::of(&st, &headers) else {
        return StatusCode::UNAUTHORIZED.into_response();
    };
    let prefix = q.prefix.unwrap_or_default();
    if !plain_text(&prefix) {
        return (StatusCode::BAD_REQUEST, "invalid prefix\n").into_response();
    }
    let Some(slot) = StreamSlot::take(&st) else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "too many live pages open\n",
        )
            .into_response();
    };
    let by_name = q.sort.as_deref() == Some("name");
    let shutdown = st.shutdown.clone();
    let stream = futures_util::stream::unfold(
        (st, viewer, prefix, slot, true),
        move |(st, viewer, prefix, slot, first)| async move {
            if !first {
                tokio::select! {
                    () = tokio::time::sleep(SNAPSHOT_EVERY) => {}
                    // The server is shutting down: end the stream so the shutdown can finish.
                    () = shutdown_of(&st) => return None,
                }
            }
            let snap = snapshot(&st, &viewer, &prefix, by_name).await;
            let data = serde_json::to_string(&snap).unwrap_or_else(|_| "{}".into());
            let ev: Result<Event, Infallible> = Ok(Event::default().event("locks").data(data));
            Some((ev, (st, viewer, prefix, slot, false)))
        },
    );
    let stream = futures_util::StreamExt::take_until(stream, shutdown.cancelled_owned());
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

async fn shutdown_of(st: &LockService) {
    st.shutdown.cancelled().await;
}

/// Live pages open at once (each reads the storage every 500 ms).
const MAX_STREAMS: usize = 64;

/// One of the [`MAX_STREAMS`] places; given back when the stream ends.
struct StreamSlot(Arc<LockService>);

impl StreamSlot {
    fn take(st: &Arc<LockService>) -> Option<Self> {
        use std::sync::atomic::Ordering;
        let n = st.recorder.streams.fetch_add(1, Ordering::AcqRel);
        if n >= MAX_STREAMS {
            st.recorder.streams.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Self(st.clone()))
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.0
            .recorder
            .streams
            .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// Free text from a query or form: at most 1 KiB, no control characters.
fn plain_text(s: &str) -> bool {
    s.len() <= MAX_NOTE_BYTES && !s.chars().any(char::is_control)
}

#[derive(Deserialize)]
pub(crate) struct Flash {
    /// `released` or `ended` (with `t`, the fencing token), or `failed`.
    done: Option<String>,
    t: Option<u64>,
}

async fn lock_page(
    State(st): Shared,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(flash): Query<Flash>,
) -> Response {
    st.recorder.start(&st.locks);
    let Some(viewer) = Viewer::of(&st, &headers) else {
        return Redirect::to("/ui/login").into_response();
    };
    let info = match st
        .get(&viewer.caller, &name, service::Read::default())
        .await
    {
        Ok(i) => i,
        Err(e) => {
            let body =
                html! { div.flash.error { (e.message()) } p { a href="/ui" { "All locks" } } };
            let status = e.kind().http_status();
            return (status, Html(page("Lock", &viewer, body).into_string())).into_response();
        }
    };
    let floor = st.locks.storage().fencing_floor().await.ok();
    // What the lock kinds keep beside the name; a page without them if they cannot be read.
    let parts = st.parts(&viewer.caller, &name).await.ok();
    let key = st
        .locks
        .key_for(&name)
        .map(|k| k.into_owned())
        .unwrap_or_default();
    let recent = st.recorder.of(&key, 50);
    let since = st
        .recorder
        .since()
        .map(|t| humantime::format_rfc3339_seconds(t).to_string())
        .unwrap_or_default();
    let since_text = if recent.is_empty() {
        format!(
            "None since this server started recording at {since}. Each replica keeps its own history (GET /v1/locks/{{name}}/events)."
        )
    } else {
        format!(
            "Since {since}, on this replica only (each keeps its own; GET /v1/locks/{{name}}/events)."
        )
    };
    let admin = viewer.caller.may(&st, &name, Permission::Admin);
    let state = info.state.as_str();
    let holder = info
        .holder
        .as_ref()
        .map(|h| format!("{}:{}", h.host, h.pid))
        .unwrap_or_else(|| "—".into());
    let token = info.fencing.map(|t| t.to_string());
    let body = html! {
        p { a href="/ui" { "← All locks" } }
        @match (flash.done.as_deref(), flash.t) {
            (Some("released"), Some(t)) => div.flash { "Force-released the hold with fencing token " (t) "." },
            (Some("ended"), Some(t)) => div.flash { "Nothing to do: the hold with fencing token " (t) " had already ended." },
            (Some("failed"), _) => div.flash.error { "The force-release failed; see the server's log." },
            _ => {}
        }
        h2 style="font-size:1.3rem; word-break:break-all" { (name) " " span class={"badge " (state)} { (state) } }
        dl {
            dt { "State" } dd { (state) }
            dt { "Fencing token" } dd.token { (token.clone().unwrap_or_else(|| "—".into())) }
            dt { "Fencing floor" } dd { (floor.map(|f| f.to_string()).unwrap_or_else(|| "—".into())) }
            dt { "Holder" } dd.holder { (holder) }
            dt { "Note" } dd.note { (info.holder.as_ref().and_then(|h| h.note.clone()).unwrap_or_else(|| "—".into())) }
            dt { "Acquired at" } dd { (info.acquired_at.map(rfc3339).unwrap_or_else(|| "—".into())) }
            dt { "Expires at" } dd { (info.expires_at.map(rfc3339).unwrap_or_else(|| "—".into())) }
            dt { "Time left" } dd { (info.expires_in.map(|d| left_text(millis(d))).unwrap_or_else(|| "—".into())) }
        }
        @if admin && info.state == LockState::Held {
            @let confirm = format!("Force-release {name} held by {holder} (fencing token {})? The holder loses the lock at its next renewal.", token.clone().unwrap_or_default());
            section {
                form #force method="post" action=(format!("/ui/locks/{}/force-release", segment(&name)))
                    data-confirm=(confirm) onsubmit="if (!confirm(this.dataset.confirm)) return false; this.confirmed.value = 'yes'; return true;" {
                    input type="hidden" name="csrf" value=(viewer.csrf.clone());
                    input type="hidden" name="expected_fencing_token" value=(token.clone().unwrap_or_default());
                    input type="hidden" name="confirmed" value="";
                    input type="text" name="reason" placeholder="reason (logged)" aria-label="reason";
                    " "
                    button.danger type="submit" { "Force-release" }
                }
            }
        }
        @if let Some(parts) = &parts {
            (parts_section(&name, parts))
        }
        section {
            h2 { "Recent events seen by this server" }
            p.note { (since_text) }
            @if !recent.is_empty() {
                table #events {
                    thead { tr { th { "When" } th { "Event" } th.num { "Fencing token" } th { "By" } th { "Reason" } } }
                    tbody {
                        @for e in recent.iter().rev() {
                            tr {
                                td data-label="When" { (humantime::format_rfc3339_millis(e.at).to_string()) }
                                td data-label="Event" { (kind_name(e.kind)) }
                                td.num data-label="Fencing token" { (e.fencing.map(|f| f.to_string()).unwrap_or_default()) }
                                td data-label="By" { (e.admin.as_ref().map(|a| a.by.as_str()).unwrap_or("")) }
                                td data-label="Reason" { (e.admin.as_ref().and_then(|a| a.reason.as_deref()).unwrap_or("")) }
                            }
                        }
                    }
                }
            }
        }
    };
    Html(page(&name, &viewer, body).into_string()).into_response()
}

/// The lock kinds' parts of a name (a semaphore's permits, an RW lock's readers, a fair lock's
/// queue), each a table of the locks held, linking to their own pages.
fn parts_section(name: &str, parts: &service::PartsView) -> Markup {
    let holder = |v: &LockView| {
        v.holder
            .as_ref()
            .map(|h| format!("{}:{}", h.host, h.pid))
            .unwrap_or_else(|| "—".into())
    };
    let rows = |label: &str, held: &[(u64, LockView)]| {
        html! {
            table.parts {
                thead { tr { th.num { (label) } th { "Lock" } th.num { "Fencing token" } th { "Holder" } th.num { "Time left" } } }
                tbody {
                    @for (n, v) in held {
                        tr {
                            td.num data-label=(label) { (n) }
                            td data-label="Lock" { a href=(format!("/ui/locks/{}", segment(&v.name))) { (v.name) } }
                            td.num.token data-label="Fencing token" { (v.fencing.map(|t| t.to_string()).unwrap_or_default()) }
                            td.holder data-label="Holder" { (holder(v)) }
                            td.num data-label="Time left" { (v.expires_in.map(|d| left_text(millis(d))).unwrap_or_else(|| "—".into())) }
                        }
                    }
                }
            }
        }
    };
    let numbered = |held: &[(u32, LockView)]| -> Vec<(u64, LockView)> {
        held.iter()
            .map(|(i, v)| (u64::from(*i), v.clone()))
            .collect()
    };
    html! {
        @if let Some((permits, held)) = &parts.semaphore {
            section #semaphore {
                h2 { "Semaphore: " (permits) " permits, " (held.len()) " held" }
                p.note { "Each permit is a lock of its own (" (name) "/permit/N), with its own fencing token." }
                @if !held.is_empty() { (rows("Permit", &numbered(held))) }
            }
        }
        @if let Some((max, held)) = &parts.readers {
            section #readers {
                h2 { "Reader-writer lock: " (held.len()) " of " (max) " readers reading" }
                p.note { "Its writer holds " (name) " itself; each reader holds a reader slot." }
                @if !held.is_empty() { (rows("Reader", &numbered(held))) }
            }
        }
        @if !parts.queue.is_empty() {
            section #queue {
                h2 { "Fair lock: " (parts.queue.len()) " waiting" }
                p.note { "Served in ticket order." }
                (rows("Ticket", &parts.queue))
            }
        }
    }
}

#[derive(Deserialize)]
pub(crate) struct ForceForm {
    csrf: String,
    expected_fencing_token: String,
    #[serde(default)]
    confirmed: String,
    #[serde(default)]
    reason: String,
}

/// The request comes from a page of this server: the `Origin`, when sent, names this host.
///
/// Browsers say where a request comes from in `Sec-Fetch-Site`; a cross-site one (or an opaque
/// `Origin: null`, e.g. from a sandboxed frame) is refused. `Host` is not compared: behind a
/// reverse proxy it names the upstream. Requests without these headers (curl) still need the
/// CSRF token.
fn same_origin(headers: &HeaderMap) -> bool {
    let get = |h| headers.get(h).and_then(|v| v.to_str().ok());
    get("sec-fetch-site") != Some("cross-site") && get("origin") != Some("null")
}

async fn force_release(
    State(st): Shared,
    headers: HeaderMap,
    Path(name): Path<String>,
    Form(f): Form<ForceForm>,
) -> Response {
    let Some(viewer) = Viewer::of(&st, &headers) else {
        return Redirect::to("/ui/login").into_response();
    };
    if !viewer.posted_here(&f.csrf, &headers) {
        return (StatusCode::FORBIDDEN, "cross-site request refused\n").into_response();
    }
    if !viewer.caller.may(&st, &name, Permission::Admin) {
        return (
            StatusCode::FORBIDDEN,
            "this token may not force-release this lock\n",
        )
            .into_response();
    }
    let Ok(token) = f.expected_fencing_token.parse::<u64>() else {
        return (StatusCode::BAD_REQUEST, "no fencing token\n").into_response();
    };
    let back = format!("/ui/locks/{}", segment(&name));
    if f.confirmed != "yes" {
        // Without JavaScript: a confirmation page that names the holder and the token.
        let current = st
            .get(&viewer.caller, &name, service::Read::default())
            .await
            .ok();
        let holder = current
            .as_ref()
            .and_then(|i| i.holder.as_ref())
            .map(|h| format!("{}:{}", h.host, h.pid))
            .unwrap_or_else(|| "unknown".into());
        let still = current
            .as_ref()
            .is_some_and(|i| i.state == LockState::Held && i.fencing == Some(token));
        let body = html! {
            p { a href=(back) { "← Back" } }
            h2 { "Force-release " (name) "?" }
            p { "Held by " b { (holder) } " with fencing token " b { (token) } ". The hold ends now; its holder finds out at its next renewal, and the next holder's token is higher." }
            @if !still { p.flash.error { "That hold seems to have ended already; nothing will change." } }
            form method="post" action=(format!("/ui/locks/{}/force-release", segment(&name))) {
                input type="hidden" name="csrf" value=(f.csrf);
                input type="hidden" name="expected_fencing_token" value=(token);
                input type="hidden" name="confirmed" value="yes";
                input type="hidden" name="reason" value=(f.reason);
                button.danger type="submit" { "Force-release" }
            }
        };
        return Html(page("Confirm", &viewer, body).into_string()).into_response();
    }
    let r = service::ForceRelease {
        expected: Some(token),
        reason: Some(service::fit_note(&format!("web page: {}", f.reason))),
    };
    let done = match st.force_release(&viewer.caller, &name, r).await {
        Ok(Some(_)) => "released",
        Ok(None) => "ended",
        Err(e) => {
            tracing::warn!(error = %e.message(), "force-release from the web page failed");
            "failed"
        }
    };
    let mut res = Redirect::to(&format!("{back}?done={done}&t={token}")).into_response();
    res.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    res
}

async fn login_page(State(st): Shared) -> Response {
    let viewer = Viewer {
        caller: Caller::anonymous(),
        auth: false,
        csrf: String::new(),
    };
    let body = html! {
        @if st.auth.is_none() {
            p { "This server has no tokens configured: nothing to sign in to. " a href="/ui" { "Open the locks" } }
        } @else {
            h2 { "Sign in" }
            p.note { "With a bearer token of this server (the page shows what it may read)." }
            form.filter method="post" action="/ui/login" {
                input type="password" name="token" placeholder="bearer token" aria-label="bearer token" autocomplete="off";
                button type="submit" { "Sign in" }
            }
        }
    };
    Html(page("Sign in", &viewer, body).into_string()).into_response()
}

#[derive(Deserialize)]
pub(crate) struct LoginForm {
    token: String,
}

async fn login(State(st): Shared, headers: HeaderMap, Form(f): Form<LoginForm>) -> Response {
    if !same_origin(&headers) {
        return (StatusCode::FORBIDDEN, "cross-site request refused\n").into_response();
    }
    let token = f.token.trim();
    let valid_chars = !token.is_empty()
        && token.len() <= 512
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~+/=".contains(&b));
    let known = valid_chars
        && st
            .auth
            .as_ref()
            .is_some_and(|a| a.current().authenticate(token).is_some());
    if !known {
        return (
            StatusCode::UNAUTHORIZED,
            Html("<p>Unknown token. <a href=\"/ui/login\">Try again</a></p>"),
        )
            .into_response();
    }
    let mut res = Redirect::to("/ui").into_response();
    let id = st.recorder.sign_in(token);
    let cookie = format!(
        "{COOKIE}={id}; HttpOnly; SameSite=Strict; Path=/ui; Max-Age={}",
        crate::recorder::SESSION_TTL.as_secs()
    );
    if let Ok(v) = HeaderValue::from_str(&cookie) {
        res.headers_mut().insert(header::SET_COOKIE, v);
    }
    res
}

#[derive(Deserialize)]
pub(crate) struct LogoutForm {
    #[serde(default)]
    csrf: String,
}

async fn logout(State(st): Shared, headers: HeaderMap, Form(f): Form<LogoutForm>) -> Response {
    let Some(viewer) = Viewer::of(&st, &headers) else {
        return Redirect::to("/ui/login").into_response();
    };
    if !viewer.posted_here(&f.csrf, &headers) {
        return (StatusCode::FORBIDDEN, "cross-site request refused\n").into_response();
    }
    if let Some(id) = cookie_token(&headers) {
        st.recorder.sign_out(&id);
    }
    let mut res = Redirect::to("/ui/login").into_response();
    res.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static("sl_session=; HttpOnly; SameSite=Strict; Path=/ui; Max-Age=0"),
    );
    res
}
