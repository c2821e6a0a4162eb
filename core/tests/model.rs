//! Model-based property tests: random sequences of every `Variable` operation
//! against a `HashMap<u64, Vec<f32>>` model that implements the contract of
//! `API.md` (TFRA semantics):
//!
//! - `lookup` / `lookup_with_exists` never insert; missing keys read the
//!   initializer's row;
//! - `lookup_or_insert` inserts missing keys with the initializer's row;
//! - `upsert`: a key repeated in one batch, the last one wins;
//! - `accum` (bp_v2): present && exists -> row += delta, absent && !exists ->
//!   insert delta, otherwise ignored; a key repeated in one batch adds every
//!   delta (the exists flags of one key are the same within a batch, as they
//!   are when they come from `lookup_with_exists`);
//! - `remove` ignores absent keys, `clear` empties everything;
//! - `export` / `export_chunks` return every row exactly once.
//!
//! Values are small integers stored as f32 so every sum is exact. Tables start
//! with `init_size(1)` so they resize many times within a case. Key spaces are
//! small so hits and misses both happen, and they include 0, MIN, MAX and
//! negative keys.

use std::collections::HashMap;
use std::sync::Arc;

use dynemb::{Initializer, Key, Partitioner, Variable};
use proptest::collection::vec;
use proptest::prelude::*;

// ---------------------------------------------------------------- keys

/// Maps a small index to a key of the type, edge values first.
trait TestKey: Key + std::fmt::Display {
    fn nth(i: usize) -> Self;
    /// The key's numeric value (for the reference modulo partitioner).
    fn value(self) -> i128;
}

impl TestKey for i64 {
    fn nth(i: usize) -> Self {
        match i {
            0 => 0,
            1 => -1,
            2 => i64::MIN,
            3 => i64::MAX,
            4 => 1,
            _ if i.is_multiple_of(2) => i as i64 * 7919 - 100_000,
            _ => -(i as i64) * 0x0123_4567_89AB_CDEF,
        }
    }
    fn value(self) -> i128 {
        self as i128
    }
}

impl TestKey for u64 {
    fn nth(i: usize) -> Self {
        match i {
            0 => 0,
            1 => u64::MAX,
            2 => 1 << 63,
            3 => u64::MAX - 1,
            4 => 1,
            _ if i.is_multiple_of(2) => i as u64 * 3,
            _ => (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
        }
    }
    fn value(self) -> i128 {
        self as i128
    }
}

impl TestKey for i32 {
    fn nth(i: usize) -> Self {
        match i {
            0 => 0,
            1 => -1,
            2 => i32::MIN,
            3 => i32::MAX,
            4 => 1,
            _ => i as i32 * 7919 - 100_000,
        }
    }
    fn value(self) -> i128 {
        self as i128
    }
}

impl TestKey for u32 {
    fn nth(i: usize) -> Self {
        match i {
            0 => 0,
            1 => u32::MAX,
            2 => 1 << 31,
            3 => u32::MAX - 1,
            4 => 1,
            _ => (i as u32).wrapping_mul(0x9E37_79B9),
        }
    }
    fn value(self) -> i128 {
        self as i128
    }
}

// ---------------------------------------------------------------- cases

#[derive(Clone, Debug)]
enum InitKind {
    Zeros,
    Constant(i8),
    /// Integer-valued row derived from the seed.
    Values(u32),
    /// RandomUniform with this seed: compared with a tolerance, the expected
    /// row of a missing key comes from an untouched twin variable.
    Uniform(u64),
}

#[derive(Clone, Debug)]
enum Flags {
    /// The flags `lookup_with_exists` reports right before the accum.
    Truth,
    /// Random flags, the same for every occurrence of a key in the batch.
    Random(u64),
}

#[derive(Clone, Debug)]
enum Op {
    Lookup(Vec<usize>),
    LookupWithExists(Vec<usize>),
    LookupOrInsert(Vec<usize>),
    Upsert(Vec<usize>, u32),
    Accum(Vec<usize>, u32, Flags),
    Remove(Vec<usize>),
    Clear,
    Export,
    ExportChunks(usize),
    Size,
}

#[derive(Clone, Debug)]
struct Case {
    key_type: u8,
    dim: usize,
    init: InitKind,
    shards: usize,
    custom_partitioner: bool,
    ops: Vec<Op>,
}

const MAX_BATCH: usize = 12;
const MAX_OPS: usize = 200;

fn batch(n: usize) -> impl Strategy<Value = Vec<usize>> {
    vec(0..n, 0..MAX_BATCH)
}

fn op_strategy(n: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => batch(n).prop_map(Op::Lookup),
        3 => batch(n).prop_map(Op::LookupWithExists),
        4 => batch(n).prop_map(Op::LookupOrInsert),
        4 => (batch(n), any::<u32>()).prop_map(|(k, s)| Op::Upsert(k, s)),
        3 => (batch(n), any::<u32>()).prop_map(|(k, s)| Op::Accum(k, s, Flags::Truth)),
        3 => (batch(n), any::<u32>(), any::<u64>())
            .prop_map(|(k, s, f)| Op::Accum(k, s, Flags::Random(f))),
        3 => batch(n).prop_map(Op::Remove),
        1 => Just(Op::Clear),
        1 => Just(Op::Export),
        1 => (1usize..6).prop_map(Op::ExportChunks),
        1 => Just(Op::Size),
    ]
}

