//! Initial rows for keys that are not in the table.
//!
//! This module owns [`Initializer`]: the rule that makes the row a missing key
//! reads ([`Variable::lookup`](crate::Variable::lookup)) and the row a
//! training read inserts
//! ([`Variable::lookup_or_insert`](crate::Variable::lookup_or_insert),
//! sparse optimizers). It checks its settings against the row `dim`
//! ([`Initializer::validate`], called when a variable is built) and writes
//! one row at a time ([`Initializer::fill`]) without allocating.
//!
//! # Determinism
//!
//! TFRA's semantics require that a missing key reads the same row every time
//! and that this row is exactly what training later inserts: a lookup that
//! does not insert and a lookup that does must agree, whichever comes first.
//! So the random initializers are not a shared random stream. Each row has its
//! own generator, seeded from a strong mix (splitmix64 finalizers) of the
//! initializer's `seed` and the key's 64-bit pattern, and element `j` of the
//! row is the `j`-th value drawn from it. The row therefore depends only on
//! `(seed, key, element index)`: not on the batch, the thread, the shard, the
//! order of calls, or which keys were initialized before. Neighbouring keys
//! (0, 1, 2, ...) and neighbouring seeds get unrelated rows.
//!
//! Rows are reproducible across runs and platforms: the mixing and the
//! generator ([`rand_pcg::Pcg64Mcg`]) are exact integer arithmetic, uniform
//! rows use only IEEE-754 basic operations, and normal rows use `rand_distr`'s
//! ziggurat sampler, whose rare tail and wedge steps take `exp`/`ln` from the
//! pure-Rust `libm` (unless another crate of the build switches `num-traits`
//! to `std`, which can move a value by one rounding step with negligible
//! probability). The rows are tied to the pinned `rand_pcg` 0.9 and
//! `rand_distr` 0.5 (a golden test pins some): rows already stored never
//! change, but upgrading these crates may change the rows of keys not yet
//! inserted.
//!
//! # Distributions
//!
//! - `RandomNormal { mean, stddev }`: `mean + stddev * z` with `z ~ N(0, 1)`.
//! - `TruncatedNormal { mean, stddev }`: TensorFlow's definition. Draw
//!   `z ~ N(0, 1)` and draw again while `|z| > 2`, so every value lies in
//!   `[mean - 2 stddev, mean + 2 stddev]`. This is not a renormalized normal
//!   with standard deviation `stddev`: the values' standard deviation is about
//!   `0.8796 * stddev`.
//! - `RandomUniform { low, high }`: uniform on `[low, high)`; `high` itself is
//!   never produced (except `low == high`, which gives exactly `low`). A
//!   variable of a half-precision value dtype stores every initial value
//!   rounded to it, so a value just below `high` may be stored as `high`.
//! - `stddev == 0` gives exactly `mean`.
//!
//! # Every value is finite
//!
//! [`Initializer::validate`] accepts only settings whose every possible
//! value is finite, so an initial row never holds an infinity that a
//! checkpoint could not store. The bounds are exact for the formulas
//! [`Initializer::fill`] computes (f32 rounding is monotonic, so checking
//! the formula at the extreme `z` covers every `z` between):
//!
//! - `TruncatedNormal`: `|z| <= 2`, so it checks `mean ± stddev * 2` (as
//!   `mean + stddev * z` in f32) is finite;
//! - `RandomNormal`: the ziggurat sampler's `|z|` is below
//!   [`Initializer::NORMAL_Z_BOUND`] `= 12.25` (see its docs for why), so it
//!   checks `mean ± stddev * 12.25`;
//! - `RandomUniform`: computed in f64, where `high - low` cannot overflow
//!   (even `[-f32::MAX, f32::MAX)`), and every value lies in `[low, high)`,
//!   so any finite `low <= high` is accepted.

use rand::{Rng, RngCore};
use rand_distr::StandardNormal;
use rand_pcg::Pcg64Mcg;

use crate::{Error, Result};

/// How rows of keys that are not in the table are made.
///
/// The row of a missing key is a pure function of the initializer and the
/// key's 64-bit pattern (random variants: of `seed`, key and element index),
/// so reading a missing key twice gives the same row, and inserting it stores
/// that row, whatever the batch, thread, shard or call order.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Initializer {
    /// Every element is `0.0`.
    #[default]
    Zeros,
    /// Every element is the given value.
    Constant(f32),
    /// The same row, of length `dim`, for every missing key.
    Values(Vec<f32>),
    /// `mean + stddev * z`, `z` standard normal, per `(seed, key)`.
    RandomNormal {
        /// Mean of the values.
        mean: f32,
        /// Standard deviation of the values (`>= 0`).
        stddev: f32,
        /// Selects the random rows; the same seed gives the same rows.
        seed: u64,
    },
    /// A normal `N(mean, stddev)` whose values beyond `2 * stddev` from the
    /// mean are drawn again (TensorFlow's `truncated_normal`). The values'
    /// standard deviation is about `0.8796 * stddev`.
    TruncatedNormal {
        /// Mean of the values.
        mean: f32,
        /// Standard deviation of the normal before truncation (`>= 0`).
        stddev: f32,
        /// Selects the random rows; the same seed gives the same rows.
        seed: u64,
    },
    /// Uniform on `[low, high)`, per `(seed, key)`.
    RandomUniform {
        /// Smallest value (inclusive).
        low: f32,
        /// Upper bound (exclusive unless equal to `low`).
        high: f32,
        /// Selects the random rows; the same seed gives the same rows.
        seed: u64,
    },
}

