//! `scc::HashMap<u64, Box<[f32]>>` (scc 3), per key, through its
//! synchronous API: `read_sync` to copy out, `update_sync` to overwrite or
//! add in place, `entry_sync` for insert-or-overwrite, `insert_sync`,
//! `remove_sync`, `iter_sync` to export. For the optimizer steps a key's box
//! holds its value row and every slot row back to back, and a step runs the
//! kernel in place inside `update_sync` (the key's bucket locked for the
//! closure). ahash.

use super::{hasher, row, row_mut, Chunker, Spec, Store, System};
use crate::apply::{boxed_row, SlotRows};
use crate::workload::Batch;
use dynemb::raw::kernels::axpy;
use dynemb::Initializer;

/// An scc map of boxed rows.
pub struct SccPeer {
    map: ::scc::HashMap<u64, Box<[f32]>, ahash::RandomState>,
    dim: usize,
    init: Initializer,
}

impl SccPeer {
    /// An empty map for `spec`.
    pub fn new(spec: &Spec) -> Self {
        SccPeer {
            map: ::scc::HashMap::with_hasher(hasher()),
            dim: spec.dim,
            init: spec.initializer.clone(),
        }
    }

    /// Stores `row` under `key`, which is absent (a present key would keep
    /// its row).
    fn insert_new(&self, key: u64, row: Box<[f32]>) {
        let _ = self.map.insert_sync(key, row);
    }
}

impl Store for SccPeer {
    fn system(&self) -> System {
        System::Scc
    }

    fn insert(&self, batch: Batch<'_>, values: &[f32]) {
        for (i, &key) in batch.keys.iter().enumerate() {
            self.insert_new(key, row(values, self.dim, i).into());
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

impl SlotRows for SccPeer {
    const SYSTEM: System = System::Scc;
    type Id = u64;

    fn with_slots(spec: &Spec, _initials: &[f32]) -> Self {
        SccPeer::new(spec)
    }

    fn ids<'a>(batch: Batch<'a>) -> &'a [u64] {
        batch.keys
    }

    fn prefill(&self, batch: Batch<'_>, values: &[f32], initials: &[f32]) {
        for (i, &key) in batch.keys.iter().enumerate() {
            self.insert_new(key, boxed_row(row(values, self.dim, i), initials));
        }
    }

    fn update_each(&self, ids: &[u64], mut update: impl FnMut(usize, &mut [f32])) {
        for (i, key) in ids.iter().enumerate() {
            self.map.update_sync(key, |_, r| update(i, r));
        }
    }

    fn read(&self, key: u64, _row: u32, out: &mut [f32]) {
        self.map
            .read_sync(&key, |_, r| out.copy_from_slice(r))
            .expect("a stored key");
    }
}
