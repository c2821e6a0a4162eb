//! TFRA's lookup family as functions returning CPU `f32` tensors:
//! [`embedding_lookup`], [`embedding_lookup_sparse`] and
//! [`safe_embedding_lookup_sparse`], with TFRA 0.8.1's results on
//! TensorFlow 2.16 bit for bit (eager execution, the default TRAIN model
//! mode; `tests/golden/SEMANTICS.md` is the full account and
//! `tests/tfra_goldens.rs` checks every recorded case).
//!
//! Common to all three:
//! - they never insert: one [`EmbeddingStore::lookup`] per call of the
//!   batch's distinct ids (in order of first appearance), or one per
//!   thread's chunk of them when a large batch is split over candle's
//!   threads ([`crate::parallel`]); a missing id reads the store's
//!   initializer row;
//! - `max_norm` clips each looked-up row, before weighting and pooling, with
//!   TF's `clip_by_norm` applied twice, as TFRA's TRAIN mode does
//!   ([`crate::clip`]). TFRA's INFERENCE mode ignores `max_norm`: pass
//!   `None` for that. TFRA caches `max_norm` per lookup `name`; here every
//!   call uses its own. A finite row never becomes infinite or NaN: a row
//!   TensorFlow's clip would turn into infinities or NaNs (some `x *
//!   max_norm` overflows) is clipped in `f64` instead (the exact clip, to
//!   one rounding), and a `max_norm` that is not finite and above 0 (for
//!   which TFRA gives NaN or zero rows) is an [`Error::InvalidInput`];
//! - the sparse functions take `max_norm` in their `*_with_max_norm` forms
//!   (last argument, as in TFRA's argument order); the short forms are those
//!   with `max_norm = None`;
//! - every check comes before the store is read: bad input is an
//!   [`Error::InvalidInput`] and changes nothing.
//!
//! Pooling (see [`Combiner`]) follows TensorFlow's kernels:
//! - without weights, the `SparseSegmentSum/Mean/SqrtN` kernel: an empty
//!   row is 0, one entry is copied; otherwise the first `k = n % 8` rows
//!   (0 -> 8, 1 -> 9) are summed left to right and, for `n < 10`, scaled by
//!   `1/n` (mean) or `1/sqrt(n)` (sqrtn); each following block of 8 rows is
//!   summed on its own and added; for `n >= 10` the total is divided by `n`
//!   or `sqrt(n)` last;
//! - with weights, `segment_sum`: `S = sum_j row_j * w_j` (one entry copied,
//!   more summed from `+0` left to right), then `S`, `S / sum_j w_j` or `S /
//!   sqrt(sum_j w_j * w_j)`. So `None` and all-ones weights may differ in
//!   the last bit. Only the weights' count is checked: 0, negative, NaN and
//!   infinite weights are used as TensorFlow uses them (which for
//!   `safe_embedding_lookup_sparse` with mean or sqrtn means dropping those
//!   not `> 0`).
//!
//! One known gap: for weighted sqrtn TF's eager `pow(w, 2)` is Eigen's
//! `pow`, which for some weights is an ulp off `w * w` (moving the output
//! by up to 2 ulp); this uses `w * w`, which is what TF's graph optimizer
//! turns the `pow` into and is exact for every golden case.
//!
//! The ids' dedup and the output are flat buffers built once; the output
//! becomes the tensor without a copy.
//!
//! ```
//! use dynemb::{Initializer, Variable};
//! use dynemb_candle::{
//!     embedding_lookup, embedding_lookup_sparse, safe_embedding_lookup_sparse,
//!     safe_embedding_lookup_sparse_with_max_norm, Combiner, SparseIds,
//! };
//!
//! let var = Variable::<i64>::builder("emb")
//!     .dim(4)
//!     .initializer(Initializer::Constant(0.5))
//!     .build()?;
//! // TF's SparseTensor form, and the same bags as PyTorch offsets.
//! let sp = SparseIds::from_coo(&[[0, 0], [0, 1], [2, 0]], &[7_i64, 9, 3], [3, 2])?;
//! let bags = SparseIds::from_offsets(&[7_i64, 9, 3], &[0, 2, 2, 3])?;
//! let weights = vec![1.0_f32, 2.0, 0.5];
//!
//! let t = embedding_lookup(&var, &[7_i64, 42], Some(2.0))?;
//! assert_eq!(t.dims(), [2, 4]);
//! let t = embedding_lookup_sparse(&var, &sp, Some(&weights), Combiner::Mean)?;
//! assert_eq!(t.dims(), [3, 4]);
//! let t = safe_embedding_lookup_sparse(&var, &bags, None, Combiner::Sqrtn, Some(0_i64))?;
//! assert_eq!(t.dims(), [3, 4]);
//! let t = safe_embedding_lookup_sparse_with_max_norm(
//!     &var, &sp, None, Combiner::Sum, None, Some(1.0),
//! )?;
//! assert_eq!(t.dims(), [3, 4]);
//! assert_eq!(var.size(), 0); // lookups never insert
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::borrow::Cow;

