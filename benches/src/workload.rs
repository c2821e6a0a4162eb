//! The data a benchmark feeds every system: keys, picks and row values.
//!
//! Everything is generated up front from a seeded [`Pcg64Mcg`], outside any
//! timed region, and shared read-only by all systems, so each system does
//! exactly the same work:
//!
//! - `keys`: `n` distinct random 64-bit keys, in insertion order. Key `i` is
//!   row `i` of the dense reference.
//! - picks: which stored keys an operation touches, as keys and as dense row
//!   indices, uniformly or Zipf(s) distributed over key ranks. Ranks are
//!   mapped to keys through a random permutation, so the hottest keys are
//!   neither adjacent in insertion order (dynemb's row arena, the dense
//!   array) nor in key order.
//! - `misses`: random keys that are not stored (row index [`NO_ROW`]).
//! - `removals`: every stored key once, shuffled.
//! - `values` / `deltas` / `grads`: one batch of finite row values, reused
//!   for every batch of upserts and inserts, of accumulations, and of
//!   optimizer steps (the gradients of [`crate::apply`]).

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};
use rand_pcg::Pcg64Mcg;
use std::ops::Range;

/// Row index of a key the dense reference does not hold (a miss).
pub const NO_ROW: u32 = u32::MAX;

/// A batch of keys, each with its dense row index ([`NO_ROW`] for a miss).
///
/// Hash tables use `keys`; only the dense reference uses `rows`, which were
/// computed before the timer started.
#[derive(Debug, Clone, Copy)]
pub struct Batch<'a> {
    /// The keys, in batch order.
    pub keys: &'a [u64],
    /// `rows[i]` is the dense row of `keys[i]`, or [`NO_ROW`].
    pub rows: &'a [u32],
}

impl Batch<'_> {
    /// Number of keys in the batch.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// True when the batch holds no key.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

/// A sequence of keys with their dense row indices.
#[derive(Debug, Clone, Default)]
pub struct Picks {
    /// The keys.
    pub keys: Vec<u64>,
    /// Their dense rows ([`NO_ROW`] for keys not stored).
    pub rows: Vec<u32>,
}

impl Picks {
    /// Number of picks.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// True when there is no pick.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The picks in `range` as a [`Batch`].
    pub fn batch(&self, range: Range<usize>) -> Batch<'_> {
        Batch {
            keys: &self.keys[range.clone()],
            rows: &self.rows[range],
        }
    }

    /// The picks of stored keys `indices` (indices into `keys`).
    fn of_indices(keys: &[u64], indices: Vec<u32>) -> Picks {
        Picks {
            keys: indices.iter().map(|&i| keys[i as usize]).collect(),
            rows: indices,
        }
    }
}

/// Sizes of a [`Workload`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    /// Distinct keys stored (the table grows to this size).
    pub keys: usize,
    /// Values per row.
    pub dim: usize,
    /// Keys per batch (the unit of every call).
    pub batch: usize,
    /// Picks per timed run of lookup, upsert and accumulate.
    pub picks: usize,
    /// Exponent of the Zipf distribution of [`Workload::zipf`].
    pub zipf_s: f64,
    /// Seed of everything random.
    pub seed: u64,
}

/// Everything one configuration feeds the systems.
#[derive(Debug, Clone)]
pub struct Workload {
    /// The sizes it was generated with.
    pub shape: Shape,
    /// Every stored key, in insertion order (key `i` is dense row `i`).
    pub keys: Picks,
    /// Every stored key once, in a shuffled order (for remove).
    pub removals: Picks,
    /// Uniformly random picks of stored keys.
    pub uniform: Picks,
    /// Zipf(`zipf_s`) picks of stored keys, ranks shuffled over keys.
    pub zipf: Picks,
    /// Random keys that are not stored.
    pub misses: Picks,
    /// One batch of row values (`batch * dim`), for inserts and upserts.
    pub values: Vec<f32>,
    /// One batch of row deltas (`batch * dim`), for accumulate.
    pub deltas: Vec<f32>,
    /// One batch of gradient rows (`batch * dim`, in `[-0.5, 0.5]`), for
    /// the optimizer steps.
    pub grads: Vec<f32>,
}

