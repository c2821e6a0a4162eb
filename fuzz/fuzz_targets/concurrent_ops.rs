//! Two threads run fuzzer-chosen operation sequences on one shared
//! `Variable`, checked by invariants that hold for every interleaving.
//!
//! The key table is split in three: thread A owns keys 0..8, thread B keys
//! 8..16, and keys 16..24 are shared. A thread upserts, removes,
//! accumulates into (with any exists flags), inserts (`lookup_or_insert`)
//! and updates (`update_rows`, values and slot columns) only its own keys,
//! so it keeps an exact sequential model of them and checks every read of
//! them (`lookup`, `lookup_with_exists`, `lookup_slot`, `lookup_scores`,
//! `export`) against it while the other thread runs. The shared keys are
//! present throughout (inserted before the threads start, never removed);
//! both threads add integer deltas to them (`accum` with exists = true,
//! `update_rows` adding to the values and a slot), so their final rows are
//! exact sums, and their frequency scores count every write. Every delta
//! added to a shared row is the same in each column, so a read of a shared
//! row that mixes two versions (a torn row) shows as unequal columns.
//! Both threads create slot columns (the same names, so they race to
//! create them) while the other writes. Tables start with room for one
//! row, so the threads insert through many resizes.
//!
//! At the end the whole variable must be: each thread's keys as its model
//! says, the shared keys with the sums of both threads' deltas, `size` the
//! sum, and `export` every key once.

#![no_main]

use arbitrary::Arbitrary;
use dynemb::{Partitioner, RestrictPolicy, SlotId, Variable};
use dynemb_fuzz::{accum_effects, small, small_row, AccumEffect, FuzzKey, DIMS};
use libfuzzer_sys::fuzz_target;
use std::collections::HashMap;
use std::sync::{Arc, Barrier};

/// Keys per part (a thread's own keys, the shared keys).
const PART: usize = 8;
const SHARED: usize = 2 * PART;
/// Most operations per thread, and batch size.
const MAX_OPS: usize = 48;
const MAX_BATCH: usize = 80;
/// Slot names both threads create, with their initial values.
const SLOTS: [(&str, f32); 3] = [("m", 0.0), ("v", 1.0), ("acc", -2.0)];

#[derive(Arbitrary, Debug, Clone, Copy)]
enum KeyType {
    I64,
    U64,
    I32,
    U32,
}

#[derive(Arbitrary, Debug)]
struct Case {
    key_type: KeyType,
    dim: u8,
    shards: u8,
    hash_partitioner: bool,
    frequency: bool,
    /// How many times each thread runs its sequence (more overlap).
    rounds: u8,
    a: Vec<Op>,
    b: Vec<Op>,
}

#[derive(Arbitrary, Debug, Clone)]
enum Op {
    /// Own keys: (key, value seed).
    Upsert(Vec<(u8, i8)>),
    Remove(Vec<u8>),
    LookupOrInsert(Vec<u8>),
    /// Own keys with any flags.
    Accum(Vec<(u8, i8, bool)>),
    /// Shared keys, exists = true, a uniform delta per row.
    AccumShared(Vec<(u8, i8)>),
    /// Own keys (`.0`) and shared keys (`.1`) in one batch, interleaved,
    /// with the created slots listed by `.2` (bit mask of `SLOTS`).
    UpdateRows(Vec<u8>, Vec<u8>, u8, i8),
    CreateSlot(u8),
    /// Reads of own and shared keys.
    Lookup(Vec<u8>, Vec<u8>),
    LookupSlot(u8, Vec<u8>, Vec<u8>),
    LookupScores(Vec<u8>, Vec<u8>),
    Export,
    /// Room for this many more keys while the other thread works:
    /// `reserve` (index and rows) or, with `false`, `reserve_rows` only.
    /// Changes nothing the model sees.
    Reserve(u16, bool),
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
    /// By slot name; a slot not here reads its initial value.
    slots: HashMap<&'static str, Vec<f32>>,
    score: u64,
}

/// The row of shared key `j` before the threads start: `j + c` in column
/// `c` (columns differ, deltas do not, so `row[c] - c` is the same for
/// every column of a row that is not torn).
fn shared_start(j: usize, dim: usize) -> Vec<f32> {
    (0..dim).map(|c| (j + c) as f32).collect()
}

