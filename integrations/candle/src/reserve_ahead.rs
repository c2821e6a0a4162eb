//! Memory for the next batch's new rows, backed while the model computes.
//! A request never changes what the store holds; at most one request per
//! layer runs at once (one made while the previous still runs is dropped),
//! and stores that are not [`cpu_bound`](EmbeddingStore::cpu_bound) get
//! none.
//!
//! After a training read, a layer asks its store to back the rows of as
//! many new keys as the batch had distinct keys with memory
//! ([`EmbeddingStore::reserve_rows`]; for a [`dynemb::Variable`], on Linux,
//! the fresh rows beyond those it holds unused, with their slot rows). The
//! request runs on a thread of its own at Linux's `SCHED_IDLE` priority, so
//! that the kernel zeroes those pages on a core the model's step leaves
//! idle rather than under the next batch's row locks. Where no core is
//! idle (or off Linux, where the thread runs at normal priority) the pages
//! cost what the inserts would have spent on them, at a different time. It
//! backs at most one batch's distinct rows ahead of the table's newest row,
//! whether or not their keys turn out new.
//!
//! Only `reserve_rows` runs at that priority, since no other thread waits
//! on it for long; a variable's index growth stays with the inserts
//! (writers meeting a migration wait for the thread that claimed its
//! chunks). A running request holds a clone of the store's `Arc` until it
//! ends. Layers turn this off with `reserve_rows_ahead: false` in their
//! config.

use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use dynemb::EmbeddingStore;

/// A layer's background `reserve_rows` requests; see the
/// [module docs](self).
#[derive(Default)]
pub(crate) struct ReserveAhead {
    running: Mutex<Option<JoinHandle<()>>>,
}

impl ReserveAhead {
    /// Asks `store` to back the rows of `additional` new keys on a thread of
    /// its own, unless a previous request still runs.
    pub(crate) fn request<S: EmbeddingStore + 'static>(&self, store: &Arc<S>, additional: usize) {
        if additional == 0 || !store.cpu_bound() {
            return;
        }
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        if running.as_ref().is_some_and(|thread| !thread.is_finished()) {
            return;
        }
        let store = Arc::clone(store);
        // A thread that cannot be started only means no rows are backed ahead.
        *running = std::thread::Builder::new()
            .name("dynemb-reserve".into())
            .spawn(move || {
                run_when_idle();
                store.reserve_rows(additional);
            })
            .ok();
    }

    /// Waits for the running request, if any; whether there was one.
    #[cfg(test)]
    pub(crate) fn finish(&self) -> bool {
        let running = self
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        running.map(JoinHandle::join).is_some()
    }
}

