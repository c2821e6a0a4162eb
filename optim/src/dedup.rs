//! Summing the gradients of a batch's repeated keys.
//!
//! A batch of ids usually repeats some (popular items, a user's history),
//! and a step must update each row once with the sum of its gradients, as
//! TensorFlow's sparse optimizers do (`_deduplicate_indexed_slices`). The
//! dedup is a flat open-addressing table of `u32` positions sized to the
//! batch (a power of two at least twice the batch), in buffers a
//! [`Dedup`] keeps between batches (the optimizers use one per thread): no
//! allocation per key, one multiply-shift hash and usually one probe per
//! key. Keys come out in order of first appearance, and each key's
//! gradients are summed in batch order (as TensorFlow's
//! `unsorted_segment_sum` does on a CPU). A batch without repeats is not
//! copied at all.

use std::borrow::Cow;
use std::cell::RefCell;

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

/// [`Deduped`] without copies: a batch with no repeated key is its own
/// deduplication, so its keys and gradients are borrowed as they are; a
/// batch with repeats borrows its sums from the [`Dedup`] that made it.
#[derive(Debug, Clone, PartialEq)]
pub struct DedupedRef<'a, K: Clone> {
    /// Distinct keys, in order of first appearance.
    pub keys: Cow<'a, [K]>,
    /// `keys.len() * dim` values: row `i` is the sum of `keys[i]`'s rows.
    pub grads: &'a [f32],
    /// Per distinct key, the batch position of its first occurrence
    /// (`None`: the batch had no repeats, so key `i` is at position
    /// `offset + i`).
    first: Option<&'a [u32]>,
    /// Where key 0 is in the batch when `first` is `None` (a
    /// [`part`](DedupedRef::part) of a batch without repeats).
    offset: usize,
}

impl<K: Clone> DedupedRef<'_, K> {
    /// The batch position of distinct key `i`'s first occurrence.
    pub fn first(&self, i: usize) -> usize {
        self.first
            .map_or(self.offset + i, |first| first[i] as usize)
    }

    /// The distinct keys `range` (of [`keys`](DedupedRef::keys)) and their
    /// gradient rows of `dim` values, still naming their positions in the
    /// whole batch ([`first`](DedupedRef::first)): a part of a
    /// deduplicated batch is deduplicated too, so parts can be updated at
    /// once without touching a row twice. `range` must lie within the keys.
    pub fn part(&self, range: std::ops::Range<usize>, dim: usize) -> DedupedRef<'_, K> {
        DedupedRef {
            keys: Cow::Borrowed(&self.keys[range.clone()]),
            grads: &self.grads[range.start * dim..range.end * dim],
            first: self.first.map(|first| &first[range.clone()]),
            offset: self.offset + range.start,
        }
    }

    /// An owned copy.
    pub fn to_owned(&self) -> Deduped<K> {
        Deduped {
            keys: self.keys.to_vec(),
            first: (0..self.keys.len()).map(|i| self.first(i) as u32).collect(),
            grads: self.grads.to_vec(),
        }
    }
}

const EMPTY: u32 = u32::MAX;

/// Buffers for deduplicating batches, kept between batches so that a
/// training loop allocates (and the kernel maps fresh pages) only when a
/// batch is larger than any before. They hold about `4 * batch` bytes of
/// positions and, for batches with repeats, `4 * distinct * dim` bytes of
/// sums.
#[derive(Debug, Default)]
pub struct Dedup {
    /// Open-addressing table of indices into the distinct keys.
    table: Vec<u32>,
    /// Per batch position, the index of its distinct key.
    distinct_of: Vec<u32>,
    /// Per distinct key, its first position.
    first: Vec<u32>,
    /// Summed gradient rows, when the batch has repeats.
    sums: Vec<f32>,
}

thread_local! {
    static SCRATCH: RefCell<Dedup> = RefCell::new(Dedup::default());
}

