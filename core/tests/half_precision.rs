//! Half-precision storage (`Dtype::F16`, `Dtype::Bf16`) checked as a user
//! sees it, through the public API only:
//!
//! - every operation (lookup, lookup_with_exists, lookup_or_insert, upsert,
//!   accum with its `bp_v2` truth table and repeated keys, remove,
//!   create_slot, update_rows with slots, lookup_slot, export, size,
//!   lookup_scores and restrict with the Frequency policy) on every value
//!   and slot dtype pair, with Zeros, Constant(0.1) and RandomNormal
//!   initializers, matches an `f32` model that rounds to the dtype after
//!   every write (accum: `round(round(old) + delta)` in `f32`), read for
//!   read, bit for bit;
//! - a value that does not fit its dtype is an `Error::OutOfRange` that
//!   changes nothing (upsert, accum deltas, slot initial values, the
//!   initializer at build), or, for results computed per row (accum sums,
//!   update_rows values and slots), refuses that row only and names the
//!   first refused position;
//! - a missing key reads the initializer's row rounded, the row
//!   `lookup_or_insert` stores;
//! - checkpoints hold native F16/BF16 tensors, say their dtypes in
//!   `index.json` only when not f32, and restore into any other dtype
//!   rounded (out of range: refused before anything changes), through
//!   `Variable::save`/`restore` and through `save_rows`/`Reader`;
//! - capacity eviction, admission, expiry and restrict work on half rows,
//!   and stochastic bf16 rounding is reproducible per seed and unbiased;
//! - bf16 rows take about half the memory of f32 rows.

use dynemb::checkpoint::{save_rows, Reader, Rows, TableInfo};
use dynemb::{
    Admission, Dtype, Error, Evicted, Initializer, RestrictPolicy, Rounding, SlotId, Variable,
};
use dynemb_test_support::contract;
use proptest::collection::vec;
use proptest::prelude::*;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

// ---------------------------------------------------------------- helpers

/// A 64-bit mixer (MurmurHash3's finalizer).
fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// A value for `(seed, row, column)`: up to 10 in magnitude, at one of
/// several scales (down to f16's subnormals), rarely exact in half
/// precision.
fn val(seed: u64, r: usize, c: usize) -> f32 {
    let h = mix(seed ^ ((r as u64) << 32) ^ (c as u64).wrapping_mul(0x9e37_79b9));
    let m = (h % 20_001) as f32 / 1000.0 - 10.0;
    m * [1.0, 0.37, 1e-3, 1e-6][(h >> 50) as usize % 4]
}

/// `n` rows of `dim` values for `seed`.
fn vals(seed: u64, n: usize, dim: usize) -> Vec<f32> {
    (0..n)
        .flat_map(|r| (0..dim).map(move |c| val(seed, r, c)))
        .collect()
}

/// `values` rounded to `dtype`.
fn rounded(dtype: Dtype, values: &[f32]) -> Vec<f32> {
    values.iter().map(|&v| dtype.round(v)).collect()
}

/// Asserts `got` and `want` hold the same bits.
#[track_caller]
fn assert_bits(got: &[f32], want: &[f32], what: impl std::fmt::Display) {
    let g: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
    let w: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
    assert!(g == w, "{what}:\n got {got:?}\nwant {want:?}");
}

/// Every row of `var` with its slots and score, by key: what "nothing
/// changed" compares.
type Snapshot = BTreeMap<i64, (Vec<u32>, Vec<Vec<u32>>, u64)>;

fn snapshot(var: &Variable<i64>) -> Snapshot {
    let (keys, values) = var.export().unwrap();
    let dim = var.dim();
    let slots: Vec<SlotId> = var
        .slot_names()
        .iter()
        .map(|n| var.slot_id(n).unwrap())
        .collect();
    let mut scores = vec![0u64; keys.len()];
    var.lookup_scores(&keys, &mut scores).unwrap();
    let slot_rows: Vec<Vec<f32>> = slots
        .iter()
        .map(|&s| {
            let mut out = vec![0.0; keys.len() * dim];
            var.lookup_slot(s, &keys, &mut out).unwrap();
            out
        })
        .collect();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    keys.iter()
        .enumerate()
        .map(|(i, &k)| {
            let row = i * dim..(i + 1) * dim;
            let slots = slot_rows.iter().map(|s| bits(&s[row.clone()])).collect();
            (k, (bits(&values[row.clone()]), slots, scores[i]))
        })
        .collect()
}

fn lookup(var: &Variable<i64>, keys: &[i64]) -> Vec<f32> {
    let mut out = vec![f32::NAN; keys.len() * var.dim()];
    var.lookup(keys, &mut out).unwrap();
    out
}

fn lookup_slot(var: &Variable<i64>, slot: SlotId, keys: &[i64]) -> Vec<f32> {
    let mut out = vec![f32::NAN; keys.len() * var.dim()];
    var.lookup_slot(slot, keys, &mut out).unwrap();
    out
}

fn half(dtype: Dtype) -> Variable<i64> {
    Variable::<i64>::builder(format!("t_{dtype}"))
        .value_dtype(dtype)
        .slot_dtype(dtype)
        .restrict_policy(RestrictPolicy::Frequency)
        .dim(4)
        .build()
        .unwrap()
}

// ---------------------------------------------------------------- 1. the model

const KEY_SPACE: usize = 14;

fn key(i: usize) -> i64 {
    match i {
        0 => 0,
        1 => -1,
        2 => i64::MIN,
        3 => i64::MAX,
        _ => i as i64 * 7919 - 40_000,
    }
}

/// The slots a case may create: names and the initial values asked for
/// (0.1 and -2.7 are not exact in half precision).
const SLOTS: [(&str, f32); 3] = [("m", 0.0), ("v", 0.1), ("w", -2.7)];

#[derive(Clone, Copy, Debug)]
enum Init {
    Zeros,
    Constant,
    Normal(u64),
}

