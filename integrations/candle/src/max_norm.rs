//! `max_norm`: TensorFlow's `clip_by_norm` on each row of looked-up
//! embeddings, as candle operations so that the gradient flows through the
//! clip (TFRA clips the looked-up rows inside the graph).
//!
//! For a row `x` and a bound `c > 0`, the result is `x * c / max(||x||, c)`
//! computed in TensorFlow's order (`(x * c) / max(norm, c)`), so a row
//! within the bound comes back as `(x * c) / c`. The gradient is
//! TensorFlow's too:
//! - a row of norm 0 gets the plain gradient `g` (TensorFlow computes the
//!   norm of a zero row without a square root, so no `0 / 0`);
//! - at `||x|| == c` the gradient goes through the norm (TensorFlow's
//!   `maximum` gradient sends ties to its first argument).
//!
//! A finite row never becomes infinite or NaN, forward or backward: a row
//! whose squares or products, or their gradients, could leave `f32`'s
//! range (its sum of squares or its largest `|x| * c` outside
//! [`PLAIN_RANGE`]) is clipped by the same operations in `f64`, where they
//! stay in range, and rounded back: the exact clip and gradient to within
//! that rounding. Every other row takes TensorFlow's `f32` arithmetic, bit
//! for bit, its gradient included. So the layers differ from TensorFlow
//! (and from the lookup functions of [`crate::clip`], which keep
//! TensorFlow's result wherever it is finite) on rows that far from 1: a
//! row whose squares overflow is clipped, not zeroed, and keeps a
//! gradient. The bound itself must be a normal positive number
//! ([`check_max_norm`]): the layers' configs refuse any other, since a
//! subnormal bound makes TensorFlow's gradient of a short row infinite.
//!
//! A layer clips the distinct rows of a batch before gathering them to
//! their positions: the result is the same as clipping every position, and
//! the gradient reaching a distinct row is the clip's Jacobian applied to
//! the sum of its positions' gradients, which is what TensorFlow computes
//! for the sum of the per-position clips.

use candle_core::{DType, Tensor, D};

use crate::{Error, Result};

/// The range (`2^-100 ..= 2^100`) in which a row's sum of squares and its
/// largest `|x| * max_norm` keep it on TensorFlow's `f32` arithmetic (see
/// the [module docs](self)).
pub const PLAIN_RANGE: std::ops::RangeInclusive<f32> =
    f32::from_bits(0x0d80_0000)..=f32::from_bits(0x7180_0000);

/// Whether the clip of `row` to `c` takes TensorFlow's `f32` arithmetic
/// (see the [module docs](self)): the row is zero or not finite, or its sum
/// of squares (TensorFlow's) and its largest `|x| * c` lie in
/// [`PLAIN_RANGE`].
pub fn takes_plain_path(row: &[f32], c: f32) -> bool {
    let l2 = row.iter().fold(0.0_f32, |sum, &x| sum + x * x);
    let largest = row.iter().fold(0.0_f32, |m, &x| m.max(x.abs()));
    !row.iter().all(|x| x.is_finite())
        || largest == 0.0
        || (PLAIN_RANGE.contains(&l2) && PLAIN_RANGE.contains(&(largest * c)))
}

/// Checks a `max_norm` bound for a layer: a normal positive number
/// (finite, above 0, not subnormal); an [`Error::InvalidInput`] otherwise.
pub fn check_max_norm(max_norm: f32) -> Result<()> {
    if max_norm.is_normal() && max_norm > 0.0 {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "max_norm must be a normal positive number (finite, above 0, not subnormal), got {max_norm}"
        )))
    }
}

