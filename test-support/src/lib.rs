//! # dynemb-test-support — what the tests of several dynemb crates share
//!
//! This crate owns the test code that more than one crate runs, so that
//! none of it is included by path or copied: the model-based contract of
//! an embedding table ([`contract`]), generic over
//! [`dynemb::EmbeddingTable`] and run on every storage; real Redis servers
//! for the tests that need them ([`servers`], feature `redis`); and the
//! one rule for a test that cannot run here ([`skip`]): it says so loudly
//! and passes, unless `DYNEMB_REQUIRE_ALL_TESTS=1` makes it fail.
//!
//! It is a dev-dependency only (`publish = false`).
#![warn(missing_docs)]

pub mod contract;
#[cfg(feature = "redis")]
pub mod servers;
pub mod skip;
