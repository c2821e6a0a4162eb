//! A batch's keys grouped by bucket, so that each bucket gets one command
//! per batch (never one per key) while every key keeps its batch position.

use crate::layout::bucket_of;
use dynemb::{Error, Result};

/// The positions of a batch's keys, grouped by bucket: each group's
/// positions are in batch order (so repeated keys keep their order).
#[derive(Debug, Default)]
pub(crate) struct Grouped {
    /// Batch positions, bucket after bucket.
    order: Vec<u32>,
    /// `(bucket, start, end)`: the bucket's positions are `order[start..end]`.
    groups: Vec<(u32, usize, usize)>,
}

impl Grouped {
    /// Groups keys (as bits) by their bucket among `buckets`.
    pub(crate) fn new(bits: &[u64], buckets: u32) -> Result<Grouped> {
        if u32::try_from(bits.len()).is_err() {
            return Err(Error::InvalidArgument(format!(
                "a batch holds at most {} keys, got {}",
                u32::MAX,
                bits.len()
            )));
        }
        let of: Vec<u32> = bits.iter().map(|&b| bucket_of(b, buckets)).collect();
        let order: Vec<u32> = if (buckets as usize) <= 2 * bits.len() + 64 {
            // Counting sort: stable, linear.
            let mut starts = vec![0usize; buckets as usize + 1];
            for &b in &of {
                starts[b as usize + 1] += 1;
            }
            for i in 1..starts.len() {
                starts[i] += starts[i - 1];
            }
            let mut order = vec![0u32; bits.len()];
            for (pos, &b) in of.iter().enumerate() {
                order[starts[b as usize]] = pos as u32;
                starts[b as usize] += 1;
            }
            order
        } else {
            let mut packed: Vec<u64> = of
                .iter()
                .enumerate()
                .map(|(pos, &b)| (u64::from(b) << 32) | pos as u64)
                .collect();
            packed.sort_unstable();
            packed.into_iter().map(|p| p as u32).collect()
        };
        let mut groups = Vec::new();
        let mut start = 0;
        while start < order.len() {
            let bucket = of[order[start] as usize];
            let mut end = start + 1;
            while end < order.len() && of[order[end] as usize] == bucket {
                end += 1;
            }
            groups.push((bucket, start, end));
            start = end;
        }
        Ok(Grouped { order, groups })
    }

    /// `(bucket, positions)` per non-empty bucket, in bucket order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u32, &[u32])> + '_ {
        self.groups
            .iter()
            .map(|&(bucket, start, end)| (bucket, &self.order[start..end]))
    }

    /// Number of non-empty buckets.
    pub(crate) fn len(&self) -> usize {
        self.groups.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(bits: &[u64], buckets: u32) {
        let g = Grouped::new(bits, buckets).unwrap();
        let mut seen = vec![false; bits.len()];
        let mut last_bucket = None;
        for (bucket, positions) in g.iter() {
            assert!(last_bucket < Some(bucket), "buckets ascend");
            last_bucket = Some(bucket);
            assert!(positions.windows(2).all(|w| w[0] < w[1]), "batch order");
            for &p in positions {
                assert_eq!(bucket_of(bits[p as usize], buckets), bucket);
                assert!(!std::mem::replace(&mut seen[p as usize], true));
            }
        }
        assert!(seen.iter().all(|&s| s), "every position once");
    }

    #[test]
    fn groups_cover_every_position_once_in_order() {
        let bits: Vec<u64> = (0..500).map(|i| (i * 7919) % 113).collect();
        check(&bits, 1);
        check(&bits, 16); // counting sort
        check(&bits, 1 << 20); // comparison sort
        check(&[], 4);
        assert_eq!(Grouped::new(&[], 4).unwrap().len(), 0);
    }
}
