//! Random sequences of every public `Variable` operation against a
//! `HashMap` model, checked after every operation.
//!
//! The input picks a key type (i64, u64, i32, u32), a dim (1, 3, 8, 17), 1
//! to 4 shards, a partitioner (modulo, a custom hash, or a custom one that
//! names a shard out of range for one key), an exact initializer, a
//! restrict policy (none, frequency, timestamp), the value and slot dtypes
//! (f32, f16, bf16 each), how many slots rows keep inline (0 to 2; the
//! rest in columns of their own) and a list of operations. Values are small
//! integers, so the model's sums are exact in `f32` and rows are compared
//! with `==`; with a half dtype the model rounds every value it writes to
//! the dtype (an accumulation: `round(old + delta)`, in `f32`), and a
//! result that leaves the dtype's range (an f16 row that optimizer steps
//! grew past 65504) is refused for its row with `OutOfRange`.
//!
//! The model (TFRA semantics, as documented on `Variable`):
//! - `lookup`/`lookup_with_exists` never insert; a missing key reads the
//!   initializer's row (and `false`); `lookup_or_insert` inserts it;
//! - `upsert`: a key repeated in one batch ends with its last row;
//! - `accum` (`bp_v2`), per occurrence in batch order: a key present before
//!   the batch gets `row += delta` if its flag says it exists, and is left
//!   alone otherwise; a key absent before the batch is inserted with
//!   `delta` as its row by its first occurrence whose flag says it does not
//!   exist, earlier occurrences are ignored, and every later occurrence is
//!   added ("a key the batch itself inserted gets the later deltas added");
//! - `update_rows`: each occurrence in order gets the row as the previous
//!   one left it (a missing key: the initializer's row and every slot's
//!   initial value), once; a row it leaves non-finite is not written (a
//!   missing key is not inserted) and the call returns `NonFinite` with the
//!   first such position (`OutOfRange` for a row that does not fit its
//!   dtypes, likewise);
//! - slots: `create_slot` adds a column whose rows all start at its initial
//!   value (existing rows included), again returns the same id (an equal
//!   initial value) or `Mismatch`; at most `MAX_SLOTS`;
//! - scores: frequency counts writes (an insert is the first, every applied
//!   upsert/accum/update occurrence one more, reads none); timestamps are
//!   one per shard's share of a call, increasing, so the model compares
//!   their order (call number, shard);
//! - `restrict(n, trigger)`: removes exactly `size - n` rows when `size >
//!   trigger`, and never a row scored above one it keeps;
//! - bad inputs (wrong lengths, NaN or infinite values, a partitioner's
//!   shard out of range, a repeated slot, another variable's slot) are an
//!   `Err` and change nothing.
//!
//! After every operation the whole state is compared: `size`, every
//! `shard_size`, `export` (each key once), every slot column, every score.

#![no_main]

use arbitrary::Arbitrary;
use dynemb::{Dtype, Error, Initializer, Partitioner, RestrictPolicy, SlotId, Variable, MAX_SLOTS};
use dynemb_fuzz::{accum_effects, small, small_row, AccumEffect, FuzzKey, DIMS, KEYS};
use libfuzzer_sys::fuzz_target;
use std::collections::HashMap;
use std::sync::Arc;

/// Most operations run per input (keeps each run short).
const MAX_OPS: usize = 64;
/// Most keys per batch: more than the table's pipeline depth (36), so
/// batches run through its steady state too.
const MAX_BATCH: usize = 80;

/// Slot names a case may create, with their initial values: more than
/// `MAX_SLOTS`, so the limit is reached.
const SLOTS: [(&str, f32); 10] = [
    ("m", 0.0),
    ("v", 0.5),
    ("acc", -1.0),
    ("s3", 3.0),
    ("s4", -4.0),
    ("s5", 5.0),
    ("s6", 6.0),
    ("s7", -7.0),
    ("s8", 8.0),
    ("s9", 9.0),
];