impl Init {
    fn initializer(self) -> Initializer {
        match self {
            Init::Zeros => Initializer::Zeros,
            Init::Constant => Initializer::Constant(0.1),
            Init::Normal(seed) => Initializer::RandomNormal {
                mean: 0.0,
                stddev: 1.0,
                seed,
            },
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    Lookup(Vec<usize>),
    LookupWithExists(Vec<usize>),
    LookupOrInsert(Vec<usize>),
    Upsert(Vec<usize>, u64),
    /// Deltas seeded by `.1`; flags from `lookup_with_exists` (`None`) or
    /// random per key (the same for every occurrence of a key).
    Accum(Vec<usize>, u64, Option<u64>),
    Remove(Vec<usize>),
    CreateSlot(usize),
    /// Keys, a mask of the created slots to list (reversed if `.2`), seed.
    UpdateRows(Vec<usize>, u8, bool, u64),
    LookupSlot(usize, Vec<usize>),
    LookupScores(Vec<usize>),
    Restrict(usize, usize),
    Export,
}

#[derive(Clone, Debug)]
struct Case {
    values: Dtype,
    slots: Dtype,
    init: Init,
    dim: usize,
    shards: usize,
    ops: Vec<Op>,
}

fn dtype() -> impl Strategy<Value = Dtype> {
    prop_oneof![Just(Dtype::F32), Just(Dtype::F16), Just(Dtype::Bf16)]
}

fn batch() -> impl Strategy<Value = Vec<usize>> {
    vec(0..KEY_SPACE, 0..10)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => batch().prop_map(Op::Lookup),
        2 => batch().prop_map(Op::LookupWithExists),
        3 => batch().prop_map(Op::LookupOrInsert),
        3 => (batch(), any::<u64>()).prop_map(|(k, s)| Op::Upsert(k, s)),
        4 => (batch(), any::<u64>(), proptest::option::of(any::<u64>()))
            .prop_map(|(k, s, f)| Op::Accum(k, s, f)),
        2 => batch().prop_map(Op::Remove),
        2 => (0..SLOTS.len()).prop_map(Op::CreateSlot),
        5 => (batch(), any::<u8>(), any::<bool>(), any::<u64>())
            .prop_map(|(k, m, r, s)| Op::UpdateRows(k, m, r, s)),
        2 => (0..SLOTS.len(), batch()).prop_map(|(s, k)| Op::LookupSlot(s, k)),
        2 => batch().prop_map(Op::LookupScores),
        1 => (0..KEY_SPACE + 2, 0..KEY_SPACE + 2).prop_map(|(n, t)| Op::Restrict(n, t)),
        1 => Just(Op::Export),
    ]
}

fn case() -> impl Strategy<Value = Case> {
    (
        dtype(),
        dtype(),
        prop_oneof![
            Just(Init::Zeros),
            Just(Init::Constant),
            any::<u64>().prop_map(Init::Normal)
        ],
        prop_oneof![Just(1usize), Just(3), Just(5), Just(65)],
        1usize..=3,
        vec(op(), 1..60),
    )
        .prop_map(|(values, slots, init, dim, shards, ops)| Case {
            values,
            slots,
            init,
            dim,
            shards,
            ops,
        })
}

/// The optimizer step of `Op::UpdateRows`, run by the closure and by the
/// model alike: an exponential average through the listed slots in order,
/// then a step of the values. Order-sensitive, bounded, never NaN.
fn step(seed: u64, pos: usize, values: &mut [f32], slots: &mut [f32]) {
    let dim = values.len();
    for c in 0..dim {
        let g = val(seed, pos, c);
        let mut carry = g;
        for s in slots.chunks_exact_mut(dim) {
            s[c] = 0.9 * s[c] + 0.1 * carry;
            carry = s[c];
        }
        values[c] -= 0.01 * carry + 0.001 * g;
    }
}

#[derive(Clone, Debug)]
struct Row {
    values: Vec<f32>,
    /// Per `SLOTS` index; `None` reads the slot's initial value.
    slots: [Option<Vec<f32>>; 3],
    score: u64,
}

/// What one occurrence of a key in an `accum` batch does (`bp_v2`).
#[derive(Clone, Copy, PartialEq)]
enum Effect {
    Insert,
    Add,
    Ignore,
}

/// The documented rule, per occurrence in batch order: a key present
/// before the batch is added to where its flag says it exists; a key
/// absent before is inserted by its first occurrence flagged absent, and
/// every later occurrence is added.
fn accum_effects(keys: &[i64], exists: &[bool], present: impl Fn(i64) -> bool) -> Vec<Effect> {
    let mut inserted = HashSet::new();
    keys.iter()
        .zip(exists)
        .map(|(&k, &e)| match (present(k), e) {
            (true, true) => Effect::Add,
            (true, false) => Effect::Ignore,
            _ if inserted.contains(&k) => Effect::Add,
            (false, false) => {
                inserted.insert(k);
                Effect::Insert
            }
            (false, true) => Effect::Ignore,
        })
        .collect()
}

struct Model {
    var: Variable<i64>,
    case: Case,
    init: Initializer,
    /// `SLOTS` indexes in creation order, with their ids.
    created: Vec<(usize, SlotId)>,
    rows: HashMap<i64, Row>,
}

impl Model {
    fn new(case: Case) -> Model {
        let init = case.init.initializer();
        let var = Variable::<i64>::builder("half_model")
            .dim(case.dim)
            .shards(case.shards)
            .init_size(1)
            .initializer(init.clone())
            .value_dtype(case.values)
            .slot_dtype(case.slots)
            .restrict_policy(RestrictPolicy::Frequency)
            .build()
            .unwrap();
        assert_eq!(
            (var.value_dtype(), var.slot_dtype()),
            (case.values, case.slots)
        );
        Model {
            var,
            case,
            init,
            created: Vec::new(),
            rows: HashMap::new(),
        }
    }

    fn dim(&self) -> usize {
        self.case.dim
    }

    /// The row of a missing key: the initializer's, rounded.
    fn init_row(&self, k: i64) -> Vec<f32> {
        let mut row = vec![0.0; self.dim()];
        self.init.fill(k as u64, &mut row);
        rounded(self.case.values, &row)
    }

    fn slot_initial(&self, kind: usize) -> f32 {
        self.case.slots.round(SLOTS[kind].1)
    }

    fn fresh(&self, k: i64) -> Row {
        Row {
            values: self.init_row(k),
            slots: [None, None, None],
            score: 0,
        }
    }

    fn values_of(&self, k: i64) -> Vec<f32> {
        self.rows
            .get(&k)
            .map_or_else(|| self.init_row(k), |r| r.values.clone())
    }

    fn slot_of(&self, kind: usize, k: i64) -> Vec<f32> {
        self.rows
            .get(&k)
            .and_then(|r| r.slots[kind].clone())
            .unwrap_or_else(|| vec![self.slot_initial(kind); self.dim()])
    }

    fn id_of(&self, kind: usize) -> Option<SlotId> {
        self.created
            .iter()
            .find(|&&(k, _)| k == kind)
            .map(|&(_, id)| id)
    }

    fn check_lookup(&self, what: &str, keys: &[i64], got: &[f32]) {
        let want: Vec<f32> = keys.iter().flat_map(|&k| self.values_of(k)).collect();
        assert_bits(got, &want, format_args!("{what} of {keys:?}"));
    }