fn init_strategy() -> impl Strategy<Value = InitKind> {
    prop_oneof![
        Just(InitKind::Zeros),
        (-4i8..=4).prop_map(InitKind::Constant),
        any::<u32>().prop_map(InitKind::Values),
        any::<u64>().prop_map(InitKind::Uniform),
    ]
}

fn case_strategy(multi_shard: bool) -> impl Strategy<Value = Case> {
    let shards = if multi_shard {
        (2usize..=3).boxed()
    } else {
        Just(1usize).boxed()
    };
    let custom = if multi_shard {
        any::<bool>().boxed()
    } else {
        Just(false).boxed()
    };
    (
        0u8..4,
        prop_oneof![Just(1usize), Just(3), Just(64), Just(130)],
        init_strategy(),
        shards,
        custom,
        1usize..40,
    )
        .prop_flat_map(
            |(key_type, dim, init, shards, custom_partitioner, key_space)| {
                vec(op_strategy(key_space), 1..MAX_OPS).prop_map(move |ops| Case {
                    key_type,
                    dim,
                    init: init.clone(),
                    shards,
                    custom_partitioner,
                    ops,
                })
            },
        )
}

// ---------------------------------------------------------------- model

/// Small integer in [-8, 8] for (seed, row, column).
fn small_int(seed: u32, r: usize, c: usize) -> f32 {
    let x = (seed as u64)
        .wrapping_add(r as u64 * 31)
        .wrapping_add(c as u64 * 7)
        % 17;
    x as f32 - 8.0
}

fn custom_partition(bits: u64, n: usize) -> usize {
    (bits.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 59) as usize % n
}

struct Runner<K: TestKey> {
    var: Variable<K>,
    /// Untouched variable with the same random initializer: its lookups give
    /// the initializer row of any key.
    twin: Option<Variable<K>>,
    init: InitKind,
    dim: usize,
    shards: usize,
    custom: bool,
    approx: bool,
    model: HashMap<u64, Vec<f32>>,
}

