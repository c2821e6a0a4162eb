//! The bounded-table peer: `moka::sync::Cache<u64, Arc<[f32]>>`, the cache
//! its documentation describes for concurrent use: `max_capacity` counted
//! in entries (no weigher), its default policy (TinyLFU admission, LRU
//! eviction), `Arc` values so that `get`'s clone is a reference count, and
//! ahash with the other peers' seeds.

use super::{batches_of, BoundedShape, StreamRun};
use crate::harness::CpuClock;
use crate::peers::{hasher, row_mut};
use crate::suite::CONSTANT;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// The cache of `capacity` rows.
type Cache = moka::sync::Cache<u64, Arc<[f32]>, ahash::RandomState>;

/// One run of the stream on a fresh cache: per id `get` (the row copied
/// out), and on a miss the initializer's row, `insert`ed.
pub fn run(ids: &[u64], s: &BoundedShape) -> StreamRun {
    let cache: Cache = moka::sync::Cache::builder()
        .max_capacity(s.capacity as u64)
        .build_with_hasher(hasher());
    let threads = s.threads.max(1);
    let hits = AtomicU64::new(0);
    let dim = s.dim;
    let mut outs: Vec<Vec<f32>> = (0..threads).map(|_| vec![1.0; s.batch * dim]).collect();
    let (clock, start) = (CpuClock::now(), Instant::now());
    std::thread::scope(|scope| {
        for (t, out) in outs.iter_mut().enumerate() {
            let (cache, hits) = (&cache, &hits);
            scope.spawn(move || {
                let mut mine = 0u64;
                for keys in batches_of(ids, s.batch, t, threads) {
                    for (i, &key) in keys.iter().enumerate() {
                        let dst = row_mut(out, dim, i);
                        match cache.get(&key) {
                            Some(row) => {
                                dst.copy_from_slice(&row);
                                mine += 1;
                            }
                            None => {
                                CONSTANT.fill(key, dst);
                                cache.insert(key, Arc::from(&*dst));
                            }
                        }
                    }
                }
                std::hint::black_box(&out);
                hits.fetch_add(mine, Ordering::Relaxed);
            });
        }
    });
    let seconds = start.elapsed().as_secs_f64();
    let others = clock.zip(CpuClock::now()).map(|(a, b)| b.others_since(&a));
    cache.run_pending_tasks();
    StreamRun {
        seconds,
        hits: Some(hits.into_inner()),
        inserts: None,
        evicted: None,
        size: cache.entry_count(),
        others_cpu_seconds: others,
    }
}