use candle_core::{Device, Tensor};
use dynemb::EmbeddingStore;

use crate::clip::{check_clip_bound, clip_rows};
use crate::pool::Pooling;
use crate::rows::{reserved, zeroed};
use crate::sparse_ids::{RowGroups, RowRanges};
use crate::unique::Dedup;
use crate::{parallel, Combiner, Error, IdKey, Ids, Result, SparseIds};

/// TFRA's `embedding_lookup(params, ids, max_norm)`: the rows of `ids` (a
/// slice, or [`Ids`] of any rank), clipped to `max_norm` if given, as a
/// tensor of shape `ids.shape + [dim]` (`[dim]` for a scalar id). Repeated
/// ids are read once.
///
/// ```
/// # use dynemb::{Initializer, Variable};
/// # use dynemb_candle::embedding_lookup;
/// let var = Variable::<i64>::builder("emb").dim(2).initializer(Initializer::Constant(3.0)).build()?;
/// let t = embedding_lookup(&var, &[7_i64, 42], Some(2.0))?;
/// assert_eq!(t.dims(), [2, 2]);
/// assert_eq!(var.size(), 0); // lookups never insert
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn embedding_lookup<S>(
    store: &S,
    ids: impl Into<Ids<S::Key>>,
    max_norm: Option<f32>,
) -> Result<Tensor>
where
    S: EmbeddingStore,
    S::Key: IdKey,
{
    max_norm.map_or(Ok(()), check_clip_bound)?;
    let ids = ids.into();
    let dim = dim_of(store)?;
    let unique = Dedup::with_thread_local(|dedup| dedup.unique(ids.keys()))?;
    let positions = unique.inverse();
    let rows = read_rows(store, unique.keys(), dim, max_norm)?;
    let values = if unique.len() == ids.len() {
        rows
    } else {
        let mut values = reserved(ids.len(), dim)?;
        for &p in positions {
            let start = p as usize * dim;
            values.extend_from_slice(&rows[start..start + dim]);
        }
        values
    };
    tensor(values, ids.output_shape(dim))
}

/// [`embedding_lookup_sparse_with_max_norm`] without `max_norm`.
pub fn embedding_lookup_sparse<S>(
    store: &S,
    sp_ids: &SparseIds<S::Key>,
    weights: Option<&[f32]>,
    combiner: Combiner,
) -> Result<Tensor>
where
    S: EmbeddingStore,
    S::Key: IdKey,
{
    embedding_lookup_sparse_with_max_norm(store, sp_ids, weights, combiner, None)
}

/// TFRA's `embedding_lookup_sparse(params, sp_ids, sp_weights, combiner,
/// max_norm)`: pools each segment of `sp_ids` into one row of a `[rows,
/// dim]` tensor.
///
/// - Segments are the entries' first indices
///   ([`SparseIds::leading_indices`]); the dense shape is not used (rank 3:
///   everything under one first index is pooled together).
/// - `rows` is the last entry's first index + 1 (0 without entries):
///   trailing empty rows are dropped, leading and middle ones kept (0, or
///   NaN for weighted mean and sqrtn, as in TFRA).
/// - First indices must not decrease ("segment ids are not increasing",
///   TensorFlow's error, is an [`Error::InvalidInput`]); the order inside a
///   row is free and is the summation order.
/// - `weights`, if given, has one weight per entry, in entry order.
///
/// See the [module docs](self) for clipping and pooling.
pub fn embedding_lookup_sparse_with_max_norm<S>(
    store: &S,
    sp_ids: &SparseIds<S::Key>,
    weights: Option<&[f32]>,
    combiner: Combiner,
    max_norm: Option<f32>,
) -> Result<Tensor>
where
    S: EmbeddingStore,
    S::Key: IdKey,
{
    max_norm.map_or(Ok(()), check_clip_bound)?;
    let dim = dim_of(store)?;
    check_weights(weights, sp_ids.len())?;
    let segments = sp_ids.leading_indices();
    let num_rows = segments.last().map_or(0, |&s| s + 1);
    let ranges = RowRanges::new(segments, num_rows)?;
    let mut out = zeroed(num_rows, dim)?;
    let unique = Dedup::new().unique(sp_ids.ids())?;
    let positions = unique.inverse();
    let rows = read_rows(store, unique.keys(), dim, max_norm)?;
    let mut pooling = Pooling::new(&rows, dim, combiner);
    for ((_, range), out_row) in ranges.zip(out.chunks_exact_mut(dim)) {
        match weights {
            None => pooling.unweighted(&positions[range], out_row),
            Some(w) => pooling.weighted(&positions[range.clone()], &w[range], out_row),
        }
    }
    tensor(out, vec![num_rows, dim])
}

/// [`safe_embedding_lookup_sparse_with_max_norm`] without `max_norm`.
pub fn safe_embedding_lookup_sparse<S>(
    store: &S,
    sp_ids: &SparseIds<S::Key>,
    weights: Option<&[f32]>,
    combiner: Combiner,
    default_id: Option<S::Key>,
) -> Result<Tensor>
where
    S: EmbeddingStore,
    S::Key: IdKey,
{
    safe_embedding_lookup_sparse_with_max_norm(store, sp_ids, weights, combiner, default_id, None)
}

