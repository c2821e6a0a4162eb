//! The lock-free table underneath [`Variable`](crate::Variable): the only
//! module of the crate with `unsafe`.
//!
//! **Not API.** This module is public only with the `raw` feature (and
//! hidden from the documentation even then), so that the workspace's
//! benchmarks (`dynemb-benches`: the row
//! [`kernels`], the group [`probe`], [`zeroed_words`], [`release_free_heap`])
//! and the crate's own integration tests ([`Table`]) can reach it. It makes
//! no stability promise and may change or become private at any time; use
//! [`Variable`](crate::Variable). Its safe functions are sound: no input can
//! cause undefined behaviour. But unlike the public API they do not turn
//! every misuse into an [`Error`](crate::Error): [`Positions::of`] panics
//! past its slice, the kernels `debug_assert!` matching lengths (and
//! otherwise use the common prefix), and [`zeroed_words`] and a table's
//! growth abort when memory runs out, as a `Vec` does. (A table's
//! constructor, its row segments and [`Table::reserve`] do not: they
//! return an error or do nothing.)
//!
//! - `tags`: slot states and SIMD matching of a group's 16 tags;
//! - `index`: the open-addressing index protocol (find, insert, remove,
//!   migrate one group) over atomics that loom can model;
//! - `rows`: the row arena (stable row ids, seqlocked rows, slot columns,
//!   scores, free list);
//! - `kernels`: vectorized row kernels and prefetch;
//! - `bulk`: copies into and out of a row's atomic words with vector
//!   loads and stores;
//! - `codec`: how a column packs values of each dtype into its words;
//! - `probe`: the group probe exposed for benchmarks (SIMD and scalar);
//! - `pipeline`: the software pipeline batched operations walk their keys in;
//! - `epoch`: the table's dedicated epoch collector;
//! - `fs`: the atomic directory exchange checkpoints publish with;
//! - `zeroed`: zeroed (huge-page) arrays, also public as [`zeroed_words`]
//!   for benchmarks, with [`release_free_heap`] for memory measurements;
//! - [`Table`]: one shard, built from the above, with batched operations.
//!
//! Without the `raw` feature the items only the benchmarks and tests reach
//! are unused, hence the `allow` below.
#![cfg_attr(not(feature = "raw"), allow(dead_code, unused_imports))]

mod bound;
mod bulk;
mod codec;
mod epoch;
pub(crate) mod fs;
pub(crate) mod index;
pub mod kernels;
#[cfg(all(test, loom))]
mod loom_models;
mod pipeline;
pub mod probe;
mod rows;
mod sync;
mod table;
pub(crate) mod tags;
pub(crate) mod zeroed;

pub use rows::{RowFormat, MAX_SLOTS, PREFAULT_MAX_BYTES};
pub(crate) use table::Lifecycle;
pub use table::{ExportColumns, ExportedRows, Positions, Table, MAX_DIM};
pub use zeroed::{release_free_heap, zeroed_words, ZeroedWords};
