//! `max_norm`: TensorFlow 2.16's `clip_by_norm` on embedding rows, and the
//! way TFRA applies it in its default (TRAIN) model mode, without ever
//! turning a finite row into infinities or NaNs.
//!
//! [`clip_by_norm`] is `tf.clip_by_norm(row, max_norm, axes=[-1])` to the
//! bit, for `f32`, wherever TensorFlow's arithmetic stays in range (the
//! *plain path*):
//! - `c = max_norm`, or `0` if `max_norm < 0` (TF turns a negative scalar
//!   into 0; a NaN stays NaN);
//! - `l2 = ((x0*x0 + x1*x1) + x2*x2) + ...`, summed left to right, with
//!   no epsilon;
//! - `n = sqrt(l2)` if `l2 > 0`, else `l2` (0, or NaN);
//! - every value becomes `(x * c) / max(n, c)`, `max` propagating NaN as
//!   TF's `Maximum` does.
//!
//! Every row is divided, clipped or not, so a row shorter than `c` can
//! still change in its last bit when `c` is not a power of two; a row whose
//! squares overflow to infinity becomes a row of signed zeros (as TFRA
//! returns it: the goldens record it); a zero row stays zero (for `c > 0`).
//!
//! One case differs from TensorFlow: a finite row that TensorFlow would
//! turn into infinities or NaNs, because some `x * c` overflows (`f32::MAX`
//! turns `[3, 4, 0, 0]` into `[inf, inf, 0, 0]`; `1e30` turns rows of
//! `+-1e20`, whose squares overflow too, into NaN). Such a row takes the
//! *wide path*: the same formula computed in `f64`, where no square or
//! product of `f32`s overflows or underflows (the same as scaling the row
//! by its largest magnitude first), rounded once to `f32`: the exact clip
//! to within that rounding, always finite. Every other row keeps
//! TensorFlow's bits.
//!
//! TFRA in TRAIN mode (the default, and what the goldens record) clips each
//! looked-up row twice: once when its `ShadowVariable` prefetches the rows
//! and again when the `TrainableWrapper` reads them. The second clip can
//! move a clipped row by an ulp or two, so [`clip_rows`], which the lookup
//! functions use, applies [`clip_by_norm`] twice. With `max_norm <= 0`,
//! NaN or infinite, TFRA's result is NaN or zeros for every row, so the
//! lookup functions refuse such a bound ([`check_clip_bound`]); in
//! INFERENCE mode TFRA ignores `max_norm` altogether: pass `None` to get
//! that.
//!
//! The left-to-right sum is TensorFlow's order for rows narrower than an
//! AVX register (eight `f32`s; the goldens check `dim` 4). For wider rows
//! TF's Eigen reduction sums in vector lanes, so its norm, and then a
//! clipped row, may differ from this one in the last bit.

use crate::{Error, Result};

/// Checks a `max_norm` given to the lookup functions: finite and above 0
/// (TFRA's result for any other bound is NaN or zero rows). An
/// [`Error::InvalidInput`] otherwise.
pub fn check_clip_bound(max_norm: f32) -> Result<()> {
    if max_norm.is_finite() && max_norm > 0.0 {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "max_norm must be finite and above 0, got {max_norm}"
        )))
    }
}

/// Whether TensorFlow's clip of `row` to `c` would not be finite although
/// `row` and `c` are (`c` above 0): some `x * c` overflows.
pub fn overflows(row: &[f32], c: f32) -> bool {
    c.is_finite()
        && c > 0.0
        && row.iter().all(|x| x.is_finite())
        && row.iter().any(|&x| (x * c).is_infinite())
}

/// Clips `row` to L2 norm `max_norm` exactly as one TensorFlow
/// `clip_by_norm` does (see the [module docs](self)).
pub fn clip_by_norm(row: &mut [f32], max_norm: f32) {
    let c = if max_norm < 0.0 { 0.0 } else { max_norm };
    if overflows(row, c) {
        clip_wide(row, c);
        return;
    }
    let l2 = row.iter().fold(0.0_f32, |sum, &x| sum + x * x);
    let norm = if l2 > 0.0 { l2.sqrt() } else { l2 };
    let divisor = max_propagating_nan(norm, c);
    for x in row {
        *x = (*x * c) / divisor;
    }
}

