#![allow(missing_docs)]
//! PostgreSQL, MySQL/MariaDB and Redis: the engine against the raw backend lock in the same run.
//!
//! ```text
//! . scripts/services.sh && cargo bench -p storage-lock --all-features --bench backends
//! ```
//!
//! For each backend: acquire+release cycles/s and p50/p99 cycle latency at 1 and 16 concurrent
//! clients on distinct keys, for the engine and for the raw baseline on the same server —
//! PostgreSQL `pg_try_advisory_lock` + `pg_advisory_unlock`, MySQL `GET_LOCK(k, 0)` +
//! `RELEASE_LOCK(k)`, Redis `SET NX PX` + a compare-and-delete script, and the `rslock` crate
//! as a peer on Redis; then the contended hand-off latency (release → next waiter holds) and
//! the round-trip time of a trivial query for scale. Prints Markdown rows for BENCHMARKS.md.

mod common;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use storage_lock::{AcquireOptions, StorageLock, connect};

const RUN: Duration = Duration::from_secs(3);
const HANDOFFS: usize = 200;

struct Stats {
    per_sec: f64,
    p50: Duration,
    p99: Duration,
}

/// Runs `clients` concurrent loops of `op(client)` for [`RUN`].
async fn measure<F, Fut>(clients: usize, op: F) -> Stats
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    // Warm up every client once (connections, prepared statements, script cache).
    for c in 0..clients {
        op(c).await;
    }
    let start = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let op = op.clone();
            tokio::spawn(async move {
                let mut lat = Vec::new();
                while start.elapsed() < RUN {
                    let t = Instant::now();
                    op(c).await;
                    lat.push(t.elapsed());
                }
                lat
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let per_sec = all.len() as f64 / start.elapsed().as_secs_f64();
    let (p50, p99) = common::percentiles(all);
    Stats { per_sec, p50, p99 }
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1e3)
}

fn row(backend: &str, clients: usize, engine: &Stats, base_name: &str, base: &Stats) {
    println!(
        "| {backend} | {clients} | {:.0} | {base_name} {:.0} | **{:.2}×** | {} / {} | {} / {} |",
        engine.per_sec,
        base.per_sec,
        engine.per_sec / base.per_sec,
        ms(engine.p50),
        ms(engine.p99),
        ms(base.p50),
        ms(base.p99)
    );
}

fn engine_op(
    locks: StorageLock,
) -> impl Fn(usize) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync + 'static {
    let opts = AcquireOptions::default();
    let tag = std::process::id();
    move |c| {
        let (locks, opts) = (locks.clone(), opts.clone());
        Box::pin(async move {
            let key = format!("bench-{tag}-{c}");
            let h = locks
                .try_acquire(&key, &opts)
                .await
                .unwrap()
                .expect("distinct keys are free");
            h.release().await.unwrap();
        })
    }
}

async fn rtt<F, Fut>(op: F) -> Duration
where
    F: Fn() -> Fut,
    Fut: Future<Output = ()>,
{
    let mut s = Vec::new();
    for _ in 0..500 {
        let t = Instant::now();
        op().await;
        s.push(t.elapsed());
    }
    common::percentiles(s).0
}

async fn postgres(url: &str) {
    let locks = connect(&format!("{url}?table=storage_lock_bench"))
        .await
        .unwrap();
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(16)
        .connect(url)
        .await
        .unwrap();
    for clients in [1, 16] {
        let engine = measure(clients, engine_op(locks.clone())).await;
        let p = pool.clone();
        let raw = measure(clients, move |c| {
            let p = p.clone();
            async move {
                let mut conn = p.acquire().await.unwrap();
                let k = 7_000_000 + c as i64;
                let ok: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
                    .bind(k)
                    .fetch_one(&mut *conn)
                    .await
                    .unwrap();
                assert!(ok);
                let _: bool = sqlx::query_scalar("SELECT pg_advisory_unlock($1)")
                    .bind(k)
                    .fetch_one(&mut *conn)
                    .await
                    .unwrap();
            }
        })
        .await;
        row("PostgreSQL", clients, &engine, "advisory lock", &raw);
        // For scale only (not a supported setting: see BENCHMARKS.md): the same engine without
        // waiting for the WAL flush at commit, the one cost advisory locks do not pay.
        let nosync = connect(&format!(
            "{url}?table=storage_lock_bench&options[synchronous_commit]=off"
        ))
        .await
        .unwrap();
        let engine_nosync = measure(clients, engine_op(nosync)).await;
        row(
            "PostgreSQL, synchronous_commit=off",
            clients,
            &engine_nosync,
            "advisory lock",
            &raw,
        );
    }
    let (p50, p99) = common::handoff(&locks, HANDOFFS).await;
    let p = pool.clone();
    let rtt = rtt(move || {
        let p = p.clone();
        async move {
            sqlx::query("SELECT 1").execute(&p).await.unwrap();
        }
    })
    .await;
    println!(
        "| PostgreSQL hand-off (LISTEN/NOTIFY) | p50 {} ms | p99 {} ms | RTT (`SELECT 1`) p50 {} ms |",
        ms(p50),
        ms(p99),
        ms(rtt)
    );
}

