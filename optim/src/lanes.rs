//! One row kernel body for both SIMD and scalar lanes.
//!
//! An optimizer's per-element update is written once, generic over
//! [`Lane`], and [`update_row`] runs it over a row eight values at a time as
//! `wide::f32x8` and over the tail (`dim % 8` values) as plain `f32`. Every
//! operation used (`+ - * /`, `sqrt`, `max`, `abs`, comparisons) is IEEE
//! exact per lane in both forms, so the SIMD part and the tail compute
//! bit-identical results and a row's numbers do not depend on its position.

use std::ops::{Add, Div, Mul, Neg, Sub};
use wide::f32x8;

/// A vector of `f32` lanes (`f32x8`) or a single `f32`, with the operations
/// row kernels use.
pub trait Lane:
    Copy
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
{
    /// Every lane set to `x`.
    fn splat(x: f32) -> Self;
    /// Square root per lane (IEEE, correctly rounded).
    fn sqrt(self) -> Self;
    /// The larger of two values per lane.
    fn max(self, other: Self) -> Self;
    /// The smaller of two values per lane.
    fn min(self, other: Self) -> Self;
    /// Absolute value per lane.
    fn abs(self) -> Self;
    /// `self.powf(exponent)` per lane, with the platform's scalar `powf`.
    fn powf(self, exponent: f32) -> Self;
    /// Per lane: `if self > other { then } else { otherwise }`.
    fn gt_select(self, other: Self, then: Self, otherwise: Self) -> Self;
}

impl Lane for f32 {
    fn splat(x: f32) -> Self {
        x
    }
    fn sqrt(self) -> Self {
        f32::sqrt(self)
    }
    fn max(self, other: Self) -> Self {
        f32::max(self, other)
    }
    fn min(self, other: Self) -> Self {
        f32::min(self, other)
    }
    fn abs(self) -> Self {
        f32::abs(self)
    }
    fn powf(self, exponent: f32) -> Self {
        f32::powf(self, exponent)
    }
    fn gt_select(self, other: Self, then: Self, otherwise: Self) -> Self {
        if self > other {
            then
        } else {
            otherwise
        }
    }
}

impl Lane for f32x8 {
    fn splat(x: f32) -> Self {
        f32x8::splat(x)
    }
    fn sqrt(self) -> Self {
        f32x8::sqrt(self)
    }
    fn max(self, other: Self) -> Self {
        f32x8::max(self, other)
    }
    fn min(self, other: Self) -> Self {
        f32x8::min(self, other)
    }
    fn abs(self) -> Self {
        f32x8::abs(self)
    }
    fn powf(self, exponent: f32) -> Self {
        // `wide`'s own powf is an approximation; TensorFlow's is libm's.
        f32x8::from(self.to_array().map(|x| x.powf(exponent)))
    }
    fn gt_select(self, other: Self, then: Self, otherwise: Self) -> Self {
        use wide::CmpGt;
        self.cmp_gt(other).blend(then, otherwise)
    }
}

/// An optimizer's per-element update with `S` slot values per element:
/// gradient `g`, value `w` and slots `s` in, updated `w` and `s` out.
pub trait LaneKernel<const S: usize> {
    /// Updates one lane group.
    fn run<L: Lane>(&self, g: L, w: &mut L, s: &mut [L; S]);
}

fn load(row: &[f32], at: usize) -> f32x8 {
    let lanes: [f32; 8] = row[at..at + 8].try_into().expect("8 values");
    f32x8::from(lanes)
}

fn store(row: &mut [f32], at: usize, lanes: f32x8) {
    row[at..at + 8].copy_from_slice(&lanes.to_array());
}

/// Runs `kernel` over a row: `grad` and `value` hold `dim` values, `slots`
/// holds `S` slot rows of `dim` values back to back.
pub fn update_row<const S: usize, K: LaneKernel<S>>(
    kernel: &K,
    grad: &[f32],
    value: &mut [f32],
    slots: &mut [f32],
) {
    let dim = value.len();
    debug_assert_eq!(grad.len(), dim);
    debug_assert_eq!(slots.len(), S * dim);
    let simd_end = dim - dim % 8;
    for at in (0..simd_end).step_by(8) {
        let mut w = load(value, at);
        let mut s: [f32x8; S] = std::array::from_fn(|j| load(slots, j * dim + at));
        kernel.run(load(grad, at), &mut w, &mut s);
        store(value, at, w);
        for (j, lanes) in s.into_iter().enumerate() {
            store(slots, j * dim + at, lanes);
        }
    }
    for at in simd_end..dim {
        let mut w = value[at];
        let mut s: [f32; S] = std::array::from_fn(|j| slots[j * dim + at]);
        kernel.run(grad[at], &mut w, &mut s);
        value[at] = w;
        for (j, x) in s.into_iter().enumerate() {
            slots[j * dim + at] = x;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// w -= 0.5 * g; s0 = max(s0, |g|); s1 = sqrt(s1) + g.
    struct Probe;
    impl LaneKernel<2> for Probe {
        fn run<L: Lane>(&self, g: L, w: &mut L, s: &mut [L; 2]) {
            *w = *w - L::splat(0.5) * g;
            s[0] = s[0].max(g.abs());
            s[1] = s[1].sqrt() + g;
        }
    }

    #[test]
    fn simd_lanes_and_the_scalar_tail_agree_bit_for_bit() {
        for dim in [1, 7, 8, 9, 17, 64] {
            let grad: Vec<f32> = (0..dim).map(|i| (i as f32 * 0.37).sin()).collect();
            let mut value: Vec<f32> = (0..dim).map(|i| i as f32 * 0.1).collect();
            let mut slots: Vec<f32> = (0..2 * dim).map(|i| (i % 5) as f32 * 0.3).collect();
            let (v0, s0) = (value.clone(), slots.clone());
            update_row(&Probe, &grad, &mut value, &mut slots);
            for i in 0..dim {
                assert_eq!(value[i].to_bits(), (v0[i] - 0.5 * grad[i]).to_bits());
                assert_eq!(slots[i].to_bits(), s0[i].max(grad[i].abs()).to_bits());
                let expected = s0[dim + i].sqrt() + grad[i];
                assert_eq!(slots[dim + i].to_bits(), expected.to_bits());
            }
        }
    }

    #[test]
    fn gt_select_and_powf_match_scalar() {
        let x = std::hint::black_box(f32x8::from([0.5, 2.0, 3.0, 0.1, 9.0, 1.0, 4.0, 0.25]));
        let picked = x.gt_select(f32x8::splat(1.0), x, f32x8::splat(0.0));
        let powed = Lane::powf(x, 0.7).to_array();
        for (i, v) in x.to_array().into_iter().enumerate() {
            assert_eq!(picked.to_array()[i], if v > 1.0 { v } else { 0.0 });
            // (black_box: LLVM may fold a constant powf with other rounding.)
            let expected = std::hint::black_box(v).powf(std::hint::black_box(0.7));
            assert_eq!(powed[i].to_bits(), expected.to_bits());
        }
    }
}