impl Initializer {
    /// A bound on the magnitude of the standard normal values `z` that
    /// `RandomNormal` draws: [`Initializer::validate`] accepts a
    /// `RandomNormal` only if `mean ± stddev * NORMAL_Z_BOUND` is finite.
    ///
    /// `rand_distr`'s ziggurat returns `|z| < R ≈ 3.6542` except in its tail
    /// step, which returns `R + |x|` with `x = ln(u1) / R` accepted only if
    /// `x² <= -2 ln(u2)`, `u1` and `u2` from `rand`'s `Open01`, whose
    /// smallest value is `2^-53`: so `|x| <= sqrt(106 ln 2) ≈ 8.5717` and
    /// `|z| < 12.2259` (a unit test drives the sampler to `12.2254`).
    pub const NORMAL_Z_BOUND: f32 = 12.25;

    /// Checks the settings against the row `dim`.
    ///
    /// `Values` must hold exactly `dim` elements (the message names the
    /// expected and the actual length); every parameter and value must be
    /// finite; `stddev >= 0`; `low <= high`; and every value the initializer
    /// can produce must be finite, so that no row a variable stores or reads
    /// is infinite. The bounds are exact for the formula
    /// [`fill`](Self::fill) computes, `mean + stddev * z` in f32 (rounding is
    /// monotonic, so checking the extreme `z` covers every `z` between):
    /// `RandomNormal` checks `z = ±`[`NORMAL_Z_BOUND`](Self::NORMAL_Z_BOUND),
    /// `TruncatedNormal` `z = ±2` (its values lie in `mean ± 2 * stddev`).
    /// `RandomUniform` computes `low + (high - low) * u` in f64, where it
    /// cannot overflow (even for `[-f32::MAX, f32::MAX)`), and its values
    /// lie in `[low, high)`, so any finite `low <= high` is accepted.
    /// Returns [`Error::InvalidArgument`] otherwise. Called by
    /// [`VariableBuilder::build`](crate::VariableBuilder::build).
    pub fn validate(&self, dim: usize) -> Result<()> {
        match self {
            Self::Zeros => Ok(()),
            Self::Constant(value) => finite("Constant", "value", *value),
            Self::Values(row) => {
                if row.len() != dim {
                    return Err(Error::InvalidArgument(format!(
                        "Values initializer: expected a row of length {dim} (the variable's dim), \
                         got length {}",
                        row.len()
                    )));
                }
                match row.iter().position(|v| !v.is_finite()) {
                    Some(i) => Err(Error::InvalidArgument(format!(
                        "Values initializer: element {i} is not finite ({})",
                        row[i]
                    ))),
                    None => Ok(()),
                }
            }
            Self::RandomNormal { mean, stddev, .. } => {
                normal_params("RandomNormal", *mean, *stddev, Self::NORMAL_Z_BOUND)
            }
            Self::TruncatedNormal { mean, stddev, .. } => {
                normal_params("TruncatedNormal", *mean, *stddev, TRUNCATE_AT)
            }
            Self::RandomUniform { low, high, .. } => {
                finite("RandomUniform", "low", *low)?;
                finite("RandomUniform", "high", *high)?;
                if low > high {
                    return Err(Error::InvalidArgument(format!(
                        "RandomUniform initializer: low ({low}) must be <= high ({high})"
                    )));
                }
                Ok(())
            }
        }
    }

    /// The largest magnitude of any value the initializer makes (for
    /// settings [`Initializer::validate`] accepts): what a value dtype
    /// must hold for every initial row to fit it.
    pub fn max_magnitude(&self) -> f32 {
        let normal = |mean: f32, stddev: f32, z: f32| {
            (mean + stddev * z).abs().max((mean - stddev * z).abs())
        };
        match self {
            Self::Zeros => 0.0,
            Self::Constant(value) => value.abs(),
            Self::Values(row) => row.iter().fold(0.0, |m, v| m.max(v.abs())),
            Self::RandomNormal { mean, stddev, .. } => normal(*mean, *stddev, Self::NORMAL_Z_BOUND),
            Self::TruncatedNormal { mean, stddev, .. } => normal(*mean, *stddev, TRUNCATE_AT),
            Self::RandomUniform { low, high, .. } => low.abs().max(high.abs()),
        }
    }

