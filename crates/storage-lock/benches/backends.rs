#![allow(missing_docs)]
//! PostgreSQL, MySQL/MariaDB, Redis (one server and a cluster), etcd, NATS JetStream KV, S3,
//! Azure Blob, memcached and DynamoDB:
//! the engine against the raw backend operation in the same run.
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
//! the round-trip time of a trivial query for scale. For the replicated stores the baselines are
//! etcd's own `Lock`/`Unlock` and a bare put + delete `Txn`, NATS KV `create` + `delete` and two
//! revision-checked updates, S3 and Azure `PUT If-None-Match: *` + `DELETE`, memcached's meta
//! add + delete, DynamoDB's conditional `PutItem` + `DeleteItem`; and the requests per lock
//! operation are counted (client side, and for etcd on the server's `/metrics` too). Where an
//! aim is a ratio (PostgreSQL's durable row, Redis's raw commands and `rslock`), engine and
//! baseline alternate for a few rounds and the row shows the median round; Redis also prints
//! the CPU a cycle costs on the server and in this process. `STORAGE_LOCK_BENCH=kinds` instead
//! measures a semaphore permit's and an RW lock read's cycle against the exclusive lock's, and
//! a multi-lock of three names against the three taken one by one, on PostgreSQL, Redis,
//! etcd, MySQL and SQLite (`kinds-postgres`, `kinds-redis`, `kinds-etcd`, `kinds-mysql`,
//! `kinds-sqlite`: one of them). Prints Markdown rows
//! for BENCHMARKS.md.

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
    cycles: usize,
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
    let cycles = all.len();
    let per_sec = cycles as f64 / start.elapsed().as_secs_f64();
    let (p50, p99) = common::percentiles(all);
    Stats {
        per_sec,
        p50,
        p99,
        cycles,
    }
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

/// Alternating rounds of the engine and of an aim's baseline (PostgreSQL's durable row,
/// Redis's raw commands and `rslock`).
const ROUNDS: usize = 5;

/// Engine and baseline alternate for [`ROUNDS`] rounds of [`measure`]; returns the ratio of
/// each round (engine / baseline, in order) and the round of the median ratio. One pair of
/// 3 s runs moved by up to 25 % between runs on a shared two-core machine, more than some of
/// the gaps the aims are about.
async fn alternating<E, EF, B, BF>(
    clients: usize,
    engine: impl Fn() -> E,
    base: impl Fn() -> B,
) -> (Vec<f64>, Stats, Stats)
where
    E: Fn(usize) -> EF + Send + Sync + 'static,
    EF: Future<Output = ()> + Send,
    B: Fn(usize) -> BF + Send + Sync + 'static,
    BF: Future<Output = ()> + Send,
{
    let mut rounds: Vec<(Stats, Stats)> = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let e = measure(clients, engine()).await;
        rounds.push((e, measure(clients, base()).await));
    }
    let ratio = |(e, b): &(Stats, Stats)| e.per_sec / b.per_sec;
    let each = rounds.iter().map(ratio).collect();
    rounds.sort_by(|a, b| ratio(a).total_cmp(&ratio(b)));
    let (e, b) = rounds.swap_remove(rounds.len() / 2);
    (each, e, b)
}

/// "the median of N alternating rounds (each: …)", for a row's baseline column.
fn rounds_note(each: &[f64]) -> String {
    let each: Vec<String> = each.iter().map(|r| format!("{r:.2}")).collect();
    format!(
        "the median of {ROUNDS} alternating rounds (each: {})",
        each.join(", ")
    )
}

/// Where the durable-row baseline's statements run.
#[derive(Clone)]
enum DurableOn {
    /// A connection per client (`[client]`): one round trip per statement, the least any
    /// client of the server can do.
    OwnConnections(Arc<Vec<tokio::sync::Mutex<sqlx::PgConnection>>>),
    /// A sqlx pool with its default settings, one pooled connection per statement (as
    /// `execute(&pool)` does): it adds a ping when it hands a connection out and another when
    /// it takes it back.
    Pool(sqlx::PgPool),
}

/// One cycle of the durable-row baseline by `client` ([`DURABLE_ACQUIRE`], [`DURABLE_RELEASE`]).
fn durable_op(
    on: DurableOn,
) -> impl Fn(usize) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync + 'static {
    move |c| {
        let on = on.clone();
        Box::pin(async move {
            let key = format!("durable-row-{c}");
            match on {
                DurableOn::OwnConnections(conns) => {
                    let mut conn = conns[c].lock().await;
                    durable_take(&mut conn, &key).await;
                    durable_free(&mut conn, &key).await;
                }
                DurableOn::Pool(pool) => {
                    durable_take(&mut pool.acquire().await.unwrap(), &key).await;
                    durable_free(&mut pool.acquire().await.unwrap(), &key).await;
                }
            }
        })
    }
}

async fn durable_take(conn: &mut sqlx::PgConnection, key: &str) {
    let taken: Option<i64> = sqlx::query_scalar(DURABLE_ACQUIRE)
        .bind(key)
        .bind(&[7u8; 16][..])
        .fetch_optional(conn)
        .await
        .unwrap();
    assert!(taken.is_some());
}

async fn durable_free(conn: &mut sqlx::PgConnection, key: &str) {
    sqlx::query(DURABLE_RELEASE)
        .bind(key)
        .bind(&[7u8; 16][..])
        .execute(conn)
        .await
        .unwrap();
}

