//! dynemb through its public batched API: one call per batch on any
//! [`EmbeddingTable`] with `u64` keys; `compare` builds a [`Variable<u64>`]
//! with the builder's defaults (optimizer steps: slots inline, below),
//! values and slots stored as `f32` (system
//! `dynemb`) or as bf16 (`dynemb-bf16`).
//!
//! - Shards: one. Batches from several threads run concurrently on the one
//!   lock-free table; more shards would only split each batch by key first.
//! - `init_size`: 0, so the table grows through every resize, for the insert
//!   op and for the prefill of the other ops alike.
//! - `insert` is `upsert` (dynemb has no insert-only call; for absent keys it
//!   inserts), `accum` passes `exists` all true (bp_v2 adds to present rows,
//!   ignores absent ones), `export` streams `export_chunks`.
//! - An optimizer step is `opt.apply(&variable, keys, grads)` of
//!   `dynemb-optim`'s `Sparse<R>`: the whole public driver (input checks,
//!   slot columns by name, created by the first step, dedup, and
//!   `update_rows`: one probe and one row lock per distinct key, value, slot
//!   rows and score written together). The variable keeps the optimizer's
//!   slots inline (`inline_slots`: Adam's `m` and `v` after each row's
//!   values), as a user who knows the optimizer builds it; the table ops'
//!   variables have no slots and keep no room for any.

use super::{Spec, Store, System};
use crate::apply::{Optimizer, Trainer};
use crate::workload::Batch;
use dynemb::{Dtype, EmbeddingTable, Variable};
use dynemb_optim::{Rule, Sparse, SparseOptimizer};

/// An empty variable for `spec` storing values and slots as `dtype`, its
/// rows keeping `inline_slots` slots beside their values.
fn variable(spec: &Spec, dtype: Dtype, inline_slots: usize) -> Variable<u64> {
    Variable::<u64>::builder("bench")
        .dim(spec.dim)
        .initializer(spec.initializer.clone())
        .value_dtype(dtype)
        .slot_dtype(dtype)
        .inline_slots(inline_slots)
        .build()
        .expect("valid variable settings")
}

/// The system of a variable storing `dtype`.
fn system_of(dtype: Dtype) -> System {
    match dtype {
        Dtype::Bf16 => System::DynembBf16,
        _ => System::Dynemb,
    }
}

/// A dynemb table, for the table ops.
pub struct Dynemb<T = Variable<u64>> {
    var: T,
    /// How it stores values.
    dtype: Dtype,
    /// `exists` for `accum`: all true, one batch long.
    all_exist: Vec<bool>,
}

impl Dynemb {
    /// An empty variable for `spec` storing `dtype`.
    pub fn new(spec: &Spec, dtype: Dtype) -> Self {
        Dynemb {
            dtype,
            ..Dynemb::of(variable(spec, dtype, 0), spec.batch)
        }
    }
}

impl<T> Dynemb<T> {
    /// The adapter of `table` (storing `f32`), for batches of at most
    /// `batch` keys.
    pub fn of(table: T, batch: usize) -> Self {
        Dynemb {
            var: table,
            dtype: Dtype::F32,
            all_exist: vec![true; batch],
        }
    }
}

impl<T: EmbeddingTable<Key = u64> + Sync> Store for Dynemb<T> {
    fn system(&self) -> System {
        system_of(self.dtype)
    }

    fn dtype(&self) -> Dtype {
        self.dtype
    }

    fn insert(&self, batch: Batch<'_>, values: &[f32]) {
        self.upsert(batch, values);
    }

    fn lookup(&self, batch: Batch<'_>, out: &mut [f32]) {
        self.var.lookup(batch.keys, out).expect("lookup");
    }

    fn upsert(&self, batch: Batch<'_>, values: &[f32]) {
        self.var.upsert(batch.keys, values).expect("upsert");
    }

    fn accum(&self, batch: Batch<'_>, deltas: &[f32]) {
        let exists = &self.all_exist[..batch.len()];
        self.var.accum(batch.keys, deltas, exists).expect("accum");
    }

    fn remove(&self, batch: Batch<'_>) {
        self.var.remove(batch.keys).expect("remove");
    }

    fn export(&self, chunk_rows: usize, sink: &mut dyn FnMut(&[u64], &[f32])) -> usize {
        let mut rows = 0;
        for chunk in self.var.export_chunks(chunk_rows) {
            let (keys, values) = chunk.expect("export");
            sink(&keys, &values);
            rows += keys.len();
        }
        rows
    }

    fn len(&self) -> usize {
        self.var.size().expect("size")
    }

    fn memory_bytes(&self) -> Option<usize> {
        self.var.memory_bytes().ok()
    }
}

/// A dynemb table and the optimizer training it.
pub struct DynembTrainer<R: Rule, T = Variable<u64>> {
    /// Which optimizer `R` is.
    optimizer: Optimizer,
    /// How the table stores values and slots.
    dtype: Dtype,
    /// The table.
    var: T,
    /// The optimizer, with its step count.
    opt: Sparse<R>,
    /// The rule's slot names, in its slot order.
    slot_names: Vec<&'static str>,
}

impl<R: Rule> DynembTrainer<R> {
    /// An empty variable for `spec` storing `dtype`, its rows keeping the
    /// optimizer's slots inline, and the optimizer with `params`.
    pub fn new(optimizer: Optimizer, params: R, spec: &Spec, dtype: Dtype) -> Self {
        let inline_slots = params.slots().len();
        DynembTrainer {
            dtype,
            ..DynembTrainer::of(variable(spec, dtype, inline_slots), optimizer, params)
        }
    }
}

impl<R: Rule, T> DynembTrainer<R, T> {
    /// `table` trained by `optimizer` with `params`.
    pub fn of(table: T, optimizer: Optimizer, params: R) -> Self {
        let slot_names = params.slots().into_iter().map(|(name, _)| name).collect();
        DynembTrainer {
            optimizer,
            dtype: Dtype::F32,
            var: table,
            opt: Sparse::new(params).expect("valid hyperparameters"),
            slot_names,
        }
    }
}

impl<R: Rule, T: EmbeddingTable<Key = u64> + Sync> Trainer for DynembTrainer<R, T> {
    fn system(&self) -> System {
        system_of(self.dtype)
    }

    fn optimizer(&self) -> Optimizer {
        self.optimizer
    }

    fn prefill(&self, batch: Batch<'_>, values: &[f32]) {
        self.var.upsert(batch.keys, values).expect("prefill");
    }

    fn apply(&self, batch: Batch<'_>, grads: &[f32]) {
        self.opt.apply(&self.var, batch.keys, grads).expect("apply");
    }

    fn steps(&self) -> u64 {
        self.opt.steps()
    }

    fn dtype(&self) -> Dtype {
        self.dtype
    }

    fn read(&self, key: u64, _row: u32, out: &mut [f32]) {
        let dim = self.var.dim();
        let (value, slots) = out.split_at_mut(dim);
        self.var.lookup(&[key], value).expect("lookup");
        for (name, slot_row) in self.slot_names.iter().zip(slots.chunks_exact_mut(dim)) {
            let slot = self
                .var
                .slot_id(name)
                .expect("the first step created the slots");
            self.var
                .lookup_slot(slot, &[key], slot_row)
                .expect("lookup_slot");
        }
    }
}
