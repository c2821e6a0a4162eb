//! The model-based contract of an embedding table, run on every storage:
//! random sequences of every operation of [`EmbeddingTable`] against a
//! `HashMap<u64, Vec<f32>>` model of TFRA's semantics, and a second model
//! of slots, scores and `restrict`. A storage enters through a [`Maker`]
//! of its tables (any [`EmbeddingTable`]); `dynemb` runs it on `Variable`,
//! `dynemb-redis` on `RedisVariable`.
//!
//! What the first model checks:
//! - `lookup` / `lookup_with_exists` never insert; missing keys read the
//!   initializer's row (deterministic per key for a random initializer),
//!   and `lookup_with_exists` flags exactly the present keys;
//! - `lookup_or_insert` inserts missing keys with the initializer's row;
//! - `upsert`: a key repeated in one batch, the last one wins;
//! - `accum` (bp_v2): present && exists -> row += delta, absent && !exists ->
//!   insert delta, otherwise ignored; a key repeated in one batch adds every
//!   delta (the exists flags of one key are the same within a batch, as they
//!   are when they come from `lookup_with_exists`);
//! - `remove` ignores absent keys, `clear` empties everything;
//! - `size` counts the rows, and a store with shards puts each key in the
//!   shard its partitioner names ([`Maker::shard_sizes`]);
//! - `export` / `export_chunks` return every row exactly once, chunks of
//!   at most the size asked for.
//!
//! Values are small integers stored as f32 so every sum is exact. Key
//! spaces are small so hits and misses both happen, and they include 0,
//! MIN, MAX and negative keys. Shards and custom partitioners are asked
//! for in a [`Spec`]; a storage without shards ignores them (its
//! [`Maker::shard_sizes`] says `None`).
//!
//! The second model (`slots_and_scores_*`) adds optimizer slots and a
//! Frequency restrict policy: `create_slot` (a fixed set of names and
//! initial values: the same id again, slot names in creation order, each
//! slot's initial value), `update_rows` with a deterministic integer update
//! of the row and the listed slots (each position called once, with the
//! row and slots as the model has them), `lookup_slot` (a slot not created
//! yet is `Error::UnknownSlot`), `lookup_scores` and `restrict`, mixed with
//! inserts, upserts, accumulations and removals. Scores are modelled
//! exactly (an insert counts 1, every upsert, applied accumulation and
//! update one per occurrence, reads nothing); for `restrict` the model
//! checks the number removed and that no removed row scored above a kept
//! one (ties at the boundary go either way), then follows the store.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dynemb::{
    Admission, EmbeddingStore, EmbeddingTable, Error, EvictListener, Evicted, Initializer, Key,
    LifecycleStats, RestrictPolicy, SlotId,
};
use proptest::collection::vec;
use proptest::prelude::*;

// ---------------------------------------------------------------- the store

/// What a case asks of a new table.
pub struct Spec {
    /// Unique among the tables of one case.
    pub name: &'static str,
    /// Values per row.
    pub dim: usize,
    /// How rows of missing keys are made.
    pub initializer: Initializer,
    /// The restrict policy (the slots-and-scores model asks for
    /// [`RestrictPolicy::Frequency`]).
    pub policy: Option<RestrictPolicy>,
    /// Shards (for storages that have them).
    pub shards: usize,
    /// Whether to partition with [`custom_partition`] (for storages with
    /// shards).
    pub custom_partitioner: bool,
}

/// Makes empty tables of one storage for the cases.
pub trait Maker {
    /// The storage's table of keys `K`.
    type Table<K: TestKey>: EmbeddingTable<Key = K>;

    /// A new, empty table as `spec` asks.
    fn make<K: TestKey>(&self, spec: Spec) -> Self::Table<K>;

    /// Rows in each shard of `table`, in shard order, for a storage with
    /// shards (the model checks them against the partitioner); `None`,
    /// the default, for one without.
    fn shard_sizes<K: TestKey>(&self, table: &Self::Table<K>) -> Option<Vec<usize>> {
        let _ = table;
        None
    }

    /// Disposes of a table when its case ends (default: drops it); a
    /// storage outside this process removes the table's data here.
    fn discard<K: TestKey>(&self, table: Self::Table<K>) {
        drop(table);
    }
}

// ---------------------------------------------------------------- keys

