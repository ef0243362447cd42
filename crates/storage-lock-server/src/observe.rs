//! Observability: a request id per request (taken from `x-request-id` or made up), a `tracing`
//! span carrying it, and Prometheus metrics.
//!
//! | metric | kind | labels |
//! |---|---|---|
//! | `storage_lock_http_requests_total` | counter | `method`, `route` (the template, never the raw path), `status` |
//! | `storage_lock_http_request_duration_seconds` | histogram | `method`, `route` |
//! | `storage_lock_grpc_requests_total` | counter | `method` (`/storagelock.v1.LockService/Acquire`, …), `code` (`Ok`, `NotFound`, … as tonic names them) |
//! | `storage_lock_grpc_request_duration_seconds` | histogram | `method` (until the response starts: a session's stream is not included) |
//! | `storage_lock_grpc_sessions` | gauge | (gRPC sessions open now) |
//! | `storage_lock_grpc_sessions_total` | counter | (sessions opened) |
//! | `storage_lock_locks_held` | gauge | `storage` (locks held in the storage by anyone, counted at a scrape at most every [`COUNT_HELD_EVERY`], up to [`COUNT_HELD_UP_TO`]) |
//!
//! plus the engine's (`storage_lock_acquire_total`, `storage_lock_lost_total{reason}`,
//! `storage_lock_renewals_total`, … see [`storage_lock_core::describe_metrics`]). Every family
//! has a `# HELP` line, and durations are histograms with explicit buckets
//! ([`install_prometheus`]), which add up across replicas (summaries do not).
//!
//! A gRPC call's `code` is read from the response headers, where a call that fails before its
//! response starts carries it; a call whose response started is counted as `Ok` (its status
//! follows in the trailers, which this layer does not wait for).

use axum::extract::{MatchedPath, Request};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};
use tracing::Instrument;

const REQUEST_ID: &str = "x-request-id";

/// Buckets (seconds) of every duration histogram but `storage_lock_hold_seconds`: 1 ms to
/// 5 min.
const SECONDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];
/// Buckets (seconds) of `storage_lock_hold_seconds`: 10 ms to a day.
const HOLD_SECONDS: &[f64] = &[
    0.01, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14_400.0, 86_400.0,
];
/// `storage_lock_locks_held` counts at most this many records per scrape (then says this).
pub const COUNT_HELD_UP_TO: usize = 100_000;

/// How often at most a scrape of `/metrics` counts the held locks (it lists the storage's
/// records: with several Prometheus servers or a short scrape interval, counting at every
/// scrape would list a large table many times a minute); scrapes in between show the last
/// count.
pub const COUNT_HELD_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// Installs the process-wide Prometheus recorder the way a lock server wants it: every
/// duration a histogram with explicit buckets (1 ms to 5 min; holds 10 ms to a day). Pass the
/// handle to [`crate::Server::metrics`]. Once per process.
///
/// # Errors
/// A recorder is already installed in this process.
///
/// # Examples
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use storage_lock_core::{MemoryStorage, StorageLock};
/// let handle = storage_lock_server::install_prometheus()?;
/// let server = storage_lock_server::Server::new(StorageLock::new(MemoryStorage::new())?)
///     .metrics(handle);
/// # Ok(()) }
/// ```
pub fn install_prometheus() -> Result<PrometheusHandle, BuildError> {
    PrometheusBuilder::new()
        .set_buckets(SECONDS)?
        .set_buckets_for_metric(
            Matcher::Full("storage_lock_hold_seconds".to_owned()),
            HOLD_SECONDS,
        )?
        .install_recorder()
}

/// The help text of every metric (the engine's and this server's).
pub(crate) fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    storage_lock_core::describe_metrics();
    describe_counter!(
        "storage_lock_http_requests_total",
        "HTTP requests answered, by method, route template and status."
    );
    describe_histogram!(
        "storage_lock_http_request_duration_seconds",
        Unit::Seconds,
        "Time to answer an HTTP request, by method and route template."
    );
    describe_counter!(
        "storage_lock_grpc_requests_total",
        "gRPC calls, by method and status code (Ok when the response started)."
    );
    describe_histogram!(
        "storage_lock_grpc_request_duration_seconds",
        Unit::Seconds,
        "Time until a gRPC call's response started, by method."
    );
    describe_gauge!("storage_lock_grpc_sessions", "gRPC sessions open now.");
    describe_counter!("storage_lock_grpc_sessions_total", "gRPC sessions opened.");
    describe_gauge!(
        "storage_lock_locks_held",
        "Locks held in the storage by any holder, counted at this scrape, by storage."
    );
}

