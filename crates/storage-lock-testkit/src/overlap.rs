//! [`OverlapDetector`]: checks mutual exclusion without trusting any synchronised counter.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use storage_lock_core::FencedResource;

/// Shared state that only stays consistent if critical sections never overlap.
///
/// [`OverlapDetector::critical_section`] does a deliberately **non-atomic** read-modify-write
/// (load, yield to the scheduler, store) of a counter, so two overlapping sections lose an
/// increment; it also flags entering while another section is inside, and writes through a
/// [`FencedResource`] that records every stale token.
#[derive(Debug, Default)]
pub struct OverlapDetector {
    inside: AtomicBool,
    overlaps: AtomicUsize,
    value: AtomicU64,
    fenced: FencedResource<u64>,
}

impl OverlapDetector {
    /// A detector with nothing recorded.
    pub fn new() -> Self {
        Self::default()
    }

    /// One critical section, run by a holder with fencing token `token`.
    pub async fn critical_section(&self, token: u64) {
        if self.inside.swap(true, Ordering::SeqCst) {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        let v = self.value.load(Ordering::SeqCst);
        tokio::task::yield_now().await;
        self.value.store(v + 1, Ordering::SeqCst);
        let _ = self.fenced.write(token, |n| *n += 1);
        self.inside.store(false, Ordering::SeqCst);
    }

    /// Panics unless exactly `sections` sections ran, none overlapped, and no token was stale.
    pub fn assert_exclusive(&self, sections: u64) {
        assert_eq!(
            self.overlaps.load(Ordering::SeqCst),
            0,
            "critical sections overlapped"
        );
        assert_eq!(
            self.fenced.rejected(),
            0,
            "a stale fencing token reached the resource"
        );
        assert_eq!(
            self.value.load(Ordering::SeqCst),
            sections,
            "increments were lost: sections overlapped"
        );
        assert_eq!(self.fenced.read(|n| *n), sections);
    }
}
