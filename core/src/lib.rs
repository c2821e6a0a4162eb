//! # dynemb — dynamic embeddings for Rust
//!
//! Embedding tables keyed by arbitrary 64-bit feature ids that grow as new ids
//! arrive, for recommendation and ranking models whose ids number in the
//! hundreds of millions. It is the Rust counterpart of TensorFlow
//! Recommenders-Addons' `dynamic_embedding`.
//!
//! ```
//! use dynemb::{Initializer, Variable};
//!
//! let emb = Variable::<i64>::builder("user_emb")
//!     .dim(4)
//!     .shards(2)
//!     .initializer(Initializer::Constant(0.5))
//!     .build()?;
//! let mut rows = vec![0.0; 2 * 4];
//! emb.lookup_or_insert(&[7, -3], &mut rows)?; // training read: inserts
//! assert_eq!(emb.size(), 2);
//! emb.accum(&[7], &[1.0; 4], &[true])?;       // bp_v2: row += delta
//! emb.lookup(&[7], &mut rows[..4])?;
//! assert_eq!(rows[..4], [1.5; 4]);
//! # Ok::<(), dynemb::Error>(())
//! ```
//!
//! Layout: `raw` holds the lock-free table and is the only module with
//! `unsafe` (public but hidden: not API, there for the benchmarks);
//! [`Variable`] is what users hold (shards, partitioner,
//! initializer, optimizer slot columns, restrict-policy scores); [`Key`],
//! [`Initializer`], [`Partitioner`], [`RestrictPolicy`] and [`Error`] are
//! its vocabulary; a [`Registry`] names a model's variables with TF's
//! `get_variable` semantics (scopes, reuse modes, collections, custom
//! getters).
#![warn(missing_docs)]

pub mod checkpoint;
pub mod checks;
mod error;
mod initializer;
mod key;
mod names;
mod options;
mod partitioner;
#[cfg(feature = "raw")]
#[doc(hidden)]
pub mod raw;
#[cfg(not(feature = "raw"))]
mod raw;
pub mod registry;
pub mod restrict;
mod store;
mod table;
mod variable;

pub use error::{BackendErrorKind, Error, Result};
pub use initializer::Initializer;
pub use key::Key;
pub use names::{check_name, MAX_NAME_BYTES};
pub use options::{TableOptions, VariableBuilder, MAX_SHARDS};
pub use partitioner::Partitioner;
pub use raw::{MAX_DIM, MAX_SLOTS};
pub use registry::{AnyVariable, Collection, Getter, Registry, Reuse, Scope, VariableRequest};
pub use restrict::RestrictPolicy;
pub use store::{new_store_id, EmbeddingStore};
pub use table::EmbeddingTable;
pub use variable::{SlotId, Variable};
