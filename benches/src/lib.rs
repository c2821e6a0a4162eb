//! # dynemb-benches: dynemb against its peers and the physical limit
//!
//! This crate holds the `compare` binary and the criterion benches of
//! `dynemb`. The binary runs one workload on every system, one system after
//! another in one process (each is dropped, and the allocator's free memory
//! returned to the OS, before the next is built), and prints keys/s per
//! system with the ratios dynemb / best peer and dynemb / dense reference:
//!
//! ```text
//! cargo run --release -p dynemb-benches --bin compare -- [--keys N] [--dim D[,D..]]
//!     [--threads T[,T..]] [--batch B] [--json FILE] [--quick] [--systems S[,S..]]
//!     [--ops O[,O..]] [--repeats R]
//! ```
//!
//! The systems (see [`systems`]): dynemb through its public batched API;
//! `dashmap`, `papaya` and `scc` used per key as their documentation
//! recommends; `hashbrown` behind one `RwLock` taken once per batch; and a
//! dense reference, the same rows in one huge-page array addressed by a
//! precomputed row index: what the operation costs with no hashing at all.
//! It also times optimizer steps (`dynemb-optim`'s `apply` of SGD, Adagrad
//! and Adam) on dynemb, the dense reference, dashmap, papaya and scc.
//!
//! Modules, each owning one thing:
//! - [`workload`]: keys, picks (uniform, Zipf), miss keys, row values;
//! - [`systems`]: the [`systems::Store`] trait and one adapter per system;
//! - [`apply`]: optimizer steps, the [`apply::Trainer`] trait and one
//!   adapter per system;
//! - [`harness`]: running an op over batches on T threads, medians, RSS;
//! - [`suite`]: which ops run on which system, in which order;
//! - [`resize`]: a reader's batch latency while a writer grows the table;
//! - [`checkpoint`]: dynemb's save and restore throughput and memory;
//! - [`redis`]: `dynemb-redis` on a local Redis Cluster against a per-key
//!   client and `redis-benchmark` (`--ops redis`);
//! - [`targets`]: the issue's targets, checked against the measured figures;
//! - [`report`]: the figures as tables and as JSON;
//! - [`cli`]: the `compare` binary's flags.
//!
//! The `train` binary ([`train`]) times training steps of dynemb's candle
//! layers against the hashing trick with candle-nn, stage by stage.

pub mod apply;
pub mod checkpoint;
pub mod cli;
pub mod harness;
pub mod redis;
pub mod report;
pub mod resize;
pub mod suite;
pub mod systems;
pub mod targets;
pub mod train;
pub mod workload;
