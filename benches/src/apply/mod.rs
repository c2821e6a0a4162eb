//! Optimizer steps, what a training step's sparse update costs: the
//! [`Trainer`] trait, the [`Stepped`] driver every system but dynemb shares,
//! and the checks that a system's rows are bit for bit the per-key model's.
//!
//! # What is measured
//!
//! One `apply` per batch of the workload (65,536 keys by default) of three
//! `dynemb-optim` optimizers, [`SparseSgd`](dynemb_optim::SparseSgd),
//! [`SparseAdagrad`](dynemb_optim::SparseAdagrad) and
//! [`SparseAdam`](dynemb_optim::SparseAdam), with Keras' default
//! hyperparameters except the learning rate ([`LR`] for all three), and the
//! workload's one batch of gradient rows ([`Workload::grads`]) for every
//! batch. A step sums the gradient rows of the batch's repeated keys and
//! updates each distinct key's value row and slot rows (SGD: none; Adagrad:
//! `accumulator`; Adam: `m`, `v`) with the optimizer's row kernel. The
//! batches are the workload's uniform picks and its Zipf(1.1) picks of stored
//! keys: a Zipf batch repeats its hottest keys many times, and summing them
//! (the dedup) is part of every system's timed work. Throughput is keys of
//! the batches per second: occurrences, repeats counted, not distinct keys.
//!
//! # Systems
//!
//! Every system does the same arithmetic: the same dedup and sum
//! ([`dynemb_optim::dedup::dedup`], the function dynemb's driver calls), then
//! per distinct key the same row kernel ([`Rule::update`] with the step's
//! constants from [`Rule::prepare`]), so every system's rows are bit for bit
//! equal after the same steps (checked, see below). dynemb runs its own
//! driver and counts its own steps ([`crate::peers::dynemb`]); every other
//! system is a [`Stepped`] table: the step count, the constants prepared
//! once per call (as `Sparse::begin_step` does) and the dedup are
//! [`Stepped`]'s, the row access the system's ([`SlotRows`], implemented in
//! each module of [`crate::peers`]). The peers hold per key one
//! `Box<[f32]>` with the value row and every slot row back to back.
//! hashbrown+RwLock does not run these ops ("-").
//!
//! # How the suite runs them
//!
//! For each system and optimizer, one after another, on a fresh table (the
//! previous one dropped and the allocator's free memory returned first):
//! 1. prefill, untimed: every key of the workload with its row of
//!    [`Workload::values`] (key `i` gets value row `i % batch`, as the other
//!    ops' tables) and its slots' initial values;
//! 2. [`check_first_steps`]: the first uniform batch, then the first Zipf
//!    batch, on one thread (for dynemb the first creates the slot columns);
//! 3. one untimed warm-up round of every op at the most threads (every row
//!    the timed rounds touch has been touched: no page fault is timed);
//! 4. for each thread count, `repeats` rounds, each timing every selected op
//!    once over all its picks (median reported). T threads apply the
//!    disjoint contiguous shares of the picks concurrently, whole batches
//!    each ([`crate::harness::run_split`], as for every other op);
//! 5. [`check_next_step`]: one more step on one thread, checked against the
//!    kernel applied to the rows read before it.
//!
//! # Correctness
//!
//! [`check_first_steps`] compares sample rows (value and slot rows, bit for
//! bit) after the first two steps with a per-key model computed here from
//! the initial rows: the rows every correct system holds, the dense
//! reference's included, since all ran the same batches from the same rows.
//! After the timed rounds the rows differ between systems and runs (two
//! threads interleave their steps, so which step number a batch gets
//! varies, and the dense reference may lose a racing update), so
//! [`check_next_step`] checks the step relative to the rows it starts from.
//! The unit tests (`tests`) run several steps through every adapter and
//! compare every row and slot with dynemb's.

use crate::harness::{batches, rate, run_split};
use crate::peers::{Spec, System};
use crate::workload::{Batch, Picks, Workload};
use dynemb::{Dtype, Key};
use dynemb_optim::dedup::Dedup;
use dynemb_optim::{ParamsAdagrad, ParamsAdam, ParamsSgd, Rule};
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};

/// The learning rate of every optimizer (its other hyperparameters are
/// Keras' defaults). It does not change the work.
pub const LR: f32 = 0.01;

/// The optimizers whose steps are measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum Optimizer {
    /// `SparseSgd`: no slot.
    #[serde(rename = "SparseSgd")]
    Sgd,
    /// `SparseAdagrad`: one slot (`accumulator`, from 0.1).
    #[serde(rename = "SparseAdagrad")]
    Adagrad,
    /// `SparseAdam`: two slots (`m`, `v`, from 0).
    #[serde(rename = "SparseAdam")]
    Adam,
}

/// `SparseSgd`'s hyperparameters here.
pub fn sgd() -> ParamsSgd {
    ParamsSgd { lr: LR }
}