/// The wide path: TensorFlow's formula in `f64` (where no square or
/// product of `f32`s leaves the range), rounded once. `row` is finite and
/// not zero, `c` finite and above 0.
pub(crate) fn clip_wide(row: &mut [f32], c: f32) {
    let c = f64::from(c);
    let l2: f64 = row.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
    let divisor = l2.sqrt().max(c);
    for x in row {
        *x = ((f64::from(*x) * c) / divisor) as f32;
    }
}

/// Applies TFRA's TRAIN-mode `max_norm` to each `dim`-value row of
/// `values`: [`clip_by_norm`] twice. Does nothing when `dim` is 0.
pub fn clip_rows(values: &mut [f32], dim: usize, max_norm: f32) {
    if dim == 0 {
        return;
    }
    for row in values.chunks_exact_mut(dim) {
        clip_by_norm(row, max_norm);
        clip_by_norm(row, max_norm);
    }
}

/// TensorFlow's `Maximum` (Eigen's `PropagateNaN`): NaN if either is.
fn max_propagating_nan(a: f32, b: f32) -> f32 {
    if a.is_nan() {
        a
    } else if b.is_nan() || a < b {
        b
    } else {
        a
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clipped(row: &[f32], max_norm: f32) -> Vec<f32> {
        let mut out = row.to_vec();
        clip_by_norm(&mut out, max_norm);
        out
    }

    fn bits(row: &[f32]) -> Vec<u32> {
        row.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn long_rows_scale_to_max_norm_short_rows_are_still_divided() {
        assert_eq!(clipped(&[3.0, 4.0, 0.0, 0.0], 2.0), [1.2, 1.6, 0.0, 0.0]);
        // Not clipped (norm 1 < 2) and a power-of-two c: unchanged.
        assert_eq!(clipped(&[-1.0, 0.0, 0.0, 0.0], 2.0), [-1.0, 0.0, 0.0, 0.0]);
        // Not clipped, but x * 0.7 / 0.7 is not always x.
        let x = 0.1_f32;
        let c = 0.7_f32;
        let row = [x, 0.2, 0.3, 0.4];
        assert_eq!(clipped(&row, c)[0].to_bits(), ((x * c) / c).to_bits());
    }

    #[test]
    fn squares_are_summed_left_to_right() {
        // 2^24 + 1 rounds back to 2^24, 1 + 1 + 1 + 2^24 would not.
        let row = [4096.0_f32, 1.0, 1.0, 1.0];
        let l2 = ((4096.0_f32 * 4096.0 + 1.0) + 1.0) + 1.0;
        assert_eq!(l2, 4096.0 * 4096.0, "each + 1 is lost in order");
        let out = clipped(&row, 1.0);
        assert_eq!(out[0], 4096.0 / l2.sqrt());
    }

    #[test]
    fn edge_rows_and_edge_norms() {
        let zero = [0.0_f32; 4];
        assert_eq!(clipped(&zero, 2.0), zero);
        // Squares overflow: the norm is infinite and the row becomes +-0
        // (finite: TensorFlow's result is kept).
        let signed_zeros = [0, (-0.0_f32).to_bits(), 0, 0];
        assert_eq!(bits(&clipped(&[3e19, -4e19, 0.0, 0.0], 2.0)), signed_zeros);
        // Squares underflow to 0: 0 is not > 0, the row is divided by c.
        let tiny = [1e-25_f32, -2e-25, 3e-25, 0.0];
        assert_eq!(clipped(&tiny, 2.0), tiny.map(|x| (x * 2.0) / 2.0));
        // A negative max_norm is 0 (the lookup functions refuse it): rows
        // become +-0, a zero row 0/0.
        assert_eq!(bits(&clipped(&[1.0, -2.0, 0.0, 0.0], -3.0)), signed_zeros);
        assert!(clipped(&zero, -1.0).iter().all(|x| x.is_nan()));
        // NaN max_norm or a NaN value: NaN everywhere.
        assert!(clipped(&[1.0, 2.0], f32::NAN).iter().all(|x| x.is_nan()));
        assert!(clipped(&[1.0, f32::NAN], 2.0).iter().all(|x| x.is_nan()));
    }

    /// TensorFlow's `f32` arithmetic, as the plain path must compute it.
    fn tensorflow(row: &[f32], c: f32) -> Vec<f32> {
        let l2 = row.iter().fold(0.0_f32, |sum, &x| sum + x * x);
        let norm = if l2 > 0.0 { l2.sqrt() } else { l2 };
        row.iter().map(|&x| (x * c) / norm.max(c)).collect()
    }

    #[test]
    fn rows_in_range_keep_tensorflows_bits() {
        let mut state = 0x2545_f491_u32;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            (state as f32 / u32::MAX as f32 - 0.5) * 8.0
        };
        for c in [0.01_f32, 0.7, 1.0, 2.0, 3.3, 1e6] {
            for _ in 0..200 {
                let row: Vec<f32> = (0..4).map(|_| next()).collect();
                assert!(!overflows(&row, c), "{row:?} {c}");
                assert_eq!(
                    bits(&clipped(&row, c)),
                    bits(&tensorflow(&row, c)),
                    "{row:?} {c}"
                );
            }
        }
    }

    #[test]
    fn extreme_bounds_and_rows_never_become_infinite_or_nan() {
        let cases: [(&[f32], f32); 5] = [
            (&[3.0, 4.0, 0.0, 0.0], f32::MAX),
            (&[1e20, -1e20, 1e20, -1e20], 1e30),
            (&[f32::MAX, f32::MAX, -f32::MAX, 1.0], 2.0),
            (&[f32::MAX, f32::MAX, -f32::MAX, 1.0], f32::MAX),
            (&[3e38, 1.0, 0.0, 0.0], 1e30),
        ];
        for (row, c) in cases {
            assert!(overflows(row, c), "{row:?} {c}");
            let once = clipped(row, c);
            let mut twice = row.to_vec();
            clip_rows(&mut twice, row.len(), c);
            for out in [&once, &twice] {
                assert!(out.iter().all(|x| x.is_finite()), "{row:?} {c}: {out:?}");
                // The exact clip, to within f32 rounding.
                let x: Vec<f64> = row.iter().map(|&v| f64::from(v)).collect();
                let norm = x.iter().map(|v| v * v).sum::<f64>().sqrt();
                for (got, x) in out.iter().zip(&x) {
                    let want = x * f64::from(c) / norm.max(f64::from(c));
                    let tolerance = want.abs() * 1e-6 + 1e-45;
                    assert!(
                        (f64::from(*got) - want).abs() <= tolerance,
                        "{row:?} {c}: {out:?}"
                    );
                }
            }
        }
        // f32::MAX on [3, 4, 0, 0]: within the bound, kept (TensorFlow:
        // [inf, inf, 0, 0]).
        let row = [3.0_f32, 4.0, 0.0, 0.0];
        assert_eq!(clipped(&row, f32::MAX), row);
        assert_eq!(tensorflow(&row, f32::MAX)[..2], [f32::INFINITY; 2]);
        // A subnormal bound: TensorFlow's arithmetic, finite.
        for row in [[3.0_f32, 4.0, 0.0, 0.0], [1e-45, -1e-45, 0.0, 0.0]] {
            assert!(!overflows(&row, 1e-45));
            assert!(clipped(&row, 1e-45).iter().all(|x| x.is_finite()));
        }
        // Rows of 1e20 are within a bound of 1e30 (TensorFlow: NaN).
        let row = [1e20_f32, -1e20, 1e20, -1e20];
        assert_eq!(clipped(&row, 1e30), row);
        assert!(tensorflow(&row, 1e30).iter().all(|x| x.is_nan()));
    }

    #[test]
    fn clip_bounds_for_the_lookup_functions() {
        for good in [1e-45, f32::MIN_POSITIVE, 0.5, f32::MAX] {
            assert!(check_clip_bound(good).is_ok(), "{good}");
        }
        for bad in [0.0, -0.0, -1.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            assert!(check_clip_bound(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn clip_rows_clips_each_row_twice() {
        let rows = [[30.0_f32, -40.0, 0.0, 0.0], [0.1, 0.2, 0.3, 0.4]];
        let mut values = rows.concat();
        clip_rows(&mut values, 4, 0.7);
        for (row, got) in rows.iter().zip(values.chunks_exact(4)) {
            let mut twice = *row;
            clip_by_norm(&mut twice, 0.7);
            clip_by_norm(&mut twice, 0.7);
            assert_eq!(got, twice);
        }
        // One clip gives 0.42; the second moves it to the next float up.
        assert_eq!(clipped(&rows[0], 0.7)[0], 0.42);
        assert_eq!(values[0], 0.420_000_02);
        let before = values.clone();
        clip_rows(&mut values, 0, 0.7);
        assert_eq!(values, before);
    }
}
