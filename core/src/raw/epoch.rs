//! Epoch-based reclamation, one dedicated `crossbeam-epoch` collector per
//! table.
//!
//! A dedicated collector keeps one table's readers from delaying another
//! table's reclamation. Each thread registers once per table: handles are
//! cached in a small thread-local list (oldest evicted first), so pinning for
//! a batch costs a short scan and the pin itself.

use crossbeam_epoch::{Collector, Guard, LocalHandle};
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

/// How many tables' handles one thread keeps registered.
const CACHED_HANDLES: usize = 16;

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static HANDLES: RefCell<Vec<(u64, LocalHandle)>> = const { RefCell::new(Vec::new()) };
}

/// A table's collector.
pub(crate) struct Epoch {
    collector: Collector,
    id: u64,
}

impl Epoch {
    pub(crate) fn new() -> Epoch {
        Epoch {
            collector: Collector::new(),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// Pins the current thread: memory retired from now on is not freed
    /// until the guard is dropped.
    pub(crate) fn pin(&self) -> Guard {
        HANDLES
            .try_with(|handles| {
                let mut handles = handles.borrow_mut();
                if let Some((_, handle)) = handles.iter().find(|(id, _)| *id == self.id) {
                    return handle.pin();
                }
                let handle = self.collector.register();
                let guard = handle.pin();
                if handles.len() == CACHED_HANDLES {
                    handles.remove(0);
                }
                handles.push((self.id, handle));
                guard
            })
            // The thread is being torn down: register for this one pin.
            .unwrap_or_else(|_| self.collector.register().pin())
    }

    /// Gives this thread's handle back and collects what can be collected;
    /// called when the table is dropped.
    pub(crate) fn release_thread_handle(&self) {
        for _ in 0..3 {
            self.pin().flush();
        }
        let _ = HANDLES.try_with(|handles| {
            handles.borrow_mut().retain(|(id, _)| *id != self.id);
        });
    }
}
