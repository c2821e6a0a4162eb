//! `dashmap::DashMap<u64, Box<[f32]>>`, per key, as its documentation
//! shows: `get` and copy out, `get_mut` and overwrite or add in place,
//! `entry` for insert-or-overwrite, `insert`, `remove`, `iter` to export.
//! Default shard count (4 × available parallelism, rounded to a power of
//! two); ahash.

use super::{hasher, row, row_mut, Chunker, Spec, Store, System};
use crate::workload::Batch;
use dashmap::DashMap;
use dynemb::raw::kernels::axpy;
use dynemb::Initializer;

/// A `DashMap` of boxed rows.
pub struct DashMapStore {
    map: DashMap<u64, Box<[f32]>, ahash::RandomState>,
    dim: usize,
    init: Initializer,
}

impl DashMapStore {
    /// An empty map for `spec`.
    pub fn new(spec: &Spec) -> Self {
        DashMapStore {
            map: DashMap::with_hasher(hasher()),
            dim: spec.dim,
            init: spec.initializer.clone(),
        }
    }
}

impl Store for DashMapStore {
    fn system(&self) -> System {
        System::DashMap
    }

    fn insert(&self, batch: Batch<'_>, values: &[f32]) {
        for (i, &key) in batch.keys.iter().enumerate() {
            self.map.insert(key, row(values, self.dim, i).into());
        }
    }

    fn lookup(&self, batch: Batch<'_>, out: &mut [f32]) {
        for (i, &key) in batch.keys.iter().enumerate() {
            let dst = row_mut(out, self.dim, i);
            match self.map.get(&key) {
                Some(r) => dst.copy_from_slice(&r),
                None => self.init.fill(key, dst),
            }
        }
    }

    fn upsert(&self, batch: Batch<'_>, values: &[f32]) {
        for (i, &key) in batch.keys.iter().enumerate() {
            let src = row(values, self.dim, i);
            self.map
                .entry(key)
                .and_modify(|r| r.copy_from_slice(src))
                .or_insert_with(|| src.into());
        }
    }

    fn accum(&self, batch: Batch<'_>, deltas: &[f32]) {
        for (i, &key) in batch.keys.iter().enumerate() {
            if let Some(mut r) = self.map.get_mut(&key) {
                axpy(&mut r, 1.0, row(deltas, self.dim, i));
            }
        }
    }

    fn remove(&self, batch: Batch<'_>) {
        for key in batch.keys {
            self.map.remove(key);
        }
    }

    fn export(&self, chunk_rows: usize, sink: &mut dyn FnMut(&[u64], &[f32])) -> usize {
        let mut chunks = Chunker::new(self.dim, chunk_rows, sink);
        for entry in self.map.iter() {
            chunks.push(*entry.key(), entry.value());
        }
        chunks.finish()
    }

    fn len(&self) -> usize {
        self.map.len()
    }
}