#[derive(Arbitrary, Debug, Clone, Copy)]
enum KeyType {
    I64,
    U64,
    I32,
    U32,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Init {
    Zeros,
    Constant(i8),
    /// `Values` with a small-integer row of this seed.
    Values(i8),
    /// `RandomNormal` with stddev 0: exactly the mean.
    Normal(i8),
    /// `TruncatedNormal` with stddev 0: exactly the mean.
    Truncated(i8),
    /// `RandomUniform` with low == high: exactly low.
    Uniform(i8),
}

#[derive(Arbitrary, Debug, Clone, Copy, PartialEq)]
enum Policy {
    None,
    Frequency,
    Timestamp,
}

#[derive(Arbitrary, Debug, Clone, Copy, PartialEq)]
enum Part {
    Modulo,
    Hash,
    /// Sends `BAD_KEY` to shard `shards` (out of range): every batch holding
    /// it fails, one shard included.
    Bad,
}

/// The key index a `Part::Bad` partitioner refuses.
const BAD_KEY: usize = 7;

#[derive(Arbitrary, Debug)]
struct Case {
    key_type: KeyType,
    dim: u8,
    shards: u8,
    init_size: u8,
    init: Init,
    policy: Policy,
    part: Part,
    /// The value dtype (`% 3`) and the slot dtype (`/ 3 % 3`), of
    /// `Dtype::ALL`.
    dtypes: u8,
    ops: Vec<Op>,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum BadLen {
    Lookup,
    LookupExistsOut,
    LookupExistsFlags,
    LookupOrInsert,
    Upsert,
    AccumDeltas,
    AccumFlags,
    LookupSlot,
    LookupScores,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum CreateKind {
    /// The slot's own initial value.
    Plain,
    /// Another initial value: `Mismatch` if it exists (else created with it
    /// as if `Plain`).
    Conflicting,
    /// `-0.0` for a slot of initial `0.0`: equal, so the same id.
    NegZero,
    /// The empty name.
    Empty,
    /// A NaN initial value for a new name.
    NanInitial,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Lookup(Vec<u8>),
    LookupWithExists(Vec<u8>),
    LookupOrInsert(Vec<u8>),
    Upsert(Vec<(u8, i8)>),
    /// Deltas with caller-chosen exists flags.
    Accum(Vec<(u8, i8, bool)>),
    /// Deltas with the flags `lookup_with_exists` reports just before.
    AccumTruth(Vec<(u8, i8)>),
    Remove(Vec<u8>),
    Clear,
    Export,
    ExportChunks(u8),
    CreateSlot(u8, CreateKind),
    LookupSlot(u8, Vec<u8>),
    LookupScores(Vec<u8>),
    /// Keys, slots (indexes into the created slots; a repeat is an error),
    /// the update's seed, and an occurrence (position) whose update leaves
    /// a NaN in its row (`.1`: in the values, else in a slot if any).
    UpdateRows(Vec<u8>, Vec<u8>, i8, Option<(u8, bool)>),
    Restrict(u8, u8),
    BadLength(BadLen, Vec<u8>, i8),
    /// upsert (`.0`) or accum with a NaN/inf/-inf (`.2`) at element `.3`.
    NonFinite(bool, Vec<(u8, i8, bool)>, u8, u16),
    /// Another variable's slot id.
    ForeignSlot(u8, Vec<u8>),
}

fuzz_target!(|case: Case| {
    match case.key_type {
        KeyType::I64 => run::<i64>(&case),
        KeyType::U64 => run::<u64>(&case),
        KeyType::I32 => run::<i32>(&case),
        KeyType::U32 => run::<u32>(&case),
    }
});

fn hash_shard(bits: u64, n: usize) -> usize {
    (bits.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize % n
}

#[derive(Clone, Debug, PartialEq)]
struct Row {
    values: Vec<f32>,
    /// By slot index (creation order).
    slots: Vec<Vec<f32>>,
    /// Frequency: the count; timestamp: `call * 8 + shard` (the order of
    /// the real stamps); none: 0.
    score: u64,
}

struct Runner<K: FuzzKey> {
    var: Variable<K>,
    dim: usize,
    shards: usize,
    part: Part,
    policy: Policy,
    init_row: Vec<f32>,
    /// How values and slot rows are stored.
    value_dtype: Dtype,
    slot_dtype: Dtype,
    /// `(SLOTS index, id, initial)` in creation order.
    created: Vec<(usize, SlotId, f32)>,
    model: HashMap<u64, Row>,
    /// Number of the current call (timestamps).
    call: u64,
    /// A slot of another variable.
    foreign: SlotId,
}

impl<K: FuzzKey> Runner<K> {
    fn new(case: &Case) -> Runner<K> {
        let dim = DIMS[case.dim as usize % DIMS.len()];
        let shards = 1 + case.shards as usize % 4;
        let (init, init_row) = match case.init {
            Init::Zeros => (Initializer::Zeros, vec![0.0; dim]),
            Init::Constant(c) => (Initializer::Constant(c as f32), vec![c as f32; dim]),
            Init::Values(s) => (
                Initializer::Values(small_row(s, 0, dim)),
                small_row(s, 0, dim),
            ),
            Init::Normal(m) => (
                Initializer::RandomNormal {
                    mean: m as f32,
                    stddev: 0.0,
                    seed: m as u64,
                },
                vec![m as f32; dim],
            ),
            Init::Truncated(m) => (
                Initializer::TruncatedNormal {
                    mean: m as f32,
                    stddev: 0.0,
                    seed: 7,
                },
                vec![m as f32; dim],
            ),
            Init::Uniform(m) => (
                Initializer::RandomUniform {
                    low: m as f32,
                    high: m as f32,
                    seed: 3,
                },
                vec![m as f32; dim],
            ),
        };
        let value_dtype = Dtype::ALL[case.dtypes as usize % 3];
        let slot_dtype = Dtype::ALL[case.dtypes as usize / 3 % 3];
        let init_row = init_row.iter().map(|&v| value_dtype.round(v)).collect();
        let mut builder = Variable::<K>::builder("fuzz")
            .value_dtype(value_dtype)
            .slot_dtype(slot_dtype)
            .inline_slots(case.dtypes as usize / 9 % 3)
            .dim(dim)
            .shards(shards)
            .init_size(case.init_size as usize % 5)
            .initializer(init);
        builder = match case.part {
            Part::Modulo => builder,
            Part::Hash => builder.partitioner(Partitioner::Custom(Arc::new(hash_shard))),
            Part::Bad => {
                let bad = K::nth(BAD_KEY).to_bits();
                builder.partitioner(Partitioner::Custom(Arc::new(move |bits, n| {
                    if bits == bad {
                        n
                    } else {
                        hash_shard(bits, n)
                    }
                })))
            }
        };
        builder = match case.policy {
            Policy::None => builder,
            Policy::Frequency => builder.restrict_policy(RestrictPolicy::Frequency),
            Policy::Timestamp => builder.restrict_policy(RestrictPolicy::Timestamp),
        };
        let var = builder.build().expect("build");
        let other = Variable::<K>::builder("other")
            .build()
            .expect("build other");
        let foreign = other.create_slot("m", 0.0).expect("slot of other");
        Runner {
            var,
            dim,
            shards,
            part: case.part,
            policy: case.policy,
            init_row,
            value_dtype,
            slot_dtype,
            created: Vec::new(),
            model: HashMap::new(),
            call: 0,
            foreign,
        }
    }

    /// The shard of `k`, or `None` where the partitioner refuses it.
    fn shard_of(&self, k: K) -> Option<usize> {
        let bits = k.to_bits();
        match self.part {
            Part::Bad if bits == K::nth(BAD_KEY).to_bits() => None,
            _ if self.shards == 1 => Some(0),
            Part::Modulo => Some(k.floor_mod(self.shards)),
            Part::Hash => Some(hash_shard(bits, self.shards)),
            Part::Bad => Some(hash_shard(bits, self.shards)),
        }
    }

    /// Whether a call with `keys` fails on the partitioner.
    fn refused(&self, keys: &[K]) -> bool {
        keys.iter().any(|&k| self.shard_of(k).is_none())
    }

    fn expect_refused<T: std::fmt::Debug>(&self, what: &str, r: dynemb::Result<T>) {
        assert!(
            matches!(r, Err(Error::UnknownShard { .. })),
            "{what}: a key outside the shards must be refused, got {r:?}"
        );
    }

    /// The score a write in this call gives a row of `k`, after `old`.
    fn write_score(&self, k: K, old: u64) -> u64 {
        match self.policy {
            Policy::None => 0,
            Policy::Frequency => old + 1,
            Policy::Timestamp => self.call * 8 + self.shard_of(k).expect("a refused key") as u64,
        }
    }

    fn fresh_row(&self, values: Vec<f32>) -> Row {
        Row {
            values,
            slots: self
                .created
                .iter()
                .map(|&(_, _, init)| vec![init; self.dim])
                .collect(),
            score: 0,
        }
    }

    fn model_values(&self, k: K) -> Vec<f32> {
        self.model
            .get(&k.to_bits())
            .map_or_else(|| self.init_row.clone(), |r| r.values.clone())
    }

    fn apply(&mut self, op: &Op) {
        self.call += 1;
        let dim = self.dim;
        match op {
            Op::Lookup(idx) => {
                let keys = K::batch(idx);
                let mut out = vec![f32::NAN; keys.len() * dim];
                let r = self.var.lookup(&keys, &mut out);
                if self.refused(&keys) {
                    return self.expect_refused("lookup", r);
                }
                r.expect("lookup");
                let want: Vec<f32> = keys.iter().flat_map(|&k| self.model_values(k)).collect();
                assert_eq!(out, want, "lookup of {keys:?}");
            }
            Op::LookupWithExists(idx) => {
                let keys = K::batch(idx);
                let mut out = vec![f32::NAN; keys.len() * dim];
                let mut exists = vec![false; keys.len()];
                let r = self.var.lookup_with_exists(&keys, &mut out, &mut exists);
                if self.refused(&keys) {
                    return self.expect_refused("lookup_with_exists", r);
                }
                r.expect("lookup_with_exists");
                let want: Vec<f32> = keys.iter().flat_map(|&k| self.model_values(k)).collect();
                let want_exists: Vec<bool> = keys
                    .iter()
                    .map(|k| self.model.contains_key(&k.to_bits()))
                    .collect();
                assert_eq!(out, want, "lookup_with_exists rows of {keys:?}");
                assert_eq!(exists, want_exists, "lookup_with_exists flags of {keys:?}");
            }
            Op::LookupOrInsert(idx) => {
                let keys = K::batch(idx);
                let mut out = vec![f32::NAN; keys.len() * dim];
                let r = self.var.lookup_or_insert(&keys, &mut out);
                if self.refused(&keys) {
                    return self.expect_refused("lookup_or_insert", r);
                }
                r.expect("lookup_or_insert");
                for &k in &keys {
                    if !self.model.contains_key(&k.to_bits()) {
                        let mut row = self.fresh_row(self.init_row.clone());
                        row.score = self.write_score(k, 0);
                        self.model.insert(k.to_bits(), row);
                    }
                }
                let want: Vec<f32> = keys.iter().flat_map(|&k| self.model_values(k)).collect();
                assert_eq!(out, want, "lookup_or_insert of {keys:?}");
            }
            Op::Upsert(entries) => {
                let keys: Vec<K> = entries.iter().map(|&(k, _)| K::of(k)).collect();
                let values: Vec<f32> = entries
                    .iter()
                    .enumerate()
                    .flat_map(|(r, &(_, s))| small_row(s, r, dim))
                    .collect();
                let r = self.var.upsert(&keys, &values);
                if self.refused(&keys) {
                    return self.expect_refused("upsert", r);
                }
                r.expect("upsert");
                for (r, &k) in keys.iter().enumerate() {
                    let fresh = self.fresh_row(Vec::new());
                    let stored = self.round_values(&values[r * dim..(r + 1) * dim]);
                    let row = self.model.entry(k.to_bits()).or_insert(fresh);
                    row.values = stored;
                    let old = row.score;
                    let score = self.write_score(k, old);
                    self.model.get_mut(&k.to_bits()).unwrap().score = score;
                }
            }
            Op::Accum(entries) => {
                let keys: Vec<K> = entries.iter().map(|&(k, _, _)| K::of(k)).collect();
                let exists: Vec<bool> = entries.iter().map(|&(_, _, e)| e).collect();
                let seeds: Vec<i8> = entries.iter().map(|&(_, s, _)| s).collect();
                self.accum(&keys, &seeds, &exists);
            }
            Op::AccumTruth(entries) => {
                let keys: Vec<K> = entries.iter().map(|&(k, _)| K::of(k)).collect();
                let seeds: Vec<i8> = entries.iter().map(|&(_, s)| s).collect();
                let mut exists = vec![false; keys.len()];
                let mut out = vec![0.0; keys.len() * dim];
                if self
                    .var
                    .lookup_with_exists(&keys, &mut out, &mut exists)
                    .is_err()
                {
                    assert!(self.refused(&keys), "lookup_with_exists failed");
                }
                self.accum(&keys, &seeds, &exists);
            }
            Op::Remove(idx) => {
                let keys = K::batch(idx);
                let r = self.var.remove(&keys);
                if self.refused(&keys) {
                    return self.expect_refused("remove", r);
                }
                r.expect("remove");
                for k in &keys {
                    self.model.remove(&k.to_bits());
                }
            }
            Op::Clear => {
                self.var.clear();
                self.model.clear();
            }
            Op::Export => {
                let (keys, values) = self.var.export().expect("export");
                assert_eq!(values.len(), keys.len() * dim);
                let mut seen = HashMap::new();
                for (i, k) in keys.iter().enumerate() {
                    let row = values[i * dim..(i + 1) * dim].to_vec();
                    assert!(
                        seen.insert(k.to_bits(), row).is_none(),
                        "export: key {k} twice"
                    );
                }
                self.check_rows("export", &seen);
            }
            Op::ExportChunks(n) => {
                let n = *n as usize % 6;
                let mut chunks = self.var.export_chunks(n);
                if n == 0 {
                    assert!(matches!(
                        chunks.next(),
                        Some(Err(Error::InvalidArgument(_)))
                    ));
                    assert!(
                        chunks.next().is_none(),
                        "export_chunks(0) goes on after its error"
                    );
                    return;
                }
                let mut seen = HashMap::new();
                for chunk in chunks {
                    let (keys, values) = chunk.expect("export_chunks");
                    assert!(
                        !keys.is_empty() && keys.len() <= n,
                        "chunk of {} rows",
                        keys.len()
                    );
                    assert_eq!(values.len(), keys.len() * dim);
                    for (i, k) in keys.iter().enumerate() {
                        let row = values[i * dim..(i + 1) * dim].to_vec();
                        assert!(
                            seen.insert(k.to_bits(), row).is_none(),
                            "export_chunks: {k} twice"
                        );
                    }
                }
                self.check_rows("export_chunks", &seen);
            }
            Op::CreateSlot(which, kind) => self.create_slot(*which as usize % SLOTS.len(), *kind),
            Op::LookupSlot(which, idx) => {
                let keys = K::batch(idx);
                let name = SLOTS[*which as usize % SLOTS.len()].0;
                if !self.created.iter().any(|&(k, _, _)| SLOTS[k].0 == name) {
                    let r = self.var.slot_id(name);
                    assert!(
                        matches!(r, Err(Error::UnknownSlot { .. })),
                        "slot_id({name}): {r:?}"
                    );
                }
                if self.created.is_empty() {
                    return;
                }
                let (kind, id, _) = self.created[*which as usize % self.created.len()];
                assert_eq!(self.var.slot_id(SLOTS[kind].0), Ok(id));
                let mut out = vec![f32::NAN; keys.len() * dim];
                let r = self.var.lookup_slot(id, &keys, &mut out);
                if self.refused(&keys) {
                    return self.expect_refused("lookup_slot", r);
                }
                r.expect("lookup_slot");
                let want = self.model_slot(id.index(), &keys);
                assert_eq!(out, want, "lookup_slot {} of {keys:?}", SLOTS[kind].0);
            }
            Op::LookupScores(idx) => {
                let keys = K::batch(idx);
                let mut out = vec![u64::MAX; keys.len()];
                let r = self.var.lookup_scores(&keys, &mut out);
                if self.refused(&keys) {
                    return self.expect_refused("lookup_scores", r);
                }
                r.expect("lookup_scores");
                self.check_scores(&keys, &out);
            }
            Op::UpdateRows(idx, slots, seed, poison) => {
                self.update_rows(idx, slots, *seed, *poison)
            }
            Op::Restrict(reserved, trigger) => self.restrict(
                *reserved as usize % (KEYS + 2),
                *trigger as usize % (KEYS + 2),
            ),
            Op::BadLength(what, idx, delta) => self.bad_length(*what, idx, *delta),
            Op::NonFinite(upsert, entries, which, at) => {
                let keys: Vec<K> = entries.iter().map(|&(k, _, _)| K::of(k)).collect();
                let exists: Vec<bool> = entries.iter().map(|&(_, _, e)| e).collect();
                let mut values: Vec<f32> = entries
                    .iter()
                    .enumerate()
                    .flat_map(|(r, &(_, s, _))| small_row(s, r, dim))
                    .collect();
                if values.is_empty() {
                    return;
                }
                let at = *at as usize % values.len();
                values[at] = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY][*which as usize % 3];
                let r = if *upsert {
                    self.var.upsert(&keys, &values)
                } else {
                    self.var.accum(&keys, &values, &exists)
                };
                assert!(
                    matches!(r, Err(Error::NonFinite { index, .. }) if index == at),
                    "non-finite element {at}: {r:?}"
                );
            }
            Op::ForeignSlot(what, idx) => {
                let keys = K::batch(idx);
                let r = match what % 3 {
                    0 => {
                        let mut out = vec![0.0; keys.len() * dim];
                        self.var.lookup_slot(self.foreign, &keys, &mut out)
                    }
                    1 => self.var.update_rows(&keys, &[self.foreign], |_, _, _| {
                        panic!("update_rows ran with another variable's slot")
                    }),
                    _ => self.var.slot_initial(self.foreign).map(|_| ()),
                };
                assert!(
                    matches!(r, Err(Error::InvalidArgument(_))),
                    "foreign slot: {r:?}"
                );
            }
        }
    }

    fn accum(&mut self, keys: &[K], seeds: &[i8], exists: &[bool]) {
        let dim = self.dim;
        let deltas: Vec<f32> = seeds
            .iter()
            .enumerate()
            .flat_map(|(r, &s)| small_row(s, r, dim))
            .collect();
        let r = self.var.accum(keys, &deltas, exists);
        if self.refused(keys) {
            return self.expect_refused("accum", r);
        }
        let bits: Vec<u64> = keys.iter().map(|k| k.to_bits()).collect();
        let effects = accum_effects(&bits, exists, |b| self.model.contains_key(&b));
        // The first occurrence whose sum does not fit the value dtype.
        let mut out_of_range = None;
        for (r, (&k, effect)) in keys.iter().zip(effects).enumerate() {
            let delta = &deltas[r * dim..(r + 1) * dim];
            let bits = k.to_bits();
            match effect {
                AccumEffect::Ignore => {}
                AccumEffect::Insert => {
                    let mut row = self.fresh_row(self.round_values(delta));
                    row.score = self.write_score(k, 0);
                    self.model.insert(bits, row);
                }
                AccumEffect::Add => {
                    let sums: Vec<f32> = self.model[&bits]
                        .values
                        .iter()
                        .zip(delta)
                        .map(|(x, d)| x + d)
                        .collect();
                    if !sums.iter().all(|&v| self.value_dtype.fits(v)) {
                        out_of_range.get_or_insert(r);
                        continue;
                    }
                    let old = self.model[&bits].score;
                    let score = self.write_score(k, old);
                    let values = self.round_values(&sums);
                    let row = self.model.get_mut(&bits).expect("added to a present row");
                    row.values = values;
                    row.score = score;
                }
            }
        }
        match out_of_range {
            None => r.expect("accum"),
            Some(at) => assert!(
                matches!(r, Err(Error::OutOfRange { what: "accum result", index, .. }) if index == at),
                "accum whose sum at #{at} leaves {}: {r:?}",
                self.value_dtype
            ),
        }
    }

    /// `values` rounded to the value dtype.
    fn round_values(&self, values: &[f32]) -> Vec<f32> {
        values.iter().map(|&v| self.value_dtype.round(v)).collect()
    }

    fn create_slot(&mut self, which: usize, kind: CreateKind) {
        let (name, initial) = SLOTS[which];
        let existing = self.created.iter().find(|&&(k, _, _)| k == which).copied();
        let names_before = self.var.slot_names();
        match kind {
            CreateKind::Empty => {
                let r = self.var.create_slot("", 1.0);
                assert!(
                    matches!(r, Err(Error::InvalidArgument(_))),
                    "empty slot name: {r:?}"
                );
            }
            CreateKind::NanInitial => {
                let r = self.var.create_slot("nan", f32::NAN);
                assert!(r.is_err(), "NaN initial value: {r:?}");
            }
            CreateKind::Conflicting if existing.is_some() => {
                let r = self.var.create_slot(name, initial + 0.25);
                assert!(
                    matches!(r, Err(Error::Mismatch { .. })),
                    "conflicting slot: {r:?}"
                );
            }
            CreateKind::NegZero if initial == 0.0 => {
                let r = self.var.create_slot(name, -0.0);
                self.created_or_refused(which, existing, r);
            }
            _ => {
                let r = self.var.create_slot(name, initial);
                self.created_or_refused(which, existing, r);
            }
        }
        if self.created.len() == names_before.len() {
            assert_eq!(
                self.var.slot_names(),
                names_before,
                "a failed create_slot added a slot"
            );
        }
        let names: Vec<&str> = self.created.iter().map(|&(k, _, _)| SLOTS[k].0).collect();
        assert_eq!(self.var.slot_names(), names);
    }

    fn created_or_refused(
        &mut self,
        which: usize,
        existing: Option<(usize, SlotId, f32)>,
        r: dynemb::Result<SlotId>,
    ) {
        let (name, initial) = SLOTS[which];
        match existing {
            Some((_, id, _)) => assert_eq!(r, Ok(id), "create_slot {name} again"),
            None if self.created.len() == MAX_SLOTS => {
                assert!(
                    r.is_err(),
                    "slot {} of at most {MAX_SLOTS}: {r:?}",
                    MAX_SLOTS + 1
                );
            }
            None => {
                let id = r.expect("create_slot");
                assert_eq!(id.index(), self.created.len(), "index of slot {name}");
                let initial = self.slot_dtype.round(initial);
                assert_eq!(self.var.slot_initial(id), Ok(initial));
                self.created.push((which, id, initial));
                for row in self.model.values_mut() {
                    row.slots.push(vec![initial; self.dim]);
                }
            }
        }
    }

    fn model_slot(&self, index: usize, keys: &[K]) -> Vec<f32> {
        let initial = self.created[index].2;
        keys.iter()
            .flat_map(|k| match self.model.get(&k.to_bits()) {
                Some(row) => row.slots[index].clone(),
                None => vec![initial; self.dim],
            })
            .collect()
    }

    fn update_rows(&mut self, idx: &[u8], slots: &[u8], seed: i8, poison: Option<(u8, bool)>) {
        let dim = self.dim;
        let keys = K::batch(idx);
        let listed: Vec<usize> = if self.created.is_empty() {
            Vec::new()
        } else {
            slots
                .iter()
                .take(MAX_SLOTS + 1)
                .map(|&s| s as usize % self.created.len())
                .collect()
        };
        let ids: Vec<SlotId> = listed.iter().map(|&i| self.created[i].1).collect();
        let repeated = (1..listed.len()).any(|j| listed[..j].contains(&listed[j]));
        let poison = poison
            .filter(|_| !keys.is_empty())
            .map(|(at, in_values)| (at as usize % keys.len(), in_values || listed.is_empty()));
        if repeated || self.refused(&keys) {
            let r = self.var.update_rows(&keys, &ids, |_, _, _| {
                panic!("update_rows ran its update on a refused call")
            });
            // Either refusal may be reported first when both apply.
            let refused = matches!(r, Err(Error::UnknownShard { .. })) && self.refused(&keys);
            let repeated_slot = matches!(r, Err(Error::InvalidArgument(_))) && repeated;
            assert!(
                refused || repeated_slot,
                "update_rows with a repeated slot ({repeated}) or a refused key ({}): {r:?}",
                self.refused(&keys)
            );
            return;
        }
        // The model, occurrence by occurrence: what each update gets.
        let mut inputs = Vec::with_capacity(keys.len());
        // The first occurrence whose result does not fit the dtypes.
        let mut out_of_range = None;
        for (pos, &k) in keys.iter().enumerate() {
            let bits = k.to_bits();
            let mut row = match self.model.get(&bits) {
                Some(row) => row.clone(),
                None => self.fresh_row(self.init_row.clone()),
            };
            let mut slot_rows: Vec<f32> =
                listed.iter().flat_map(|&i| row.slots[i].clone()).collect();
            inputs.push((row.values.clone(), slot_rows.clone()));
            if poison.is_some_and(|(at, _)| at == pos) {
                continue;
            }
            step(seed, pos, &mut row.values, &mut slot_rows);
            let fits = row.values.iter().all(|&v| self.value_dtype.fits(v))
                && slot_rows.iter().all(|&v| self.slot_dtype.fits(v));
            if !fits {
                out_of_range.get_or_insert(pos);
                continue;
            }
            row.values = self.round_values(&row.values);
            for (j, &i) in listed.iter().enumerate() {
                row.slots[i] = slot_rows[j * dim..(j + 1) * dim]
                    .iter()
                    .map(|&v| self.slot_dtype.round(v))
                    .collect();
            }
            let old = self.model.get(&bits).map_or(0, |r| r.score);
            row.score = self.write_score(k, old);
            self.model.insert(bits, row);
        }
        let mut calls = vec![0usize; keys.len()];
        let r = self.var.update_rows(&keys, &ids, |pos, values, slot_rows| {
            calls[pos] += 1;
            let (want_values, want_slots) = &inputs[pos];
            assert_eq!(values, &want_values[..], "update_rows row of #{pos}");
            assert_eq!(
                slot_rows,
                &want_slots[..],
                "update_rows slot rows of #{pos}"
            );
            step(seed, pos, values, slot_rows);
            match poison {
                Some((at, true)) if at == pos => values[dim - 1] = f32::NAN,
                Some((at, false)) if at == pos => slot_rows[0] = f32::INFINITY,
                _ => {}
            }
        });
        assert!(
            calls.iter().all(|&c| c == 1),
            "update calls per position: {calls:?}"
        );
        let poisoned = poison.map(|(at, _)| at);
        match (poisoned, out_of_range) {
            (None, None) => r.expect("update_rows"),
            // A poisoned row is NonFinite, even if its values are also out
            // of range.
            (Some(at), oor) if oor.is_none_or(|o| at < o) => assert!(
                matches!(r, Err(Error::NonFinite { index, .. }) if index == at),
                "update_rows leaving a NaN at #{at}: {r:?}"
            ),
            (_, Some(at)) => assert!(
                matches!(
                    r,
                    Err(Error::OutOfRange { what: "update_rows result", index, .. }) if index == at
                ),
                "update_rows whose result at #{at} leaves the dtypes: {r:?}"
            ),
            (Some(_), None) => unreachable!("handled above"),
        }
    }

    fn restrict(&mut self, reserved: usize, trigger: usize) {
        let r = self.var.restrict(reserved, trigger);
        if self.policy == Policy::None {
            assert!(
                matches!(r, Err(Error::InvalidArgument(_))),
                "restrict without policy: {r:?}"
            );
            return;
        }
        let removed = r.expect("restrict");
        let len = self.model.len();
        let want = if len <= trigger {
            0
        } else {
            len.saturating_sub(reserved)
        };
        assert_eq!(
            removed, want,
            "restrict({reserved}, {trigger}) of {len} rows"
        );
        let all: Vec<u64> = self.model.keys().copied().collect();
        let keys: Vec<K> = all.iter().map(|&b| K::from_bits(b)).collect();
        let mut out = vec![0.0; keys.len() * self.dim];
        let mut exists = vec![false; keys.len()];
        self.var
            .lookup_with_exists(&keys, &mut out, &mut exists)
            .expect("lookup after restrict");
        let (mut kept_min, mut removed_max, mut gone) = (u64::MAX, 0, 0);
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
        assert_eq!(gone, removed, "rows gone after restrict");
        assert!(
            gone == 0 || removed_max <= kept_min,
            "restrict removed a row scored {removed_max} and kept one scored {kept_min}"
        );
    }

    fn bad_length(&mut self, what: BadLen, idx: &[u8], delta: i8) {
        let dim = self.dim;
        let keys = K::batch(idx);
        let n = keys.len();
        let off = |len: usize| -> usize {
            let d = if delta == 0 { 1 } else { delta as isize };
            let l = len as isize + d;
            if l < 0 {
                len + d.unsigned_abs()
            } else {
                l as usize
            }
        };
        let r = match what {
            BadLen::Lookup => self.var.lookup(&keys, &mut vec![0.0; off(n * dim)]),
            BadLen::LookupExistsOut => self.var.lookup_with_exists(
                &keys,
                &mut vec![0.0; off(n * dim)],
                &mut vec![false; n],
            ),
            BadLen::LookupExistsFlags => self.var.lookup_with_exists(
                &keys,
                &mut vec![0.0; n * dim],
                &mut vec![false; off(n)],
            ),
            BadLen::LookupOrInsert => self
                .var
                .lookup_or_insert(&keys, &mut vec![0.0; off(n * dim)]),
            BadLen::Upsert => self.var.upsert(&keys, &vec![1.0; off(n * dim)]),
            BadLen::AccumDeltas => self
                .var
                .accum(&keys, &vec![1.0; off(n * dim)], &vec![false; n]),
            BadLen::AccumFlags => self
                .var
                .accum(&keys, &vec![1.0; n * dim], &vec![false; off(n)]),
            BadLen::LookupSlot => match self.created.first() {
                Some(&(_, id, _)) => self
                    .var
                    .lookup_slot(id, &keys, &mut vec![0.0; off(n * dim)]),
                None => return,
            },
            BadLen::LookupScores => self.var.lookup_scores(&keys, &mut vec![0; off(n)]),
        };
        assert!(
            matches!(r, Err(Error::LengthMismatch { .. })),
            "{what:?} with a wrong length: {r:?}"
        );
    }

    fn check_rows(&self, what: &str, got: &HashMap<u64, Vec<f32>>) {
        assert_eq!(got.len(), self.model.len(), "{what}: row count");
        for (bits, row) in &self.model {
            let k = K::from_bits(*bits);
            match got.get(bits) {
                Some(values) => assert_eq!(values, &row.values, "{what}: row of {k}"),
                None => panic!("{what}: key {k} missing"),
            }
        }
    }

    fn check_scores(&self, keys: &[K], got: &[u64]) {
        match self.policy {
            Policy::None => assert!(got.iter().all(|&s| s == 0), "scores without policy {got:?}"),
            Policy::Frequency => {
                let want: Vec<u64> = keys
                    .iter()
                    .map(|k| self.model.get(&k.to_bits()).map_or(0, |r| r.score))
                    .collect();
                assert_eq!(got, want, "frequency scores of {keys:?}");
            }
            Policy::Timestamp => {
                let model: Vec<Option<u64>> = keys
                    .iter()
                    .map(|k| self.model.get(&k.to_bits()).map(|r| r.score))
                    .collect();
                for (i, m) in model.iter().enumerate() {
                    match m {
                        None => assert_eq!(got[i], 0, "timestamp of absent key {}", keys[i]),
                        Some(_) => assert!(got[i] > 0, "timestamp of {} is 0", keys[i]),
                    }
                    for (j, n) in model.iter().enumerate() {
                        if let (Some(a), Some(b)) = (m, n) {
                            assert_eq!(
                                a.cmp(b),
                                got[i].cmp(&got[j]),
                                "timestamps of {} and {}: written at {a} and {b}, stamped {} and {}",
                                keys[i],
                                keys[j],
                                got[i],
                                got[j]
                            );
                        }
                    }
                }
            }
        }
    }

    /// Compares the whole state with the model.
    fn check_all(&self) {
        assert_eq!(self.var.size(), self.model.len(), "size()");
        let mut per_shard = vec![0; self.shards];
        for &bits in self.model.keys() {
            per_shard[self
                .shard_of(K::from_bits(bits))
                .expect("stored key refused")] += 1;
        }
        for (s, &n) in per_shard.iter().enumerate() {
            assert_eq!(self.var.shard_size(s), Ok(n), "shard_size({s})");
        }
        assert!(matches!(
            self.var.shard_size(self.shards),
            Err(Error::UnknownShard { .. })
        ));
        // Small chunks: `export` sets out to copy 65536 rows a chunk, which
        // costs more than the rest of a fuzz run under the sanitizer.
        let mut seen = HashMap::new();
        for chunk in self.var.export_chunks(7) {
            let (keys, values) = chunk.expect("export_chunks");
            assert_eq!(values.len(), keys.len() * self.dim);
            for (i, k) in keys.iter().enumerate() {
                let row = values[i * self.dim..(i + 1) * self.dim].to_vec();
                assert!(
                    seen.insert(k.to_bits(), row).is_none(),
                    "export: key {k} twice"
                );
            }
        }
        self.check_rows("export_chunks(7)", &seen);
        // Slots and scores of every stored key and of a few absent ones
        // (refused keys cannot be asked for).
        let mut keys: Vec<K> = self.model.keys().map(|&b| K::from_bits(b)).collect();
        keys.sort();
        keys.extend(
            (0..KEYS)
                .map(K::nth)
                .filter(|k| !self.model.contains_key(&k.to_bits()) && self.shard_of(*k).is_some())
                .take(3),
        );
        for &(kind, id, _) in &self.created {
            let mut out = vec![f32::NAN; keys.len() * self.dim];
            self.var
                .lookup_slot(id, &keys, &mut out)
                .expect("lookup_slot");
            assert_eq!(
                out,
                self.model_slot(id.index(), &keys),
                "slot {}",
                SLOTS[kind].0
            );
        }
        let mut scores = vec![u64::MAX; keys.len()];
        self.var
            .lookup_scores(&keys, &mut scores)
            .expect("lookup_scores");
        self.check_scores(&keys, &scores);
    }
}

/// The update of `update_rows`, deterministic and order-sensitive, small
/// integers in, small integers out (slots alternate sign, so stay small).
fn step(seed: i8, pos: usize, values: &mut [f32], slots: &mut [f32]) {
    let dim = values.len();
    for c in 0..dim {
        let d = small(seed, pos, c);
        let first = slots.get(c).copied().unwrap_or(0.0);
        values[c] += d + first;
        for (j, s) in slots.chunks_exact_mut(dim).enumerate() {
            s[c] = -s[c] + d + j as f32;
        }
    }
}

fn run<K: FuzzKey>(case: &Case) {
    let mut runner = Runner::<K>::new(case);
    for op in case.ops.iter().take(MAX_OPS) {
        if op_too_large(op) {
            continue;
        }
        runner.apply(op);
        runner.check_all();
    }
}

fn op_too_large(op: &Op) -> bool {
    let n = match op {
        Op::Lookup(v) | Op::LookupWithExists(v) | Op::LookupOrInsert(v) | Op::Remove(v) => v.len(),
        Op::LookupSlot(_, v) | Op::LookupScores(v) | Op::BadLength(_, v, _) => v.len(),
        Op::UpdateRows(v, s, _, _) => v.len().max(s.len() / 8),
        Op::ForeignSlot(_, v) => v.len(),
        Op::Upsert(v) | Op::AccumTruth(v) => v.len(),
        Op::Accum(v) | Op::NonFinite(_, v, _, _) => v.len(),
        _ => 0,
    };
    n > MAX_BATCH
}
