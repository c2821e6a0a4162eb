//! One worker thread: a training-like mix of batched operations on the main
//! variable and the ledger, checking every row it reads.
//!
//! Main-variable keys are picked from the window of the latest `--keys` ids,
//! skewed towards recent ids (hot keys, as in training), and new ids are
//! handed out for inserts: every `lookup_or_insert` key is new while the
//! variable grows to `--keys` keys, a tenth of them afterwards, when
//! `remove` (of the window's older half) and `restrict` (whenever the size
//! passes 1.1 `--keys`, back to 0.9 `--keys`) churn it.

use crate::rows::{self, Rng, ACCUM_UNIT};
use crate::shared::Shared;
use crate::stats::Op;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// A ledger index's gradient sum stops growing past this, so values (and
/// slots, twice as large) stay exact f32 integers.
const LEDGER_LIMIT: u64 = 1 << 22;
/// Keys per ledger batch.
const LEDGER_BATCH: usize = 256;

/// The operations a worker picks from, with their weights.
#[derive(Debug, Clone, Copy)]
enum Choice {
    /// [`Worker::lookup_or_insert`].
    LookupOrInsert,
    /// [`Worker::lookup`].
    Lookup,
    /// [`Worker::lookup_slot`].
    LookupSlot,
    /// [`Worker::update_rows`].
    UpdateRows,
    /// [`Worker::accum`].
    Accum,
    /// [`Worker::remove`].
    Remove,
    /// [`Worker::ledger_update`].
    LedgerUpdate,
    /// [`Worker::ledger_accum`].
    LedgerAccum,
    /// [`Worker::ledger_read`].
    LedgerRead,
}

/// Weights while the main variable grows to `--keys` keys.
const GROWING: [(Choice, u32); 9] = [
    (Choice::LookupOrInsert, 40),
    (Choice::Lookup, 12),
    (Choice::LookupSlot, 5),
    (Choice::UpdateRows, 15),
    (Choice::Accum, 10),
    (Choice::Remove, 2),
    (Choice::LedgerUpdate, 8),
    (Choice::LedgerAccum, 4),
    (Choice::LedgerRead, 4),
];

/// Weights afterwards (churn).
const CHURNING: [(Choice, u32); 9] = [
    (Choice::LookupOrInsert, 15),
    (Choice::Lookup, 18),
    (Choice::LookupSlot, 5),
    (Choice::UpdateRows, 20),
    (Choice::Accum, 12),
    (Choice::Remove, 8),
    (Choice::LedgerUpdate, 10),
    (Choice::LedgerAccum, 6),
    (Choice::LedgerRead, 6),
];

/// A worker's reusable buffers.
struct Worker<'a> {
    shared: &'a Shared,
    rng: Rng,
    /// This thread's own gradient sum per ledger index.
    local: Vec<u64>,
    keys: Vec<i64>,
    ids: Vec<usize>,
    grads: Vec<u32>,
    out: Vec<f32>,
    slots: Vec<f32>,
    exists: Vec<bool>,
    deltas: Vec<f32>,
}

/// Runs the load until the stop flag is set; returns this thread's gradient
/// sum per ledger index.
pub fn run(shared: &Shared, index: usize) -> Vec<u64> {
    let mut worker = Worker {
        shared,
        rng: Rng::new(
            shared
                .options
                .seed
                .wrapping_mul(1000)
                .wrapping_add(index as u64),
        ),
        local: vec![0; 2 * shared.ledger.per_kind],
        keys: Vec::new(),
        ids: Vec::new(),
        grads: Vec::new(),
        out: Vec::new(),
        slots: Vec::new(),
        exists: Vec::new(),
        deltas: Vec::new(),
    };
    let mut bounded = shared
        .bounded
        .as_ref()
        .map(|b| crate::bounded::Worker::new(shared, b));
    while !shared.stop.load(Ordering::Relaxed) {
        let _running = shared.running();
        if let Some(bounded) = &mut bounded {
            if worker.rng.chance(0.25) {
                bounded.step(&mut worker.rng, shared.options.batch);
                continue;
            }
        }
        worker.maybe_restrict();
        let growing = !shared.grown.load(Ordering::Relaxed);
        let weights = if growing { &GROWING } else { &CHURNING };
        match worker.choose(weights) {
            Choice::LookupOrInsert => worker.lookup_or_insert(growing),
            Choice::Lookup => worker.lookup(),
            Choice::LookupSlot => worker.lookup_slot(),
            Choice::UpdateRows => worker.update_rows(),
            Choice::Accum => worker.accum(),
            Choice::Remove => worker.remove(),
            Choice::LedgerUpdate => worker.ledger_update(),
            Choice::LedgerAccum => worker.ledger_accum(),
            Choice::LedgerRead => worker.ledger_read(),
        }
    }
    worker.local
}

