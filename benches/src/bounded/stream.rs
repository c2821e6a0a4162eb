//! The ids the bounded-table runs read: Zipf draws over a large universe,
//! scrambled, generated once before any timer starts.

use rand::SeedableRng;
use rand_distr::{Distribution, Zipf};
use rand_pcg::Pcg64Mcg;

/// Ids generated from one seed of their own, so the stream does not depend
/// on how many threads generate it.
const CHUNK: usize = 1 << 20;

/// A bijection of `u64` (splitmix64's finalizer): rank `r` becomes id
/// `scramble(r)`, so distinct ranks stay distinct ids and the hot ids are
/// neither small integers nor neighbours.
pub fn scramble(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `len` ids, each `scramble(rank)` of a Zipf(`s`) rank in `1..=universe`,
/// deterministic from `seed` (chunks of ids generated in parallel, each
/// from a seed of its own).
///
/// # Panics
/// If `universe` is 0 or `s` is not positive.
pub fn zipf_ids(len: usize, universe: u64, s: f64, seed: u64) -> Vec<u64> {
    let zipf = Zipf::new(universe as f64, s).expect("Zipf parameters: universe >= 1, s > 0");
    let mut ids = vec![0u64; len];
    let chunks: Vec<(usize, &mut [u64])> = ids.chunks_mut(CHUNK).enumerate().collect();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per_thread = chunks.len().div_ceil(threads).max(1);
    let mut chunks = chunks.into_iter();
    std::thread::scope(|scope| loop {
        let mine: Vec<(usize, &mut [u64])> = chunks.by_ref().take(per_thread).collect();
        if mine.is_empty() {
            break;
        }
        let zipf = &zipf;
        scope.spawn(move || {
            for (c, chunk) in mine {
                let mut rng = Pcg64Mcg::seed_from_u64(seed ^ scramble(c as u64));
                for id in chunk {
                    let rank = zipf.sample(&mut rng) as u64;
                    *id = scramble(rank.clamp(1, universe));
                }
            }
        });
    });
    ids
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn scramble_is_injective_on_a_range() {
        let mut seen: Vec<u64> = (0..100_000).map(scramble).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 100_000);
    }

    #[test]
    fn ids_are_deterministic_skewed_and_scrambled() {
        let a = zipf_ids(3 * CHUNK / 2, 1_000_000_000, 1.1, 7);
        let b = zipf_ids(3 * CHUNK / 2, 1_000_000_000, 1.1, 7);
        assert_eq!(a, b);
        assert_ne!(a, zipf_ids(3 * CHUNK / 2, 1_000_000_000, 1.1, 8));
        let mut counts: HashMap<u64, usize> = HashMap::new();
        for &id in &a {
            *counts.entry(id).or_default() += 1;
        }
        // Zipf(1.1): rank 1 takes 1 / zeta(1.1), about 9.5%, of the draws.
        let top = counts.values().copied().max().unwrap() as f64 / a.len() as f64;
        assert!((0.08..0.11).contains(&top), "top share {top}");
        assert_eq!(
            counts.get(&scramble(1)).copied().unwrap() as f64 / a.len() as f64,
            top
        );
        assert!(a.iter().all(|&id| id > 1 << 32), "hot ids are not small");
    }
}
