//! Helpers shared by the fuzz targets: key tables with every key type's edge
//! values, and small-integer row values so that every sum the targets
//! compare is exact in `f32`.

use dynemb::Key;

/// Keys a target draws from: small enough that batches hit the same keys
/// again (duplicates, hits and misses), large enough to resize tables that
/// start with room for one row.
pub const KEYS: usize = 24;

/// A key type with a table of `KEYS` distinct keys, edge values first.
pub trait FuzzKey: Key + Ord + std::fmt::Display {
    /// The `i`-th key of the table (`i % KEYS`).
    fn nth(i: usize) -> Self;

    /// The key of a fuzzer byte.
    fn of(byte: u8) -> Self {
        Self::nth(byte as usize)
    }

    /// The keys of fuzzer bytes.
    fn batch(bytes: &[u8]) -> Vec<Self> {
        bytes.iter().map(|&b| Self::of(b)).collect()
    }
}

impl FuzzKey for i64 {
    fn nth(i: usize) -> Self {
        match i % KEYS {
            0 => 0,
            1 => -1,
            2 => i64::MIN,
            3 => i64::MAX,
            4 => 1,
            5 => i64::MIN + 1,
            i if i % 2 == 0 => i as i64 * 7919 - 100_000,
            i => (i as i64).wrapping_mul(-0x0123_4567_89AB_CDEF),
        }
    }
}

impl FuzzKey for u64 {
    fn nth(i: usize) -> Self {
        match i % KEYS {
            0 => 0,
            1 => u64::MAX,
            2 => 1 << 63,
            3 => u64::MAX - 1,
            4 => 1,
            5 => (1 << 63) - 1,
            i if i % 2 == 0 => i as u64 * 3,
            i => (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
        }
    }
}

impl FuzzKey for i32 {
    fn nth(i: usize) -> Self {
        match i % KEYS {
            0 => 0,
            1 => -1,
            2 => i32::MIN,
            3 => i32::MAX,
            4 => 1,
            5 => i32::MIN + 1,
            i if i % 2 == 0 => i as i32 * 7919 - 100_000,
            i => (i as i32).wrapping_mul(-0x0765_4321),
        }
    }
}

impl FuzzKey for u32 {
    fn nth(i: usize) -> Self {
        match i % KEYS {
            0 => 0,
            1 => u32::MAX,
            2 => 1 << 31,
            3 => u32::MAX - 1,
            4 => 1,
            5 => (1 << 31) - 1,
            i if i % 2 == 0 => i as u32 * 3,
            i => (i as u32).wrapping_mul(0x9E37_79B9),
        }
    }
}

/// A small integer in `[-8, 8]` for `(seed, row, column)`: row values and
/// deltas, exact in `f32` and in every sum of a few thousand of them.
pub fn small(seed: i8, r: usize, c: usize) -> f32 {
    ((seed as i64 + 5 * r as i64 + 3 * c as i64).rem_euclid(17) - 8) as f32
}

/// `dim` small integers for `(seed, row)`.
pub fn small_row(seed: i8, r: usize, dim: usize) -> Vec<f32> {
    (0..dim).map(|c| small(seed, r, c)).collect()
}

/// The row dims the targets use: 1, a few odd and even widths, and one
/// past a SIMD width.
pub const DIMS: [usize; 4] = [1, 3, 8, 17];

/// What one occurrence of a key in a `Variable::accum` batch does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccumEffect {
    /// Inserts the key with the delta as its row.
    Insert,
    /// Adds the delta to the row.
    Add,
    /// Nothing.
    Ignore,
}

/// The documented `bp_v2` rule, per occurrence in batch order: a key present
/// before the batch is added to where its flag says it exists and left
/// alone elsewhere; a key absent before the batch is inserted by its first
/// occurrence whose flag says it does not exist (earlier occurrences are
/// ignored) and every later occurrence is added ("a key the batch itself
/// inserted gets the later deltas added", whatever its flag).
pub fn accum_effects(
    keys: &[u64],
    exists: &[bool],
    present_before: impl Fn(u64) -> bool,
) -> Vec<AccumEffect> {
    let mut inserted = std::collections::HashSet::new();
    keys.iter()
        .zip(exists)
        .map(|(&k, &e)| {
            if present_before(k) {
                if e {
                    AccumEffect::Add
                } else {
                    AccumEffect::Ignore
                }
            } else if inserted.contains(&k) {
                AccumEffect::Add
            } else if !e {
                inserted.insert(k);
                AccumEffect::Insert
            } else {
                AccumEffect::Ignore
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn distinct<K: FuzzKey>() {
        let mut keys: Vec<K> = (0..KEYS).map(K::nth).collect();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), KEYS, "{}", K::TYPE_NAME);
    }

    #[test]
    fn key_tables_are_injective() {
        distinct::<i64>();
        distinct::<u64>();
        distinct::<i32>();
        distinct::<u32>();
    }
}
