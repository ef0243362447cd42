#![allow(missing_docs)]
//! One uncontended acquire + release on the memory engine against a naive `Mutex<HashMap>`
//! lock table, as a plain loop: what `scripts/bench-cycle-instructions.sh` counts instructions
//! of under callgrind (wall-clock timings on a shared machine move by ±30 %; instruction counts
//! do not).
//!
//! `cycle (naive|engine) N` runs N cycles and prints the time per cycle.

#[path = "support/naive_table.rs"]
mod naive_table;

use std::time::Instant;

use naive_table::NaiveTable;
use storage_lock_core::{AcquireOptions, MemoryStorage, StorageLock};

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(what), Some(n)) = (args.next(), args.next().and_then(|n| n.parse::<u32>().ok()))
    else {
        // `cargo bench` / `cargo test --all-targets` run it without arguments: nothing to do.
        return;
    };
    let started = Instant::now();
    match what.as_str() {
        "naive" => {
            let table = NaiveTable::default();
            for _ in 0..n {
                let token = table.try_lock(std::hint::black_box("bench")).unwrap();
                std::hint::black_box(token);
                table.unlock("bench");
            }
        }
        "engine" => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let locks = StorageLock::new(MemoryStorage::new()).unwrap();
                let opts = AcquireOptions::default();
                for _ in 0..n {
                    let h = locks.try_acquire("bench", &opts).await.unwrap().unwrap();
                    std::hint::black_box(h.fencing_token());
                    h.release().await.unwrap();
                }
            });
        }
        other => panic!("cycle: unknown variant {other:?} (naive or engine)"),
    }
    let per = started.elapsed().as_nanos() as f64 / f64::from(n);
    println!("{what}: {per:.1} ns per cycle");
}
