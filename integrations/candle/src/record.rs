//! The per-batch training record: what a layer's training forward leaves
//! for the optimizer step.
//!
//! A training forward reads a batch's distinct rows into one fresh
//! variable `[n_unique, dim]` (never one variable for a whole table:
//! candle's `index_select` backward allocates a gradient as large as its
//! source) and records the keys with it ([`RecordedBatch`]), with the keys
//! the read left without a row (admission had not admitted them). After
//! `loss.backward()`, the variable's gradient in the `GradStore` is the
//! gradient of each distinct key's row, summed over the batch's positions;
//! a step applies it but for the keys without a row, whose gradient is
//! dropped.
//!
//! A [`Recorder`] holds a layer's store and the batches recorded since the
//! last step, in order: a layer called several times before a step (the
//! same ids feature in two places) records several batches, and the step
//! applies them all. Batches leave the record when a step has begun on
//! them ([`SparseStep`](crate::SparseStep)), or by
//! [`Recorder::discard`] (after an evaluation run in training mode, whose
//! loss is never backpropagated). A failed forward records nothing, and a
//! step that fails its checks keeps the batches.
//!
//! The record is the layer's, for one training loop: layers trained from
//! several threads at once each need their own layer (sharing the store's
//! `Arc`), since a step gathers every batch its layers hold.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use dynemb::EmbeddingStore;
use dynemb_optim::Rule;

use crate::max_norm::check_max_norm;
use crate::regularizer::Regularizer;
use crate::reserve_ahead::ReserveAhead;
use crate::rows::{train_rows, TrainRows};
use crate::step::SparseGrads;
use crate::{Error, Result};

/// One training batch of one store: its distinct keys, the variable
/// `[keys.len(), dim]` holding their rows as the forward read them, and
/// which keys had no row after the read (not admitted yet).
#[derive(Debug, Clone)]
pub struct RecordedBatch<K> {
    keys: Arc<Vec<K>>,
    rows: Var,
    /// Per key, whether it had a row after the read; `None`: every key.
    stored: Option<Arc<Vec<bool>>>,
}

impl<K> RecordedBatch<K> {
    /// The batch's distinct keys, in the order of the variable's rows.
    pub fn keys(&self) -> &Arc<Vec<K>> {
        &self.keys
    }

    /// The variable holding the keys' rows; its gradient is what a step
    /// applies, but for the rows of keys not stored.
    pub fn rows(&self) -> &Var {
        &self.rows
    }

    /// Per key, whether it had a row in the store after the read (false
    /// for a key admission had not admitted: the step drops its gradient);
    /// `None` when every key had one.
    pub fn stored(&self) -> Option<&[bool]> {
        self.stored.as_deref().map(Vec::as_slice)
    }
}

/// A layer's store and its training batches since the last step; see the
/// [module docs](self).
pub struct Recorder<S: EmbeddingStore> {
    store: Arc<S>,
    batches: Mutex<Vec<RecordedBatch<S::Key>>>,
    /// Background `reserve_rows` requests, when on.
    pub(crate) reserve_ahead: Option<ReserveAhead>,
}

impl<S: EmbeddingStore> std::fmt::Debug for Recorder<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorder")
            .field("store", &self.store.name())
            .field("batches", &self.batches().len())
            .finish()
    }
}

impl<S: EmbeddingStore> Recorder<S> {
    /// A recorder for `store`, with no batches.
    pub fn new(store: Arc<S>) -> Self {
        Recorder {
            store,
            batches: Mutex::new(Vec::new()),
            reserve_ahead: Some(ReserveAhead::default()),
        }
    }

    /// A recorder for a layer over `store` with these settings, checked:
    /// an [`Error::InvalidInput`] for a store of dim 0, a `max_norm` that
    /// is not finite and above 0, or a regularizer weight that is not
    /// finite and non-negative.
    pub fn for_layer(
        store: Arc<S>,
        max_norm: Option<f32>,
        regularizer: Option<&Regularizer>,
    ) -> Result<Self> {
        if store.dim() == 0 {
            return Err(Error::invalid(format!(
                "embedding store {:?} has dim 0",
                store.name()
            )));
        }
        if let Some(max_norm) = max_norm {
            check_max_norm(max_norm)?;
        }
        if let Some(regularizer) = regularizer {
            regularizer.validate()?;
        }
        Ok(Self::new(store))
    }

    /// Whether [`Recorder::read`] asks the store to back the next batch's
    /// rows with memory ahead, on a low-priority thread (on by default; see
    /// [`EmbeddingConfig::reserve_rows_ahead`](crate::EmbeddingConfig::reserve_rows_ahead)).
    pub fn reserve_rows_ahead(mut self, on: bool) -> Self {
        self.reserve_ahead = on.then(ReserveAhead::default);
        self
    }

    /// The store the batches read.
    pub fn store(&self) -> &Arc<S> {
        &self.store
    }

    fn batches(&self) -> MutexGuard<'_, Vec<RecordedBatch<S::Key>>> {
        self.batches.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records a batch: its distinct `keys` and the rows read for them by
    /// [`Recorder::read`]. An empty batch is not recorded (there is nothing
    /// to train); rows of another shape than `[keys.len(), dim]` are an
    /// [`Error::InvalidInput`].
    pub fn record(&self, keys: Vec<S::Key>, rows: TrainRows) -> Result<()> {
        let (rows, stored) = rows.into_parts();
        let dim = self.store.dim();
        if rows.dims() != [keys.len(), dim] {
            return Err(Error::invalid(format!(
                "recorded rows of {:?}: expected shape [{}, {dim}], got {:?}",
                self.store.name(),
                keys.len(),
                rows.dims()
            )));
        }
        if !keys.is_empty() {
            self.batches().push(RecordedBatch {
                keys: Arc::new(keys),
                rows,
                stored,
            });
        }
        Ok(())
    }

