//! The driver every optimizer shares: [`Sparse`], generic over a [`Rule`]
//! (an optimizer's hyperparameters and row kernel), and the
//! [`SparseOptimizer`] trait.
//!
//! A step ([`Sparse::begin_step`]) fixes the step number `t` (1 for the
//! first step: Keras' `iterations + 1`) and the learning rate (the schedule
//! evaluated at `t - 1`, Keras' `iterations`), and precomputes the rule's
//! per-step constants. [`Step::apply`] then, for one store:
//! 1. checks the input before anything changes: the store is trainable,
//!    `grads.len() == keys.len() * dim` ([`Error::LengthMismatch`]) and
//!    every gradient finite ([`Error::NonFinite`] naming the value's
//!    position in `grads`);
//! 2. creates the rule's missing slots in the store, all or nothing
//!    ([`EmbeddingStore::create_slots`]): an existing slot of the same name
//!    with another initial value is an [`Error::Mismatch`], a store without
//!    room for every missing slot ([`MAX_SLOTS`](dynemb::MAX_SLOTS)) an
//!    [`Error::InvalidArgument`], and neither creates a slot;
//! 3. sums the gradients of repeated keys ([`crate::dedup`]);
//! 4. runs the rule's row kernel on each distinct key through
//!    [`EmbeddingStore::update_rows`]: one index probe and one row lock per
//!    key, the value, every slot and the restrict score updated together;
//!    a missing key is inserted with the initializer's row (the row the
//!    forward `lookup` returned) and its slots' initial values.
//!
//! [`SparseOptimizer::apply`] checks all of that (with [`check_step`]) and
//! that the next step can begin ([`Sparse::check_next_step`]) before the
//! step number is taken, so a refused call changes nothing: no row, no
//! slot, no step count. A model stepping several stores checks each with
//! [`check_step`] before [`Sparse::begin_step`]. What no check can see
//! first may still stop a step part-way: a row whose update overflows
//! (below), a remote store's node failing mid-write
//! ([`Error::Backend`]), or another handle filling the store's slot list
//! between the check and the creation.
//!
//! Rows a step does not touch keep their values and slots (TFRA's lazy
//! behaviour). A row whose update would overflow to infinity (finite but
//! extreme gradients), or to a value its half dtype cannot hold, is not
//! stored: it keeps its previous value and slots (a missing key is not
//! inserted), the other rows are updated, and the call returns
//! [`Error::NonFinite`] (or [`Error::OutOfRange`]) whose `index` is the
//! batch position of the first such key's first occurrence.
//!
//! Slots are named as TensorFlow names them (`m`, `v`, `accumulator`, ...),
//! without the optimizer's name: two optimizers training one variable share
//! same-named slots whose meaning may differ (Adam's `v` is not Adamax's).
//! Train each variable with one optimizer, as TFRA does.
//!
//! [`SparseOptimizer::apply`] is one whole step on one store. A model with
//! several tables takes one step over all of them with one
//! [`Sparse::begin_step`] and a [`Step::apply`] per table (of any key
//! types), which advances the step count once. Steps may run from many
//! threads at once (each gets its own `t`); concurrent updates of one key
//! serialize on its row lock and none is lost.

use crate::dedup::{check_grads_len, Dedup, DedupedRef};
use crate::schedule::LearningRate;
use dynemb::{EmbeddingStore, Error, Result, SlotId};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::fmt::Debug;
use std::path::Path;
use std::sync::{Mutex, PoisonError};

/// An optimizer's hyperparameters and update rule: what a `Params*` type
/// implements. [`Sparse<R>`] drives it.
pub trait Rule:
    Clone + Debug + PartialEq + Send + Sync + Serialize + DeserializeOwned + 'static
{
    /// The optimizer's type name (`"SparseAdam"`), recorded in its state.
    const NAME: &'static str;
    /// What a step precomputes from `t` and the learning rate.
    type Step: Send + Sync;

    /// Checks the hyperparameters (an [`Error::InvalidArgument`] naming the
    /// bad one).
    fn validate(&self) -> Result<()>;
    /// The base learning rate.
    fn lr(&self) -> f32;
    /// Sets the base learning rate.
    fn set_lr(&mut self, lr: f32);
    /// The slot columns the rule keeps, TensorFlow's names, with the value
    /// every row starts at.
    fn slots(&self) -> Vec<(&'static str, f32)>;
    /// The per-step constants for step `t` (1-based) at learning rate `lr`.
    fn prepare(&self, t: u64, lr: f32) -> Self::Step;
    /// The row kernel: updates one key's `value` row and its slot rows
    /// (`slots().len()` rows of `dim` back to back, in `slots()` order) with
    /// its summed gradient row `grad`.
    fn update(step: &Self::Step, grad: &[f32], value: &mut [f32], slots: &mut [f32]);
}

/// Most steps an optimizer counts (far beyond any training run; keeps `t`
/// exact in the `f32` bias corrections' exponents' range of use).
const MAX_STEPS: u64 = 1 << 62;

/// Checks a hyperparameter.
pub(crate) fn check(ok: bool, optimizer: &str, what: impl std::fmt::Display) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!("{optimizer}: {what}")))
    }
}

