//! [`Ids`]: the ids of a lookup and the shape they came in, from a slice of
//! keys or from a candle tensor.
//!
//! Tensor ids may be `i64`, `u32` or `i32`, of any rank (a scalar is one
//! id); every other dtype is an [`Error::InvalidInput`]. Conversion to the
//! table's key type keeps the value, and a value the key type cannot hold
//! (a negative id for `u32` or `u64` keys, an `i64` beyond `i32`'s range
//! for `i32` keys, ...) is an error naming its position, with one
//! exception: candle has no `u64` dtype, so an `i64` tensor feeding `u64`
//! keys is read as the ids' 64-bit patterns (`-1_i64` is `u64::MAX`), which
//! is how hashed 64-bit ids travel in candle.
//!
//! A shape whose lookup output could not be laid out (the product of its
//! non-zero dimensions times the widest row overflowing) is an error too,
//! even when it holds no ids.

use candle_core::{CpuStorage, Storage, Tensor};
use dynemb::Key;

use crate::{Error, Result};

/// A key type ids can be converted to from a tensor's elements; see the
/// [module docs](self) for the rules. Implemented for dynemb's key types.
pub trait IdKey: Key {
    /// The key for an id of an `i64` tensor, if it can hold it (`u64`
    /// keys take the id's 64-bit pattern).
    fn from_i64(id: i64) -> Option<Self>;

    /// The key whose value is `id` (an id of a `u32` or `i32` tensor,
    /// widened), if the key type can hold that value.
    fn from_value(id: i64) -> Option<Self> {
        Self::from_i64(id)
    }
}

impl IdKey for i64 {
    fn from_i64(id: i64) -> Option<Self> {
        Some(id)
    }
}

impl IdKey for u64 {
    fn from_i64(id: i64) -> Option<Self> {
        Some(id as u64)
    }

    fn from_value(id: i64) -> Option<Self> {
        u64::try_from(id).ok()
    }
}

impl IdKey for i32 {
    fn from_i64(id: i64) -> Option<Self> {
        i32::try_from(id).ok()
    }
}

impl IdKey for u32 {
    fn from_i64(id: i64) -> Option<Self> {
        u32::try_from(id).ok()
    }
}

/// Checks that a lookup's output over `shape` (`shape + [dim]`, any dim up
/// to [`dynemb::MAX_DIM`]) can be laid out: the product of its non-zero
/// dimensions, in `f32` bytes, fits an `isize` (a shape such as
/// `[0, usize::MAX]` holds no ids but has no strides). An
/// [`Error::InvalidInput`] naming `what` otherwise.
pub(crate) fn check_shape(what: &str, shape: &[usize]) -> Result<()> {
    let limit = isize::MAX as usize / std::mem::size_of::<f32>() / dynemb::MAX_DIM;
    shape
        .iter()
        .filter(|&&d| d != 0)
        .try_fold(1_usize, |n, &d| n.checked_mul(d).filter(|&n| n <= limit))
        .map(|_| ())
        .ok_or_else(|| Error::invalid(format!("{what}: shape {shape:?} is too large")))
}

/// Keys in a shape: `keys.len()` is the product of `shape` (a scalar has
/// shape `[]` and one key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ids<K> {
    keys: Vec<K>,
    shape: Vec<usize>,
}

impl<K: IdKey> Ids<K> {
    /// Keys in this shape; an [`Error::InvalidInput`] if the shape's
    /// product is not `keys.len()`.
    pub fn new(keys: Vec<K>, shape: &[usize]) -> Result<Self> {
        check_shape("ids", shape)?;
        let expected = shape
            .iter()
            .try_fold(1usize, |n, &d| n.checked_mul(d))
            .ok_or_else(|| Error::invalid(format!("ids shape {shape:?} overflows")))?;
        if expected != keys.len() {
            return Err(Error::invalid(format!(
                "ids shape {shape:?} holds {expected} ids, got {}",
                keys.len()
            )));
        }
        Ok(Ids {
            keys,
            shape: shape.to_vec(),
        })
    }

