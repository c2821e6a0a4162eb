//! When evicted rows reach the listener: after every shard a call writes.
//!
//! A table hands the rows one batch evicted to its listener when the batch
//! ends. A variable call that writes several shards runs one batch per
//! shard, so it holds those deliveries ([`HeldDeliveries`]) until its last
//! shard is written: the listener then sees every row of the call in the
//! table, and a panicking listener cannot keep the call's later shards from
//! being written. The held batches are handed over in the order they were
//! evicted, each exactly once: a listener that panics on one still gets
//! the others, and the first panic is resumed after the last. If the call
//! itself unwinds (a panicking update closure), the held batches are still
//! delivered, and panics of the listener are then dropped, as a table
//! batch that unwinds drops them.
//!
//! Holding is per thread: a listener that writes the variable again starts
//! a call of its own, which holds and delivers its own evictions.

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

/// While alive, the evicted rows the tables of this thread's call hand to
/// their listeners are held; dropping it delivers them (see the module
/// docs).
pub(crate) struct HeldDeliveries {
    /// Bound to the thread whose deliveries it holds.
    _thread: PhantomData<*const ()>,
}

impl HeldDeliveries {
    /// Starts holding this thread's deliveries.
    pub(crate) fn begin() -> Self {
        HELD.with(|held| held.borrow_mut().push(Vec::new()));
        HeldDeliveries {
            _thread: PhantomData,
        }
    }
}

impl Drop for HeldDeliveries {
    fn drop(&mut self) {
        let batches = HELD.with(|held| held.borrow_mut().pop().unwrap_or_default());
        let unwinding = std::thread::panicking();
        let mut first_panic = None;
        for (listener, rows) in batches {
            if let Err(panic) = catch_unwind(AssertUnwindSafe(|| listener(&rows))) {
                first_panic.get_or_insert(panic);
            }
        }
        if let (Some(panic), false) = (first_panic, unwinding) {
            resume_unwind(panic);
        }
    }
}

/// Hands `rows` to `listener`, or holds them if this thread's call holds
/// its deliveries.
pub(crate) fn deliver(listener: &ShardListener, rows: EvictedRows) {
    let rows = HELD.with(|held| match held.borrow_mut().last_mut() {
        Some(batches) => {
            batches.push((listener.clone(), rows));
            None
        }
        None => Some(rows),
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
        {
            let _held = HeldDeliveries::begin();
            deliver(&listener, rows(1));
            deliver(&listener, rows(2));
            assert!(log.lock().unwrap().is_empty(), "held");
        }
        assert_eq!(*log.lock().unwrap(), [1, 2]);
        deliver(&listener, rows(3));
        assert_eq!(*log.lock().unwrap(), [1, 2, 3], "not held outside a call");
    }

    #[test]
    fn a_panicking_listener_still_gets_every_batch_once_then_panics() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let listener = recorder(&log, Some(1));
        let result = catch_unwind(AssertUnwindSafe(|| {
            let _held = HeldDeliveries::begin();
            deliver(&listener, rows(1));
            deliver(&listener, rows(2));
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
        {
            let _outer = HeldDeliveries::begin();
            deliver(&listener, rows(1));
            {
                let _inner = HeldDeliveries::begin();
                deliver(&listener, rows(2));
            }
            assert_eq!(*log.lock().unwrap(), [2], "the inner call delivered");
        }
        assert_eq!(*log.lock().unwrap(), [2, 1]);
    }
}
