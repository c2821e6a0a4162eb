//! Model-based property tests of `Variable`: the contract every table
//! storage keeps (`dynemb_test_support::contract`: random sequences of
//! every operation against a `HashMap` model; slots, `update_rows`,
//! scores and `restrict` against a second model), run on 1 to 3 shards
//! with the modulo and a custom partitioner, with each shard's size
//! checked against the partitioner, and with `init_size(1)` so tables
//! resize many times within a case. `dynemb-redis` runs the same contract
//! on its store.

use dynemb::{Partitioner, Variable};
use dynemb_test_support::contract::{self, Maker, Spec, TestKey};
use proptest::prelude::*;
use std::sync::Arc;

/// Makes local variables.
struct Local;

impl Maker for Local {
    type Table<K: TestKey> = Variable<K>;

    fn make<K: TestKey>(&self, spec: Spec) -> Variable<K> {
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
        b.build().expect("build")
    }

    fn shard_sizes<K: TestKey>(&self, table: &Variable<K>) -> Option<Vec<usize>> {
        let sizes = (0..table.num_shards())
            .map(|s| table.shard_size(s).expect("a shard of the variable"))
            .collect();
        Some(sizes)
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