/// Checks an epsilon: a normal positive number (TensorFlow flushes
/// subnormals to 0).
pub(crate) fn check_eps(optimizer: &str, eps: f32) -> Result<()> {
    check(
        eps.is_finite() && eps >= f32::MIN_POSITIVE,
        optimizer,
        format!(
            "eps must be a normal positive number (TensorFlow flushes subnormals to 0), got {eps}"
        ),
    )
}

/// Checks a decay rate (a beta, a rho): in `[0, 1)`.
pub(crate) fn check_decay(optimizer: &str, what: &str, decay: f32) -> Result<()> {
    check(
        (0.0..1.0).contains(&decay),
        optimizer,
        format!("{what} must be in [0, 1), got {decay}"),
    )
}

/// The checks every learning rate gets: finite and not negative.
pub(crate) fn check_lr(optimizer: &str, lr: f32) -> Result<()> {
    check(
        lr.is_finite() && lr >= 0.0,
        optimizer,
        format!("lr must be finite and >= 0, got {lr}"),
    )
}

/// An optimizer that trains embedding stores one sparse step at a time.
pub trait SparseOptimizer: Send + Sync {
    /// One whole step on one store: updates the rows of `keys` (repeated
    /// keys' gradients summed) with `grads` (`keys.len() * dim` values).
    fn apply<S: EmbeddingStore>(&self, store: &S, keys: &[S::Key], grads: &[f32]) -> Result<()>;
}

/// The mutable part of an optimizer: what its state file holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct State<R> {
    optimizer: String,
    params: R,
    step: u64,
    learning_rate: LearningRate,
}

/// A sparse optimizer running the rule `R` (`SparseAdam` is
/// `Sparse<ParamsAdam>`); see the [module docs](self).
#[derive(Debug)]
pub struct Sparse<R: Rule> {
    state: Mutex<State<R>>,
}

/// One optimizer step, applied to any number of stores; see
/// [`Sparse::begin_step`].
#[derive(Debug)]
pub struct Step<R: Rule> {
    t: u64,
    lr: f32,
    params: R,
    consts: R::Step,
}