/// The durable-row baseline: a hand-written lock on the engine's own table, one statement per
/// step, both commits synchronous (the session default): an upsert that takes a free or
/// expired row with the next fencing token, and an update that frees it.
const DURABLE_ACQUIRE: &str = "INSERT INTO storage_lock_bench AS cur
        (lock_key, version, owner, count, fencing, acquired_at, expires_at)
    VALUES ($1, 1, $2, 1, 1, 0, (extract(epoch from now()) * 1000)::bigint + 30000)
    ON CONFLICT (lock_key) DO UPDATE SET version = cur.version + 1, owner = EXCLUDED.owner,
        count = 1, fencing = cur.fencing + 1, expires_at = EXCLUDED.expires_at
    WHERE cur.count = 0 OR cur.expires_at < (extract(epoch from now()) * 1000)::bigint
    RETURNING fencing";
const DURABLE_RELEASE: &str = "UPDATE storage_lock_bench SET version = version + 1, count = 0
    WHERE lock_key = $1 AND owner = $2 AND count > 0";

/// Renewing [`RENEWED`] held keys: one `renew_many` call against one `renew` per key (all of
/// them concurrently, up to the pool), the storage calls the watchdog makes per period.
const RENEWED: usize = storage_lock::backend::RENEW_BATCH;

async fn renew_batch_row(backend: &str, locks: &StorageLock) {
    use storage_lock::backend::{RenewRequest, Storage};
    let storage = locks.storage().clone();
    let owner = storage_lock::backend::OwnerId::random();
    let tag = std::process::id();
    let keys: Vec<String> = (0..RENEWED).map(|i| format!("renew-{tag}-{i}")).collect();
    let req = storage_lock::backend::AcquireRequest {
        owner,
        lease: Duration::from_secs(60),
        holder: None,
        reentrant: false,
    };
    for k in &keys {
        storage.acquire_once(k, &req).await.unwrap();
    }
    let lease = Duration::from_secs(60);
    let requests: Vec<RenewRequest<'_>> = keys
        .iter()
        .map(|k| RenewRequest {
            key: k,
            owner,
            lease,
        })
        .collect();
    let time = |batched: bool| {
        let (storage, requests) = (storage.clone(), &requests);
        async move {
            let mut s = Vec::new();
            for _ in 0..30 {
                let t = Instant::now();
                if batched {
                    let answers = storage.renew_many(requests).await.unwrap();
                    assert!(answers.iter().all(|a| a.is_ok()));
                } else {
                    let calls = requests
                        .iter()
                        .map(|r| storage.renew(r.key, r.owner, r.lease));
                    futures_util::future::try_join_all(calls).await.unwrap();
                }
                s.push(t.elapsed());
            }
            common::percentiles(s).0
        }
    };
    let (batched, single) = (time(true).await, time(false).await);
    println!(
        "| {backend}: renew {RENEWED} held keys | `renew_many` p50 {} ms | {RENEWED} × `renew` (concurrent) p50 {} ms | **{:.1}×** faster |",
        ms(batched),
        ms(single),
        single.as_secs_f64() / batched.as_secs_f64()
    );
    for k in &keys {
        storage.release(k, owner).await.unwrap();
    }
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
    let mut conns = Vec::new();
    for _ in 0..16 {
        use sqlx::Connection;
        conns.push(tokio::sync::Mutex::new(
            sqlx::PgConnection::connect(url).await.unwrap(),
        ));
    }
    let conns = Arc::new(conns);
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
        // The durable row is the aim's baseline: the row shows the round of the median ratio.
        let (each, engine, durable) = alternating(
            clients,
            || engine_op(locks.clone()),
            || durable_op(DurableOn::OwnConnections(conns.clone())),
        )
        .await;
        row(
            "PostgreSQL",
            clients,
            &engine,
            &format!(
                "durable row (upsert + update, a connection per client), {}",
                rounds_note(&each)
            ),
            &durable,
        );
        // For scale: the same baseline as a sqlx user writes it, on a pool with its default
        // settings (a ping when a connection is handed out, another when it comes back).
        let pooled = measure(clients, durable_op(DurableOn::Pool(pool.clone()))).await;
        row(
            "PostgreSQL",
            clients,
            &measure(clients, engine_op(locks.clone())).await,
            "durable row on a sqlx pool (default settings)",
            &pooled,
        );
    }
    renew_batch_row("PostgreSQL", &locks).await;
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
    renew_batch_row("MariaDB", &locks).await;
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

/// One [`measure`] run of `op` with the CPU time it cost per cycle, in µs: the Redis server's
/// (`used_cpu_user` + `used_cpu_sys` of `INFO cpu`) and this process's (user + system time of
/// `/proc/self/stat`, in clock ticks: ±10 ms over the run, ±0.3 %).
async fn redis_cpu<F, Fut>(
    conn: &redis::aio::ConnectionManager,
    clients: usize,
    op: F,
) -> (f64, f64)
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    async fn server(conn: &redis::aio::ConnectionManager) -> f64 {
        let info: String = redis::cmd("INFO")
            .arg("cpu")
            .query_async(&mut conn.clone())
            .await
            .unwrap();
        info.lines()
            .filter_map(|l| l.split_once(':'))
            .filter(|(k, _)| *k == "used_cpu_user" || *k == "used_cpu_sys")
            .map(|(_, v)| v.trim().parse::<f64>().unwrap())
            .sum()
    }
    fn client() -> f64 {
        let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
        // Fields 14 and 15 (utime, stime), counted after the parenthesised command name.
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        let f: Vec<&str> = rest.split(' ').collect();
        let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
        ticks / 100.0
    }
    let (s0, c0) = (server(conn).await, client());
    let stats = measure(clients, op).await;
    let (s1, c1) = (server(conn).await, client());
    let per = |secs: f64| secs * 1e6 / stats.cycles as f64;
    (per(s1 - s0), per(c1 - c0))
}

