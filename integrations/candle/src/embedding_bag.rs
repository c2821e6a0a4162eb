//! [`EmbeddingBag`]: pooled lookups per bag over a dynamic table, the
//! differentiable counterpart of TFRA's `safe_embedding_lookup_sparse`
//! (the layer PyTorch calls `nn.EmbeddingBag`, with TensorFlow's rules).
//!
//! # What a forward computes
//!
//! The input is [`SparseIds`] (TensorFlow's `SparseTensor` of any rank, or
//! PyTorch's ids and offsets; [`EmbeddingBag::forward_offsets`] takes the
//! latter as tensors) and optionally one weight per entry. A **bag** is a
//! row of the sparse ids ([`SparseIds::rows`]: every dimension of the dense
//! shape but the last). Per bag, exactly as `safe_embedding_lookup_sparse`
//! (`tests/golden/SEMANTICS.md`):
//! - entries may come in any order: they are grouped by bag stably, so a
//!   bag's entries keep their given order (no sorting is required, and
//!   unsorted rows are never an error);
//! - with weights and a combiner other than [`Combiner::Sum`], entries whose
//!   weight is not `> 0` (0, negative, NaN) are dropped first (TFRA's
//!   pruning); with `Sum` every weight is used as given. Ids are never
//!   dropped: every key value is an ordinary id;
//! - the [`Combiner`] pools the rows `e_j` with weights `w_j` (1 without
//!   weights): `sum_j w_j e_j`, divided by `sum_j w_j` (mean) or
//!   `sqrt(sum_j w_j^2)` (sqrtn);
//! - a bag left empty (no entry, or every entry dropped) is the row of the
//!   configured `default_id` (read, clipped and, in training, trained like
//!   any other id; a missing one is its initializer row) or, without a
//!   `default_id`, zeros. For such a zero bag no row is read: TFRA looks up
//!   id 0 there and masks the result, which this layer does not do;
//! - `max_norm` clips each distinct row read, before weighting (the clip of
//!   [`crate::max_norm`], whose gradient flows).
//!
//! The output is an `f32` tensor on the configured device of shape
//! `dense_shape[..rank - 1] + [dim]`: `[bags, dim]` for offsets and rank 2,
//! `[a, b, dim]` for rank 3, `[dim]` for rank 1 (one bag).
//!
//! # Modes
//!
//! - **Training** ([`EmbeddingBag::forward_train`]): the bags' ids (the
//!   kept entries grouped by bag, then `default_id` once per empty bag) are
//!   deduplicated ([`Dedup`]); the distinct rows are read with
//!   `lookup_or_insert_with_exists` into one variable `[n_unique, dim]`
//!   ([`Recorder::read`]: one store call, then the next batch's rows
//!   backed ahead, as for [`Embedding`](crate::Embedding)), clipped,
//!   gathered per entry
//!   ([`gather_rows`]), multiplied per entry by `w_j / divisor` (weights
//!   only) and added into their bags (`index_add` into `[bags, dim]`
//!   zeros; skipped when every bag holds one entry); without weights, mean
//!   and sqrtn then divide each bag by `n` or `sqrt(n)`. All are candle
//!   operations with a backward, so after `loss.backward()` the variable's
//!   gradient is each distinct row's gradient summed over its entries; the
//!   keys and the variable are recorded for
//!   [`SparseStep`](crate::SparseStep), one batch per call.
//! - **Inference** ([`EmbeddingBag::forward_inference`]): the lookup
//!   function [`safe_embedding_lookup_sparse_with_max_norm`] itself, with
//!   the layer's combiner, `default_id` and `max_norm`: one `lookup` (no
//!   variable, no insert, nothing recorded), TensorFlow's summation order,
//!   so its output equals the function's bit for bit (TFRA's eager result
//!   in its default TRAIN model mode: `max_norm` applies in both of this
//!   layer's modes, where TFRA's INFERENCE mode would ignore it). A store
//!   that is not trainable is read this way in both modes.
//!
//! # Numerics of the two modes
//!
//! Training sums a bag's entries left to right and divides per entry
//! (weighted) or per bag (unweighted); TensorFlow sums unweighted bags in
//! blocks of 8, divides a weighted bag's sum once, and TFRA clips twice
//! where training clips once. Each difference is an ulp or two per
//! operation, so the modes agree to about `n * 2^-23` relative for a bag
//! of `n` entries whose sum does not cancel (1e-6 for the bags of the
//! tests), not bit for bit. What is not finite in one mode (infinite or
//! NaN weights with `Sum`, a weight sum that overflows, squares that
//! underflow to 0) is not finite in the other, but may be another
//! infinity or NaN.
//!
//! # Invariants and decisions
//!
//! - One store call per forward (one per thread's chunk when a large
//!   batch is split over candle's threads, [`crate::parallel`]), of each
//!   distinct id once; every check
//!   (weights' length, sizes) comes before it, so bad input is an
//!   [`Error::InvalidInput`] that reads,
//!   inserts and records nothing. A training forward with nothing to read
//!   (no bag, or only empty bags and no `default_id`) returns zeros and
//!   records nothing.
//! - Per batch the layer builds a few flat buffers (the pooled entries'
//!   ids, bags and factors, the distinct keys); nothing is allocated per
//!   entry, and each thread's deduplication table is reused between calls.
//! - `default_id` is a setting of the layer ([`EmbeddingBagConfig`] is
//!   generic over the key type), like the combiner: TFRA passes both per
//!   call, but a layer's bags keep them from call to call.
//! - The layer implements no `ModuleT`: a bag forward needs the bags'
//!   structure and weights, not one tensor.
//! - The layer's [`Regularizer`] penalizes the distinct rows of each
//!   recorded batch (`default_id`'s row included when it was read); see
//!   [`crate::regularizer`].
//!
//! ```
//! use std::sync::Arc;
//! use dynemb::{Initializer, Variable};
//! use dynemb_candle::{Combiner, EmbeddingBag, EmbeddingBagConfig, SparseIds, SparseStep};
//! use dynemb_optim::{ParamsSgd, SparseSgd};
//!
//! let table = Variable::<i64>::builder("bags")
//!     .dim(8)
//!     .initializer(Initializer::Constant(0.5))
//!     .build()?;
//! let bag = EmbeddingBag::new(
//!     Arc::new(table),
//!     EmbeddingBagConfig { combiner: Combiner::Sqrtn, default_id: Some(0), ..Default::default() },
//! )?;
//! // Bags [7, 9], [] (which reads default_id 0) and [3].
//! let ids = SparseIds::from_offsets(&[7_i64, 9, 3], &[0, 2, 2, 3])?;
//! let pooled = bag.forward_train(&ids, None)?;
//! assert_eq!(pooled.dims(), [3, 8]);
//! let loss = pooled.sqr()?.sum_all()?;
//! let step = SparseStep::new(SparseSgd::new(ParamsSgd { lr: 0.1 })?);
//! step.step(&loss.backward()?, &[&bag])?;
//! assert_eq!(bag.store().size(), 4); // 7, 9, 3 and the default id 0
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::sync::Arc;