impl<R: Rule> Sparse<R> {
    /// An optimizer with these hyperparameters, at step 0 with a constant
    /// learning rate; an [`Error::InvalidArgument`] if any is invalid.
    pub fn new(params: R) -> Result<Self> {
        params.validate()?;
        Ok(Sparse {
            state: Mutex::new(State {
                optimizer: R::NAME.to_string(),
                params,
                step: 0,
                learning_rate: LearningRate::Constant,
            }),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State<R>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The hyperparameters.
    pub fn params(&self) -> R {
        self.state().params.clone()
    }

    /// Steps taken so far (Keras' `iterations`).
    pub fn steps(&self) -> u64 {
        self.state().step
    }

    /// Sets the base learning rate for the following steps (checked as
    /// `new` checks it: FTRL needs it above 0). Under a schedule, the base
    /// rate is what `ExponentialDecay` scales, and `PiecewiseConstant`
    /// ignores it (unlike Keras, where assigning a rate replaces the
    /// schedule: call `set_learning_rate(LearningRate::Constant)` for that).
    pub fn set_lr(&self, lr: f32) -> Result<()> {
        let mut state = self.state();
        let mut params = state.params.clone();
        params.set_lr(lr);
        params.validate()?;
        state.params = params;
        Ok(())
    }

    /// Makes the following steps' learning rate follow `schedule`.
    pub fn set_learning_rate(&self, schedule: LearningRate) -> Result<()> {
        schedule.validate()?;
        self.state().learning_rate = schedule;
        Ok(())
    }

    /// The learning rate the next step will use.
    pub fn current_lr(&self) -> f32 {
        let state = self.state();
        state.learning_rate.at(state.params.lr(), state.step)
    }

    /// Starts a step: takes the next step number and the learning rate for
    /// it. Apply it to every store of the model with [`Step::apply`]. An
    /// [`Error::InvalidArgument`] (and no step taken) if the schedule's
    /// learning rate at this step is not one the rule accepts (not finite;
    /// 0 for FTRL) or the step count is exhausted.
    pub fn begin_step(&self) -> Result<Step<R>> {
        let mut state = self.state();
        let (t, lr, params) = Self::next_step(&state)?;
        state.step = t;
        Ok(Step {
            t,
            lr,
            consts: params.prepare(t, lr),
            params,
        })
    }

    /// Checks, changing nothing, that [`Sparse::begin_step`] would succeed
    /// now: the schedule's learning rate at the next step is one the rule
    /// accepts and the step count is not exhausted. A caller that must
    /// change other state before the step begins (a dense optimizer's
    /// step) checks this first.
    pub fn check_next_step(&self) -> Result<()> {
        Self::next_step(&self.state()).map(|_| ())
    }

    /// The next step's number, learning rate and hyperparameters (with
    /// that rate), checked.
    fn next_step(state: &State<R>) -> Result<(u64, f32, R)> {
        let lr = state.learning_rate.at(state.params.lr(), state.step);
        let mut params = state.params.clone();
        params.set_lr(lr);
        params.validate().map_err(|e| {
            Error::InvalidArgument(format!(
                "the learning-rate schedule gives {lr} at step {}: {e}",
                state.step + 1
            ))
        })?;
        let t = state
            .step
            .checked_add(1)
            .filter(|&t| t <= MAX_STEPS)
            .ok_or_else(|| Error::InvalidArgument(format!("{}: step count exhausted", R::NAME)))?;
        Ok((t, lr, state.params.clone()))
    }

    /// The optimizer's state (its type, hyperparameters, step count and
    /// learning-rate schedule) as JSON.
    pub fn state_json(&self) -> String {
        serde_json::to_string_pretty(&*self.state()).expect("optimizer state serializes")
    }

    /// Replaces the state with one from [`Sparse::state_json`]; checked
    /// whole first (an error changes nothing): another optimizer's state is
    /// an [`Error::WrongOptimizer`] naming both optimizers; JSON that is
    /// not readable or names no optimizer (not an optimizer state), and
    /// invalid values, an [`Error::InvalidArgument`].
    pub fn restore_state_json(&self, json: &str) -> Result<()> {
        let unreadable = |e: serde_json::Error| {
            Error::InvalidArgument(format!("{} state is not readable: {e}", R::NAME))
        };
        let value: serde_json::Value = serde_json::from_str(json).map_err(unreadable)?;
        let optimizer = value
            .get("optimizer")
            .and_then(|o| o.as_str())
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "not an optimizer state ({} was asked to restore it): it names no optimizer",
                    R::NAME
                ))
            })?;
        if optimizer != R::NAME {
            return Err(Error::WrongOptimizer {
                holds: optimizer.to_string(),
                requested: R::NAME.to_string(),
            });
        }
        let saved: State<R> = serde_json::from_value(value).map_err(unreadable)?;
        saved.params.validate()?;
        saved.learning_rate.validate()?;
        if saved.step >= MAX_STEPS {
            return Err(Error::InvalidArgument(format!(
                "{} state: step {} is beyond {MAX_STEPS}",
                R::NAME,
                saved.step
            )));
        }
        *self.state() = saved;
        Ok(())
    }

    /// Writes [`Sparse::state_json`] to the file `path`, replacing it
    /// atomically (written beside it, flushed, renamed).
    pub fn save_state(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let io = |e: std::io::Error| Error::Io {
            path: path.display().to_string(),
            kind: e.kind(),
            message: e.to_string(),
        };
        let name = path.file_name().ok_or_else(|| {
            Error::InvalidArgument(format!("state path {} has no file name", path.display()))
        })?;
        // One staging name per save, so concurrent saves never share one.
        static SAVES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = SAVES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let staging = path.with_file_name(format!(
            ".{}.saving-{}-{n}",
            name.to_string_lossy(),
            std::process::id()
        ));
        let written = (|| {
            use std::io::Write;
            let mut file = std::fs::File::create(&staging)?;
            file.write_all(self.state_json().as_bytes())?;
            file.sync_all()?;
            std::fs::rename(&staging, path)?;
            match path.parent().filter(|p| !p.as_os_str().is_empty()) {
                Some(parent) => std::fs::File::open(parent)?.sync_all(),
                None => std::fs::File::open(".")?.sync_all(),
            }
        })();
        if written.is_err() {
            let _ = std::fs::remove_file(&staging);
        }
        written.map_err(io)
    }

    /// Restores the state saved by [`Sparse::save_state`] at `path` (as
    /// [`Sparse::restore_state_json`]).
    pub fn restore_state(&self, path: impl AsRef<Path>) -> Result<()> {
        let path = path.as_ref();
        let json = std::fs::read_to_string(path).map_err(|e| Error::Io {
            path: path.display().to_string(),
            kind: e.kind(),
            message: e.to_string(),
        })?;
        self.restore_state_json(&json)
    }
}

