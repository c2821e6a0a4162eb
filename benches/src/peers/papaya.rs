//! `papaya::HashMap<u64, V>`, per key, one `pin()` per batch (its
//! documentation recommends reusing a guard across operations). Default
//! resize mode (incremental); ahash.
//!
//! papaya's values are immutable once published (readers hold plain `&V`
//! without a lock). For the table ops `V` is `Box<[f32]>`: an overwrite is
//! an `insert` of a new box and `row += delta` an `update` that builds a new
//! box from the old one, the old boxes reclaimed by papaya's collector.
//!
//! For the optimizer steps `V` is [`LockedRow`]: a key's value row and
//! every slot row back to back behind the row's own `Mutex`, and a step runs
//! the kernel in place under that lock. papaya's documentation advises
//! fine-grained locking for frequently modified entries, and a step modifies
//! every row it touches; `update` with a new box per step is as correct but
//! allocates and copies the whole row (value and slots) every step, about
//! three times slower.

use super::{hasher, row, row_mut, Chunker, Spec, Store, System};
use crate::apply::{boxed_row, SlotRows};
use crate::workload::Batch;
use dynemb::raw::kernels::axpy;
use dynemb::Initializer;
use std::sync::{Mutex, PoisonError};

/// A row (value and slot rows) behind its own lock.
pub type LockedRow = Mutex<Box<[f32]>>;

/// A papaya map of rows of type `V`.
pub struct Papaya<V> {
    map: papaya::HashMap<u64, V, ahash::RandomState>,
    dim: usize,
    init: Initializer,
}

impl<V> Papaya<V> {
    /// An empty map for `spec`.
    pub fn new(spec: &Spec) -> Self {
        Papaya {
            map: papaya::HashMap::with_hasher(hasher()),
            dim: spec.dim,
            init: spec.initializer.clone(),
        }
    }
}

impl Store for Papaya<Box<[f32]>> {
    fn system(&self) -> System {
        System::Papaya
    }

    fn insert(&self, batch: Batch<'_>, values: &[f32]) {
        self.upsert(batch, values);
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

impl SlotRows for Papaya<LockedRow> {
    const SYSTEM: System = System::Papaya;
    type Id = u64;

    fn with_slots(spec: &Spec, _initials: &[f32]) -> Self {
        Papaya::new(spec)
    }

    fn ids<'a>(batch: Batch<'a>) -> &'a [u64] {
        batch.keys
    }

    fn prefill(&self, batch: Batch<'_>, values: &[f32], initials: &[f32]) {
        let map = self.map.pin();
        for (i, &key) in batch.keys.iter().enumerate() {
            let r = boxed_row(row(values, self.dim, i), initials);
            map.insert(key, Mutex::new(r));
        }
    }

    fn update_each(&self, ids: &[u64], mut update: impl FnMut(usize, &mut [f32])) {
        let map = self.map.pin();
        for (i, key) in ids.iter().enumerate() {
            if let Some(r) = map.get(key) {
                update(i, &mut r.lock().unwrap_or_else(PoisonError::into_inner));
            }
        }
    }

    fn read(&self, key: u64, _row: u32, out: &mut [f32]) {
        let map = self.map.pin();
        let r = map.get(&key).expect("a stored key");
        out.copy_from_slice(&r.lock().unwrap_or_else(PoisonError::into_inner));
    }
}