/// TFRA's `safe_embedding_lookup_sparse(embedding_weights, sparse_ids,
/// sparse_weights, combiner, default_id, max_norm)`: pools each row of
/// `sp_ids` ([`SparseIds::rows`]: every dimension but the last, flattened)
/// into a tensor of shape `dense_shape[..rank - 1] + [dim]` (`[dim]` for
/// rank 1, where everything is one row).
///
/// - Entries may come in any order: rows are gathered stably, so a row's
///   entries are summed in their given order.
/// - With `weights` and a combiner other than [`Combiner::Sum`], entries
///   whose weight is not `> 0` (0, negative, NaN) are dropped first. With
///   `Sum` every weight is used. Ids are never dropped (negative ids are
///   ordinary keys, unlike `tf.nn`'s version).
/// - A row left empty is `+0.0` when `default_id` is `None`, otherwise the
///   (clipped) row of `default_id`, `0` included; a missing default id
///   reads the initializer row.
///
/// See the [module docs](self) for clipping and pooling.
pub fn safe_embedding_lookup_sparse_with_max_norm<S>(
    store: &S,
    sp_ids: &SparseIds<S::Key>,
    weights: Option<&[f32]>,
    combiner: Combiner,
    default_id: Option<S::Key>,
    max_norm: Option<f32>,
) -> Result<Tensor>
where
    S: EmbeddingStore,
    S::Key: IdKey,
{
    max_norm.map_or(Ok(()), check_clip_bound)?;
    let dim = dim_of(store)?;
    check_weights(weights, sp_ids.len())?;
    let mut out = zeroed(sp_ids.num_rows(), dim)?;
    let pruning = weights.filter(|_| combiner != Combiner::Sum);
    let grouped = RowGroups::new(sp_ids, pruning)?;
    let ids = sp_ids.ids();
    // The entries' ids in row order, then the default id if a row needs it.
    let mut lookup_ids: Vec<S::Key> = match &grouped.order {
        None => ids.to_vec(),
        Some(order) => order.iter().map(|&i| ids[i]).collect(),
    };
    let entries = lookup_ids.len();
    if let Some(id) = default_id.filter(|_| grouped.has_empty_row()) {
        lookup_ids.push(id);
    }
    let weights: Option<Cow<'_, [f32]>> = weights.map(|w| match &grouped.order {
        None => Cow::Borrowed(w),
        Some(order) => order.iter().map(|&i| w[i]).collect(),
    });
    let unique = Dedup::new().unique(&lookup_ids)?;
    let (positions, default_position) = unique.inverse().split_at(entries);
    let default_position = default_position.first().copied();
    let rows = read_rows(store, unique.keys(), dim, max_norm)?;
    let mut pooling = Pooling::new(&rows, dim, combiner);
    for (range, out_row) in grouped.ranges().zip(out.chunks_exact_mut(dim)) {
        if !range.is_empty() {
            match &weights {
                None => pooling.unweighted(&positions[range], out_row),
                Some(w) => pooling.weighted(&positions[range.clone()], &w[range], out_row),
            }
        } else if let Some(p) = default_position {
            let start = p as usize * dim;
            out_row.copy_from_slice(&rows[start..start + dim]);
        }
    }
    let mut shape = sp_ids.dense_shape()[..sp_ids.rank() - 1].to_vec();
    shape.push(dim);
    tensor(out, shape)
}

/// The store's row width; an error for 0 (nothing to look up).
fn dim_of<S: EmbeddingStore>(store: &S) -> Result<usize> {
    match store.dim() {
        0 => Err(Error::invalid(format!(
            "embedding store {:?} has dim 0",
            store.name()
        ))),
        dim => Ok(dim),
    }
}

/// One weight per entry, if weights are given.
pub(crate) fn check_weights(weights: Option<&[f32]>, entries: usize) -> Result<()> {
    match weights {
        Some(w) if w.len() != entries => Err(Error::invalid(format!(
            "weights: {entries} sparse ids need {entries} weights, got {}",
            w.len()
        ))),
        _ => Ok(()),
    }
}

/// The rows of `keys` (one store lookup), clipped to `max_norm` if given.
fn read_rows<S: EmbeddingStore>(
    store: &S,
    keys: &[S::Key],
    dim: usize,
    max_norm: Option<f32>,
) -> Result<Vec<f32>> {
    let mut rows = zeroed(keys.len(), dim)?;
    parallel::lookup(store, keys, &mut rows)?;
    if let Some(max_norm) = max_norm {
        clip_rows(&mut rows, dim, max_norm);
    }
    Ok(rows)
}

/// `values` as a CPU tensor of `shape`.
fn tensor(values: Vec<f32>, shape: Vec<usize>) -> Result<Tensor> {
    Ok(Tensor::from_vec(values, shape, &Device::Cpu)?)
}
