//! A fast Zipf sampler: rank `r` in `0..n` with probability proportional
//! to `(r + 1)^-s`.
//!
//! It is a table lookup where `rand_distr::Zipf` (rejection-inversion)
//! takes a few `ln`/`exp`/`pow` per draw, so data generation stays far
//! ahead of training. It is exact for the head and nearly so for the tail, with small tables:
//! - the first [`HEAD`] ranks and one "tail" outcome form a Walker/Vose
//!   alias table (one `u64` of randomness, one 8-byte entry read: O(1));
//!   a bigger head (4096) made the table reads cache misses that cost more
//!   than the tail's arithmetic;
//! - a tail draw inverts the CDF of the continuous density `x^-s` on
//!   `[HEAD + 0.5, n + 0.5]` and rounds to the nearest rank `k = r + 1`.
//!   That gives rank `k` the mass `∫ x^-s` over `[k - 0.5, k + 0.5]`, which
//!   differs from `k^-s` by a relative `s (s + 1) / (24 k^2)`: below 2e-6
//!   past rank 256. The tail's total mass in the alias table is the same
//!   integral, so the two parts are consistent. The inversion raises to the
//!   power `1 / (1 - s)`, which for `s = 1.1` is the integer -10: then it is
//!   a few multiplications (`powi`) instead of a `pow` call (which took a
//!   quarter of the generator's time).
//!
//! Invariant: every draw is in `0..n`.

use rand::RngCore;

/// Ranks sampled exactly from the alias table; the rest is the tail.
pub const HEAD: usize = 256;

/// Samples Zipf ranks; see the module docs.
#[derive(Clone, Debug)]
pub struct ZipfSampler {
    n: u64,
    /// Alias table over `head` ranks plus one tail outcome (index `head`).
    table: AliasTable,
    head: usize,
    /// `(HEAD + 0.5)^(1-s)` and `(n + 0.5)^(1-s)` (or their logs when
    /// `s == 1`): the tail's inverse CDF interpolates between them.
    tail_low: f64,
    tail_high: f64,
    /// How the tail's inverse CDF maps back from the integral's scale.
    inverse: TailInverse,
}

/// The last step of the tail's inverse CDF: from the antiderivative's
/// scale ([`integral_point`]) back to `x`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum TailInverse {
    /// `s == 1`: the points are logarithms.
    Exp,
    /// `1 / (1 - s)` is (within 1e-9 of) this small integer.
    Powi(i32),
    /// Any other `1 / (1 - s)`.
    Powf(f64),
}

impl ZipfSampler {
    /// A sampler over `n` ranks with exponent `exponent`; `None` unless
    /// `n >= 1` and `exponent` is finite and positive.
    pub fn new(n: u64, exponent: f64) -> Option<Self> {
        if n == 0 || !(exponent.is_finite() && exponent > 0.0) {
            return None;
        }
        let head = HEAD.min(usize::try_from(n).unwrap_or(HEAD));
        let mut weights: Vec<f64> = (1..=head).map(|k| (k as f64).powf(-exponent)).collect();
        let (tail_low, tail_high) = if (head as u64) < n {
            let low = integral_point(head as f64 + 0.5, exponent);
            let high = integral_point(n as f64 + 0.5, exponent);
            weights.push(integral_between(low, high, exponent));
            (low, high)
        } else {
            (0.0, 0.0)
        };
        let power = 1.0 / (1.0 - exponent);
        // 1 / (1 - 1.1) is -9.999999999999991 in floating point.
        let inverse = if exponent == 1.0 {
            TailInverse::Exp
        } else if (power - power.round()).abs() < 1e-9 && power.abs() <= 64.0 {
            TailInverse::Powi(power.round() as i32)
        } else {
            TailInverse::Powf(power)
        };
        Some(Self {
            n,
            table: AliasTable::new(&weights),
            head,
            tail_low,
            tail_high,
            inverse,
        })
    }

    /// Number of ranks.
    pub fn len(&self) -> u64 {
        self.n
    }

    /// One rank in `0..n`.
    #[inline]
    pub fn sample<R: RngCore + ?Sized>(&self, rng: &mut R) -> u64 {
        let outcome = self.table.sample(rng.next_u64());
        if outcome < self.head {
            return outcome as u64;
        }
        let u = unit_f64(rng.next_u64());
        let point = self.tail_low + u * (self.tail_high - self.tail_low);
        let x = match self.inverse {
            TailInverse::Exp => point.exp(),
            TailInverse::Powi(power) => point.powi(power),
            TailInverse::Powf(power) => point.powf(power),
        };
        // The nearest rank k = round(x) > HEAD, and r = k - 1, clamped
        // against rounding at the ends of the range. x > 0, so truncation
        // rounds down (`floor` is a libm call on baseline x86-64).
        let rank = (x + 0.5) as u64;
        rank.saturating_sub(1).clamp(self.head as u64, self.n - 1)
    }
}

/// The antiderivative's point `x^(1-s)` (or `ln x` when `s == 1`), up to
/// the constant factor that [`integral_between`] applies.
fn integral_point(x: f64, exponent: f64) -> f64 {
    if exponent == 1.0 {
        x.ln()
    } else {
        x.powf(1.0 - exponent)
    }
}

/// `∫ x^-s dx` between the two points of [`integral_point`].
fn integral_between(low: f64, high: f64, exponent: f64) -> f64 {
    if exponent == 1.0 {
        high - low
    } else {
        (high - low) / (1.0 - exponent)
    }
}