impl<K: TestKey> Runner<K> {
    fn new(case: &Case) -> Self {
        let make = |name: &str| {
            let init = match case.init {
                InitKind::Zeros => Initializer::Zeros,
                InitKind::Constant(c) => Initializer::Constant(c as f32),
                InitKind::Values(s) => {
                    Initializer::Values((0..case.dim).map(|c| small_int(s, 0, c)).collect())
                }
                InitKind::Uniform(seed) => Initializer::RandomUniform {
                    low: -1.0,
                    high: 1.0,
                    seed,
                },
            };
            let mut b = Variable::<K>::builder(name)
                .dim(case.dim)
                .shards(case.shards)
                .init_size(1)
                .initializer(init);
            if case.custom_partitioner {
                b = b.partitioner(Partitioner::Custom(Arc::new(custom_partition)));
            }
            b.build().expect("build")
        };
        Runner {
            var: make("model"),
            twin: matches!(case.init, InitKind::Uniform(_)).then(|| make("twin")),
            init: case.init.clone(),
            dim: case.dim,
            shards: case.shards,
            custom: case.custom_partitioner,
            approx: matches!(case.init, InitKind::Uniform(_)),
            model: HashMap::new(),
        }
    }

    fn init_row(&self, k: K) -> Vec<f32> {
        match self.init {
            InitKind::Zeros => vec![0.0; self.dim],
            InitKind::Constant(c) => vec![c as f32; self.dim],
            InitKind::Values(s) => (0..self.dim).map(|c| small_int(s, 0, c)).collect(),
            InitKind::Uniform(_) => {
                let twin = self.twin.as_ref().unwrap();
                let mut out = vec![0.0; self.dim];
                twin.lookup(&[k], &mut out).unwrap();
                assert_eq!(twin.size(), 0, "lookup inserted into the twin");
                assert!(out.iter().all(|x| (-1.0..=1.0).contains(x)), "{out:?}");
                out
            }
        }
    }

    fn expected_row(&self, k: K) -> Vec<f32> {
        match self.model.get(&k.to_bits()) {
            Some(r) => r.clone(),
            None => self.init_row(k),
        }
    }

    fn assert_rows(&self, what: &str, keys: &[K], got: &[f32], want: &[f32]) {
        assert_eq!(got.len(), want.len());
        for (i, k) in keys.iter().enumerate() {
            let g = &got[i * self.dim..(i + 1) * self.dim];
            let w = &want[i * self.dim..(i + 1) * self.dim];
            let ok = if self.approx {
                g.iter()
                    .zip(w)
                    .all(|(a, b)| (a - b).abs() <= 1e-4 * b.abs().max(1.0))
            } else {
                g == w
            };
            assert!(
                ok,
                "{what}: key {k} (#{i} of {keys:?}): got {g:?}, want {w:?}"
            );
        }
    }

    fn shard_of(&self, k: K) -> usize {
        if self.custom {
            custom_partition(k.to_bits(), self.shards)
        } else {
            k.value().rem_euclid(self.shards as i128) as usize
        }
    }

    fn check_sizes(&self) {
        assert_eq!(self.var.size(), self.model.len(), "size()");
        let mut per_shard = vec![0usize; self.shards];
        for &bits in self.model.keys() {
            per_shard[self.shard_of(K::from_bits(bits))] += 1;
        }
        for (s, &n) in per_shard.iter().enumerate() {
            assert_eq!(self.var.shard_size(s).unwrap(), n, "shard_size({s})");
        }
    }

    fn check_export(&self) {
        let (keys, values) = self.var.export().unwrap();
        assert_eq!(values.len(), keys.len() * self.dim);
        let mut seen = HashMap::new();
        for (i, k) in keys.iter().enumerate() {
            let r = values[i * self.dim..(i + 1) * self.dim].to_vec();
            assert!(
                seen.insert(k.to_bits(), r).is_none(),
                "export: key {k} twice"
            );
        }
        self.check_map("export", &seen);
    }

    fn check_map(&self, what: &str, got: &HashMap<u64, Vec<f32>>) {
        assert_eq!(got.len(), self.model.len(), "{what}: row count");
        for (bits, want) in &self.model {
            let k = K::from_bits(*bits);
            let g = got
                .get(bits)
                .unwrap_or_else(|| panic!("{what}: key {k} missing"));
            self.assert_rows(what, &[k], g, want);
        }
    }

