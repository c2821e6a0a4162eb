//! Model-based property tests of `Variable`: the contract every table
//! storage keeps (`dynemb_test_support::contract`: random sequences of
//! every operation against a `HashMap` model; slots, `update_rows`,
//! scores and `restrict` against a second model), run on 1 to 3 shards
//! with the modulo and a custom partitioner, with each shard's size
//! checked against the partitioner, and with `init_size(1)` so tables
//! resize many times within a case. `dynemb-redis` runs the same contract
//! on its store.

use dynemb::{Evicted, Partitioner, Variable, VariableBuilder};
use dynemb_test_support::contract::{
    self, Features, LifecycleMaker, LifecycleSpec, Maker, Spec, TestKey,
};
use proptest::prelude::*;
use std::sync::{Arc, Mutex};

/// Makes local variables.
struct Local;

impl Maker for Local {
    type Table<K: TestKey> = Variable<K>;

    fn make<K: TestKey>(&self, spec: Spec) -> Variable<K> {
        builder(spec).build().expect("build")
    }

    fn shard_sizes<K: TestKey>(&self, table: &Variable<K>) -> Option<Vec<usize>> {
        let sizes = (0..table.num_shards())
            .map(|s| table.shard_size(s).expect("a shard of the variable"))
            .collect();
        Some(sizes)
    }
}

/// A builder of what `spec` asks, with `init_size(1)` so tables resize
/// many times within a case, and as many slots kept inline as `dim % 3`.
fn builder<K: TestKey>(spec: Spec) -> VariableBuilder<K> {
    let mut b = Variable::<K>::builder(spec.name)
        .dim(spec.dim)
        .shards(spec.shards)
        .init_size(1)
        // Slots in columns of their own, or one or two inline, by dim.
        .inline_slots(spec.dim % 3)
        .initializer(spec.initializer);
    if let Some(policy) = spec.policy {
        b = b.restrict_policy(policy);
    }
    if spec.custom_partitioner {
        b = b.partitioner(Partitioner::Custom(Arc::new(contract::custom_partition)));
    }
    b
}

impl LifecycleMaker for Local {
    fn make_with_lifecycle<K: TestKey>(&self, spec: Spec, lifecycle: LifecycleSpec) -> Variable<K> {
        let mut b = builder::<K>(spec).frequency_decay(lifecycle.frequency_decay);
        if let Some(rows) = lifecycle.capacity {
            b = b.capacity(rows);
        }
        if let Some(admission) = lifecycle.admission {
            b = b.admission(admission);
        }
        let mut options = b.table_options().clone();
        options.on_evict = lifecycle.on_evict;
        b.options(options).build().expect("build")
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

    /// A capacity of 1 to 8 rows with a listener, on 1 to 3 shards: the
    /// model learns evictions from the listener.
    #[test]
    fn capacity_matches_model(case in contract::lifecycle_case_strategy(Features {
        capacity: true,
        admission: false,
        expiry: false,
        shards: true,
    })) {
        contract::run_lifecycle(&Local, case);
    }

    /// Exact admission (min_count 1 to 3) without a capacity: the model
    /// counts training reads and predicts each admission.
    #[test]
    fn admission_matches_model(case in contract::lifecycle_case_strategy(Features {
        capacity: false,
        admission: true,
        expiry: false,
        shards: true,
    })) {
        contract::run_lifecycle(&Local, case);
    }

    /// The Timestamp policy with `expire`.
    #[test]
    fn expiry_matches_model(case in contract::lifecycle_case_strategy(Features {
        capacity: false,
        admission: false,
        expiry: true,
        shards: true,
    })) {
        contract::run_lifecycle(&Local, case);
    }

    /// Capacity, admission and expiry together.
    #[test]
    fn every_lifecycle_feature_matches_model(case in contract::lifecycle_case_strategy(Features {
        capacity: true,
        admission: true,
        expiry: true,
        shards: true,
    })) {
        contract::run_lifecycle(&Local, case);
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

/// The lifecycle model's smallest failing case, kept as a plain test: a
/// key new to a full table and repeated in one batch takes one row, so
/// the batch evicts one row for it, not one per occurrence (each later
/// occurrence finds the key the first inserted).
#[test]
fn a_new_key_repeated_in_one_batch_evicts_one_row() {
    for op in ["lookup_or_insert", "upsert", "accum"] {
        let evicted = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&evicted);
        let var = Variable::<u64>::builder("t")
            .capacity(4)
            .on_evict(move |batch: Evicted<'_, u64>| {
                sink.lock().unwrap().extend_from_slice(batch.keys());
            })
            .build()
            .unwrap();
        var.upsert(&[1, 2, 3, 4], &[1.0; 4]).unwrap();
        let mut out = [0.0; 2];
        match op {
            "lookup_or_insert" => var.lookup_or_insert(&[9, 9], &mut out).unwrap(),
            "upsert" => var.upsert(&[9, 9], &[5.0, 6.0]).unwrap(),
            _ => var.accum(&[9, 9], &[5.0, 6.0], &[false, false]).unwrap(),
        }
        let evicted = evicted.lock().unwrap();
        assert_eq!(evicted.len(), 1, "{op} [9, 9] evicted {evicted:?}");
        assert_eq!(var.size(), 4, "{op}: the table stays full");
        assert_eq!(var.lifecycle_stats().evicted, 1, "{op}");
    }
}

/// The lifecycle model's second finding, as a plain test: within one
/// `lookup_or_insert`, a key that the batch evicted and inserted again
/// reads its new row at every later occurrence, never the evicted one.
/// The batch is laid out for the table's pipeline: the first key's insert
/// finds the index's reservations used up (14 inserts into its 16 slots)
/// and rebuilds it; X is evicted at position 15 and inserted again at
/// position 30; position 37 was probed in the rebuilt index before
/// position 15 evicted X, and must not answer with the row it found then.
#[test]
fn a_training_read_never_returns_a_row_its_batch_evicted() {
    let var = Variable::<u64>::builder("t")
        .capacity(3)
        .initializer(dynemb::Initializer::Constant(-1.0))
        .restrict_policy(dynemb::RestrictPolicy::Timestamp)
        .on_evict(|_| {})
        .build()
        .unwrap();
    let (y, x, a, n0, n15) = (100, 200, 300, 400, 500);
    for k in 1..=11u64 {
        var.upsert(&[k], &[k as f32]).unwrap();
    }
    // Oldest to newest: Y, X, A.
    for k in [y, x, a] {
        var.upsert(&[k], &[k as f32]).unwrap();
    }
    let mut keys = vec![a; 38];
    keys[0] = n0;
    keys[15] = n15;
    keys[30] = x;
    keys[31..37].fill(n0);
    keys[37] = x;
    let mut out = vec![0.0; keys.len()];
    var.lookup_or_insert(&keys, &mut out).unwrap();
    let mut now = [0.0];
    var.lookup(&[x], &mut now).unwrap();
    assert_eq!(
        (out[30], out[37]),
        (now[0], now[0]),
        "both training reads of X return its row"
    );
}