impl Worker<'_> {
    /// Picks an operation by `weights`.
    fn choose(&mut self, weights: &[(Choice, u32)]) -> Choice {
        let total: u32 = weights.iter().map(|&(_, w)| w).sum();
        let mut pick = self.rng.below(u64::from(total)) as u32;
        for &(choice, weight) in weights {
            if pick < weight {
                return choice;
            }
            pick -= weight;
        }
        weights[weights.len() - 1].0
    }

    /// Fills `keys` with `n` keys from the window, skewed towards recent ids
    /// (`id = end - 1 - span * r^2`); about one in 64 is an id not handed
    /// out yet (a key nobody inserted).
    fn pick_recent(&mut self, n: usize) {
        let (start, end) = self.shared.window();
        let span = end - start;
        self.keys.clear();
        for _ in 0..n {
            let id = if span == 0 || self.rng.below(64) == 0 {
                end + self.rng.below(1 << 20)
            } else {
                let r = self.rng.unit();
                end - 1 - ((span as f64 * r * r) as u64).min(span - 1)
            };
            self.keys.push(self.shared.main_key(id));
        }
    }

    /// Sizes the row buffers for the keys in `keys`.
    fn size_buffers(&mut self) {
        let dim = self.shared.options.dim;
        let n = self.keys.len();
        self.out.resize(n * dim, 0.0);
        self.slots.resize(n * dim, 0.0);
        self.exists.resize(n, false);
    }

    /// Checks the value rows in `out` for `keys`.
    fn check_values(&self, what: &str) {
        let dim = self.shared.options.dim;
        for (i, &key) in self.keys.iter().enumerate() {
            if let Err(e) = rows::check_value(key, &self.out[i * dim..(i + 1) * dim]) {
                self.shared.violation(format!("{what}: {e}"));
            }
        }
    }

    /// `lookup_or_insert` of recent keys and new ids (all new while
    /// `growing`), checking every row read.
    fn lookup_or_insert(&mut self, growing: bool) {
        let batch = self.shared.options.batch;
        let new_share = if growing { 1.0 } else { 0.1 };
        let fresh = (0..batch).filter(|_| self.rng.chance(new_share)).count();
        self.pick_recent(batch - fresh);
        let first = self.shared.new_ids(fresh);
        for id in first..first + fresh as u64 {
            self.keys.push(self.shared.main_key(id));
        }
        self.size_buffers();
        let result = self.shared.main.lookup_or_insert(&self.keys, &mut self.out);
        self.shared.ok("main lookup_or_insert", result);
        self.check_values("main lookup_or_insert");
        self.shared.stats.count(Op::LookupOrInsert, self.keys.len());
    }

    /// `lookup` of recent keys, checking every row read.
    fn lookup(&mut self) {
        self.pick_recent(self.shared.options.batch);
        self.size_buffers();
        let result = self.shared.main.lookup(&self.keys, &mut self.out);
        self.shared.ok("main lookup", result);
        self.check_values("main lookup");
        self.shared.stats.count(Op::Lookup, self.keys.len());
    }

    /// `lookup_slot` of recent keys, checking every slot row read.
    fn lookup_slot(&mut self) {
        self.pick_recent(self.shared.options.batch);
        self.size_buffers();
        let shared = self.shared;
        let result = shared
            .main
            .lookup_slot(shared.main_slot, &self.keys, &mut self.slots);
        shared.ok("main lookup_slot", result);
        let dim = shared.options.dim;
        for (i, &key) in self.keys.iter().enumerate() {
            if let Err(e) = rows::check_slot(key, &self.slots[i * dim..(i + 1) * dim]) {
                shared.violation(format!("main lookup_slot: {e}"));
            }
        }
        shared.stats.count(Op::LookupSlot, self.keys.len());
    }

    /// An optimizer step: `update_rows` with the slot and gradients in
    /// `1..=3`, each row's pair checked under its lock before the step.
    fn update_rows(&mut self) {
        self.pick_recent(self.shared.options.batch);
        self.grads.clear();
        for _ in 0..self.keys.len() {
            self.grads.push(1 + self.rng.below(3) as u32);
        }
        let shared = self.shared;
        let (keys, grads) = (&self.keys, &self.grads);
        let mut failed: Option<String> = None;
        let result = shared
            .main
            .update_rows(keys, &[shared.main_slot], |i, values, slot| {
                if let Err(e) = rows::step(keys[i], grads[i], values, slot) {
                    failed.get_or_insert(e);
                }
            });
        if let Some(e) = failed {
            shared.violation(format!("inside main update_rows (under the row lock): {e}"));
        }
        shared.ok("main update_rows", result);
        shared.stats.count(Op::UpdateRows, keys.len());
    }

    /// `bp_v2`: `lookup_with_exists` (rows checked; a missing key must read
    /// 0), then `accum` of 1 to 3 units with those flags.
    fn accum(&mut self) {
        self.pick_recent(self.shared.options.batch);
        self.size_buffers();
        let shared = self.shared;
        let result = shared
            .main
            .lookup_with_exists(&self.keys, &mut self.out, &mut self.exists);
        shared.ok("main lookup_with_exists", result);
        self.check_values("main lookup_with_exists");
        let dim = shared.options.dim;
        for (i, &key) in self.keys.iter().enumerate() {
            if !self.exists[i] && self.out[i * dim] != 0.0 {
                shared.violation(format!(
                    "main lookup_with_exists: missing key {key} read {} instead of the \
                     initializer's 0",
                    self.out[i * dim]
                ));
            }
        }
        shared.stats.count(Op::LookupWithExists, self.keys.len());
        self.deltas.clear();
        for _ in 0..self.keys.len() {
            let units = 1 + self.rng.below(3);
            let delta = ACCUM_UNIT * units as f32;
            self.deltas.extend(std::iter::repeat_n(delta, dim));
        }
        let result = shared.main.accum(&self.keys, &self.deltas, &self.exists);
        shared.ok("main accum", result);
        shared.stats.count(Op::Accum, self.keys.len());
    }

    /// `remove` of keys from the window's older half, unless a strict save
    /// holds the removal gate.
    fn remove(&mut self) {
        let shared = self.shared;
        let Ok(_gate) = shared.removal_gate.try_read() else {
            return; // a strict save is running: no removal now
        };
        let (start, end) = shared.window();
        let half = (end - start) / 2;
        if half == 0 {
            return;
        }
        self.keys.clear();
        for _ in 0..shared.options.batch / 4 {
            let id = start + self.rng.below(half);
            self.keys.push(shared.main_key(id));
        }
        let result = shared.main.remove(&self.keys);
        shared.ok("main remove", result);
        shared.stats.count(Op::Remove, self.keys.len());
    }

    /// Runs `restrict` if the main variable is above the trigger and no other
    /// worker is restricting and no strict save is running.
    fn maybe_restrict(&mut self) {
        let shared = self.shared;
        let size = shared.main.size();
        if size >= shared.options.keys {
            shared.grown.store(true, Ordering::Relaxed);
        }
        if size <= shared.restrict_trigger() || shared.restricting.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Ok(_gate) = shared.removal_gate.try_read() {
            let started = Instant::now();
            let removed = shared
                .main
                .restrict(shared.restrict_reserve(), shared.restrict_trigger());
            let removed = shared.ok("main restrict", removed);
            shared.stats.restricts.add(started.elapsed());
            shared
                .stats
                .restrict_removed
                .fetch_add(removed as u64, Ordering::Relaxed);
        }
        shared.restricting.store(false, Ordering::Release);
    }

    /// Picks `LEDGER_BATCH` indexes of one kind (repeats allowed), leaving
    /// out those at the exactness limit.
    fn pick_ledger(&mut self, update_keys: bool) {
        let ledger = &self.shared.ledger;
        let base = if update_keys { 0 } else { ledger.per_kind };
        self.ids.clear();
        self.keys.clear();
        for _ in 0..LEDGER_BATCH {
            let j = base + self.rng.below(ledger.per_kind as u64) as usize;
            if ledger.started[j].load(Ordering::Relaxed) < LEDGER_LIMIT {
                self.ids.push(j);
                self.keys.push(ledger.key(j));
            }
        }
        self.grads.clear();
        for _ in 0..self.ids.len() {
            self.grads.push(1 + self.rng.below(4) as u32);
        }
        for (&j, &g) in self.ids.iter().zip(&self.grads) {
            ledger.started[j].fetch_add(u64::from(g), Ordering::SeqCst);
        }
    }

    /// Books the gradients of a ledger call that returned.
    fn book_ledger(&mut self) {
        let ledger = &self.shared.ledger;
        for (&j, &g) in self.ids.iter().zip(&self.grads) {
            ledger.done[j].fetch_add(u64::from(g), Ordering::SeqCst);
            self.local[j] += u64::from(g);
        }
    }

    /// `update_rows` of update keys: value `+= g`, slot `+= 2g`, after
    /// checking `slot == 2 * value` under the row lock.
    fn ledger_update(&mut self) {
        self.pick_ledger(true);
        let shared = self.shared;
        let (keys, grads) = (&self.keys, &self.grads);
        let mut failed: Option<String> = None;
        let result =
            shared
                .ledger
                .var
                .update_rows(keys, &[shared.ledger.slot], |i, values, slot| {
                    let check =
                        rows::ledger_value("ledger value row", keys[i], values).and_then(|v| {
                            let s = rows::ledger_value("ledger slot row", keys[i], slot)?;
                            if s == 2 * v {
                                Ok(v)
                            } else {
                                Err(format!(
                                    "ledger key {}: slot {s} != 2 * value {v} under the row lock",
                                    keys[i]
                                ))
                            }
                        });
                    match check {
                        Ok(_) => {
                            let g = grads[i] as f32;
                            values.iter_mut().for_each(|x| *x += g);
                            slot.iter_mut().for_each(|x| *x += 2.0 * g);
                        }
                        Err(e) => {
                            failed.get_or_insert(e);
                        }
                    }
                });
        if let Some(e) = failed {
            shared.violation(format!("inside ledger update_rows: {e}"));
        }
        shared.ok("ledger update_rows", result);
        self.book_ledger();
        shared.stats.count(Op::LedgerUpdate, self.keys.len());
    }

    /// `accum` of accum keys (`exists = true`: they are always present).
    fn ledger_accum(&mut self) {
        self.pick_ledger(false);
        let shared = self.shared;
        let dim = shared.options.dim;
        self.deltas.clear();
        for &g in &self.grads {
            self.deltas.extend(std::iter::repeat_n(g as f32, dim));
        }
        self.exists.clear();
        self.exists.resize(self.keys.len(), true);
        let result = shared
            .ledger
            .var
            .accum(&self.keys, &self.deltas, &self.exists);
        shared.ok("ledger accum", result);
        self.book_ledger();
        shared.stats.count(Op::LedgerAccum, self.keys.len());
    }

    /// Reads ledger rows of both kinds and checks each against the books:
    /// `done` read before the lookup <= value <= `started` read after, and
    /// the slot (read after the value): `2 * value <= slot <= 2 * started`
    /// for update keys, 0 for accum keys.
    fn ledger_read(&mut self) {
        let shared = self.shared;
        let ledger = &shared.ledger;
        let dim = shared.options.dim;
        self.ids.clear();
        self.keys.clear();
        for _ in 0..64 {
            let j = self.rng.below(2 * ledger.per_kind as u64) as usize;
            self.ids.push(j);
            self.keys.push(ledger.key(j));
        }
        self.size_buffers();
        let lower: Vec<u64> = self
            .ids
            .iter()
            .map(|&j| ledger.done[j].load(Ordering::SeqCst))
            .collect();
        let result = ledger.var.lookup(&self.keys, &mut self.out);
        shared.ok("ledger lookup", result);
        let result = ledger
            .var
            .lookup_slot(ledger.slot, &self.keys, &mut self.slots);
        shared.ok("ledger lookup_slot", result);
        for (i, &j) in self.ids.iter().enumerate() {
            let upper = ledger.started[j].load(Ordering::SeqCst);
            let key = self.keys[i];
            let row = |buf: &[f32], what| {
                rows::ledger_value(what, key, &buf[i * dim..(i + 1) * dim])
                    .unwrap_or_else(|e| shared.violation(format!("ledger read: {e}")))
            };
            let v = row(&self.out, "ledger value row");
            let s = row(&self.slots, "ledger slot row");
            if !(lower[i]..=upper).contains(&v) {
                shared.violation(format!(
                    "ledger read: key {key} (index {j}) has value {v}, but {} was added by calls \
                     that had returned before the read and at most {upper} by calls started \
                     before its end{}",
                    lower[i],
                    if v < lower[i] {
                        ": an update was lost"
                    } else {
                        ""
                    }
                ));
            }
            let slot_ok = if ledger.is_update_key(j) {
                2 * v <= s && s <= 2 * upper
            } else {
                s == 0
            };
            if !slot_ok {
                shared.violation(format!(
                    "ledger read: key {key} (index {j}, {} key) has value {v} then slot {s} \
                     (started sum {upper})",
                    if ledger.is_update_key(j) {
                        "update"
                    } else {
                        "accum"
                    }
                ));
            }
        }
        shared.stats.count(Op::LedgerRead, self.keys.len());
    }
}

/// Returns the workers' ledger sums, added up per index.
pub fn sum_locals(locals: &[Vec<u64>]) -> Vec<u64> {
    let mut total = vec![0u64; locals.first().map_or(0, Vec::len)];
    for local in locals {
        for (t, x) in total.iter_mut().zip(local) {
            *t += x;
        }
    }
    total
}
