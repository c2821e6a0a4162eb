//! Model-based property tests of `Variable`: the shared store contract of
//! `contract/mod.rs` (random sequences of every operation against a
//! `HashMap` model; slots, `update_rows`, scores and `restrict` against a
//! second model), run on 1 to 3 shards with the modulo and a custom
//! partitioner, and with `init_size(1)` so tables resize many times within
//! a case. `dynemb-redis` runs the same contract on its store.

mod contract;

use contract::{Maker, RowUpdate, Spec, Subject, TestKey};
use dynemb::{Key, Partitioner, Result, SlotId, Variable};
use proptest::prelude::*;
use std::sync::Arc;

/// Makes local variables.
struct Local;

impl Maker for Local {
    fn make<K: TestKey>(&self, spec: Spec) -> Box<dyn Subject<K>> {
        let mut b = Variable::<K>::builder(spec.name)
            .dim(spec.dim)
            .shards(spec.shards)
            .init_size(1)
            .initializer(spec.initializer);
        if let Some(policy) = spec.policy {
            b = b.restrict_policy(policy);
        }
        if spec.custom_partitioner {
            b = b.partitioner(Partitioner::Custom(Arc::new(contract::custom_partition)));
        }
        Box::new(b.build().expect("build"))
    }
}

impl<K: Key> Subject<K> for Variable<K> {
    fn lookup(&self, keys: &[K], out: &mut [f32]) -> Result<()> {
        Variable::lookup(self, keys, out)
    }
    fn lookup_with_exists(&self, keys: &[K], out: &mut [f32], exists: &mut [bool]) -> Result<()> {
        Variable::lookup_with_exists(self, keys, out, exists)
    }
    fn lookup_or_insert(&self, keys: &[K], out: &mut [f32]) -> Result<()> {
        Variable::lookup_or_insert(self, keys, out)
    }
    fn upsert(&self, keys: &[K], values: &[f32]) -> Result<()> {
        Variable::upsert(self, keys, values)
    }
    fn accum(&self, keys: &[K], deltas: &[f32], exists: &[bool]) -> Result<()> {
        Variable::accum(self, keys, deltas, exists)
    }
    fn remove(&self, keys: &[K]) -> Result<()> {
        Variable::remove(self, keys)
    }
    fn clear(&self) -> Result<()> {
        Variable::clear(self);
        Ok(())
    }
    fn size(&self) -> Result<usize> {
        Ok(Variable::size(self))
    }
    fn shard_size(&self, shard: usize) -> Option<usize> {
        Some(Variable::shard_size(self, shard).expect("a shard of the variable"))
    }
    fn export(&self) -> Result<(Vec<K>, Vec<f32>)> {
        Variable::export(self)
    }
    fn export_chunks(&self, rows_per_chunk: usize) -> Vec<Result<(Vec<K>, Vec<f32>)>> {
        Variable::export_chunks(self, rows_per_chunk).collect()
    }
    fn create_slot(&self, name: &str, initial: f32) -> Result<SlotId> {
        Variable::create_slot(self, name, initial)
    }
    fn slot_id(&self, name: &str) -> Result<SlotId> {
        Variable::slot_id(self, name)
    }
    fn slot_names(&self) -> Result<Vec<String>> {
        Ok(Variable::slot_names(self))
    }
    fn slot_initial(&self, slot: SlotId) -> Result<f32> {
        Variable::slot_initial(self, slot)
    }
    fn lookup_slot(&self, slot: SlotId, keys: &[K], out: &mut [f32]) -> Result<()> {
        Variable::lookup_slot(self, slot, keys, out)
    }
    fn lookup_scores(&self, keys: &[K], out: &mut [u64]) -> Result<()> {
        Variable::lookup_scores(self, keys, out)
    }
    fn update_rows(&self, keys: &[K], slots: &[SlotId], update: &mut RowUpdate<'_>) -> Result<()> {
        Variable::update_rows(self, keys, slots, update)
    }
    fn restrict(&self, num_reserved: usize, trigger: usize) -> Result<usize> {
        Variable::restrict(self, num_reserved, trigger)
    }
}

proptest! {
    #![proptest_config(contract::config(64))]

    #[test]
    fn single_shard_matches_hashmap_model(case in contract::case_strategy(false)) {
        contract::run(&Local, case);
    }

    #[test]
    fn multi_shard_matches_hashmap_model(case in contract::case_strategy(true)) {
        contract::run(&Local, case);
    }

    /// Slots, update_rows and Frequency scores (with restrict) against the
    /// model, on 1 to 3 shards.
    #[test]
    fn slots_and_scores_match_model(case in contract::slot_case_strategy()) {
        contract::run_slots(&Local, case);
    }
}

/// A fixed long sequence on the largest dim with a tiny key space: many
/// duplicates, many resizes after clears.
#[test]
fn long_fixed_sequence_matches_model() {
    contract::long_fixed_sequence(&Local);
}

/// A fixed long sequence: slots created between writes, many updates,
/// removals and restricts over a tiny key space.
#[test]
fn slots_and_scores_long_fixed_sequence_matches_model() {
    contract::slots_and_scores_long_fixed_sequence(&Local);
}