use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor, Var};
use dynemb::EmbeddingStore;
use dynemb_optim::Rule;

use crate::gather::gather_rows;
use crate::lookup::check_weights;
use crate::max_norm::clip_tensor_rows;
use crate::record::Recorder;
use crate::regularizer::Regularizer;
use crate::rows::{check_room, with_room, zeroed};
use crate::sparse_ids::RowGroups;
use crate::step::{SparseGrads, SparseModule};
use crate::unique::Dedup;
use crate::{
    safe_embedding_lookup_sparse_with_max_norm, Combiner, Error, IdKey, Ids, Result, SparseIds,
};

/// The settings of an [`EmbeddingBag`] whose table has keys of type `K`.
/// `Default`: on the CPU, [`Combiner::Mean`] (TensorFlow's default), no
/// `max_norm`, no `default_id`, no regularizer, rows reserved ahead.
#[derive(Debug, Clone)]
pub struct EmbeddingBagConfig<K> {
    /// Where the output (and the trained rows' variables) live.
    pub device: Device,
    /// How a bag's rows are pooled.
    pub combiner: Combiner,
    /// Clip each distinct looked-up row to this L2 norm (finite, above 0).
    /// The training forward clips once (candle ops, differentiable); the
    /// inference forward is [`safe_embedding_lookup_sparse_with_max_norm`],
    /// which clips twice as TFRA's TRAIN mode does, so the two modes can
    /// differ in the last bits (and on a row whose squares overflow `f32`,
    /// which the inference forward zeroes as TensorFlow does and the
    /// training forward clips, see [`crate::max_norm`]), and TFRA's
    /// INFERENCE mode (which ignores `max_norm`) differs from both: leave
    /// it `None` to match that.
    pub max_norm: Option<f32>,
    /// The id whose row an empty bag gets (zeros when `None`).
    pub default_id: Option<K>,
    /// Penalty on the rows training batches read; see
    /// [`EmbeddingBag::regularization_loss`].
    pub regularizer: Option<Regularizer>,
    /// As [`EmbeddingConfig::reserve_rows_ahead`](crate::EmbeddingConfig::reserve_rows_ahead)
    /// (default `true`).
    pub reserve_rows_ahead: bool,
}

