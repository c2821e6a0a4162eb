//! candle layers over dynemb's dynamic embedding tables: a table keyed by
//! arbitrary 64-bit ids, growing as ids arrive, used in a candle model as
//! naturally as `candle_nn::Embedding`, with TensorFlow Recommenders-Addons'
//! lookup semantics and dynemb-optim's sparse optimizers.
//!
//! - **Lookup family** ([`lookup`]): [`embedding_lookup`],
//!   [`embedding_lookup_sparse`] and [`safe_embedding_lookup_sparse`] over
//!   [`SparseIds`] (TF's COO form or PyTorch's offsets) with a
//!   [`Combiner`], returning tensors, bit for bit what TFRA 0.8 returns
//!   on every golden case (`tests/golden/`, dim 4). Two known gaps of a
//!   last bit or two: `max_norm` on rows wider than 8 values (TF sums the
//!   squares in vector lanes, [`clip`]) and weighted sqrtn for some weights
//!   ([`lookup`]). They only read: nothing is inserted.
//! - **Layers**: [`Embedding`] (ids of any rank to rows) and
//!   [`EmbeddingBag`] (pooled bags), each with a training and an inference
//!   forward. Training: the batch's distinct ids are read (and inserted)
//!   into one per-batch `Var` (never one `Var` for the table: candle's
//!   `index_select` backward allocates a gradient as large as its source)
//!   and gathered back; the layer records the `Var` and its keys.
//!   Inference: a plain lookup, nothing inserted or recorded. Both take
//!   `max_norm` ([`max_norm`]) and a [`Regularizer`].
//! - **The step** ([`step`]): after `loss.backward()`, [`SparseStep`] reads
//!   every recorded `Var`'s gradient and applies a dynemb-optim optimizer
//!   as one optimizer step over every table the model read (layers sharing
//!   a table train it with their summed gradient), beside candle-nn's
//!   dense optimizer ([`SparseStep::backward_step`]).
//! - **Threads** ([`parallel`], [`gather`]): a large batch's store reads,
//!   its gather and its optimizer update are split over candle's own CPU
//!   threads, with the same results as one call (store calls only for
//!   stores in this process's memory: [`dynemb::EmbeddingStore::cpu_bound`]).
//!
//! The layers are generic over [`dynemb::EmbeddingStore`], so they train a
//! local `Variable` and any other store alike. Every function checks its
//! input before it changes anything ([`Error`]); `examples/ctr/` trains a
//! CTR model end to end.
#![warn(missing_docs)]

pub mod error;
pub mod ids;

pub use error::{Error, Result};
pub use ids::{IdKey, Ids};

// TFRA's lookup family.
pub mod clip;
pub mod combiner;
pub mod lookup;
mod pool;
pub mod sparse_ids;

pub use combiner::Combiner;
pub use lookup::{
    embedding_lookup, embedding_lookup_sparse, embedding_lookup_sparse_with_max_norm,
    safe_embedding_lookup_sparse, safe_embedding_lookup_sparse_with_max_norm,
};
pub use sparse_ids::{RowRanges, SparseIds};

// Layers, their per-batch records and the optimizer step.
pub mod embedding;
pub mod embedding_bag;
pub mod gather;
pub mod max_norm;
pub mod parallel;
pub mod record;
pub mod regularizer;
mod reserve_ahead;
pub mod rows;
pub mod step;
mod threads;
pub mod unique;

pub use embedding::{Embedding, EmbeddingConfig};
pub use embedding_bag::{EmbeddingBag, EmbeddingBagConfig};
pub use gather::gather_rows;
pub use record::{RecordedBatch, Recorder};
pub use regularizer::Regularizer;
pub use step::{SparseGrads, SparseModule, SparseStep};
pub use unique::{Dedup, UniqueIds};

/// The README's examples (every crate's), compiled and run as doctests
/// here, the crate that depends on all the others.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;