    fn apply(&mut self, op: &Op) {
        let dim = self.dim();
        let keys_of = |idx: &[usize]| idx.iter().map(|&i| key(i)).collect::<Vec<i64>>();
        match op {
            Op::Lookup(idx) => {
                let keys = keys_of(idx);
                self.check_lookup("lookup", &keys, &lookup(&self.var, &keys));
            }
            Op::LookupWithExists(idx) => {
                let keys = keys_of(idx);
                let mut out = vec![f32::NAN; keys.len() * dim];
                let mut exists = vec![true; keys.len()];
                self.var
                    .lookup_with_exists(&keys, &mut out, &mut exists)
                    .unwrap();
                self.check_lookup("lookup_with_exists", &keys, &out);
                let want: Vec<bool> = keys.iter().map(|k| self.rows.contains_key(k)).collect();
                assert_eq!(exists, want, "lookup_with_exists flags of {keys:?}");
            }
            Op::LookupOrInsert(idx) => {
                let keys = keys_of(idx);
                let mut out = vec![f32::NAN; keys.len() * dim];
                self.var.lookup_or_insert(&keys, &mut out).unwrap();
                for &k in &keys {
                    if !self.rows.contains_key(&k) {
                        let mut row = self.fresh(k);
                        row.score = 1;
                        self.rows.insert(k, row);
                    }
                }
                self.check_lookup("lookup_or_insert", &keys, &out);
            }
            Op::Upsert(idx, seed) => {
                let keys = keys_of(idx);
                let values = vals(*seed, keys.len(), dim);
                self.var.upsert(&keys, &values).unwrap();
                for (r, &k) in keys.iter().enumerate() {
                    let fresh = self.fresh(k);
                    let row = self.rows.entry(k).or_insert(fresh);
                    row.values = rounded(self.case.values, &values[r * dim..(r + 1) * dim]);
                    row.score += 1;
                }
            }
            Op::Accum(idx, seed, flags) => {
                let keys = keys_of(idx);
                let deltas = vals(*seed, keys.len(), dim);
                let exists: Vec<bool> = match flags {
                    None => {
                        let mut out = vec![0.0; keys.len() * dim];
                        let mut exists = vec![false; keys.len()];
                        self.var
                            .lookup_with_exists(&keys, &mut out, &mut exists)
                            .unwrap();
                        exists
                    }
                    Some(bits) => idx.iter().map(|&i| bits >> i & 1 == 1).collect(),
                };
                self.var.accum(&keys, &deltas, &exists).unwrap();
                let effects = accum_effects(&keys, &exists, |k| self.rows.contains_key(&k));
                let dtype = self.case.values;
                for (r, (&k, effect)) in keys.iter().zip(effects).enumerate() {
                    let delta = &deltas[r * dim..(r + 1) * dim];
                    match effect {
                        Effect::Ignore => {}
                        Effect::Insert => {
                            let mut row = self.fresh(k);
                            row.values = rounded(dtype, delta);
                            row.score = 1;
                            self.rows.insert(k, row);
                        }
                        Effect::Add => {
                            let row = self.rows.get_mut(&k).unwrap();
                            for (x, d) in row.values.iter_mut().zip(delta) {
                                *x = dtype.round(*x + d);
                            }
                            row.score += 1;
                        }
                    }
                }
            }
            Op::Remove(idx) => {
                let keys = keys_of(idx);
                self.var.remove(&keys).unwrap();
                for k in &keys {
                    self.rows.remove(k);
                }
            }
            Op::CreateSlot(kind) => {
                let (name, initial) = SLOTS[*kind];
                let id = self.var.create_slot(name, initial).unwrap();
                match self.id_of(*kind) {
                    Some(existing) => assert_eq!(id, existing, "create_slot {name} again"),
                    None => self.created.push((*kind, id)),
                }
                assert_bits(
                    &[self.var.slot_initial(id).unwrap()],
                    &[self.slot_initial(*kind)],
                    format_args!("initial value of slot {name}"),
                );
            }
            Op::UpdateRows(idx, mask, reverse, seed) => {
                let keys = keys_of(idx);
                let (kinds, ids) = contract::listed_slots(&self.created, *mask, *reverse);
                let mut inputs = Vec::with_capacity(keys.len());
                for (pos, &k) in keys.iter().enumerate() {
                    let mut row = self.rows.remove(&k).unwrap_or_else(|| self.fresh(k));
                    let mut slots: Vec<f32> = kinds
                        .iter()
                        .flat_map(|&s| self.slot_of_row(&row, s))
                        .collect();
                    inputs.push((row.values.clone(), slots.clone()));
                    step(*seed, pos, &mut row.values, &mut slots);
                    self.case.values.round_slice(&mut row.values);
                    self.case.slots.round_slice(&mut slots);
                    for (j, &kind) in kinds.iter().enumerate() {
                        row.slots[kind] = Some(slots[j * dim..(j + 1) * dim].to_vec());
                    }
                    row.score += 1;
                    self.rows.insert(k, row);
                }
                let mut calls = vec![0usize; keys.len()];
                self.var
                    .update_rows(&keys, &ids, |pos, values, slots| {
                        calls[pos] += 1;
                        let (want_values, want_slots) = &inputs[pos];
                        assert_bits(values, want_values, format_args!("update_rows row #{pos}"));
                        assert_bits(slots, want_slots, format_args!("update_rows slots #{pos}"));
                        step(*seed, pos, values, slots);
                    })
                    .unwrap();
                assert!(
                    calls.iter().all(|&c| c == 1),
                    "calls per position {calls:?}"
                );
            }
            Op::LookupSlot(kind, idx) => {
                let keys = keys_of(idx);
                match self.id_of(*kind) {
                    None => assert!(matches!(
                        self.var.slot_id(SLOTS[*kind].0),
                        Err(Error::UnknownSlot { .. })
                    )),
                    Some(id) => {
                        let want: Vec<f32> =
                            keys.iter().flat_map(|&k| self.slot_of(*kind, k)).collect();
                        assert_bits(
                            &lookup_slot(&self.var, id, &keys),
                            &want,
                            format_args!("slot {} of {keys:?}", SLOTS[*kind].0),
                        );
                    }
                }
            }
            Op::LookupScores(idx) => self.check_scores(&keys_of(idx)),
            Op::Restrict(num_reserved, trigger) => self.restrict(*num_reserved, *trigger),
            Op::Export => {
                let (keys, values) = self.var.export().unwrap();
                assert_eq!(keys.len(), self.rows.len(), "export row count");
                let mut seen = HashSet::new();
                for (i, k) in keys.iter().enumerate() {
                    assert!(seen.insert(*k), "export: {k} twice");
                    let row = self.rows.get(k).unwrap_or_else(|| panic!("export: {k}"));
                    assert_bits(
                        &values[i * dim..(i + 1) * dim],
                        &row.values,
                        format_args!("export of {k}"),
                    );
                }
            }
        }
        assert_eq!(self.var.size(), self.rows.len(), "size() after {op:?}");
    }

    fn slot_of_row(&self, row: &Row, kind: usize) -> Vec<f32> {
        row.slots[kind]
            .clone()
            .unwrap_or_else(|| vec![self.slot_initial(kind); self.dim()])
    }

    fn check_scores(&self, keys: &[i64]) {
        let mut out = vec![u64::MAX; keys.len()];
        self.var.lookup_scores(keys, &mut out).unwrap();
        let want: Vec<u64> = keys
            .iter()
            .map(|k| self.rows.get(k).map_or(0, |r| r.score))
            .collect();
        assert_eq!(out, want, "scores of {keys:?}");
    }

    fn restrict(&mut self, num_reserved: usize, trigger: usize) {
        let len = self.rows.len();
        let want = if len <= trigger {
            0
        } else {
            len.saturating_sub(num_reserved)
        };
        let removed = self.var.restrict(num_reserved, trigger).unwrap();
        assert_eq!(
            removed, want,
            "restrict({num_reserved}, {trigger}) of {len}"
        );
        let keys: Vec<i64> = self.rows.keys().copied().collect();
        let present = dynemb_test_support::present(&self.var, &keys);
        let (mut kept_min, mut removed_max) = (u64::MAX, 0);
        for (k, here) in keys.iter().zip(present) {
            let score = self.rows[k].score;
            if here {
                kept_min = kept_min.min(score);
            } else {
                removed_max = removed_max.max(score);
                self.rows.remove(k);
            }
        }
        assert_eq!(len - self.rows.len(), removed, "rows gone after restrict");
        assert!(
            removed == 0 || removed_max <= kept_min,
            "restrict removed a row scored {removed_max}, kept one scored {kept_min}"
        );
    }

