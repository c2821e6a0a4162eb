//! [`Embedding`]: candle-nn's `Embedding` layer over a dynamic table (an
//! [`EmbeddingStore`]), TFRA's `dynamic_embedding.keras.layers.Embedding`
//! (with `with_unique`): ids of any shape in, `[..ids' shape, dim]` out.
//!
//! Modes ([`Embedding::forward`]`(ids, train)`, and candle's [`ModuleT`]
//! convention `forward_t(ids, train)`, as for candle-nn's `Dropout` and
//! `BatchNorm`, whose training and evaluation differ; candle's blanket
//! `ModuleT` for every `Module` rules out also implementing `Module`,
//! whose one-argument `forward` could not tell the two apart):
//! - **training** ([`Embedding::forward_train`]): the batch's ids are
//!   deduplicated, the distinct keys' rows are read with
//!   `lookup_or_insert_with_exists` (missing keys are inserted with the
//!   initializer's row, unless admission has not admitted them yet) into
//!   one fresh variable `[n_unique, dim]`, and gathered back to
//!   the ids' positions ([`gather_rows`]: `index_select`'s values, with a
//!   backward split over threads). The keys and the variable are
//!   recorded ([`crate::record`]) for [`SparseStep`](crate::SparseStep),
//!   which applies the variable's gradient after `loss.backward()`, but
//!   for the rows of keys the read left without a row (not admitted: their
//!   gradient is dropped); each call records one batch. After the read, the store is asked, on a
//!   low-priority thread of its own, to back the rows of as many new keys
//!   as the batch had distinct keys with memory
//!   (`EmbeddingStore::reserve_rows`: for a `Variable`, the kernel zeroes
//!   fresh row pages while the model computes, not in the next batch's
//!   read; `reserve_rows_ahead: false` turns it off). This is why the
//!   layers need a `'static` store, as training steps do anyway.
//! - **inference** ([`Embedding::forward_inference`]): the same, read with
//!   `lookup` into a plain tensor: no variable, no insert, nothing
//!   recorded. A missing id reads the initializer's row, the very values a
//!   training forward would insert, so both modes give the same output.
//!
//! A store that is not trainable is read in inference mode by both.
//!
//! `max_norm` clips each row to that L2 norm after the read, differentiably
//! with candle ops ([`crate::max_norm`]: TF's `clip_by_norm` formula,
//! applied once, in both modes; the lookup functions apply TFRA's TRAIN-mode
//! double clip in exact f32 order, so the two can differ in the last bits,
//! and on a row whose squares overflow `f32`, which the lookup functions
//! zero as TensorFlow does and the layer clips; TFRA's INFERENCE mode
//! ignores `max_norm` where this layer does not).
//! The layer's optional [`Regularizer`] penalizes the rows of the recorded
//! batches ([`Embedding::regularization_loss`], to add to the loss). Output
//! is `f32` on the configured device. The layer is `Send + Sync` and its
//! inference forward can run on many threads at once. Its training
//! forwards record batches that belong to one training loop: a step takes
//! every batch recorded so far, so two loops (threads) sharing one layer
//! would step each other's batches; concurrent trainers take one layer
//! each over the shared table (see [`crate::step`]). Every training
//! forward keeps its `Var` until a step (or
//! [`Embedding::discard_batches`]) drops it: a layer left out of the
//! step's modules holds its batches, and their memory, until then.

use std::sync::Arc;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, ModuleT, Tensor, Var};
use dynemb::EmbeddingStore;
use dynemb_optim::Rule;

use crate::gather::gather_rows;
use crate::max_norm::clip_tensor_rows;
use crate::record::Recorder;
use crate::regularizer::Regularizer;
use crate::rows::{check_room, read_rows};
use crate::step::{SparseGrads, SparseModule};
use crate::unique::Dedup;
use crate::{Error, IdKey, Ids, Result};

