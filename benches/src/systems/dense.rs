//! The dense reference: every row in one array, addressed by a row index
//! computed before the timer starts. What an operation costs with no hashing
//! at all: the physical limit to compare dynemb with.
//!
//! It gets the same treatment as dynemb's row arena, so the comparison is
//! about hashing and nothing else:
//! - the same row layout and kernels: rows are `words_for_dim(dim)`
//!   `AtomicU64` words, read with `load_row`, written with `store_row`,
//!   accumulated with `axpy_row` (Relaxed atomics, plain moves on x86_64;
//!   atomics also make concurrent writers to one row well-defined, though
//!   without a row lock two racing adds may lose one: this is a cost
//!   reference, not a store);
//! - the same prefetching: the row [`PREFETCH_AHEAD`] keys ahead is
//!   prefetched with `prefetch_span`, as far ahead as dynemb prefetches
//!   rows;
//! - the same pages: the array comes from [`dynemb::raw::zeroed_words`], the
//!   allocation dynemb's row segments use (2 MiB-aligned anonymous mapping
//!   marked `MADV_HUGEPAGE`; with transparent huge pages in `madvise` mode
//!   neither would get huge pages otherwise).
//!
//! Lookup is a gather, upsert a scatter, accumulate a scatter-add, a miss
//! fills the initializer's row. Insert, remove and export mean nothing for a
//! dense array (it neither grows nor has keys): [`Store::supports`] says no,
//! and the report prints "-". `insert` still stores rows, for the prefill.

use super::{row, row_mut, Op, Spec, Store, System};
use crate::workload::{Batch, NO_ROW};
use dynemb::raw::kernels::{axpy_row, load_row, prefetch_span, store_row, words_for_dim};
use dynemb::raw::{zeroed_words, ZeroedWords};
use dynemb::Initializer;
use std::sync::atomic::AtomicU64;

/// How many keys ahead a row is prefetched: dynemb's pipeline prefetches a
/// found row 12 keys ahead (its `ROWS_AHEAD`). Measured for this gather
/// alone (8Mi rows of dim 64, one thread, alternating rounds): 4 ahead 20.4M
/// rows/s, 8 ahead 25.3M, 12 ahead 27.2M, 16 ahead 27.1M, 32 ahead 28.8M;
/// 12 is on the plateau, so the reference is the physical limit, not a
/// handicapped one.
pub const PREFETCH_AHEAD: usize = 12;

/// Rows in one huge-page array by row index.
pub struct DenseStore {
    words: ZeroedWords,
    dim: usize,
    /// Words per row.
    stride: usize,
    init: Initializer,
}

impl DenseStore {
    /// Zeroed room for `spec.dense_rows` rows.
    pub fn new(spec: &Spec) -> Self {
        let stride = words_for_dim(spec.dim);
        DenseStore {
            words: zeroed_words(spec.dense_rows * stride),
            dim: spec.dim,
            stride,
            init: spec.initializer.clone(),
        }
    }

    #[inline]
    fn row(&self, r: u32) -> &[AtomicU64] {
        let start = r as usize * self.stride;
        &self.words[start..start + self.stride]
    }

    /// Prefetches the row of key `i + PREFETCH_AHEAD` of the batch.
    #[inline]
    fn prefetch_ahead(&self, rows: &[u32], i: usize) {
        if let Some(&r) = rows.get(i + PREFETCH_AHEAD) {
            if r != NO_ROW {
                let at = self.words.as_ptr().wrapping_add(r as usize * self.stride);
                prefetch_span(at, self.stride * 8);
            }
        }
    }

    /// Runs `f(row)` on the row of every stored key of the batch, with
    /// prefetching.
    #[inline]
    fn each_row(&self, batch: Batch<'_>, mut f: impl FnMut(usize, &[AtomicU64])) {
        for (i, &r) in batch.rows.iter().enumerate() {
            self.prefetch_ahead(batch.rows, i);
            if r != NO_ROW {
                f(i, self.row(r));
            }
        }
    }
}

impl Store for DenseStore {
    fn system(&self) -> System {
        System::Dense
    }

    fn supports(&self, op: Op) -> bool {
        !matches!(op, Op::Insert | Op::Remove | Op::Export)
    }

    fn insert(&self, batch: Batch<'_>, values: &[f32]) {
        self.upsert(batch, values);
    }

    fn lookup(&self, batch: Batch<'_>, out: &mut [f32]) {
        for (i, (&key, &r)) in batch.keys.iter().zip(batch.rows).enumerate() {
            self.prefetch_ahead(batch.rows, i);
            let dst = row_mut(out, self.dim, i);
            if r == NO_ROW {
                self.init.fill(key, dst);
            } else {
                load_row(self.row(r), dst);
            }
        }
    }

    fn upsert(&self, batch: Batch<'_>, values: &[f32]) {
        self.each_row(batch, |i, r| store_row(r, row(values, self.dim, i)));
    }

    fn accum(&self, batch: Batch<'_>, deltas: &[f32]) {
        self.each_row(batch, |i, r| axpy_row(r, 1.0, row(deltas, self.dim, i)));
    }

    fn remove(&self, _batch: Batch<'_>) {}

    fn export(&self, _chunk_rows: usize, _sink: &mut dyn FnMut(&[u64], &[f32])) -> usize {
        0
    }

    fn len(&self) -> usize {
        self.words.len() / self.stride
    }

    fn memory_bytes(&self) -> Option<usize> {
        Some(self.words.len() * 8)
    }
}