    /// A rank-1 batch of these keys.
    pub fn from_slice(keys: &[K]) -> Self {
        Ids {
            keys: keys.to_vec(),
            shape: vec![keys.len()],
        }
    }

    /// The ids of an `i64`, `u32` or `i32` tensor of any rank, converted as
    /// the [module docs](self) say.
    pub fn from_tensor(ids: &Tensor) -> Result<Self> {
        check_shape("ids", ids.dims())?;
        // Read in place: a contiguous tensor on the CPU (the usual case) as
        // it is, anything else after one copy into that form.
        let flat = ids
            .flatten_all()?
            .to_device(&candle_core::Device::Cpu)?
            .contiguous()?;
        let (storage, layout) = flat.storage_and_layout();
        let (start, end) = layout.contiguous_offsets().ok_or_else(|| {
            Error::invalid("ids: a contiguous tensor is not laid out contiguously")
        })?;
        let keys = match &*storage {
            Storage::Cpu(CpuStorage::I64(v)) => convert_all(&v[start..end], K::from_i64)?,
            Storage::Cpu(CpuStorage::U32(v)) => {
                convert_all(&v[start..end], |id: u32| K::from_value(i64::from(id)))?
            }
            Storage::Cpu(CpuStorage::I32(v)) => {
                convert_all(&v[start..end], |id: i32| K::from_value(i64::from(id)))?
            }
            _ => {
                return Err(Error::invalid(format!(
                    "ids must be i64, u32 or i32, got {:?}",
                    ids.dtype()
                )))
            }
        };
        Ok(Ids {
            keys,
            shape: ids.dims().to_vec(),
        })
    }

    /// The keys, in row-major order.
    pub fn keys(&self) -> &[K] {
        &self.keys
    }

    /// The shape the keys came in.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// How many ids.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether there are no ids.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The shape of a lookup's output: the ids' shape followed by `dim`.
    pub fn output_shape(&self, dim: usize) -> Vec<usize> {
        let mut shape = self.shape.clone();
        shape.push(dim);
        shape
    }
}

impl<K: IdKey> From<&[K]> for Ids<K> {
    fn from(keys: &[K]) -> Self {
        Ids::from_slice(keys)
    }
}

impl<K: IdKey, const N: usize> From<&[K; N]> for Ids<K> {
    fn from(keys: &[K; N]) -> Self {
        Ids::from_slice(keys)
    }
}

impl<K: IdKey> From<Vec<K>> for Ids<K> {
    fn from(keys: Vec<K>) -> Self {
        let shape = vec![keys.len()];
        Ids { keys, shape }
    }
}