impl Dedup {
    /// Empty buffers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs `f` with this thread's buffers (a fresh [`Dedup`] if `f` runs
    /// inside another call of this on the same thread).
    pub fn with_thread_local<T>(f: impl FnOnce(&mut Dedup) -> T) -> T {
        SCRATCH.with(|scratch| match scratch.try_borrow_mut() {
            Ok(mut dedup) => f(&mut dedup),
            Err(_) => f(&mut Dedup::new()),
        })
    }

    /// Deduplicates `keys`, summing their `dim`-value rows of `grads`
    /// (`keys.len() * dim` values, [`Error::LengthMismatch`] otherwise):
    /// keys in order of first appearance, each key's rows summed in batch
    /// order.
    pub fn run<'a, K: Key>(
        &'a mut self,
        keys: &'a [K],
        grads: &'a [f32],
        dim: usize,
    ) -> Result<DedupedRef<'a, K>> {
        if keys.len() >= EMPTY as usize {
            return Err(Error::InvalidArgument(format!(
                "a batch holds at most {} keys, got {}",
                EMPTY - 1,
                keys.len()
            )));
        }
        check_grads_len(keys.len(), dim, grads)?;
        let distinct = self.index(keys);
        if distinct.len() == keys.len() {
            return Ok(DedupedRef {
                keys: Cow::Borrowed(keys),
                grads,
                first: None,
                offset: 0,
            });
        }
        self.sums.clear();
        self.sums.reserve(self.first.len() * dim);
        for (i, &at) in self.distinct_of.iter().enumerate() {
            let row = &grads[i * dim..(i + 1) * dim];
            let at = at as usize;
            if self.first[at] as usize == i {
                self.sums.extend_from_slice(row);
            } else {
                for (sum, g) in self.sums[at * dim..(at + 1) * dim].iter_mut().zip(row) {
                    *sum += g;
                }
            }
        }
        Ok(DedupedRef {
            keys: Cow::Owned(distinct),
            grads: &self.sums,
            first: Some(&self.first),
            offset: 0,
        })
    }

    /// Fills `distinct_of` and `first` for `keys` and returns the distinct
    /// keys: one multiply-shift hash and usually one probe per key.
    fn index<K: Key>(&mut self, keys: &[K]) -> Vec<K> {
        let capacity = (keys.len() * 2).next_power_of_two().max(16);
        let shift = 64 - capacity.trailing_zeros();
        let mask = capacity - 1;
        self.table.clear();
        self.table.resize(capacity, EMPTY);
        self.distinct_of.clear();
        self.first.clear();
        let mut distinct: Vec<K> = Vec::with_capacity(keys.len());
        for (i, &key) in keys.iter().enumerate() {
            let bits = key.to_bits();
            let mut slot = (bits.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> shift) as usize;
            let at = loop {
                match self.table[slot] {
                    EMPTY => {
                        let at = distinct.len() as u32;
                        self.table[slot] = at;
                        distinct.push(key);
                        self.first.push(i as u32);
                        break at;
                    }
                    at if distinct[at as usize] == key => break at,
                    _ => slot = (slot + 1) & mask,
                }
            };
            self.distinct_of.push(at);
        }
        distinct
    }
}

/// An error unless `grads` holds `rows * dim` values: an
/// [`Error::LengthMismatch`], or an [`Error::InvalidArgument`] where that
/// count overflows.
pub(crate) fn check_grads_len(rows: usize, dim: usize, grads: &[f32]) -> Result<()> {
    let expected = rows.checked_mul(dim).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "a batch of {rows} rows of {dim} values is too large"
        ))
    })?;
    if grads.len() != expected {
        return Err(Error::LengthMismatch {
            what: "grads",
            expected,
            actual: grads.len(),
        });
    }
    Ok(())
}

