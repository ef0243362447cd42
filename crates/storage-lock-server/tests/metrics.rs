//! `/metrics` (its own test binary: the recorder is process-global): every family of the
//! engine and the server has `# HELP`, durations are histograms with explicit buckets (not
//! summaries), the locks held through the API are counted (`storage_lock_held` said 0 while
//! two were), gRPC calls have their method and status code (they were all one route with
//! status 200), lost holds have their reason, renewals and storage errors are counted — and
//! every query of the Grafana dashboard in `dashboards/` is checked against this real scrape.

use std::sync::Arc;
use std::time::Duration;

use storage_lock_core::fault::FaultyStorage;
use storage_lock_core::{AcquireOptions, MemoryStorage, StorageLock};
use storage_lock_proto::v1 as pb;
use storage_lock_proto::v1::lock_service_client::LockServiceClient;
use storage_lock_server::Server;

const DASHBOARD: &str = include_str!("../dashboards/storage-lock.json");

async fn client(base: &str) -> LockServiceClient<tonic::transport::Channel> {
    let channel = tonic::transport::Channel::from_shared(base.to_owned())
        .unwrap()
        .connect()
        .await
        .unwrap();
    LockServiceClient::new(channel)
}

/// The sample lines of metric `name` (its own name or its `_bucket`/`_sum`/`_count` series).
fn samples<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .collect()
}