    /// Every key of the space: values, every created slot and score.
    fn check_all(&self) {
        let keys: Vec<i64> = (0..KEY_SPACE).map(key).collect();
        self.check_lookup("final lookup", &keys, &lookup(&self.var, &keys));
        for &(kind, id) in &self.created {
            let want: Vec<f32> = keys.iter().flat_map(|&k| self.slot_of(kind, k)).collect();
            assert_bits(&lookup_slot(&self.var, id, &keys), &want, "final slot");
        }
        self.check_scores(&keys);
    }
}

proptest! {
    #![proptest_config(contract::config(48))]

    /// Every operation on every value and slot dtype pair against the
    /// rounding `f32` model.
    #[test]
    fn every_op_matches_a_rounding_f32_model(case in case()) {
        let ops = case.ops.clone();
        let mut model = Model::new(case);
        for op in &ops {
            model.apply(op);
        }
        model.check_all();
    }
}

/// The model on a fixed long sequence for each dtype pair, so every pair
/// runs whatever proptest draws.
#[test]
fn every_dtype_pair_runs_a_long_fixed_sequence() {
    let mut ops = vec![Op::CreateSlot(1), Op::CreateSlot(2)];
    for i in 0..300usize {
        let b: Vec<usize> = (0..(i % 9)).map(|j| (i * 7 + j * 5) % 11).collect();
        let seed = i as u64 * 0x9e37;
        ops.push(match i % 8 {
            0 => Op::LookupOrInsert(b),
            1 => Op::Accum(b, seed, None),
            2 => Op::Accum(b, seed, Some(seed)),
            3 => Op::Upsert(b, seed),
            4 => Op::UpdateRows(b, (i % 8) as u8, i % 3 == 0, seed),
            5 => Op::Remove(b),
            6 if i % 40 == 6 => Op::Restrict(6, 3),
            6 => Op::LookupSlot(i % 3, b),
            _ => Op::LookupWithExists(b),
        });
    }
    ops.push(Op::Export);
    for values in Dtype::ALL {
        for slots in Dtype::ALL {
            let mut model = Model::new(Case {
                values,
                slots,
                init: Init::Normal(7),
                dim: 5,
                shards: 2,
                ops: Vec::new(),
            });
            for op in &ops {
                model.apply(op);
            }
            model.check_all();
        }
    }
}

// ---------------------------------------------------------------- 2. range errors

#[test]
fn an_upsert_out_of_range_is_refused_whole() {
    let var = half(Dtype::F16);
    var.upsert(&[1, 2], &vals(1, 2, 4)).unwrap();
    let before = snapshot(&var);
    let mut values = vec![1.0; 12];
    values[5] = 70000.0;
    let err = var.upsert(&[3, 1, 4], &values).unwrap_err();
    assert!(
        matches!(
            err,
            Error::OutOfRange {
                what: "values",
                index: 5,
                value,
                dtype: Dtype::F16,
            } if value == 70000.0
        ),
        "{err}"
    );
    assert_eq!(snapshot(&var), before, "a refused upsert changes nothing");
    values[5] = -65520.0;
    assert!(matches!(
        var.upsert(&[3, 1, 4], &values),
        Err(Error::OutOfRange { index: 5, .. })
    ));
    // NaN is still NonFinite, whatever the dtype.
    values[5] = f32::NAN;
    assert!(matches!(
        var.upsert(&[3, 1, 4], &values),
        Err(Error::NonFinite { index: 5, .. })
    ));
    // Of a value out of range and a NaN, the error names the first.
    values[2] = 70000.0;
    assert!(matches!(
        var.upsert(&[3, 1, 4], &values),
        Err(Error::OutOfRange { index: 2, .. })
    ));
    values[2] = f32::NAN;
    values[5] = 70000.0;
    assert!(matches!(
        var.upsert(&[3, 1, 4], &values),
        Err(Error::NonFinite { index: 2, .. })
    ));
    values[2] = 1.0;
    assert_eq!(snapshot(&var), before);
    // The largest value that rounds to f16's maximum is accepted.
    values[5] = 65519.0;
    var.upsert(&[3, 1, 4], &values).unwrap();
    assert_eq!(lookup(&var, &[1])[1], 65504.0);
}

#[test]
fn an_accum_delta_out_of_range_is_refused_whole() {
    let var = half(Dtype::F16);
    var.upsert(&[1, 2], &vals(2, 2, 4)).unwrap();
    let before = snapshot(&var);
    let mut deltas = vec![0.5; 8];
    deltas[6] = 1e5;
    let err = var.accum(&[1, 9], &deltas, &[true, false]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::OutOfRange {
                what: "deltas",
                index: 6,
                dtype: Dtype::F16,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(snapshot(&var), before);
}

#[test]
fn an_accum_sum_out_of_range_refuses_that_row_only() {
    for dtype in [Dtype::F16, Dtype::Bf16] {
        let big = if dtype == Dtype::F16 { 60000.0 } else { 3.3e38 };
        let push = if dtype == Dtype::F16 { 6000.0 } else { 1e37 };
        let var = half(dtype);
        var.upsert(&[1, 2, 3], &[[big; 4], [1.0; 4], [-big; 4]].concat())
            .unwrap();
        let before = snapshot(&var);
        let deltas = [[0.0, 0.0, push, 0.0], [1.0; 4], [0.0, -push, 0.0, 0.0]].concat();
        let err = var
            .accum(&[1, 2, 3], &deltas, &[true, true, true])
            .unwrap_err();
        assert!(
            matches!(err, Error::OutOfRange { what: "accum result", index: 0, dtype: d, .. } if d == dtype),
            "{dtype}: {err}"
        );
        let after = snapshot(&var);
        assert_eq!(
            after[&1], before[&1],
            "{dtype}: refused row 1 kept, score too"
        );
        assert_eq!(after[&3], before[&3], "{dtype}: refused row 3 kept");
        assert_eq!(lookup(&var, &[2]), [2.0; 4], "{dtype}: row 2 written");
        assert_eq!(after[&2].2, before[&2].2 + 1, "{dtype}: row 2 scored");
        // The error names the first refused position.
        let deltas = [[1.0; 4], [0.0, -push, 0.0, 0.0], [0.0, 0.0, push, 0.0]].concat();
        let err = var
            .accum(&[2, 3, 1], &deltas, &[true, true, true])
            .unwrap_err();
        assert!(matches!(err, Error::OutOfRange { index: 1, .. }), "{err}");
        // A key the batch inserted keeps the row it was inserted with.
        let err = var
            .accum(&[7, 7], &[[big; 4], [push; 4]].concat(), &[false, false])
            .unwrap_err();
        assert!(matches!(err, Error::OutOfRange { index: 1, .. }), "{err}");
        assert_eq!(lookup(&var, &[7]), [dtype.round(big); 4], "{dtype}");
    }
    // An f32 overflow is still NonFinite.
    let var = half(Dtype::Bf16);
    var.upsert(&[1], &[3e38; 4]).unwrap();
    let err = var.accum(&[1], &[3e38; 4], &[true]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::NonFinite {
                what: "accum result",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn an_update_out_of_range_refuses_that_row_for_values_and_for_slots() {
    for (values, slots) in [(Dtype::F16, Dtype::F32), (Dtype::F32, Dtype::F16)] {
        let var = Variable::<i64>::builder("u")
            .dim(3)
            .value_dtype(values)
            .slot_dtype(slots)
            .restrict_policy(RestrictPolicy::Frequency)
            .build()
            .unwrap();
        let m = var.create_slot("m", 0.1).unwrap();
        var.upsert(&[1, 2, 3], &vals(3, 3, 3)).unwrap();
        let before = snapshot(&var);
        // Position 1 leaves 70000 in its values, position 2 in its slot:
        // one of them fits, the other does not.
        let r = var.update_rows(&[1, 2, 3, 8], &[m], |pos, v, s| {
            v[0] += 1.0;
            s[0] += 1.0;
            match pos {
                1 => v[2] = 70000.0,
                2 => s[1] = 70000.0,
                _ => {}
            }
        });
        let refused = if values == Dtype::F16 { 1 } else { 2 };
        let kept = 3 - refused;
        assert!(
            matches!(
                r,
                Err(Error::OutOfRange { what: "update_rows result", index, dtype: Dtype::F16, value })
                    if index == refused && value == 70000.0
            ),
            "values {values}, slots {slots}: {r:?}"
        );
        let after = snapshot(&var);
        let refused_key = [1, 2, 3][refused];
        let kept_key = [1, 2, 3][kept];
        assert_eq!(
            after[&refused_key], before[&refused_key],
            "refused row unchanged"
        );
        assert_ne!(
            after[&kept_key], before[&kept_key],
            "the row that fits is written"
        );
        assert_eq!(after[&kept_key].2, before[&kept_key].2 + 1);
        assert_eq!(
            lookup(&var, &[kept_key])[2].max(lookup_slot(&var, m, &[kept_key])[1]),
            70000.0
        );
        assert_ne!(after[&1], before[&1]);
        assert_eq!(after.len(), 4, "the new key 8 was written");
        // A missing key refused is not inserted.
        let r = var.update_rows(&[9], &[m], |_, v, s| {
            v[0] = 1e6;
            s[0] = 1e6;
        });
        assert!(
            matches!(r, Err(Error::OutOfRange { index: 0, .. })),
            "{r:?}"
        );
        assert!(!dynemb_test_support::present(&var, &[9])[0]);
        // A row with a NaN anywhere is NonFinite, even after a value out
        // of range, in its values or in its slots.
        for nan_in_slot in [false, true] {
            let r = var.update_rows(&[1], &[m], |_, v, s| {
                v[0] = 70000.0;
                s[0] = 70000.0;
                if nan_in_slot {
                    s[2] = f32::NAN;
                } else {
                    v[2] = f32::NAN;
                }
            });
            assert!(
                matches!(r, Err(Error::NonFinite { index: 0, value, .. }) if value.is_nan()),
                "{r:?}"
            );
        }
    }
}

/// Out of range (1e5, -7e4) or a nonzero value that rounds to 0 (1e-9):
/// refused in f16 slots, nothing created.
#[test]
fn a_slot_initial_value_that_does_not_fit_creates_nothing() {
    let var = Variable::<i64>::builder("s")
        .slot_dtype(Dtype::F16)
        .build()
        .unwrap();
    assert_eq!(Dtype::F16.round(1e-9), 0.0);
    for initial in [1e5, 1e-9, -1e-9] {
        let err = var.create_slot("acc", initial).unwrap_err();
        assert!(
            matches!(
                err,
                Error::OutOfRange {
                    what: "slot initial value",
                    index: 0,
                    dtype: Dtype::F16,
                    ..
                }
            ),
            "{initial}: {err}"
        );
    }
    for bad in [-7e4, 1e-9] {
        let err = var.create_slots(&[("m", 0.0), ("v", bad)]).unwrap_err();
        assert!(matches!(err, Error::OutOfRange { index: 1, .. }), "{err}");
        assert!(var.check_create_slots(&[("v", bad)]).is_err());
    }
    assert!(var.slot_names().is_empty(), "no slot created");
    // Zero of either sign, and a value that becomes an f16 subnormal, start
    // slots.
    let subnormal = 1e-6;
    assert_ne!(Dtype::F16.round(subnormal), 0.0);
    for (name, initial) in [("m", 0.0), ("n", -0.0), ("small", subnormal)] {
        let id = var.create_slot(name, initial).unwrap();
        assert_eq!(var.slot_initial(id).unwrap(), Dtype::F16.round(initial));
    }
    // bf16 has f32's range: both values start slots there, rounded.
    let var = Variable::<i64>::builder("s")
        .slot_dtype(Dtype::Bf16)
        .build()
        .unwrap();
    let id = var.create_slot("acc", 1e5).unwrap();
    assert_eq!(var.slot_initial(id).unwrap(), Dtype::Bf16.round(1e5));
    assert_ne!(Dtype::Bf16.round(1e5), 1e5);
    // Asking again with the unrounded value finds the same slot.
    assert_eq!(var.create_slot("acc", 1e5).unwrap(), id);
    let tiny = var.create_slot("tiny", 1e-9).unwrap();
    assert_eq!(var.slot_initial(tiny).unwrap(), Dtype::Bf16.round(1e-9));
}

#[test]
fn a_checkpoint_slot_initial_value_that_rounds_to_zero_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let src = Variable::<i64>::builder("emb").dim(2).build().unwrap();
    src.create_slot("acc", 1e-9).unwrap();
    src.upsert(&[1], &[0.5, 0.25]).unwrap();
    src.save(dir.path()).unwrap();
    let dst = Variable::<i64>::builder("emb")
        .dim(2)
        .slot_dtype(Dtype::F16)
        .build()
        .unwrap();
    dst.upsert(&[7], &[1.0, 2.0]).unwrap();
    let before = snapshot(&dst);
    for load in [false, true] {
        let err = if load {
            dst.load(dir.path())
        } else {
            dst.restore(dir.path())
        }
        .unwrap_err();
        assert!(
            matches!(
                err,
                Error::OutOfRange {
                    what: "checkpoint slot initial value",
                    dtype: Dtype::F16,
                    ..
                }
            ),
            "{err}"
        );
        assert_eq!(snapshot(&dst), before, "load {load}: nothing changed");
        assert!(dst.slot_names().is_empty());
    }
}

/// `save_rows` refuses to write what restoring would refuse: an f16 slot
/// starting at 1e-9, which rounds to 0.
#[test]
fn save_rows_refuses_a_slot_initial_value_that_rounds_to_zero() {
    let dir = tempfile::tempdir().unwrap();
    let info = |initial: f32| TableInfo {
        name: "emb".into(),
        dim: 1,
        slots: vec![("acc".into(), initial)],
        scores: None,
        shards: 1,
        value_dtype: Dtype::F32,
        slot_dtype: Dtype::F16,
    };
    let rows = || Rows {
        keys: vec![1i64],
        values: vec![0.5],
        slots: vec![vec![0.25]],
        scores: None,
    };
    let err = save_rows(dir.path(), &info(1e-9), [Ok(rows())]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::OutOfRange {
                what: "slot initial value",
                index: 0,
                dtype: Dtype::F16,
                ..
            }
        ),
        "{err}"
    );
    assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none());
    save_rows(dir.path(), &info(0.0), [Ok(rows())]).unwrap();
    let dst = Variable::<i64>::builder("emb")
        .dim(1)
        .slot_dtype(Dtype::F16)
        .build()
        .unwrap();
    dst.restore(dir.path()).unwrap();
    assert_eq!(dst.size(), 1);
}

#[test]
fn an_initializer_out_of_range_is_refused_at_build() {
    let build = |dtype: Dtype, init: Initializer| {
        Variable::<i64>::builder("b")
            .value_dtype(dtype)
            .initializer(init)
            .build()
    };
    let err = build(Dtype::F16, Initializer::Constant(1e5)).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    assert!(build(Dtype::F16, Initializer::Constant(65504.0)).is_ok());
    assert!(build(Dtype::Bf16, Initializer::Constant(1e5)).is_ok());
    assert!(build(Dtype::F32, Initializer::Constant(1e5)).is_ok());
    let wide = Initializer::RandomNormal {
        mean: 0.0,
        stddev: 1e4,
        seed: 1,
    };
    assert!(matches!(
        build(Dtype::F16, wide.clone()),
        Err(Error::InvalidArgument(_))
    ));
    assert!(build(Dtype::Bf16, wide).is_ok());
    let err = build(Dtype::Bf16, Initializer::Constant(f32::MAX)).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    assert!(build(Dtype::F32, Initializer::Constant(f32::MAX)).is_ok());
    let err = build(Dtype::F16, Initializer::Values(vec![1.0, -7e4])).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
}

#[test]
fn bf16_holds_f32_range_but_not_its_largest_values() {
    let var = half(Dtype::Bf16);
    let largest = f32::from_bits(0x7f7f_0000);
    var.upsert(&[1], &[largest, -largest, 1e38, 1e-38]).unwrap();
    assert_eq!(
        lookup(&var, &[1]),
        [
            largest,
            -largest,
            Dtype::Bf16.round(1e38),
            Dtype::Bf16.round(1e-38)
        ]
    );
    let before = snapshot(&var);
    for v in [f32::MAX, -f32::MAX, f32::from_bits(0x7f7f_8000)] {
        let err = var.upsert(&[1], &[0.0, v, 0.0, 0.0]).unwrap_err();
        assert!(
            matches!(
                err,
                Error::OutOfRange {
                    index: 1,
                    dtype: Dtype::Bf16,
                    ..
                }
            ),
            "{v}: {err}"
        );
    }
    // Just below the halfway point rounds down to the largest bf16.
    var.upsert(&[2], &[f32::from_bits(0x7f7f_7fff); 4]).unwrap();
    assert_eq!(lookup(&var, &[2]), [largest; 4]);
    var.remove(&[2]).unwrap();
    assert_eq!(snapshot(&var), before);
}

// ---------------------------------------------------------------- 3. missing keys

#[test]
fn a_missing_key_reads_the_initializer_row_rounded() {
    let init = Initializer::RandomNormal {
        mean: 0.3,
        stddev: 1.7,
        seed: 9,
    };
    let dim = 37;
    let keys: Vec<i64> = (-20..30).collect();
    let mut raw = vec![0.0; keys.len() * dim];
    for (k, row) in keys.iter().zip(raw.chunks_exact_mut(dim)) {
        init.fill(*k as u64, row);
    }
    for dtype in Dtype::ALL {
        let var = Variable::<i64>::builder("init")
            .dim(dim)
            .shards(3)
            .initializer(init.clone())
            .value_dtype(dtype)
            .build()
            .unwrap();
        let want = rounded(dtype, &raw);
        if dtype != Dtype::F32 {
            assert_ne!(want, raw, "{dtype}: the rows do need rounding");
        }
        let read = lookup(&var, &keys);
        assert_bits(
            &read,
            &want,
            format_args!("{dtype}: lookup of missing keys"),
        );
        let mut out = vec![0.0; read.len()];
        let mut exists = vec![true; keys.len()];
        var.lookup_with_exists(&keys, &mut out, &mut exists)
            .unwrap();
        assert_bits(&out, &want, format_args!("{dtype}: lookup_with_exists"));
        assert!(exists.iter().all(|&e| !e));
        assert_eq!(var.size(), 0, "reads insert nothing");
        // update_rows on a missing key starts from the same row.
        var.update_rows(&keys[..1], &[], |_, v, _| {
            assert_bits(v, &want[..dim], format_args!("{dtype}: update_rows input"));
        })
        .unwrap();
        var.remove(&keys[..1]).unwrap();
        var.lookup_or_insert(&keys, &mut out).unwrap();
        assert_bits(&out, &want, format_args!("{dtype}: lookup_or_insert"));
        assert_eq!(var.size(), keys.len());
        assert_bits(
            &lookup(&var, &keys),
            &want,
            format_args!("{dtype}: stored rows"),
        );
        let (exported_keys, exported) = var.export().unwrap();
        for (i, k) in exported_keys.iter().enumerate() {
            let at = keys.iter().position(|x| x == k).unwrap();
            assert_bits(
                &exported[i * dim..(i + 1) * dim],
                &want[at * dim..(at + 1) * dim],
                format_args!("{dtype}: export of {k}"),
            );
        }
    }
}

// ---------------------------------------------------------------- 4. checkpoints

/// Dtype pairs (values, slots) the checkpoint tests save from and restore
/// into.
const PAIRS: [(Dtype, Dtype); 5] = [
    (Dtype::F32, Dtype::F32),
    (Dtype::F16, Dtype::F16),
    (Dtype::Bf16, Dtype::Bf16),
    (Dtype::F16, Dtype::Bf16),
    (Dtype::Bf16, Dtype::F32),
];

fn ckpt_var(name: &str, (values, slots): (Dtype, Dtype), shards: usize) -> Variable<i64> {
    Variable::<i64>::builder(name)
        .dim(5)
        .shards(shards)
        .value_dtype(values)
        .slot_dtype(slots)
        .restrict_policy(RestrictPolicy::Frequency)
        .build()
        .unwrap()
}

/// The tensors of every data file of the checkpoint at `dir`: name ->
/// dtypes seen.
fn tensor_dtypes(dir: &std::path::Path) -> HashMap<String, Vec<safetensors::Dtype>> {
    let mut seen: HashMap<String, Vec<safetensors::Dtype>> = HashMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "safetensors") {
            let bytes = std::fs::read(&path).unwrap();
            let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
            for (name, view) in file.tensors() {
                let dtypes = seen.entry(name).or_default();
                if !dtypes.contains(&view.dtype()) {
                    dtypes.push(view.dtype());
                }
            }
        }
    }
    seen
}

fn safetensors_dtype(dtype: Dtype) -> safetensors::Dtype {
    match dtype {
        Dtype::F32 => safetensors::Dtype::F32,
        Dtype::F16 => safetensors::Dtype::F16,
        Dtype::Bf16 => safetensors::Dtype::BF16,
    }
}

#[test]
fn checkpoints_round_trip_across_dtypes() {
    let dir = tempfile::tempdir().unwrap();
    let keys: Vec<i64> = (0..40).map(|i| i * 31 - 500).collect();
    for (s, &source) in PAIRS.iter().enumerate() {
        let src = ckpt_var("emb", source, 2);
        let [m, v] = [("m", 0.0), ("v", 0.1)].map(|(n, i)| src.create_slot(n, i).unwrap());
        src.upsert(&keys, &vals(10 + s as u64, keys.len(), 5))
            .unwrap();
        src.update_rows(&keys[..30], &[m, v], |pos, values, slots| {
            step(s as u64, pos, values, slots);
        })
        .unwrap();
        // A few more writes so scores differ.
        src.accum(&keys[..5], &vals(3, 5, 5), &[true; 5]).unwrap();
        let path = dir.path().join(format!("from-{s}"));
        src.save(&path).unwrap();
        let values = lookup(&src, &keys);
        let slot_rows = [lookup_slot(&src, m, &keys), lookup_slot(&src, v, &keys)];
        let mut scores = vec![0; keys.len()];
        src.lookup_scores(&keys, &mut scores).unwrap();

        // index.json names the dtypes only when they are not f32.
        let index: serde_json::Value =
            serde_json::from_slice(&std::fs::read(path.join("index.json")).unwrap()).unwrap();
        for (field, dtype) in [("value_dtype", source.0), ("slot_dtype", source.1)] {
            match dtype {
                Dtype::F32 => assert!(index.get(field).is_none(), "{field} for f32: {index}"),
                _ => assert_eq!(index[field], dtype.name(), "{field}"),
            }
        }
        // The files hold the native dtypes.
        let tensors = tensor_dtypes(&path);
        assert_eq!(tensors["values"], vec![safetensors_dtype(source.0)]);
        for slot in ["slot.m", "slot.v"] {
            assert_eq!(tensors[slot], vec![safetensors_dtype(source.1)], "{slot}");
        }
        assert_eq!(tensors["scores"], vec![safetensors::Dtype::U64]);

        for (t, &target) in PAIRS.iter().enumerate() {
            let dst = ckpt_var("emb", target, 3);
            dst.upsert(&[123_456], &[1.0; 5]).unwrap();
            dst.restore(&path).unwrap();
            let what = format!("{source:?} -> {target:?}");
            assert_eq!(dst.size(), keys.len(), "{what}");
            assert_bits(
                &lookup(&dst, &keys),
                &rounded(target.0, &values),
                format_args!("{what}: values"),
            );
            for (j, name) in ["m", "v"].into_iter().enumerate() {
                let id = dst.slot_id(name).unwrap();
                assert_bits(
                    &lookup_slot(&dst, id, &keys),
                    &rounded(target.1, &slot_rows[j]),
                    format_args!("{what}: slot {name}"),
                );
            }
            // The slot's initial value: the one asked for, rounded to the
            // target's slot dtype.
            let initial = dst.slot_initial(dst.slot_id("v").unwrap()).unwrap();
            assert_eq!(initial, target.1.round(0.1), "{what}");
            let mut got = vec![0; keys.len()];
            dst.lookup_scores(&keys, &mut got).unwrap();
            assert_eq!(got, scores, "{what}: scores");
            // Saving again stores the target's dtypes.
            let again = dir.path().join(format!("again-{s}-{t}"));
            dst.save(&again).unwrap();
            let tensors = tensor_dtypes(&again);
            assert_eq!(tensors["values"], vec![safetensors_dtype(target.0)]);
            assert_eq!(tensors["slot.v"], vec![safetensors_dtype(target.1)]);
        }
    }
}

/// An optimizer creates its slots with the initial values it was given,
/// before or after a restore: a checkpoint of another dtype must not make
/// them a mismatch.
#[test]
fn slots_created_by_the_user_agree_with_a_checkpoint_of_another_dtype() {
    let dir = tempfile::tempdir().unwrap();
    for (s, &source) in PAIRS.iter().enumerate() {
        let src = ckpt_var("emb", source, 1);
        src.create_slots(&[("m", 0.0), ("v", 0.1), ("w", -2.7)])
            .unwrap();
        src.upsert(&[1, 2], &vals(5, 2, 5)).unwrap();
        let path = dir.path().join(format!("c{s}"));
        src.save(&path).unwrap();
        for &target in &PAIRS {
            let what = format!("{source:?} -> {target:?}");
            // Slots created before the restore.
            let before = ckpt_var("emb", target, 1);
            before
                .create_slots(&[("m", 0.0), ("v", 0.1), ("w", -2.7)])
                .unwrap();
            before
                .restore(&path)
                .unwrap_or_else(|e| panic!("{what}: restore into created slots: {e}"));
            // Slots created after: the same call finds them.
            let after = ckpt_var("emb", target, 1);
            after.restore(&path).unwrap();
            after
                .create_slots(&[("m", 0.0), ("v", 0.1), ("w", -2.7)])
                .unwrap_or_else(|e| panic!("{what}: create_slots after restore: {e}"));
            assert_eq!(after.slot_names(), ["m", "v", "w"]);
        }
    }
}

#[test]
fn restoring_values_out_of_range_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let src = ckpt_var("emb", (Dtype::F32, Dtype::F32), 1);
    src.upsert(&[1, 2], &[[1.0; 5], [1.0, 2.0, 70000.0, 4.0, 5.0]].concat())
        .unwrap();
    src.save(dir.path().join("values")).unwrap();
    let slotted = ckpt_var("emb", (Dtype::F32, Dtype::F32), 1);
    let m = slotted.create_slot("m", 0.0).unwrap();
    slotted.upsert(&[1], &[1.0; 5]).unwrap();
    slotted
        .update_rows(&[1], &[m], |_, _, s| s[4] = -1e5)
        .unwrap();
    slotted.save(dir.path().join("slots")).unwrap();
    let init = ckpt_var("emb", (Dtype::F32, Dtype::F32), 1);
    init.create_slot("acc", 1e5).unwrap();
    init.save(dir.path().join("initial")).unwrap();