/// Maps a small index to a key of the type, edge values first.
pub trait TestKey: Key + std::fmt::Display {
    /// The `i`th key of the test key space (injective over `0..40`).
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

/// The initializer of a case's tables.
#[derive(Clone, Debug)]
pub enum InitKind {
    /// [`Initializer::Zeros`].
    Zeros,
    /// [`Initializer::Constant`].
    Constant(i8),
    /// Integer-valued row derived from the seed.
    Values(u32),
    /// RandomUniform with this seed: compared with a tolerance, the expected
    /// row of a missing key comes from an untouched twin variable.
    Uniform(u64),
}

/// The `exists` flags of an `accum`.
#[derive(Clone, Debug)]
pub enum Flags {
    /// The flags `lookup_with_exists` reports right before the accum.
    Truth,
    /// Random flags, the same for every occurrence of a key in the batch.
    Random(u64),
}

/// An operation of the first model, on keys given by their index in the
/// key space ([`TestKey::nth`]); values and deltas seeded by the `u32`.
#[derive(Clone, Debug)]
pub enum Op {
    /// `lookup`.
    Lookup(Vec<usize>),
    /// `lookup_with_exists`.
    LookupWithExists(Vec<usize>),
    /// `lookup_or_insert`.
    LookupOrInsert(Vec<usize>),
    /// `upsert`.
    Upsert(Vec<usize>, u32),
    /// `accum`.
    Accum(Vec<usize>, u32, Flags),
    /// `remove`.
    Remove(Vec<usize>),
    /// `clear`.
    Clear,
    /// `export`.
    Export,
    /// `export_chunks` of chunks of at most this many rows.
    ExportChunks(usize),
    /// `size` (and the shards' sizes).
    Size,
}

/// A case of the first model: a key type, the tables' settings and the
/// operations.
#[derive(Clone, Debug)]
pub struct Case {
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

/// Cases of the first model, on one shard or (`multi_shard`) 2 or 3 with
/// the modulo or a custom partitioner.
pub fn case_strategy(multi_shard: bool) -> impl Strategy<Value = Case> {
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

/// The slots an `update_rows` op of a model test passes: those of `created`
/// (kind, id) whose kind's bit is set in `mask`, in creation order or
/// reversed; as their kinds and their ids.
pub fn listed_slots(
    created: &[(usize, SlotId)],
    mask: u8,
    reverse: bool,
) -> (Vec<usize>, Vec<SlotId>) {
    let mut listed: Vec<(usize, SlotId)> = created
        .iter()
        .copied()
        .filter(|&(kind, _)| mask >> kind & 1 == 1)
        .collect();
    if reverse {
        listed.reverse();
    }
    listed.into_iter().unzip()
}

/// The custom partitioner a [`Spec`] may ask for: `(key bits, shards) ->
/// shard`.
pub fn custom_partition(bits: u64, n: usize) -> usize {
    (bits.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 59) as usize % n
}

struct Runner<'m, M: Maker, K: TestKey> {
    maker: &'m M,
    var: M::Table<K>,
    /// Untouched variable with the same random initializer: its lookups give
    /// the initializer row of any key.
    twin: Option<M::Table<K>>,
    init: InitKind,
    dim: usize,
    shards: usize,
    custom: bool,
    approx: bool,
    model: HashMap<u64, Vec<f32>>,
}

impl<'m, M: Maker, K: TestKey> Runner<'m, M, K> {
    fn new(maker: &'m M, case: &Case) -> Self {
        let make = |name: &'static str| {
            let initializer = match case.init {
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
            maker.make::<K>(Spec {
                name,
                dim: case.dim,
                initializer,
                policy: None,
                shards: case.shards,
                custom_partitioner: case.custom_partitioner,
            })
        };
        Runner {
            maker,
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
                assert_eq!(twin.size().unwrap(), 0, "lookup inserted into the twin");
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
        assert_eq!(self.var.size().unwrap(), self.model.len(), "size()");
        let Some(sizes) = self.maker.shard_sizes(&self.var) else {
            return;
        };
        let mut per_shard = vec![0usize; self.shards];
        for &bits in self.model.keys() {
            per_shard[self.shard_of(K::from_bits(bits))] += 1;
        }
        assert_eq!(sizes, per_shard, "shard sizes");
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
                self.var.clear().unwrap();
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
        assert_eq!(
            self.var.size().unwrap(),
            self.model.len(),
            "size() after {op:?}"
        );
    }
}

fn run_typed<K: TestKey, M: Maker>(maker: &M, case: &Case) {
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

    let mut runner = Runner::<M, K>::new(maker, case);
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
    maker.discard(runner.var);
    if let Some(twin) = runner.twin {
        maker.discard(twin);
    }
}

/// Runs a case of the first model on stores from `maker`.
pub fn run<M: Maker>(maker: &M, case: Case) {
    match case.key_type {
        0 => run_typed::<i64, M>(maker, &case),
        1 => run_typed::<u64, M>(maker, &case),
        2 => run_typed::<i32, M>(maker, &case),
        _ => run_typed::<u32, M>(maker, &case),
    }
}

/// The proptest settings of the models, with `cases` cases (or as many
/// as the `PROPTEST_CASES` environment variable says, for a longer run).
pub fn config(cases: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(cases);
    ProptestConfig {
        cases,
        // Never write regression files into the source tree.
        failure_persistence: None,
        max_shrink_iters: 2048,
        ..ProptestConfig::default()
    }
}

/// A fixed long sequence on the largest dim with a tiny key space: many
/// duplicates, many resizes after clears.
pub fn long_fixed_sequence<M: Maker>(maker: &M) {
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
        run(
            maker,
            Case {
                key_type,
                dim: 130,
                init: InitKind::Constant(2),
                shards,
                custom_partitioner: custom,
                ops: ops.clone(),
            },
        );
    }
}

// ---------------------------------------------------------------- slots and scores

/// The slots a case may create: (name, initial value).
const SLOTS: [(&str, f32); 3] = [("m", 0.0), ("v", 0.5), ("acc", -1.0)];

/// An operation of the slots-and-scores model, on keys given by their
/// index in the key space ([`TestKey::nth`]).
#[derive(Clone, Debug)]
pub enum SlotOp {
    /// Creates `SLOTS[i]` (again: the same id).
    CreateSlot(usize),
    /// `update_rows` of the keys with the created slots whose bit is set in
    /// the mask (in reverse creation order if `reverse`), update seeded by
    /// the `u32`.
    UpdateRows(Vec<usize>, u8, bool, u32),
    /// `lookup_slot` of `SLOTS[i]` (`UnknownSlot` if not created yet).
    LookupSlot(usize, Vec<usize>),
    /// `lookup_scores`.
    LookupScores(Vec<usize>),
    /// `lookup`.
    Lookup(Vec<usize>),
    /// `lookup_or_insert`.
    LookupOrInsert(Vec<usize>),
    /// `upsert`, values seeded by the `u32`.
    Upsert(Vec<usize>, u32),
    /// `accum`, deltas seeded by the `u32`.
    Accum(Vec<usize>, u32, Flags),
    /// `remove`.
    Remove(Vec<usize>),
    /// `restrict(num_reserved, trigger)`.
    Restrict(usize, usize),
    /// `export`.
    Export,
}

/// A case of the slots-and-scores model: a key type, the table's settings
/// and the operations.
#[derive(Clone, Debug)]
pub struct SlotCase {
    key_type: u8,
    dim: usize,
    init: i8,
    shards: usize,
    custom_partitioner: bool,
    ops: Vec<SlotOp>,
}

fn slot_op_strategy(n: usize) -> impl Strategy<Value = SlotOp> {
    prop_oneof![
        2 => (0usize..SLOTS.len()).prop_map(SlotOp::CreateSlot),
        6 => (batch(n), any::<u8>(), any::<bool>(), any::<u32>())
            .prop_map(|(k, m, r, s)| SlotOp::UpdateRows(k, m, r, s)),
        3 => ((0usize..SLOTS.len()), batch(n)).prop_map(|(s, k)| SlotOp::LookupSlot(s, k)),
        3 => batch(n).prop_map(SlotOp::LookupScores),
        2 => batch(n).prop_map(SlotOp::Lookup),
        2 => batch(n).prop_map(SlotOp::LookupOrInsert),
        3 => (batch(n), any::<u32>()).prop_map(|(k, s)| SlotOp::Upsert(k, s)),
        2 => (batch(n), any::<u32>()).prop_map(|(k, s)| SlotOp::Accum(k, s, Flags::Truth)),
        1 => (batch(n), any::<u32>(), any::<u64>())
            .prop_map(|(k, s, f)| SlotOp::Accum(k, s, Flags::Random(f))),
        3 => batch(n).prop_map(SlotOp::Remove),
        2 => ((0..n + 2), prop_oneof![Just(0usize), 0..n + 2])
            .prop_map(|(r, t)| SlotOp::Restrict(r, t)),
        1 => Just(SlotOp::Export),
    ]
}

/// Cases of the slots-and-scores model, on 1 to 3 shards.
pub fn slot_case_strategy() -> impl Strategy<Value = SlotCase> {
    (
        0u8..4,
        prop_oneof![Just(1usize), Just(3), Just(8)],
        -3i8..=3,
        1usize..=3,
        any::<bool>(),
        1usize..30,
    )
        .prop_flat_map(|(key_type, dim, init, shards, custom, key_space)| {
            vec(slot_op_strategy(key_space), 1..MAX_OPS).prop_map(move |ops| SlotCase {
                key_type,
                dim,
                init,
                shards,
                custom_partitioner: custom && shards > 1,
                ops,
            })
        })
}

/// A non-zero small integer (deltas that always change the row).
fn nonzero_int(seed: u32, r: usize, c: usize) -> f32 {
    let x = small_int(seed, r, c);
    if x == 0.0 {
        1.0
    } else {
        x
    }
}

/// The deterministic optimizer step of `SlotOp::UpdateRows`: the row gets a
/// small integer per element, then each listed slot (whose `SLOTS` index is
/// `kinds[j]`) adds the new value times `kind + 1`. Used by the closure and
/// by the model alike (same operations, same order: bit-exact).
fn slot_step(seed: u32, pos: usize, kinds: &[usize], values: &mut [f32], slots: &mut [f32]) {
    let dim = values.len();
    for (c, x) in values.iter_mut().enumerate() {
        *x += small_int(seed, pos, c);
    }
    for (j, &kind) in kinds.iter().enumerate() {
        for c in 0..dim {
            slots[j * dim + c] += values[c] * (kind as f32 + 1.0);
        }
    }
}

#[derive(Clone, Debug)]
struct ModelRow {
    values: Vec<f32>,
    /// Per `SLOTS` index; `None` reads the slot's initial value.
    slots: [Option<Vec<f32>>; 3],
    score: u64,
}

struct SlotRunner<M: Maker, K: TestKey> {
    var: M::Table<K>,
    dim: usize,
    init: f32,
    /// `SLOTS` indexes in creation order, with their ids.
    created: Vec<(usize, SlotId)>,
    model: HashMap<u64, ModelRow>,
}

impl<M: Maker, K: TestKey> SlotRunner<M, K> {
    fn new(maker: &M, case: &SlotCase) -> Self {
        SlotRunner {
            var: maker.make::<K>(Spec {
                name: "slot_model",
                dim: case.dim,
                initializer: Initializer::Constant(case.init as f32),
                policy: Some(RestrictPolicy::Frequency),
                shards: case.shards,
                custom_partitioner: case.custom_partitioner,
            }),
            dim: case.dim,
            init: case.init as f32,
            created: Vec::new(),
            model: HashMap::new(),
        }
    }

    fn fresh_row(&self) -> ModelRow {
        ModelRow {
            values: vec![self.init; self.dim],
            slots: [None, None, None],
            score: 0,
        }
    }

    fn slot_of(&self, kind: usize) -> Option<SlotId> {
        self.created
            .iter()
            .find(|&&(k, _)| k == kind)
            .map(|&(_, id)| id)
    }

    fn model_slot(&self, kind: usize, key: K) -> Vec<f32> {
        self.model
            .get(&key.to_bits())
            .and_then(|row| row.slots[kind].clone())
            .unwrap_or_else(|| vec![SLOTS[kind].1; self.dim])
    }

    fn model_values(&self, key: K) -> Vec<f32> {
        self.model
            .get(&key.to_bits())
            .map_or_else(|| vec![self.init; self.dim], |row| row.values.clone())
    }

    fn model_score(&self, key: K) -> u64 {
        self.model.get(&key.to_bits()).map_or(0, |row| row.score)
    }

    fn check_lookup(&self, what: &str, keys: &[K]) {
        let mut out = vec![f32::NAN; keys.len() * self.dim];
        self.var.lookup(keys, &mut out).unwrap();
        let want: Vec<f32> = keys.iter().flat_map(|&k| self.model_values(k)).collect();
        assert_eq!(out, want, "{what}: lookup of {keys:?}");
    }

    fn check_slot(&self, what: &str, kind: usize, keys: &[K]) {
        let Some(id) = self.slot_of(kind) else {
            assert!(
                matches!(
                    self.var.slot_id(SLOTS[kind].0),
                    Err(Error::UnknownSlot { .. })
                ),
                "{what}: slot {} not created yet",
                SLOTS[kind].0
            );
            return;
        };
        assert_eq!(self.var.slot_id(SLOTS[kind].0).unwrap(), id);
        let mut out = vec![f32::NAN; keys.len() * self.dim];
        self.var.lookup_slot(id, keys, &mut out).unwrap();
        let want: Vec<f32> = keys
            .iter()
            .flat_map(|&k| self.model_slot(kind, k))
            .collect();
        assert_eq!(out, want, "{what}: slot {} of {keys:?}", SLOTS[kind].0);
    }

