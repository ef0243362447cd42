//! The naive baseline every memory-engine benchmark compares with: a keyed `Mutex<HashMap>`
//! lock table (insert-if-absent, remove). Shared by `storage-lock-core`'s `cycle` bench and, by
//! path, the facade's benches.

use std::collections::HashMap;
use std::sync::Mutex;

/// The least a lock table can do: a map of held keys and a token counter.
#[derive(Default)]
pub struct NaiveTable {
    held: Mutex<HashMap<String, u64>>,
    next: Mutex<u64>,
}

impl NaiveTable {
    /// The key's new token, or `None` if it is held.
    pub fn try_lock(&self, key: &str) -> Option<u64> {
        let mut held = self.held.lock().unwrap();
        if held.contains_key(key) {
            return None;
        }
        let token = {
            let mut n = self.next.lock().unwrap();
            *n += 1;
            *n
        };
        held.insert(key.to_owned(), token);
        Some(token)
    }

    /// Frees the key.
    pub fn unlock(&self, key: &str) {
        self.held.lock().unwrap().remove(key);
    }
}