    for (ckpt, (values, slots), what) in [
        ("values", (Dtype::F16, Dtype::F32), "checkpoint values"),
        ("slots", (Dtype::F32, Dtype::F16), "checkpoint slot rows"),
        (
            "initial",
            (Dtype::Bf16, Dtype::F16),
            "checkpoint slot initial value",
        ),
    ] {
        let dst = ckpt_var("emb", (values, slots), 2);
        dst.create_slot("own", 0.5).unwrap();
        dst.upsert(&[7, 8], &vals(1, 2, 5)).unwrap();
        let before = snapshot(&dst);
        for load in [false, true] {
            let r = if load {
                dst.load(dir.path().join(ckpt))
            } else {
                dst.restore(dir.path().join(ckpt))
            };
            assert!(
                matches!(r, Err(Error::OutOfRange { what: w, dtype: Dtype::F16, .. }) if w == what),
                "{ckpt} (load {load}): {r:?}"
            );
            assert_eq!(snapshot(&dst), before, "{ckpt}: nothing changed");
            assert_eq!(dst.slot_names(), ["own"], "{ckpt}: no slot created");
        }
    }
}

#[test]
fn rows_saved_in_half_read_back_rounded() {
    let dir = tempfile::tempdir().unwrap();
    let dim = 6;
    let info = TableInfo {
        name: "emb".into(),
        dim,
        slots: vec![("m".into(), 0.0), ("v".into(), 0.1)],
        scores: Some(RestrictPolicy::Frequency),
        shards: 1,
        value_dtype: Dtype::Bf16,
        slot_dtype: Dtype::F16,
    };
    let keys: Vec<i64> = (0..50).collect();
    let rows = Rows {
        keys: keys.clone(),
        values: vals(1, keys.len(), dim),
        slots: vec![vals(2, keys.len(), dim), vals(3, keys.len(), dim)],
        scores: Some(keys.iter().map(|&k| k as u64 + 1).collect()),
    };
    let path = dir.path().join("rows");
    save_rows(&path, &info, [Ok(rows.clone())]).unwrap();
    let tensors = tensor_dtypes(&path);
    assert_eq!(tensors["values"], vec![safetensors::Dtype::BF16]);
    assert_eq!(tensors["slot.v"], vec![safetensors::Dtype::F16]);

    let reader = Reader::<i64>::open(&path, "emb", dim).unwrap();
    let read_info = reader.info();
    assert_eq!(
        (read_info.value_dtype, read_info.slot_dtype),
        (Dtype::Bf16, Dtype::F16)
    );
    assert_eq!(read_info.slots, info.slots, "initial values as asked");
    let mut seen = 0;
    reader
        .for_each(|batch| {
            for (i, &k) in batch.keys.iter().enumerate() {
                let at = k as usize * dim..(k as usize + 1) * dim;
                let row = i * dim..(i + 1) * dim;
                assert_bits(
                    &batch.values[row.clone()],
                    &rounded(Dtype::Bf16, &rows.values[at.clone()]),
                    "values",
                );
                for j in 0..2 {
                    assert_bits(
                        &batch.slots[j][row.clone()],
                        &rounded(Dtype::F16, &rows.slots[j][at.clone()]),
                        "slots",
                    );
                }
                seen += 1;
            }
            Ok(())
        })
        .unwrap();
    assert_eq!(seen, keys.len());

    // Into an f32 variable: the half values, exactly.
    let var = Variable::<i64>::builder("emb")
        .dim(dim)
        .shards(2)
        .restrict_policy(RestrictPolicy::Frequency)
        .build()
        .unwrap();
    var.restore(&path).unwrap();
    assert_bits(
        &lookup(&var, &keys),
        &rounded(Dtype::Bf16, &rows.values),
        "restored",
    );

    // Rows out of the info's range publish nothing.
    let mut bad = rows.clone();
    bad.slots[0][7] = 70000.0;
    let err = save_rows(&path, &info, [Ok(bad)]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::OutOfRange {
                index: 7,
                dtype: Dtype::F16,
                ..
            }
        ),
        "{err}"
    );
    let mut bad_info = info.clone();
    bad_info.slots[0].1 = 1e5;
    let err = save_rows(&path, &bad_info, [Ok(rows)]).unwrap_err();
    assert!(matches!(err, Error::OutOfRange { index: 0, .. }), "{err}");
    assert_eq!(Reader::<i64>::open(&path, "emb", dim).unwrap().rows(), 50);
}