impl<K> Default for EmbeddingBagConfig<K> {
    fn default() -> Self {
        EmbeddingBagConfig {
            device: Device::Cpu,
            combiner: Combiner::default(),
            max_norm: None,
            default_id: None,
            regularizer: None,
            reserve_rows_ahead: true,
        }
    }
}

/// A pooling embedding layer over a dynamic table; see the
/// [module docs](self).
pub struct EmbeddingBag<S: EmbeddingStore> {
    recorder: Recorder<S>,
    config: EmbeddingBagConfig<S::Key>,
}

impl<S: EmbeddingStore> std::fmt::Debug for EmbeddingBag<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddingBag")
            .field("store", &self.recorder.store().name())
            .field("dim", &self.recorder.store().dim())
            .field("config", &self.config)
            .field("recorded_batches", &self.recorder.len())
            .finish()
    }
}

impl<S: EmbeddingStore + 'static> EmbeddingBag<S>
where
    S::Key: IdKey,
{
    /// A layer reading `store` (share one store between layers by cloning
    /// its `Arc`). An [`Error::InvalidInput`] for a store of `dim` 0, a
    /// `max_norm` that is not finite and above 0 or a regularizer weight
    /// that is not finite and non-negative.
    pub fn new(store: Arc<S>, config: EmbeddingBagConfig<S::Key>) -> Result<Self> {
        Ok(EmbeddingBag {
            recorder: Recorder::for_layer(store, config.max_norm, config.regularizer.as_ref())?
                .reserve_rows_ahead(config.reserve_rows_ahead),
            config,
        })
    }

    /// The table.
    pub fn store(&self) -> &Arc<S> {
        self.recorder.store()
    }

    /// Values per row.
    pub fn dim(&self) -> usize {
        self.recorder.store().dim()
    }

    /// The settings.
    pub fn config(&self) -> &EmbeddingBagConfig<S::Key> {
        &self.config
    }

    /// The training forward of `sp_ids` with optional per-entry `weights`;
    /// see the [module docs](self).
    pub fn forward_train(
        &self,
        sp_ids: &SparseIds<S::Key>,
        weights: Option<&[f32]>,
    ) -> Result<Tensor> {
        self.forward(sp_ids, weights, true)
    }

    /// The inference forward of `sp_ids` with optional per-entry `weights`
    /// (equal to [`safe_embedding_lookup_sparse_with_max_norm`]); see the
    /// [module docs](self).
    pub fn forward_inference(
        &self,
        sp_ids: &SparseIds<S::Key>,
        weights: Option<&[f32]>,
    ) -> Result<Tensor> {
        self.forward(sp_ids, weights, false)
    }

    /// The forward of `sp_ids` with optional per-entry `weights` (one per
    /// entry, in entry order; `train` picks the mode): an `f32` tensor of
    /// shape `dense_shape[..rank - 1] + [dim]`. An
    /// [`Error::InvalidInput`] for weights of another length.
    pub fn forward(
        &self,
        sp_ids: &SparseIds<S::Key>,
        weights: Option<&[f32]>,
        train: bool,
    ) -> Result<Tensor> {
        let store = self.recorder.store();
        if train && store.trainable() {
            return self.train(sp_ids, weights);
        }
        let config = &self.config;
        let pooled = safe_embedding_lookup_sparse_with_max_norm(
            &**store,
            sp_ids,
            weights,
            config.combiner,
            config.default_id,
            config.max_norm,
        )?;
        Ok(pooled.to_device(&config.device)?)
    }

    /// The forward of PyTorch's `EmbeddingBag` input: `ids` a vector
    /// (`i64`, `u32` or `i32`, converted as [`Ids::from_tensor`] does),
    /// `offsets` a vector of `bags + 1` offsets (`i64`, `u32` or `i32`; bag `b`
    /// is `ids[offsets[b]..offsets[b + 1]]`, PyTorch's
    /// `include_last_offset=True` form, see [`SparseIds::from_offsets`]),
    /// `per_sample_weights` a float vector as long as `ids`. Output `[bags,
    /// dim]`, pooled with this layer's (TensorFlow's) rules. Tensors of
    /// another rank or dtype, negative or inconsistent offsets and weights
    /// of another length are an [`Error::InvalidInput`].
    pub fn forward_offsets(
        &self,
        ids: &Tensor,
        offsets: &Tensor,
        per_sample_weights: Option<&Tensor>,
        train: bool,
    ) -> Result<Tensor> {
        let ids = Ids::<S::Key>::from_tensor(vector(ids, "ids")?)?;
        let offsets = vector(offsets, "offsets")?;
        if !matches!(offsets.dtype(), DType::I64 | DType::U32 | DType::I32) {
            return Err(Error::invalid(format!(
                "offsets must be i64, u32 or i32, got {:?}",
                offsets.dtype()
            )));
        }
        let offsets = Ids::<i64>::from_tensor(offsets)
            .map_err(|e| Error::invalid(format!("offsets: {e}")))?
            .keys()
            .iter()
            .enumerate()
            .map(|(b, &offset)| {
                usize::try_from(offset).map_err(|_| {
                    Error::invalid(format!(
                        "offsets must not be negative: offsets[{b}] = {offset}"
                    ))
                })
            })
            .collect::<Result<Vec<usize>>>()?;
        let weights = per_sample_weights
            .map(|w| {
                let w = vector(w, "per_sample_weights")?;
                if !w.dtype().is_float() {
                    return Err(Error::invalid(format!(
                        "per_sample_weights must be a float tensor, got {:?}",
                        w.dtype()
                    )));
                }
                Ok(w.to_dtype(DType::F32)?.to_vec1::<f32>()?)
            })
            .transpose()?;
        let sp_ids = SparseIds::from_offsets(ids.keys(), &offsets)?;
        self.forward(&sp_ids, weights.as_deref(), train)
    }

    /// The training forward (the store is trainable).
    fn train(&self, sp_ids: &SparseIds<S::Key>, weights: Option<&[f32]>) -> Result<Tensor> {
        check_weights(weights, sp_ids.len())?;
        let (config, dim) = (&self.config, self.dim());
        let bags = sp_ids.num_rows();
        if bags >= u32::MAX as usize || bags.checked_mul(dim).is_none() {
            return Err(Error::invalid(format!(
                "{bags} bags of {dim} values are too many for one batch"
            )));
        }
        let mut shape = sp_ids.dense_shape()[..sp_ids.rank() - 1].to_vec();
        shape.push(dim);
        let entries = BagEntries::new(sp_ids, weights, config.combiner, config.default_id)?;
        if entries.ids.is_empty() {
            let zeros = zeroed(bags, dim)?;
            return Ok(Tensor::from_vec(zeros, shape, &config.device)?);
        }
        let unique = Dedup::with_thread_local(|dedup| dedup.unique(&entries.ids))?;
        let (keys, inverse) = unique.into_parts();
        check_room(inverse.len().saturating_add(bags), dim)?;
        let rows = self.recorder.read(&keys, &config.device)?;
        let clipped = match config.max_norm {
            Some(max_norm) => clip_tensor_rows(rows.as_tensor(), max_norm)?,
            None => rows.as_tensor().clone(),
        };
        let pooled = entries.pool(&clipped, inverse, bags)?;
        let output = if pooled.dims() == shape.as_slice() {
            pooled
        } else {
            pooled.reshape(shape)?
        };
        self.recorder.record(keys, rows)?;
        Ok(output)
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

impl<S: EmbeddingStore + 'static, R: Rule> SparseModule<R> for EmbeddingBag<S>
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

/// `tensor` if it is a vector, else an [`Error::InvalidInput`] naming it.
fn vector<'a>(tensor: &'a Tensor, name: &str) -> Result<&'a Tensor> {
    match tensor.rank() {
        1 => Ok(tensor),
        rank => Err(Error::invalid(format!(
            "{name} must be a vector, got a tensor of rank {rank} (shape {:?})",
            tensor.dims()
        ))),
    }
}

