//! Both suites against [`MemoryStorage`], through its own lock operations and the defaults.

use storage_lock_core::MemoryStorage;

async fn memory() -> MemoryStorage {
    MemoryStorage::new()
}

storage_lock_testkit::storage_lock_suites!(memory);