// ---------------------------------------------------------------- 5. lifecycle

#[test]
fn capacity_evicts_rounded_rows_to_the_listener() {
    for dtype in [Dtype::F16, Dtype::Bf16] {
        let evicted = Arc::new(Mutex::new(HashMap::<i64, (Vec<f32>, Vec<f32>)>::new()));
        let sink = Arc::clone(&evicted);
        let var = Variable::<i64>::builder("cap")
            .dim(3)
            .value_dtype(dtype)
            .slot_dtype(dtype)
            .capacity(4)
            .restrict_policy(RestrictPolicy::Frequency)
            .on_evict(move |batch: Evicted<'_, i64>| {
                let m = batch.slot("m").unwrap();
                let mut sink = sink.lock().unwrap();
                for (i, &k) in batch.keys().iter().enumerate() {
                    let row = i * 3..(i + 1) * 3;
                    sink.insert(k, (batch.values()[row.clone()].to_vec(), m[row].to_vec()));
                }
            })
            .build()
            .unwrap();
        var.create_slot("m", 0.1).unwrap();
        let mut written = HashMap::new();
        for k in 0..20i64 {
            let row = vals(k as u64, 1, 3);
            var.upsert(&[k], &row).unwrap();
            written.insert(k, row);
            assert!(var.size() <= 4);
        }
        let evicted = evicted.lock().unwrap();
        assert_eq!(evicted.len(), 16, "{dtype}");
        for (k, (values, slot)) in evicted.iter() {
            assert_bits(
                values,
                &rounded(dtype, &written[k]),
                format_args!("{dtype}: evicted {k}"),
            );
            assert_bits(
                slot,
                &[dtype.round(0.1); 3],
                format_args!("{dtype}: slot of {k}"),
            );
        }
        let (keys, values) = var.export().unwrap();
        for (i, k) in keys.iter().enumerate() {
            assert_bits(
                &values[i * 3..(i + 1) * 3],
                &rounded(dtype, &written[k]),
                "kept",
            );
        }
    }
}

