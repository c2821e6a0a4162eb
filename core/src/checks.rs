//! The input checks every table runs before it changes anything, in one
//! place for every storage (a local [`Variable`](crate::Variable), the Redis
//! backend, a storage of your own implementing
//! [`EmbeddingTable`](crate::EmbeddingTable)): each returns the typed
//! [`Error`] a caller can match on, naming the argument.

use crate::raw::kernels::first_non_finite;
use crate::{Error, Result};

/// `Ok` if a buffer called `what` holds `expected` items, else
/// [`Error::LengthMismatch`].
pub fn check_len(what: &'static str, expected: usize, actual: usize) -> Result<()> {
    if expected == actual {
        Ok(())
    } else {
        Err(Error::LengthMismatch {
            what,
            expected,
            actual,
        })
    }
}

/// `keys * dim`, the length of a batch's row buffer, or
/// [`Error::InvalidArgument`] if it overflows.
pub fn batch_len(keys: usize, dim: usize) -> Result<usize> {
    keys.checked_mul(dim).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "a batch of {keys} rows of {dim} values is too large"
        ))
    })
}

/// `Ok` if every value of `values` (called `what`) is finite, else
/// [`Error::NonFinite`] naming the first one that is not (a vectorized
/// scan).
pub fn check_finite(what: &'static str, values: &[f32]) -> Result<()> {
    match first_non_finite(values) {
        None => Ok(()),
        Some(index) => Err(Error::NonFinite {
            what,
            index,
            value: values[index],
        }),
    }
}