/// The keys of `ids` converted one by one (i64 ids carry u64 keys' bit
/// patterns, narrower ids their values); an error naming the first id that
/// does not fit `K`.
fn convert_all<T, K>(ids: &[T], convert: impl Fn(T) -> Option<K>) -> Result<Vec<K>>
where
    T: Copy + Into<i64>,
    K: IdKey,
{
    let mut keys = Vec::new();
    keys.try_reserve_exact(ids.len())
        .map_err(|e| Error::invalid(format!("{} ids: {e}", ids.len())))?;
    for (i, &id) in ids.iter().enumerate() {
        match convert(id) {
            Some(key) => keys.push(key),
            None => {
                return Err(Error::invalid(format!(
                    "id {} at position {i} does not fit the table's {} keys",
                    id.into(),
                    K::TYPE_NAME
                )))
            }
        }
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn tensors_of_every_id_dtype_and_rank() {
        let dev = Device::Cpu;
        let t = Tensor::new(&[[1_i64, -2], [3, 4]], &dev).unwrap();
        let ids = Ids::<i64>::from_tensor(&t).unwrap();
        assert_eq!(ids.keys(), &[1, -2, 3, 4]);
        assert_eq!(ids.shape(), &[2, 2]);
        assert_eq!(ids.output_shape(8), vec![2, 2, 8]);

        let t = Tensor::new(&[[[7_u32]], [[9]]], &dev).unwrap();
        let ids = Ids::<u64>::from_tensor(&t).unwrap();
        assert_eq!(ids.keys(), &[7, 9]);
        assert_eq!(ids.shape(), &[2, 1, 1]);

        let t = Tensor::new(-5_i32, &dev).unwrap();
        let ids = Ids::<i64>::from_tensor(&t).unwrap();
        assert_eq!(ids.keys(), &[-5]);
        assert!(ids.shape().is_empty());

        // Views: read in their own row-major order, in place or copied.
        let t = Tensor::new(&[[1_i64, 2, 3], [4, 5, 6]], &dev).unwrap();
        let ids = Ids::<i64>::from_tensor(&t.t().unwrap()).unwrap();
        assert_eq!(ids.keys(), &[1, 4, 2, 5, 3, 6]);
        assert_eq!(ids.shape(), &[3, 2]);
        let ids = Ids::<i64>::from_tensor(&t.narrow(0, 1, 1).unwrap()).unwrap();
        assert_eq!(ids.keys(), &[4, 5, 6]);
        let t = Tensor::new(&[[1_u32, 2], [3, 4]], &dev).unwrap();
        let ids = Ids::<i32>::from_tensor(&t.t().unwrap()).unwrap();
        assert_eq!(ids.keys(), &[1, 3, 2, 4]);
    }

    #[test]
    fn i64_ids_carry_u64_bit_patterns_and_narrower_ids_their_values() {
        let t = Tensor::new(&[-1_i64, 5], &Device::Cpu).unwrap();
        let ids = Ids::<u64>::from_tensor(&t).unwrap();
        assert_eq!(ids.keys(), &[u64::MAX, 5]);
        let t = Tensor::new(&[5_i32, -1], &Device::Cpu).unwrap();
        let err = Ids::<u64>::from_tensor(&t).unwrap_err().to_string();
        assert!(err.contains("position 1"), "{err}");
        let t = Tensor::new(&[u32::MAX], &Device::Cpu).unwrap();
        assert_eq!(Ids::<u64>::from_tensor(&t).unwrap().keys(), &[4294967295]);
    }

    #[test]
    fn shapes_whose_output_cannot_be_laid_out_are_errors() {
        assert!(Ids::<i64>::new(vec![], &[0, usize::MAX]).is_err());
        assert!(Ids::<i64>::new(vec![], &[0, 1 << 20]).is_ok());
        assert!(check_shape("x", &[3, 0, 1 << 40]).is_err());
        assert!(check_shape("x", &[]).is_ok());
    }

    #[test]
    fn out_of_range_ids_and_bad_dtypes_are_errors() {
        let dev = Device::Cpu;
        let t = Tensor::new(&[1_i64, -3], &dev).unwrap();
        let err = Ids::<u32>::from_tensor(&t).unwrap_err().to_string();
        assert!(err.contains("position 1"), "{err}");
        let t = Tensor::new(&[i64::MAX], &dev).unwrap();
        assert!(Ids::<i32>::from_tensor(&t).is_err());
        let t = Tensor::new(&[u32::MAX], &dev).unwrap();
        assert!(Ids::<i32>::from_tensor(&t).is_err());
        let t = Tensor::new(&[1.0_f32], &dev).unwrap();
        let err = Ids::<i64>::from_tensor(&t).unwrap_err().to_string();
        assert!(err.contains("F32"), "{err}");
    }

    #[test]
    fn shapes_must_hold_the_keys() {
        assert!(Ids::new(vec![1_i64, 2, 3], &[3, 1]).is_ok());
        assert!(Ids::new(vec![1_i64, 2, 3], &[2, 2]).is_err());
        assert!(Ids::new(vec![1_i64], &[]).is_ok());
        assert!(Ids::<i64>::new(vec![], &[usize::MAX, 2]).is_err());
        assert!(Ids::<i64>::new(vec![], &[4, 0]).is_ok());
    }
}