/// The settings of an [`Embedding`]. `Default`: on the CPU, no
/// `max_norm`, no regularizer, rows reserved ahead.
#[derive(Debug, Clone)]
pub struct EmbeddingConfig {
    /// Where the output (and the trained rows' variables) live.
    pub device: Device,
    /// Clip each looked-up row to this L2 norm (finite, above 0).
    pub max_norm: Option<f32>,
    /// Penalty on the rows training batches read; see
    /// [`Embedding::regularization_loss`].
    pub regularizer: Option<Regularizer>,
    /// After each training read, back the rows of as many new keys as the
    /// batch had distinct keys with memory, on a low-priority thread
    /// ([`crate::record`]; default `true`). Turn it off to keep every
    /// page the table touches to the inserts themselves, or to start no
    /// thread per training forward.
    pub reserve_rows_ahead: bool,
}

impl Default for EmbeddingConfig {
    fn default() -> Self {
        EmbeddingConfig {
            device: Device::Cpu,
            max_norm: None,
            regularizer: None,
            reserve_rows_ahead: true,
        }
    }
}

/// An embedding layer over a dynamic table; see the [module docs](self).
pub struct Embedding<S: EmbeddingStore> {
    recorder: Recorder<S>,
    config: EmbeddingConfig,
}

impl<S: EmbeddingStore> std::fmt::Debug for Embedding<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedding")
            .field("store", &self.recorder.store().name())
            .field("dim", &self.recorder.store().dim())
            .field("config", &self.config)
            .field("recorded_batches", &self.recorder.len())
            .finish()
    }
}

