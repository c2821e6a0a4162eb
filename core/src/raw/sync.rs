//! The atomics the index protocol is written against.
//!
//! Under `--cfg loom` they are loom's model-checked atomics, so the loom
//! tests explore every interleaving of the index protocol; otherwise they are
//! `std`'s. Only the index (tags, slots, counters) goes through this module:
//! the row arena and the epoch machinery are not part of the loom models.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Waits for another thread to finish a short critical step (publishing a
/// pending slot, migrating a chunk). Spins briefly, then yields the CPU.
pub(crate) struct Spin {
    #[cfg(not(loom))]
    backoff: crossbeam_utils::Backoff,
}

impl Spin {
    pub(crate) fn new() -> Self {
        Spin {
            #[cfg(not(loom))]
            backoff: crossbeam_utils::Backoff::new(),
        }
    }

    /// One round of waiting.
    pub(crate) fn wait(&self) {
        #[cfg(loom)]
        loom::thread::yield_now();
        #[cfg(not(loom))]
        self.backoff.snooze();
    }
}