/// The raw baseline's acquisition: `SET k owner NX PX 30000`, which must succeed.
async fn raw_take(conn: &mut impl redis::aio::ConnectionLike, k: &str) {
    let ok: Option<String> = redis::cmd("SET")
        .arg(k)
        .arg("owner")
        .arg("NX")
        .arg("PX")
        .arg(30_000)
        .query_async(conn)
        .await
        .unwrap();
    assert!(ok.is_some());
}

/// The raw baseline's release: the compare-and-delete script on `k`.
async fn raw_free(conn: &mut impl redis::aio::ConnectionLike, cad: &redis::Script, k: &str) {
    let _: i64 = cad.key(k).arg("owner").invoke_async(conn).await.unwrap();
}

async fn redis_bench(url: &str) {
    let locks = connect(&format!("{url}?prefix=storage-lock-bench:"))
        .await
        .unwrap();
    let client = redis::Client::open(url).unwrap();
    let conn = client.get_connection_manager().await.unwrap();
    let cad = redis::Script::new(COMPARE_AND_DELETE);
    let rs = Arc::new(rslock::LockManager::new(vec![url.to_owned()]));
    for clients in [1, 16] {
        // Both baselines alternate with the engine (see `alternating`): the gaps to the aims
        // are smaller than the drift between two sequential 3 s runs.
        let raw_op = || {
            let (c2, s2) = (conn.clone(), cad.clone());
            move |c: usize| {
                let (mut conn, cad) = (c2.clone(), s2.clone());
                async move {
                    let k = format!("raw-lock-{c}");
                    raw_take(&mut conn, &k).await;
                    raw_free(&mut conn, &cad, &k).await;
                }
            }
        };
        let (each, engine, raw) = alternating(clients, || engine_op(locks.clone()), raw_op).await;
        let name = format!("SET NX PX + CAD, {}", rounds_note(&each));
        row("Redis", clients, &engine, &name, &raw);
        let peer_op = || {
            let r2 = rs.clone();
            move |c: usize| {
                let rs = r2.clone();
                async move {
                    let k = format!("rslock-{c}");
                    let lock = rs
                        .lock(k.as_bytes(), Duration::from_secs(30))
                        .await
                        .expect("rslock");
                    rs.unlock(&lock).await;
                }
            }
        };
        let (each, engine, peer) = alternating(clients, || engine_op(locks.clone()), peer_op).await;
        row(
            "Redis",
            clients,
            &engine,
            &format!("rslock, {}", rounds_note(&each)),
            &peer,
        );
        // Where a cycle's CPU goes: the server's own account (`INFO cpu`) and this process's
        // (`/proc/self/stat`), per cycle, one more run of each.
        let mut cells = Vec::new();
        for (name, cpu) in [
            (
                "engine",
                redis_cpu(&conn, clients, engine_op(locks.clone())).await,
            ),
            ("SET NX PX + CAD", redis_cpu(&conn, clients, raw_op()).await),
            ("rslock", redis_cpu(&conn, clients, peer_op()).await),
        ] {
            cells.push(format!(
                "{name}: server {:.1} µs, client {:.1} µs",
                cpu.0, cpu.1
            ));
        }
        println!(
            "| Redis CPU per cycle | {clients} | {} |",
            cells.join(" | ")
        );
    }
    renew_batch_row("Redis", &locks).await;
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

/// The engine on the Redis Cluster of `url` (its primary of the prefix's slot), without and
/// with `replicas=1`, against the raw commands on the same slot: `SET NX PX` + the
/// compare-and-delete script, and with `replicas=1` each followed by `WAIT 1` as the engine
/// does. The ratio is the cost of the engine's scripts; the rows side by side give the cost of
/// waiting for the replica.
async fn redis_cluster_bench(url: &str) {
    use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
    let seed = url.split('?').next().unwrap_or(url).to_owned();
    let client = redis::cluster::ClusterClient::new(vec![seed.as_str()]).unwrap();
    let mut conn = client.get_async_connection().await.unwrap();
    let slot: u16 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg("{storage-lock-bench}")
        .query_async(&mut conn)
        .await
        .unwrap();
    let primary = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::new(
        slot,
        SlotAddr::Master,
    )));
    let cad = redis::Script::new(COMPARE_AND_DELETE);
    for replicas in [0u32, 1] {
        let locks = connect(&format!(
            "{seed}?cluster=true&replicas={replicas}&prefix={{storage-lock-bench}}:"
        ))
        .await
        .unwrap();
        for clients in [1, 16] {
            let raw_op = || {
                let (c2, s2, p2) = (conn.clone(), cad.clone(), primary.clone());
                move |c: usize| {
                    let (mut conn, cad, primary) = (c2.clone(), s2.clone(), p2.clone());
                    async move {
                        let k = format!("{{storage-lock-bench}}raw-lock-{c}");
                        raw_take(&mut conn, &k).await;
                        let wait = redis::cmd("WAIT").arg(replicas).arg(1000).clone();
                        if replicas > 0 {
                            conn.route_command(&wait, primary.clone()).await.unwrap();
                        }
                        raw_free(&mut conn, &cad, &k).await;
                        if replicas > 0 {
                            conn.route_command(&wait, primary).await.unwrap();
                        }
                    }
                }
            };
            let (each, engine, raw) =
                alternating(clients, || engine_op(locks.clone()), raw_op).await;
            let name = if replicas == 0 {
                format!("SET NX PX + CAD, {}", rounds_note(&each))
            } else {
                format!("SET NX PX + CAD, each + WAIT 1, {}", rounds_note(&each))
            };
            row(
                &format!("Redis Cluster, replicas={replicas}"),
                clients,
                &engine,
                &name,
                &raw,
            );
        }
        if replicas == 1 {
            let (p50, p99) = common::handoff(&locks, HANDOFFS).await;
            println!(
                "| Redis Cluster hand-off (pub/sub), replicas=1 | p50 {} ms | p99 {} ms |",
                ms(p50),
                ms(p99)
            );
        }
    }
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
    // STORAGE_LOCK_BENCH=redis (or postgres, mysql, redis-cluster, etcd, nats, s3, azure,
    // memcached, dynamodb) runs one
    // backend only; =kinds runs the lock kinds' rows.
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
    if wanted("redis-cluster") {
        rt.block_on(redis_cluster_bench(&var("STORAGE_LOCK_REDIS_CLUSTER_URL")));
    }
    // Not in the default run: STORAGE_LOCK_BENCH=kinds (kinds-postgres, kinds-redis,
    // kinds-etcd, kinds-mysql, kinds-sqlite: one backend's rows).
    let kinds = |backend: &str| {
        only.as_deref() == Some("kinds") || only.as_deref() == Some(&format!("kinds-{backend}"))
    };
    if kinds("postgres") {
        rt.block_on(kinds_bench("PostgreSQL", &var("STORAGE_LOCK_POSTGRES_URL")));
    }
    if kinds("redis") {
        rt.block_on(kinds_bench("Redis", &var("STORAGE_LOCK_REDIS_URL")));
    }
    if kinds("etcd") {
        rt.block_on(kinds_bench("etcd", &var("STORAGE_LOCK_ETCD_URL")));
    }
    if kinds("mysql") {
        rt.block_on(kinds_bench("MySQL", &var("STORAGE_LOCK_MYSQL_URL")));
    }
    if kinds("sqlite") {
        let file =
            std::env::temp_dir().join(format!("storage-lock-bench-{}.db", std::process::id()));
        rt.block_on(kinds_bench(
            "SQLite",
            &format!("sqlite://{}", file.display()),
        ));
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", file.display()));
        }
        let _ = std::fs::remove_dir_all(format!("{}-wake", file.display()));
    }
    if wanted("etcd") {
        rt.block_on(etcd_bench(&var("STORAGE_LOCK_ETCD_URL")));
    }
    if wanted("nats") {
        rt.block_on(nats_bench(&var("STORAGE_LOCK_NATS_URL")));
    }
    if wanted("s3") {
        let url = var("STORAGE_LOCK_S3_URL");
        rt.block_on(object_store_bench(
            "S3 (ministack)",
            &url,
            "s3://storage-lock-test",
        ));
    }
    if wanted("memcached") {
        rt.block_on(memcached_bench(&var("STORAGE_LOCK_MEMCACHED_URL")));
    }
    if wanted("dynamodb") {
        let url = var("STORAGE_LOCK_DYNAMODB_URL");
        rt.block_on(dynamodb_bench("DynamoDB (ministack)", &url));
        let url = var("STORAGE_LOCK_DYNALITE_URL");
        rt.block_on(dynamodb_bench("DynamoDB (dynalite)", &url));
    }
    if wanted("zookeeper") {
        rt.block_on(zookeeper_bench(&var("STORAGE_LOCK_ZOOKEEPER_URL")));
    }
    if wanted("azure") {
        let url = var("STORAGE_LOCK_AZURE_URL");
        rt.block_on(object_store_bench(
            "Azure Blob (Azurite)",
            &url,
            "azure://storage-lock-test",
        ));
    }
}

