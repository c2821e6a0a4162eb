//! When evicted rows reach the listener: after every shard a call writes.
//!
//! A table hands the rows one batch evicted to its listener when the batch
//! ends. A variable call runs one batch per shard it writes, so it holds
//! those deliveries ([`HeldDeliveries`]) until its last shard is written
//! and its pins are released: the listener then sees every row of the call
//! in the table, and a panicking listener cannot keep the call's later
//! shards from being written. The held batches are handed over in the order
//! they were evicted, each exactly once: a listener that panics on one
//! still gets the others, and the first panic is resumed after the last
//! ([`HeldDeliveries::finish`]). If the call itself unwinds (a panicking
//! update closure), the held batches are still delivered, and the
//! listener's panics are then dropped (the call's own panic is on its
//! way).
//!
//! Frames nest per thread: every call opens its own, so a call made from an
//! update closure or a listener delivers its evictions before it returns.
//! Once the thread's locals are gone (a write from a thread-local's
//! destructor), rows go to the listener at once.

use super::{EvictedRows, ShardListener};
use std::cell::RefCell;
use std::marker::PhantomData;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};

/// Batches of evicted rows held for each open [`HeldDeliveries`] of this
/// thread, innermost last.
type Held = Vec<Vec<(ShardListener, EvictedRows)>>;

thread_local! {
    static HELD: RefCell<Held> = const { RefCell::new(Vec::new()) };
}

/// While open, the evicted rows the tables of this thread's call hand to
/// their listeners are held; [`HeldDeliveries::finish`] delivers them and
/// resumes a listener's panic, and a drop without it (the call is
/// unwinding) delivers them and drops the listener's panics (see the module
/// docs).
pub(crate) struct HeldDeliveries {
    /// Whether this frame is on the thread's stack (not if the thread's
    /// locals are already gone: then deliveries go straight through).
    open: bool,
    /// Bound to the thread whose deliveries it holds.
    _thread: PhantomData<*const ()>,
}

impl HeldDeliveries {
    /// Starts holding this thread's deliveries.
    pub(crate) fn begin() -> Self {
        let open = HELD
            .try_with(|held| held.borrow_mut().push(Vec::new()))
            .is_ok();
        HeldDeliveries {
            open,
            _thread: PhantomData,
        }
    }

    /// Ends the call normally: hands every held batch to its listener, in
    /// order, then resumes the first panic of a listener, if any.
    pub(crate) fn finish(mut self) {
        if let Some(panic) = self.deliver_held() {
            resume_unwind(panic);
        }
    }

    /// Pops this frame and hands its batches over, each under
    /// `catch_unwind`; returns the first panic.
    fn deliver_held(&mut self) -> Option<Box<dyn std::any::Any + Send>> {
        if !std::mem::take(&mut self.open) {
            return None;
        }
        let batches = HELD.try_with(|held| held.borrow_mut().pop().unwrap_or_default());
        debug_assert!(batches.is_ok(), "thread locals outlive a call");
        let batches = batches.unwrap_or_default();
        let mut first_panic = None;
        for (listener, rows) in batches {
            if let Err(panic) = catch_unwind(AssertUnwindSafe(|| listener(&rows))) {
                first_panic.get_or_insert(panic);
            }
        }
        first_panic
    }
}

impl Drop for HeldDeliveries {
    /// Only reached open when the call unwinds: the held batches are
    /// delivered, and a listener's panic dropped (the call's own panic is
    /// already on its way).
    fn drop(&mut self) {
        debug_assert!(
            !self.open || std::thread::panicking(),
            "a call that returns finishes its frame"
        );
        let _ = self.deliver_held();
    }
}

