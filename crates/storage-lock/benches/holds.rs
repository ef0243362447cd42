#![allow(missing_docs)]
//! The cost of a held lock on the memory engine: resident memory per hold (RSS delta / N, the
//! name, the record, the handle and its timers) at 1 000 000 holds, and the acquire + release
//! latency of one more key with 1 000 and with 1 000 000 locks held (the ratio of the two).
//! Plain holds and auto-renewed holds (a watchdog each).
//!
//! `cargo bench -p storage-lock --bench holds` (Linux: reads `/proc/self/statm`)

use std::time::{Duration, Instant};

use storage_lock::{AcquireOptions, LockHandle, MemoryStorage, StorageLock};

const MANY: usize = 1_000_000;
const FEW: usize = 1_000;
const CYCLES: usize = 20_000;

fn rss() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// Median acquire + release of a key nobody holds, with whatever is held now.
async fn cycle(locks: &StorageLock<MemoryStorage>, opts: &AcquireOptions) -> Duration {
    let mut samples = Vec::with_capacity(CYCLES);
    for i in 0..CYCLES {
        let name = format!("probe-{}", i % 64);
        let t = Instant::now();
        let h = locks.try_acquire(&name, opts).await.unwrap().unwrap();
        h.release().await.unwrap();
        samples.push(t.elapsed());
    }
    samples.sort();
    samples[CYCLES / 2]
}

async fn run(label: &str, opts: AcquireOptions) {
    let locks = StorageLock::new(MemoryStorage::new()).unwrap();
    let mut held: Vec<LockHandle> = Vec::with_capacity(MANY);
    let take = |held: &mut Vec<LockHandle>, from: usize, to: usize| {
        let (locks, opts) = (locks.clone(), opts.clone());
        let mut batch = std::mem::take(held);
        async move {
            for i in from..to {
                let h = locks
                    .try_acquire(&format!("held-{i:07}"), &opts)
                    .await
                    .unwrap()
                    .unwrap();
                batch.push(h);
            }
            batch
        }
    };
    held = take(&mut held, 0, FEW).await;
    // A first round warms the allocator, the caches and the runtime; the second is measured.
    cycle(&locks, &opts).await;
    let few = cycle(&locks, &opts).await;
    let before = rss();
    held = take(&mut held, FEW, MANY).await;
    let per_hold = rss().saturating_sub(before) as f64 / (MANY - FEW) as f64;
    let many = cycle(&locks, &opts).await;
    println!(
        "| {label} | {per_hold:.0} B | {:.2} µs | {:.2} µs | **{:.2}×** |",
        few.as_secs_f64() * 1e6,
        many.as_secs_f64() * 1e6,
        many.as_secs_f64() / few.as_secs_f64()
    );
    drop(held);
}

/// Set in the child process that measures one variant (a fresh process each, so that memory
/// freed by one variant does not hide the next one's growth).
const VARIANT: &str = "STORAGE_LOCK_HOLDS_VARIANT";

fn main() {
    let lease = Duration::from_secs(3600);
    let variants = [
        ("plain", AcquireOptions::default().lease(lease)),
        (
            "auto-renewed (watchdog every 20 min)",
            AcquireOptions::default()
                .lease(lease)
                .auto_renew(Duration::from_secs(1200)),
        ),
    ];
    if let Ok(v) = std::env::var(VARIANT) {
        let (label, opts) = variants[v.parse::<usize>().unwrap()].clone();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        return rt.block_on(run(label, opts));
    }
    // `cargo bench` passes --bench; `cargo test --all-targets` runs this binary without it:
    // then only check that it starts.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    println!(
        "| holds on the memory engine | memory per hold at {MANY} held | acquire + release p50, {FEW} held | same, {MANY} held | ratio |"
    );
    println!("|---|---|---|---|---|");
    for i in 0..variants.len() {
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .env(VARIANT, i.to_string())
            .status()
            .unwrap();
        assert!(status.success());
    }
}
