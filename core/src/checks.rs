//! The input checks every table runs before it changes anything, in one
//! place for every storage (a local [`Variable`](crate::Variable), the Redis
//! backend, a storage of your own implementing
//! [`EmbeddingTable`](crate::EmbeddingTable)): each returns the typed
//! [`Error`] a caller can match on, naming the argument.

use crate::raw::kernels::first_non_finite;
use crate::{Dtype, Error, RestrictPolicy, Result, SlotId, MAX_SLOTS};

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

/// `Ok` if every value of `values` (called `what`) is finite and fits
/// `dtype` (see [`Dtype::fits`]), else [`Error::NonFinite`] or
/// [`Error::OutOfRange`] naming the first one that is not.
pub fn check_fits(what: &'static str, values: &[f32], dtype: Dtype) -> Result<()> {
    let Some(index) = dtype.first_unfit(values) else {
        return Ok(());
    };
    let value = values[index];
    Err(if value.is_finite() {
        Error::OutOfRange {
            what,
            index,
            value,
            dtype,
        }
    } else {
        Error::NonFinite { what, index, value }
    })
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

/// Checks a request to create the slot columns `slots` (name, initial
/// value) in the table called `table`, whose columns are `existing` (name,
/// initial value, in index order), as every storage's `create_slots`
/// checks it: each entry's existing index, or `None` if it is to be
/// created. An error if a name is empty or longer than
/// [`MAX_NAME_BYTES`](crate::MAX_NAME_BYTES), an existing slot's (or an
/// earlier entry's) initial value differs ([`slot_mismatch`]; `0.0` equals
/// `-0.0`), a new initial value is not finite, or the new columns do not
/// fit in [`MAX_SLOTS`] ([`slot_room_error`]).
pub fn plan_slots(
    table: &str,
    existing: &[(&str, f32)],
    slots: &[(&str, f32)],
) -> Result<Vec<Option<usize>>> {
    let mut planned = Vec::with_capacity(slots.len());
    let mut new: Vec<(&str, f32)> = Vec::new();
    for (i, &(name, initial)) in slots.iter().enumerate() {
        if name.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "variable {table:?}: a slot name must not be empty"
            )));
        }
        crate::check_name("slot name", name)?;
        if let Some(index) = existing.iter().position(|&(n, _)| n == name) {
            let was = existing[index].1;
            if was != initial {
                return Err(slot_mismatch(table, name, was, initial));
            }
            planned.push(Some(index));
            continue;
        }
        if !initial.is_finite() {
            return Err(Error::NonFinite {
                what: "slot initial value",
                index: i,
                value: initial,
            });
        }
        match new.iter().find(|&&(n, _)| n == name) {
            Some(&(_, earlier)) if earlier != initial => {
                return Err(slot_mismatch(table, name, earlier, initial))
            }
            Some(_) => {}
            None => new.push((name, initial)),
        }
        planned.push(None);
    }
    if existing.len() + new.len() > MAX_SLOTS {
        let names: Vec<&str> = new.iter().map(|&(n, _)| n).collect();
        return Err(slot_room_error(table, existing.len(), &names));
    }
    Ok(planned)
}

/// [`Error::Mismatch`] for the slot `name` of `table`, which starts at
/// `existing`, asked for again with another `initial` value.
pub fn slot_mismatch(table: &str, name: &str, existing: f32, initial: f32) -> Error {
    Error::Mismatch {
        name: format!("{table}/{name}"),
        existing: format!("slot with initial value {existing}"),
        requested: format!("initial value {initial}"),
    }
}

/// [`Error::InvalidArgument`] for the slots `new` that do not fit beside
/// the `existing` columns of `table` ([`MAX_SLOTS`] at most).
pub fn slot_room_error(table: &str, existing: usize, new: &[&str]) -> Error {
    Error::InvalidArgument(format!(
        "variable {table:?} has {existing} slot column(s); adding {new:?} would make {}, more than the {MAX_SLOTS} a variable may have",
        existing + new.len()
    ))
}

/// The restrict policy `policy` of the table `table`, or
/// [`Error::InvalidArgument`] if it has none (for `restrict`).
pub fn check_restrict_policy(
    table: &str,
    policy: Option<RestrictPolicy>,
) -> Result<RestrictPolicy> {
    policy.ok_or_else(|| {
        Error::InvalidArgument(format!(
            "variable {table:?} has no restrict policy (set one with VariableBuilder::restrict_policy)"
        ))
    })
}

/// The score below which `expire(older_than)` removes a row of the table
/// `table`: `now - older_than` on [`next_timestamp`](crate::restrict::next_timestamp)'s
/// clock (0, so nothing, for an age past the epoch), or
/// [`Error::InvalidArgument`] unless `policy` is
/// [`RestrictPolicy::Timestamp`].
pub fn expiry_cutoff(
    table: &str,
    policy: Option<RestrictPolicy>,
    older_than: std::time::Duration,
) -> Result<u64> {
    if policy != Some(RestrictPolicy::Timestamp) {
        return Err(Error::InvalidArgument(format!(
            "variable {table:?}: expire needs the Timestamp restrict policy, the variable has {}",
            policy.map_or("none", RestrictPolicy::name)
        )));
    }
    let age = u64::try_from(older_than.as_nanos()).unwrap_or(u64::MAX);
    Ok(crate::restrict::next_timestamp().saturating_sub(age))
}

/// `Ok` if an export's chunks may hold `rows_per_chunk` rows (at least 1),
/// else [`Error::InvalidArgument`].
pub fn check_rows_per_chunk(rows_per_chunk: usize) -> Result<()> {
    if rows_per_chunk == 0 {
        Err(Error::InvalidArgument(
            "rows_per_chunk must be at least 1".into(),
        ))
    } else {
        Ok(())
    }
}