/// What both threads added to the shared keys, per key index: values,
/// per-slot sums, writes.
#[derive(Default, Clone)]
struct SharedSums {
    values: HashMap<usize, f32>,
    slots: HashMap<(usize, &'static str), f32>,
    writes: HashMap<usize, u64>,
}

struct Worker<'a, K: FuzzKey> {
    var: &'a Variable<K>,
    dim: usize,
    frequency: bool,
    /// Index of this thread's first own key.
    base: usize,
    model: HashMap<usize, Row>,
    /// Slots this thread knows of (created by it, in `SLOTS` order).
    slots: Vec<(usize, SlotId)>,
    sums: SharedSums,
    name: &'static str,
}

fn own(base: usize, b: u8) -> usize {
    base + b as usize % PART
}

fn shared(b: u8) -> usize {
    SHARED + b as usize % PART
}

impl<K: FuzzKey> Worker<'_, K> {
    fn keys(&self, idx: &[usize]) -> Vec<K> {
        idx.iter().map(|&i| K::nth(i)).collect()
    }

    fn slot(&self, kind: usize) -> Option<SlotId> {
        self.slots
            .iter()
            .find(|&&(k, _)| k == kind)
            .map(|&(_, id)| id)
    }

    fn fresh(&self, values: Vec<f32>) -> Row {
        Row {
            values,
            slots: HashMap::new(),
            score: 0,
        }
    }

    fn own_slot(&self, i: usize, kind: usize) -> Vec<f32> {
        self.model
            .get(&i)
            .and_then(|r| r.slots.get(SLOTS[kind].0).cloned())
            .unwrap_or_else(|| vec![SLOTS[kind].1; self.dim])
    }

    /// A shared row read at any moment: not torn, and integer-valued.
    fn check_shared_row(&self, what: &str, j: usize, row: &[f32]) {
        let level = row[0];
        for (c, &x) in row.iter().enumerate() {
            assert_eq!(
                x - c as f32,
                level,
                "{}: {what}: torn row of shared key {j}: {row:?}",
                self.name
            );
        }
        assert_eq!(
            level.fract(),
            0.0,
            "{}: {what}: shared key {j}: {row:?}",
            self.name
        );
    }

    fn bump(&self, old: u64) -> u64 {
        if self.frequency {
            old + 1
        } else {
            0
        }
    }

    fn apply(&mut self, op: &Op) {
        let dim = self.dim;
        let base = self.base;
        match op {
            Op::Upsert(entries) => {
                let idx: Vec<usize> = entries.iter().map(|&(k, _)| own(base, k)).collect();
                let values: Vec<f32> = entries
                    .iter()
                    .enumerate()
                    .flat_map(|(r, &(_, s))| small_row(s, r, dim))
                    .collect();
                self.var.upsert(&self.keys(&idx), &values).expect("upsert");
                for (r, &i) in idx.iter().enumerate() {
                    let old = self.model.get(&i).map_or(0, |row| row.score);
                    let score = self.bump(old);
                    let fresh = self.fresh(Vec::new());
                    let row = self.model.entry(i).or_insert(fresh);
                    row.values = values[r * dim..(r + 1) * dim].to_vec();
                    row.score = score;
                }
            }
            Op::Remove(idx) => {
                let idx: Vec<usize> = idx.iter().map(|&k| own(base, k)).collect();
                self.var.remove(&self.keys(&idx)).expect("remove");
                for i in idx {
                    self.model.remove(&i);
                }
            }
            Op::LookupOrInsert(idx) => {
                let idx: Vec<usize> = idx.iter().map(|&k| own(base, k)).collect();
                let mut out = vec![f32::NAN; idx.len() * dim];
                self.var
                    .lookup_or_insert(&self.keys(&idx), &mut out)
                    .expect("lookup_or_insert");
                for &i in &idx {
                    if !self.model.contains_key(&i) {
                        let mut row = self.fresh(vec![0.0; dim]);
                        row.score = self.bump(0);
                        self.model.insert(i, row);
                    }
                }
                let want: Vec<f32> = idx
                    .iter()
                    .flat_map(|i| self.model[i].values.clone())
                    .collect();
                assert_eq!(out, want, "{}: lookup_or_insert", self.name);
            }
            Op::Accum(entries) => {
                let idx: Vec<usize> = entries.iter().map(|&(k, _, _)| own(base, k)).collect();
                let exists: Vec<bool> = entries.iter().map(|&(_, _, e)| e).collect();
                let deltas: Vec<f32> = entries
                    .iter()
                    .enumerate()
                    .flat_map(|(r, &(_, s, _))| small_row(s, r, dim))
                    .collect();
                self.var
                    .accum(&self.keys(&idx), &deltas, &exists)
                    .expect("accum");
                let bits: Vec<u64> = idx.iter().map(|&i| i as u64).collect();
                let effects =
                    accum_effects(&bits, &exists, |i| self.model.contains_key(&(i as usize)));
                for (r, (&i, effect)) in idx.iter().zip(effects).enumerate() {
                    let delta = &deltas[r * dim..(r + 1) * dim];
                    match effect {
                        AccumEffect::Ignore => {}
                        AccumEffect::Insert => {
                            let mut row = self.fresh(delta.to_vec());
                            row.score = self.bump(0);
                            self.model.insert(i, row);
                        }
                        AccumEffect::Add => {
                            let score = self.bump(self.model[&i].score);
                            let row = self.model.get_mut(&i).expect("present");
                            for (x, d) in row.values.iter_mut().zip(delta) {
                                *x += d;
                            }
                            row.score = score;
                        }
                    }
                }
            }
            Op::AccumShared(entries) => {
                let idx: Vec<usize> = entries.iter().map(|&(k, _)| shared(k)).collect();
                let deltas: Vec<f32> = entries
                    .iter()
                    .enumerate()
                    .flat_map(|(r, &(_, s))| vec![small(s, r, 0); dim])
                    .collect();
                self.var
                    .accum(&self.keys(&idx), &deltas, &vec![true; idx.len()])
                    .expect("accum shared");
                for (r, &j) in idx.iter().enumerate() {
                    *self.sums.values.entry(j).or_default() += deltas[r * dim];
                    *self.sums.writes.entry(j).or_default() += 1;
                }
            }
            Op::UpdateRows(mine, theirs, mask, seed) => {
                self.update_rows(mine, theirs, *mask, *seed)
            }
            Op::CreateSlot(which) => {
                let kind = *which as usize % SLOTS.len();
                let (name, initial) = SLOTS[kind];
                let id = self.var.create_slot(name, initial).expect("create_slot");
                match self.slot(kind) {
                    Some(known) => assert_eq!(id, known, "{}: create_slot {name} again", self.name),
                    None => self.slots.push((kind, id)),
                }
                assert_eq!(self.var.slot_id(name), Ok(id));
                assert_eq!(self.var.slot_initial(id), Ok(initial));
            }
            Op::Lookup(mine, theirs) => {
                let (idx, _) = self.mixed(mine, theirs);
                let mut out = vec![f32::NAN; idx.len() * dim];
                let mut exists = vec![false; idx.len()];
                self.var
                    .lookup_with_exists(&self.keys(&idx), &mut out, &mut exists)
                    .expect("lookup_with_exists");
                let mut plain = vec![f32::NAN; idx.len() * dim];
                self.var
                    .lookup(&self.keys(&idx), &mut plain)
                    .expect("lookup");
                for (r, &i) in idx.iter().enumerate() {
                    let row = &out[r * dim..(r + 1) * dim];
                    let row2 = &plain[r * dim..(r + 1) * dim];
                    if i >= SHARED {
                        assert!(exists[r], "{}: shared key {i} missing", self.name);
                        self.check_shared_row("lookup_with_exists", i, row);
                        self.check_shared_row("lookup", i, row2);
                        continue;
                    }
                    let want = self.model.get(&i);
                    assert_eq!(
                        exists[r],
                        want.is_some(),
                        "{}: exists of own key {i}",
                        self.name
                    );
                    let want = want.map_or_else(|| vec![0.0; dim], |r| r.values.clone());
                    assert_eq!(
                        row,
                        &want[..],
                        "{}: lookup_with_exists of own key {i}",
                        self.name
                    );
                    assert_eq!(row2, &want[..], "{}: lookup of own key {i}", self.name);
                }
            }
            Op::LookupSlot(which, mine, theirs) => {
                let kind = *which as usize % SLOTS.len();
                let Some(id) = self.slot(kind) else { return };
                let (idx, _) = self.mixed(mine, theirs);
                let mut out = vec![f32::NAN; idx.len() * dim];
                self.var
                    .lookup_slot(id, &self.keys(&idx), &mut out)
                    .expect("lookup_slot");
                for (r, &i) in idx.iter().enumerate() {
                    let row = &out[r * dim..(r + 1) * dim];
                    if i >= SHARED {
                        // The shared slot rows get uniform deltas too.
                        let level = row[0];
                        assert!(
                            row.iter().all(|&x| x == level),
                            "{}: torn slot row of shared key {i}: {row:?}",
                            self.name
                        );
                    } else {
                        assert_eq!(
                            row,
                            &self.own_slot(i, kind)[..],
                            "{}: slot of own key {i}",
                            self.name
                        );
                    }
                }
            }
            Op::LookupScores(mine, theirs) => {
                let (idx, _) = self.mixed(mine, theirs);
                let mut out = vec![u64::MAX; idx.len()];
                self.var
                    .lookup_scores(&self.keys(&idx), &mut out)
                    .expect("lookup_scores");
                for (r, &i) in idx.iter().enumerate() {
                    if i >= SHARED {
                        if self.frequency {
                            let mine = self.sums.writes.get(&i).copied().unwrap_or(0);
                            assert!(
                                out[r] > mine,
                                "{}: score of shared key {i}: {} <= {mine} + 1",
                                self.name,
                                out[r]
                            );
                        } else {
                            assert_eq!(out[r], 0);
                        }
                    } else {
                        let want = self.model.get(&i).map_or(0, |r| r.score);
                        assert_eq!(out[r], want, "{}: score of own key {i}", self.name);
                    }
                }
            }
            Op::Reserve(n, index_too) => {
                if *index_too {
                    self.var.reserve(usize::from(*n));
                } else {
                    self.var.reserve_rows(usize::from(*n));
                }
            }
            Op::Export => {
                let (keys, values) = self.var.export().expect("export");
                let mut seen: HashMap<u64, Vec<f32>> = HashMap::new();
                for (r, k) in keys.iter().enumerate() {
                    let row = values[r * dim..(r + 1) * dim].to_vec();
                    let first = seen.insert(k.to_bits(), row);
                    // Keys of the other thread may come twice (removed and
                    // re-inserted meanwhile); ours and the shared ones not.
                    let i = index_of::<K>(*k);
                    if i >= SHARED || (base..base + PART).contains(&i) {
                        assert!(first.is_none(), "{}: export: key {i} twice", self.name);
                    }
                }
                for j in SHARED..SHARED + PART {
                    let row = seen
                        .get(&K::nth(j).to_bits())
                        .unwrap_or_else(|| panic!("{}: export lost shared key {j}", self.name));
                    self.check_shared_row("export", j, row);
                }
                for i in base..base + PART {
                    let got = seen.get(&K::nth(i).to_bits());
                    let want = self.model.get(&i).map(|r| &r.values);
                    assert_eq!(got, want, "{}: export of own key {i}", self.name);
                }
            }
        }
    }

    /// Own and shared key indexes, interleaved.
    fn mixed(&self, mine: &[u8], theirs: &[u8]) -> (Vec<usize>, usize) {
        let mut idx = Vec::with_capacity(mine.len() + theirs.len());
        let (mut a, mut b) = (mine.iter(), theirs.iter());
        loop {
            match (a.next(), b.next()) {
                (None, None) => break,
                (x, y) => {
                    if let Some(&x) = x {
                        idx.push(own(self.base, x));
                    }
                    if let Some(&y) = y {
                        idx.push(shared(y));
                    }
                }
            }
        }
        (idx, mine.len())
    }

    fn update_rows(&mut self, mine: &[u8], theirs: &[u8], mask: u8, seed: i8) {
        let dim = self.dim;
        let (idx, _) = self.mixed(mine, theirs);
        let kinds: Vec<usize> = self
            .slots
            .iter()
            .map(|&(k, _)| k)
            .filter(|&k| mask >> k & 1 == 1)
            .collect();
        let ids: Vec<SlotId> = kinds
            .iter()
            .map(|&k| self.slot(k).expect("known"))
            .collect();
        // The own keys' model, occurrence by occurrence.
        let mut inputs: HashMap<usize, (Vec<f32>, Vec<f32>)> = HashMap::new();
        for (pos, &i) in idx.iter().enumerate() {
            if i >= SHARED {
                let d = small(seed, pos, 0);
                *self.sums.values.entry(i).or_default() += d;
                *self.sums.writes.entry(i).or_default() += 1;
                for &k in &kinds {
                    *self.sums.slots.entry((i, SLOTS[k].0)).or_default() += d;
                }
                continue;
            }
            let mut row = self
                .model
                .get(&i)
                .cloned()
                .unwrap_or_else(|| self.fresh(vec![0.0; dim]));
            let mut slot_rows: Vec<f32> = kinds.iter().flat_map(|&k| self.own_slot(i, k)).collect();
            inputs.insert(pos, (row.values.clone(), slot_rows.clone()));
            own_step(seed, pos, &mut row.values, &mut slot_rows);
            for (j, &k) in kinds.iter().enumerate() {
                row.slots
                    .insert(SLOTS[k].0, slot_rows[j * dim..(j + 1) * dim].to_vec());
            }
            row.score = self.bump(row.score);
            self.model.insert(i, row);
        }
        let mut calls = vec![0usize; idx.len()];
        let name = self.name;
        self.var
            .update_rows(&self.keys(&idx), &ids, |pos, values, slot_rows| {
                calls[pos] += 1;
                if idx[pos] >= SHARED {
                    let d = small(seed, pos, 0);
                    for x in values.iter_mut().chain(slot_rows.iter_mut()) {
                        *x += d;
                    }
                    return;
                }
                let (want_values, want_slots) = &inputs[&pos];
                assert_eq!(
                    values,
                    &want_values[..],
                    "{name}: update_rows input row #{pos}"
                );
                assert_eq!(
                    slot_rows,
                    &want_slots[..],
                    "{name}: update_rows input slots #{pos}"
                );
                own_step(seed, pos, values, slot_rows);
            })
            .expect("update_rows");
        for (pos, &i) in idx.iter().enumerate() {
            if i < SHARED {
                assert_eq!(
                    calls[pos], 1,
                    "{name}: update of own key {i} ran {} times",
                    calls[pos]
                );
            } else {
                assert!(
                    calls[pos] >= 1,
                    "{name}: update of shared key {i} never ran"
                );
            }
        }
    }
}

