//! The lock server against the engine called directly and against etcd's own lock service,
//! all in one run on one machine.
//!
//! ```sh
//! scripts/bench-server.sh          # starts etcd (and PostgreSQL) via scripts/services.sh
//! ```
//!
//! Throughput: `clients` tasks, each on its own lock name, run acquire (no wait) + release
//! cycles for a fixed time. Hand-off: a holder releases while a waiter is blocked on the same
//! name; the latency is release sent → waiter's grant received. Servers run as their own
//! processes (`storage-lock serve`, `etcd`); the load generator is this process.
//!
//! etcd is driven through its JSON gateway (`/v3/lock/lock`, `/v3/lock/unlock`,
//! `/v3/lease/grant`, `/v3/lease/revoke`) over HTTP/1.1 — the same transport as our HTTP rows.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use storage_lock_core::{AcquireOptions, DistributedLock, MemoryStorage, StorageLock};
use storage_lock_proto::v1 as pb;
use storage_lock_proto::v1::lock_service_client::LockServiceClient;

#[path = "../tests/support/mod.rs"]
mod support;

use support::Served;

type Cycle = Arc<dyn Fn(usize) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

const RUN: Duration = Duration::from_secs(3);
const WARMUP: Duration = Duration::from_millis(300);
const HANDOFFS: usize = 200;
/// Alternating rounds (engine, HTTP, gRPC) of each PostgreSQL row: the median round is shown.
const ROUNDS: usize = 5;

