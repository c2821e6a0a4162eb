//! `papaya::HashMap<u64, Box<[f32]>>`, per key, one `pin()` per batch (its
//! documentation recommends reusing a guard across operations).
//!
//! papaya's values are immutable once published (readers hold plain `&V`
//! without locks): that is its model. So an overwrite is an `insert` of a
//! new box and `row += delta` is an `update` that builds a new box from the
//! old one; the old boxes are reclaimed by papaya's collector. Default
//! resize mode (incremental); ahash.

use super::{hasher, row, row_mut, Chunker, Spec, Store, System};
use crate::workload::Batch;
use dynemb::raw::kernels::axpy;
use dynemb::Initializer;

/// A papaya map of boxed rows.
pub struct PapayaStore {
    map: papaya::HashMap<u64, Box<[f32]>, ahash::RandomState>,
    dim: usize,
    init: Initializer,
}

impl PapayaStore {
    /// An empty map for `spec`.
    pub fn new(spec: &Spec) -> Self {
        PapayaStore {
            map: papaya::HashMap::with_hasher(hasher()),
            dim: spec.dim,
            init: spec.initializer.clone(),
        }
    }
}

impl Store for PapayaStore {
    fn system(&self) -> System {
        System::Papaya
    }

    fn insert(&self, batch: Batch<'_>, values: &[f32]) {
        let map = self.map.pin();
        for (i, &key) in batch.keys.iter().enumerate() {
            map.insert(key, row(values, self.dim, i).into());
        }
    }

    fn lookup(&self, batch: Batch<'_>, out: &mut [f32]) {
        let map = self.map.pin();
        for (i, &key) in batch.keys.iter().enumerate() {
            let dst = row_mut(out, self.dim, i);
            match map.get(&key) {
                Some(r) => dst.copy_from_slice(r),
                None => self.init.fill(key, dst),
            }
        }
    }

    fn upsert(&self, batch: Batch<'_>, values: &[f32]) {
        let map = self.map.pin();
        for (i, &key) in batch.keys.iter().enumerate() {
            map.insert(key, row(values, self.dim, i).into());
        }
    }

    fn accum(&self, batch: Batch<'_>, deltas: &[f32]) {
        let map = self.map.pin();
        for (i, &key) in batch.keys.iter().enumerate() {
            let delta = row(deltas, self.dim, i);
            map.update(key, |old| {
                let mut new = old.clone();
                axpy(&mut new, 1.0, delta);
                new
            });
        }
    }

    fn remove(&self, batch: Batch<'_>) {
        let map = self.map.pin();
        for key in batch.keys {
            map.remove(key);
        }
    }

    fn export(&self, chunk_rows: usize, sink: &mut dyn FnMut(&[u64], &[f32])) -> usize {
        let mut chunks = Chunker::new(self.dim, chunk_rows, sink);
        for (&key, r) in self.map.pin().iter() {
            chunks.push(key, r);
        }
        chunks.finish()
    }

    fn len(&self) -> usize {
        self.map.len()
    }
}