    /// Writes the initial row of the key whose 64-bit pattern is `key_bits`
    /// into `out`.
    ///
    /// `out.len()` is the row `dim` (the caller guarantees it). Random
    /// variants draw `out.len()` values from a generator seeded by
    /// `(seed, key_bits)` alone, so the same key always gets the same row.
    /// Never allocates and never panics: a `Values` row of another length
    /// (which [`validate`](Self::validate) rejects) copies the common prefix
    /// and zeroes the rest.
    pub fn fill(&self, key_bits: u64, out: &mut [f32]) {
        match *self {
            Self::Zeros => out.fill(0.0),
            Self::Constant(value) => out.fill(value),
            Self::Values(ref row) => {
                let n = row.len().min(out.len());
                out[..n].copy_from_slice(&row[..n]);
                out[n..].fill(0.0);
            }
            Self::RandomNormal { mean, stddev, seed } => {
                if stddev == 0.0 {
                    out.fill(mean);
                    return;
                }
                let mut rng = row_rng(seed, key_bits);
                for x in out {
                    let z: f32 = rng.sample(StandardNormal);
                    *x = mean + stddev * z;
                }
            }
            Self::TruncatedNormal { mean, stddev, seed } => {
                if stddev == 0.0 {
                    out.fill(mean);
                    return;
                }
                let mut rng = row_rng(seed, key_bits);
                for x in out {
                    let z = loop {
                        let z: f32 = rng.sample(StandardNormal);
                        if z.abs() <= TRUNCATE_AT {
                            break z;
                        }
                    };
                    *x = mean + stddev * z;
                }
            }
            Self::RandomUniform { low, high, seed } => {
                // In f64 the span cannot overflow, even for [-MAX, MAX).
                let span = f64::from(high) - f64::from(low);
                if span.is_nan() || span <= 0.0 {
                    // low == high (low > high is rejected by validate).
                    out.fill(low);
                    return;
                }
                let below_high = next_down(high);
                let mut rng = row_rng(seed, key_bits);
                for x in out {
                    // 53 random bits: u in [0, 1), exact in f64.
                    let u = (rng.next_u64() >> 11) as f64 * UNIT_53;
                    let v = (f64::from(low) + span * u) as f32;
                    // Rounding to f32 may reach `high`; keep the range half-open.
                    *x = if v < high { v } else { below_high };
                }
            }
        }
    }

    /// True when the row does not depend on the key (`Zeros`, `Constant`,
    /// `Values`), so callers may compute it once per batch and copy it.
    /// False for the random variants, whatever their parameters.
    pub fn is_key_independent(&self) -> bool {
        matches!(self, Self::Zeros | Self::Constant(_) | Self::Values(_))
    }
}

/// `TruncatedNormal` redraws standard normal values beyond this magnitude.
const TRUNCATE_AT: f32 = 2.0;

/// `2^-53`: scales a 53-bit integer into `[0, 1)`.
const UNIT_53: f64 = 1.0 / (1u64 << 53) as f64;

/// Salts that keep seed 0 and key 0 away from `mix64`'s fixed point 0 and
/// make the two halves of the generator state independent hashes.
const SALT_HI: u64 = 0x243F_6A88_85A3_08D3;
const SALT_LO: u64 = 0x1319_8A2E_0370_7344;

/// The splitmix64 finalizer: a bijection of `u64` with full avalanche.
#[inline]
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The generator of one row: a function of `(seed, key_bits)` only.
///
/// The high half of the 128-bit state is `mix64(key + mix64(seed ^ salt))`,
/// a bijection of the key for a fixed seed and of the seed for a fixed key,
/// so two keys of one seed (or one key under two seeds) never share a state.
/// The low half is an independent hash; its lowest bit is forced to 1 by the
/// MCG.
#[inline]
fn row_rng(seed: u64, key_bits: u64) -> Pcg64Mcg {
    let hi = mix64(key_bits.wrapping_add(mix64(seed ^ SALT_HI)));
    let lo = mix64(key_bits ^ mix64(seed ^ SALT_LO));
    Pcg64Mcg::new((u128::from(hi) << 64) | u128::from(lo))
}

/// The largest `f32` below `x`, for finite `x > -f32::MAX`.
#[inline]
fn next_down(x: f32) -> f32 {
    if x == 0.0 {
        -f32::from_bits(1)
    } else if x > 0.0 {
        f32::from_bits(x.to_bits() - 1)
    } else {
        f32::from_bits(x.to_bits() + 1)
    }
}

fn finite(variant: &str, param: &str, value: f32) -> Result<()> {
    if value.is_finite() {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "{variant} initializer: {param} must be finite, got {value}"
        )))
    }
}

