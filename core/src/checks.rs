//! The input checks every table runs before it changes anything, in one
//! place for every storage (a local [`Variable`](crate::Variable), the Redis
//! backend, a storage of your own implementing
//! [`EmbeddingTable`](crate::EmbeddingTable)): each returns the typed
//! [`Error`] a caller can match on, naming the argument.

use crate::raw::kernels::first_non_finite;
use crate::{Error, Result, SlotId, MAX_SLOTS};

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

/// `Ok` if `slot` is a column of the table whose
/// [`store_id`](crate::EmbeddingStore::store_id) is `store_id` (called
/// `name`), else [`Error::InvalidArgument`].
pub fn check_slot(store_id: u64, name: &str, slot: SlotId) -> Result<()> {
    if slot.store_id() == store_id {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "slot {} belongs to another variable than {name:?}",
            slot.index()
        )))
    }
}

/// `Ok` if every slot of `slots` is a column of the table `store_id`
/// (called `name`; see [`check_slot`]), below [`MAX_SLOTS`], and listed
/// once, as an `update_rows` call needs them; else
/// [`Error::InvalidArgument`].
pub fn check_slot_list(store_id: u64, name: &str, slots: &[SlotId]) -> Result<()> {
    let mut seen = [false; MAX_SLOTS];
    for &slot in slots {
        check_slot(store_id, name, slot)?;
        let listed = seen.get_mut(slot.index()).ok_or_else(|| {
            Error::InvalidArgument(format!("variable {name:?} has no slot {}", slot.index()))
        })?;
        if std::mem::replace(listed, true) {
            return Err(Error::InvalidArgument(format!(
                "slot {} is given more than once",
                slot.index()
            )));
        }
    }
    Ok(())
}
