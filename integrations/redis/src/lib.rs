//! # dynemb-redis — dynamic embeddings stored in Redis
//!
//! When a model's tables outgrow one machine, or several trainer processes
//! must share one table, its rows can live in a Redis server or a Redis
//! Cluster (TFRA's `RedisTable` route). A [`RedisVariable`] has the
//! semantics of a local [`dynemb::Variable`] and implements the same
//! [`dynemb::EmbeddingStore`] trait, so `dynemb-optim`'s optimizers and
//! `dynemb-candle`'s layers train it unchanged.
//!
//! A table is described once, with [`dynemb::Variable::builder`], and
//! that description builds a local table (`build()`) or opens a Redis one
//! ([`RedisVariable::open`]), as TFRA's `kv_creator` gives one `Variable`
//! for every backend.
//!
//! ```no_run
//! use dynemb::{Initializer, Variable};
//! use dynemb_redis::{RedisConfig, RedisVariable};
//!
//! let config = RedisConfig::with_nodes(["127.0.0.1:7000", "127.0.0.1:7001"]);
//! let description = Variable::<i64>::builder("user_emb")
//!     .dim(8)
//!     .initializer(Initializer::Constant(0.5));
//! let emb = RedisVariable::open(description, config)?;
//! let mut rows = vec![0.0; 2 * 8];
//! emb.lookup_or_insert(&[7, -3], &mut rows)?; // training read: inserts
//! emb.accum(&[7], &[1.0; 8], &[true])?;       // bp_v2, added on the server
//! emb.lookup(&[7], &mut rows[..8])?;
//! assert_eq!(rows[..8], [1.5; 8]);
//! # Ok::<(), dynemb::Error>(())
//! ```
//!
//! # Decisions
//!
//! - **Settings**: [`RedisVariable::open`] takes the
//!   [`VariableBuilder`](dynemb::VariableBuilder) a local table is built
//!   from, checks it where every table's settings are checked
//!   ([`TableOptions::check`](dynemb::TableOptions::check)), and refuses at
//!   open what a Redis table cannot honour: more than one shard (keys are
//!   spread over [`RedisConfig::buckets`] instead, a layout fixed when the
//!   table is created) and a custom partitioner. `init_size` is accepted
//!   and unused: it sizes a local table's index ahead of its keys, and a
//!   Redis table has no index to size (its buckets are Redis hashes that
//!   grow on the servers), so the hint has nothing to change and a
//!   description written for a local table opens unchanged.
//! - **Layout** (TFRA's, improved): rows are spread over
//!   [`buckets`](RedisConfig::buckets) Redis hashes by a fixed 64-bit mix
//!   of the key; bucket `b` is the hash `<prefix>:<name>:{b}`, whose hash
//!   tag puts it on one cluster node. A field is the key's 8 bytes
//!   (little-endian), its value the row: an 8-byte version, an 8-byte score,
//!   the values and then each slot column, `f32` little-endian. A row
//!   written before a slot existed lacks that column and reads its initial
//!   value, so creating a slot rewrites nothing. `<prefix>:<name>:meta`
//!   holds the format version, key type, dim, bucket count, initializer,
//!   restrict policy and slots; opening a variable with other settings is
//!   an [`Error::Mismatch`](dynemb::Error::Mismatch).
//! - **Batches**: a batch's keys are grouped by bucket; each bucket gets one
//!   command (`HMGET`, `HDEL`, one module command or one Lua script call),
//!   each node one
//!   pipeline, and every node's pipeline is sent before any reply is read:
//!   one round trip per node, all nodes at once. Routing is this crate's
//!   own (the cluster's CRC16 slots, `CLUSTER SLOTS`, `MOVED`/`ASK`
//!   followed per command).
//! - **Atomicity**: every write that depends on a row's current state runs
//!   on the server, as one command on the row's bucket: `accum` adds on
//!   the server, `upsert` keeps the row's slots, `lookup_or_insert`
//!   inserts only absent keys. The command is `dynemb-redis-module`'s
//!   (`DYNEMB.ACCUM` and its siblings, native code) when every node has
//!   that module loaded when the variable is opened
//!   ([`RedisConfig::use_module`], [`RedisVariable::uses_module`]), else
//!   a Lua script of the same semantics (`EVALSHA`). Decision: the
//!   module, because Lua has no cheap way to read or add `f32`s (`accum`
//!   in Lua runs at about a fifth of the servers' `SET` rate, natively at
//!   about their `SET` rate); the scripts, so that a plain Redis (or a
//!   managed one that loads no modules) works too. A node restarted
//!   without the module refuses the commands (an error, nothing applied)
//!   until it has it again or the variable is reopened. The optimizers'
//!   read-modify-write ([`update_rows`](RedisVariable::update_rows)) is
//!   optimistic: read the rows with their versions, run the optimizer's
//!   kernel here, write back only the rows whose version is unchanged,
//!   retry the others (see [`update`]).
//! - **Every write runs at most once, so lost replies are resent**: each
//!   bucket write carries a random write id and records its reply on the
//!   server (a key beside the bucket, expiring after
//!   [`RedisConfig::record_ttl`]); a second run of it returns that reply
//!   and changes nothing. So a write whose reply was lost (a timeout, a
//!   broken connection) is sent again by the crate itself, on a new
//!   connection, and applied once: `accum` and optimizer steps included.
//!   `update_rows`' write-back also knows its own rows by their new
//!   versions.
//! - **Failures**: a node that is down, silent or refusing is an
//!   [`Error::Backend`](dynemb::Error::Backend) with a
//!   [`BackendErrorKind`](dynemb::BackendErrorKind), within one deadline
//!   per batch ([`RedisConfig::batch_deadline`], twice the command
//!   timeout, counted from the start of the call for the calls of one
//!   batch); a failed connection is dropped and the next batch
//!   reconnects. After such a failure a write may have been applied on
//!   some nodes (each command once, each row whole) and not on others.
//! - **Checkpoints** ([`RedisVariable::save`], `restore`, `load`) use the
//!   local format through [`dynemb::checkpoint::save_rows`] and
//!   [`dynemb::checkpoint::Reader`]. A restore marks the variable while it
//!   runs (reads are errors, never a mix of old and new rows), and one
//!   that stopped part-way is finished by running it again.
//! - **Whole-table operations** (`size`, `clear`, `restrict`,
//!   `export_chunks`, `save`, `restore`) run in round trips of a bounded
//!   number of buckets or rows, and hold one round trip's rows here, not
//!   the table's; a bucket is read whole, so the bucket count bounds a
//!   round trip from below (see [`RedisConfig::buckets`] for how to
//!   choose it). `restrict` reads only scores (8 bytes a row) and prunes
//!   on the servers.
//!
//! Modules, each owning one thing:
//! - [`config`]: servers, timeouts, password, buckets, prefix;
//! - `node`: one server and its connection pool (reconnects, timeouts);
//! - `cluster`: the slot map and one pipelined round trip per node per
//!   batch, all nodes at once, with redirections followed;
//! - `layout`: keys, buckets and the bytes of a row (the storage format);
//! - `meta`: the variable's metadata, checked when opening;
//! - `scripts`: the Lua scripts that make writes atomic on the server, and
//!   their module twins;
//! - `scan`: whole-table passes in bounded round trips (export, save's
//!   reading, `restrict`);
//! - `variable`, `slots`, [`update`], `checkpoint`, `store`: the
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
pub use variable::RedisVariable;