impl Workload {
    /// Generates the workload of `shape`, deterministically from its seed.
    ///
    /// # Panics
    /// If `shape.keys` is 0 or does not fit a `u32` row index, or `dim`,
    /// `batch` or `picks` is 0.
    pub fn generate(shape: Shape) -> Workload {
        assert!(shape.keys > 0 && shape.keys < NO_ROW as usize, "keys");
        assert!(shape.dim > 0 && shape.batch > 0 && shape.picks > 0);
        let mut rng = Pcg64Mcg::seed_from_u64(shape.seed);
        let (stored, misses) = distinct_keys(&mut rng, shape.keys, shape.picks);
        let n = shape.keys;

        let mut order: Vec<u32> = (0..n as u32).collect();
        order.shuffle(&mut rng);
        let removals = Picks::of_indices(&stored, order);

        let uniform = (0..shape.picks)
            .map(|_| rng.random_range(0..n as u32))
            .collect();
        let uniform = Picks::of_indices(&stored, uniform);
        let zipf = Picks::of_indices(
            &stored,
            zipf_indices(&mut rng, n, shape.picks, shape.zipf_s),
        );

        let row_len = shape.batch * shape.dim;
        let values = (0..row_len).map(|j| (j % 97) as f32 * 0.01 - 0.5).collect();
        let deltas = (0..row_len)
            .map(|j| (j % 13) as f32 * 1e-3 - 6e-3)
            .collect();
        let grads = (0..row_len)
            .map(|j| ((j * 37) % 101) as f32 * 0.01 - 0.5)
            .collect();
        Workload {
            shape,
            keys: Picks {
                keys: stored,
                rows: (0..n as u32).collect(),
            },
            removals,
            uniform,
            zipf,
            misses: Picks {
                rows: vec![NO_ROW; misses.len()],
                keys: misses,
            },
            values,
            deltas,
            grads,
        }
    }

    /// Values per row.
    pub fn dim(&self) -> usize {
        self.shape.dim
    }

    /// Keys per batch.
    pub fn batch(&self) -> usize {
        self.shape.batch
    }

    /// The first `keys * dim` values of the value batch.
    pub fn values_for(&self, keys: usize) -> &[f32] {
        &self.values[..keys * self.shape.dim]
    }

    /// The first `keys * dim` values of the delta batch.
    pub fn deltas_for(&self, keys: usize) -> &[f32] {
        &self.deltas[..keys * self.shape.dim]
    }

    /// The first `keys * dim` values of the gradient batch.
    pub fn grads_for(&self, keys: usize) -> &[f32] {
        &self.grads[..keys * self.shape.dim]
    }
}

/// `stored` distinct random keys, and `misses` more random keys distinct
/// from all of them.
fn distinct_keys(rng: &mut Pcg64Mcg, stored: usize, misses: usize) -> (Vec<u64>, Vec<u64>) {
    let mut seen = hashbrown::HashSet::with_capacity_and_hasher(
        stored + misses,
        ahash::RandomState::with_seeds(1, 2, 3, 4),
    );
    let mut draw = |count: usize| {
        let mut out = Vec::with_capacity(count);
        while out.len() < count {
            let key: u64 = rng.random();
            if seen.insert(key) {
                out.push(key);
            }
        }
        out
    };
    let stored = draw(stored);
    let misses = draw(misses);
    (stored, misses)
}