/// One gRPC session: opened, answered, closed.
async fn open_and_close_a_session(base: &str) {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(pb::SessionRequest {
        kind: Some(pb::session_request::Kind::Open(pb::Open {
            ttl_ms: 5_000,
            holder: None,
        })),
    })
    .await
    .unwrap();
    let mut events = client(base)
        .await
        .session(tonic::codegen::tokio_stream::wrappers::ReceiverStream::new(
            rx,
        ))
        .await
        .unwrap()
        .into_inner();
    match events.message().await.unwrap().unwrap().kind {
        Some(pb::session_event::Kind::Opened(_)) => {}
        other => panic!("expected Opened, got {other:?}"),
    }
    drop(tx);
    while let Ok(Some(_)) = events.message().await {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_cover_the_engine_the_server_and_the_dashboard() {
    let handle = storage_lock_server::install_prometheus().unwrap();
    let faulty = Arc::new(FaultyStorage::new(MemoryStorage::new()));
    let locks = StorageLock::builder_arc(faulty.clone()).build().unwrap();
    let base = Server::new(locks.clone())
        .metrics(handle)
        .spawn_on_loopback()
        .await
        .unwrap();
    let http = reqwest::Client::new();
    // Two holds through the HTTP API, and one busy answer.
    for name in ["m", "m", "n"] {
        http.post(format!("{base}/v1/locks/{name}/acquire"))
            .json(&serde_json::json!({"lease_ms": 30_000}))
            .send()
            .await
            .unwrap();
    }
    // gRPC: a grant and a refusal.
    let mut grpc = client(&base).await;
    let acquire = || pb::AcquireRequest {
        name: "g".into(),
        lease_ms: 30_000,
        ..Default::default()
    };
    grpc.acquire(acquire()).await.unwrap();
    let busy = grpc.acquire(acquire()).await.unwrap_err();
    assert_eq!(busy.code(), tonic::Code::Aborted);
    open_and_close_a_session(&base).await;
    // Handles of this process: renewed and released; expired; lost to a failed renewal.
    let lease = |ms| AcquireOptions::default().lease(Duration::from_millis(ms));
    let h = locks
        .try_acquire("e1", &lease(30_000))
        .await
        .unwrap()
        .unwrap();
    h.try_renew(None).await.unwrap();
    h.release().await.unwrap();
    let short = locks.try_acquire("e2", &lease(300)).await.unwrap().unwrap();
    tokio::time::timeout(Duration::from_secs(10), short.lost())
        .await
        .expect("a 300 ms hold without renewals turned lost");
    let failing = locks
        .try_acquire("e3", &lease(30_000))
        .await
        .unwrap()
        .unwrap();
    faulty.set_fail_renewals(true);
    let _ = failing.try_renew(None).await;
    faulty.set_fail_renewals(false);
    assert!(failing.is_lost());

    let res = http.get(format!("{base}/metrics")).send().await.unwrap();
    assert!(
        res.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    let text = res.text().await.unwrap();

    for want in [
        r#"storage_lock_http_requests_total{method="POST",route="/v1/locks/{name}/acquire",status="200"} 2"#,
        r#"storage_lock_http_requests_total{method="POST",route="/v1/locks/{name}/acquire",status="409"} 1"#,
        r#"storage_lock_grpc_requests_total{method="/storagelock.v1.LockService/Acquire",code="Ok"} 1"#,
        r#"storage_lock_grpc_requests_total{method="/storagelock.v1.LockService/Acquire",code="Aborted"} 1"#,
        r#"storage_lock_grpc_sessions_total 1"#,
        r#"storage_lock_grpc_sessions 0"#,
        r#"storage_lock_lost_total{reason="expired"} 1"#,
        r#"storage_lock_lost_total{reason="error"} 1"#,
        r#"storage_lock_renewals_total{result="renewed"}"#,
        r#"storage_lock_renewals_total{result="error"} 1"#,
        r#"storage_lock_storage_errors_total{operation="renew"} 1"#,
        "storage_lock_hold_seconds_bucket{le=",
        "storage_lock_acquire_seconds_bucket{result=\"acquired\",le=",
    ] {
        assert!(text.contains(want), "{want} missing from:\n{text}");
    }
    // The locks held through the API (m, n, g; e3 is still held in the storage too).
    let held: Vec<&str> = samples(&text, "storage_lock_locks_held");
    assert_eq!(held.len(), 1, "{text}");
    let value: f64 = held[0].rsplit(' ').next().unwrap().parse().unwrap();
    assert!(
        held[0].contains(r#"storage="memory""#) && value >= 3.0,
        "{}",
        held[0]
    );
    // A second scrape within COUNT_HELD_EVERY shows the last count without listing the
    // storage again (a scrape used to list every record, each time).
    let lists = faulty.calls(storage_lock_core::fault::Op::List);
    let again = http
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(faulty.calls(storage_lock_core::fault::Op::List), lists);
    assert_eq!(samples(&again, "storage_lock_locks_held"), held);
    // Histograms, never summaries; and every family says what it is.
    assert!(!text.contains("quantile="), "a summary:\n{text}");
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let name = rest.split(' ').next().unwrap();
            assert!(
                text.contains(&format!("# HELP {name} ")),
                "{name} has no # HELP:\n{text}"
            );
        }
    }

    // Every query of the dashboard: its metrics are in this scrape, with the labels it groups by.
    let dashboard: serde_json::Value = serde_json::from_str(DASHBOARD).unwrap();
    let mut queries = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            queries += 1;
            let names: Vec<&str> = expr
                .match_indices("storage_lock_")
                .map(|(at, _)| {
                    let rest = &expr[at..];
                    let end = rest
                        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                        .unwrap_or(rest.len());
                    &rest[..end]
                })
                .collect();
            assert!(!names.is_empty(), "{expr}");
            let lines: Vec<&str> = names.iter().flat_map(|n| samples(&text, n)).collect();
            assert!(
                !lines.is_empty(),
                "no samples of {names:?} ({expr}):\n{text}"
            );
            for (at, _) in expr.match_indices("by (") {
                let labels = &expr[at + 4..];
                let labels = &labels[..labels.find(')').unwrap()];
                for label in labels.split(',').map(str::trim).filter(|l| *l != "le") {
                    if label == "instance" {
                        continue; // added by Prometheus when it scrapes
                    }
                    assert!(
                        lines.iter().any(|l| l.contains(&format!("{label}=\""))),
                        "{expr}: no label {label} on {names:?}"
                    );
                }
            }
        }
    }
    assert!(queries >= 10, "{queries} queries");
}