/// Gives the calling thread Linux's `SCHED_IDLE` policy: it then runs on a
/// core only when nothing else wants it. Where that cannot be set, it runs
/// as an ordinary thread.
fn run_when_idle() {
    #[cfg(target_os = "linux")]
    {
        use thread_priority::{
            set_thread_priority_and_policy, thread_native_id, NormalThreadSchedulePolicy,
            ThreadPriority, ThreadSchedulePolicy,
        };
        let _ = set_thread_priority_and_policy(
            thread_native_id(),
            ThreadPriority::Min,
            ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Idle),
        );
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc::{channel, Receiver, Sender};
    use std::time::Duration;

    use candle_core::Device;
    use dynemb::{SlotId, Variable};

    use super::*;
    use crate::record::Recorder;

    /// A `Variable` whose `reserve_rows` reports each call and then waits
    /// until the test lets it finish.
    struct Gated {
        inner: Variable<i64>,
        cpu_bound: bool,
        calls: AtomicUsize,
        entered: Mutex<Sender<usize>>,
        release: Mutex<Receiver<()>>,
    }

    impl EmbeddingStore for Gated {
        type Key = i64;

        fn name(&self) -> &str {
            self.inner.name()
        }
        fn store_id(&self) -> u64 {
            self.inner.store_id()
        }
        fn dim(&self) -> usize {
            self.inner.dim()
        }
        fn trainable(&self) -> bool {
            self.inner.trainable()
        }
        fn cpu_bound(&self) -> bool {
            self.cpu_bound
        }
        fn reserve_rows(&self, additional: usize) {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let _ = self.entered.lock().unwrap().send(additional);
            let _ = self.release.lock().unwrap().recv();
            self.inner.reserve_rows(additional);
        }
        fn lookup(&self, keys: &[i64], out: &mut [f32]) -> dynemb::Result<()> {
            self.inner.lookup(keys, out)
        }
        fn lookup_or_insert(&self, keys: &[i64], out: &mut [f32]) -> dynemb::Result<()> {
            self.inner.lookup_or_insert(keys, out)
        }
        fn create_slot(&self, name: &str, initial: f32) -> dynemb::Result<SlotId> {
            self.inner.create_slot(name, initial)
        }
        fn slot_id(&self, name: &str) -> dynemb::Result<SlotId> {
            self.inner.slot_id(name)
        }
        fn slot_initial(&self, slot: SlotId) -> dynemb::Result<f32> {
            self.inner.slot_initial(slot)
        }
        fn lookup_slot(&self, slot: SlotId, keys: &[i64], out: &mut [f32]) -> dynemb::Result<()> {
            self.inner.lookup_slot(slot, keys, out)
        }
        fn update_rows<F>(&self, keys: &[i64], slots: &[SlotId], update: F) -> dynemb::Result<()>
        where
            F: FnMut(usize, &mut [f32], &mut [f32]),
        {
            self.inner.update_rows(keys, slots, update)
        }
    }

    /// A gated store, the channel its `reserve_rows` calls report on, and the
    /// sender that lets each call finish.
    fn gated(cpu_bound: bool) -> (Arc<Gated>, Receiver<usize>, Sender<()>) {
        let (entered, calls) = channel();
        let (release, gate) = channel();
        let store = Gated {
            inner: Variable::builder("gated").dim(2).build().unwrap(),
            cpu_bound,
            calls: AtomicUsize::new(0),
            entered: Mutex::new(entered),
            release: Mutex::new(gate),
        };
        (Arc::new(store), calls, release)
    }

    const WAIT: Duration = Duration::from_secs(60);

    #[test]
    fn a_training_read_asks_for_its_keys_rows_one_request_at_a_time() {
        let (store, calls, release) = gated(true);
        let recorder = Recorder::new(Arc::clone(&store));
        let device = Device::Cpu;
        let rows = recorder.read(&[4, 5, 6], &device).unwrap();
        assert_eq!(rows.as_tensor().dims(), [3, 2]);
        assert_eq!(calls.recv_timeout(WAIT), Ok(3), "rows for the batch's keys");
        // While that request runs, further reads make none.
        recorder.read(&[7], &device).unwrap();
        recorder.read(&[8, 9], &device).unwrap();
        release.send(()).unwrap();
        assert!(recorder.reserve_ahead.as_ref().unwrap().finish());
        assert_eq!(store.calls.load(Ordering::SeqCst), 1);
        // Once it has finished, the next read makes one again.
        recorder.read(&[10, 11, 12, 13], &device).unwrap();
        assert_eq!(calls.recv_timeout(WAIT), Ok(4));
        release.send(()).unwrap();
        assert!(recorder.reserve_ahead.as_ref().unwrap().finish());
        assert_eq!(store.inner.size(), 10, "reserve_rows inserts nothing");
    }

    #[test]
    fn no_request_for_an_empty_batch_a_remote_store_or_when_turned_off() {
        let (remote, _calls, _release) = gated(false);
        let recorder = Recorder::new(Arc::clone(&remote));
        recorder.read(&[1, 2], &Device::Cpu).unwrap();
        assert!(!recorder.reserve_ahead.as_ref().unwrap().finish());
        assert_eq!(remote.calls.load(Ordering::SeqCst), 0);

        let (local, _calls, _release) = gated(true);
        let reserve_ahead = ReserveAhead::default();
        reserve_ahead.request(&local, 0);
        assert!(!reserve_ahead.finish());
        let off = Recorder::new(Arc::clone(&local)).reserve_rows_ahead(false);
        off.read(&[1, 2], &Device::Cpu).unwrap();
        assert!(off.reserve_ahead.is_none());
        assert_eq!(local.calls.load(Ordering::SeqCst), 0);
        assert_eq!(local.inner.size(), 2);
    }
}