/// Cycles per second of `clients` tasks running `cycle` for [`RUN`].
async fn throughput(clients: usize, cycle: Cycle) -> f64 {
    let run = |d: Duration| {
        let cycle = cycle.clone();
        async move {
            let count = Arc::new(AtomicU64::new(0));
            let stop = Instant::now() + d;
            let tasks: Vec<_> = (0..clients)
                .map(|c| {
                    let (cycle, count) = (cycle.clone(), count.clone());
                    tokio::spawn(async move {
                        while Instant::now() < stop {
                            cycle(c).await;
                            count.fetch_add(1, Ordering::Relaxed);
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.unwrap();
            }
            count.load(Ordering::Relaxed) as f64 / d.as_secs_f64()
        }
    };
    run(WARMUP).await;
    run(RUN).await
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn summary(mut v: Vec<Duration>) -> String {
    v.sort();
    format!(
        "p50 {:.3} ms, p99 {:.3} ms",
        percentile(&v, 0.5).as_secs_f64() * 1e3,
        percentile(&v, 0.99).as_secs_f64() * 1e3
    )
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(64)
        .build()
        .unwrap()
}

async fn post(c: &reqwest::Client, url: String, body: Value) -> (u16, Value) {
    let res = c.post(url).json(&body).send().await.unwrap();
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(Value::Null))
}

fn owner(c: usize) -> String {
    format!("{:032x}", (c as u128 + 1) * 0x1_0000_0001)
}

fn http_cycle(base: &str, prefix: &'static str) -> Cycle {
    let (base, c) = (base.to_owned(), http());
    Arc::new(move |i| {
        let (base, c) = (base.clone(), c.clone());
        Box::pin(async move {
            let url = |op: &str| format!("{base}/v1/locks/{prefix}-{i}/{op}");
            let (s, _) = post(
                &c,
                url("acquire"),
                json!({"lease_ms": 30_000, "owner": owner(i)}),
            )
            .await;
            assert_eq!(s, 200);
            post(&c, url("release"), json!({"owner": owner(i)})).await;
        })
    })
}

/// A lean HTTP/1.1 cycle, as a load generator such as `wrk` drives a server: each client has
/// its own keep-alive connection (hyper's bare connection, no pool) and sends prepared bodies.
/// It measures the server with the least client-side cost this machine's shared cores allow.
async fn lean_http_cycle(base: &str, prefix: &'static str, clients: usize) -> Cycle {
    use http_body_util::{BodyExt, Full};
    type Conn = hyper::client::conn::http1::SendRequest<Full<bytes::Bytes>>;
    let addr = base.trim_start_matches("http://").to_owned();
    let mut conns = Vec::new();
    for _ in 0..clients {
        let tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
        tcp.set_nodelay(true).unwrap();
        let (send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
            .await
            .unwrap();
        tokio::spawn(conn);
        conns.push(Arc::new(tokio::sync::Mutex::new(send)));
    }
    let conns: Arc<Vec<Arc<tokio::sync::Mutex<Conn>>>> = Arc::new(conns);
    let host = addr.clone();
    Arc::new(move |i| {
        let (conns, host) = (conns.clone(), host.clone());
        Box::pin(async move {
            let mut send = conns[i].lock().await;
            let req = |op: &str, body: String| {
                hyper::Request::post(format!("/v1/locks/{prefix}-{i}/{op}"))
                    .header("host", &host)
                    .header("content-type", "application/json")
                    .body(Full::new(bytes::Bytes::from(body)))
                    .unwrap()
            };
            let owner = owner(i);
            let res = send
                .send_request(req(
                    "acquire",
                    format!(r#"{{"lease_ms":30000,"owner":"{owner}"}}"#),
                ))
                .await
                .unwrap();
            assert_eq!(res.status(), 200);
            res.into_body().collect().await.unwrap();
            let res = send
                .send_request(req("release", format!(r#"{{"owner":"{owner}"}}"#)))
                .await
                .unwrap();
            res.into_body().collect().await.unwrap();
        })
    })
}

async fn grpc(base: &str) -> LockServiceClient<tonic::transport::Channel> {
    let ch = tonic::transport::Channel::from_shared(base.to_owned())
        .unwrap()
        .tcp_nodelay(true)
        .connect()
        .await
        .unwrap();
    LockServiceClient::new(ch)
}

async fn grpc_cycle(base: &str, prefix: &'static str) -> Cycle {
    let client = grpc(base).await;
    Arc::new(move |i| {
        let mut c = client.clone();
        Box::pin(async move {
            let name = format!("{prefix}-{i}");
            c.acquire(pb::AcquireRequest {
                name: name.clone(),
                lease_ms: 30_000,
                owner: owner(i),
                ..Default::default()
            })
            .await
            .unwrap();
            c.release(pb::ReleaseRequest {
                name,
                owner: owner(i),
            })
            .await
            .unwrap();
        })
    })
}

fn lock_cycle(locks: Arc<dyn DistributedLock>, prefix: &'static str) -> Cycle {
    Arc::new(move |i| {
        let locks = locks.clone();
        Box::pin(async move {
            let h = locks
                .try_acquire(&format!("{prefix}-{i}"), &AcquireOptions::default())
                .await
                .unwrap()
                .expect("free");
            h.release().await.unwrap();
        })
    })
}

fn b64(s: &str) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let b = s.as_bytes();
    let mut out = String::new();
    for chunk in b.chunks(3) {
        let n = (u32::from(chunk[0]) << 16)
            | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
            | u32::from(*chunk.get(2).unwrap_or(&0));
        for k in 0..4 {
            if k <= chunk.len() {
                out.push(char::from(T[((n >> (18 - 6 * k)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

async fn etcd_lease(c: &reqwest::Client, etcd: &str) -> String {
    let (_, v) = post(c, format!("{etcd}/v3/lease/grant"), json!({"TTL": 30})).await;
    v["ID"].as_str().unwrap().to_owned()
}

async fn etcd_lock(c: &reqwest::Client, etcd: &str, name: &str, lease: &str) -> String {
    let (s, v) = post(
        c,
        format!("{etcd}/v3/lock/lock"),
        json!({"name": b64(name), "lease": lease}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    v["key"].as_str().unwrap().to_owned()
}

async fn etcd_unlock(c: &reqwest::Client, etcd: &str, key: &str) {
    post(c, format!("{etcd}/v3/lock/unlock"), json!({"key": key})).await;
}

/// etcd's Lock + Unlock with one lease per client (like a concurrency.Session), or with a lease
/// granted and revoked in every cycle.
async fn etcd_cycle(etcd: &str, lease_per_cycle: bool, clients: usize) -> Cycle {
    let c = http();
    let mut leases = Vec::new();
    for _ in 0..clients {
        leases.push(etcd_lease(&c, etcd).await);
    }
    let (etcd, leases) = (etcd.to_owned(), Arc::new(leases));
    Arc::new(move |i| {
        let (etcd, c, leases) = (etcd.clone(), c.clone(), leases.clone());
        Box::pin(async move {
            let name = format!("bench-etcd-{i}");
            if lease_per_cycle {
                let lease = etcd_lease(&c, &etcd).await;
                let key = etcd_lock(&c, &etcd, &name, &lease).await;
                etcd_unlock(&c, &etcd, &key).await;
                post(&c, format!("{etcd}/v3/lease/revoke"), json!({"ID": lease})).await;
            } else {
                let key = etcd_lock(&c, &etcd, &name, &leases[i]).await;
                etcd_unlock(&c, &etcd, &key).await;
            }
        })
    })
}

async fn handoff_http(base: &str) -> Vec<Duration> {
    let c = http();
    let url = |op: &str| format!("{base}/v1/locks/bench-handoff/{op}");
    let mut out = Vec::with_capacity(HANDOFFS);
    for i in 0..HANDOFFS {
        let (a, b) = (owner(2 * i), owner(2 * i + 1));
        assert_eq!(
            post(&c, url("acquire"), json!({"lease_ms": 30_000, "owner": a}))
                .await
                .0,
            200
        );
        let waiter = {
            let (c, u) = (c.clone(), url("acquire"));
            let b = b.clone();
            tokio::spawn(async move {
                let r = post(
                    &c,
                    u,
                    json!({"lease_ms": 30_000, "wait_ms": 10_000, "owner": b}),
                )
                .await;
                (r.0, Instant::now())
            })
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        let released = Instant::now();
        post(&c, url("release"), json!({"owner": a})).await;
        let (status, granted) = waiter.await.unwrap();
        assert_eq!(status, 200);
        out.push(granted.saturating_duration_since(released));
        post(&c, url("release"), json!({"owner": b})).await;
    }
    out
}

async fn handoff_grpc(base: &str) -> Vec<Duration> {
    let mut c = grpc(base).await;
    let mut out = Vec::with_capacity(HANDOFFS);
    for i in 0..HANDOFFS {
        let (a, b) = (owner(2 * i), owner(2 * i + 1));
        let req = |o: &str, wait_ms| pb::AcquireRequest {
            name: "bench-handoff-grpc".into(),
            lease_ms: 30_000,
            wait_ms,
            owner: o.to_owned(),
            ..Default::default()
        };
        c.acquire(req(&a, 0)).await.unwrap();
        let waiter = {
            let mut c = c.clone();
            let r = req(&b, 10_000);
            tokio::spawn(async move {
                c.acquire(r).await.unwrap();
                Instant::now()
            })
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        let released = Instant::now();
        c.release(pb::ReleaseRequest {
            name: "bench-handoff-grpc".into(),
            owner: a,
        })
        .await
        .unwrap();
        out.push(waiter.await.unwrap().saturating_duration_since(released));
        c.release(pb::ReleaseRequest {
            name: "bench-handoff-grpc".into(),
            owner: b,
        })
        .await
        .unwrap();
    }
    out
}

async fn handoff_etcd(etcd: &str) -> Vec<Duration> {
    let c = http();
    let (la, lb) = (etcd_lease(&c, etcd).await, etcd_lease(&c, etcd).await);
    let mut out = Vec::with_capacity(HANDOFFS);
    for _ in 0..HANDOFFS {
        let ka = etcd_lock(&c, etcd, "bench-etcd-handoff", &la).await;
        let waiter = {
            let (c, etcd, lb) = (c.clone(), etcd.to_owned(), lb.clone());
            tokio::spawn(async move {
                let k = etcd_lock(&c, &etcd, "bench-etcd-handoff", &lb).await;
                (k, Instant::now())
            })
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        let released = Instant::now();
        etcd_unlock(&c, etcd, &ka).await;
        let (kb, granted) = waiter.await.unwrap();
        out.push(granted.saturating_duration_since(released));
        etcd_unlock(&c, etcd, &kb).await;
    }
    out
}

fn row(what: &str, clients: usize, ours: f64, base_name: &str, base: f64) {
    println!(
        "| {what} | {clients} | {ours:.0} | {base_name} {base:.0} | **{:.2}×** |",
        ours / base
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` runs this binary without it:
    // then only check that it starts (the full run takes minutes and is not a test).
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    // The JSON gateway of the cluster scripts/services.sh starts (etcd://host:port → http://).
    let etcd = std::env::var("STORAGE_LOCK_ETCD_URL")
        .ok()
        .map(|u| u.replace("etcd://", "http://"));
    let pg = std::env::var("STORAGE_LOCK_POSTGRES_URL").ok();
    if etcd.is_none() {
        eprintln!(
            "STORAGE_LOCK_ETCD_URL is not set: the etcd rows are skipped (run scripts/bench-server.sh)"
        );
    }
    // STORAGE_LOCK_BENCH_ROWS=postgres: only the PostgreSQL rows (for profiling them alone).
    let pg_only = std::env::var("STORAGE_LOCK_BENCH_ROWS").is_ok_and(|r| r == "postgres");
    if !pg_only {
        memory_rows(etcd.as_deref()).await;
    }
    if let Some(pg) = pg {
        postgres_rows(&pg).await;
    }
}

/// The server over `memory:` against the engine and etcd, and the hand-offs.
async fn memory_rows(etcd: Option<&str>) {
    let memory = Served::start("memory:", &[]);
    let direct: Arc<dyn DistributedLock> =
        Arc::new(StorageLock::new(MemoryStorage::new()).unwrap());
    let sdk: Arc<dyn DistributedLock> =
        Arc::new(storage_lock_client::connect(&memory.url).await.unwrap());
    let session: Arc<dyn DistributedLock> = Arc::new(
        storage_lock_client::SessionLock::open(&memory.url, Duration::from_secs(30))
            .await
            .unwrap(),
    );
    println!(
        "| what (memory storage) | clients | cycles/s | baseline cycles/s (same run) | ratio |"
    );
    println!("|---|---|---|---|---|");
    for clients in [1, 16] {
        let engine = throughput(clients, lock_cycle(direct.clone(), "direct")).await;
        let http_raw = throughput(clients, http_cycle(&memory.url, "http")).await;
        let grpc_raw = throughput(clients, grpc_cycle(&memory.url, "grpc").await).await;
        let sdk_http = throughput(clients, lock_cycle(sdk.clone(), "sdk")).await;
        let sdk_session = throughput(clients, lock_cycle(session.clone(), "session")).await;
        let etcd_rows = match etcd {
            Some(e) => Some((
                throughput(clients, etcd_cycle(e, false, clients).await).await,
                throughput(clients, etcd_cycle(e, true, clients).await).await,
            )),
            None => None,
        };
        row(
            "engine called directly (no network)",
            clients,
            engine,
            "—",
            engine,
        );
        for (what, v) in [
            ("server, HTTP (acquire + release requests)", http_raw),
            ("server, gRPC unary", grpc_raw),
            ("server, Rust SDK over HTTP (`RemoteLock`)", sdk_http),
            ("server, Rust SDK gRPC session (`SessionLock`)", sdk_session),
        ] {
            match etcd_rows {
                Some((lock_unlock, _)) => row(what, clients, v, "etcd Lock+Unlock", lock_unlock),
                None => row(what, clients, v, "engine", engine),
            }
        }
        if let Some((lock_unlock, with_lease)) = etcd_rows {
            row(
                "etcd Lock+Unlock (one lease per client)",
                clients,
                lock_unlock,
                "engine",
                engine,
            );
            row(
                "etcd lease grant + Lock + Unlock + revoke",
                clients,
                with_lease,
                "etcd Lock+Unlock",
                lock_unlock,
            );
        }
    }
    println!();
    println!("| hand-off (release → waiter granted, {HANDOFFS} hand-offs) | latency |");
    println!("|---|---|");
    println!(
        "| server on memory, HTTP long poll | {} |",
        summary(handoff_http(&memory.url).await)
    );
    println!(
        "| server on memory, gRPC unary wait | {} |",
        summary(handoff_grpc(&memory.url).await)
    );
    if let Some(e) = etcd {
        println!(
            "| etcd Lock (blocked) | {} |",
            summary(handoff_etcd(e).await)
        );
    }
}

/// The server over PostgreSQL against the engine called directly on the same table.
async fn postgres_rows(pg: &str) {
    let url = format!("{pg}?table=storage_lock_bench_server");
    let served = Served::start(&url, &[]);
    let memory = Served::start("memory:", &[]);
    let pg_direct: Arc<dyn DistributedLock> = Arc::new(storage_lock::connect(&url).await.unwrap());
    println!();
    println!(
        "| what (PostgreSQL storage) | clients | ratio to the engine direct, median of {ROUNDS} alternating rounds (range) | median cycles/s, server / engine |"
    );
    println!("|---|---|---|---|");
    // The transport's own cost, from the `memory:` server in the same rounds: a server over
    // PostgreSQL cannot beat the engine's cycle plus it (1 client: latencies add; 16 clients:
    // the CPU time per cycle adds, on the cores the load generator and PostgreSQL share).
    for clients in [1, 16] {
        let (mut http, mut grpc, mut ceiling) = (Vec::new(), Vec::new(), Vec::new());
        let (mut lean, mut lean_ceiling) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            let engine = throughput(clients, lock_cycle(pg_direct.clone(), "pg-direct")).await;
            let h = throughput(clients, http_cycle(&served.url, "pg-http")).await;
            let g = throughput(clients, grpc_cycle(&served.url, "pg-grpc").await).await;
            let m = throughput(clients, http_cycle(&memory.url, "mem-http")).await;
            // 1 / (1/engine + 1/m) cycles/s: the engine's cycle plus the transport's.
            let bound = 1.0 / (1.0 / engine + 1.0 / m);
            ceiling.push((bound / engine, m, engine));
            http.push((h / engine, h, engine));
            let l = throughput(
                clients,
                lean_http_cycle(&served.url, "pg-lean", clients).await,
            )
            .await;
            let lm = throughput(
                clients,
                lean_http_cycle(&memory.url, "mem-lean", clients).await,
            )
            .await;
            lean.push((l / engine, l, engine));
            lean_ceiling.push((1.0 / (1.0 / engine + 1.0 / lm) / engine, lm, engine));
            grpc.push((g / engine, g, engine));
        }
        for (what, mut rounds) in [
            ("server, HTTP", http),
            ("server, gRPC unary", grpc),
            (
                "ceiling: engine cycle + the HTTP transport's (memory server, cycles/s shown)",
                ceiling,
            ),
            ("server, HTTP, lean load generator", lean),
            (
                "ceiling with the lean load generator (memory server, cycles/s shown)",
                lean_ceiling,
            ),
        ] {
            rounds.sort_by(|a, b| a.0.total_cmp(&b.0));
            let (ratio, ours, engine) = rounds[rounds.len() / 2];
            println!(
                "| {what} | {clients} | **{ratio:.2}×** ({:.2}–{:.2}) | {ours:.0} / {engine:.0} |",
                rounds[0].0,
                rounds[rounds.len() - 1].0
            );
        }
    }
    println!();
    println!("| hand-off, PostgreSQL storage | latency |");
    println!("|---|---|");
    println!(
        "| server, HTTP long poll | {} |",
        summary(handoff_http(&served.url).await)
    );
    println!(
        "| server, gRPC unary wait | {} |",
        summary(handoff_grpc(&served.url).await)
    );
}