/// The lock kinds' cycles against the exclusive lock's on the same storage: a semaphore
/// permit (16 permits, one held at a time per name) and an RW lock's read hold (a permit of its
/// readers' semaphore, then a read of the gate), each acquire (no wait) + release, alternating
/// with the exclusive cycle as [`alternating`] does. Clients use distinct names.
async fn kinds_bench(backend: &str, url: &str) {
    use storage_lock::kinds::{RwLock, Semaphore};
    let sep = if url.contains('?') { '&' } else { '?' };
    let option = match backend {
        "Redis" => "prefix=storage-lock-bench:",
        "etcd" => "prefix=storage-lock-bench-kinds/",
        _ => "table=storage_lock_bench",
    };
    let locks = connect(&format!("{url}{sep}{option}")).await.unwrap();
    let tag = std::process::id();
    let opts = AcquireOptions::default();
    // One permit taken and given back, client `c` on semaphore `c`.
    let sem_cycle = |semaphores: Arc<Vec<Semaphore>>| {
        let opts = opts.clone();
        move || {
            let (semaphores, opts) = (semaphores.clone(), opts.clone());
            move |c: usize| {
                let (semaphores, opts) = (semaphores.clone(), opts.clone());
                async move {
                    let permit = semaphores[c].acquire(&opts).await.unwrap().expect("free");
                    permit.release().await.unwrap();
                }
            }
        }
    };
    for clients in [1, 16] {
        let semaphores: Arc<Vec<_>> = Arc::new(
            (0..clients)
                .map(|c| Semaphore::new(&locks, &format!("bench-sem-{tag}-{c}"), 16).unwrap())
                .collect(),
        );
        let (each, sem, exclusive) =
            alternating(clients, sem_cycle(semaphores), || engine_op(locks.clone())).await;
        let name = format!("exclusive lock, {}", rounds_note(&each));
        row(
            backend,
            clients,
            &sem,
            &format!("semaphore vs {name}"),
            &exclusive,
        );

        // The same with 15 of the 16 permits out (held by the bench): the attempt must find the
        // one free slot (one `acquire_any` call where the backend overrides it).
        let full: Arc<Vec<_>> = Arc::new(
            (0..clients)
                .map(|c| Semaphore::new(&locks, &format!("bench-full-{tag}-{c}"), 16).unwrap())
                .collect(),
        );
        let mut out = Vec::new();
        for semaphore in full.iter() {
            for _ in 0..15 {
                out.push(semaphore.acquire(&opts).await.unwrap().expect("free"));
            }
        }
        let (each, last, exclusive) =
            alternating(clients, sem_cycle(full), || engine_op(locks.clone())).await;
        let name = format!("exclusive lock, {}", rounds_note(&each));
        row(
            backend,
            clients,
            &last,
            &format!("semaphore, 15 of 16 permits out, vs {name}"),
            &exclusive,
        );
        for permit in out {
            permit.release().await.unwrap();
        }

        let rws: Arc<Vec<_>> = Arc::new(
            (0..clients)
                .map(|c| RwLock::new(&locks, &format!("bench-rw-{tag}-{c}")).unwrap())
                .collect(),
        );
        let read_op = || {
            let (rws, opts) = (rws.clone(), opts.clone());
            move |c: usize| {
                let (rws, opts) = (rws.clone(), opts.clone());
                async move {
                    let read = rws[c].read(&opts).await.unwrap().expect("no writer");
                    read.release().await.unwrap();
                }
            }
        };
        let (each, read, exclusive) =
            alternating(clients, read_op, || engine_op(locks.clone())).await;
        let name = format!("exclusive lock, {}", rounds_note(&each));
        row(
            backend,
            clients,
            &read,
            &format!("RW read vs {name}"),
            &exclusive,
        );

        // A multi-lock of three names against the same three taken one by one (what a
        // caller without `acquire_all` writes); both release the three at once.
        let names = move |c: usize, kind: &str| -> [String; 3] {
            ["a", "b", "c"].map(|n| format!("bench-multi-{kind}-{tag}-{c}-{n}"))
        };
        let multi_op = || {
            let (locks, opts) = (locks.clone(), opts.clone());
            move |c: usize| {
                let (locks, opts, names) = (locks.clone(), opts.clone(), names(c, "all"));
                async move {
                    let asked: Vec<&str> = names.iter().map(String::as_str).collect();
                    let all = storage_lock::kinds::acquire_all(&locks, &asked, &opts)
                        .await
                        .unwrap()
                        .expect("free");
                    all.release().await.unwrap();
                }
            }
        };
        let one_by_one_op = || {
            let (locks, opts) = (locks.clone(), opts.clone());
            move |c: usize| {
                let (locks, opts, names) = (locks.clone(), opts.clone(), names(c, "each"));
                async move {
                    let mut held = Vec::with_capacity(names.len());
                    for name in &names {
                        held.push(locks.try_acquire(name, &opts).await.unwrap().expect("free"));
                    }
                    let released = held.iter().map(storage_lock::LockHandle::release);
                    for r in futures_util::future::join_all(released).await {
                        r.unwrap();
                    }
                }
            }
        };
        let (each, multi, one_by_one) = alternating(clients, multi_op, one_by_one_op).await;
        row(
            backend,
            clients,
            &multi,
            &format!(
                "multi-lock of 3 vs the 3 names taken one by one, {}",
                rounds_note(&each)
            ),
            &one_by_one,
        );
    }
}