/// Deduplicates `keys`, summing their `dim`-value rows of `grads`
/// (`keys.len() * dim` values), into new vectors; [`Dedup::run`] does the
/// same without copying.
pub fn dedup<K: Key>(keys: &[K], grads: &[f32], dim: usize) -> Result<Deduped<K>> {
    Dedup::with_thread_local(|scratch| Ok(scratch.run(keys, grads, dim)?.to_owned()))
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
    fn parts_keep_the_positions_of_the_whole_batch() {
        let grads: Vec<f32> = (0..6).map(|i| i as f32).collect();
        let mut scratch = Dedup::new();
        // Without repeats: positions are offsets.
        let batch = scratch.run(&[5_u64, 6, 7], &grads[..3], 1).unwrap();
        let part = batch.part(1..3, 1);
        assert_eq!((&*part.keys, part.grads), (&[6_u64, 7][..], &grads[1..3]));
        assert_eq!((part.first(0), part.first(1)), (1, 2));
        // With repeats: positions are first occurrences.
        let batch = scratch.run(&[5_u64, 5, 6, 7, 6, 8], &grads, 1).unwrap();
        let part = batch.part(1..3, 1);
        assert_eq!(&*part.keys, &[6, 7]);
        assert_eq!(part.grads, &[2.0 + 4.0, 3.0]);
        assert_eq!((part.first(0), part.first(1)), (2, 3));
        assert_eq!(part.part(1..2, 1).first(0), 3);
    }

    #[test]
    fn empty_batch() {
        let d = dedup::<i32>(&[], &[], 4).unwrap();
        assert!(d.keys.is_empty() && d.grads.is_empty());
    }

    #[test]
    fn a_batch_without_repeats_is_borrowed_not_copied() {
        let keys = [3_u32, 1, 2];
        let grads = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let mut scratch = Dedup::new();
        let d = scratch.run(&keys, &grads, 2).unwrap();
        assert!(matches!(d.keys, Cow::Borrowed(_)));
        assert_eq!(d.grads.as_ptr(), grads.as_ptr());
        assert_eq!((d.first(0), d.first(2)), (0, 2));
    }

    #[test]
    fn reused_buffers_hold_nothing_of_earlier_batches() {
        let mut scratch = Dedup::new();
        let big: Vec<i64> = (0..1000).map(|i| i % 10).collect();
        let ones = vec![1.0; big.len() * 3];
        let d = scratch.run(&big, &ones, 3).unwrap();
        assert_eq!(d.keys.len(), 10);
        assert!(d.grads.iter().all(|&g| g == 100.0));
        let small = [7_i64, 7, 8];
        let grads = [1.0, 2.0, 3.0, 10.0, 20.0, 30.0, 5.0, 5.0, 5.0];
        let d = scratch.run(&small, &grads, 3).unwrap().to_owned();
        assert_eq!(
            d,
            Deduped {
                keys: vec![7, 8],
                first: vec![0, 2],
                grads: vec![11.0, 22.0, 33.0, 5.0, 5.0, 5.0],
            }
        );
    }

    #[test]
    fn nested_thread_local_use_gets_its_own_buffers() {
        let outer = Dedup::with_thread_local(|a| {
            let d = a.run(&[1_u64, 1], &[1.0, 2.0], 1).unwrap().to_owned();
            let inner = Dedup::with_thread_local(|b| {
                b.run(&[2_u64, 2], &[5.0, 5.0], 1).unwrap().to_owned()
            });
            assert_eq!(inner.grads, [10.0]);
            d
        });
        assert_eq!(outer.grads, [3.0]);
    }

    #[test]
    fn gradients_of_the_wrong_length_are_an_error_not_a_panic() {
        let mut scratch = Dedup::new();
        for (keys, grads) in [
            (&[1_u64, 1][..], &[1.0, 2.0, 3.0][..]), // repeats, short
            (&[1_u64, 2][..], &[1.0; 5][..]),        // no repeats, long
        ] {
            let err = scratch.run(keys, grads, 2).unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::LengthMismatch {
                        what: "grads",
                        expected: 4,
                        ..
                    }
                ),
                "{err:?}"
            );
            assert!(dedup(keys, grads, 2).is_err());
        }
        assert!(scratch.run(&[1_u64], &[], usize::MAX).is_err());
    }
}
