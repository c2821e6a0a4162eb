#![doc = include_str!("../README.md")]
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
pub use rows::TrainRows;
pub use step::{SparseGrads, SparseModule, SparseStep};
pub use unique::{Dedup, UniqueIds};

/// The root README's examples, compiled and run as doctests here, the
/// crate that depends on all the others (each crate runs its own README's
/// as its crate docs).
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;
