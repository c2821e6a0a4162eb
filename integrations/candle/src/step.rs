//! One sparse optimizer step over every embedding a model read, after
//! `loss.backward()`.
//!
//! A layer whose training forwards record batches implements
//! [`SparseModule`]: it adds each recorded batch's distinct keys and the
//! gradient of their rows (read from the `GradStore`) to a
//! [`SparseGrads`], which groups them by store. [`SparseStep::step`] then:
//! 1. gathers every module's gradients: a recorded batch without a
//!    gradient in the `GradStore` is an error, and nothing has changed;
//! 2. checks every store before any changes ([`check_step`], the checks
//!    [`Step::apply`] makes, made for all stores first): trainable,
//!    gradients finite, the optimizer's slots compatible with the ones the
//!    store holds, and room in the store for the slots it lacks (slots are
//!    then created all or nothing, [`EmbeddingStore::create_slots`]);
//! 3. begins **one** optimizer step ([`Sparse::begin_step`]: the step count
//!    advances once, whatever the number of stores and their key types;
//!    a learning rate the schedule cannot give is an error here, before
//!    any store changes) and applies it to each store once, with the keys
//!    and gradients of every batch that read it concatenated
//!    ([`Step::apply`] sums repeated keys, so two layers sharing a store
//!    train it as one gradient would; a large batch is split over candle's
//!    threads by [`parallel::apply`], which sums them first);
//! 4. drops the modules' batches it gathered (a batch recorded meanwhile,
//!    by another thread's forward, stays for the next step).
//!
//! An error in 1, 2 or the beginning of 3 leaves the stores (rows, slots,
//! scores), the step count and the recorded batches as they were.
//! [`SparseStep::backward_step`] checks one thing more, first: the loss
//! itself must be finite ([`Error::NonFiniteLoss`]), since a NaN or an
//! infinity that stays on the dense side of the graph leaves every
//! embedding gradient finite; and it makes every check (the next step's
//! learning rate included) before the dense optimizer steps. On any of
//! its errors its gradients, which live only in the call, are gone, so it
//! drops the batches they belong to (no later step could train them) and
//! the next batch trains as usual.
//!
//! Once the step has begun, the batches are dropped whatever happens: a
//! store failing its update does not stop the other stores' updates, and
//! the first error is returned; applying the batches again would apply
//! part of the step twice. The checks cannot see everything first, so a
//! step may still fail part-way: a row whose update overflows (that row is
//! kept, the others updated), a remote store's node dying mid-write (its
//! rows may or may not have been written, see `dynemb::Error::Backend`),
//! another process filling a store's slot columns between the check and
//! the creation, or an error of the dense optimizer itself (candle-nn's:
//! the sparse step is then not taken).
//!
//! Stores are the same table when they are of one type and have the same
//! [`EmbeddingStore::store_id`]: layers over clones of one `Variable` (or
//! over the same name fetched twice from a `Registry`) train it with their
//! summed gradient, one optimizer update per step.
//!
//! A layer's recorded batches belong to one training loop: two loops
//! sharing a layer would step each other's batches (or fail on a batch
//! whose gradient the other loop's `GradStore` lacks). Concurrent trainers
//! take one layer each over the shared table. A training forward whose
//! output does not reach the loss leaves a batch no `GradStore` has a
//! gradient for: the next step is an error until the layer's
//! `discard_batches` drops it (gradient accumulation over several
//! backward passes is not supported: step after each).
//!
//! Dense parameters keep candle-nn's optimizers;
//! [`SparseStep::backward_step`] runs one of them and the sparse step from
//! one loss.

use std::any::{Any, TypeId};
use std::collections::HashSet;
use std::sync::Arc;

use candle_core::backprop::GradStore;
use candle_core::{Tensor, TensorId, Var};
use dynemb::EmbeddingStore;
use dynemb_optim::{check_step, Rule, Sparse, Step};

use crate::parallel;
use crate::rows::with_f32_values;
use crate::{Error, Result};

/// A layer that records training batches for a sparse optimizer step with
/// the rule `R` (implemented for every rule by the crate's layers); see
/// the [module docs](self).
pub trait SparseModule<R: Rule> {
    /// Adds every batch recorded since the last step to `into` (keys and
    /// the gradient of their rows in `grads`); an error if `grads` lacks
    /// one. Leaves the batches recorded.
    fn gather_grads(&self, grads: &GradStore, into: &mut SparseGrads<R>) -> Result<()>;

    /// Drops the recorded batches whose gradients `gathered` holds (a step
    /// calls it once it has begun); batches recorded since the gathering
    /// stay for the next step.
    fn discard_gathered(&self, gathered: &SparseGrads<R>);
}

/// One store's share of a step: the batches' keys and gradient tensors.
struct StoreGrads<S: EmbeddingStore> {
    store: Arc<S>,
    parts: Vec<(Arc<Vec<S::Key>>, Tensor)>,
}

