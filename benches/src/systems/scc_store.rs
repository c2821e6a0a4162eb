//! `scc::HashMap<u64, Box<[f32]>>` (scc 3), per key, through its
//! synchronous API: `read_sync` to copy out, `update_sync` to overwrite or
//! add in place, `entry_sync` for insert-or-overwrite, `insert_sync`,
//! `remove_sync`, `iter_sync` to export. ahash.

use super::{hasher, row, row_mut, Chunker, Spec, Store, System};
use crate::workload::Batch;
use dynemb::raw::kernels::axpy;
use dynemb::Initializer;

/// An scc map of boxed rows.
pub struct SccStore {
    map: scc::HashMap<u64, Box<[f32]>, ahash::RandomState>,
    dim: usize,
    init: Initializer,
}

impl SccStore {
    /// An empty map for `spec`.
    pub fn new(spec: &Spec) -> Self {
        SccStore {
            map: scc::HashMap::with_hasher(hasher()),
            dim: spec.dim,
            init: spec.initializer.clone(),
        }
    }
}

impl Store for SccStore {
    fn system(&self) -> System {
        System::Scc
    }

    fn insert(&self, batch: Batch<'_>, values: &[f32]) {
        for (i, &key) in batch.keys.iter().enumerate() {
            // The keys are new; a present key would keep its row.
            let _ = self.map.insert_sync(key, row(values, self.dim, i).into());
        }
    }

    fn lookup(&self, batch: Batch<'_>, out: &mut [f32]) {
        for (i, &key) in batch.keys.iter().enumerate() {
            let dst = row_mut(out, self.dim, i);
            if self
                .map
                .read_sync(&key, |_, r| dst.copy_from_slice(r))
                .is_none()
            {
                self.init.fill(key, dst);
            }
        }
    }

    fn upsert(&self, batch: Batch<'_>, values: &[f32]) {
        for (i, &key) in batch.keys.iter().enumerate() {
            let src = row(values, self.dim, i);
            self.map
                .entry_sync(key)
                .and_modify(|r| r.copy_from_slice(src))
                .or_insert_with(|| src.into());
        }
    }

    fn accum(&self, batch: Batch<'_>, deltas: &[f32]) {
        for (i, &key) in batch.keys.iter().enumerate() {
            let delta = row(deltas, self.dim, i);
            self.map.update_sync(&key, |_, r| axpy(r, 1.0, delta));
        }
    }

    fn remove(&self, batch: Batch<'_>) {
        for key in batch.keys {
            self.map.remove_sync(key);
        }
    }

    fn export(&self, chunk_rows: usize, sink: &mut dyn FnMut(&[u64], &[f32])) -> usize {
        let mut chunks = Chunker::new(self.dim, chunk_rows, sink);
        self.map.iter_sync(|&key, r| {
            chunks.push(key, r);
            true
        });
        chunks.finish()
    }

    fn len(&self) -> usize {
        self.map.len()
    }
}
