//! The parts of the `soak` binary; `src/bin/soak.rs` documents what it
//! checks and why each invariant holds.
//!
//! - [`cli`]: the flags and the [`cli::Options`] they make;
//! - [`rows`]: how keys map to ids, how every row encodes a checkable state,
//!   and the checks themselves;
//! - [`stats`]: operation counters, resize inference, progress and summary;
//! - [`shared`]: what the threads share (variables, ledger, flags, locks);
//! - [`worker`]: the training-like mixed load of one thread;
//! - [`checkpoints`]: save, restore and load rounds, each checked;
//! - [`server`]: restores of the checkpoints while they are being saved;
//! - [`audit`]: whole-table checks while every worker is paused.

pub mod audit;
pub mod checkpoints;
pub mod cli;
pub mod rows;
pub mod server;
pub mod shared;
pub mod stats;
pub mod worker;