/// Requests per acquire and per release (uncontended, 100 cycles of one key after a first
/// cycle created its record), counted on the client: the primitives the default lock
/// operations call (these backends have no overrides; their clock is local, not a request).
async fn requests_per_op(storage: Arc<dyn storage_lock::backend::Storage>) -> (f64, f64) {
    use storage_lock_core::fault::{FaultyStorage, Op, PrimitivesOnly};
    let counted = Arc::new(FaultyStorage::new(storage));
    let locks = StorageLock::new(PrimitivesOnly(counted.clone())).unwrap();
    let total = |c: &FaultyStorage<Arc<dyn storage_lock::backend::Storage>>| -> usize {
        [Op::Get, Op::Create, Op::Update, Op::Delete, Op::List]
            .into_iter()
            .map(|op| c.calls(op))
            .sum()
    };
    let opts = AcquireOptions::default();
    let key = format!("rtt-{}", std::process::id());
    let first = locks.try_acquire(&key, &opts).await.unwrap().unwrap();
    first.release().await.unwrap();
    let (mut acq, mut rel) = (0, 0);
    for _ in 0..100 {
        let before = total(&counted);
        let h = locks.try_acquire(&key, &opts).await.unwrap().unwrap();
        let mid = total(&counted);
        h.release().await.unwrap();
        acq += mid - before;
        rel += total(&counted) - mid;
    }
    (acq as f64 / 100.0, rel as f64 / 100.0)
}

fn requests_row(backend: &str, (acquire, release): (f64, f64), server: &str) {
    println!(
        "| {backend} requests per operation (client count{server}) | acquire {acquire:.2} | release {release:.2} | |"
    );
}