/// Each row of `rows` (its last dimension) clipped to L2 norm `max_norm`,
/// differentiably; see the [module docs](self). An
/// [`Error::InvalidInput`] if `max_norm` is not a normal positive number or
/// `rows` is a scalar.
pub fn clip_tensor_rows(rows: &Tensor, max_norm: f32) -> Result<Tensor> {
    check_max_norm(max_norm)?;
    if rows.rank() == 0 {
        return Err(Error::invalid("max_norm clips rows: got a scalar"));
    }
    let Some(wide) = wide_rows(rows, max_norm)? else {
        return tf_clip(rows, max_norm);
    };
    // Each path sees zeros in the other's rows (whose clip and gradient
    // are 0 and finite), so neither path's gradient can be NaN where the
    // selection sends it 0.
    let wide = wide.broadcast_as(rows.shape())?;
    let zeros = rows.zeros_like()?;
    let plain = tf_clip(&wide.where_cond(&zeros, rows)?, max_norm)?;
    let wide_rows = wide.where_cond(rows, &zeros)?.to_dtype(DType::F64)?;
    let widened = tf_clip(&wide_rows, max_norm)?.to_dtype(rows.dtype())?;
    Ok(wide.where_cond(&widened, &plain)?)
}

/// TensorFlow's `clip_by_norm` in `rows`' dtype.
fn tf_clip(rows: &Tensor, max_norm: f32) -> Result<Tensor> {
    let squares = rows.sqr()?.sum_keepdim(D::Minus1)?;
    let positive = squares.gt(0.0)?;
    let safe = positive.where_cond(&squares, &squares.ones_like()?)?;
    let norm = positive.where_cond(&safe.sqrt()?, &squares)?;
    let bound = Tensor::full(max_norm, norm.shape(), norm.device())?.to_dtype(norm.dtype())?;
    let divisor = norm.ge(&bound)?.where_cond(&norm, &bound)?;
    Ok((rows * f64::from(max_norm))?.broadcast_div(&divisor)?)
}

