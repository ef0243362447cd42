#![allow(missing_docs)]
//! Ratios and latencies measured in one run, printed as a table for BENCHMARKS.md:
//!
//! * uncontended acquire+release: memory engine vs naive `Mutex<HashMap>` table (median of
//!   interleaved rounds);
//! * hand-off latency (holder calls `release()` → waiter holds the lock), p50/p99, on memory
//!   (notifications) and SQLite (backoff).
//!
//! `cargo bench -p storage-lock --bench handoff`

mod common;

use std::time::{Duration, Instant};

use storage_lock::{AcquireOptions, MemoryStorage, StorageLock};

const ROUNDS: usize = 7;
const CYCLES: u32 = 200_000;
const HANDOFFS: usize = 2_000;

fn main() {
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
        "| hand-off latency, SQLite (backoff) | p50 {:.1} µs | p99 {:.1} µs |",
        us(p50),
        us(p99)
    );
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