impl<S: EmbeddingStore + 'static> Embedding<S>
where
    S::Key: IdKey,
{
    /// A layer reading `store` (share one store between layers by cloning
    /// its `Arc`). An [`Error::InvalidInput`]
    /// for a store of dim 0, a `max_norm` that is not finite and above 0 or
    /// a regularizer weight that is not finite and non-negative.
    pub fn new(store: Arc<S>, config: EmbeddingConfig) -> Result<Self> {
        Ok(Embedding {
            recorder: Recorder::for_layer(store, config.max_norm, config.regularizer.as_ref())?
                .reserve_rows_ahead(config.reserve_rows_ahead),
            config,
        })
    }

    /// The table.
    pub fn store(&self) -> &Arc<S> {
        self.recorder.store()
    }

    /// Values per row (candle-nn's `hidden_size`).
    pub fn dim(&self) -> usize {
        self.recorder.store().dim()
    }

    /// The settings.
    pub fn config(&self) -> &EmbeddingConfig {
        &self.config
    }

    /// The forward of ids in an `i64`, `u32` or `i32` tensor of any rank
    /// (`train` picks the mode): an `f32` tensor of shape
    /// `ids.shape() + [dim]`; see the [module docs](self).
    pub fn forward(&self, ids: &Tensor, train: bool) -> Result<Tensor> {
        self.forward_ids(&Ids::from_tensor(ids)?, train)
    }

    /// The training forward of ids in an `i64`, `u32` or `i32` tensor of
    /// any rank; see the [module docs](self).
    pub fn forward_train(&self, ids: &Tensor) -> Result<Tensor> {
        self.forward_ids(&Ids::from_tensor(ids)?, true)
    }

    /// The inference forward of ids in an `i64`, `u32` or `i32` tensor of
    /// any rank; see the [module docs](self).
    pub fn forward_inference(&self, ids: &Tensor) -> Result<Tensor> {
        self.forward_ids(&Ids::from_tensor(ids)?, false)
    }

    /// The forward of ids `[batch, ..]` (rank 1 or more) in an `i64`, `u32`
    /// or `i32` tensor (`train` picks the mode) with each sample's rows
    /// side by side: an `f32` tensor `[batch, (ids per sample) * dim]`, the
    /// input a dense tower reads (rank-1 ids give `[batch, dim]`). The same
    /// values and gradients as `forward(ids, train)?.flatten_from(1)`,
    /// without that reshape's graph node, whose backward costs a zeroed
    /// gradient and an add as large as the output. Scalar ids are an
    /// [`Error::InvalidInput`].
    pub fn forward_concat(&self, ids: &Tensor, train: bool) -> Result<Tensor> {
        let ids = Ids::from_tensor(ids)?;
        let [batch, rest @ ..] = ids.shape() else {
            return Err(Error::invalid(
                "forward_concat needs ids of rank 1 or more, not a scalar",
            ));
        };
        let width = if rest.contains(&0) {
            Some(0)
        } else {
            rest.iter()
                .try_fold(self.dim(), |width, &n| width.checked_mul(n))
        };
        let width = width.ok_or_else(|| {
            Error::invalid(format!("ids of shape {:?} overflow a row", ids.shape()))
        })?;
        let shape = vec![*batch, width];
        self.forward_shaped(&ids, train, shape)
    }

    /// The forward of keys in a shape (`train` picks the mode): an `f32`
    /// tensor of shape `ids.shape() + [dim]`.
    pub fn forward_ids(&self, ids: &Ids<S::Key>, train: bool) -> Result<Tensor> {
        self.forward_shaped(ids, train, ids.output_shape(self.dim()))
    }

    /// The forward of `ids`, its rows laid out in `shape` (of
    /// `ids.len() * dim` elements).
    fn forward_shaped(&self, ids: &Ids<S::Key>, train: bool, shape: Vec<usize>) -> Result<Tensor> {
        let device = &self.config.device;
        if ids.is_empty() {
            return Ok(Tensor::zeros(shape, DType::F32, device)?);
        }
        let unique = Dedup::with_thread_local(|dedup| dedup.unique(ids.keys()))?;
        let (keys, inverse) = unique.into_parts();
        let store = self.recorder.store();
        if !(train && store.trainable()) {
            let rows = read_rows(&**store, &keys, device)?;
            return self.gather(&rows, inverse, shape);
        }
        check_room(inverse.len(), self.dim())?;
        let rows = self.recorder.read(&keys, device)?;
        let output = self.gather(rows.as_tensor(), inverse, shape)?;
        self.recorder.record(keys, rows)?;
        Ok(output)
    }

    /// Clips the distinct rows (with `max_norm`) and gathers them to the
    /// ids' positions in the output's shape ([`gather_rows`]).
    fn gather(&self, rows: &Tensor, inverse: Vec<u32>, shape: Vec<usize>) -> Result<Tensor> {
        match self.config.max_norm {
            Some(max_norm) => gather_rows(&clip_tensor_rows(rows, max_norm)?, inverse, shape),
            None => gather_rows(rows, inverse, shape),
        }
    }

    /// The regularizer's penalty on the rows of the batches recorded since
    /// the last step (each batch's distinct rows once; see
    /// [`crate::regularizer`]), a scalar to add to the loss; 0 without a
    /// regularizer or a recorded batch.
    pub fn regularization_loss(&self) -> Result<Tensor> {
        self.recorder
            .regularization_loss(self.config.regularizer.as_ref(), &self.config.device)
    }

    /// How many training batches are recorded (since the last step).
    pub fn recorded_batches(&self) -> usize {
        self.recorder.len()
    }

    /// The variables of the recorded batches, in order (to read or replace
    /// their gradients in a `GradStore`, e.g. for clipping by global norm).
    pub fn recorded_vars(&self) -> Vec<Var> {
        self.recorder.vars()
    }

    /// Drops the recorded batches without training them (after an
    /// evaluation run in training mode).
    pub fn discard_batches(&self) {
        self.recorder.discard();
    }

    /// The layer's record of training batches (what an optimizer step
    /// reads).
    pub fn recorder(&self) -> &Recorder<S> {
        &self.recorder
    }
}

impl<S: EmbeddingStore + 'static> ModuleT for Embedding<S>
where
    S::Key: IdKey,
{
    fn forward_t(&self, ids: &Tensor, train: bool) -> candle_core::Result<Tensor> {
        Ok(self.forward(ids, train)?)
    }
}

impl<S: EmbeddingStore + 'static, R: Rule> SparseModule<R> for Embedding<S>
where
    S::Key: IdKey,
{
    fn gather_grads(&self, grads: &GradStore, into: &mut SparseGrads<R>) -> Result<()> {
        self.recorder.gather_grads(grads, into)
    }

    fn discard_gathered(&self, gathered: &SparseGrads<R>) {
        self.recorder.discard_gathered(gathered);
    }
}