/// `SparseAdagrad`'s hyperparameters here.
pub fn adagrad() -> ParamsAdagrad {
    ParamsAdagrad {
        lr: LR,
        ..ParamsAdagrad::default()
    }
}

/// `SparseAdam`'s hyperparameters here.
pub fn adam() -> ParamsAdam {
    ParamsAdam {
        lr: LR,
        ..ParamsAdam::default()
    }
}

impl Optimizer {
    /// Every optimizer, in report order.
    pub const ALL: [Optimizer; 3] = [Optimizer::Sgd, Optimizer::Adagrad, Optimizer::Adam];

    /// The optimizer's type name (`"SparseAdam"`).
    pub fn name(self) -> &'static str {
        match self {
            Optimizer::Sgd => "SparseSgd",
            Optimizer::Adagrad => "SparseAdagrad",
            Optimizer::Adam => "SparseAdam",
        }
    }

    /// The initial value of each of its slots, in the rule's slot order.
    pub fn slot_initials(self) -> Vec<f32> {
        let slots = match self {
            Optimizer::Sgd => sgd().slots(),
            Optimizer::Adagrad => adagrad().slots(),
            Optimizer::Adam => adam().slots(),
        };
        slots.into_iter().map(|(_, initial)| initial).collect()
    }

    /// Values a key holds: its value row and its slot rows.
    pub fn row_len(self, dim: usize) -> usize {
        (1 + self.slot_initials().len()) * dim
    }

    /// The model of one key's step: the rule's kernel at step `t` on `row`
    /// (value row, then slot rows) with the summed gradient row `grad`.
    pub fn step_row(self, t: u64, grad: &[f32], row: &mut [f32]) {
        fn run<R: Rule>(params: R, t: u64, grad: &[f32], row: &mut [f32]) {
            let step = params.prepare(t, params.lr());
            let (value, slots) = row.split_at_mut(grad.len());
            R::update(&step, grad, value, slots);
        }
        match self {
            Optimizer::Sgd => run(sgd(), t, grad, row),
            Optimizer::Adagrad => run(adagrad(), t, grad, row),
            Optimizer::Adam => run(adam(), t, grad, row),
        }
    }
}

/// A table of rows with an optimizer's slots, trained one batch at a time.
/// Calls may come from several threads at once.
pub trait Trainer: Sync {
    /// Which system this is.
    fn system(&self) -> System;

    /// Which optimizer it runs.
    fn optimizer(&self) -> Optimizer;