    fn check_scores(&self, what: &str, keys: &[K]) {
        let mut out = vec![u64::MAX; keys.len()];
        self.var.lookup_scores(keys, &mut out).unwrap();
        let want: Vec<u64> = keys.iter().map(|&k| self.model_score(k)).collect();
        assert_eq!(out, want, "{what}: scores of {keys:?}");
    }

    fn apply(&mut self, op: &SlotOp) {
        let dim = self.dim;
        let keys_of = |idx: &[usize]| idx.iter().map(|&i| K::nth(i)).collect::<Vec<K>>();
        match op {
            SlotOp::CreateSlot(kind) => {
                let (name, initial) = SLOTS[*kind];
                let id = self.var.create_slot(name, initial).unwrap();
                match self.slot_of(*kind) {
                    Some(existing) => assert_eq!(id, existing, "create_slot {name} again"),
                    None => {
                        assert_eq!(id.index(), self.created.len(), "slot index of {name}");
                        self.created.push((*kind, id));
                    }
                }
                let names: Vec<&str> = self.created.iter().map(|&(k, _)| SLOTS[k].0).collect();
                assert_eq!(self.var.slot_names().unwrap(), names);
                assert_eq!(self.var.slot_initial(id).unwrap(), initial);
            }
            SlotOp::UpdateRows(idx, mask, reverse, seed) => {
                let keys = keys_of(idx);
                let (kinds, ids) = listed_slots(&self.created, *mask, *reverse);
                // The model, in batch order (each key's occurrences in order).
                let mut expected_inputs = Vec::with_capacity(keys.len());
                for (pos, &k) in keys.iter().enumerate() {
                    let mut row = self
                        .model
                        .remove(&k.to_bits())
                        .unwrap_or_else(|| self.fresh_row());
                    let mut slots: Vec<f32> = kinds
                        .iter()
                        .flat_map(|&kind| {
                            row.slots[kind]
                                .clone()
                                .unwrap_or_else(|| vec![SLOTS[kind].1; dim])
                        })
                        .collect();
                    expected_inputs.push((row.values.clone(), slots.clone()));
                    slot_step(*seed, pos, &kinds, &mut row.values, &mut slots);
                    for (j, &kind) in kinds.iter().enumerate() {
                        row.slots[kind] = Some(slots[j * dim..(j + 1) * dim].to_vec());
                    }
                    row.score += 1;
                    self.model.insert(k.to_bits(), row);
                }
                let mut calls = vec![0usize; keys.len()];
                self.var
                    .update_rows(&keys, &ids, |pos, values, slots| {
                        calls[pos] += 1;
                        let (want_values, want_slots) = &expected_inputs[pos];
                        assert_eq!(values, &want_values[..], "update_rows input row #{pos}");
                        assert_eq!(slots, &want_slots[..], "update_rows input slots #{pos}");
                        slot_step(*seed, pos, &kinds, values, slots);
                    })
                    .unwrap();
                assert!(calls.iter().all(|&c| c == 1), "positions called {calls:?}");
            }
            SlotOp::LookupSlot(kind, idx) => {
                let keys = keys_of(idx);
                self.check_slot("lookup_slot", *kind, &keys);
            }
            SlotOp::LookupScores(idx) => self.check_scores("lookup_scores", &keys_of(idx)),
            SlotOp::Lookup(idx) => self.check_lookup("lookup", &keys_of(idx)),
            SlotOp::LookupOrInsert(idx) => {
                let keys = keys_of(idx);
                for &k in &keys {
                    if !self.model.contains_key(&k.to_bits()) {
                        let mut row = self.fresh_row();
                        row.score = 1;
                        self.model.insert(k.to_bits(), row);
                    }
                }
                let mut out = vec![f32::NAN; keys.len() * dim];
                self.var.lookup_or_insert(&keys, &mut out).unwrap();
                let want: Vec<f32> = keys.iter().flat_map(|&k| self.model_values(k)).collect();
                assert_eq!(out, want, "lookup_or_insert of {keys:?}");
            }
            SlotOp::Upsert(idx, seed) => {
                let keys = keys_of(idx);
                let values: Vec<f32> = (0..keys.len())
                    .flat_map(|r| (0..dim).map(move |c| small_int(*seed, r, c)))
                    .collect();
                self.var.upsert(&keys, &values).unwrap();
                for (r, k) in keys.iter().enumerate() {
                    let fresh = self.fresh_row();
                    let row = self.model.entry(k.to_bits()).or_insert(fresh);
                    row.values = values[r * dim..(r + 1) * dim].to_vec();
                    row.score += 1;
                }
            }
            SlotOp::Accum(idx, seed, flags) => {
                let keys = keys_of(idx);
                let deltas: Vec<f32> = (0..keys.len())
                    .flat_map(|r| (0..dim).map(move |c| nonzero_int(*seed, r, c)))
                    .collect();
                let before: Vec<bool> = keys
                    .iter()
                    .map(|k| self.model.contains_key(&k.to_bits()))
                    .collect();
                let exists: Vec<bool> = match flags {
                    Flags::Truth => before.clone(),
                    Flags::Random(bits) => {
                        idx.iter().map(|&i| (bits >> (i % 64)) & 1 == 1).collect()
                    }
                };
                self.var.accum(&keys, &deltas, &exists).unwrap();
                for (r, k) in keys.iter().enumerate() {
                    let d = &deltas[r * dim..(r + 1) * dim];
                    match (before[r], exists[r]) {
                        (true, true) => {
                            let row = self.model.get_mut(&k.to_bits()).unwrap();
                            for (x, y) in row.values.iter_mut().zip(d) {
                                *x += y;
                            }
                            row.score += 1;
                        }
                        (false, false) => {
                            let mut fresh = self.fresh_row();
                            fresh.values = vec![0.0; dim];
                            let row = self.model.entry(k.to_bits()).or_insert(fresh);
                            for (x, y) in row.values.iter_mut().zip(d) {
                                *x += y;
                            }
                            row.score += 1;
                        }
                        _ => {}
                    }
                }
            }
            SlotOp::Remove(idx) => {
                let keys = keys_of(idx);
                self.var.remove(&keys).unwrap();
                for k in &keys {
                    self.model.remove(&k.to_bits());
                }
            }
            SlotOp::Restrict(num_reserved, trigger) => {
                let len = self.model.len();
                let want_removed = if len <= *trigger {
                    0
                } else {
                    len.saturating_sub(*num_reserved)
                };
                let removed = self.var.restrict(*num_reserved, *trigger).unwrap();
                assert_eq!(
                    removed, want_removed,
                    "restrict({num_reserved}, {trigger}) of {len} rows"
                );
                let all: Vec<u64> = self.model.keys().copied().collect();
                let keys: Vec<K> = all.iter().map(|&b| K::from_bits(b)).collect();
                let mut out = vec![0.0; keys.len() * dim];
                let mut exists = vec![false; keys.len()];
                self.var
                    .lookup_with_exists(&keys, &mut out, &mut exists)
                    .unwrap();
                let (mut kept_min, mut removed_max) = (u64::MAX, 0);
                let mut gone = 0;
                for (bits, &present) in all.iter().zip(&exists) {
                    let score = self.model[bits].score;
                    if present {
                        kept_min = kept_min.min(score);
                    } else {
                        removed_max = removed_max.max(score);
                        gone += 1;
                        self.model.remove(bits);
                    }
                }
                assert_eq!(gone, removed, "rows missing after restrict");
                assert!(
                    gone == 0 || removed_max <= kept_min,
                    "restrict removed a row scored {removed_max} but kept one scored {kept_min}"
                );
            }
            SlotOp::Export => {
                let (keys, values) = self.var.export().unwrap();
                assert_eq!(keys.len(), self.model.len(), "export row count");
                for (i, k) in keys.iter().enumerate() {
                    let row = self
                        .model
                        .get(&k.to_bits())
                        .unwrap_or_else(|| panic!("export: unexpected key {k}"));
                    assert_eq!(values[i * dim..(i + 1) * dim], row.values, "export of {k}");
                }
            }
        }
        assert_eq!(
            self.var.size().unwrap(),
            self.model.len(),
            "size() after {op:?}"
        );
    }

