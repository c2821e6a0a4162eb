//! Moving rows between an [`EmbeddingStore`] and candle tensors with no
//! more copies than needed: the layers' reads and the step's gradient
//! reads.
//!
//! - [`read_rows`] and [`train_rows`] read rows into one `Vec<f32>` that
//!   becomes the tensor's storage as it is on the CPU (no copy); on
//!   another device it is copied there once ([`train_rows`]' `Var` then
//!   takes one more copy on the device, which candle requires to make a
//!   variable of a tensor). [`train_rows`] also says which keys admission
//!   left without a row ([`TrainRows::stored`]).
//! - [`with_f32_values`] lends a tensor's values as a slice: a contiguous
//!   `f32` tensor on the CPU (what candle's backward produces) is read in
//!   place, anything else is copied to the host first.
//!
//! Row tensors are `f32` of shape `[keys.len(), dim]`, row `i` holding
//! `keys[i]`'s values.

use std::sync::Arc;

use candle_core::op::BackpropOp;
use candle_core::{CpuStorage, DType, Device, Storage, Tensor, Var};
use dynemb::EmbeddingStore;

use crate::{parallel, Error, Result};

/// An empty buffer with room for `rows * dim` values; an error instead of
/// an abort when that is more than can be had.
pub(crate) fn reserved(rows: usize, dim: usize) -> Result<Vec<f32>> {
    let len = rows
        .checked_mul(dim)
        .ok_or_else(|| Error::invalid(format!("{rows} rows of {dim} values overflow")))?;
    let mut values = Vec::new();
    values
        .try_reserve_exact(len)
        .map_err(|e| Error::invalid(format!("{rows} rows of {dim} values: {e}")))?;
    Ok(values)
}

/// An error now, before a training read inserts or counts anything, if
/// the room for an output of `rows * dim` values cannot be had at this
/// check (it is asked of the host's allocator and given back; a later
/// allocation may still fail).
pub(crate) fn check_room(rows: usize, dim: usize) -> Result<()> {
    reserved(rows, dim).map(drop)
}

/// An empty vector with room for `len` elements, as [`reserved`] (`what`
/// names the buffer in the error).
pub(crate) fn with_room<T>(len: usize, what: &str) -> Result<Vec<T>> {
    let mut values = Vec::new();
    values
        .try_reserve_exact(len)
        .map_err(|e| Error::invalid(format!("{what} of {len} elements: {e}")))?;
    Ok(values)
}

/// `len` copies of `value`, as [`reserved`] (`what` names the buffer in
/// the error).
pub(crate) fn filled<T: Clone>(len: usize, value: T, what: &str) -> Result<Vec<T>> {
    let mut values = with_room(len, what)?;
    values.resize(len, value);
    Ok(values)
}

/// `rows * dim` zeros, as [`reserved`].
pub(crate) fn zeroed(rows: usize, dim: usize) -> Result<Vec<f32>> {
    let mut values = reserved(rows, dim)?;
    values.resize(rows * dim, 0.0);
    Ok(values)
}

/// The rows of `keys` as a tensor `[keys.len(), dim]` on `device`, read
/// with [`EmbeddingStore::lookup`] (split over candle's threads for large
/// batches: [`parallel::lookup`]): a missing key reads the initializer's
/// row and nothing is inserted.
pub fn read_rows<S: EmbeddingStore>(store: &S, keys: &[S::Key], device: &Device) -> Result<Tensor> {
    let dim = store.dim();
    let mut values = zeroed(keys.len(), dim)?;
    parallel::lookup(store, keys, &mut values)?;
    Ok(Tensor::from_vec(values, (keys.len(), dim), device)?)
}

/// The rows a training read returned ([`train_rows`]): the fresh variable
/// holding them, and which of the keys have a row in the store after the
/// read. A key admission has not admitted yet (see
/// [`dynemb::Admission`]) read the initializer's row and was not
/// inserted: the step drops its gradient, as the store would drop its
/// update.
#[derive(Debug, Clone)]
pub struct TrainRows {
    var: Var,
    /// Per key, whether it has a row; `None` when every key has.
    stored: Option<Arc<Vec<bool>>>,
}

impl TrainRows {
    /// Rows read by other means, every key stored: what
    /// [`Recorder::record`](crate::Recorder::record) takes for rows a
    /// caller read itself.
    pub fn from_var(var: Var) -> Self {
        TrainRows { var, stored: None }
    }