/// A store's gradients with its type erased, for one rule.
trait PendingStore<R: Rule> {
    /// The store's identity: its type and [`EmbeddingStore::store_id`].
    fn identity(&self) -> (TypeId, u64);
    fn as_any_mut(&mut self) -> &mut dyn Any;
    fn rows(&self) -> usize;
    fn check(&self, params: &R) -> Result<()>;
    fn apply(&self, step: &Step<R>) -> Result<()>;
}

impl<S: EmbeddingStore + 'static, R: Rule> PendingStore<R> for StoreGrads<S> {
    fn identity(&self) -> (TypeId, u64) {
        (TypeId::of::<S>(), self.store.store_id())
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn rows(&self) -> usize {
        self.parts.iter().map(|(keys, _)| keys.len()).sum()
    }

    fn check(&self, params: &R) -> Result<()> {
        for (keys, grad) in &self.parts {
            with_f32_values(grad, |grads| {
                Ok(check_step(params, &*self.store, keys, grads)?)
            })?;
        }
        Ok(())
    }

    fn apply(&self, step: &Step<R>) -> Result<()> {
        let store = &*self.store;
        if let [(keys, grad)] = self.parts.as_slice() {
            return with_f32_values(grad, |grads| Ok(parallel::apply(step, store, keys, grads)?));
        }
        let rows = PendingStore::<R>::rows(self);
        let mut keys = Vec::with_capacity(rows);
        let mut grads = Vec::with_capacity(rows * store.dim());
        for (part_keys, grad) in &self.parts {
            keys.extend_from_slice(part_keys);
            with_f32_values(grad, |values| {
                grads.extend_from_slice(values);
                Ok(())
            })?;
        }
        Ok(parallel::apply(step, store, &keys, &grads)?)
    }
}

/// The gradients of one step, grouped by store; see the
/// [module docs](self).
pub struct SparseGrads<R: Rule> {
    stores: Vec<Box<dyn PendingStore<R>>>,
    /// The recorded variables whose gradients were gathered.
    vars: HashSet<TensorId>,
}

impl<R: Rule> Default for SparseGrads<R> {
    fn default() -> Self {
        SparseGrads {
            stores: Vec::new(),
            vars: HashSet::new(),
        }
    }
}

impl<R: Rule> std::fmt::Debug for SparseGrads<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SparseGrads")
            .field("stores", &self.stores())
            .field("rows", &self.rows())
            .finish()
    }
}