#[test]
fn admission_inserts_the_rounded_initial_row() {
    for dtype in [Dtype::F16, Dtype::Bf16] {
        let var = Variable::<i64>::builder("adm")
            .dim(4)
            .value_dtype(dtype)
            .initializer(Initializer::Constant(0.1))
            .admission(Admission::Exact { min_count: 2 })
            .build()
            .unwrap();
        let want = [dtype.round(0.1); 4];
        let mut out = [0.0; 4];
        var.lookup_or_insert(&[5], &mut out).unwrap();
        assert_eq!(out, want, "{dtype}: a read before admission");
        assert_eq!(var.size(), 0);
        var.lookup_or_insert(&[5], &mut out).unwrap();
        assert_eq!(out, want, "{dtype}: the admitting read");
        assert_eq!(var.size(), 1);
        var.accum(&[5], &[1e-3; 4], &[true]).unwrap();
        assert_eq!(
            lookup(&var, &[5]),
            [dtype.round(want[0] + 1e-3); 4],
            "{dtype}"
        );
    }
}

#[test]
fn expire_and_restrict_keep_rounded_rows() {
    for dtype in [Dtype::F16, Dtype::Bf16] {
        let var = Variable::<i64>::builder("exp")
            .dim(2)
            .value_dtype(dtype)
            .restrict_policy(RestrictPolicy::Timestamp)
            .build()
            .unwrap();
        var.upsert(&[1, 2], &vals(4, 2, 2)).unwrap();
        assert_eq!(var.expire(Duration::from_secs(3600)).unwrap(), 0);
        assert_bits(
            &lookup(&var, &[1, 2]),
            &rounded(dtype, &vals(4, 2, 2)),
            "after expire",
        );
        assert_eq!(var.expire(Duration::ZERO).unwrap(), 2);
        assert_eq!(var.size(), 0);

        let var = Variable::<i64>::builder("freq")
            .dim(2)
            .value_dtype(dtype)
            .slot_dtype(dtype)
            .restrict_policy(RestrictPolicy::Frequency)
            .build()
            .unwrap();
        let keys: Vec<i64> = (0..8).collect();
        var.upsert(&keys, &vals(6, 8, 2)).unwrap();
        // Keys 6 and 7 are written most often.
        for _ in 0..3 {
            var.accum(&[6, 7], &[0.3; 4], &[true, true]).unwrap();
        }
        let kept = lookup(&var, &[6, 7]);
        assert_eq!(var.restrict(2, 0).unwrap(), 6);
        assert_eq!(
            dynemb_test_support::present(&var, &keys),
            [vec![false; 6], vec![true; 2]].concat()
        );
        assert_bits(&lookup(&var, &[6, 7]), &kept, "kept rows");
        let mut want = rounded(dtype, &vals(6, 8, 2)[12..]);
        for _ in 0..3 {
            want.iter_mut().for_each(|x| *x = dtype.round(*x + 0.3));
        }
        assert_bits(&kept, &want, format_args!("{dtype}: accumulated"));
    }
}

