#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

pub mod checkpoint;
pub mod checks;
mod dtype;
mod error;
mod initializer;
mod key;
pub mod lifecycle;
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

pub use dtype::{Dtype, Rounding};
pub use error::{BackendErrorKind, Error, Result};
pub use initializer::Initializer;
pub use key::Key;
pub use lifecycle::{Admission, EvictListener, Evicted, LifecycleStats};
pub use names::{check_name, MAX_NAME_BYTES};
pub use options::{TableOptions, VariableBuilder, MAX_SHARDS};
pub use partitioner::Partitioner;
pub use raw::{MAX_DIM, MAX_SLOTS};
pub use registry::{AnyVariable, Collection, Getter, Registry, Reuse, Scope, VariableRequest};
pub use restrict::RestrictPolicy;
pub use store::{new_store_id, EmbeddingStore};
pub use table::EmbeddingTable;
pub use variable::{SlotId, Variable};
