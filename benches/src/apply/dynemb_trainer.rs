//! dynemb: a `Variable<u64>` (one shard, the builder's defaults) trained by
//! `dynemb-optim`'s `Sparse<R>` through its public API,
//! `opt.apply(&variable, keys, grads)`, once per batch: the driver checks
//! the input (lengths, every gradient finite), gets the rule's slot columns
//! (`create_slot` by name: created by the first step, found by the later
//! ones), sums repeated keys' gradients (`dedup`) and runs the rule's kernel
//! on each distinct key through `update_rows` (one index probe and one row
//! lock per key; the value, slot rows and score written together). The
//! prefill is `upsert`; the slot rows start at their initial values.

use super::{Optimizer, Trainer};
use crate::systems::{Spec, System};
use crate::workload::Batch;
use dynemb::Variable;
use dynemb_optim::{Rule, Sparse, SparseOptimizer};

/// A variable and the optimizer training it.
pub struct DynembTrainer<R: Rule> {
    /// Which optimizer `R` is.
    optimizer: Optimizer,
    /// The table.
    var: Variable<u64>,
    /// The optimizer, with its step count.
    opt: Sparse<R>,
    /// The rule's slot names, in its slot order.
    slot_names: Vec<&'static str>,
}

impl<R: Rule> DynembTrainer<R> {
    /// An empty variable for `spec`, and the optimizer with `params`.
    pub fn new(optimizer: Optimizer, params: R, spec: &Spec) -> Self {
        let var = Variable::<u64>::builder("bench")
            .dim(spec.dim)
            .initializer(spec.initializer.clone())
            .build()
            .expect("valid variable settings");
        let slot_names = params.slots().into_iter().map(|(name, _)| name).collect();
        DynembTrainer {
            optimizer,
            var,
            opt: Sparse::new(params).expect("valid hyperparameters"),
            slot_names,
        }
    }
}

impl<R: Rule> Trainer for DynembTrainer<R> {
    fn system(&self) -> System {
        System::Dynemb
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