pub(crate) async fn observe(req: Request, next: Next) -> Response {
    let started = tokio::time::Instant::now();
    let grpc = req
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| ct.starts_with("application/grpc"));
    // The route template (or the gRPC method of our service), never the raw path: label
    // values stay few.
    let route = if grpc {
        let path = req.uri().path();
        if path.starts_with("/storagelock.") && path.len() <= 128 {
            path.to_owned()
        } else {
            "unknown".to_owned()
        }
    } else {
        req.extensions()
            .get::<MatchedPath>()
            .map_or_else(|| "unmatched".to_owned(), |m| m.as_str().to_owned())
    };
    let method = req.method().as_str().to_owned();
    let id = req
        .headers()
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 64 && v.bytes().all(|b| b.is_ascii_graphic()))
        .map_or_else(|| format!("{:016x}", rand::random::<u64>()), str::to_owned);
    let span = tracing::info_span!("http", request_id = %id, method = %method, route = %route);
    let mut res = next.run(req).instrument(span).await;
    let took = started.elapsed().as_secs_f64();
    if grpc {
        let code = res
            .headers()
            .get("grpc-status")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<i32>().ok())
            .map_or(tonic::Code::Ok, tonic::Code::from_i32);
        metrics::counter!(
            "storage_lock_grpc_requests_total",
            "method" => route.clone(),
            "code" => format!("{code:?}")
        )
        .increment(1);
        metrics::histogram!("storage_lock_grpc_request_duration_seconds", "method" => route)
            .record(took);
    } else {
        let status = res.status().as_u16().to_string();
        metrics::counter!(
            "storage_lock_http_requests_total",
            "method" => method.clone(),
            "route" => route.clone(),
            "status" => status
        )
        .increment(1);
        metrics::histogram!(
            "storage_lock_http_request_duration_seconds",
            "method" => method,
            "route" => route
        )
        .record(took);
    }
    if let Ok(v) = HeaderValue::from_str(&id) {
        res.headers_mut().insert(REQUEST_ID, v);
    }
    res
}

/// Sets `storage_lock_locks_held{storage}`: the locks held in `locks`' storage now, by any
/// holder (this server's API clients, its sessions, other processes on the same storage),
/// counted page by page up to [`COUNT_HELD_UP_TO`], unless `last` (when the last count began)
/// is less than [`COUNT_HELD_EVERY`] ago or a count is running. A storage error leaves the last
/// value.
pub(crate) async fn count_held(
    locks: &storage_lock_core::StorageLock,
    last: &std::sync::Mutex<Option<tokio::time::Instant>>,
) {
    use storage_lock_core::{PageRequest, StorageExt};
    {
        let mut last = last.lock().unwrap_or_else(|e| e.into_inner());
        let now = tokio::time::Instant::now();
        if last.is_some_and(|at| now.duration_since(at) < COUNT_HELD_EVERY) {
            return;
        }
        *last = Some(now);
    }
    let storage = locks.storage();
    let Ok(now) = storage.now().await else {
        return;
    };
    let mut request = PageRequest::default();
    let mut held = 0usize;
    let mut seen = 0usize;
    loop {
        let page = match storage.list_locks("", &request).await {
            Ok(page) => page,
            Err(e) => {
                tracing::debug!(error = %e, "cannot count held locks for /metrics");
                return;
            }
        };
        seen += page.entries.len();
        held += page
            .entries
            .iter()
            .filter(|(_, stored)| stored.record.is_held_at(now))
            .count();
        match page.next {
            Some(next) if seen < COUNT_HELD_UP_TO => request.after = Some(next),
            _ => break,
        }
    }
    #[allow(clippy::cast_precision_loss)] // exact below 2^53
    metrics::gauge!("storage_lock_locks_held", "storage" => storage.name().to_owned())
        .set(held as f64);
}