    /// Every key of the space: values, every slot (created or not) and score.
    fn check_all(&self) {
        let keys: Vec<K> = (0..40).map(K::nth).collect();
        self.check_lookup("final", &keys);
        for kind in 0..SLOTS.len() {
            self.check_slot("final", kind, &keys);
        }
        self.check_scores("final", &keys);
    }
}

fn run_slot_typed<K: TestKey, M: Maker>(maker: &M, case: &SlotCase) {
    let mut runner = SlotRunner::<M, K>::new(maker, case);
    for op in &case.ops {
        runner.apply(op);
    }
    runner.check_all();
    maker.discard(runner.var);
}

/// Runs a case of the slots-and-scores model on a store from `maker`.
pub fn run_slots<M: Maker>(maker: &M, case: SlotCase) {
    match case.key_type {
        0 => run_slot_typed::<i64, M>(maker, &case),
        1 => run_slot_typed::<u64, M>(maker, &case),
        2 => run_slot_typed::<i32, M>(maker, &case),
        _ => run_slot_typed::<u32, M>(maker, &case),
    }
}

/// A fixed long sequence: slots created between writes, many updates,
/// removals and restricts over a tiny key space.
pub fn slots_and_scores_long_fixed_sequence<M: Maker>(maker: &M) {
    let mut ops = Vec::new();
    for i in 0..1500usize {
        let b: Vec<usize> = (0..(i % 9)).map(|j| (i * 5 + j * 11) % 13).collect();
        ops.push(match i % 10 {
            0 if i % 300 == 0 => SlotOp::CreateSlot((i / 300) % 3),
            0..=2 => SlotOp::UpdateRows(b, (i % 8) as u8, i % 4 == 1, i as u32),
            3 => SlotOp::Upsert(b, i as u32),
            4 => SlotOp::Accum(b, i as u32, Flags::Truth),
            5 => SlotOp::LookupSlot(i % 3, b),
            6 => SlotOp::Remove(b),
            7 if i % 70 == 7 => SlotOp::Restrict(i % 7, i % 5),
            7 => SlotOp::LookupOrInsert(b),
            8 => SlotOp::LookupScores(b),
            _ => SlotOp::Export,
        });
    }
    for (key_type, dim, shards, custom) in [
        (0u8, 3usize, 1usize, false),
        (1, 8, 3, true),
        (3, 1, 2, false),
    ] {
        run_slots(
            maker,
            SlotCase {
                key_type,
                dim,
                init: 1,
                shards,
                custom_partitioner: custom,
                ops: ops.clone(),
            },
        );
    }
}

// ---------------------------------------------------------------- lifecycle

/// What a lifecycle case asks of a new table besides its [`Spec`] (whose
/// `policy` is the case's restrict policy).
pub struct LifecycleSpec {
    /// Most rows the table holds.
    pub capacity: Option<usize>,
    /// When a key becomes a row.
    pub admission: Option<Admission>,
    /// Whether eviction ages Frequency counts.
    pub frequency_decay: bool,
    /// Receives the evicted rows (with a capacity).
    pub on_evict: Option<EvictListener>,
}

/// Makes tables with the lifecycle settings: a storage that honours a
/// capacity, admission and an eviction listener runs the lifecycle model
/// ([`run_lifecycle`]) through it.
pub trait LifecycleMaker: Maker {
    /// A new, empty table as `spec` and `lifecycle` ask.
    fn make_with_lifecycle<K: TestKey>(
        &self,
        spec: Spec,
        lifecycle: LifecycleSpec,
    ) -> Self::Table<K>;
}

/// Which lifecycle features the cases of [`lifecycle_case_strategy`] turn
/// on.
#[derive(Clone, Copy, Debug)]
pub struct Features {
    /// A small capacity (1 to 8 rows) with a listener.
    pub capacity: bool,
    /// `Admission::Exact` with `min_count` 1 to 3.
    pub admission: bool,
    /// The Timestamp policy and `expire` operations (else Frequency, and
    /// `expire` is refused).
    pub expiry: bool,
    /// 1 to 3 shards (else 1).
    pub shards: bool,
}

/// What an `expire` of the lifecycle model asks for.
#[derive(Clone, Copy, Debug)]
pub enum ExpireAge {
    /// `Duration::ZERO`: every row.
    Zero,
    /// `Duration::MAX`: no row.
    Max,
    /// An age that makes the cutoff fall just past the stamp of the
    /// present row at this rank (modulo the number of rows) in stamp
    /// order, as far as the clock lets a test aim.
    AtRank(usize),
}

/// An operation of the lifecycle model, on keys given by their index in
/// the key space ([`TestKey::nth`]).
#[derive(Clone, Debug)]
pub enum LifeOp {
    /// `lookup` (and `lookup_with_exists`).
    Lookup(Vec<usize>),
    /// `lookup_or_insert`: training reads.
    LookupOrInsert(Vec<usize>),
    /// `upsert`, values seeded by the `u32`.
    Upsert(Vec<usize>, u32),
    /// `accum`, deltas seeded by the `u32`.
    Accum(Vec<usize>, u32, Flags),
    /// `update_rows` with the created slots whose bit is set in the mask
    /// (in reverse creation order if `reverse`), seeded by the `u32`.
    UpdateRows(Vec<usize>, u8, bool, u32),
    /// Creates `SLOTS[i]`.
    CreateSlot(usize),
    /// `remove`.
    Remove(Vec<usize>),
    /// `clear`.
    Clear,
    /// `restrict(num_reserved, trigger)`.
    Restrict(usize, usize),
    /// `expire`.
    Expire(ExpireAge),
    /// `export`.
    Export,
}

/// A case of the lifecycle model: a table's settings and the operations
/// (built by [`lifecycle_case_strategy`], or by hand, as a fuzz target
/// does).
#[derive(Clone, Debug)]
pub struct LifecycleCase {
    /// 0: i64, 1: u64, 2: i32, else u32.
    pub key_type: u8,
    /// Values per row.
    pub dim: usize,
    /// The initializer ([`InitKind::Uniform`] is not exact, so not
    /// allowed).
    pub init: InitKind,
    /// Shards.
    pub shards: usize,
    /// Whether to partition with [`custom_partition`].
    pub custom_partitioner: bool,
    /// The capacity (at least one row per shard); a listener comes with it.
    pub capacity: Option<usize>,
    /// `Admission::Exact`'s `min_count`, if keys are admitted.
    pub min_count: Option<u32>,
    /// The restrict policy (Timestamp for `expire` to work).
    pub policy: RestrictPolicy,
    /// Whether eviction ages Frequency counts (with a capacity and the
    /// Frequency policy only).
    pub decay: bool,
    /// The operations, on keys `0..40` of the key space.
    pub ops: Vec<LifeOp>,
}

fn life_op_strategy(n: usize, expiry: bool) -> impl Strategy<Value = LifeOp> {
    let expire = if expiry {
        prop_oneof![
            1 => Just(ExpireAge::Zero),
            1 => Just(ExpireAge::Max),
            4 => (0usize..64).prop_map(ExpireAge::AtRank),
        ]
        .boxed()
    } else {
        Just(ExpireAge::Zero).boxed()
    };
    // Now and then a batch longer than the table's pipeline is deep, so
    // that its probes run ahead of the writes (and evictions) they see.
    let batch = move || {
        prop_oneof![
            4 => batch(n),
            1 => vec(0..n, MAX_BATCH..48),
        ]
    };
    prop_oneof![
        2 => batch().prop_map(LifeOp::Lookup),
        6 => batch().prop_map(LifeOp::LookupOrInsert),
        4 => (batch(), any::<u32>()).prop_map(|(k, s)| LifeOp::Upsert(k, s)),
        2 => (batch(), any::<u32>()).prop_map(|(k, s)| LifeOp::Accum(k, s, Flags::Truth)),
        2 => (batch(), any::<u32>(), any::<u64>())
            .prop_map(|(k, s, f)| LifeOp::Accum(k, s, Flags::Random(f))),
        4 => (batch(), any::<u8>(), any::<bool>(), any::<u32>())
            .prop_map(|(k, m, r, s)| LifeOp::UpdateRows(k, m, r, s)),
        1 => (0usize..SLOTS.len()).prop_map(LifeOp::CreateSlot),
        2 => batch().prop_map(LifeOp::Remove),
        1 => Just(LifeOp::Clear),
        1 => ((0..n + 2), prop_oneof![Just(0usize), 0..n + 2])
            .prop_map(|(r, t)| LifeOp::Restrict(r, t)),
        2 => expire.prop_map(LifeOp::Expire),
        1 => Just(LifeOp::Export),
    ]
}

/// Cases of the lifecycle model with `features` on: integer initializers
/// (exact rows), dims 1 to 4, a key space of 1 to 24 keys.
pub fn lifecycle_case_strategy(features: Features) -> impl Strategy<Value = LifecycleCase> {
    let shards = if features.shards {
        (1usize..=3).boxed()
    } else {
        Just(1usize).boxed()
    };
    let capacity = if features.capacity {
        (1usize..=8).prop_map(Some).boxed()
    } else {
        Just(None).boxed()
    };
    let min_count = if features.admission {
        (1u32..=3).prop_map(Some).boxed()
    } else {
        Just(None).boxed()
    };
    let init = prop_oneof![
        Just(InitKind::Zeros),
        (-4i8..=4).prop_map(InitKind::Constant),
        any::<u32>().prop_map(InitKind::Values),
    ];
    let expiry = features.expiry;
    (
        (0u8..4, 1usize..=4, init, shards, any::<bool>()),
        (capacity, min_count, any::<bool>(), 1usize..=24),
    )
        .prop_flat_map(
            move |((key_type, dim, init, shards, custom), (capacity, min_count, decay, keys))| {
                // A capacity holds at least one row per shard.
                let capacity = capacity.map(|c: usize| c.max(shards));
                let policy = if expiry {
                    RestrictPolicy::Timestamp
                } else {
                    RestrictPolicy::Frequency
                };
                let decay = decay && capacity.is_some() && policy == RestrictPolicy::Frequency;
                vec(life_op_strategy(keys, expiry), 1..120).prop_map(move |ops| LifecycleCase {
                    key_type,
                    dim,
                    init: init.clone(),
                    shards,
                    custom_partitioner: custom && shards > 1,
                    capacity,
                    min_count,
                    policy,
                    decay,
                    ops,
                })
            },
        )
}

/// One row the eviction listener received.
#[derive(Clone, Debug)]
struct DeliveredRow {
    bits: u64,
    values: Vec<f32>,
    /// Every slot column's row, by name, in creation order.
    slots: Vec<(String, Vec<f32>)>,
    score: u64,
}

/// The rows a listener received, in order.
type Deliveries = Arc<Mutex<Vec<DeliveredRow>>>;

/// A listener that records every row it receives, checking each batch's
/// shape.
fn recording_listener<K: TestKey>(dim: usize) -> (Deliveries, EvictListener) {
    let delivered: Deliveries = Arc::default();
    let sink = Arc::clone(&delivered);
    let listener = EvictListener::new::<K>(move |batch: Evicted<'_, K>| {
        assert!(!batch.is_empty(), "the listener got an empty batch");
        assert_eq!(batch.dim(), dim, "Evicted::dim");
        assert_eq!(batch.values().len(), batch.len() * dim, "Evicted::values");
        assert_eq!(batch.scores().len(), batch.len(), "Evicted::scores");
        assert_eq!(batch.slots().count(), batch.slot_names().len());
        let mut sink = sink
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (i, key) in batch.keys().iter().enumerate() {
            let rows = i * dim..(i + 1) * dim;
            let slots = batch
                .slots()
                .map(|(name, column)| {
                    assert_eq!(column.len(), batch.len() * dim, "slot {name}'s rows");
                    (name.to_string(), column[rows.clone()].to_vec())
                })
                .collect();
            sink.push(DeliveredRow {
                bits: key.to_bits(),
                values: batch.values()[rows].to_vec(),
                slots,
                score: batch.scores()[i],
            });
        }
    });
    (delivered, listener)
}

/// `(score, key index)` pairs.
type Scored = Vec<(u64, usize)>;

/// A row's score as the lifecycle model knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LifeScore {
    /// Frequency: the count of writes.
    Count(u64),
    /// Timestamp: the stamp observed.
    Stamp(u64),
    /// Timestamp: written by the current operation, stamp not seen yet.
    StampedNow,
}