/// Hands `rows` to `listener`, or holds them if this thread's call holds
/// its deliveries.
pub(crate) fn deliver(listener: &ShardListener, rows: EvictedRows) {
    let mut rows = Some(rows);
    let _ = HELD.try_with(|held| {
        if let Some(batches) = held.borrow_mut().last_mut() {
            batches.extend(rows.take().map(|rows| (listener.clone(), rows)));
        }
    });
    if let Some(rows) = rows {
        listener(&rows);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    fn recorder(log: &Arc<Mutex<Vec<u64>>>, panics_on: Option<u64>) -> ShardListener {
        let log = Arc::clone(log);
        Arc::new(move |rows: &EvictedRows| {
            log.lock().unwrap().extend(&rows.keys);
            if rows.keys.first().copied() == panics_on {
                panic!("listener panics on {panics_on:?}");
            }
        })
    }

    fn rows(key: u64) -> EvictedRows {
        EvictedRows {
            keys: vec![key],
            ..EvictedRows::default()
        }
    }

    #[test]
    fn held_batches_arrive_in_order_when_the_call_ends() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let listener = recorder(&log, None);
        let held = HeldDeliveries::begin();
        deliver(&listener, rows(1));
        deliver(&listener, rows(2));
        assert!(log.lock().unwrap().is_empty(), "held");
        held.finish();
        assert_eq!(*log.lock().unwrap(), [1, 2]);
        deliver(&listener, rows(3));
        assert_eq!(*log.lock().unwrap(), [1, 2, 3], "not held outside a call");
    }

    #[test]
    fn a_panicking_listener_still_gets_every_batch_once_then_panics() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let listener = recorder(&log, Some(1));
        let result = catch_unwind(AssertUnwindSafe(|| {
            let held = HeldDeliveries::begin();
            deliver(&listener, rows(1));
            deliver(&listener, rows(2));
            held.finish();
        }));
        assert!(result.is_err(), "the listener's panic reaches the caller");
        assert_eq!(*log.lock().unwrap(), [1, 2]);
        HELD.with(|held| assert!(held.borrow().is_empty(), "the frame is gone"));
    }

    #[test]
    fn an_unwinding_call_still_delivers() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let listener = recorder(&log, Some(2));
        let result = catch_unwind(AssertUnwindSafe(|| {
            let _held = HeldDeliveries::begin();
            deliver(&listener, rows(1));
            deliver(&listener, rows(2));
            deliver(&listener, rows(3));
            panic!("the call's own panic");
        }));
        let panic = result.unwrap_err();
        assert_eq!(panic.downcast_ref::<&str>(), Some(&"the call's own panic"));
        assert_eq!(*log.lock().unwrap(), [1, 2, 3]);
    }

    #[test]
    fn nested_calls_hold_their_own() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let listener = recorder(&log, None);
        let outer = HeldDeliveries::begin();
        deliver(&listener, rows(1));
        let inner = HeldDeliveries::begin();
        deliver(&listener, rows(2));
        inner.finish();
        assert_eq!(*log.lock().unwrap(), [2], "the inner call delivered");
        outer.finish();
        assert_eq!(*log.lock().unwrap(), [2, 1]);
    }

    /// A call made while another unwinds (from a listener its frame runs)
    /// still resumes its own listener's panic.
    #[test]
    fn a_call_made_during_unwinding_keeps_its_listeners_panic() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let inner_listener = recorder(&log, Some(7));
        let inner_result = Arc::new(Mutex::new(None));
        let outer_listener: ShardListener = {
            let (inner_listener, inner_result) =
                (inner_listener.clone(), Arc::clone(&inner_result));
            Arc::new(move |_: &EvictedRows| {
                let result = catch_unwind(AssertUnwindSafe(|| {
                    let held = HeldDeliveries::begin();
                    deliver(&inner_listener, rows(7));
                    held.finish();
                }));
                *inner_result.lock().unwrap() = Some(result.is_err());
            })
        };
        let _ = catch_unwind(AssertUnwindSafe(|| {
            let _held = HeldDeliveries::begin();
            deliver(&outer_listener, rows(1));
            panic!("the outer call's own panic");
        }));
        assert_eq!(*log.lock().unwrap(), [7]);
        assert_eq!(
            *inner_result.lock().unwrap(),
            Some(true),
            "the inner call panicked with its listener"
        );
    }
}