    /// Stores keys that are not present yet with the rows of `values` and
    /// their slots' initial values (untimed: building the table).
    fn prefill(&self, batch: Batch<'_>, values: &[f32]);

    /// One optimizer step: sums the gradient rows (`grads`, `batch.len() *
    /// dim` values) of repeated keys and updates each distinct key's value
    /// and slot rows. Every key of `batch` is stored.
    fn apply(&self, batch: Batch<'_>, grads: &[f32]);

    /// Steps taken so far: the next step is `steps() + 1`.
    fn steps(&self) -> u64;

    /// Copies a stored key's value row and slot rows, back to back, into
    /// `out` ([`Optimizer::row_len`] values); `row` is its dense row index.
    fn read(&self, key: u64, row: u32, out: &mut [f32]);

    /// How it stores values and slots: each step's result is stored
    /// rounded to this.
    fn dtype(&self) -> Dtype {
        Dtype::F32
    }
}

/// A system's table of value and slot rows, as [`Stepped`] drives it.
pub trait SlotRows: Sync + Sized {
    /// Which system this is.
    const SYSTEM: System;

    /// What the table is addressed by, and the dedup runs over: keys, or
    /// the dense reference's row indices.
    type Id: Key;

    /// An empty table for `spec` whose rows carry one slot row per entry of
    /// `initials`, starting at that value.
    fn with_slots(spec: &Spec, initials: &[f32]) -> Self;

    /// The ids of `batch` ([`Batch::keys`] or [`Batch::rows`]).
    fn ids<'a>(batch: Batch<'a>) -> &'a [Self::Id];

    /// Stores keys that are not present yet with the rows of `values` and
    /// slot rows at `initials`.
    fn prefill(&self, batch: Batch<'_>, values: &[f32], initials: &[f32]);

    /// Runs `update(i, row)` on the value and slot rows (back to back) of
    /// each of the distinct `ids`, in order, each under whatever keeps
    /// concurrent writers of the row apart.
    fn update_each(&self, ids: &[Self::Id], update: impl FnMut(usize, &mut [f32]));

    /// Copies a stored key's value row and slot rows, back to back, into
    /// `out`; `row` is its dense row index.
    fn read(&self, key: u64, row: u32, out: &mut [f32]);
}

/// A [`SlotRows`] table trained by the rule `R`: the step count, the step's
/// constants and the dedup, as dynemb's driver does them.
pub struct Stepped<P, R: Rule> {
    /// Which optimizer `R` is.
    optimizer: Optimizer,
    /// The hyperparameters.
    params: R,
    /// Steps taken so far.
    steps: AtomicU64,
    /// Each slot's initial value.
    initials: Vec<f32>,
    /// The table.
    rows: P,
    /// Values per row.
    dim: usize,
}

impl<P: SlotRows, R: Rule> Stepped<P, R> {
    /// An empty table for `spec`, trained with `params`.
    pub fn new(optimizer: Optimizer, params: R, spec: &Spec) -> Self {
        let initials: Vec<f32> = params.slots().into_iter().map(|(_, v)| v).collect();
        Stepped {
            optimizer,
            params,
            steps: AtomicU64::new(0),
            rows: P::with_slots(spec, &initials),
            initials,
            dim: spec.dim,
        }
    }
}

impl<P: SlotRows, R: Rule> Trainer for Stepped<P, R> {
    fn system(&self) -> System {
        P::SYSTEM
    }

    fn optimizer(&self) -> Optimizer {
        self.optimizer
    }

    fn prefill(&self, batch: Batch<'_>, values: &[f32]) {
        self.rows.prefill(batch, values, &self.initials);
    }

    fn apply(&self, batch: Batch<'_>, grads: &[f32]) {
        let t = self.steps.fetch_add(1, Ordering::Relaxed) + 1;
        let step = self.params.prepare(t, self.params.lr());
        let dim = self.dim;
        Dedup::with_thread_local(|scratch| {
            let unique = scratch.run(P::ids(batch), grads, dim).expect("dedup");
            let grads = unique.grads;
            self.rows.update_each(&unique.keys, |i, row| {
                let (value, slots) = row.split_at_mut(dim);
                R::update(&step, &grads[i * dim..(i + 1) * dim], value, slots);
            });
        });
    }

    fn steps(&self) -> u64 {
        self.steps.load(Ordering::Relaxed)
    }

    fn read(&self, key: u64, row: u32, out: &mut [f32]) {
        self.rows.read(key, row, out);
    }
}

/// A peer's row: `value`, then each slot's row at its initial value.
pub(crate) fn boxed_row(value: &[f32], initials: &[f32]) -> Box<[f32]> {
    let mut row = Vec::with_capacity(value.len() * (1 + initials.len()));
    row.extend_from_slice(value);
    for &initial in initials {
        row.extend(std::iter::repeat_n(initial, value.len()));
    }
    row.into_boxed_slice()
}

/// Stores every key of the workload with its initial row, on `threads`
/// threads (untimed).
pub fn prefill(trainer: &dyn Trainer, w: &Workload, threads: usize) {
    let batch = w.batch();
    let mut shares = vec![(); threads.max(1)];
    run_split(&mut shares, w.keys.len(), batch, |_, share| {
        for range in batches(share, batch) {
            let b = w.keys.batch(range);
            trainer.prefill(b, w.values_for(b.len()));
        }
    });
}

/// Times one step per batch over all of `picks` on `threads` threads;
/// keys (occurrences) per second.
pub fn time_apply(trainer: &dyn Trainer, picks: &Picks, w: &Workload, threads: usize) -> f64 {
    let batch = w.batch();
    let mut shares = vec![(); threads.max(1)];
    let elapsed = run_split(&mut shares, picks.len(), batch, |_, share| {
        for range in batches(share, batch) {
            let b = picks.batch(range);
            trainer.apply(b, w.grads_for(b.len()));
        }
    });
    rate(picks.len(), elapsed)
}

/// Sample positions checked per batch (plus the batch's most repeated key).
const SAMPLES_PER_BATCH: usize = 32;

/// The first batch of `picks`.
fn first_batch<'a>(w: &Workload, picks: &'a Picks) -> Batch<'a> {
    picks.batch(0..w.batch().min(picks.len()))
}

/// Keys of `batch` to check, with their dense rows: every
/// `len / SAMPLES_PER_BATCH`-th position and the most repeated key, each
/// once.
fn sample(batch: Batch<'_>) -> Vec<(u64, u32)> {
    let stride = (batch.len() / SAMPLES_PER_BATCH).max(1);
    let mut keys: Vec<(u64, u32)> = (0..batch.len())
        .step_by(stride)
        .map(|i| (batch.keys[i], batch.rows[i]))
        .collect();
    let mut counts: std::collections::HashMap<u32, usize> = std::collections::HashMap::new();
    for &r in batch.rows {
        *counts.entry(r).or_default() += 1;
    }
    if let Some((&hot, _)) = counts.iter().max_by_key(|&(&r, &c)| (c, r)) {
        let i = batch
            .rows
            .iter()
            .position(|&r| r == hot)
            .expect("in the batch");
        keys.push((batch.keys[i], hot));
    }
    keys.sort_unstable();
    keys.dedup();
    keys
}

