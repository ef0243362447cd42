//! Two contenders take turns on one lock in an embedded SQLite file.
//!
//! ```text
//! cargo run --example contenders [-- PATH]   # default: ./storage-lock-demo.db
//! ```
//!
//! Each contender has its own storage connection (as two processes would) and takes the lock
//! three times; the fencing token grows with every acquisition, and the waiter gets the lock
//! right after the holder releases it.

use std::time::{Duration, Instant};

use storage_lock::{AcquireOptions, StorageLock, Wait, connect};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "storage-lock-demo.db".into());
    let url = format!("sqlite://{path}");
    println!("storage: {url}");
    let start = Instant::now();
    let a = tokio::spawn(contender("A", connect(&url).await?, start));
    let b = tokio::spawn(contender("B", connect(&url).await?, start));
    a.await??;
    b.await??;
    Ok(())
}

async fn contender(
    who: &'static str,
    locks: StorageLock,
    start: Instant,
) -> Result<(), storage_lock::LockError> {
    let opts = AcquireOptions::default()
        .wait(Wait::For(Duration::from_secs(10)))
        .lease(Duration::from_secs(5))
        .auto_renew(Duration::from_secs(1))
        .note(format!("contender {who}"));
    for round in 1..=3 {
        let Some(handle) = locks.try_acquire("demo", &opts).await? else {
            println!(
                "{:>6.3}s {who}: gave up waiting",
                start.elapsed().as_secs_f64()
            );
            continue;
        };
        println!(
            "{:>6.3}s {who}: holds `demo` (round {round}, fencing token {})",
            start.elapsed().as_secs_f64(),
            handle.fencing_token()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        println!("{:>6.3}s {who}: releases", start.elapsed().as_secs_f64());
        handle.release().await?;
        // Other work between rounds, so the other contender gets its turn.
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    Ok(())
}
