//! # dynemb-test-support — what the tests of several dynemb crates share
//!
//! This crate owns the test code that more than one crate runs, so that
//! none of it is included by path or copied: the model-based contract of
//! an embedding table ([`contract`]), generic over
//! [`dynemb::EmbeddingTable`] and run on every storage; the optimizers'
//! TensorFlow goldens ([`goldens`]); real Redis servers
//! for the tests that need them ([`servers`], feature `redis`); and the
//! one rule for a test that cannot run here ([`skip`]): it says so loudly
//! and passes, unless `DYNEMB_REQUIRE_ALL_TESTS=1` makes it fail.
//!
//! It is a dev-dependency only (`publish = false`).
#![warn(missing_docs)]

pub mod contract;
pub mod goldens;
#[cfg(feature = "redis")]
pub mod servers;
pub mod skip;

/// Whether each of `keys` is in `var` (`lookup_with_exists`, which counts
/// nothing and moves no score).
///
/// # Panics
/// If the lookup fails.
pub fn present<K: dynemb::Key>(var: &dynemb::Variable<K>, keys: &[K]) -> Vec<bool> {
    let mut out = vec![0.0; keys.len() * var.dim()];
    let mut exists = vec![false; keys.len()];
    var.lookup_with_exists(keys, &mut out, &mut exists)
        .expect("lookup_with_exists");
    exists
}