/// A training batch's pooled entries, built on the host: the kept entries
/// grouped by bag (stably), then `default_id` in each empty bag, with what
/// pooling them needs.
struct BagEntries<K> {
    /// Per pooled entry, its id.
    ids: Vec<K>,
    /// Per pooled entry, its bag (non-decreasing).
    bags: Vec<u32>,
    /// Per pooled entry, `w / divisor` of its bag (weighted pooling only).
    factors: Option<Vec<f32>>,
    /// Per bag, `n` (mean) or `sqrt(n)` (sqrtn), 1 for an empty bag
    /// (unweighted mean and sqrtn with some bag of several entries only).
    divisors: Option<Vec<f32>>,
    /// Whether every bag holds exactly one pooled entry (entry `b` is bag
    /// `b`).
    one_per_bag: bool,
}

impl<K: IdKey> BagEntries<K> {
    fn new(
        sp_ids: &SparseIds<K>,
        weights: Option<&[f32]>,
        combiner: Combiner,
        default_id: Option<K>,
    ) -> Result<Self> {
        let pruning = weights.filter(|_| combiner != Combiner::Sum);
        let groups = RowGroups::new(sp_ids, pruning)?;
        let entry = |j: usize| groups.order.as_ref().map_or(j, |order| order[j]);
        let (kept, empty) = groups.ranges().fold((0, 0), |(kept, empty), range| {
            (kept + range.len(), empty + usize::from(range.is_empty()))
        });
        let len = kept + if default_id.is_some() { empty } else { 0 };
        let mut ids = with_room(len, "bag entries")?;
        let mut bags = with_room(len, "bag entries")?;
        let mut factors = weights
            .map(|_| with_room(len, "bag entry weights"))
            .transpose()?;
        let mut divisors = (weights.is_none() && combiner != Combiner::Sum)
            .then(|| with_room(sp_ids.num_rows(), "bag divisors"))
            .transpose()?;
        let mut one_per_bag = true;
        for (bag, range) in groups.ranges().enumerate() {
            // `RowGroups` has `num_rows` ranges, checked to fit a u32.
            let bag = bag as u32;
            if range.is_empty() {
                one_per_bag &= default_id.is_some();
                if let Some(id) = default_id {
                    ids.push(id);
                    bags.push(bag);
                    if let Some(factors) = &mut factors {
                        factors.push(1.0);
                    }
                }
                if let Some(divisors) = &mut divisors {
                    divisors.push(1.0);
                }
                continue;
            }
            one_per_bag &= range.len() == 1;
            ids.extend(range.clone().map(|j| sp_ids.ids()[entry(j)]));
            bags.resize(bags.len() + range.len(), bag);
            if let (Some(factors), Some(weights)) = (&mut factors, weights) {
                let bag_weights = range.clone().map(|j| weights[entry(j)]);
                let divisor = match combiner {
                    Combiner::Sum => 1.0,
                    Combiner::Mean => bag_weights.clone().fold(0.0_f32, |s, w| s + w),
                    Combiner::Sqrtn => bag_weights.clone().fold(0.0_f32, |s, w| s + w * w).sqrt(),
                };
                factors.extend(bag_weights.map(|w| w / divisor));
            }
            if let Some(divisors) = &mut divisors {
                let n = range.len();
                divisors.push(match combiner {
                    Combiner::Sqrtn => (n as f64).sqrt() as f32,
                    Combiner::Sum | Combiner::Mean => n as f32,
                });
            }
        }
        if one_per_bag {
            divisors = None;
        }
        Ok(BagEntries {
            ids,
            bags,
            factors,
            divisors,
            one_per_bag,
        })
    }

    /// Pools `rows` (the distinct rows, `[n_unique, dim]`), which entry `i`
    /// reads at `inverse[i]`, into `[bags, dim]` with candle operations;
    /// see the [module docs](self).
    fn pool(self, rows: &Tensor, inverse: Vec<u32>, bags: usize) -> Result<Tensor> {
        let (device, dim) = (rows.device(), rows.dim(1)?);
        let n = inverse.len();
        let gathered = gather_rows(rows, inverse, (n, dim))?;
        let weighted = match self.factors {
            Some(factors) => gathered.broadcast_mul(&Tensor::from_vec(factors, (n, 1), device)?)?,
            None => gathered,
        };
        let summed = if self.one_per_bag {
            weighted
        } else {
            let bag_of = Tensor::from_vec(self.bags, n, device)?;
            let zeros = Tensor::from_vec(zeroed(bags, dim)?, (bags, dim), device)?;
            zeros.index_add(&bag_of, &weighted, 0)?
        };
        Ok(match self.divisors {
            Some(divisors) => {
                summed.broadcast_div(&Tensor::from_vec(divisors, (bags, 1), device)?)?
            }
            None => summed,
        })
    }
}
