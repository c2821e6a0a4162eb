//! Random sequences of operations on a variable with the row lifecycle's
//! features, as the input picks them: a small capacity (1 to 12 rows, on 1
//! to 3 shards) whose eviction listener reports every evicted row,
//! `Admission::Exact` (min_count 1 to 3), the Timestamp policy with
//! `expire` (or Frequency, with or without LFU ageing, where `expire` must
//! be refused).
//!
//! The model is the lifecycle model the core's property tests run
//! (`dynemb_test_support::contract::run_lifecycle`): it learns evictions
//! from the listener and explains them key by key (each delivered row is
//! the row the model held for its key at some point of the batch, each
//! row is delivered at most once per lifetime, a batch evicts only to make
//! room for its inserts), predicts admission from its own counts of
//! training reads, and checks after every operation that every key's
//! values, slots, score and presence, `size()`, each shard's size and the
//! lifecycle counters are what it allows. Batches run up to 80 keys, past
//! the depth of the table's pipeline, so probes run ahead of the evictions
//! the batch itself makes.

#![no_main]

use arbitrary::Arbitrary;
use dynemb::{Partitioner, RestrictPolicy, Variable};
use dynemb_test_support::contract::{
    self, ExpireAge, Flags, InitKind, LifeOp, LifecycleCase, LifecycleMaker, LifecycleSpec, Maker,
    Spec, TestKey,
};
use libfuzzer_sys::fuzz_target;
use std::sync::Arc;

/// Most operations run per input.
const MAX_OPS: usize = 48;
/// Most keys per batch.
const MAX_BATCH: usize = 80;
/// Keys of the space a case may use at most.
const KEYS: usize = 24;

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Init {
    Zeros,
    Constant(i8),
    Values(u32),
}

#[derive(Arbitrary, Debug)]
struct Input {
    key_type: u8,
    dim: u8,
    init: Init,
    shards: u8,
    custom_partitioner: bool,
    /// A capacity of `1 + c % 12` rows (at least one per shard).
    capacity: Option<u8>,
    /// `min_count` of `1 + m % 3`.
    admission: Option<u8>,
    /// Timestamp (with expiry), else Frequency.
    timestamp: bool,
    decay: bool,
    /// Keys in play: `1 + k % KEYS`.
    keys: u8,
    ops: Vec<Op>,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Lookup(Vec<u8>),
    LookupOrInsert(Vec<u8>),
    Upsert(Vec<u8>, u32),
    /// Flags as `lookup_with_exists` would report them, or random bits.
    Accum(Vec<u8>, u32, Option<u64>),
    UpdateRows(Vec<u8>, u8, bool, u32),
    CreateSlot(u8),
    Remove(Vec<u8>),
    Clear,
    Restrict(u8, u8),
    ExpireZero,
    ExpireMax,
    ExpireAtRank(u8),
    Export,
}

/// Makes local variables, as the core's model tests do.
struct Local;

fn builder<K: TestKey>(spec: Spec) -> dynemb::VariableBuilder<K> {
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

fn case_of(input: &Input) -> LifecycleCase {
    let keys = 1 + input.keys as usize % KEYS;
    let batch = |bytes: &[u8]| -> Vec<usize> {
        bytes
            .iter()
            .take(MAX_BATCH)
            .map(|&b| b as usize % keys)
            .collect()
    };
    let shards = 1 + input.shards as usize % 3;
    let capacity = input.capacity.map(|c| (1 + c as usize % 12).max(shards));
    let policy = if input.timestamp {
        RestrictPolicy::Timestamp
    } else {
        RestrictPolicy::Frequency
    };
    let ops = input
        .ops
        .iter()
        .take(MAX_OPS)
        .map(|op| match op {
            Op::Lookup(k) => LifeOp::Lookup(batch(k)),
            Op::LookupOrInsert(k) => LifeOp::LookupOrInsert(batch(k)),
            Op::Upsert(k, s) => LifeOp::Upsert(batch(k), *s),
            Op::Accum(k, s, bits) => {
                LifeOp::Accum(batch(k), *s, bits.map_or(Flags::Truth, Flags::Random))
            }
            Op::UpdateRows(k, mask, reverse, s) => {
                LifeOp::UpdateRows(batch(k), *mask, *reverse, *s)
            }
            Op::CreateSlot(i) => LifeOp::CreateSlot(*i as usize % 3),
            Op::Remove(k) => LifeOp::Remove(batch(k)),
            Op::Clear => LifeOp::Clear,
            Op::Restrict(n, t) => {
                LifeOp::Restrict(*n as usize % (keys + 2), *t as usize % (keys + 2))
            }
            Op::ExpireZero => LifeOp::Expire(ExpireAge::Zero),
            Op::ExpireMax => LifeOp::Expire(ExpireAge::Max),
            Op::ExpireAtRank(r) => LifeOp::Expire(ExpireAge::AtRank(*r as usize)),
            Op::Export => LifeOp::Export,
        })
        .collect();
    LifecycleCase {
        key_type: input.key_type % 4,
        dim: 1 + input.dim as usize % 4,
        init: match input.init {
            Init::Zeros => InitKind::Zeros,
            Init::Constant(c) => InitKind::Constant(c % 5),
            Init::Values(s) => InitKind::Values(s),
        },
        shards,
        custom_partitioner: input.custom_partitioner && shards > 1,
        capacity,
        min_count: input.admission.map(|m| 1 + u32::from(m) % 3),
        policy,
        decay: input.decay && capacity.is_some() && policy == RestrictPolicy::Frequency,
        ops,
    }
}

fuzz_target!(|input: Input| {
    contract::run_lifecycle(&Local, case_of(&input));
});
