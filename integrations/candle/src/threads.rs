//! The threads the embedding path's large calls are split over: candle's
//! own CPU threads.
//!
//! candle-core 0.11 runs its CPU kernels (element-wise ops, reductions,
//! copies) on a pool of its own, [`barrier_pool`]: `CANDLE_NUM_THREADS`
//! (else `RAYON_NUM_THREADS`, else the cores) minus one workers and the
//! calling thread. After each op its workers spin for a while before they
//! sleep, waiting for the next one. Work handed to a second pool (rayon's
//! global pool, which this crate used before) then fights those spinning
//! workers for the same cores: on the 2-core development VM the split
//! store calls and the gather's backward ran slower than on one thread
//! while a candle worker spun beside them. So every split in this crate
//! ([`crate::parallel`], [`crate::gather`]) runs on candle's pool, whose
//! workers are the ones waiting, and no other threads are started.
//!
//! [`run`] hands out the parts dynamically (a thread that finishes takes
//! the next part), so any number of parts runs on any number of threads,
//! with results in part order: the split is decided by [`count`] and the
//! batch, never by which thread runs a part. A call from inside one of
//! candle's workers, or from inside a part of another [`run`], runs its
//! parts on its own thread, in order.
//!
//! One rule for the parts: they must not run candle CPU ops. The caller's
//! thread holds candle's pool while the parts run, so a candle op in a
//! part on that thread would wait for the pool forever. The parts here
//! are store calls ([`dynemb::EmbeddingStore`]) and plain loops; a store
//! whose methods run candle ops must not be used with large batches
//! (at least two chunks of [`crate::parallel::MIN_KEYS_PER_CHUNK`] keys).
//!
//! [`barrier_pool`]: candle_core::utils::barrier_pool

use std::cell::Cell;
use std::sync::Mutex;

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
pub fn count() -> usize {
    barrier_pool().n_workers() + 1
}

/// `task(part)` for every part in `0..parts`, run on candle's CPU threads
/// (the caller's among them); the results in part order.
pub fn run<T: Send>(parts: usize, task: impl Fn(usize) -> T + Sync) -> Vec<T> {
    if parts <= 1 || IN_PART.get() {
        return (0..parts).map(task).collect();
    }
    let results: Vec<Mutex<Option<T>>> = (0..parts).map(|_| Mutex::new(None)).collect();
    barrier_pool().execute_chunked(parts, |range| {
        let _in_part = InPart::enter();
        for part in range {
            let result = task(part);
            *results[part].lock().unwrap_or_else(|e| e.into_inner()) = Some(result);
        }
    });
    results
        .into_iter()
        .map(|slot| {
            slot.into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .expect("execute_chunked runs every part before it returns")
        })
        .collect()
}

/// `task(part, chunk)` for the consecutive chunks of `values` of
/// `chunk_len` values each (the last one shorter), split as [`run`]
/// splits; the results in chunk order.
pub fn run_chunks_mut<V: Send, T: Send>(
    values: &mut [V],
    chunk_len: usize,
    task: impl Fn(usize, &mut [V]) -> T + Sync,
) -> Vec<T> {
    let chunks: Vec<Mutex<&mut [V]>> = values
        .chunks_mut(chunk_len.max(1))
        .map(Mutex::new)
        .collect();
    run(chunks.len(), |part| {
        let mut chunk = chunks[part].lock().unwrap_or_else(|e| e.into_inner());
        task(part, &mut chunk)
    })
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
