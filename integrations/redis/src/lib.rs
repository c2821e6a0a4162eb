//! # dynemb-redis — dynamic embeddings stored in Redis
//!
//! When a model's tables outgrow one machine, or several trainer processes
//! must share one table, its rows can live in a Redis server or a Redis
//! Cluster (TFRA's `RedisTable` route). A [`RedisVariable`] has the
//! semantics of a local [`dynemb::Variable`] and implements the same
//! [`dynemb::EmbeddingStore`] trait, so `dynemb-optim`'s optimizers and
//! `dynemb-candle`'s layers train it unchanged.
//!
//! ```no_run
//! use dynemb::Initializer;
//! use dynemb_redis::{RedisConfig, RedisVariable};
//!
//! let config = RedisConfig::with_nodes(["127.0.0.1:7000", "127.0.0.1:7001"]);
//! let emb = RedisVariable::<i64>::builder("user_emb")
//!     .dim(8)
//!     .initializer(Initializer::Constant(0.5))
//!     .config(config)
//!     .build()?;
//! let mut rows = vec![0.0; 2 * 8];
//! emb.lookup_or_insert(&[7, -3], &mut rows)?; // training read: inserts
//! emb.accum(&[7], &[1.0; 8], &[true])?;       // bp_v2, added on the server
//! emb.lookup(&[7], &mut rows[..8])?;
//! assert_eq!(rows[..8], [1.5; 8]);
//! # Ok::<(), dynemb::Error>(())
//! ```
//!
//! Modules, each owning one thing:
//! - [`config`]: servers, timeouts, password, buckets, prefix;
//! - `node`: one server and its connection pool (reconnects, timeouts);
//! - `cluster`: the slot map and one pipelined round trip per node per
//!   batch, all nodes at once, with redirections followed;
//! - `layout`: keys, buckets and the bytes of a row (the storage format);
//! - `meta`: the variable's metadata, checked when opening;
//! - `scripts`: the Lua scripts that make writes atomic on the server;
//! - `variable`, `slots`, `scan`, [`update`], `checkpoint`, `store`: the
//!   variable's operations.
#![warn(missing_docs)]

mod batch;
mod checkpoint;
mod cluster;
pub mod config;
mod layout;
mod meta;
mod node;
mod reply;
mod scan;
mod scripts;
mod slots;
mod store;
pub mod update;
mod variable;

pub use config::RedisConfig;
pub use variable::{RedisVariable, RedisVariableBuilder};
