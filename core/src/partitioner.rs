//! Which shard a key lives in.
//!
//! The default, [`Partitioner::Modulo`], is TFRA's: the floor modulo of the
//! key's value by the shard count (`rem_euclid`, so `-1` goes to the last
//! shard), the same on every build and platform. A [`Partitioner::Custom`]
//! function receives the key's 64-bit pattern (signed keys sign-extended) and
//! the shard count, for every key of every call, one shard included; a
//! shard it returns outside `0..shards` makes the whole call fail with
//! [`Error::UnknownShard`] before anything changes. Zero
//! shards is an [`Error::InvalidArgument`] (a variable always has at least
//! one), and a custom function is not called with it.

use crate::{Error, Key, Result};
use std::sync::Arc;

/// A custom partition function: `(key bits, shards) -> shard`.
pub type PartitionFn = dyn Fn(u64, usize) -> usize + Send + Sync;

/// How keys are spread over a variable's shards.
#[derive(Clone, Default)]
pub enum Partitioner {
    /// Floor modulo of the key value by the number of shards (the default).
    #[default]
    Modulo,
    /// A user function of (key bits, shards).
    Custom(Arc<PartitionFn>),
}

impl std::fmt::Debug for Partitioner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Partitioner::Modulo => f.write_str("Modulo"),
            Partitioner::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

impl Partitioner {
    /// The shard of `key` among `shards`: [`Error::UnknownShard`] if a custom
    /// function returns one outside `0..shards`, [`Error::InvalidArgument`]
    /// if `shards` is 0.
    #[inline]
    pub fn shard_of<K: Key>(&self, key: K, shards: usize) -> Result<usize> {
        if shards == 0 {
            return Err(Error::InvalidArgument(
                "a key cannot be partitioned over 0 shards".into(),
            ));
        }
        let shard = match self {
            Partitioner::Modulo => key.floor_mod(shards),
            Partitioner::Custom(f) => f(key.to_bits(), shards),
        };
        if shard < shards {
            Ok(shard)
        } else {
            Err(Error::UnknownShard { shard, shards })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modulo_is_floor_modulo_of_the_value() {
        let p = Partitioner::Modulo;
        assert_eq!(p.shard_of(-1i64, 3), Ok(2));
        assert_eq!(p.shard_of(7u64, 3), Ok(1));
        assert_eq!(p.shard_of(-4i32, 4), Ok(0));
        assert_eq!(p.shard_of(u32::MAX, 2), Ok(1));
    }

    #[test]
    fn custom_partitions_and_out_of_range_is_an_error() {
        let p = Partitioner::Custom(Arc::new(|bits, n| (bits as usize >> 1) % n));
        assert_eq!(p.shard_of(6u64, 4), Ok(3));
        let bad = Partitioner::Custom(Arc::new(|_, n| n));
        assert_eq!(
            bad.shard_of(1u64, 2),
            Err(Error::UnknownShard {
                shard: 2,
                shards: 2
            })
        );
        assert_eq!(format!("{bad:?}"), "Custom(..)");
    }
}
