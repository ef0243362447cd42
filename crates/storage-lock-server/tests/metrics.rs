//! `/metrics` serves the engine's and the HTTP layer's metrics in Prometheus text (its own test
//! binary: the recorder is process-global).

use metrics_exporter_prometheus::PrometheusBuilder;
use storage_lock_core::{MemoryStorage, StorageLock};
use storage_lock_server::Server;

#[tokio::test]
async fn metrics_cover_the_engine_and_the_routes() {
    let handle = PrometheusBuilder::new().install_recorder().unwrap();
    let locks = StorageLock::new(MemoryStorage::new()).unwrap();
    let base = Server::new(locks)
        .metrics(handle)
        .spawn_on_loopback()
        .await
        .unwrap();
    let http = reqwest::Client::new();
    for _ in 0..2 {
        http.post(format!("{base}/v1/locks/m/acquire"))
            .json(&serde_json::json!({"lease_ms": 1000}))
            .send()
            .await
            .unwrap();
    }
    let res = http.get(format!("{base}/metrics")).send().await.unwrap();
    assert!(
        res.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    let text = res.text().await.unwrap();
    for want in [
        r#"storage_lock_http_requests_total{method="POST",route="/v1/locks/{name}/acquire",status="200"} 1"#,
        r#"storage_lock_http_requests_total{method="POST",route="/v1/locks/{name}/acquire",status="409"} 1"#,
        "storage_lock_http_request_duration_seconds",
        "storage_lock_acquire",
    ] {
        assert!(text.contains(want), "{want} missing from:\n{text}");
    }
}
