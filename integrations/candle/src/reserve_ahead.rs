//! Room for the next batch's new keys, made while the model computes.
//!
//! After a training read, a layer asks its store to make room for as many
//! new keys as the batch had distinct keys ([`EmbeddingStore::reserve`]):
//! for a [`dynemb::Variable`], the index grows now if the next batch could
//! make it grow, and the fresh rows the next batch's new keys will take are
//! backed with memory now. The request runs on a thread of its own, so that
//! this work (the kernel zeroing fresh pages, the index migration) happens
//! while the rest of the model's step runs, rather than inside the next
//! training read. On a small machine candle's matrix products leave a core
//! idle much of the step, which is where it goes; on a busy one it costs
//! what the inserts would have spent anyway.
//!
//! Invariants: a request never changes what the store holds (`reserve` is a
//! hint, and the store serves reads and writes meanwhile); at most one
//! request per layer runs at once (one made while the previous still runs
//! is dropped: that one is still making room); stores that are not
//! [`cpu_bound`](EmbeddingStore::cpu_bound) get no request (a remote store
//! grows on its servers).

use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use dynemb::EmbeddingStore;

/// A layer's background `reserve` requests; see the [module docs](self).
#[derive(Default)]
pub(crate) struct ReserveAhead {
    running: Mutex<Option<JoinHandle<()>>>,
}

impl ReserveAhead {
    /// Asks `store` to make room for `additional` more keys on a thread of
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
        // A thread that cannot be started only means no room is made ahead.
        *running = std::thread::Builder::new()
            .name("dynemb-reserve".into())
            .spawn(move || {
                run_when_idle();
                store.reserve(additional);
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

/// Gives the calling thread Linux's `SCHED_IDLE` policy: it then runs only
/// on a core nothing else wants, so the room it makes costs the training
/// threads no time. Where that cannot be set, it runs as an ordinary
/// thread.
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

    /// A `Variable` whose `reserve` reports each call and then waits until
    /// the test lets it finish.
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
        fn reserve(&self, additional: usize) {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let _ = self.entered.lock().unwrap().send(additional);
            let _ = self.release.lock().unwrap().recv();
            self.inner.reserve(additional);
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

    /// A gated store, the channel its `reserve` calls report on, and the
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
    fn a_training_read_asks_for_room_for_its_keys_one_request_at_a_time() {
        let (store, calls, release) = gated(true);
        let recorder = Recorder::new(Arc::clone(&store));
        let device = Device::Cpu;
        let rows = recorder.read(&[4, 5, 6], &device).unwrap();
        assert_eq!(rows.dims(), [3, 2]);
        assert_eq!(calls.recv_timeout(WAIT), Ok(3), "room for the batch's keys");
        // While that request runs, further reads make none.
        recorder.read(&[7], &device).unwrap();
        recorder.read(&[8, 9], &device).unwrap();
        release.send(()).unwrap();
        assert!(recorder.reserve_ahead.finish());
        assert_eq!(store.calls.load(Ordering::SeqCst), 1);
        // Once it has finished, the next read makes one again.
        recorder.read(&[10, 11, 12, 13], &device).unwrap();
        assert_eq!(calls.recv_timeout(WAIT), Ok(4));
        release.send(()).unwrap();
        assert!(recorder.reserve_ahead.finish());
        assert_eq!(store.inner.size(), 10, "reserve inserts nothing");
    }

    #[test]
    fn no_request_for_an_empty_batch_or_a_store_that_is_not_cpu_bound() {
        let (remote, _calls, _release) = gated(false);
        let recorder = Recorder::new(Arc::clone(&remote));
        recorder.read(&[1, 2], &Device::Cpu).unwrap();
        let (local, _calls, _release) = gated(true);
        let reserve_ahead = ReserveAhead::default();
        reserve_ahead.request(&local, 0);
        assert!(!recorder.reserve_ahead.finish());
        assert!(!reserve_ahead.finish());
        assert_eq!(remote.calls.load(Ordering::SeqCst), 0);
        assert_eq!(local.calls.load(Ordering::SeqCst), 0);
    }
}
