//! The dense reference: every row in one array per column, addressed by a
//! row index computed before the timer starts. What an operation costs with
//! no hashing at all: the physical limit to compare dynemb with.
//!
//! It gets the same treatment as dynemb's row arena, so the comparison is
//! about hashing and nothing else:
//! - the same row layout and kernels: rows are `words_for_dim(dim)`
//!   `AtomicU64` words, read with `load_row`, written with `store_row`
//!   (vector copies that behave as Relaxed atomic word accesses),
//!   accumulated with `axpy_row` (Relaxed word atomics);
//! - the same prefetching: the row [`PREFETCH_AHEAD`] keys ahead, as far
//!   ahead as dynemb prefetches rows;
//! - the same pages: each column comes from [`dynemb::raw::zeroed_words`],
//!   the allocation dynemb's row segments use (2 MiB-aligned, marked
//!   `MADV_HUGEPAGE`).
//!
//! Lookup is a gather, upsert a scatter, accumulate a scatter-add, a miss
//! fills the initializer's row. An optimizer step dedups the batch's row
//! indices with the function dynemb's driver uses, then per distinct row
//! loads the value and slot rows into one buffer, runs the kernel and
//! stores them back, as dynemb's `update_rows` moves a row through its
//! scratch buffer. There is no lock: two threads writing one row at once may
//! lose one write, and a read racing a write may mix words of the two (the
//! accesses are atomic, so this is well-defined). It is a cost reference,
//! not a store: insert, remove and export mean nothing for it; `insert`
//! still stores rows, for the prefill.

use super::{row, row_mut, Spec, Store, System};
use crate::apply::SlotRows;
use crate::workload::{Batch, NO_ROW};
use dynemb::raw::kernels::{axpy_row, load_row, prefetch_span, store_row, words_for_dim};
use dynemb::raw::{zeroed_words, ZeroedWords};
use dynemb::Initializer;
use std::sync::atomic::AtomicU64;

/// How many keys ahead a row is prefetched: dynemb prefetches a found row
/// 12 keys ahead, and the dense gather's throughput no longer rises past
/// 12, so the reference is the limit, not a handicapped one.
pub const PREFETCH_AHEAD: usize = 12;

/// One huge-page array per column (the values, then each slot), by row
/// index.
pub struct Dense {
    columns: Vec<ZeroedWords>,
    dim: usize,
    /// Words per row.
    stride: usize,
    init: Initializer,
}

impl Dense {
    /// Room for `spec.dense_rows` rows of values, and of one slot per entry
    /// of `initials` at that initial value.
    pub fn new(spec: &Spec, initials: &[f32]) -> Self {
        let stride = words_for_dim(spec.dim);
        let columns: Vec<ZeroedWords> = (0..=initials.len())
            .map(|_| zeroed_words(spec.dense_rows * stride))
            .collect();
        for (column, &initial) in columns[1..].iter().zip(initials) {
            // Zeroed pages already hold 0.
            if initial.to_bits() != 0 {
                let r = vec![initial; spec.dim];
                for words in column.chunks_exact(stride) {
                    store_row(words, &r);
                }
            }
        }
        Dense {
            columns,
            dim: spec.dim,
            stride,
            init: spec.initializer.clone(),
        }
    }

    /// Row `r` of column `column` (0: the values, 1 + j: slot j).
    #[inline]
    fn row(&self, column: usize, r: u32) -> &[AtomicU64] {
        let start = r as usize * self.stride;
        &self.columns[column][start..start + self.stride]
    }

    /// Prefetches row `rows[i + PREFETCH_AHEAD]` of every column.
    #[inline]
    fn prefetch_ahead(&self, rows: &[u32], i: usize) {
        if let Some(&r) = rows.get(i + PREFETCH_AHEAD) {
            for column in 0..self.columns.len() {
                self.prefetch_row(column, r);
            }
        }
    }

    /// Prefetches row `r` of column `column` (0: the values, 1 + j: slot
    /// j; nothing for [`NO_ROW`]).
    #[inline]
    pub(super) fn prefetch_row(&self, column: usize, r: u32) {
        if r != NO_ROW {
            let at = self.columns[column]
                .as_ptr()
                .wrapping_add(r as usize * self.stride);
            prefetch_span(at, self.stride * 8);
        }
    }

    /// Copies the values of row `r` into `dst`, or the initializer's row of
    /// `key` if `r` is [`NO_ROW`].
    #[inline]
    pub(super) fn gather_one(&self, key: u64, r: u32, dst: &mut [f32]) {
        if r == NO_ROW {
            self.init.fill(key, dst);
        } else {
            load_row(self.row(0, r), dst);
        }
    }

    /// Values per row.
    pub(super) fn dim(&self) -> usize {
        self.dim
    }

    /// Runs `f(i, row)` on the value row of every stored key of the batch,
    /// with prefetching.
    #[inline]
    fn each_row(&self, batch: Batch<'_>, mut f: impl FnMut(usize, &[AtomicU64])) {
        for (i, &r) in batch.rows.iter().enumerate() {
            self.prefetch_ahead(batch.rows, i);
            if r != NO_ROW {
                f(i, self.row(0, r));
            }
        }
    }
}

impl Store for Dense {
    fn system(&self) -> System {
        System::Dense
    }

    fn insert(&self, batch: Batch<'_>, values: &[f32]) {
        self.upsert(batch, values);
    }

    fn lookup(&self, batch: Batch<'_>, out: &mut [f32]) {
        for (i, (&key, &r)) in batch.keys.iter().zip(batch.rows).enumerate() {
            self.prefetch_ahead(batch.rows, i);
            self.gather_one(key, r, row_mut(out, self.dim, i));
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
        self.columns[0].len() / self.stride
    }

    fn memory_bytes(&self) -> Option<usize> {
        Some(self.columns.iter().map(|c| c.len() * 8).sum())
    }
}

impl SlotRows for Dense {
    const SYSTEM: System = System::Dense;
    type Id = u32;

    fn with_slots(spec: &Spec, initials: &[f32]) -> Self {
        Dense::new(spec, initials)
    }

    fn ids<'a>(batch: Batch<'a>) -> &'a [u32] {
        batch.rows
    }

    fn prefill(&self, batch: Batch<'_>, values: &[f32], _initials: &[f32]) {
        for (i, &r) in batch.rows.iter().enumerate() {
            store_row(self.row(0, r), row(values, self.dim, i));
        }
    }

    fn update_each(&self, ids: &[u32], mut update: impl FnMut(usize, &mut [f32])) {
        let dim = self.dim;
        let mut buf = vec![0.0; self.columns.len() * dim];
        for (i, &r) in ids.iter().enumerate() {
            self.prefetch_ahead(ids, i);
            for (c, out) in buf.chunks_exact_mut(dim).enumerate() {
                load_row(self.row(c, r), out);
            }
            update(i, &mut buf);
            for (c, src) in buf.chunks_exact(dim).enumerate() {
                store_row(self.row(c, r), src);
            }
        }
    }

    fn read(&self, _key: u64, row: u32, out: &mut [f32]) {
        for (c, out) in out.chunks_exact_mut(self.dim).enumerate() {
            load_row(self.row(c, row), out);
        }
    }
}