/// A uniform value in `[0, 1)` from the top 53 bits.
#[inline]
pub fn unit_f64(bits: u64) -> f64 {
    (bits >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Walker's alias method (Vose's construction): a draw picks a column with
/// the high 32 bits of a random word and keeps it or takes its alias by
/// comparing the low 32 bits with the column's threshold.
#[derive(Clone, Debug)]
struct AliasTable {
    /// Per column: (threshold, alias), side by side so a draw reads one
    /// entry. The column is kept when the low bits are below the threshold.
    columns: Vec<(u32, u32)>,
}

impl AliasTable {
    /// A table for these weights (non-negative, finite, not all zero; at
    /// most `u32::MAX` of them).
    fn new(weights: &[f64]) -> Self {
        let n = weights.len();
        let total: f64 = weights.iter().sum();
        let mut scaled: Vec<f64> = weights.iter().map(|w| w * n as f64 / total).collect();
        let mut threshold = vec![u32::MAX; n];
        let mut alias: Vec<u32> = (0..n as u32).collect();
        let (mut small, mut large): (Vec<usize>, Vec<usize>) =
            (0..n).partition(|&i| scaled[i] < 1.0);
        while let (Some(s), Some(&l)) = (small.pop(), large.last()) {
            threshold[s] = (scaled[s] * 4_294_967_296.0).min(u32::MAX as f64) as u32;
            alias[s] = l as u32;
            scaled[l] -= 1.0 - scaled[s];
            if scaled[l] < 1.0 {
                large.pop();
                small.push(l);
            }
        }
        // Whatever is left has probability 1 up to rounding: keep it.
        Self {
            columns: threshold.into_iter().zip(alias).collect(),
        }
    }

    /// The outcome for one random word.
    #[inline]
    fn sample(&self, bits: u64) -> usize {
        let column = (((bits >> 32) * self.columns.len() as u64) >> 32) as usize;
        let (threshold, alias) = self.columns[column];
        if (bits as u32) < threshold {
            column
        } else {
            alias as usize
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand_pcg::Pcg64Mcg;

    /// Exact Zipf probability of rank `r` out of `n`.
    fn exact(r: u64, n: u64, s: f64) -> f64 {
        let norm: f64 = (1..=n).map(|k| (k as f64).powf(-s)).sum();
        ((r + 1) as f64).powf(-s) / norm
    }

    fn frequencies(sampler: &ZipfSampler, draws: usize, seed: u64) -> Vec<u64> {
        let mut rng = Pcg64Mcg::seed_from_u64(seed);
        let mut counts = vec![0u64; sampler.len() as usize];
        for _ in 0..draws {
            counts[sampler.sample(&mut rng) as usize] += 1;
        }
        counts
    }

    #[test]
    fn rejects_bad_parameters() {
        assert!(ZipfSampler::new(0, 1.1).is_none());
        assert!(ZipfSampler::new(10, 0.0).is_none());
        assert!(ZipfSampler::new(10, f64::NAN).is_none());
        assert!(ZipfSampler::new(1, 1.1).is_some());
    }

    #[test]
    fn integer_tail_powers_are_found() {
        let inverse = |s| ZipfSampler::new(10_000, s).unwrap().inverse;
        assert_eq!(inverse(1.0), TailInverse::Exp);
        assert_eq!(inverse(1.1), TailInverse::Powi(-10));
        assert_eq!(inverse(1.25), TailInverse::Powi(-4));
        assert_eq!(inverse(2.0), TailInverse::Powi(-1));
        assert!(matches!(inverse(1.3), TailInverse::Powf(p) if (p + 1.0 / 0.3).abs() < 1e-12));
    }

    #[test]
    fn head_only_matches_exact_probabilities() {
        let (n, s, draws) = (50, 1.1, 2_000_000);
        let sampler = ZipfSampler::new(n, s).unwrap();
        let counts = frequencies(&sampler, draws, 1);
        for r in [0, 1, 2, 9, 49] {
            let p = exact(r, n, s);
            let observed = counts[r as usize] as f64 / draws as f64;
            let sigma = (p * (1.0 - p) / draws as f64).sqrt();
            assert!(
                (observed - p).abs() < 5.0 * sigma,
                "rank {r}: observed {observed}, expected {p}"
            );
        }
    }

    #[test]
    fn tail_mass_and_ranks_match_exact_probabilities() {
        // Exponents whose tail inversion is exp, powi and powf.
        for s in [1.0, 1.1, 1.25, 1.3] {
            let (n, draws) = (20_000u64, 2_000_000);
            let sampler = ZipfSampler::new(n, s).unwrap();
            let counts = frequencies(&sampler, draws, 2);
            let norm: f64 = (1..=n).map(|k| (k as f64).powf(-s)).sum();
            let band = |lo: u64, hi: u64| -> (f64, f64) {
                let p: f64 = (lo + 1..=hi).map(|k| (k as f64).powf(-s)).sum::<f64>() / norm;
                let seen = counts[lo as usize..hi as usize].iter().sum::<u64>() as f64;
                (seen / draws as f64, p)
            };
            let head = HEAD as u64;
            for (lo, hi) in [
                (0, 1),
                (head - 6, head),
                (head, head + 1),
                (head, head + 4),
                (head, 2 * head),
                (2 * head, 8000),
                (8000, n),
            ] {
                let (observed, p) = band(lo, hi);
                let sigma = (p * (1.0 - p) / draws as f64).sqrt();
                assert!(
                    (observed - p).abs() < 5.0 * sigma,
                    "s {s}, ranks {lo}..{hi}: observed {observed}, expected {p}"
                );
            }
        }
    }

    #[test]
    fn draws_stay_in_range() {
        for n in [1, 2, HEAD as u64, HEAD as u64 + 1, 1_000_003] {
            let sampler = ZipfSampler::new(n, 1.1).unwrap();
            let mut rng = Pcg64Mcg::seed_from_u64(n);
            assert!((0..100_000).all(|_| sampler.sample(&mut rng) < n));
        }
    }
}