/// The model of one step for one key: sums `key`'s gradient rows in
/// `batch` in batch order (as the dedup does: the first row, then each
/// later one added) and applies the kernel at step `t` to `row`; a key not
/// in the batch keeps its row.
fn model_step(
    optimizer: Optimizer,
    t: u64,
    batch: Batch<'_>,
    grads: &[f32],
    key: u64,
    row: &mut [f32],
) {
    let dim = grads.len() / batch.len().max(1);
    let mut sum: Option<Vec<f32>> = None;
    for (i, _) in batch.keys.iter().enumerate().filter(|&(_, &k)| k == key) {
        let g = &grads[i * dim..(i + 1) * dim];
        match &mut sum {
            None => sum = Some(g.to_vec()),
            Some(s) => s.iter_mut().zip(g).for_each(|(s, g)| *s += g),
        }
    }
    if let Some(sum) = sum {
        optimizer.step_row(t, &sum, row);
    }
}

/// The row the prefill gives the key of dense row `r`: value row `r %
/// batch` of [`Workload::values`], slots at their initial values.
fn initial_row(optimizer: Optimizer, w: &Workload, r: u32) -> Vec<f32> {
    let dim = w.dim();
    let at = (r as usize % w.batch()) * dim;
    boxed_row(&w.values[at..at + dim], &optimizer.slot_initials()).into_vec()
}

/// A trainer's row of `key`.
fn read(trainer: &dyn Trainer, key: u64, row: u32, dim: usize) -> Vec<f32> {
    let mut out = vec![f32::NAN; trainer.optimizer().row_len(dim)];
    trainer.read(key, row, &mut out);
    out
}

/// Panics unless `got` equals `want` bit for bit.
fn assert_rows(trainer: &dyn Trainer, key: u64, got: &[f32], want: &[f32], when: &str) {
    let bits = |xs: &[f32]| xs.iter().map(|x| x.to_bits()).collect::<Vec<u32>>();
    assert!(
        bits(got) == bits(want),
        "{} {}: key {key} {when}: rows (value, then slots) {got:?}, expected {want:?}",
        trainer.system().name(),
        trainer.optimizer().name(),
    );
}

/// On a freshly prefilled trainer (no step taken): applies the first batch
/// of the uniform picks (step 1), then the first batch of the Zipf picks
/// (step 2), on one thread, and checks sample keys of both (the hottest Zipf
/// key included) bit for bit against the per-key model.
///
/// # Panics
/// On any difference: a trainer computing wrong rows would make its figures
/// meaningless.
pub fn check_first_steps(trainer: &dyn Trainer, w: &Workload) {
    let dim = w.dim();
    let optimizer = trainer.optimizer();
    assert_eq!(trainer.steps(), 0, "a fresh trainer");
    let steps = [first_batch(w, &w.uniform), first_batch(w, &w.zipf)];
    for b in steps {
        trainer.apply(b, w.grads_for(b.len()));
    }
    assert_eq!(trainer.steps(), 2, "{}: steps", trainer.system().name());
    let dtype = trainer.dtype();
    for (key, r) in steps.iter().flat_map(|b| sample(*b)) {
        let mut want = initial_row(optimizer, w, r);
        dtype.round_slice(&mut want);
        for (t, b) in (1..).zip(steps) {
            model_step(optimizer, t, b, w.grads_for(b.len()), key, &mut want);
            dtype.round_slice(&mut want);
        }
        let got = read(trainer, key, r, dim);
        assert_rows(trainer, key, &got, &want, "after the first two steps");
    }
}

/// Applies one more step (the first batch of the Zipf picks) on one thread
/// and checks that each sample key's rows became the kernel, at the step's
/// number, applied to the rows read before it.
///
/// # Panics
/// On any difference.
pub fn check_next_step(trainer: &dyn Trainer, w: &Workload) {
    let dim = w.dim();
    let optimizer = trainer.optimizer();
    let b = first_batch(w, &w.zipf);
    let keys = sample(b);
    let before: Vec<Vec<f32>> = keys
        .iter()
        .map(|&(key, r)| read(trainer, key, r, dim))
        .collect();
    let t = trainer.steps() + 1;
    trainer.apply(b, w.grads_for(b.len()));
    assert_eq!(trainer.steps(), t, "{}: steps", trainer.system().name());
    for (&(key, r), mut want) in keys.iter().zip(before) {
        model_step(optimizer, t, b, w.grads_for(b.len()), key, &mut want);
        trainer.dtype().round_slice(&mut want);
        let got = read(trainer, key, r, dim);
        assert_rows(trainer, key, &got, &want, &format!("after step {t}"));
    }
}

#[cfg(test)]
mod tests;