/// A present row of the lifecycle model.
#[derive(Clone, Debug, PartialEq)]
struct LifeRow {
    values: Vec<f32>,
    /// Per `SLOTS` index; `None` reads the slot's initial value.
    slots: [Option<Vec<f32>>; 3],
    score: LifeScore,
}

/// One possible state of a key: its row if present, and its pending
/// admission count.
#[derive(Clone, Debug, PartialEq)]
struct Candidate {
    row: Option<LifeRow>,
    pending: u32,
}

/// One occurrence of a key in a writing batch, with what the table
/// answered for it.
#[derive(Debug)]
enum Touch<'a> {
    /// A training read that returned `out`.
    Read { out: &'a [f32] },
    /// An upsert of `values`.
    Upsert { values: &'a [f32] },
    /// An accumulation of `delta` with this `exists` flag.
    Accum { delta: &'a [f32], exists: bool },
    /// `update_rows` at batch position `pos`, whose update saw `seen`
    /// (values, then the listed slots' rows), or never ran.
    Update {
        pos: usize,
        seen: Option<&'a (Vec<f32>, Vec<f32>)>,
    },
}

/// What the explanation of one operation needs besides the key.
struct OpContext<'a> {
    /// The listed slots of an `update_rows` (`SLOTS` indexes).
    kinds: &'a [usize],
    /// Its seed.
    seed: u32,
    /// The largest stamp seen before the operation (Timestamp).
    stamp_floor: u64,
    /// A stamp taken after the operation (Timestamp).
    stamp_ceiling: u64,
    /// Whether pending counts may be dropped (a bounded exact counter).
    lossy: bool,
}

struct LifeRunner<'m, M: Maker, K: TestKey> {
    maker: &'m M,
    var: M::Table<K>,
    delivered: Deliveries,
    /// Delivered rows already accounted for.
    seen_deliveries: usize,
    dim: usize,
    init_row: Vec<f32>,
    shards: usize,
    custom: bool,
    /// Each shard's share of the capacity.
    shares: Option<Vec<usize>>,
    policy: RestrictPolicy,
    min_count: Option<u32>,
    /// Keys in the space.
    n: usize,
    /// `SLOTS` indexes in creation order, with their ids.
    created: Vec<(usize, SlotId)>,
    /// Per key of the space, its possible states.
    keys: Vec<Vec<Candidate>>,
    /// The largest stamp seen so far.
    stamp_floor: u64,
    stats: LifecycleStats,
}

impl<'m, M: LifecycleMaker, K: TestKey> LifeRunner<'m, M, K> {
    fn new(maker: &'m M, case: &LifecycleCase) -> Self {
        let initializer = match case.init {
            InitKind::Zeros => Initializer::Zeros,
            InitKind::Constant(c) => Initializer::Constant(c as f32),
            InitKind::Values(s) => {
                Initializer::Values((0..case.dim).map(|c| small_int(s, 0, c)).collect())
            }
            InitKind::Uniform(_) => unreachable!("lifecycle cases use exact initializers"),
        };
        let init_row = match case.init {
            InitKind::Zeros => vec![0.0; case.dim],
            InitKind::Constant(c) => vec![c as f32; case.dim],
            InitKind::Values(s) => (0..case.dim).map(|c| small_int(s, 0, c)).collect(),
            InitKind::Uniform(_) => unreachable!("lifecycle cases use exact initializers"),
        };
        let (delivered, listener) = recording_listener::<K>(case.dim);
        let var = maker.make_with_lifecycle::<K>(
            Spec {
                name: "lifecycle_model",
                dim: case.dim,
                initializer,
                policy: Some(case.policy),
                shards: case.shards,
                custom_partitioner: case.custom_partitioner,
            },
            LifecycleSpec {
                capacity: case.capacity,
                admission: case
                    .min_count
                    .map(|min_count| Admission::Exact { min_count }),
                frequency_decay: case.decay,
                on_evict: case.capacity.map(|_| listener),
            },
        );
        assert_eq!(var.capacity(), case.capacity, "capacity()");
        let n = 40;
        LifeRunner {
            maker,
            var,
            delivered,
            seen_deliveries: 0,
            dim: case.dim,
            init_row,
            shards: case.shards,
            custom: case.custom_partitioner,
            shares: case.capacity.map(|rows| {
                (0..case.shards)
                    .map(|s| rows / case.shards + usize::from(s < rows % case.shards))
                    .collect()
            }),
            policy: case.policy,
            min_count: case.min_count,
            n,
            created: Vec::new(),
            keys: vec![
                vec![Candidate {
                    row: None,
                    pending: 0
                }];
                n
            ],
            stamp_floor: 0,
            stats: LifecycleStats::default(),
        }
    }

    fn shard_of_index(&self, i: usize) -> usize {
        let k = K::nth(i);
        if self.custom {
            custom_partition(k.to_bits(), self.shards)
        } else {
            k.value().rem_euclid(self.shards as i128) as usize
        }
    }

    fn index_of_bits(&self, bits: u64) -> usize {
        (0..self.n)
            .find(|&i| K::nth(i).to_bits() == bits)
            .unwrap_or_else(|| panic!("a key outside the key space: {}", K::from_bits(bits)))
    }

    /// The present row of key `i` (every candidate agrees after an
    /// observation), if any.
    fn present(&self, i: usize) -> Option<&LifeRow> {
        self.keys[i][0].row.as_ref()
    }

    fn present_count(&self) -> usize {
        (0..self.n).filter(|&i| self.present(i).is_some()).count()
    }

    /// Whether an update may insert a missing key (exact counts admit no
    /// missing key unless every key is admitted at its first read).
    fn update_admits(&self) -> bool {
        self.min_count.is_none_or(|m| m <= 1)
    }

    /// A new row's score.
    fn new_score(&self) -> LifeScore {
        match self.policy {
            RestrictPolicy::Frequency => LifeScore::Count(1),
            RestrictPolicy::Timestamp => LifeScore::StampedNow,
        }
    }

    /// A written row's score.
    fn written_score(&self, before: LifeScore) -> LifeScore {
        match before {
            LifeScore::Count(c) => LifeScore::Count(c + 1),
            LifeScore::Stamp(_) | LifeScore::StampedNow => LifeScore::StampedNow,
        }
    }