/// etcd's own count of handled gRPC calls by method, from its `/metrics`.
fn etcd_handled(metrics_url: &str) -> std::collections::HashMap<String, f64> {
    let out = std::process::Command::new("curl")
        .args(["-fsS", metrics_url])
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut by_method = std::collections::HashMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("grpc_server_handled_total{") else {
            continue;
        };
        let method = rest
            .split("grpc_method=\"")
            .nth(1)
            .and_then(|m| m.split('"').next())
            .unwrap_or("")
            .to_owned();
        let n: f64 = line
            .rsplit(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0.0);
        *by_method.entry(method).or_insert(0.0) += n;
    }
    by_method
}

async fn etcd_bench(url: &str) {
    use etcd_client::{Compare, CompareOp, LockOptions, Txn, TxnOp};
    let url = format!("{url}?prefix=storage-lock-bench/");
    let storage = storage_lock::connect_storage(&url).await.unwrap();
    let locks = StorageLock::builder_arc(storage.clone()).build().unwrap();
    let endpoint = url
        .trim_start_matches("etcd://")
        .split(['?', ','])
        .next()
        .unwrap()
        .to_owned();
    let client = etcd_client::Client::connect([format!("http://{endpoint}")], None)
        .await
        .unwrap();
    let tag = std::process::id();
    for clients in [1, 16] {
        let engine = measure(clients, engine_op(locks.clone())).await;
        let c = client.clone();
        let txn = measure(clients, move |i| {
            let mut kv = c.kv_client();
            async move {
                let k = format!("raw-bench/{tag}/{i}");
                let r = kv
                    .txn(
                        Txn::new()
                            .when([Compare::create_revision(k.clone(), CompareOp::Equal, 0)])
                            .and_then([TxnOp::put(k.clone(), "x", None)]),
                    )
                    .await
                    .unwrap();
                assert!(r.succeeded());
                kv.delete(k, None).await.unwrap();
            }
        })
        .await;
        row("etcd", clients, &engine, "put+delete `Txn`", &txn);
        let mut leases = Vec::new();
        for _ in 0..clients {
            leases.push(client.clone().lease_grant(60, None).await.unwrap().id());
        }
        let (c, leases) = (client.clone(), Arc::new(leases));
        let own = measure(clients, move |i| {
            let (mut c, lease) = (c.clone(), leases[i]);
            async move {
                let name = format!("raw-lock/{tag}/{i}");
                let got = c
                    .lock(name, Some(LockOptions::new().with_lease(lease)))
                    .await
                    .unwrap();
                c.unlock(got.key().to_vec()).await.unwrap();
            }
        })
        .await;
        row("etcd", clients, &engine, "etcd `Lock`+`Unlock`", &own);
    }
    let (p50, p99) = common::handoff(&locks, HANDOFFS).await;
    let c = client.clone();
    let rtt = rtt(move || {
        let mut kv = c.kv_client();
        async move {
            kv.get("rtt", None).await.unwrap();
        }
    })
    .await;
    println!(
        "| etcd hand-off (watch) | p50 {} ms | p99 {} ms | RTT (`Range`) p50 {} ms |",
        ms(p50),
        ms(p99),
        ms(rtt)
    );
    let metrics = format!("http://{endpoint}/metrics");
    let before = etcd_handled(&metrics);
    let counted = requests_per_op(storage).await;
    let after = etcd_handled(&metrics);
    let delta =
        |m: &str| after.get(m).copied().unwrap_or(0.0) - before.get(m).copied().unwrap_or(0.0);
    requests_row(
        "etcd",
        counted,
        &format!(
            "; server over 100 cycles: {:.0} `Range`, {:.0} `Txn`",
            delta("Range"),
            delta("Txn")
        ),
    );
}

async fn nats_bench(url: &str) {
    use async_nats::jetstream::kv;
    let storage = storage_lock::connect_storage(&format!("{url}?bucket=storage-lock-bench"))
        .await
        .unwrap();
    let locks = StorageLock::builder_arc(storage.clone()).build().unwrap();
    let client = async_nats::connect(url.trim_start_matches("nats://"))
        .await
        .unwrap();
    let js = async_nats::jetstream::new(client);
    let store = js
        .create_key_value(kv::Config {
            bucket: "storage-lock-bench-raw".into(),
            history: 1,
            ..Default::default()
        })
        .await
        .unwrap();
    let tag = std::process::id();
    for clients in [1, 16] {
        let engine = measure(clients, engine_op(locks.clone())).await;
        let s = store.clone();
        let create_delete = measure(clients, move |i| {
            let s = s.clone();
            async move {
                let k = format!("cd-{tag}-{i}");
                s.create(&k, "x".into()).await.unwrap();
                s.delete(&k).await.unwrap();
            }
        })
        .await;
        row(
            "NATS KV",
            clients,
            &engine,
            "KV `create`+`delete`",
            &create_delete,
        );
        let mut revs = Vec::new();
        for i in 0..clients {
            revs.push(std::sync::Mutex::new(
                store
                    .put(format!("cas-{tag}-{i}"), "x".into())
                    .await
                    .unwrap(),
            ));
        }
        let (s, revs) = (store.clone(), Arc::new(revs));
        let cas = measure(clients, move |i| {
            let (s, revs) = (s.clone(), revs.clone());
            async move {
                let k = format!("cas-{tag}-{i}");
                let rev = *revs[i].lock().unwrap();
                let taken = s.update(&k, "held".into(), rev).await.unwrap();
                let freed = s.update(&k, "free".into(), taken).await.unwrap();
                *revs[i].lock().unwrap() = freed;
            }
        })
        .await;
        row(
            "NATS KV",
            clients,
            &engine,
            "two revision-checked `update`s",
            &cas,
        );
    }
    let (p50, p99) = common::handoff(&locks, HANDOFFS).await;
    let s = store.clone();
    let rtt = rtt(move || {
        let s = s.clone();
        async move {
            s.entry("rtt").await.unwrap();
        }
    })
    .await;
    println!(
        "| NATS KV hand-off (KV watch) | p50 {} ms | p99 {} ms | RTT (KV `get`) p50 {} ms |",
        ms(p50),
        ms(p99),
        ms(rtt)
    );
    requests_row("NATS KV", requests_per_op(storage).await, "");
    js.delete_key_value("storage-lock-bench-raw").await.unwrap();
}