    /// How many batches are recorded.
    pub fn len(&self) -> usize {
        self.batches().len()
    }

    /// Whether no batch is recorded.
    pub fn is_empty(&self) -> bool {
        self.batches().is_empty()
    }

    /// The recorded batches (cheap clones: shared keys and variables), in
    /// the order they were recorded.
    pub fn recorded(&self) -> Vec<RecordedBatch<S::Key>> {
        self.batches().clone()
    }

    /// The variables of the recorded batches, in the order they were
    /// recorded (to read or replace their gradients in a `GradStore`).
    pub fn vars(&self) -> Vec<Var> {
        self.batches()
            .iter()
            .map(|batch| batch.rows.clone())
            .collect()
    }

    /// Drops every recorded batch.
    pub fn discard(&self) {
        self.batches().clear();
    }

    /// Drops the recorded batches whose gradients `gathered` holds.
    pub fn discard_gathered<R: Rule>(&self, gathered: &SparseGrads<R>) {
        self.batches().retain(|batch| !gathered.holds(&batch.rows));
    }

    /// The sum of `regularizer`'s penalty on each recorded batch's rows (a
    /// scalar on `device`, 0 with no regularizer or no batch); see [`crate::regularizer`].
    pub fn regularization_loss(
        &self,
        regularizer: Option<&Regularizer>,
        device: &Device,
    ) -> Result<Tensor> {
        let mut loss = Tensor::zeros((), DType::F32, device)?;
        let Some(regularizer) = regularizer else {
            return Ok(loss);
        };
        for batch in self.batches().iter() {
            loss = (loss + regularizer.loss(batch.rows.as_tensor())?)?;
        }
        Ok(loss)
    }
}

impl<S: EmbeddingStore + 'static> Recorder<S> {
    /// Reads the rows of the distinct `keys` for training (inserting
    /// missing keys, unless admission has not admitted them yet) into a
    /// fresh variable `[keys.len(), dim]` on `device` ([`train_rows`]).
    /// The rows are not recorded yet: call [`Recorder::record`] with them
    /// once the forward has succeeded. Then, unless turned off
    /// ([`Recorder::reserve_rows_ahead`]), asks the store on a low-priority
    /// thread of its own to back the rows of as many new keys as `keys`
    /// holds with memory, ready for the next batch
    /// ([`EmbeddingStore::reserve_rows`]; at most one such request of a
    /// recorder runs at once, and none for a store that is not
    /// [`cpu_bound`](EmbeddingStore::cpu_bound)).
    pub fn read(&self, keys: &[S::Key], device: &Device) -> Result<TrainRows> {
        let rows = train_rows(&*self.store, keys, device)?;
        if let Some(reserve_ahead) = &self.reserve_ahead {
            reserve_ahead.request(&self.store, keys.len());
        }
        Ok(rows)
    }

    /// Adds each recorded batch's keys and gradient to `into`, but for the
    /// keys that had no row after the batch's read (not admitted yet):
    /// their gradient is dropped, so a key admitted by a later read before
    /// the step is trained by that read alone. An
    /// [`Error::InvalidInput`] naming the batch if `grads` has no gradient
    /// for its variable (its rows did not reach the loss, or `grads` comes
    /// from another loss) or one of another shape. Leaves the batches
    /// recorded.
    pub fn gather_grads<R: Rule>(
        &self,
        grads: &GradStore,
        into: &mut SparseGrads<R>,
    ) -> Result<()> {
        let dim = self.store.dim();
        for (i, batch) in self.batches().iter().enumerate() {
            let grad = grads.get(batch.rows.as_tensor()).ok_or_else(|| {
                Error::invalid(format!(
                    "no gradient for batch {i} of embedding {:?}: its output did not reach the \
                     loss, or the GradStore is another loss's (discard the batches of a forward \
                     that is not trained)",
                    self.store.name()
                ))
            })?;
            if grad.dims() != [batch.keys.len(), dim] {
                return Err(Error::invalid(format!(
                    "gradient of batch {i} of embedding {:?}: expected shape [{}, {dim}], got {:?}",
                    self.store.name(),
                    batch.keys.len(),
                    grad.dims()
                )));
            }
            match &batch.stored {
                None => into.push(
                    &self.store,
                    Arc::clone(&batch.keys),
                    &batch.rows,
                    grad.clone(),
                )?,
                Some(stored) => {
                    let (keys, grad) = stored_only(&batch.keys, stored, grad)?;
                    into.push(&self.store, Arc::new(keys), &batch.rows, grad)?;
                }
            }
        }
        Ok(())
    }
}

/// The keys that had a row (`stored[i]`) and their rows of `grad`.
fn stored_only<K: Clone>(keys: &[K], stored: &[bool], grad: &Tensor) -> Result<(Vec<K>, Tensor)> {
    let kept: Vec<u32> = (0u32..)
        .zip(stored)
        .filter(|&(_, &has_row)| has_row)
        .map(|(i, _)| i)
        .collect();
    let kept_keys = kept.iter().map(|&i| keys[i as usize].clone()).collect();
    let len = kept.len();
    let at = Tensor::from_vec(kept, len, grad.device())?;
    Ok((kept_keys, grad.index_select(&at, 0)?))
}