impl<R: Rule> SparseGrads<R> {
    /// No gradients.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds the gradient `grad` (`[keys.len(), dim]`) of `rows`, the
    /// variable a layer read the rows of `keys` in `store` into, to be
    /// applied with the other batches of the same table (the same
    /// [`EmbeddingStore::store_id`]: clones of one `Variable` are one
    /// table). A gradient of another shape is an [`Error::InvalidInput`].
    pub fn push<S: EmbeddingStore + 'static>(
        &mut self,
        store: &Arc<S>,
        keys: Arc<Vec<S::Key>>,
        rows: &Var,
        grad: Tensor,
    ) -> Result<()> {
        let dim = store.dim();
        if grad.dims() != [keys.len(), dim] {
            return Err(Error::invalid(format!(
                "gradient of {} rows of {:?}: expected shape [{}, {dim}], got {:?}",
                keys.len(),
                store.name(),
                keys.len(),
                grad.dims()
            )));
        }
        self.vars.insert(rows.id());
        let identity = (TypeId::of::<S>(), store.store_id());
        for pending in &mut self.stores {
            if pending.identity() == identity {
                if let Some(same) = pending.as_any_mut().downcast_mut::<StoreGrads<S>>() {
                    same.parts.push((keys, grad));
                    return Ok(());
                }
            }
        }
        self.stores.push(Box::new(StoreGrads {
            store: Arc::clone(store),
            parts: vec![(keys, grad)],
        }));
        Ok(())
    }

    /// Whether the gradient of `rows` was gathered.
    pub fn holds(&self, rows: &Var) -> bool {
        self.vars.contains(&rows.id())
    }

    /// How many stores have gradients.
    pub fn stores(&self) -> usize {
        self.stores.len()
    }

    /// How many gradient rows, over all stores (repeated keys counted).
    pub fn rows(&self) -> usize {
        self.stores.iter().map(|s| s.rows()).sum()
    }

    /// Whether there are no gradients.
    pub fn is_empty(&self) -> bool {
        self.stores.is_empty()
    }

    /// Checks every store for a step with hyperparameters `params`, before
    /// anything changes: trainable, every gradient finite, the rule's slots
    /// compatible with the store's, room in the store for the ones it
    /// lacks.
    pub fn check(&self, params: &R) -> Result<()> {
        self.stores.iter().try_for_each(|s| s.check(params))
    }

    /// Applies `step` to every store, once each. Every store is attempted;
    /// the first error is returned.
    pub fn apply(&self, step: &Step<R>) -> Result<()> {
        let mut first_error = None;
        for pending in &self.stores {
            if let Err(e) = pending.apply(step) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

/// A sparse optimizer stepping layers' recorded batches; see the
/// [module docs](self).
#[derive(Debug)]
pub struct SparseStep<R: Rule> {
    optimizer: Sparse<R>,
}

impl<R: Rule> From<Sparse<R>> for SparseStep<R> {
    fn from(optimizer: Sparse<R>) -> Self {
        SparseStep::new(optimizer)
    }
}

impl<R: Rule> SparseStep<R> {
    /// Steps with `optimizer`.
    pub fn new(optimizer: Sparse<R>) -> Self {
        SparseStep { optimizer }
    }

    /// The optimizer (its step count, learning rate, state).
    pub fn optimizer(&self) -> &Sparse<R> {
        &self.optimizer
    }

    /// The optimizer, by value.
    pub fn into_inner(self) -> Sparse<R> {
        self.optimizer
    }

    /// One optimizer step over the batches `modules` recorded, with their
    /// gradients in `grads` (from `loss.backward()`); see the
    /// [module docs](self). A module listed twice is stepped once. The step
    /// count advances even when no module recorded a batch (as Keras counts
    /// an `apply_gradients` whatever it updates).
    pub fn step(&self, grads: &GradStore, modules: &[&dyn SparseModule<R>]) -> Result<()> {
        let modules = distinct(modules);
        let gathered = self.gather(grads, &modules)?;
        self.apply(&gathered, &modules)
    }

    /// `loss.backward()`, then one step of the dense optimizer `dense` (a
    /// candle-nn optimizer over the model's other variables) and one sparse
    /// step over `modules`, from the same gradients. A loss with a NaN or
    /// infinite value is refused ([`Error::NonFiniteLoss`]) before
    /// anything changes, even when the bad value never reaches an
    /// embedding's gradient: a caller may skip the batch and go on.
    /// Everything the sparse step checks (the gradients, the stores and
    /// their room for slots, the learning rate of the next step) is checked
    /// before the dense step, so an error there changes no table, no slot,
    /// no step count and no dense variable. An error of the dense optimizer
    /// itself is candle-nn's: the sparse step is not taken then. What no
    /// check can see first (a remote store's node dying mid-write) may
    /// still stop the step part-way (see the [module docs](self)).
    ///
    /// The gradients live only in this call, so on any error after the
    /// backward pass (a non-finite gradient from a bad batch, say) the
    /// batches they belong to can never be stepped: they are dropped, and
    /// the next batch trains as usual. A batch the loss did not reach
    /// (no gradient here) stays recorded, and the error names it (see the
    /// [module docs](self)).
    pub fn backward_step<O: candle_nn::Optimizer>(
        &self,
        loss: &Tensor,
        dense: &mut O,
        modules: &[&dyn SparseModule<R>],
    ) -> Result<()> {
        let grads = loss.backward()?;
        let modules = distinct(modules);
        let stepped = check_loss(loss)
            .and_then(|()| self.gather(&grads, &modules))
            .and_then(|gathered| {
                self.optimizer.check_next_step()?;
                dense.step(&grads)?;
                Ok(gathered)
            });
        match stepped {
            Ok(gathered) => self.apply(&gathered, &modules),
            Err(e) => {
                let mut dead = SparseGrads::new();
                dead.vars.extend(grads.get_ids().copied());
                for module in &modules {
                    module.discard_gathered(&dead);
                }
                Err(e)
            }
        }
    }

    /// Gathers and checks every module's gradients.
    fn gather(
        &self,
        grads: &GradStore,
        modules: &[&dyn SparseModule<R>],
    ) -> Result<SparseGrads<R>> {
        let mut gathered = SparseGrads::new();
        for module in modules {
            module.gather_grads(grads, &mut gathered)?;
        }
        gathered.check(&self.optimizer.params())?;
        Ok(gathered)
    }

    /// Begins the step, applies it, and drops the batches it gathered.
    fn apply(&self, gathered: &SparseGrads<R>, modules: &[&dyn SparseModule<R>]) -> Result<()> {
        let step = self.optimizer.begin_step()?;
        let applied = gathered.apply(&step);
        for module in modules {
            module.discard_gathered(gathered);
        }
        applied
    }
}

/// An [`Error::NonFiniteLoss`] if any value of `loss` is NaN or infinite.
fn check_loss(loss: &Tensor) -> Result<()> {
    let values = loss
        .flatten_all()?
        .to_dtype(candle_core::DType::F32)?
        .to_vec1::<f32>()?;
    match values.into_iter().find(|v| !v.is_finite()) {
        Some(loss) => Err(Error::NonFiniteLoss { loss }),
        None => Ok(()),
    }
}

/// `modules` without repeats (the same module object listed twice).
fn distinct<'a, R: Rule>(modules: &[&'a dyn SparseModule<R>]) -> Vec<&'a dyn SparseModule<R>> {
    let mut seen: Vec<&'a dyn SparseModule<R>> = Vec::with_capacity(modules.len());
    for &module in modules {
        if !seen.iter().any(|s| std::ptr::addr_eq(*s, module)) {
            seen.push(module);
        }
    }
    seen
}