/// An object store's cycle against its bare conditional PUT (`If-None-Match: *`) + `DELETE`,
/// through the very store client the storage uses (`ObjectStoreStorage::object_store`).
async fn object_store_bench(label: &str, url: &str, container: &str) {
    use object_store::{ObjectStore, PutMode, PutOptions, PutPayload, path::Path};
    let url = url.replacen(container, &format!("{container}/bench"), 1);
    let opened = storage_lock::ObjectStoreStorage::from_url(&url).unwrap();
    let raw: Arc<dyn ObjectStore> = opened.object_store().clone();
    let storage: Arc<dyn storage_lock::backend::Storage> = Arc::new(opened);
    let locks = StorageLock::builder_arc(storage.clone()).build().unwrap();
    let tag = std::process::id();
    for clients in [1, 16] {
        let engine = measure(clients, engine_op(locks.clone())).await;
        let r = raw.clone();
        let base = measure(clients, move |i| {
            let r = r.clone();
            async move {
                let p = Path::from(format!("raw-bench/{tag}-{i}"));
                let opts = PutOptions {
                    mode: PutMode::Create,
                    ..PutOptions::default()
                };
                r.put_opts(&p, PutPayload::from_static(b"x"), opts)
                    .await
                    .unwrap();
                object_store::ObjectStoreExt::delete(&*r, &p).await.unwrap();
            }
        })
        .await;
        row(
            label,
            clients,
            &engine,
            "`PUT If-None-Match` + `DELETE`",
            &base,
        );
    }
    let (p50, p99) = common::handoff(&locks, HANDOFFS).await;
    let r = raw.clone();
    let rtt = rtt(move || {
        let r = r.clone();
        async move {
            let _ = object_store::ObjectStoreExt::head(&*r, &Path::from("rtt")).await;
        }
    })
    .await;
    println!(
        "| {label} hand-off (backoff) | p50 {} ms | p99 {} ms | RTT (`HEAD`) p50 {} ms |",
        ms(p50),
        ms(p99),
        ms(rtt)
    );
    requests_row(label, requests_per_op(storage).await, "");
}

/// memcached's cycle against its bare meta commands, add (`ms KEY 1 ME`) + `md KEY`, one
/// round trip each, every client on a connection of its own.
async fn memcached_bench(url: &str) {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufStream};
    let tag = std::process::id();
    let url = format!("{url}&prefix=storage-lock-bench-{tag}:");
    let storage = storage_lock::connect_storage(&url).await.unwrap();
    let locks = StorageLock::builder_arc(storage.clone()).build().unwrap();
    let address = url
        .trim_start_matches("memcached://")
        .split(['?', '/'])
        .next()
        .unwrap()
        .to_owned();
    let mut conns = Vec::new();
    for _ in 0..16 {
        let stream = tokio::net::TcpStream::connect(&address).await.unwrap();
        stream.set_nodelay(true).unwrap();
        conns.push(tokio::sync::Mutex::new(BufStream::new(stream)));
    }
    let conns = Arc::new(conns);
    async fn ask(conn: &mut BufStream<tokio::net::TcpStream>, request: &str, answer: &str) {
        conn.write_all(request.as_bytes()).await.unwrap();
        conn.flush().await.unwrap();
        let mut line = String::new();
        conn.read_line(&mut line).await.unwrap();
        assert!(line.starts_with(answer), "{request:?}: {line:?}");
    }
    for clients in [1, 16] {
        let engine = measure(clients, engine_op(locks.clone())).await;
        let c = conns.clone();
        let base = measure(clients, move |i| {
            let c = c.clone();
            async move {
                let mut conn = c[i].lock().await;
                ask(&mut conn, &format!("ms raw-{tag}-{i} 1 ME\r\nx\r\n"), "HD").await;
                ask(&mut conn, &format!("md raw-{tag}-{i}\r\n"), "HD").await;
            }
        })
        .await;
        row("memcached", clients, &engine, "`ms … ME` + `md`", &base);
    }
    let (p50, p99) = common::handoff(&locks, HANDOFFS).await;
    let c = conns.clone();
    let rtt = rtt(move || {
        let c = c.clone();
        async move { ask(&mut *c[0].lock().await, "mn\r\n", "MN").await }
    })
    .await;
    println!(
        "| memcached hand-off (backoff) | p50 {} ms | p99 {} ms | RTT (`mn`) p50 {} ms |",
        ms(p50),
        ms(p99),
        ms(rtt)
    );
    requests_row("memcached", requests_per_op(storage).await, "");
}

