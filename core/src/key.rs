//! Key types a [`Variable`](crate::Variable) can be indexed by.
//!
//! Keys are stored as their 64-bit pattern: `i64` and `u64` as they are,
//! `i32` sign-extended and `u32` zero-extended. The mapping is lossless and
//! reversible, so every value of every key type is a legal key (0, `MAX`,
//! negative values included) and export gives back exactly what was inserted.

/// A feature id type. Implemented for `i64`, `u64`, `i32` and `u32`.
pub trait Key:
    Copy + Eq + std::hash::Hash + Send + Sync + std::fmt::Debug + 'static + sealed::Sealed
{
    /// Name of the type, as written in checkpoints and error messages.
    const TYPE_NAME: &'static str;
    /// The key's 64-bit pattern (sign-extended for signed types).
    fn to_bits(self) -> u64;
    /// Inverse of [`Key::to_bits`] for bits produced by it.
    fn from_bits(bits: u64) -> Self;
    /// Floor modulo of the key's value by `n` (`rem_euclid`): the default
    /// partitioner. `n == 0` gives 0 rather than dividing by zero (there is
    /// no shard to pick; [`Partitioner::shard_of`](crate::Partitioner::shard_of)
    /// refuses zero shards).
    fn floor_mod(self, n: usize) -> usize;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for i64 {}
    impl Sealed for u64 {}
    impl Sealed for i32 {}
    impl Sealed for u32 {}
}

macro_rules! signed_key {
    ($t:ty, $name:literal) => {
        impl Key for $t {
            const TYPE_NAME: &'static str = $name;
            #[inline]
            fn to_bits(self) -> u64 {
                self as i64 as u64
            }
            #[inline]
            fn from_bits(bits: u64) -> Self {
                bits as i64 as $t
            }
            #[inline]
            fn floor_mod(self, n: usize) -> usize {
                (self as i128).checked_rem_euclid(n as i128).unwrap_or(0) as usize
            }
        }
    };
}

macro_rules! unsigned_key {
    ($t:ty, $name:literal) => {
        impl Key for $t {
            const TYPE_NAME: &'static str = $name;
            #[inline]
            fn to_bits(self) -> u64 {
                self as u64
            }
            #[inline]
            fn from_bits(bits: u64) -> Self {
                bits as $t
            }
            #[inline]
            fn floor_mod(self, n: usize) -> usize {
                (self as u64).checked_rem(n as u64).unwrap_or(0) as usize
            }
        }
    };
}

signed_key!(i64, "i64");
signed_key!(i32, "i32");
unsigned_key!(u64, "u64");
unsigned_key!(u32, "u32");

#[cfg(test)]
mod tests {
    use super::Key;

    #[test]
    fn bits_round_trip_at_the_edges() {
        for k in [0i64, -1, i64::MIN, i64::MAX, 42] {
            assert_eq!(i64::from_bits(k.to_bits()), k);
        }
        for k in [0i32, -1, i32::MIN, i32::MAX] {
            assert_eq!(i32::from_bits(k.to_bits()), k);
            assert_eq!(k.to_bits(), k as i64 as u64);
        }
        for k in [0u64, u64::MAX, 1 << 63] {
            assert_eq!(u64::from_bits(k.to_bits()), k);
        }
        for k in [0u32, u32::MAX] {
            assert_eq!(u32::from_bits(k.to_bits()), k);
            assert_eq!(k.to_bits(), k as u64);
        }
    }

    #[test]
    fn floor_mod_is_euclidean() {
        assert_eq!((-1i64).floor_mod(3), 2);
        assert_eq!((-3i64).floor_mod(3), 0);
        assert_eq!(
            i64::MIN.floor_mod(7),
            (i64::MIN as i128).rem_euclid(7) as usize
        );
        assert_eq!((-7i32).floor_mod(4), 1);
        assert_eq!(u64::MAX.floor_mod(10), (u64::MAX % 10) as usize);
        assert_eq!(7u32.floor_mod(4), 3);
        assert_eq!((-7i64).floor_mod(0), 0, "no shards: no division by zero");
        assert_eq!(7u64.floor_mod(0), 0);
    }
}