async fn mysql(url: &str) {
    let locks = connect(&format!("{url}?table=storage_lock_bench"))
        .await
        .unwrap();
    let pool = sqlx::mysql::MySqlPoolOptions::new()
        .max_connections(16)
        .connect(url)
        .await
        .unwrap();
    for clients in [1, 16] {
        let engine = measure(clients, engine_op(locks.clone())).await;
        let p = pool.clone();
        let raw = measure(clients, move |c| {
            let p = p.clone();
            async move {
                let mut conn = p.acquire().await.unwrap();
                let k = format!("raw-{c}");
                let ok: i64 = sqlx::query_scalar("SELECT GET_LOCK(?, 0)")
                    .bind(&k)
                    .fetch_one(&mut *conn)
                    .await
                    .unwrap();
                assert_eq!(ok, 1);
                let _: Option<i64> = sqlx::query_scalar("SELECT RELEASE_LOCK(?)")
                    .bind(&k)
                    .fetch_one(&mut *conn)
                    .await
                    .unwrap();
            }
        })
        .await;
        row("MariaDB", clients, &engine, "GET_LOCK", &raw);
    }
    let (p50, p99) = common::handoff(&locks, HANDOFFS).await;
    let p = pool.clone();
    let rtt = rtt(move || {
        let p = p.clone();
        async move {
            sqlx::query("SELECT 1").execute(&p).await.unwrap();
        }
    })
    .await;
    println!(
        "| MariaDB hand-off (backoff) | p50 {} ms | p99 {} ms | RTT (`SELECT 1`) p50 {} ms |",
        ms(p50),
        ms(p99),
        ms(rtt)
    );
}

const COMPARE_AND_DELETE: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end";

async fn redis_bench(url: &str) {
    let locks = connect(&format!("{url}?prefix=storage-lock-bench:"))
        .await
        .unwrap();
    let client = redis::Client::open(url).unwrap();
    let conn = client.get_connection_manager().await.unwrap();
    let cad = redis::Script::new(COMPARE_AND_DELETE);
    let rs = Arc::new(rslock::LockManager::new(vec![url.to_owned()]));
    for clients in [1, 16] {
        let engine = measure(clients, engine_op(locks.clone())).await;
        let (c2, s2) = (conn.clone(), cad.clone());
        let raw = measure(clients, move |c| {
            let (mut conn, cad) = (c2.clone(), s2.clone());
            async move {
                let k = format!("raw-lock-{c}");
                let ok: Option<String> = redis::cmd("SET")
                    .arg(&k)
                    .arg("owner")
                    .arg("NX")
                    .arg("PX")
                    .arg(30_000)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                assert!(ok.is_some());
                let _: i64 = cad
                    .key(&k)
                    .arg("owner")
                    .invoke_async(&mut conn)
                    .await
                    .unwrap();
            }
        })
        .await;
        row("Redis", clients, &engine, "SET NX PX + CAD", &raw);
        let r2 = rs.clone();
        let peer = measure(clients, move |c| {
            let rs = r2.clone();
            async move {
                let k = format!("rslock-{c}");
                let lock = rs
                    .lock(k.as_bytes(), Duration::from_secs(30))
                    .await
                    .expect("rslock");
                rs.unlock(&lock).await;
            }
        })
        .await;
        row("Redis", clients, &engine, "rslock", &peer);
    }
    let (p50, p99) = common::handoff(&locks, HANDOFFS).await;
    let c2 = conn.clone();
    let rtt = rtt(move || {
        let mut c = c2.clone();
        async move {
            let _: String = redis::cmd("PING").query_async(&mut c).await.unwrap();
        }
    })
    .await;
    println!(
        "| Redis hand-off (pub/sub) | p50 {} ms | p99 {} ms | RTT (`PING`) p50 {} ms |",
        ms(p50),
        ms(p99),
        ms(rtt)
    );
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --all-targets` runs this binary without it:
    // then only check that it starts.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let var = |v: &str| {
        std::env::var(v)
            .unwrap_or_else(|_| panic!("{v} is not set: run `. scripts/services.sh` first"))
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!(
        "| backend | clients | engine cycles/s | baseline cycles/s | ratio | engine p50 / p99 ms | baseline p50 / p99 ms |"
    );
    println!("|---|---|---|---|---|---|---|");
    // STORAGE_LOCK_BENCH=redis (or postgres, mysql) runs one backend only.
    let only = std::env::var("STORAGE_LOCK_BENCH").ok();
    let wanted = |b: &str| only.as_deref().is_none_or(|o| o == b);
    if wanted("postgres") {
        rt.block_on(postgres(&var("STORAGE_LOCK_POSTGRES_URL")));
    }
    if wanted("mysql") {
        rt.block_on(mysql(&var("STORAGE_LOCK_MYSQL_URL")));
    }
    if wanted("redis") {
        rt.block_on(redis_bench(&var("STORAGE_LOCK_REDIS_URL")));
    }
}