/// `n` steps adding `delta` to every value of 64 keys of dim 8 through
/// `update_rows`; returns the values.
fn add_steps(var: &Variable<i64>, n: usize, delta: f32) -> Vec<f32> {
    let keys: Vec<i64> = (0..64).collect();
    var.upsert(&keys, &vec![1.0; keys.len() * 8]).unwrap();
    for _ in 0..n {
        var.update_rows(&keys, &[], |_, v, _| v.iter_mut().for_each(|x| *x += delta))
            .unwrap();
    }
    lookup(var, &keys)
}

fn rounding_var(dtype: Dtype, rounding: Rounding) -> Variable<i64> {
    Variable::<i64>::builder("sr")
        .dim(8)
        .value_dtype(dtype)
        .rounding(rounding)
        .build()
        .unwrap()
}

#[test]
fn stochastic_rounding_is_reproducible_and_unbiased() {
    let (n, delta) = (1000, 1e-3);
    let exact = add_steps(&rounding_var(Dtype::F32, Rounding::NearestEven), n, delta)[0];
    let nearest = add_steps(&rounding_var(Dtype::Bf16, Rounding::NearestEven), n, delta);
    assert!(
        nearest.iter().all(|&x| x == 1.0),
        "nearest even loses every step"
    );

    let stochastic = |seed| {
        add_steps(
            &rounding_var(Dtype::Bf16, Rounding::Stochastic { seed }),
            n,
            delta,
        )
    };
    let a = stochastic(7);
    let b = stochastic(7);
    let c = stochastic(8);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&a), bits(&b), "the same seed stores the same bits");
    assert_ne!(bits(&a), bits(&c), "another seed stores other bits");
    assert!(
        a.iter().all(|&x| x == Dtype::Bf16.round(x)),
        "stored values are bf16"
    );
    let mean = a.iter().map(|&x| f64::from(x)).sum::<f64>() / a.len() as f64;
    let f32_result = f64::from(exact);
    assert!(
        (mean - f32_result).abs() < 0.05,
        "mean {mean}, f32 {f32_result}"
    );
    assert!((mean - f32_result).abs() < (1.0 - f32_result).abs());
    // F16 columns round to nearest even whatever the setting.
    let f16_stoch = add_steps(
        &rounding_var(Dtype::F16, Rounding::Stochastic { seed: 7 }),
        50,
        delta,
    );
    let f16_nearest = add_steps(&rounding_var(Dtype::F16, Rounding::NearestEven), 50, delta);
    assert_eq!(bits(&f16_stoch), bits(&f16_nearest));
}

#[test]
fn stochastic_rounding_applies_to_a_step_that_inserts_a_key_too() {
    // 1 + 2^-9 is a quarter of the way from 1 to the next bf16: about a
    // quarter of the values and slot values round up, whether the step
    // updates present rows or inserts missing keys.
    let value = 1.0 + 2f32.powi(-9);
    let dim = 4;
    let keys: Vec<i64> = (0..4096).collect();
    let var = Variable::<i64>::builder("stochastic_insert")
        .dim(dim)
        .value_dtype(Dtype::Bf16)
        .slot_dtype(Dtype::Bf16)
        .rounding(Rounding::Stochastic { seed: 7 })
        .build()
        .unwrap();
    let m = var.create_slot("m", 0.0).unwrap();
    let (present, missing) = keys.split_at(2048);
    var.upsert(present, &vec![0.0; present.len() * dim])
        .unwrap();
    for half in [present, missing] {
        var.update_rows(half, &[m], |_, row, slot| {
            row.fill(value);
            slot.fill(value);
        })
        .unwrap();
        let up =
            |rows: Vec<f32>| rows.iter().filter(|&&v| v > 1.0).count() as f64 / rows.len() as f64;
        let (values, slots) = (lookup(&var, half), lookup_slot(&var, m, half));
        for (what, share) in [("values", up(values)), ("slots", up(slots))] {
            assert!(
                (0.2..0.3).contains(&share),
                "{what} of {} keys: {share} rounded up",
                if half == present {
                    "present"
                } else {
                    "missing"
                }
            );
        }
    }
}

// ---------------------------------------------------------------- 6. memory

#[test]
fn bf16_rows_take_about_half_the_memory() {
    let n = 4096i64;
    let keys: Vec<i64> = (0..n).collect();
    let bytes = |dtype: Dtype| {
        let var = Variable::<i64>::builder("mem")
            .dim(64)
            .value_dtype(dtype)
            .init_size(n as usize)
            .build()
            .unwrap();
        var.upsert(&keys, &vals(1, keys.len(), 64)).unwrap();
        var.memory_bytes()
    };
    let (f32_bytes, bf16_bytes) = (bytes(Dtype::F32), bytes(Dtype::Bf16));
    // Both have the same index: the difference is the rows' values alone,
    // 64 * 2 bytes per row.
    assert_eq!(
        f32_bytes - bf16_bytes,
        n as usize * 128,
        "{f32_bytes} vs {bf16_bytes}"
    );
    let index = f32_bytes - n as usize * 272;
    let ratio = (bf16_bytes - index) as f64 / (f32_bytes - index) as f64;
    assert!((ratio - 144.0 / 272.0).abs() < 1e-9, "rows ratio {ratio}");
    println!("dim 64, {n} rows: f32 {f32_bytes} bytes, bf16 {bf16_bytes} bytes, index {index}");
}