    fn slot_rows(&self, row: &LifeRow, kinds: &[usize]) -> Vec<f32> {
        kinds
            .iter()
            .flat_map(|&kind| {
                row.slots[kind]
                    .clone()
                    .unwrap_or_else(|| vec![SLOTS[kind].1; self.dim])
            })
            .collect()
    }

    fn fresh_row(&self, values: Vec<f32>) -> LifeRow {
        LifeRow {
            values,
            slots: [None, None, None],
            score: self.new_score(),
        }
    }

    /// Whether a delivered row is what the model holds in `row`.
    fn delivery_matches(&self, row: &LifeRow, d: &DeliveredRow, ctx: &OpContext<'_>) -> bool {
        if d.values != row.values {
            return false;
        }
        if d.slots.len() != self.created.len() {
            return false;
        }
        for ((name, rows), &(kind, _)) in d.slots.iter().zip(&self.created) {
            let want = row.slots[kind]
                .clone()
                .unwrap_or_else(|| vec![SLOTS[kind].1; self.dim]);
            if name != SLOTS[kind].0 || *rows != want {
                return false;
            }
        }
        match row.score {
            LifeScore::Count(c) | LifeScore::Stamp(c) => d.score == c,
            LifeScore::StampedNow => d.score > ctx.stamp_floor && d.score < ctx.stamp_ceiling,
        }
    }

    /// The states `touch` can lead to from `(cand, inserted_here)`: none if
    /// what the table answered rules the state out.
    fn apply_touch(
        &self,
        cand: &Candidate,
        inserted_here: bool,
        touch: &Touch<'_>,
        ctx: &OpContext<'_>,
    ) -> Vec<(Candidate, bool)> {
        let mut next = cand.clone();
        match (touch, &mut next.row) {
            (Touch::Read { out }, Some(row)) => {
                if *out != &row.values[..] {
                    return Vec::new();
                }
                vec![(next, inserted_here)]
            }
            (Touch::Read { out }, None) => {
                if *out != &self.init_row[..] {
                    return Vec::new();
                }
                let counts: Vec<u32> = if ctx.lossy && cand.pending > 0 {
                    vec![cand.pending, 0]
                } else {
                    vec![cand.pending]
                };
                counts
                    .into_iter()
                    .map(|pending| match self.min_count {
                        Some(m) if m > 1 && pending + 1 < m => (
                            Candidate {
                                row: None,
                                pending: pending + 1,
                            },
                            inserted_here,
                        ),
                        _ => (
                            Candidate {
                                row: Some(self.fresh_row(self.init_row.clone())),
                                pending: 0,
                            },
                            true,
                        ),
                    })
                    .collect()
            }
            (Touch::Upsert { values }, Some(row)) => {
                row.values = values.to_vec();
                row.score = self.written_score(row.score);
                vec![(next, inserted_here)]
            }
            (Touch::Upsert { values }, None) => {
                next.row = Some(self.fresh_row(values.to_vec()));
                vec![(next, true)]
            }
            (Touch::Accum { delta, exists }, Some(row)) => {
                if *exists || inserted_here {
                    for (x, d) in row.values.iter_mut().zip(delta.iter()) {
                        *x += d;
                    }
                    row.score = self.written_score(row.score);
                }
                vec![(next, inserted_here)]
            }
            (Touch::Accum { delta, exists }, None) => {
                if !*exists && self.update_admits() {
                    next.row = Some(self.fresh_row(delta.to_vec()));
                    return vec![(next, true)];
                }
                vec![(next, inserted_here)]
            }
            (Touch::Update { pos, seen }, Some(row)) => {
                let Some((values, slots)) = seen else {
                    return Vec::new();
                };
                if *values != row.values || *slots != self.slot_rows(row, ctx.kinds) {
                    return Vec::new();
                }
                let (mut values, mut slots) = (values.clone(), slots.clone());
                slot_step(ctx.seed, *pos, ctx.kinds, &mut values, &mut slots);
                row.values = values;
                for (j, &kind) in ctx.kinds.iter().enumerate() {
                    row.slots[kind] = Some(slots[j * self.dim..(j + 1) * self.dim].to_vec());
                }
                row.score = self.written_score(row.score);
                vec![(next, inserted_here)]
            }
            (Touch::Update { pos, seen }, None) => {
                if !self.update_admits() {
                    return if seen.is_none() {
                        vec![(next, inserted_here)]
                    } else {
                        Vec::new()
                    };
                }
                let fresh = self.fresh_row(self.init_row.clone());
                let Some((values, slots)) = seen else {
                    return Vec::new();
                };
                if *values != fresh.values || *slots != self.slot_rows(&fresh, ctx.kinds) {
                    return Vec::new();
                }
                let (mut values, mut slots) = (values.clone(), slots.clone());
                slot_step(ctx.seed, *pos, ctx.kinds, &mut values, &mut slots);
                let mut row = fresh;
                row.values = values;
                for (j, &kind) in ctx.kinds.iter().enumerate() {
                    row.slots[kind] = Some(slots[j * self.dim..(j + 1) * self.dim].to_vec());
                }
                next.row = Some(row);
                vec![(next, true)]
            }
        }
    }