/// Checks a normal initializer's parameters, and that `mean + stddev * z`,
/// computed in f32 as [`Initializer::fill`] computes it, is finite for `z =
/// ±z_bound` (and so, rounding being monotonic, for every `|z| <= z_bound`).
fn normal_params(variant: &str, mean: f32, stddev: f32, z_bound: f32) -> Result<()> {
    finite(variant, "mean", mean)?;
    finite(variant, "stddev", stddev)?;
    if stddev < 0.0 {
        return Err(Error::InvalidArgument(format!(
            "{variant} initializer: stddev must be >= 0, got {stddev}"
        )));
    }
    let extremes = [mean + stddev * z_bound, mean + stddev * -z_bound];
    if let Some(value) = extremes.into_iter().find(|v| !v.is_finite()) {
        return Err(Error::InvalidArgument(format!(
            "{variant} initializer: mean {mean} and stddev {stddev} overflow: \
             mean ± stddev * {z_bound} (the largest |z| it draws) gives {value}, \
             and every value must be finite"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const N: u64 = 100_000;

    fn row(init: &Initializer, key: u64, dim: usize) -> Vec<f32> {
        let mut out = vec![f32::NAN; dim];
        init.fill(key, &mut out);
        out
    }

    /// One value per key for keys `0..N`.
    fn column(init: &Initializer) -> Vec<f32> {
        (0..N).map(|k| row(init, k, 1)[0]).collect()
    }

    fn mean_sd(xs: &[f32]) -> (f64, f64) {
        let n = xs.len() as f64;
        let mean = xs.iter().map(|&x| f64::from(x)).sum::<f64>() / n;
        let var = xs
            .iter()
            .map(|&x| (f64::from(x) - mean).powi(2))
            .sum::<f64>()
            / (n - 1.0);
        (mean, var.sqrt())
    }

    fn correlation(a: &[f32], b: &[f32]) -> f64 {
        let (ma, sa) = mean_sd(a);
        let (mb, sb) = mean_sd(b);
        let cov = a
            .iter()
            .zip(b)
            .map(|(&x, &y)| (f64::from(x) - ma) * (f64::from(y) - mb))
            .sum::<f64>()
            / (a.len() as f64 - 1.0);
        cov / (sa * sb)
    }

    fn random_variants(seed: u64) -> [Initializer; 3] {
        [
            Initializer::RandomNormal {
                mean: 0.0,
                stddev: 1.0,
                seed,
            },
            Initializer::TruncatedNormal {
                mean: 0.0,
                stddev: 1.0,
                seed,
            },
            Initializer::RandomUniform {
                low: -1.0,
                high: 1.0,
                seed,
            },
        ]
    }

    #[test]
    fn same_seed_and_key_give_identical_rows() {
        for init in random_variants(7) {
            for key in [0, 1, 42, u64::MAX, (-5i64) as u64] {
                let a = row(&init, key, 16);
                let b = row(&init, key, 16);
                let c = row(&init.clone(), key, 16);
                assert_eq!(a, b, "{init:?} key {key}");
                assert_eq!(a, c, "{init:?} key {key}");
                assert!(a.iter().all(|x| x.is_finite()));
            }
        }
    }

    #[test]
    fn different_keys_give_different_rows() {
        for init in random_variants(3) {
            let keys = if cfg!(miri) { 40 } else { 1000 };
            let rows: Vec<Vec<f32>> = (0..keys).map(|k| row(&init, k, 8)).collect();
            for i in 0..rows.len() {
                for j in i + 1..rows.len() {
                    assert_ne!(rows[i], rows[j], "{init:?} keys {i} and {j}");
                }
            }
            // Within a row the elements differ too.
            assert!(rows[0].windows(2).all(|w| w[0] != w[1]), "{init:?}");
        }
    }

    #[test]
    fn different_seeds_give_different_rows() {
        for key in [0, 1, 99] {
            for seed_a in 0..20u64 {
                for seed_b in seed_a + 1..20 {
                    for (a, b) in random_variants(seed_a).iter().zip(&random_variants(seed_b)) {
                        assert_ne!(row(a, key, 8), row(b, key, 8), "key {key}");
                    }
                }
            }
        }
    }

    #[test]
    fn row_does_not_depend_on_earlier_fills_order_or_thread() {
        for init in random_variants(11) {
            let fresh = row(&init.clone(), 12_345, 8);
            let keys: Vec<u64> = (0..500).collect();
            let forward: Vec<Vec<f32>> = keys.iter().map(|&k| row(&init, k, 8)).collect();
            assert_eq!(row(&init, 12_345, 8), fresh);
            let backward: Vec<Vec<f32>> = keys.iter().rev().map(|&k| row(&init, k, 8)).collect();
            let backward: Vec<Vec<f32>> = backward.into_iter().rev().collect();
            assert_eq!(forward, backward);
            let threaded: Vec<Vec<f32>> = std::thread::scope(|s| {
                let handles: Vec<_> = keys
                    .chunks(100)
                    .map(|chunk| {
                        let init = &init;
                        s.spawn(move || chunk.iter().map(|&k| row(init, k, 8)).collect::<Vec<_>>())
                    })
                    .collect();
                handles
                    .into_iter()
                    .flat_map(|h| h.join().unwrap())
                    .collect()
            });
            assert_eq!(forward, threaded);
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "correlation over many rows: too slow under Miri")]
    fn neighbouring_keys_and_seeds_are_uncorrelated() {
        // SE of a correlation over 100k pairs is ~0.003.
        for init in random_variants(0) {
            let col = column(&init);
            let r = correlation(&col[..col.len() - 1], &col[1..]);
            assert!(r.abs() < 0.015, "{init:?}: lag-1 correlation {r}");
        }
        for (a, b) in random_variants(0).iter().zip(&random_variants(1)) {
            let r = correlation(&column(a), &column(b));
            assert!(r.abs() < 0.015, "{a:?} vs seed 1: correlation {r}");
        }
        // Elements of one row are uncorrelated too.
        let init = Initializer::RandomNormal {
            mean: 0.0,
            stddev: 1.0,
            seed: 5,
        };
        let (first, second): (Vec<f32>, Vec<f32>) = (0..N)
            .map(|k| {
                let r = row(&init, k, 2);
                (r[0], r[1])
            })
            .unzip();
        let r = correlation(&first, &second);
        assert!(r.abs() < 0.015, "elements 0 and 1: correlation {r}");
    }

    #[test]
    fn golden_rows_are_stable() {
        // Pinned bits: a change here changes the rows every existing
        // deployment reads for keys it has not inserted yet.
        let normal = Initializer::RandomNormal {
            mean: 0.0,
            stddev: 1.0,
            seed: 0,
        };
        let truncated = Initializer::TruncatedNormal {
            mean: 0.0,
            stddev: 1.0,
            seed: 0,
        };
        let uniform = Initializer::RandomUniform {
            low: 0.0,
            high: 1.0,
            seed: 0,
        };
        let bits = |init: &Initializer, key: u64| -> [u32; 3] {
            let mut out = [0.0f32; 3];
            init.fill(key, &mut out);
            out.map(f32::to_bits)
        };
        assert_eq!(bits(&normal, 0), [0x3D71_8F73, 0xBE30_A0F5, 0x3FD1_DE39]);
        assert_eq!(bits(&normal, 1), [0x3F41_7024, 0xC017_56D7, 0xBFB0_0C09]);
        // Same stream as the normal row: no draw of it exceeds 2 sd.
        assert_eq!(bits(&truncated, 0), [0x3D71_8F73, 0xBE30_A0F5, 0x3FD1_DE39]);
        assert_eq!(bits(&uniform, 0), [0x3F0B_6C5C, 0x3EDE_0ADC, 0x3F79_B35D]);
        assert_eq!(
            bits(&uniform, u64::MAX),
            [0x3D76_21B1, 0x3F60_7307, 0x3F67_5A55]
        );
    }

    #[test]
    #[cfg_attr(miri, ignore = "100k samples: too slow under Miri")]
    fn random_normal_statistics() {
        let (m, s) = (0.5f32, 2.0f32);
        let xs = column(&Initializer::RandomNormal {
            mean: m,
            stddev: s,
            seed: 17,
        });
        let (mean, sd) = mean_sd(&xs);
        assert!((mean - 0.5).abs() < 0.02 * 2.0, "mean {mean}");
        assert!((sd - 2.0).abs() < 0.02 * 2.0, "sd {sd}");
        // About 4.55% of a normal lies beyond 2 sd, 0.27% beyond 3 sd.
        let beyond =
            |k: f32| xs.iter().filter(|&&x| (x - m).abs() > k * s).count() as f64 / N as f64;
        assert!(
            (beyond(2.0) - 0.0455).abs() < 0.004,
            "beyond 2 sd: {}",
            beyond(2.0)
        );
        assert!(
            (beyond(3.0) - 0.0027).abs() < 0.001,
            "beyond 3 sd: {}",
            beyond(3.0)
        );
    }

    #[test]
    #[cfg_attr(miri, ignore = "100k samples: too slow under Miri")]
    fn random_normal_statistics_over_wide_rows() {
        // A few elements per key: every position of the row is N(mean, stddev).
        let init = Initializer::RandomNormal {
            mean: -1.0,
            stddev: 0.1,
            seed: 2,
        };
        let dim = 4;
        let mut all = vec![0.0f32; 25_000 * dim];
        for (k, out) in all.chunks_mut(dim).enumerate() {
            init.fill(k as u64, out);
        }
        let (mean, sd) = mean_sd(&all);
        assert!((mean + 1.0).abs() < 0.02 * 0.1, "mean {mean}");
        assert!((sd - 0.1).abs() < 0.02 * 0.1, "sd {sd}");
        for j in 0..dim {
            let col: Vec<f32> = all.iter().skip(j).step_by(dim).copied().collect();
            let (mean, sd) = mean_sd(&col);
            assert!((mean + 1.0).abs() < 0.004, "element {j}: mean {mean}");
            assert!((sd - 0.1).abs() < 0.004, "element {j}: sd {sd}");
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "100k samples: too slow under Miri")]
    fn truncated_normal_statistics() {
        let (m, s) = (0.5f32, 2.0f32);
        let xs = column(&Initializer::TruncatedNormal {
            mean: m,
            stddev: s,
            seed: 23,
        });
        let (lo, hi) = (m - 2.0 * s, m + 2.0 * s);
        assert!(xs.iter().all(|&x| (lo..=hi).contains(&x)));
        let (mean, sd) = mean_sd(&xs);
        assert!((mean - 0.5).abs() < 0.02 * 2.0, "mean {mean}");
        // Standard deviation of N(0, 1) truncated to [-2, 2].
        let expected_sd = 0.879_626 * 2.0;
        assert!((sd - expected_sd).abs() < 0.01 * expected_sd, "sd {sd}");
        // Values do reach out towards the bound.
        assert!(xs.iter().any(|&x| (x - m).abs() > 1.9 * s));
    }

    #[test]
    #[cfg_attr(miri, ignore = "100k samples: too slow under Miri")]
    fn random_uniform_statistics() {
        let (low, high) = (-3.0f32, 5.0f32);
        let xs = column(&Initializer::RandomUniform {
            low,
            high,
            seed: 31,
        });
        assert!(xs.iter().all(|&x| (low..high).contains(&x)));
        let (mean, sd) = mean_sd(&xs);
        let width = f64::from(high - low);
        assert!((mean - 1.0).abs() < 0.01 * width, "mean {mean}");
        let var = sd * sd;
        let expected_var = width * width / 12.0;
        assert!(
            (var - expected_var).abs() < 0.02 * expected_var,
            "var {var}"
        );
        // Ten equal buckets each hold about a tenth.
        let mut buckets = [0usize; 10];
        for &x in &xs {
            buckets[((f64::from(x - low) / width) * 10.0) as usize] += 1;
        }
        for (i, &count) in buckets.iter().enumerate() {
            let share = count as f64 / N as f64;
            assert!((share - 0.1).abs() < 0.005, "bucket {i}: {share}");
        }
    }

    #[test]
    fn random_uniform_never_reaches_high() {
        let keys = if cfg!(miri) { 100 } else { 10_000 };
        // A one-ulp range: rounding would give `high` about half the time.
        let low = 1.0f32;
        let high = f32::from_bits(low.to_bits() + 1);
        let init = Initializer::RandomUniform { low, high, seed: 4 };
        for k in 0..keys {
            assert_eq!(row(&init, k, 4), [low; 4]);
        }
        // Negative and zero upper bounds.
        for (low, high) in [(-2.0f32, -1.0f32), (-1e-30, 0.0), (0.0, 1e-38)] {
            let init = Initializer::RandomUniform { low, high, seed: 4 };
            for k in 0..keys {
                assert!(row(&init, k, 4).iter().all(|x| (low..high).contains(x)));
            }
        }
        // The widest finite range does not overflow.
        let init = Initializer::RandomUniform {
            low: -f32::MAX,
            high: f32::MAX,
            seed: 4,
        };
        assert!(init.validate(4).is_ok());
        let xs: Vec<f32> = (0..keys).flat_map(|k| row(&init, k, 4)).collect();
        assert!(xs.iter().all(|x| x.is_finite() && *x < f32::MAX));
        assert!(xs.iter().any(|&x| x < -1e38) && xs.iter().any(|&x| x > 1e38));
    }

    #[test]
    fn degenerate_random_settings_give_exact_values() {
        for seed in [0, 9] {
            let normal = Initializer::RandomNormal {
                mean: 0.25,
                stddev: 0.0,
                seed,
            };
            let truncated = Initializer::TruncatedNormal {
                mean: -3.5,
                stddev: -0.0,
                seed,
            };
            let uniform = Initializer::RandomUniform {
                low: 1.5,
                high: 1.5,
                seed,
            };
            for key in [0, 1, u64::MAX] {
                assert_eq!(row(&normal, key, 5), [0.25; 5]);
                assert_eq!(row(&truncated, key, 5), [-3.5; 5]);
                assert_eq!(row(&uniform, key, 5), [1.5; 5]);
            }
            assert!(normal.validate(5).is_ok());
            assert!(truncated.validate(5).is_ok());
            assert!(uniform.validate(5).is_ok());
        }
    }

    #[test]
    fn key_independent_variants_give_exact_rows() {
        assert_eq!(row(&Initializer::Zeros, 3, 4), [0.0; 4]);
        assert_eq!(row(&Initializer::default(), 3, 4), [0.0; 4]);
        assert_eq!(row(&Initializer::Constant(-1.25), 3, 4), [-1.25; 4]);
        let values = Initializer::Values(vec![1.0, -2.0, 3.5]);
        for key in [0, 3, u64::MAX] {
            assert_eq!(row(&values, key, 3), [1.0, -2.0, 3.5]);
        }
        assert_eq!(row(&Initializer::Zeros, 3, 0), Vec::<f32>::new());
    }

    #[test]
    fn values_of_another_length_do_not_panic() {
        let values = Initializer::Values(vec![1.0, 2.0, 3.0]);
        assert_eq!(row(&values, 0, 2), [1.0, 2.0]);
        assert_eq!(row(&values, 0, 5), [1.0, 2.0, 3.0, 0.0, 0.0]);
        assert_eq!(row(&Initializer::Values(vec![]), 0, 2), [0.0, 0.0]);
    }

    #[test]
    fn validate_accepts_good_settings() {
        let good = [
            Initializer::Zeros,
            Initializer::Constant(0.5),
            Initializer::Values(vec![0.0, 1.0, -1.0, 2.0]),
            Initializer::RandomNormal {
                mean: 0.0,
                stddev: 0.05,
                seed: 1,
            },
            Initializer::TruncatedNormal {
                mean: 1.0,
                stddev: 2.0,
                seed: u64::MAX,
            },
            Initializer::RandomUniform {
                low: -0.1,
                high: 0.1,
                seed: 0,
            },
        ];
        for init in good {
            assert_eq!(init.validate(4), Ok(()), "{init:?}");
        }
    }

    fn message(result: Result<()>) -> String {
        match result {
            Err(Error::InvalidArgument(msg)) => msg,
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn validate_rejects_values_of_wrong_length() {
        let msg = message(Initializer::Values(vec![0.0; 5]).validate(7));
        assert!(msg.contains('7') && msg.contains('5'), "{msg}");
        let msg = message(Initializer::Values(vec![0.0; 12]).validate(3));
        assert!(msg.contains("12") && msg.contains('3'), "{msg}");
    }

    #[test]
    fn validate_rejects_non_finite_parameters() {
        let bad = [
            Initializer::Constant(f32::NAN),
            Initializer::Constant(f32::INFINITY),
            Initializer::Values(vec![0.0, f32::NAN]),
            Initializer::Values(vec![f32::NEG_INFINITY, 0.0]),
            Initializer::RandomNormal {
                mean: f32::NAN,
                stddev: 1.0,
                seed: 0,
            },
            Initializer::RandomNormal {
                mean: 0.0,
                stddev: f32::NAN,
                seed: 0,
            },
            Initializer::TruncatedNormal {
                mean: 0.0,
                stddev: f32::INFINITY,
                seed: 0,
            },
            Initializer::TruncatedNormal {
                mean: f32::NAN,
                stddev: 1.0,
                seed: 0,
            },
            Initializer::RandomUniform {
                low: f32::NAN,
                high: 1.0,
                seed: 0,
            },
            Initializer::RandomUniform {
                low: 0.0,
                high: f32::NAN,
                seed: 0,
            },
            Initializer::RandomUniform {
                low: f32::NEG_INFINITY,
                high: 0.0,
                seed: 0,
            },
        ];
        for init in bad {
            let msg = message(init.validate(2));
            assert!(msg.contains("finite"), "{init:?}: {msg}");
        }
    }

    #[test]
    fn validate_rejects_negative_stddev_and_reversed_range() {
        for init in [
            Initializer::RandomNormal {
                mean: 0.0,
                stddev: -1.0,
                seed: 0,
            },
            Initializer::TruncatedNormal {
                mean: 0.0,
                stddev: -1e-9,
                seed: 0,
            },
        ] {
            let msg = message(init.validate(1));
            assert!(msg.contains("stddev"), "{msg}");
        }
        let msg = message(
            Initializer::RandomUniform {
                low: 2.0,
                high: 1.0,
                seed: 0,
            }
            .validate(1),
        );
        assert!(msg.contains("low") && msg.contains("high"), "{msg}");
    }

    #[test]
    fn unvalidated_nan_parameters_do_not_panic_or_hang() {
        for init in [
            Initializer::RandomNormal {
                mean: 0.0,
                stddev: f32::NAN,
                seed: 0,
            },
            Initializer::TruncatedNormal {
                mean: f32::NAN,
                stddev: f32::NAN,
                seed: 0,
            },
            Initializer::RandomUniform {
                low: f32::NAN,
                high: 1.0,
                seed: 0,
            },
            Initializer::RandomUniform {
                low: 2.0,
                high: 1.0,
                seed: 0,
            },
        ] {
            let mut out = [0.0f32; 8];
            init.fill(1, &mut out);
        }
    }

    /// A generator that returns `script`, then alternates `u64::MAX` and 0
    /// from its first odd draw (so a pending tail loop of the ziggurat draws
    /// x_ ~ 1 and y_ = 2^-53, and exits).
    struct Scripted {
        script: Vec<u64>,
        next: usize,
    }

    impl RngCore for Scripted {
        fn next_u32(&mut self) -> u32 {
            self.next_u64() as u32
        }
        fn next_u64(&mut self) -> u64 {
            let i = self.next;
            self.next += 1;
            match self.script.get(i) {
                Some(&v) => v,
                None if i % 2 == 1 => u64::MAX,
                None => 0,
            }
        }
        fn fill_bytes(&mut self, dst: &mut [u8]) {
            for chunk in dst.chunks_mut(8) {
                let bytes = self.next_u64().to_le_bytes();
                chunk.copy_from_slice(&bytes[..chunk.len()]);
            }
        }
    }

    #[test]
    fn the_normal_samplers_largest_z_is_below_the_bound() {
        // The ziggurat's first draw: layer 0 (low 8 bits 0) at u = -1 (bits
        // 12.. zero), beyond the layer: the tail step, which draws
        // x = ln(x_) / R and y = ln(y_) (x_, y_ from Open01: the top 52
        // bits n give (n + 0.5) * 2^-52) until x² <= -2y, and returns
        // -(R + |x|). The largest |x| comes with the smallest y_ (n = 0);
        // scan x_ around where x² = -2 ln(2^-53).
        let mut largest = 0.0f32;
        for n in 1u64..400 {
            let mut rng = Scripted {
                script: vec![0, n << 12, 0],
                next: 0,
            };
            let z: f32 = rng.sample(StandardNormal);
            largest = largest.max(z.abs());
        }
        println!("largest |z| of the tail: {largest}");
        assert!(
            largest > 12.2,
            "the scan reaches the tail's extreme: {largest}"
        );
        assert!(
            largest < Initializer::NORMAL_Z_BOUND,
            "largest |z| {largest} vs bound {}",
            Initializer::NORMAL_Z_BOUND
        );
        // Below x² = 73.47 the tail returns at once; above it, it draws again.
        let mut rng = Scripted {
            script: vec![0, 0, 0],
            next: 0,
        };
        let z: f32 = rng.sample(StandardNormal);
        assert!(z.abs() < 4.0, "x_ = 2^-53 is refused, then x_ ~ 1: {z}");
    }

    #[test]
    fn normal_parameters_whose_values_overflow_are_rejected() {
        let bound = Initializer::NORMAL_Z_BOUND;
        let normal = |mean, stddev| Initializer::RandomNormal {
            mean,
            stddev,
            seed: 0,
        };
        let truncated = |mean, stddev| Initializer::TruncatedNormal {
            mean,
            stddev,
            seed: 0,
        };
        for bad in [
            normal(f32::MAX, f32::MAX),
            normal(3e38, 1e37),
            normal(-3e38, 1e37),
            normal(0.0, f32::MAX / 12.0),
            truncated(f32::MAX, f32::MAX),
            truncated(3e38, 3e37),
            truncated(0.0, f32::MAX / 1.9),
            truncated(-f32::MAX, 1e32),
        ] {
            let msg = message(bad.validate(1));
            assert!(msg.contains("overflow"), "{bad:?}: {msg}");
        }
        // At the edge: the largest values are finite, and so is every row.
        for good in [
            normal(0.0, f32::MAX / bound * 0.999_999),
            normal(f32::MAX, 1.0),
            normal(3e38, 1e30),
            truncated(0.0, f32::MAX / 2.0),
            truncated(f32::MAX / 2.0, f32::MAX / 4.0),
            truncated(-f32::MAX, 1.0),
        ] {
            assert_eq!(good.validate(3), Ok(()), "{good:?}");
            for key in 0..if cfg!(miri) { 20 } else { 2000 } {
                let r = row(&good, key, 3);
                assert!(r.iter().all(|x| x.is_finite()), "{good:?} key {key}: {r:?}");
            }
        }
    }

    #[test]
    fn uniform_over_the_widest_range_is_accepted_and_finite() {
        // `high - low` overflows in f32 but not in f64, where fill computes.
        let init = Initializer::RandomUniform {
            low: -3e38,
            high: 3e38,
            seed: 1,
        };
        assert_eq!(init.validate(2), Ok(()));
        for key in 0..if cfg!(miri) { 20 } else { 5000 } {
            let r = row(&init, key, 2);
            assert!(
                r.iter().all(|&x| (-3e38..3e38).contains(&x)),
                "key {key}: {r:?}"
            );
        }
    }

    #[test]
    fn is_key_independent_per_variant() {
        assert!(Initializer::Zeros.is_key_independent());
        assert!(Initializer::Constant(1.0).is_key_independent());
        assert!(Initializer::Values(vec![1.0]).is_key_independent());
        for init in random_variants(0) {
            assert!(!init.is_key_independent(), "{init:?}");
        }
    }
}
