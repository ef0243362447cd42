//! The SDK over TLS against a real server on loopback (`Server::serve_tls`) with certificates
//! made at test time (`rcgen`): HTTPS and a gRPC session with a client certificate (mutual
//! TLS); refused without the client certificate, without the CA, and over plain `http://`.

use std::time::Duration;

use storage_lock_client::SessionLock;
use storage_lock_core::{AcquireOptions, DistributedLock, MemoryStorage, StorageLock};
use storage_lock_server::{Server, TlsConfig};
use storage_lock_testkit::tls::make_certificates;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_and_grpc_over_mutual_tls() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    make_certificates(d);
    let tls = TlsConfig::from_pem_files(
        &d.join("server.pem"),
        &d.join("server.key"),
        Some(&d.join("ca.pem")),
    )
    .unwrap();
    assert!(tls.requires_client_certificates());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let locks = StorageLock::new(MemoryStorage::new()).unwrap();
    tokio::spawn(async move {
        Server::new(locks)
            .serve_tls(listener, &tls, std::future::pending())
            .await
    });
    let (ca, cert, key) = (d.join("ca.pem"), d.join("client.pem"), d.join("client.key"));
    let url = format!(
        "https://127.0.0.1:{port}?ca={}&cert={}&key={}",
        ca.display(),
        cert.display(),
        key.display()
    );

    let remote = storage_lock_client::connect(&url)
        .await
        .expect("https with mTLS");
    let held = remote
        .try_acquire("tls/a", &AcquireOptions::default())
        .await
        .unwrap()
        .expect("free");
    let session = SessionLock::open(&url, Duration::from_secs(5))
        .await
        .expect("a gRPC session over TLS");
    assert!(
        session
            .try_acquire("tls/a", &AcquireOptions::default())
            .await
            .unwrap()
            .is_none(),
        "the session sees the HTTPS client's hold"
    );
    held.release().await.unwrap();
    let s = session
        .try_acquire("tls/a", &AcquireOptions::default())
        .await
        .unwrap()
        .expect("free after the release");
    assert!(s.fencing_token() > held.fencing_token());
    s.release().await.unwrap();

    for (refused, why) in [
        (
            format!("https://127.0.0.1:{port}?ca={}", ca.display()),
            "no client certificate",
        ),
        (
            format!(
                "https://127.0.0.1:{port}?cert={}&key={}",
                cert.display(),
                key.display()
            ),
            "the server's CA is not trusted",
        ),
        (format!("http://127.0.0.1:{port}"), "plain HTTP"),
    ] {
        assert!(
            storage_lock_client::RemoteStorage::connect(&refused)
                .await
                .is_err(),
            "connected with {why}"
        );
    }
    let bad = storage_lock_client::RemoteStorage::connect(&format!(
        "http://127.0.0.1:{port}?ca={}",
        ca.display()
    ))
    .await
    .unwrap_err();
    assert!(bad.to_string().contains("https"), "{bad}");
}
