//! Per-request observability: a request id (taken from `x-request-id` or made up), a `tracing`
//! span carrying it, and Prometheus metrics by route and status:
//! `storage_lock_http_requests_total{method, route, status}` and
//! `storage_lock_http_request_duration_seconds{method, route}`.

use axum::extract::{MatchedPath, Request};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

const REQUEST_ID: &str = "x-request-id";

pub(crate) async fn observe(req: Request, next: Next) -> Response {
    let started = tokio::time::Instant::now();
    // The route template, never the raw path: label values stay few.
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |m| m.as_str().to_owned());
    let method = req.method().as_str().to_owned();
    let id = req
        .headers()
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 64 && v.bytes().all(|b| b.is_ascii_graphic()))
        .map_or_else(|| format!("{:016x}", rand::random::<u64>()), str::to_owned);
    let span = tracing::info_span!("http", request_id = %id, method = %method, route = %route);
    let mut res = next.run(req).instrument(span).await;
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
    .record(started.elapsed().as_secs_f64());
    if let Ok(v) = HeaderValue::from_str(&id) {
        res.headers_mut().insert(REQUEST_ID, v);
    }
    res
}
