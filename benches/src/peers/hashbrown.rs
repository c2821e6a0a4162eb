//! `hashbrown::HashMap<u64, Box<[f32]>>` behind one `std::sync::RwLock`:
//! the read lock once per lookup batch, the write lock once per write
//! batch (the usual way to share a single-threaded map). ahash.

use super::{hasher, row, row_mut, Chunker, Spec, Store, System};
use crate::workload::Batch;
use dynemb::raw::kernels::axpy;
use dynemb::Initializer;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

type Map = hashbrown::HashMap<u64, Box<[f32]>, ahash::RandomState>;

/// A hashbrown map of boxed rows behind a reader-writer lock.
pub struct HashbrownPeer {
    map: RwLock<Map>,
    dim: usize,
    init: Initializer,
}

impl HashbrownPeer {
    /// An empty map for `spec`.
    pub fn new(spec: &Spec) -> Self {
        HashbrownPeer {
            map: RwLock::new(Map::with_hasher(hasher())),
            dim: spec.dim,
            init: spec.initializer.clone(),
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, Map> {
        self.map.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, Map> {
        self.map.write().unwrap_or_else(|e| e.into_inner())
    }
}

impl Store for HashbrownPeer {
    fn system(&self) -> System {
        System::HashbrownRwLock
    }

    fn insert(&self, batch: Batch<'_>, values: &[f32]) {
        let mut map = self.write();
        for (i, &key) in batch.keys.iter().enumerate() {
            map.insert(key, row(values, self.dim, i).into());
        }
    }

    fn lookup(&self, batch: Batch<'_>, out: &mut [f32]) {
        let map = self.read();
        for (i, &key) in batch.keys.iter().enumerate() {
            let dst = row_mut(out, self.dim, i);
            match map.get(&key) {
                Some(r) => dst.copy_from_slice(r),
                None => self.init.fill(key, dst),
            }
        }
    }

    fn upsert(&self, batch: Batch<'_>, values: &[f32]) {
        let mut map = self.write();
        for (i, &key) in batch.keys.iter().enumerate() {
            let src = row(values, self.dim, i);
            map.entry(key)
                .and_modify(|r| r.copy_from_slice(src))
                .or_insert_with(|| src.into());
        }
    }

    fn accum(&self, batch: Batch<'_>, deltas: &[f32]) {
        let mut map = self.write();
        for (i, &key) in batch.keys.iter().enumerate() {
            if let Some(r) = map.get_mut(&key) {
                axpy(r, 1.0, row(deltas, self.dim, i));
            }
        }
    }

    fn remove(&self, batch: Batch<'_>) {
        let mut map = self.write();
        for key in batch.keys {
            map.remove(key);
        }
    }

    fn export(&self, chunk_rows: usize, sink: &mut dyn FnMut(&[u64], &[f32])) -> usize {
        let mut chunks = Chunker::new(self.dim, chunk_rows, sink);
        for (&key, r) in self.read().iter() {
            chunks.push(key, r);
        }
        chunks.finish()
    }

    fn len(&self) -> usize {
        self.read().len()
    }
}
