//! The threads the embedding path's large calls are split over: candle's
//! own CPU threads, and no others. Results come in part order and never
//! depend on which thread ran a part.
//!
//! candle-core 0.11 runs its CPU kernels (element-wise ops, reductions,
//! copies) on a pool of its own, [`barrier_pool`]: `CANDLE_NUM_THREADS`
//! (else `RAYON_NUM_THREADS`, else the physical cores or
//! `CANDLE_CPU_MASK`'s) minus one workers and the calling thread. After
//! each op its workers spin for a while before they sleep, so every split
//! in this crate ([`crate::parallel`], [`crate::gather`]) runs on that
//! pool: work on a second pool would fight the spinning workers for the
//! same cores.
//!
//! [`run`] hands out the parts dynamically (a thread that finishes takes
//! the next part), so any number of parts runs on any number of threads;
//! the split is decided by [`count`] and the batch. A call from inside one of
//! candle's workers, or from inside a part of another [`run`], runs its
//! parts on its own thread, in order.
//!
//! One rule for the parts: they must not run candle CPU ops, nor wait on
//! a thread that does. The caller's thread holds candle's pool (a lock
//! every candle op of 64K values or more takes) while the parts run, so
//! such an op would wait for the pool forever; and every other thread's
//! large candle ops wait while parts run. The parts here are CPU-bound
//! store calls (stores whose [`dynemb::EmbeddingStore::cpu_bound`] is
//! true: a remote store is never split) and plain loops. A store whose
//! methods run candle ops must say `cpu_bound() == false`. With one
//! thread (`CANDLE_NUM_THREADS=1`) candle takes no lock and parts run in
//! turn on the caller's thread.
//!
//! [`barrier_pool`]: candle_core::utils::barrier_pool

use std::any::Any;
use std::cell::Cell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::{Mutex, MutexGuard, PoisonError};

use candle_core::utils::barrier_pool;

thread_local! {
    /// Whether this thread is running a part of a [`run`].
    static IN_PART: Cell<bool> = const { Cell::new(false) };
}

/// Marks this thread as running parts until dropped (also when a part
/// panics), restoring the mark it had.
struct InPart {
    outer: bool,
}

impl InPart {
    fn enter() -> InPart {
        InPart {
            outer: IN_PART.replace(true),
        }
    }
}

impl Drop for InPart {
    fn drop(&mut self) {
        IN_PART.set(self.outer);
    }
}

/// How many threads run a split call: candle's CPU workers and the caller.
pub(crate) fn count() -> usize {
    barrier_pool().n_workers() + 1
}

/// `task(part)` for every part in `0..parts`, run on candle's CPU threads
/// (the caller's among them); the results in part order. A part that
/// panics stops the parts not yet started, and the panic goes on in the
/// caller once candle's pool is released (candle's pool holds a lock
/// while parts run, which a panic inside would poison for every later
/// candle op).
pub(crate) fn run<T: Send>(parts: usize, task: impl Fn(usize) -> T + Sync) -> Vec<T> {
    if parts <= 1 || IN_PART.get() {
        return (0..parts).map(task).collect();
    }
    let results: Vec<Mutex<Option<T>>> = (0..parts).map(|_| Mutex::new(None)).collect();
    let panicked: Mutex<Option<Box<dyn Any + Send>>> = Mutex::new(None);
    barrier_pool().execute_chunked(parts, |range| {
        let _in_part = InPart::enter();
        for part in range {
            if lock(&panicked).is_some() {
                return;
            }
            match catch_unwind(AssertUnwindSafe(|| task(part))) {
                Ok(result) => *lock(&results[part]) = Some(result),
                Err(payload) => {
                    lock(&panicked).get_or_insert(payload);
                    return;
                }
            }
        }
    });
    if let Some(payload) = lock(&panicked).take() {
        resume_unwind(payload);
    }
    results
        .into_iter()
        .map(|slot| {
            slot.into_inner()
                .unwrap_or_else(PoisonError::into_inner)
                .expect("execute_chunked runs every part before it returns")
        })
        .collect()
}

/// The mutex's value, also after a panic elsewhere (the values here are
/// written whole, so a poisoned one is still consistent).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `task(part, chunk)` for the consecutive chunks of `values` of
/// `chunk_len` values each (the last one shorter), split as [`run`]
/// splits; the results in chunk order.
pub(crate) fn run_chunks_mut<V: Send, T: Send>(
    values: &mut [V],
    chunk_len: usize,
    task: impl Fn(usize, &mut [V]) -> T + Sync,
) -> Vec<T> {
    run_each(values.chunks_mut(chunk_len.max(1)).collect(), task)
}

/// `task(part, values)` for each of the disjoint `parts`, split as
/// [`run`] splits; the results in part order.
pub(crate) fn run_each<V: Send, T: Send>(
    parts: Vec<&mut [V]>,
    task: impl Fn(usize, &mut [V]) -> T + Sync,
) -> Vec<T> {
    let parts: Vec<Mutex<&mut [V]>> = parts.into_iter().map(Mutex::new).collect();
    run(parts.len(), |part| task(part, &mut lock(&parts[part])))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_part_runs_once_in_order() {
        assert!(count() >= 1);
        for parts in [0, 1, 2, 3, 17] {
            assert_eq!(
                run(parts, |p| p * 10),
                (0..parts).map(|p| p * 10).collect::<Vec<_>>()
            );
        }
    }

    #[test]
    fn a_panicking_part_panics_the_caller_and_leaves_candle_working() {
        let panicked = catch_unwind(|| run(16, |p| if p == 3 { panic!("part 3") } else { p }));
        assert!(panicked.is_err());
        // candle's pool (a large element-wise op splits over it) and this
        // module's runs still work.
        let ones =
            candle_core::Tensor::ones(200_000, candle_core::DType::F32, &candle_core::Device::Cpu)
                .unwrap();
        let twos = (&ones + &ones)
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert_eq!(twos, 400_000.0);
        assert_eq!(run(16, |p| p).len(), 16);
        assert!(!IN_PART.get());
    }

    #[test]
    fn runs_nest() {
        let sums = run(3, |outer| {
            run(4, |inner| outer * 10 + inner).iter().sum::<usize>()
        });
        assert_eq!(sums, [6, 46, 86]);
    }

    #[test]
    fn chunks_are_disjoint_and_cover_the_values() {
        let mut values = vec![0_usize; 103];
        let lens = run_chunks_mut(&mut values, 10, |part, chunk| {
            chunk.iter_mut().for_each(|v| *v += part + 1);
            chunk.len()
        });
        assert_eq!(lens, [10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 3]);
        for (i, v) in values.iter().enumerate() {
            assert_eq!(*v, i / 10 + 1);
        }
    }
}