    fn apply(&mut self, op: &Op) {
        let dim = self.dim;
        let keys_of = |idx: &[usize]| idx.iter().map(|&i| K::nth(i)).collect::<Vec<K>>();
        match op {
            Op::Lookup(idx) => {
                let keys = keys_of(idx);
                let want: Vec<f32> = keys.iter().flat_map(|&k| self.expected_row(k)).collect();
                let mut out = vec![f32::NAN; keys.len() * dim];
                self.var.lookup(&keys, &mut out).unwrap();
                self.assert_rows("lookup", &keys, &out, &want);
            }
            Op::LookupWithExists(idx) => {
                let keys = keys_of(idx);
                let want: Vec<f32> = keys.iter().flat_map(|&k| self.expected_row(k)).collect();
                let want_exists: Vec<bool> = keys
                    .iter()
                    .map(|k| self.model.contains_key(&k.to_bits()))
                    .collect();
                let mut out = vec![f32::NAN; keys.len() * dim];
                let mut exists = vec![false; keys.len()];
                self.var
                    .lookup_with_exists(&keys, &mut out, &mut exists)
                    .unwrap();
                assert_eq!(exists, want_exists, "lookup_with_exists flags for {keys:?}");
                self.assert_rows("lookup_with_exists", &keys, &out, &want);
            }
            Op::LookupOrInsert(idx) => {
                let keys = keys_of(idx);
                for &k in &keys {
                    if !self.model.contains_key(&k.to_bits()) {
                        let r = self.init_row(k);
                        self.model.insert(k.to_bits(), r);
                    }
                }
                let want: Vec<f32> = keys.iter().flat_map(|&k| self.expected_row(k)).collect();
                let mut out = vec![f32::NAN; keys.len() * dim];
                self.var.lookup_or_insert(&keys, &mut out).unwrap();
                self.assert_rows("lookup_or_insert", &keys, &out, &want);
            }
            Op::Upsert(idx, seed) => {
                let keys = keys_of(idx);
                let values: Vec<f32> = (0..keys.len())
                    .flat_map(|r| (0..dim).map(move |c| small_int(*seed, r, c)))
                    .collect();
                self.var.upsert(&keys, &values).unwrap();
                for (r, k) in keys.iter().enumerate() {
                    self.model
                        .insert(k.to_bits(), values[r * dim..(r + 1) * dim].to_vec());
                }
            }
            Op::Accum(idx, seed, flags) => {
                let keys = keys_of(idx);
                let deltas: Vec<f32> = (0..keys.len())
                    .flat_map(|r| (0..dim).map(move |c| small_int(seed.wrapping_add(1), r, c)))
                    .collect();
                let exists: Vec<bool> = match flags {
                    Flags::Truth => {
                        let mut out = vec![0.0; keys.len() * dim];
                        let mut e = vec![false; keys.len()];
                        self.var
                            .lookup_with_exists(&keys, &mut out, &mut e)
                            .unwrap();
                        e
                    }
                    Flags::Random(bits) => {
                        idx.iter().map(|&i| (bits >> (i % 64)) & 1 == 1).collect()
                    }
                };
                self.var.accum(&keys, &deltas, &exists).unwrap();
                // Presence is decided by the state before the batch.
                let before: Vec<bool> = keys
                    .iter()
                    .map(|k| self.model.contains_key(&k.to_bits()))
                    .collect();
                for (r, k) in keys.iter().enumerate() {
                    let d = &deltas[r * dim..(r + 1) * dim];
                    match (before[r], exists[r]) {
                        (true, true) => {
                            let row = self.model.get_mut(&k.to_bits()).unwrap();
                            for (x, y) in row.iter_mut().zip(d) {
                                *x += y;
                            }
                        }
                        (false, false) => {
                            let row = self
                                .model
                                .entry(k.to_bits())
                                .or_insert_with(|| vec![0.0; dim]);
                            for (x, y) in row.iter_mut().zip(d) {
                                *x += y;
                            }
                        }
                        _ => {}
                    }
                }
            }
            Op::Remove(idx) => {
                let keys = keys_of(idx);
                self.var.remove(&keys).unwrap();
                for k in &keys {
                    self.model.remove(&k.to_bits());
                }
            }
            Op::Clear => {
                self.var.clear();
                self.model.clear();
            }
            Op::Export => self.check_export(),
            Op::ExportChunks(n) => {
                let mut seen = HashMap::new();
                for item in self.var.export_chunks(*n) {
                    let (keys, values) = item.unwrap();
                    assert!(keys.len() <= *n, "chunk of {} rows, limit {n}", keys.len());
                    assert_eq!(values.len(), keys.len() * dim);
                    for (i, k) in keys.iter().enumerate() {
                        let r = values[i * dim..(i + 1) * dim].to_vec();
                        assert!(
                            seen.insert(k.to_bits(), r).is_none(),
                            "export_chunks: {k} twice"
                        );
                    }
                }
                self.check_map("export_chunks", &seen);
            }
            Op::Size => self.check_sizes(),
        }
        assert_eq!(self.var.size(), self.model.len(), "size() after {op:?}");
    }
}

