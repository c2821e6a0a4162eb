//! The dense reference reached through one random read: a lookup first reads
//! its row's index from an array of row indices in scrambled order, then
//! gathers the row as [`Dense`] does. It is what a gather costs when one
//! dependent random read of 8 bytes comes before each row, as the probe of
//! any table whose index does not fit in the cache does: the limit for a
//! hashed table, where [`Dense`] is the limit for no table at all.
//!
//! Only lookups are measured (see [`System::measures`]); the other
//! operations go to the dense rows, to prefill them.

use super::dense::{Dense, PREFETCH_AHEAD};
use super::{row_mut, Spec, Store, System};
use crate::workload::{Batch, NO_ROW};
use dynemb::raw::kernels::prefetch;
use dynemb::raw::{zeroed_words, ZeroedWords};
use std::sync::atomic::Ordering::Relaxed;

/// How many keys ahead a row index is prefetched: the row itself is
/// prefetched [`PREFETCH_AHEAD`] keys ahead, once its index is read.
const INDEX_AHEAD: usize = 2 * PREFETCH_AHEAD;
/// Row indices kept between the two stages: an index read for key `j` is
/// used `INDEX_AHEAD - PREFETCH_AHEAD` keys later, so more than that many.
const RING: usize = 32;
const _: () = assert!(RING > INDEX_AHEAD - PREFETCH_AHEAD);
/// An odd multiplier: `r * SCRAMBLE` modulo a power of two is a bijection.
const SCRAMBLE: usize = 0x9E37_79B9_7F4A_7C15_u64 as usize;

/// The dense rows, and their indices at scrambled places.
pub struct DenseIndirect {
    dense: Dense,
    /// `indices[place(r)] = r`, a power of two long.
    indices: ZeroedWords,
}

impl DenseIndirect {
    /// Room for `spec.dense_rows` rows, and their indices.
    pub fn new(spec: &Spec) -> Self {
        let len = spec.dense_rows.next_power_of_two();
        let table = DenseIndirect {
            dense: Dense::new(spec, &[]),
            indices: zeroed_words(len),
        };
        for r in 0..spec.dense_rows {
            table.indices[table.place(r as u32)].store(r as u64, Relaxed);
        }
        table
    }

    /// Where row `r`'s index is kept.
    #[inline]
    fn place(&self, r: u32) -> usize {
        (r as usize).wrapping_mul(SCRAMBLE) & (self.indices.len() - 1)
    }
}

impl Store for DenseIndirect {
    fn system(&self) -> System {
        System::DenseIndirect
    }

    fn insert(&self, batch: Batch<'_>, values: &[f32]) {
        self.dense.insert(batch, values);
    }

    fn lookup(&self, batch: Batch<'_>, out: &mut [f32]) {
        let n = batch.len();
        let mut found = [NO_ROW; RING];
        for step in 0..n + INDEX_AHEAD {
            if let Some(&r) = batch.rows.get(step) {
                if r != NO_ROW {
                    prefetch(self.indices[self.place(r)..].as_ptr());
                }
            }
            if let Some(j) = (step + PREFETCH_AHEAD)
                .checked_sub(INDEX_AHEAD)
                .filter(|&j| j < n)
            {
                let r = batch.rows[j];
                found[j % RING] = if r == NO_ROW {
                    NO_ROW
                } else {
                    self.indices[self.place(r)].load(Relaxed) as u32
                };
                self.dense.prefetch_row(0, found[j % RING]);
            }
            if let Some(j) = step.checked_sub(INDEX_AHEAD) {
                let dst = row_mut(out, self.dense.dim(), j);
                self.dense.gather_one(batch.keys[j], found[j % RING], dst);
            }
        }
    }

    fn upsert(&self, batch: Batch<'_>, values: &[f32]) {
        self.dense.upsert(batch, values);
    }

    fn accum(&self, batch: Batch<'_>, deltas: &[f32]) {
        self.dense.accum(batch, deltas);
    }

    fn remove(&self, batch: Batch<'_>) {
        self.dense.remove(batch);
    }

    fn export(&self, chunk_rows: usize, sink: &mut dyn FnMut(&[u64], &[f32])) -> usize {
        self.dense.export(chunk_rows, sink)
    }

    fn len(&self) -> usize {
        self.dense.len()
    }

    fn memory_bytes(&self) -> Option<usize> {
        Some(self.dense.memory_bytes()? + self.indices.len() * 8)
    }
}