/// A `u8` mask of shape `rows.dims()` with a last dimension of 1, set
/// where a row must take the wide path; `None` if no row must.
fn wide_rows(rows: &Tensor, max_norm: f32) -> Result<Option<Tensor>> {
    let dim = rows.dim(D::Minus1)?;
    let values = rows
        .detach()
        .flatten_all()?
        .to_dtype(DType::F32)?
        .to_vec1::<f32>()?;
    if dim == 0 {
        return Ok(None);
    }
    let wide: Vec<u8> = values
        .chunks_exact(dim)
        .map(|row| u8::from(!takes_plain_path(row, max_norm)))
        .collect();
    if !wide.contains(&1) {
        return Ok(None);
    }
    let mut shape = rows.dims().to_vec();
    *shape.last_mut().expect("rank >= 1") = 1;
    Ok(Some(Tensor::from_vec(wide, shape, rows.device())?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    #[test]
    fn long_rows_are_scaled_to_the_bound_and_short_ones_kept() {
        let rows = Tensor::new(&[[3.0_f32, 4.0], [0.3, 0.4], [0.0, 0.0]], &Device::Cpu).unwrap();
        let clipped = clip_tensor_rows(&rows, 1.0)
            .unwrap()
            .to_vec2::<f32>()
            .unwrap();
        assert_eq!(clipped, [[0.6, 0.8], [0.3, 0.4], [0.0, 0.0]]);
    }

    #[test]
    fn a_zero_row_gets_the_plain_gradient() {
        let rows = Var::new(&[[0.0_f32, 0.0]], &Device::Cpu).unwrap();
        let w = Tensor::new(&[[2.0_f32, -1.0]], &Device::Cpu).unwrap();
        let loss = (clip_tensor_rows(&rows, 1.0).unwrap() * w)
            .unwrap()
            .sum_all()
            .unwrap();
        let grads = loss.backward().unwrap();
        let g = grads.get(&rows).unwrap().to_vec2::<f32>().unwrap();
        assert_eq!(g, [[2.0, -1.0]]);
    }

    /// The clip and the gradient of `sum(clip(x) * w)`, exactly (in f64).
    fn exact(x: &[f32], w: &[f32], c: f32) -> (Vec<f64>, Vec<f64>) {
        let x: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
        let w: Vec<f64> = w.iter().map(|&v| f64::from(v)).collect();
        let c = f64::from(c);
        let norm = x.iter().map(|v| v * v).sum::<f64>().sqrt();
        let xw: f64 = x.iter().zip(&w).map(|(a, b)| a * b).sum();
        let out = x.iter().map(|v| v * c / norm.max(c)).collect();
        let grad = (0..x.len())
            .map(|j| {
                if norm > c {
                    c / norm * (w[j] - xw * x[j] / (norm * norm))
                } else {
                    w[j]
                }
            })
            .collect();
        (out, grad)
    }

    fn assert_near(got: &[f32], want: &[f64], what: &str) {
        for (g, w) in got.iter().zip(want) {
            assert!(g.is_finite(), "{what}: {got:?}");
            assert!(
                (f64::from(*g) - w).abs() <= w.abs() * 1e-5 + 1e-30,
                "{what}: {got:?} vs {want:?}"
            );
        }
    }

    #[test]
    fn extreme_bounds_and_rows_give_finite_rows_and_gradients() {
        let cases: [([f32; 4], f32); 5] = [
            ([3.0, 4.0, 0.0, 0.0], f32::MAX),
            ([3e38, -3e38, 0.0, 1.0], f32::MAX),
            ([1e20, -1e20, 1e20, -1e20], 1e30),
            ([1e20, -1e20, 1e20, -1e20], 2.0),
            ([1e-20, 2e-20, 0.0, -1e-20], 1e-30),
        ];
        let w = [0.5_f32, -1.0, 0.25, 2.0];
        for (row, c) in cases {
            // Beside an ordinary row, which keeps TensorFlow's bits.
            let ordinary = [0.3_f32, -0.4, 1.2, 0.0];
            let rows = Var::new(&[row, ordinary], &Device::Cpu).unwrap();
            let weights = Tensor::new(&[w, w], &Device::Cpu).unwrap();
            let out = clip_tensor_rows(&rows, c).unwrap();
            let loss = (&out * &weights).unwrap().sum_all().unwrap();
            let grads = loss.backward().unwrap();
            let grad = grads.get(&rows).unwrap().to_vec2::<f32>().unwrap();
            let out = out.to_vec2::<f32>().unwrap();
            let (want_out, want_grad) = exact(&row, &w, c);
            assert_near(&out[0], &want_out, &format!("{row:?} clipped to {c}"));
            assert_near(&grad[0], &want_grad, &format!("gradient of {row:?} at {c}"));
            let (want_out, want_grad) = exact(&ordinary, &w, c);
            assert_near(&out[1], &want_out, &format!("{ordinary:?} clipped to {c}"));
            assert_near(
                &grad[1],
                &want_grad,
                &format!("gradient of {ordinary:?} at {c}"),
            );
            if takes_plain_path(&ordinary, c) {
                let plain = tf_clip(&Tensor::new(&[ordinary], &Device::Cpu).unwrap(), c)
                    .unwrap()
                    .to_vec2::<f32>()
                    .unwrap();
                assert_eq!(out[1], plain[0], "a row in range keeps TensorFlow's bits");
            }
        }
    }

    #[test]
    fn bad_bounds_and_scalars_are_errors() {
        let rows = Tensor::new(&[[1.0_f32]], &Device::Cpu).unwrap();
        for bad in [
            0.0,
            -1.0,
            f32::NAN,
            f32::INFINITY,
            1e-45,
            -f32::MIN_POSITIVE,
        ] {
            assert!(clip_tensor_rows(&rows, bad).is_err(), "{bad}");
        }
        assert!(clip_tensor_rows(&Tensor::new(1.0_f32, &Device::Cpu).unwrap(), 1.0).is_err());
    }
}