    /// Every state key's `touches` and `deliveries` (in the order the
    /// listener got them) can lead to from `cand`: each delivery happens
    /// between two touches, or before the first or after the last, and
    /// takes the row the key had then. `visited` holds the states already
    /// explored (touches and deliveries left, and the key's state), so a
    /// long batch of one key with many deliveries costs what its distinct
    /// states do.
    #[allow(clippy::too_many_arguments)]
    fn explain(
        &self,
        cand: Candidate,
        inserted_here: bool,
        touches: &[Touch<'_>],
        deliveries: &[&DeliveredRow],
        ctx: &OpContext<'_>,
        visited: &mut HashSet<(usize, usize, bool, String)>,
        out: &mut Vec<Candidate>,
    ) {
        let state = (
            touches.len(),
            deliveries.len(),
            inserted_here,
            format!("{cand:?}"),
        );
        if !visited.insert(state) {
            return;
        }
        if let (Some((d, rest)), Some(row)) = (deliveries.split_first(), &cand.row) {
            if self.delivery_matches(row, d, ctx) {
                let evicted = Candidate {
                    row: None,
                    pending: cand.pending,
                };
                self.explain(evicted, false, touches, rest, ctx, visited, out);
            }
        }
        match touches.split_first() {
            None => {
                if deliveries.is_empty() && !out.contains(&cand) {
                    out.push(cand);
                }
            }
            Some((touch, rest)) => {
                for (next, here) in self.apply_touch(&cand, inserted_here, touch, ctx) {
                    self.explain(next, here, rest, deliveries, ctx, visited, out);
                }
            }
        }
    }

    /// The rows the listener received since the last call.
    fn take_deliveries(&mut self) -> Vec<DeliveredRow> {
        let all = self
            .delivered
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let new = all[self.seen_deliveries..].to_vec();
        self.seen_deliveries = all.len();
        new
    }

    /// Explains a writing batch key by key, then checks the table against
    /// the states that remain.
    fn write_batch(
        &mut self,
        what: &str,
        idx: &[usize],
        touches: Vec<Touch<'_>>,
        kinds: &[usize],
        seed: u32,
        stamp_floor: u64,
    ) {
        let stamp_ceiling = stamp_now(self.policy);
        let deliveries = self.take_deliveries();
        let ctx = OpContext {
            kinds,
            seed,
            stamp_floor,
            stamp_ceiling,
            lossy: self.shares.is_some() && self.min_count.is_some_and(|m| m > 1),
        };
        let counted = touches.iter().any(|t| matches!(t, Touch::Read { .. }));
        let mut by_key: Vec<(Vec<Touch<'_>>, Vec<&DeliveredRow>)> =
            (0..self.n).map(|_| (Vec::new(), Vec::new())).collect();
        for (&i, touch) in idx.iter().zip(touches) {
            by_key[i].0.push(touch);
        }
        let mut evicted_per_shard = vec![0usize; self.shards];
        for d in &deliveries {
            let i = self.index_of_bits(d.bits);
            evicted_per_shard[self.shard_of_index(i)] += 1;
            by_key[i].1.push(d);
        }
        for (i, (touches, delivered)) in by_key.iter().enumerate() {
            if touches.is_empty() && delivered.is_empty() {
                continue;
            }
            let mut next = Vec::new();
            let mut visited = HashSet::new();
            for cand in &self.keys[i] {
                let cand = cand.clone();
                self.explain(
                    cand,
                    false,
                    touches,
                    delivered,
                    &ctx,
                    &mut visited,
                    &mut next,
                );
            }
            assert!(
                !next.is_empty(),
                "{what}: no explanation for key {} (#{i}): it was {:?}, its occurrences in the \
                 batch: {touches:?}, the listener got {delivered:?}",
                K::nth(i),
                self.keys[i],
            );
            self.keys[i] = next;
        }
        if ctx.lossy && counted {
            // Counting a read may drop other keys' pending counts.
            for cands in &mut self.keys {
                let dropped: Vec<Candidate> = cands
                    .iter()
                    .filter(|c| c.row.is_none() && c.pending > 0)
                    .map(|_| Candidate {
                        row: None,
                        pending: 0,
                    })
                    .collect();
                for c in dropped {
                    if !cands.contains(&c) {
                        cands.push(c);
                    }
                }
            }
        }
        self.observe(what, deliveries.len());
        if let Some(shares) = &self.shares {
            let sizes = self.shard_counts();
            for (s, &evicted) in evicted_per_shard.iter().enumerate() {
                assert!(
                    evicted == 0 || sizes[s] == shares[s],
                    "{what}: shard {s} evicted {evicted} row(s) but holds {} of its {} \
                     (an eviction without an insert)",
                    sizes[s],
                    shares[s]
                );
            }
        }
    }

    /// Rows per shard as the model has them.
    fn shard_counts(&self) -> Vec<usize> {
        let mut sizes = vec![0; self.shards];
        for i in 0..self.n {
            if self.present(i).is_some() {
                sizes[self.shard_of_index(i)] += 1;
            }
        }
        sizes
    }

    /// Reads every key of the space (values, presence, every created slot,
    /// scores) and keeps the states that agree; checks sizes, capacity and
    /// the lifecycle counters (`evicted` new rows delivered).
    fn observe(&mut self, what: &str, evicted: usize) {
        let dim = self.dim;
        let keys: Vec<K> = (0..self.n).map(K::nth).collect();
        let mut values = vec![f32::NAN; keys.len() * dim];
        let mut exists = vec![false; keys.len()];
        self.var
            .lookup_with_exists(&keys, &mut values, &mut exists)
            .unwrap();
        let mut slots = Vec::new();
        for &(kind, id) in &self.created {
            let mut out = vec![f32::NAN; keys.len() * dim];
            self.var.lookup_slot(id, &keys, &mut out).unwrap();
            slots.push((kind, out));
        }
        let mut scores = vec![u64::MAX; keys.len()];
        self.var.lookup_scores(&keys, &mut scores).unwrap();
        let mut stamped_now: HashMap<usize, u64> = HashMap::new();
        let mut new_floor = self.stamp_floor;
        for i in 0..self.n {
            let row_values = &values[i * dim..(i + 1) * dim];
            let mut kept: Vec<Candidate> = Vec::new();
            for cand in &self.keys[i] {
                let ok = match &cand.row {
                    None => {
                        !exists[i]
                            && row_values == &self.init_row[..]
                            && scores[i] == 0
                            && slots.iter().all(|(kind, out)| {
                                out[i * dim..(i + 1) * dim]
                                    .iter()
                                    .all(|&x| x == SLOTS[*kind].1)
                            })
                    }
                    Some(row) => {
                        exists[i]
                            && row_values == &row.values[..]
                            && slots.iter().all(|(kind, out)| {
                                let want = row.slots[*kind]
                                    .clone()
                                    .unwrap_or_else(|| vec![SLOTS[*kind].1; dim]);
                                out[i * dim..(i + 1) * dim] == want[..]
                            })
                            && match row.score {
                                LifeScore::Count(c) | LifeScore::Stamp(c) => scores[i] == c,
                                LifeScore::StampedNow => scores[i] > self.stamp_floor,
                            }
                    }
                };
                if ok {
                    let mut cand = cand.clone();
                    if let Some(row) = &mut cand.row {
                        if row.score == LifeScore::StampedNow {
                            row.score = LifeScore::Stamp(scores[i]);
                            stamped_now.insert(i, scores[i]);
                        }
                    }
                    if !kept.contains(&cand) {
                        kept.push(cand);
                    }
                }
            }
            assert!(
                !kept.is_empty(),
                "{what}: key {} (#{i}) reads exists={} values={row_values:?} score={} slots={:?}, \
                 the model has {:?}",
                K::nth(i),
                exists[i],
                scores[i],
                slots
                    .iter()
                    .map(|(kind, out)| (SLOTS[*kind].0, out[i * dim..(i + 1) * dim].to_vec()))
                    .collect::<Vec<_>>(),
                self.keys[i]
            );
            if exists[i] && self.policy == RestrictPolicy::Timestamp {
                new_floor = new_floor.max(scores[i]);
            }
            self.keys[i] = kept;
        }
        // One batch stamp per shard: keys of a shard written by this
        // operation share it.
        let mut per_shard: HashMap<usize, u64> = HashMap::new();
        for (&i, &stamp) in &stamped_now {
            if self.keys[i].iter().all(|c| {
                c.row
                    .as_ref()
                    .is_some_and(|r| r.score == LifeScore::Stamp(stamp))
            }) {
                let shard = self.shard_of_index(i);
                let seen = *per_shard.entry(shard).or_insert(stamp);
                assert_eq!(
                    seen, stamp,
                    "{what}: two stamps in one batch of shard {shard}"
                );
            }
        }
        self.stamp_floor = new_floor;

        let present = self.present_count();
        assert_eq!(self.var.size().unwrap(), present, "{what}: size()");
        if let Some(sizes) = self.shard_sizes() {
            assert_eq!(sizes, self.shard_counts(), "{what}: shard sizes");
        }
        if let Some(shares) = &self.shares {
            for (s, (&size, &share)) in self.shard_counts().iter().zip(shares).enumerate() {
                assert!(size <= share, "{what}: shard {s} holds {size} > {share}");
            }
        }
        let stats = self.var.lifecycle_stats().unwrap();
        assert_eq!(
            stats.evicted - self.stats.evicted,
            evicted as u64,
            "{what}: lifecycle_stats().evicted counts the delivered rows"
        );
        assert!(stats.not_admitted_reads >= self.stats.not_admitted_reads);
        self.stats.evicted = stats.evicted;
        self.stats.not_admitted_reads = stats.not_admitted_reads;
    }

    fn shard_sizes(&self) -> Option<Vec<usize>> {
        self.maker.shard_sizes(&self.var)
    }

    fn apply(&mut self, op: &LifeOp) {
        let dim = self.dim;
        let what = format!("{op:?}");
        let keys_of = |idx: &[usize]| idx.iter().map(|&i| K::nth(i)).collect::<Vec<K>>();
        let stamp_floor = self.stamp_floor;
        match op {
            LifeOp::Lookup(idx) => {
                let keys = keys_of(idx);
                let want: Vec<f32> = idx
                    .iter()
                    .flat_map(|&i| {
                        self.present(i)
                            .map_or_else(|| self.init_row.clone(), |r| r.values.clone())
                    })
                    .collect();
                let mut out = vec![f32::NAN; keys.len() * dim];
                self.var.lookup(&keys, &mut out).unwrap();
                assert_eq!(out, want, "{what}: lookup");
                let mut exists = vec![false; keys.len()];
                self.var
                    .lookup_with_exists(&keys, &mut out, &mut exists)
                    .unwrap();
                assert_eq!(out, want, "{what}: lookup_with_exists");
                let want_exists: Vec<bool> =
                    idx.iter().map(|&i| self.present(i).is_some()).collect();
                assert_eq!(exists, want_exists, "{what}: exists");
                self.observe(&what, 0);
            }
            LifeOp::LookupOrInsert(idx) => {
                let keys = keys_of(idx);
                let mut out = vec![f32::NAN; keys.len() * dim];
                self.var.lookup_or_insert(&keys, &mut out).unwrap();
                let touches = out.chunks(dim).map(|out| Touch::Read { out }).collect();
                self.write_batch(&what, idx, touches, &[], 0, stamp_floor);
            }
            LifeOp::Upsert(idx, seed) => {
                let keys = keys_of(idx);
                let values: Vec<f32> = (0..keys.len())
                    .flat_map(|r| (0..dim).map(move |c| small_int(*seed, r, c)))
                    .collect();
                self.var.upsert(&keys, &values).unwrap();
                let touches = values
                    .chunks(dim)
                    .map(|values| Touch::Upsert { values })
                    .collect();
                self.write_batch(&what, idx, touches, &[], 0, stamp_floor);
            }
            LifeOp::Accum(idx, seed, flags) => {
                let keys = keys_of(idx);
                let deltas: Vec<f32> = (0..keys.len())
                    .flat_map(|r| (0..dim).map(move |c| nonzero_int(*seed, r, c)))
                    .collect();
                let exists: Vec<bool> = match flags {
                    Flags::Truth => idx.iter().map(|&i| self.present(i).is_some()).collect(),
                    Flags::Random(bits) => {
                        idx.iter().map(|&i| (bits >> (i % 64)) & 1 == 1).collect()
                    }
                };
                self.var.accum(&keys, &deltas, &exists).unwrap();
                let touches = deltas
                    .chunks(dim)
                    .zip(&exists)
                    .map(|(delta, &exists)| Touch::Accum { delta, exists })
                    .collect();
                self.write_batch(&what, idx, touches, &[], 0, stamp_floor);
            }
            LifeOp::UpdateRows(idx, mask, reverse, seed) => {
                let keys = keys_of(idx);
                let (kinds, ids) = listed_slots(&self.created, *mask, *reverse);
                let mut seen: Vec<Option<(Vec<f32>, Vec<f32>)>> = vec![None; keys.len()];
                self.var
                    .update_rows(&keys, &ids, |pos, values, slots| {
                        assert!(seen[pos].is_none(), "{what}: position {pos} updated twice");
                        seen[pos] = Some((values.to_vec(), slots.to_vec()));
                        slot_step(*seed, pos, &kinds, values, slots);
                    })
                    .unwrap();
                let touches = seen
                    .iter()
                    .enumerate()
                    .map(|(pos, seen)| Touch::Update {
                        pos,
                        seen: seen.as_ref(),
                    })
                    .collect();
                self.write_batch(&what, idx, touches, &kinds, *seed, stamp_floor);
            }
            LifeOp::CreateSlot(kind) => {
                let (name, initial) = SLOTS[*kind];
                let id = self.var.create_slot(name, initial).unwrap();
                if self.slot_of(*kind).is_none() {
                    self.created.push((*kind, id));
                }
                self.observe(&what, 0);
            }
            LifeOp::Remove(idx) => {
                self.var.remove(&keys_of(idx)).unwrap();
                for &i in idx {
                    for cand in &mut self.keys[i] {
                        cand.row = None;
                    }
                }
                self.dedup_all();
                self.no_deliveries(&what);
                self.observe(&what, 0);
            }
            LifeOp::Clear => {
                self.var.clear().unwrap();
                for cands in &mut self.keys {
                    // Whether clear forgets pending admission counts is
                    // not part of the contract: either.
                    let mut next = Vec::new();
                    for cand in cands.iter() {
                        for pending in [cand.pending, 0] {
                            let c = Candidate { row: None, pending };
                            if !next.contains(&c) {
                                next.push(c);
                            }
                        }
                    }
                    *cands = next;
                }
                self.no_deliveries(&what);
                self.observe(&what, 0);
            }
            LifeOp::Restrict(num_reserved, trigger) => {
                let len = self.present_count();
                let want_removed = if len <= *trigger {
                    0
                } else {
                    len.saturating_sub(*num_reserved)
                };
                let removed = self.var.restrict(*num_reserved, *trigger).unwrap();
                assert_eq!(removed, want_removed, "{what}: rows removed of {len}");
                self.learn_removal(&what, removed);
            }
            LifeOp::Expire(age) => self.expire(&what, *age),
            LifeOp::Export => {
                let (keys, values) = self.var.export().unwrap();
                assert_eq!(keys.len(), self.present_count(), "{what}: rows");
                let mut seen = HashSet::new();
                for (r, k) in keys.iter().enumerate() {
                    assert!(seen.insert(k.to_bits()), "{what}: {k} twice");
                    let i = self.index_of_bits(k.to_bits());
                    let row = self
                        .present(i)
                        .unwrap_or_else(|| panic!("{what}: {k} is not in the model"));
                    assert_eq!(
                        values[r * dim..(r + 1) * dim],
                        row.values[..],
                        "{what}: {k}"
                    );
                }
                self.no_deliveries(&what);
            }
        }
    }

    fn slot_of(&self, kind: usize) -> Option<SlotId> {
        self.created
            .iter()
            .find(|&&(k, _)| k == kind)
            .map(|&(_, id)| id)
    }

    fn dedup_all(&mut self) {
        for cands in &mut self.keys {
            let mut next: Vec<Candidate> = Vec::new();
            for cand in cands.drain(..) {
                if !next.contains(&cand) {
                    next.push(cand);
                }
            }
            *cands = next;
        }
    }

    fn no_deliveries(&mut self, what: &str) {
        let new = self.take_deliveries();
        assert!(new.is_empty(), "{what}: rows went to the listener: {new:?}");
    }

    /// The score of present key `i` as a number (Count or Stamp).
    fn score_of(&self, i: usize) -> Option<u64> {
        self.present(i).map(|row| match row.score {
            LifeScore::Count(c) | LifeScore::Stamp(c) => c,
            LifeScore::StampedNow => unreachable!("stamps are known between operations"),
        })
    }

    /// After a removal by score (`restrict`, `expire`) of `removed` rows:
    /// learns which rows went from the table, and checks that no removed
    /// row scored above a kept one. Returns the (score, key index) pairs
    /// removed and kept.
    fn learn_removal(&mut self, what: &str, removed: usize) -> (Scored, Scored) {
        self.no_deliveries(what);
        let before: Vec<(u64, usize)> = (0..self.n)
            .filter_map(|i| self.score_of(i).map(|s| (s, i)))
            .collect();
        let keys: Vec<K> = before.iter().map(|&(_, i)| K::nth(i)).collect();
        let mut out = vec![0.0; keys.len() * self.dim];
        let mut exists = vec![false; keys.len()];
        self.var
            .lookup_with_exists(&keys, &mut out, &mut exists)
            .unwrap();
        let (mut gone, mut kept) = (Vec::new(), Vec::new());
        for (&(score, i), &present) in before.iter().zip(&exists) {
            if present {
                kept.push((score, i));
            } else {
                gone.push((score, i));
                for cand in &mut self.keys[i] {
                    cand.row = None;
                }
            }
        }
        self.dedup_all();
        assert_eq!(gone.len(), removed, "{what}: rows missing");
        let removed_max = gone.iter().map(|&(s, _)| s).max();
        let kept_min = kept.iter().map(|&(s, _)| s).min();
        if let (Some(removed_max), Some(kept_min)) = (removed_max, kept_min) {
            assert!(
                removed_max <= kept_min,
                "{what}: removed a row scored {removed_max} but kept one scored {kept_min}"
            );
        }
        self.observe(what, 0);
        (gone, kept)
    }

    fn expire(&mut self, what: &str, age: ExpireAge) {
        if self.policy != RestrictPolicy::Timestamp {
            assert!(
                matches!(
                    self.var.expire(Duration::ZERO),
                    Err(Error::InvalidArgument(_))
                ),
                "{what}: expire needs the Timestamp policy"
            );
            self.observe(what, 0);
            return;
        }
        let mut stamps: Vec<u64> = (0..self.n).filter_map(|i| self.score_of(i)).collect();
        stamps.sort_unstable();
        match age {
            ExpireAge::Zero => {
                let len = stamps.len();
                assert_eq!(self.var.expire(Duration::ZERO).unwrap(), len, "{what}");
                self.learn_removal(what, len);
                self.stats.expired += len as u64;
            }
            ExpireAge::Max => {
                assert_eq!(self.var.expire(Duration::MAX).unwrap(), 0, "{what}");
                self.learn_removal(what, 0);
            }
            ExpireAge::AtRank(rank) => {
                let Some(&target) = stamps.get(rank % stamps.len().max(1)) else {
                    assert_eq!(self.var.expire(Duration::ZERO).unwrap(), 0, "{what}: empty");
                    self.observe(what, 0);
                    return;
                };
                // The cutoff is `now - age` with `now` a stamp taken inside
                // expire: past `before`, short of `after`.
                let before = dynemb::restrict::next_timestamp();
                let age = before - target;
                let removed = self.var.expire(Duration::from_nanos(age)).unwrap();
                let after = dynemb::restrict::next_timestamp();
                let (gone, kept) = self.learn_removal(what, removed);
                self.stats.expired += removed as u64;
                for &(stamp, i) in &kept {
                    assert!(
                        stamp > target,
                        "{what}: key {} stamped {stamp} <= {target} was kept",
                        K::nth(i)
                    );
                }
                for &(stamp, i) in &gone {
                    assert!(
                        stamp < target + (after - before),
                        "{what}: key {} stamped {stamp} went, the cutoff was below {}",
                        K::nth(i),
                        target + (after - before)
                    );
                }
            }
        }
        let stats = self.var.lifecycle_stats().unwrap();
        assert_eq!(
            stats.expired, self.stats.expired,
            "{what}: lifecycle_stats().expired"
        );
    }
}

/// A stamp from the process's clock (Timestamp), or 0.
fn stamp_now(policy: RestrictPolicy) -> u64 {
    match policy {
        RestrictPolicy::Timestamp => dynemb::restrict::next_timestamp(),
        RestrictPolicy::Frequency => 0,
    }
}

fn run_lifecycle_typed<K: TestKey, M: LifecycleMaker>(maker: &M, case: &LifecycleCase) {
    let mut runner = LifeRunner::<M, K>::new(maker, case);
    runner.observe("a new table", 0);
    for op in &case.ops {
        runner.apply(op);
    }
    runner.apply(&LifeOp::Export);
    maker.discard(runner.var);
}

/// Runs a case of the lifecycle model on a store from `maker`.
pub fn run_lifecycle<M: LifecycleMaker>(maker: &M, case: LifecycleCase) {
    match case.key_type {
        0 => run_lifecycle_typed::<i64, M>(maker, &case),
        1 => run_lifecycle_typed::<u64, M>(maker, &case),
        2 => run_lifecycle_typed::<i32, M>(maker, &case),
        _ => run_lifecycle_typed::<u32, M>(maker, &case),
    }
}