/// ZooKeeper's cycle against its bare conditional write on the same server: two
/// `setData(path, version)` on a znode of the client's own (what the engine's acquire and
/// release each are when the holder knows the version), on one session like the engine's.
async fn zookeeper_bench(url: &str) {
    use zookeeper_client as zk;
    let tag = std::process::id();
    let url = format!("{url}-bench-{tag}");
    let storage = storage_lock::connect_storage(&url).await.unwrap();
    let locks = StorageLock::builder_arc(storage.clone()).build().unwrap();
    let servers = url
        .trim_start_matches("zookeeper://")
        .split(['?', '/'])
        .next()
        .unwrap()
        .to_owned();
    let client = zk::Client::connect(&servers).await.unwrap();
    let root = format!("/storage-lock-bench-raw-{tag}");
    let options = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
    client.create(&root, b"", &options).await.unwrap();
    let mut versions = Vec::new();
    for i in 0..16 {
        client
            .create(&format!("{root}/{i}"), b"x", &options)
            .await
            .unwrap();
        versions.push(tokio::sync::Mutex::new(0));
    }
    let versions = Arc::new(versions);
    for clients in [1, 16] {
        let engine = measure(clients, engine_op(locks.clone())).await;
        let (c, v, root) = (client.clone(), versions.clone(), root.clone());
        let base = measure(clients, move |i| {
            let (c, v, path) = (c.clone(), v.clone(), format!("{root}/{i}"));
            async move {
                let mut version = v[i].lock().await;
                for _ in 0..2 {
                    let stat = c.set_data(&path, b"x", Some(*version)).await.unwrap();
                    *version = stat.version;
                }
            }
        })
        .await;
        row(
            "ZooKeeper",
            clients,
            &engine,
            "two `setData(path, version)`",
            &base,
        );
    }
    let (p50, p99) = common::handoff(&locks, HANDOFFS).await;
    let c = client.clone();
    let rtt = rtt(move || {
        let c = c.clone();
        async move {
            c.check_stat("/").await.unwrap();
        }
    })
    .await;
    println!(
        "| ZooKeeper hand-off (watch) | p50 {} ms | p99 {} ms | RTT (`exists /`) p50 {} ms |",
        ms(p50),
        ms(p99),
        ms(rtt)
    );
    requests_row("ZooKeeper", requests_per_op(storage).await, "");
}

/// DynamoDB's cycle against its bare conditional writes on the same endpoint: `PutItem` with
/// `attribute_not_exists(k)` + `DeleteItem`, one request each on one pooled HTTP client (not
/// signed: the emulators do not check, so the baseline skips the engine's SigV4 work).
async fn dynamodb_bench(label: &str, url: &str) {
    let tag = std::process::id();
    let url = url.replacen(
        "dynamodb://storage-lock-test",
        &format!("dynamodb://storage-lock-test/bench-{tag}/"),
        1,
    );
    let storage = storage_lock::connect_storage(&url).await.unwrap();
    let locks = StorageLock::builder_arc(storage.clone()).build().unwrap();
    let start = url.find("endpoint=").unwrap() + "endpoint=".len();
    let end = url[start..].find('&').map_or(url.len(), |i| start + i);
    let endpoint = format!("{}/", &url[start..end]);
    let http = reqwest::Client::new();
    let call = move |action: &'static str, body: serde_json::Value| {
        let (http, endpoint) = (http.clone(), endpoint.clone());
        async move {
            let response = http
                .post(&endpoint)
                .header("content-type", "application/x-amz-json-1.0")
                .header("x-amz-target", format!("DynamoDB_20120810.{action}"))
                // Unchecked, but dynalite wants them present.
                .header("x-amz-date", "20260101T000000Z")
                .header(
                    "authorization",
                    "AWS4-HMAC-SHA256 Credential=test/20260101/us-east-1/dynamodb/aws4_request, \
                     SignedHeaders=host, Signature=0",
                )
                .body(body.to_string())
                .send()
                .await
                .unwrap();
            assert!(response.status().is_success(), "{action}: {response:?}");
            response.bytes().await.unwrap();
        }
    };
    for clients in [1, 16] {
        let engine = measure(clients, engine_op(locks.clone())).await;
        let call = call.clone();
        let base = measure(clients, move |i| {
            let call = call.clone();
            async move {
                let key = serde_json::json!({ "k": { "S": format!("raw-{tag}-{i}") } });
                let mut item = key.clone();
                item["r"] = serde_json::json!({ "B": "eA==" });
                call(
                    "PutItem",
                    serde_json::json!({
                        "TableName": "storage-lock-test",
                        "Item": item,
                        "ConditionExpression": "attribute_not_exists(k)",
                    }),
                )
                .await;
                call(
                    "DeleteItem",
                    serde_json::json!({ "TableName": "storage-lock-test", "Key": key }),
                )
                .await;
            }
        })
        .await;
        row(
            label,
            clients,
            &engine,
            "conditional `PutItem` + `DeleteItem`",
            &base,
        );
    }
    let (p50, p99) = common::handoff(&locks, HANDOFFS).await;
    let rtt = rtt(move || {
        let call = call.clone();
        async move { call("ListTables", serde_json::json!({ "Limit": 1 })).await }
    })
    .await;
    println!(
        "| {label} hand-off (backoff) | p50 {} ms | p99 {} ms | RTT (`ListTables`) p50 {} ms |",
        ms(p50),
        ms(p99),
        ms(rtt)
    );
    requests_row(label, requests_per_op(storage).await, "");
}
