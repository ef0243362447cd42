#![allow(missing_docs)] // criterion macros generate undocumented items
//! Criterion benchmarks: uncontended acquire+release on the memory engine vs a naive
//! `Mutex<HashMap>` table, and a SQLite cycle vs a raw SQLite lock table, each pair in one run.
//!
//! `cargo bench -p storage-lock --bench engine`

mod common;

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use storage_lock::{AcquireOptions, MemoryStorage, SqliteStorage, StorageLock};

fn uncontended(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut g = c.benchmark_group("uncontended_acquire_release");
    let naive = common::NaiveTable::default();
    g.bench_function("naive_mutex_hashmap", |b| {
        b.iter(|| {
            let t = naive.try_lock("bench").unwrap();
            std::hint::black_box(t);
            naive.unlock("bench");
        })
    });
    let locks = StorageLock::new(MemoryStorage::new()).unwrap();
    let opts = AcquireOptions::default();
    g.bench_function("memory_engine", |b| {
        b.to_async(&rt).iter(|| async {
            let h = locks.try_acquire("bench", &opts).await.unwrap().unwrap();
            std::hint::black_box(h.fencing_token());
            h.release().await.unwrap();
        })
    });
    g.finish();
}

fn sqlite(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut g = c.benchmark_group("sqlite_acquire_release");
    g.measurement_time(Duration::from_secs(5));
    let raw = rt.block_on(common::RawSqlite::open(&dir.path().join("raw.db"), false));
    g.bench_function("raw_insert_delete", |b| {
        b.to_async(&rt).iter(|| raw.cycle("bench"))
    });
    let synced = rt.block_on(common::RawSqlite::open(&dir.path().join("synced.db"), true));
    g.bench_function("raw_insert_delete_synced", |b| {
        b.to_async(&rt).iter(|| synced.cycle("bench"))
    });
    let locks = rt.block_on(async {
        StorageLock::new(
            SqliteStorage::open(dir.path().join("engine.db"))
                .await
                .unwrap(),
        )
        .unwrap()
    });
    let opts = AcquireOptions::default();
    g.bench_function("engine", |b| {
        b.to_async(&rt).iter(|| async {
            let h = locks.try_acquire("bench", &opts).await.unwrap().unwrap();
            h.release().await.unwrap();
        })
    });
    g.finish();
}

criterion_group!(benches, uncontended, sqlite);
criterion_main!(benches);
