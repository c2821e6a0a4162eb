//! dynemb through its public batched API: one [`Variable<u64>`] call per
//! batch.
//!
//! - Shards: the builder's default (one). Batches from several threads run
//!   concurrently on the one lock-free table; more shards would only split
//!   each batch by key first.
//! - `init_size`: the default (0), so the table grows through every resize,
//!   for the insert op and for the prefill of the other ops alike.
//! - `insert` is `upsert` (dynemb has no insert-only call; for absent keys it
//!   inserts), `accum` passes `exists` all true (the keys were looked up and
//!   found: bp_v2 adds to present rows, ignores absent ones), `export` streams
//!   `export_chunks`.

use super::{Op, Spec, Store, System};
use crate::workload::Batch;
use dynemb::Variable;

/// dynemb's `Variable<u64>`.
pub struct DynembStore {
    var: Variable<u64>,
    /// `exists` for `accum`: all true, one batch long.
    all_exist: Vec<bool>,
}

impl DynembStore {
    /// An empty variable for `spec`.
    pub fn new(spec: &Spec) -> Self {
        let var = Variable::<u64>::builder("bench")
            .dim(spec.dim)
            .initializer(spec.initializer.clone())
            .build()
            .expect("valid variable settings");
        DynembStore {
            var,
            all_exist: vec![true; spec.batch],
        }
    }

    /// The variable underneath.
    pub fn variable(&self) -> &Variable<u64> {
        &self.var
    }
}

impl Store for DynembStore {
    fn system(&self) -> System {
        System::Dynemb
    }

    fn supports(&self, _op: Op) -> bool {
        true
    }

    fn insert(&self, batch: Batch<'_>, values: &[f32]) {
        self.var.upsert(batch.keys, values).expect("insert");
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
        self.var.size()
    }

    fn memory_bytes(&self) -> Option<usize> {
        Some(self.var.memory_bytes())
    }
}
