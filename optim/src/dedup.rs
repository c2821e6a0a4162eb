//! Summing the gradients of a batch's repeated keys.
//!
//! A batch of ids usually repeats some (popular items, a user's history),
//! and a step must update each row once with the sum of its gradients, as
//! TensorFlow's sparse optimizers do (`_deduplicate_indexed_slices`). The
//! dedup is a flat open-addressing table of `u32` positions sized to the
//! batch (a power of two at least twice the batch), allocated once per
//! batch: no allocation per key, one multiply-shift hash and usually one
//! probe per key. Keys come out in order of first appearance, and each
//! key's gradients are summed in batch order (as TensorFlow's
//! `unsorted_segment_sum` does on a CPU).

use dynemb::{Error, Key, Result};

/// A batch's distinct keys, in order of first appearance, and per key the
/// sum of its gradient rows.
#[derive(Debug, Clone, PartialEq)]
pub struct Deduped<K> {
    /// Distinct keys.
    pub keys: Vec<K>,
    /// Per distinct key, the batch position of its first occurrence.
    pub first: Vec<u32>,
    /// `keys.len() * dim` values: row `i` is the sum of `keys[i]`'s rows.
    pub grads: Vec<f32>,
}

const EMPTY: u32 = u32::MAX;

/// Deduplicates `keys`, summing their `dim`-value rows of `grads` (whose
/// length the caller has checked).
pub fn dedup<K: Key>(keys: &[K], grads: &[f32], dim: usize) -> Result<Deduped<K>> {
    if keys.len() >= EMPTY as usize {
        return Err(Error::InvalidArgument(format!(
            "a batch holds at most {} keys, got {}",
            EMPTY - 1,
            keys.len()
        )));
    }
    let capacity = (keys.len() * 2).next_power_of_two().max(16);
    let shift = 64 - capacity.trailing_zeros();
    let mask = capacity - 1;
    let mut table = vec![EMPTY; capacity];
    let mut unique: Vec<K> = Vec::with_capacity(keys.len());
    let mut first: Vec<u32> = Vec::with_capacity(keys.len());
    let mut sums: Vec<f32> = Vec::with_capacity(grads.len());
    for (i, &key) in keys.iter().enumerate() {
        let bits = key.to_bits();
        let mut slot = (bits.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> shift) as usize;
        let row = &grads[i * dim..(i + 1) * dim];
        loop {
            match table[slot] {
                EMPTY => {
                    table[slot] = unique.len() as u32;
                    unique.push(key);
                    first.push(i as u32);
                    sums.extend_from_slice(row);
                    break;
                }
                at if unique[at as usize] == key => {
                    let at = at as usize;
                    for (sum, g) in sums[at * dim..(at + 1) * dim].iter_mut().zip(row) {
                        *sum += g;
                    }
                    break;
                }
                _ => slot = (slot + 1) & mask,
            }
        }
    }
    Ok(Deduped {
        keys: unique,
        first,
        grads: sums,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn repeated_keys_sum_in_batch_order_and_keep_first_appearance_order() {
        let keys = [5_i64, -1, 5, 0, -1, 5, i64::MIN];
        let grads: Vec<f32> = (0..keys.len() * 2).map(|i| i as f32).collect();
        let d = dedup(&keys, &grads, 2).unwrap();
        assert_eq!(d.keys, [5, -1, 0, i64::MIN]);
        assert_eq!(d.first, [0, 1, 3, 6]);
        assert_eq!(
            d.grads,
            [
                0.0 + 4.0 + 10.0,
                1.0 + 5.0 + 11.0,
                2.0 + 8.0,
                3.0 + 9.0,
                6.0,
                7.0,
                12.0,
                13.0
            ]
        );
    }

    #[test]
    fn matches_a_hashmap_on_many_colliding_keys() {
        let keys: Vec<u64> = (0..5_000u64).map(|i| (i % 777) << 40).collect();
        let grads: Vec<f32> = (0..keys.len()).map(|i| (i % 3) as f32).collect();
        let d = dedup(&keys, &grads, 1).unwrap();
        let mut model: HashMap<u64, f32> = HashMap::new();
        for (k, g) in keys.iter().zip(&grads) {
            *model.entry(*k).or_default() += g;
        }
        assert_eq!(d.keys.len(), model.len());
        for (k, g) in d.keys.iter().zip(&d.grads) {
            assert_eq!(model[k], *g);
        }
    }

    #[test]
    fn empty_batch() {
        let d = dedup::<i32>(&[], &[], 4).unwrap();
        assert!(d.keys.is_empty() && d.grads.is_empty());
    }
}