fn run_typed<K: TestKey>(case: &Case) {
    // The key table must be injective for the model to make sense.
    let mut bits: Vec<u64> = (0..40).map(|i| K::nth(i).to_bits()).collect();
    bits.sort_unstable();
    bits.dedup();
    assert_eq!(
        bits.len(),
        40,
        "test key table of {} is not injective",
        K::TYPE_NAME
    );

    let mut runner = Runner::<K>::new(case);
    for op in &case.ops {
        runner.apply(op);
    }
    runner.check_sizes();
    runner.check_export();
    // Every key of the space reads what the model says.
    let keys: Vec<K> = (0..40).map(K::nth).collect();
    let want: Vec<f32> = keys.iter().flat_map(|&k| runner.expected_row(k)).collect();
    let mut out = vec![0.0; keys.len() * case.dim];
    runner.var.lookup(&keys, &mut out).unwrap();
    runner.assert_rows("final lookup", &keys, &out, &want);
}

fn run(case: Case) {
    match case.key_type {
        0 => run_typed::<i64>(&case),
        1 => run_typed::<u64>(&case),
        2 => run_typed::<i32>(&case),
        _ => run_typed::<u32>(&case),
    }
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 64,
        // Never write regression files into the source tree.
        failure_persistence: None,
        max_shrink_iters: 2048,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn single_shard_matches_hashmap_model(case in case_strategy(false)) {
        run(case);
    }

    #[test]
    fn multi_shard_matches_hashmap_model(case in case_strategy(true)) {
        run(case);
    }
}

/// A fixed long sequence on the largest dim with a tiny key space: many
/// duplicates, many resizes after clears.
#[test]
fn long_fixed_sequence_matches_model() {
    let mut ops = Vec::new();
    for i in 0..2000usize {
        let b: Vec<usize> = (0..(i % 11)).map(|j| (i * 7 + j * 13) % 9).collect();
        ops.push(match i % 9 {
            0 => Op::LookupOrInsert(b),
            1 => Op::Accum(b, i as u32, Flags::Truth),
            2 => Op::Accum(b, i as u32, Flags::Random(i as u64 * 0x9E37_79B9)),
            3 => Op::Upsert(b, i as u32),
            4 => Op::Remove(b),
            5 => Op::LookupWithExists(b),
            6 => Op::Lookup(b),
            7 if i % 500 == 7 => Op::Clear,
            7 => Op::ExportChunks(1 + i % 4),
            _ => Op::Size,
        });
    }
    for (key_type, shards, custom) in [
        (0u8, 1usize, false),
        (1, 3, true),
        (2, 2, false),
        (3, 3, false),
    ] {
        run(Case {
            key_type,
            dim: 130,
            init: InitKind::Constant(2),
            shards,
            custom_partitioner: custom,
            ops: ops.clone(),
        });
    }
}