    /// The variable `[keys.len(), dim]` holding the rows.
    pub fn var(&self) -> &Var {
        &self.var
    }

    /// The rows as a tensor (the variable's).
    pub fn as_tensor(&self) -> &Tensor {
        self.var.as_tensor()
    }

    /// Per key, whether it has a row in the store after the read (false
    /// for a key not admitted yet); `None` when every key has one.
    pub fn stored(&self) -> Option<&[bool]> {
        self.stored.as_deref().map(Vec::as_slice)
    }

    /// The variable and the flags, for the record.
    pub(crate) fn into_parts(self) -> (Var, Option<Arc<Vec<bool>>>) {
        (self.var, self.stored)
    }
}

/// The rows of `keys` as a fresh variable `[keys.len(), dim]` on `device`,
/// read with [`EmbeddingStore::lookup_or_insert_with_exists`] (split over
/// candle's threads for large batches:
/// [`parallel::lookup_or_insert_with_exists`]): a missing key is inserted
/// with the initializer's row (the training read), unless admission has
/// not admitted it yet.
pub fn train_rows<S: EmbeddingStore>(
    store: &S,
    keys: &[S::Key],
    device: &Device,
) -> Result<TrainRows> {
    let dim = store.dim();
    let mut values = zeroed(keys.len(), dim)?;
    let mut stored = filled(keys.len(), true, "flags of stored keys")?;
    parallel::lookup_or_insert_with_exists(store, keys, &mut values, &mut stored)?;
    let shape = (keys.len(), dim);
    let tensor = match device {
        Device::Cpu => Tensor::from_storage(
            Storage::Cpu(CpuStorage::F32(values)),
            shape,
            BackpropOp::none(),
            true,
        ),
        _ => Tensor::from_vec(values, shape, device)?,
    };
    Ok(TrainRows {
        var: Var::from_tensor(&tensor)?,
        stored: stored.contains(&false).then(|| Arc::new(stored)),
    })
}

/// Runs `f` on the values of `tensor` in row-major order: in place for a
/// contiguous `f32` tensor on the CPU, else on a host copy converted to
/// `f32`.
pub fn with_f32_values<T>(tensor: &Tensor, f: impl FnOnce(&[f32]) -> Result<T>) -> Result<T> {
    {
        let (storage, layout) = tensor.storage_and_layout();
        if let (Storage::Cpu(CpuStorage::F32(values)), Some((start, end))) =
            (&*storage, layout.contiguous_offsets())
        {
            return f(&values[start..end]);
        }
    }
    let values = tensor
        .flatten_all()?
        .to_dtype(DType::F32)?
        .to_vec1::<f32>()?;
    f(&values)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::IndexOp;
    use dynemb::{Initializer, Variable};

    fn store() -> Variable<i64> {
        let var = Variable::builder("rows")
            .dim(2)
            .initializer(Initializer::Constant(0.5))
            .build()
            .unwrap();
        var.upsert(&[1], &[1.0, 2.0]).unwrap();
        var
    }

    #[test]
    fn reads_and_inserts_as_the_store_says() {
        let var = store();
        let t = read_rows(&var, &[1, 9], &Device::Cpu).unwrap();
        assert_eq!(t.to_vec2::<f32>().unwrap(), [[1.0, 2.0], [0.5, 0.5]]);
        assert_eq!(var.size(), 1);
        let v = train_rows(&var, &[9, 1], &Device::Cpu).unwrap();
        assert_eq!(
            v.as_tensor().to_vec2::<f32>().unwrap(),
            [[0.5, 0.5], [1.0, 2.0]]
        );
        assert_eq!(var.size(), 2);
        assert!(v.as_tensor().is_variable());
        assert_eq!(v.stored(), None, "every key has a row");
    }

    #[test]
    fn values_of_views_and_other_dtypes() {
        let t = Tensor::new(&[[1.0_f32, 2.0], [3.0, 4.0]], &Device::Cpu).unwrap();
        let sum = |t: &Tensor| with_f32_values(t, |v| Ok(v.to_vec())).unwrap();
        assert_eq!(sum(&t), [1.0, 2.0, 3.0, 4.0]);
        assert_eq!(sum(&t.i(1).unwrap()), [3.0, 4.0]);
        assert_eq!(sum(&t.t().unwrap()), [1.0, 3.0, 2.0, 4.0]);
        assert_eq!(sum(&t.to_dtype(DType::F64).unwrap()), [1.0, 2.0, 3.0, 4.0]);
    }
}
