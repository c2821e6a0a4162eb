//! # dynemb-benches: dynemb against its peers and the physical limit
//!
//! This crate holds the `compare` and `train` binaries and the criterion
//! benches of `dynemb`; `README.md` beside it has the commands, the
//! workloads and the figures.
//!
//! `compare` runs one workload on every system, one system after another
//! in one process (each is dropped, and the allocator's free memory
//! returned to the OS, before the next is built), and prints keys/s per
//! system with the ratios dynemb / best peer, dynemb / dense reference and
//! dynemb / indirect dense reference, measured in the same run. `train` times training steps of dynemb's
//! candle layers against the hashing trick with candle-nn ([`train`]).
//!
//! Modules, each owning one thing:
//! - [`workload`]: keys, picks (uniform, Zipf), miss keys, row values;
//! - [`peers`]: the [`peers::Store`] trait and one module per system, with
//!   its adapters for the table ops and the optimizer steps;
//! - [`apply`]: optimizer steps: the [`apply::Trainer`] trait, the step
//!   driver the peers share, and the checks of their rows;
//! - [`harness`]: running an op over batches on T threads, medians, RSS;
//! - [`suite`]: which ops run on which system, in which order;
//! - [`resize`]: a reader's batch latency while a writer grows the table;
//! - [`checkpoint`]: dynemb's save and restore throughput and memory;
//! - [`bounded`]: a variable with a capacity on a Zipf training stream
//!   against moka and exact LRU and LFU, and its eviction quality
//!   (`--ops bounded`);
//! - [`redis`]: `dynemb-redis` on a local Redis Cluster against a per-key
//!   client and `redis-benchmark` (`--ops redis`);
//! - [`report`]: the figures and their ratios as tables and as JSON;
//! - [`cli`]: the `compare` binary's flags.

pub mod apply;
pub mod bounded;
pub mod checkpoint;
pub mod cli;
pub mod harness;
pub mod peers;
pub mod redis;
pub mod report;
pub mod resize;
pub mod suite;
pub mod train;
pub mod workload;
