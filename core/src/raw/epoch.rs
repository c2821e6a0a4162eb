//! Epoch-based reclamation, one dedicated `crossbeam-epoch` collector per
//! table.
//!
//! A dedicated collector keeps one table's readers from delaying another
//! table's reclamation. Each thread registers once per table: its handles
//! live in a thread-local map keyed by the table's collector id, so pinning
//! for a batch costs a hash lookup and the pin itself, however many tables a
//! thread uses. An entry holds a weak reference to its table's liveness
//! token; entries of dropped tables are purged whenever a thread registers
//! a new handle, so a dead table's collector (and its garbage) is freed.

use crossbeam_epoch::{Collector, Guard, LocalHandle};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// This thread's registered handles, by collector id. Each entry also keeps
/// a clone of its collector, dropped after the handle (tuple fields drop in
/// order): the last reference to a collector is then never the handle
/// itself, whose release would free the collector from inside
/// crossbeam-epoch's `Local::finalize` while `&self` is live (flagged by
/// Miri as undefined behaviour).
type Handles = HashMap<u64, (Weak<()>, LocalHandle, Collector), ahash::RandomState>;

thread_local! {
    static HANDLES: RefCell<Handles> = const {
        RefCell::new(HashMap::with_hasher(ahash::RandomState::with_seeds(1, 2, 3, 4)))
    };
}

/// A table's collector.
pub(crate) struct Epoch {
    collector: Collector,
    id: u64,
    /// Dropped with the table: tells threads their handle can go.
    alive: Arc<()>,
}

impl Epoch {
    pub(crate) fn new() -> Epoch {
        Epoch {
            collector: Collector::new(),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            alive: Arc::new(()),
        }
    }

    /// Pins the current thread: memory retired from now on is not freed
    /// until the guard is dropped.
    pub(crate) fn pin(&self) -> Guard {
        HANDLES
            .try_with(|handles| {
                let mut handles = handles.borrow_mut();
                if let Some((_, handle, _)) = handles.get(&self.id) {
                    return handle.pin();
                }
                handles.retain(|_, (alive, _, _)| alive.strong_count() > 0);
                let handle = self.collector.register();
                let guard = handle.pin();
                let entry = (Arc::downgrade(&self.alive), handle, self.collector.clone());
                handles.insert(self.id, entry);
                guard
            })
            // The thread is being torn down: register for this one pin.
            .unwrap_or_else(|_| self.collector.register().pin())
    }

    /// Pins and flushes a few times, so that memory this thread retired is
    /// freed now if no other thread is pinned (rather than many pins later,
    /// when the collector gets round to it). Called after a resize, whose
    /// retired index can be large.
    pub(crate) fn reclaim(&self) {
        for _ in 0..3 {
            self.pin().flush();
        }
    }

    /// Gives this thread's handle back and collects what can be collected;
    /// called when the table is dropped.
    pub(crate) fn release_thread_handle(&self) {
        for _ in 0..3 {
            self.pin().flush();
        }
        let _ = HANDLES.try_with(|handles| handles.borrow_mut().remove(&self.id));
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn one_handle_per_table_and_dead_tables_are_purged() {
        let count = || HANDLES.with(|h| h.borrow().len());
        let before = count();
        let epochs: Vec<Epoch> = (0..40).map(|_| Epoch::new()).collect();
        for _ in 0..3 {
            for epoch in &epochs {
                drop(epoch.pin());
            }
        }
        assert_eq!(count(), before + 40, "a handle per table, none evicted");
        drop(epochs);
        drop(Epoch::new().pin());
        assert_eq!(count(), before + 1, "handles of dropped tables are purged");
    }
}
