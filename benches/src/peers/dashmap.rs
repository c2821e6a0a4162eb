//! `dashmap::DashMap<u64, Box<[f32]>>`, per key, as its documentation
//! shows: `get` and copy out, `get_mut` and overwrite or add in place,
//! `entry` for insert-or-overwrite, `insert`, `remove`, `iter` to export.
//! For the optimizer steps a key's box holds its value row and every slot
//! row back to back, and a step runs the kernel in place under `get_mut`
//! (the write lock of the key's shard, held for the one row). Default shard
//! count (4 × available parallelism, rounded to a power of two); ahash.

use super::{hasher, row, row_mut, Chunker, Spec, Store, System};
use crate::apply::{boxed_row, SlotRows};
use crate::workload::Batch;
use ::dashmap::DashMap;
use dynemb::raw::kernels::axpy;
use dynemb::Initializer;

/// A `DashMap` of boxed rows.
pub struct DashMapPeer {
    map: DashMap<u64, Box<[f32]>, ahash::RandomState>,
    dim: usize,
    init: Initializer,
}

impl DashMapPeer {
    /// An empty map for `spec`.
    pub fn new(spec: &Spec) -> Self {
        DashMapPeer {
            map: DashMap::with_hasher(hasher()),
            dim: spec.dim,
            init: spec.initializer.clone(),
        }
    }
}

impl Store for DashMapPeer {
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

impl SlotRows for DashMapPeer {
    const SYSTEM: System = System::DashMap;
    type Id = u64;

    fn with_slots(spec: &Spec, _initials: &[f32]) -> Self {
        DashMapPeer::new(spec)
    }

    fn ids<'a>(batch: Batch<'a>) -> &'a [u64] {
        batch.keys
    }

    fn prefill(&self, batch: Batch<'_>, values: &[f32], initials: &[f32]) {
        for (i, &key) in batch.keys.iter().enumerate() {
            self.map
                .insert(key, boxed_row(row(values, self.dim, i), initials));
        }
    }

    fn update_each(&self, ids: &[u64], mut update: impl FnMut(usize, &mut [f32])) {
        for (i, key) in ids.iter().enumerate() {
            if let Some(mut r) = self.map.get_mut(key) {
                update(i, &mut r);
            }
        }
    }

    fn read(&self, key: u64, _row: u32, out: &mut [f32]) {
        out.copy_from_slice(&self.map.get(&key).expect("a stored key"));
    }
}