/// The table index of a key of the table.
fn index_of<K: FuzzKey>(k: K) -> usize {
    (0..3 * PART)
        .find(|&i| K::nth(i) == k)
        .expect("a key of the table")
}

/// An own key's update: order-sensitive, small integers.
fn own_step(seed: i8, pos: usize, values: &mut [f32], slots: &mut [f32]) {
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

fn too_large(op: &Op) -> bool {
    let n = match op {
        Op::Upsert(v) | Op::AccumShared(v) => v.len(),
        Op::Remove(v) | Op::LookupOrInsert(v) => v.len(),
        Op::Accum(v) => v.len(),
        Op::UpdateRows(a, b, _, _) | Op::Lookup(a, b) | Op::LookupSlot(_, a, b) => {
            a.len() + b.len()
        }
        Op::LookupScores(a, b) => a.len() + b.len(),
        Op::CreateSlot(_) | Op::Export | Op::Reserve(..) => 0,
    };
    n > MAX_BATCH
}

fn run<K: FuzzKey>(case: &Case) {
    let dim = DIMS[case.dim as usize % DIMS.len()];
    let shards = 1 + case.shards as usize % 4;
    let mut builder = Variable::<K>::builder("concurrent")
        .dim(dim)
        .shards(shards)
        .init_size(1);
    if case.hash_partitioner {
        builder = builder.partitioner(Partitioner::Custom(Arc::new(hash_shard)));
    }
    if case.frequency {
        builder = builder.restrict_policy(RestrictPolicy::Frequency);
    }
    let var = builder.build().expect("build");
    let shared_keys: Vec<K> = (SHARED..SHARED + PART).map(K::nth).collect();
    let start: Vec<f32> = (SHARED..SHARED + PART)
        .flat_map(|j| shared_start(j, dim))
        .collect();
    var.upsert(&shared_keys, &start).expect("shared keys");
    let rounds = 1 + case.rounds as usize % 3;
    let ops = |ops: &[Op]| -> Vec<Op> {
        ops.iter()
            .filter(|op| !too_large(op))
            .take(MAX_OPS)
            .cloned()
            .collect()
    };
    let (ops_a, ops_b) = (ops(&case.a), ops(&case.b));
    let barrier = Barrier::new(2);
    let work = |base: usize, ops: &[Op], name: &'static str| {
        let mut w = Worker::<K> {
            var: &var,
            dim,
            frequency: case.frequency,
            base,
            model: HashMap::new(),
            slots: Vec::new(),
            sums: SharedSums::default(),
            name,
        };
        barrier.wait();
        for _ in 0..rounds {
            for op in ops {
                w.apply(op);
            }
        }
        (w.model, w.sums)
    };
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| work(0, &ops_a, "thread A"));
        let b = s.spawn(|| work(PART, &ops_b, "thread B"));
        (a.join(), b.join())
    });
    let (a, b) = match (a, b) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => std::panic::resume_unwind(e),
    };

    // The final state.
    let names = var.slot_names();
    let slot_ids: Vec<(&'static str, f32, SlotId)> = SLOTS
        .iter()
        .filter(|(n, _)| names.iter().any(|m| m == n))
        .map(|&(n, init)| (n, init, var.slot_id(n).expect("slot")))
        .collect();
    assert_eq!(names.len(), slot_ids.len(), "slots {names:?}");
    let all: Vec<K> = (0..3 * PART).map(K::nth).collect();
    let mut values = vec![f32::NAN; all.len() * dim];
    let mut exists = vec![false; all.len()];
    var.lookup_with_exists(&all, &mut values, &mut exists)
        .expect("final lookup");
    let mut scores = vec![u64::MAX; all.len()];
    var.lookup_scores(&all, &mut scores).expect("final scores");
    let slot_rows: Vec<Vec<f32>> = slot_ids
        .iter()
        .map(|&(_, _, id)| {
            let mut out = vec![f32::NAN; all.len() * dim];
            var.lookup_slot(id, &all, &mut out).expect("final slots");
            out
        })
        .collect();
    for i in 0..3 * PART {
        let row = &values[i * dim..(i + 1) * dim];
        let (model, what) = match i {
            i if i < PART => (a.0.get(&i), "thread A's"),
            i if i < SHARED => (b.0.get(&i), "thread B's"),
            _ => (None, "shared"),
        };
        if i < SHARED {
            assert_eq!(
                exists[i],
                model.is_some(),
                "final: presence of {what} key {i}"
            );
            let Some(m) = model else { continue };
            assert_eq!(row, &m.values[..], "final: {what} key {i}");
            assert_eq!(scores[i], m.score, "final: score of {what} key {i}");
            for (s, &(name, init, _)) in slot_ids.iter().enumerate() {
                let want = m
                    .slots
                    .get(name)
                    .cloned()
                    .unwrap_or_else(|| vec![init; dim]);
                assert_eq!(
                    &slot_rows[s][i * dim..(i + 1) * dim],
                    &want[..],
                    "final: slot {name} of {what} key {i}"
                );
            }
            continue;
        }
        assert!(exists[i], "final: shared key {i} lost");
        let added =
            a.1.values.get(&i).copied().unwrap_or(0.0) + b.1.values.get(&i).copied().unwrap_or(0.0);
        let want: Vec<f32> = shared_start(i, dim).iter().map(|x| x + added).collect();
        assert_eq!(row, &want[..], "final: shared key {i}");
        let writes =
            a.1.writes.get(&i).copied().unwrap_or(0) + b.1.writes.get(&i).copied().unwrap_or(0);
        let want_score = if case.frequency { 1 + writes } else { 0 };
        assert_eq!(scores[i], want_score, "final: score of shared key {i}");
        for (s, &(name, init, _)) in slot_ids.iter().enumerate() {
            let sum = a.1.slots.get(&(i, name)).copied().unwrap_or(0.0)
                + b.1.slots.get(&(i, name)).copied().unwrap_or(0.0);
            let want = vec![init + sum; dim];
            assert_eq!(
                &slot_rows[s][i * dim..(i + 1) * dim],
                &want[..],
                "final: slot {name} of shared key {i}"
            );
        }
    }
    let present = exists.iter().filter(|&&e| e).count();
    assert_eq!(var.size(), present, "final size");
    let (keys, _) = var.export().expect("final export");
    let mut keys: Vec<u64> = keys.iter().map(|k| k.to_bits()).collect();
    keys.sort_unstable();
    let n = keys.len();
    keys.dedup();
    assert_eq!(keys.len(), n, "final export repeats a key");
    assert_eq!(n, present, "final export row count");
}