impl<R: Rule> SparseOptimizer for Sparse<R> {
    /// One step on one store. The input, the store's slots (their initial
    /// values, the room for missing ones) and the next step's learning rate
    /// are checked before anything changes, so a refused batch changes
    /// nothing, the step count and the slot list included.
    fn apply<S: EmbeddingStore>(&self, store: &S, keys: &[S::Key], grads: &[f32]) -> Result<()> {
        let params = self.params();
        check_step(&params, store, keys, grads)?;
        self.check_next_step()?;
        let slots = prepare_slots(&params, store)?;
        self.begin_step()?.update(store, keys, grads, &slots)
    }
}

/// Checks a batch for `store` before anything changes: the store is
/// trainable, `grads` holds `keys.len() * dim` values, all finite.
fn check_batch<S: EmbeddingStore>(store: &S, keys: &[S::Key], grads: &[f32]) -> Result<()> {
    check_trainable(store)?;
    let dim = store.dim();
    check_grads_len(keys.len(), dim, grads)?;
    // Blocks without an early exit, so the check vectorizes; the position
    // is searched for only once a block fails.
    const BLOCK: usize = 256;
    let all_finite = grads
        .chunks(BLOCK)
        .all(|block| block.iter().fold(true, |ok, g| ok & g.is_finite()));
    if all_finite {
        return Ok(());
    }
    match grads.iter().position(|g| !g.is_finite()) {
        Some(index) => Err(Error::NonFinite {
            what: "grads",
            index,
            value: grads[index],
        }),
        None => Ok(()),
    }
}

/// An error unless optimizers may train `store`.
fn check_trainable<S: EmbeddingStore>(store: &S) -> Result<()> {
    if store.trainable() {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "{:?} is not trainable",
            store.name()
        )))
    }
}

/// Checks, changing nothing, everything a step with the rule's `params`
/// checks before it changes `store`: the store is trainable, `grads` holds
/// `keys.len() * dim` finite values, every slot of the rule the store
/// already holds has the rule's initial value ([`Error::Mismatch`]
/// otherwise), and the store has room for the slots it lacks
/// ([`EmbeddingStore::check_create_slots`]: at most
/// [`MAX_SLOTS`](dynemb::MAX_SLOTS) columns). A model stepping several
/// stores at once checks them all with this before it begins the step.
pub fn check_step<R: Rule, S: EmbeddingStore>(
    params: &R,
    store: &S,
    keys: &[S::Key],
    grads: &[f32],
) -> Result<()> {
    check_batch(store, keys, grads)?;
    check_slots(params, store)
}

/// Checks, changing nothing, that the rule's slots can be had in `store`:
/// the existing ones have the rule's initial values, and the missing ones
/// fit (asked of the store only when one is missing, so a trained store
/// costs no query).
fn check_slots<R: Rule, S: EmbeddingStore>(params: &R, store: &S) -> Result<()> {
    let slots = params.slots();
    if existing_slots(params, store)?.len() < slots.len() {
        store.check_create_slots(&slots)?;
    }
    Ok(())
}

/// The ids of the rule's slots that `store` holds already, each checked
/// to have the rule's initial value, as the store holds it (rounded to its
/// slot dtype; [`Error::Mismatch`] otherwise).
fn existing_slots<R: Rule, S: EmbeddingStore>(params: &R, store: &S) -> Result<Vec<SlotId>> {
    let mut existing_ids = Vec::new();
    for (name, initial) in params.slots() {
        if let Ok(id) = store.slot_id(name) {
            let existing = store.slot_initial(id)?;
            // A store reports the initial value it holds: rounded to its
            // slot dtype, which may not be `initial` itself (0.2 in bf16),
            // so a differing one is asked of the store, which rounds.
            if existing != initial && store.check_create_slots(&[(name, initial)]).is_err() {
                return Err(Error::Mismatch {
                    name: format!("{}/{name}", store.name()),
                    existing: format!("slot with initial value {existing}"),
                    requested: format!("{}'s initial value {initial}", R::NAME),
                });
            }
            existing_ids.push(id);
        }
    }
    Ok(existing_ids)
}

