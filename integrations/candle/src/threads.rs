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
//! candle's workers runs its parts on that thread, in order.
//!
//! [`barrier_pool`]: candle_core::utils::barrier_pool

use std::sync::Mutex;

use candle_core::utils::barrier_pool;

/// How many threads run a split call: candle's CPU workers and the caller.
pub fn count() -> usize {
    barrier_pool().n_workers() + 1
}

/// `task(part)` for every part in `0..parts`, run on candle's CPU threads
/// (the caller's among them); the results in part order.
pub fn run<T: Send>(parts: usize, task: impl Fn(usize) -> T + Sync) -> Vec<T> {
    if parts <= 1 {
        return (0..parts).map(task).collect();
    }
    let results: Vec<Mutex<Option<T>>> = (0..parts).map(|_| Mutex::new(None)).collect();
    barrier_pool().execute_chunked(parts, |range| {
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
