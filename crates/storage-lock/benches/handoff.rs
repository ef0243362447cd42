#![allow(missing_docs)]
//! Ratios and latencies measured in one run, printed as a table for BENCHMARKS.md:
//!
//! * uncontended acquire+release: memory engine vs naive `Mutex<HashMap>` table (median of
//!   interleaved rounds);
//! * hand-off latency (holder calls `release()` → waiter holds the lock), p50/p99, on memory
//!   (notifications), SQLite within one process, and SQLite between two processes (the waiter
//!   is this binary started again; woken through the `-wake` directory), with the same
//!   between two processes when the waiter only backs off (`?notify` off: the baseline).
//!
//! `cargo bench -p storage-lock --bench handoff`

mod common;

use std::time::{Duration, Instant};

use storage_lock::{AcquireOptions, MemoryStorage, StorageLock};

const ROUNDS: usize = 7;
const CYCLES: u32 = 200_000;
const HANDOFFS: usize = 2_000;

/// Set in the waiter process this bench starts: the database file to wait on.
const CHILD: &str = "STORAGE_LOCK_HANDOFF_CHILD";
const CROSS_HANDOFFS: usize = 300;

fn main() {
    if let Ok(db) = std::env::var(CHILD) {
        return child(&db);
    }
    // `cargo bench` passes --bench; `cargo test --all-targets` runs this binary without it:
    // then only check that it starts.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let ratio = rt.block_on(uncontended_ratio());
    println!(
        "| uncontended acquire+release, memory engine vs naive table | {:.0} ns vs {:.0} ns | ratio {:.2}× |",
        ratio.0,
        ratio.1,
        ratio.0 / ratio.1
    );
    let memory = StorageLock::new(MemoryStorage::new()).unwrap();
    let (p50, p99) = rt.block_on(common::handoff(&memory, HANDOFFS));
    println!(
        "| hand-off latency, memory | p50 {:.1} µs | p99 {:.1} µs |",
        us(p50),
        us(p99)
    );
    let dir = tempfile::tempdir().unwrap();
    let sqlite = rt.block_on(async {
        StorageLock::new(
            storage_lock::SqliteStorage::open(dir.path().join("h.db"))
                .await
                .unwrap(),
        )
        .unwrap()
    });
    let (p50, p99) = rt.block_on(common::handoff(&sqlite, 300));
    println!(
        "| hand-off latency, SQLite, one process | p50 {:.1} µs | p99 {:.1} µs |",
        us(p50),
        us(p99)
    );
    for wake in [true, false] {
        let (p50, p99) = rt.block_on(cross_process(&dir.path().join("x.db"), wake));
        println!(
            "| hand-off latency, SQLite, two processes ({}) | p50 {:.1} µs | p99 {:.1} µs |",
            if wake {
                "wake-up directory"
            } else {
                "backoff only"
            },
            us(p50),
            us(p99)
        );
    }
}

async fn sqlite_locks(db: &str, wake: bool) -> StorageLock {
    let storage = storage_lock::SqliteStorage::open(db).await.unwrap();
    let storage: std::sync::Arc<dyn storage_lock::backend::Storage> = if wake {
        std::sync::Arc::new(storage)
    } else {
        // The same file without change notifications: waiters back off.
        std::sync::Arc::new(storage_lock_core::fault::PrimitivesOnly(storage))
    };
    StorageLock::builder_arc(storage).build().unwrap()
}

/// The waiter process: for each line `go` on stdin, waits for the lock, prints the wall-clock
/// time it got it (ns since the epoch), releases it and prints `done`.
fn child(db: &str) {
    use std::io::{BufRead, Write};
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let wake = std::env::var("STORAGE_LOCK_HANDOFF_WAKE").is_ok_and(|v| v == "1");
    let locks = rt.block_on(sqlite_locks(db, wake));
    let wait = AcquireOptions::default()
        .lease(Duration::from_secs(30))
        .wait(storage_lock::Wait::Forever);
    let mut out = std::io::stdout().lock();
    for line in std::io::stdin().lock().lines() {
        if line.unwrap() != "go" {
            break;
        }
        let h = rt
            .block_on(locks.try_acquire("cross", &wait))
            .unwrap()
            .unwrap();
        let got = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        rt.block_on(h.release()).unwrap();
        writeln!(out, "{got}\ndone").unwrap();
        out.flush().unwrap();
    }
}

/// Release in this process → the waiter in another process holds the lock.
async fn cross_process(db: &std::path::Path, wake: bool) -> (Duration, Duration) {
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Command, Stdio};
    let db = db.to_str().unwrap().to_owned();
    let locks = sqlite_locks(&db, wake).await;
    let mut waiter = Command::new(std::env::current_exe().unwrap())
        .env(CHILD, &db)
        .env("STORAGE_LOCK_HANDOFF_WAKE", if wake { "1" } else { "0" })
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut to = waiter.stdin.take().unwrap();
    let mut from = BufReader::new(waiter.stdout.take().unwrap()).lines();
    let opts = AcquireOptions::default()
        .lease(Duration::from_secs(30))
        .wait(storage_lock::Wait::Forever);
    let mut samples = Vec::with_capacity(CROSS_HANDOFFS);
    for _ in 0..CROSS_HANDOFFS {
        let h = locks.try_acquire("cross", &opts).await.unwrap().unwrap();
        writeln!(to, "go").unwrap();
        to.flush().unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await; // the waiter is waiting
        let released = std::time::SystemTime::now();
        h.release().await.unwrap();
        let got: u64 = from.next().unwrap().unwrap().parse().unwrap();
        assert_eq!(from.next().unwrap().unwrap(), "done");
        let got = std::time::UNIX_EPOCH + Duration::from_nanos(got);
        samples.push(got.duration_since(released).unwrap_or_default());
    }
    drop(to);
    waiter.wait().unwrap();
    common::percentiles(samples)
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Median ns per cycle of (engine, naive), alternating rounds so both see the same machine state.
async fn uncontended_ratio() -> (f64, f64) {
    let naive = common::NaiveTable::default();
    let locks = StorageLock::new(MemoryStorage::new()).unwrap();
    let opts = AcquireOptions::default();
    let (mut engine_ns, mut naive_ns) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let t = Instant::now();
        for _ in 0..CYCLES {
            let h = locks.try_acquire("bench", &opts).await.unwrap().unwrap();
            std::hint::black_box(h.fencing_token());
            h.release().await.unwrap();
        }
        engine_ns.push(t.elapsed().as_nanos() as f64 / f64::from(CYCLES));
        let t = Instant::now();
        for _ in 0..CYCLES {
            std::hint::black_box(naive.try_lock("bench").unwrap());
            naive.unlock("bench");
        }
        naive_ns.push(t.elapsed().as_nanos() as f64 / f64::from(CYCLES));
    }
    (median(engine_ns), median(naive_ns))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