/// `count` Zipf(`s`) draws over ranks `1..=n`, mapped to key indices through
/// a random permutation (rank 1, the hottest, is a random key).
fn zipf_indices(rng: &mut Pcg64Mcg, n: usize, count: usize, s: f64) -> Vec<u32> {
    let mut of_rank: Vec<u32> = (0..n as u32).collect();
    of_rank.shuffle(rng);
    let zipf = Zipf::new(n as f64, s).expect("Zipf parameters: n >= 1, s > 0");
    (0..count)
        .map(|_| {
            let rank = zipf.sample(rng) as usize; // in 1..=n
            of_rank[rank.clamp(1, n) - 1]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{HashMap, HashSet};

    fn shape(keys: usize) -> Shape {
        Shape {
            keys,
            dim: 4,
            batch: 16,
            picks: 20_000,
            zipf_s: 1.1,
            seed: 9,
        }
    }

    #[test]
    fn keys_are_distinct_and_misses_are_absent() {
        let w = Workload::generate(shape(5000));
        let stored: HashSet<u64> = w.keys.keys.iter().copied().collect();
        assert_eq!(stored.len(), 5000);
        assert_eq!(w.keys.rows, (0..5000).collect::<Vec<u32>>());
        assert_eq!(w.misses.len(), 20_000);
        assert!(w.misses.keys.iter().all(|k| !stored.contains(k)));
        assert!(w.misses.rows.iter().all(|&r| r == NO_ROW));
    }

    #[test]
    fn picks_name_their_rows() {
        let w = Workload::generate(shape(3000));
        for picks in [&w.uniform, &w.zipf, &w.removals] {
            for (&key, &row) in picks.keys.iter().zip(&picks.rows) {
                assert_eq!(w.keys.keys[row as usize], key);
            }
        }
        let mut removed = w.removals.rows.clone();
        removed.sort_unstable();
        assert_eq!(removed, w.keys.rows, "removals is a permutation");
        assert_ne!(w.removals.rows, w.keys.rows, "and a shuffled one");
    }

    #[test]
    fn generation_is_deterministic() {
        let a = Workload::generate(shape(1000));
        let b = Workload::generate(shape(1000));
        assert_eq!(a.keys.keys, b.keys.keys);
        assert_eq!(a.zipf.keys, b.zipf.keys);
        let c = Workload::generate(Shape {
            seed: 10,
            ..shape(1000)
        });
        assert_ne!(a.keys.keys, c.keys.keys);
    }

    #[test]
    fn zipf_is_skewed_and_uniform_is_not() {
        let w = Workload::generate(shape(10_000));
        let top_share = |picks: &Picks| {
            let mut counts: HashMap<u32, usize> = HashMap::new();
            for &r in &picks.rows {
                *counts.entry(r).or_default() += 1;
            }
            let mut c: Vec<usize> = counts.into_values().collect();
            c.sort_unstable_by(|a, b| b.cmp(a));
            c.iter().take(10).sum::<usize>() as f64 / picks.len() as f64
        };
        // Zipf(1.1) over 10k ranks: the top 10 ranks take about 40% of picks.
        let zipf = top_share(&w.zipf);
        assert!((0.3..0.55).contains(&zipf), "zipf top-10 share {zipf}");
        assert!(top_share(&w.uniform) < 0.01);
        // The hottest keys are not adjacent rows.
        let mut counts: HashMap<u32, usize> = HashMap::new();
        for &r in &w.zipf.rows {
            *counts.entry(r).or_default() += 1;
        }
        let mut hot: Vec<(usize, u32)> = counts.into_iter().map(|(r, c)| (c, r)).collect();
        hot.sort_unstable_by(|a, b| b.cmp(a));
        let mut rows: Vec<u32> = hot.iter().take(5).map(|&(_, r)| r).collect();
        rows.sort_unstable();
        assert!(rows.windows(2).any(|p| p[1] - p[0] > 1), "{rows:?}");
    }

    #[test]
    fn batches_and_values_have_the_right_lengths() {
        let w = Workload::generate(shape(100));
        assert_eq!(w.values.len(), 16 * 4);
        assert_eq!(w.deltas_for(3).len(), 12);
        assert_eq!(w.grads_for(2).len(), 8);
        assert!(w
            .values
            .iter()
            .chain(&w.deltas)
            .chain(&w.grads)
            .all(|v| v.is_finite()));
        let b = w.uniform.batch(5..9);
        assert_eq!(b.len(), 4);
        assert_eq!(b.keys, &w.uniform.keys[5..9]);
        assert_eq!(b.rows, &w.uniform.rows[5..9]);
    }
}