/// The rule's slots in `store`: every existing one's initial value is
/// checked first ([`Error::Mismatch`], nothing created), then the missing
/// ones are created all or nothing ([`EmbeddingStore::create_slots`]: a
/// store without room for them all gets none). Only then is the store's
/// slot list locked for writing: a trained store's slots all exist.
fn prepare_slots<R: Rule, S: EmbeddingStore>(params: &R, store: &S) -> Result<Vec<SlotId>> {
    let slots = params.slots();
    let existing_ids = existing_slots(params, store)?;
    if existing_ids.len() == slots.len() {
        return Ok(existing_ids);
    }
    store.create_slots(&slots)
}

impl<R: Rule> Step<R> {
    /// The step number (1-based).
    pub fn t(&self) -> u64 {
        self.t
    }

    /// The learning rate of this step.
    pub fn lr(&self) -> f32 {
        self.lr
    }

    /// The hyperparameters this step was begun with.
    pub fn params(&self) -> &R {
        &self.params
    }

    /// Applies this step to one store (see the [module docs](self)).
    pub fn apply<S: EmbeddingStore>(
        &self,
        store: &S,
        keys: &[S::Key],
        grads: &[f32],
    ) -> Result<()> {
        check_batch(store, keys, grads)?;
        let slots = prepare_slots(&self.params, store)?;
        self.update(store, keys, grads, &slots)
    }

    /// Applies this step to a deduplicated batch (or a
    /// [`part`](DedupedRef::part) of one) whose keys' gradients were
    /// checked with [`check_step`] before [`Dedup::run`] summed them: the
    /// rows a batch's [`apply`](Step::apply) updates, so that the parts of
    /// one batch can be updated on several threads at once (they hold
    /// distinct keys). A summed gradient that overflows makes its row's
    /// result non-finite, which is refused as in `apply`: the other rows
    /// are updated and the error names the key's first position in the
    /// batch.
    pub fn apply_deduped<S: EmbeddingStore>(
        &self,
        store: &S,
        batch: &DedupedRef<'_, S::Key>,
    ) -> Result<()> {
        check_trainable(store)?;
        let slots = prepare_slots(&self.params, store)?;
        self.update_deduped(store, batch, &slots)
    }

    /// Sums repeated keys and updates every row (input already checked).
    fn update<S: EmbeddingStore>(
        &self,
        store: &S,
        keys: &[S::Key],
        grads: &[f32],
        slots: &[SlotId],
    ) -> Result<()> {
        Dedup::with_thread_local(|scratch| {
            let batch = scratch.run(keys, grads, store.dim())?;
            self.update_deduped(store, &batch, slots)
        })
    }

    /// Updates the rows of a deduplicated batch.
    fn update_deduped<S: EmbeddingStore>(
        &self,
        store: &S,
        batch: &DedupedRef<'_, S::Key>,
        slots: &[SlotId],
    ) -> Result<()> {
        let dim = store.dim();
        let grads = batch.grads;
        if grads.len() != batch.keys.len() * dim {
            return Err(Error::LengthMismatch {
                what: "grads",
                expected: batch.keys.len() * dim,
                actual: grads.len(),
            });
        }
        store
            .update_rows(&batch.keys, slots, |i, value, slot_rows| {
                R::update(
                    &self.consts,
                    &grads[i * dim..(i + 1) * dim],
                    value,
                    slot_rows,
                )
            })
            .map_err(|e| match e {
                // Name the key by its position in the caller's batch.
                Error::NonFinite { index, value, .. } => Error::NonFinite {
                    what: "optimizer step result",
                    index: batch_position(batch, index),
                    value,
                },
                Error::OutOfRange {
                    index,
                    value,
                    dtype,
                    ..
                } => Error::OutOfRange {
                    what: "optimizer step result",
                    index: batch_position(batch, index),
                    value,
                    dtype,
                },
                e => e,
            })
    }
}

/// The caller's batch position of distinct key `index` of `batch`; an index
/// past the batch's keys (a custom store's error) is kept as it is.
fn batch_position<K: Clone>(batch: &DedupedRef<'_, K>, index: usize) -> usize {
    if index < batch.keys.len() {
        batch.first(index)
    } else {
        index
    }
}
