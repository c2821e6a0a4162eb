//! [`Dtype`]: how a variable stores its values and its optimizer slots.
//!
//! The API is `f32` whatever the storage: values are rounded to the dtype
//! when they are written and widened back when they are read, and every
//! computation (accumulation, optimizer steps) runs in `f32` on the widened
//! values. Rounding is to nearest, ties to even (IEEE's default, as
//! TensorFlow's and PyTorch's casts do); [`Rounding::Stochastic`] rounds the
//! bf16 writes of optimizer steps stochastically instead.
//!
//! A value *fits* a dtype when it is finite and stays finite once rounded:
//! `70000.0` does not fit `F16` (whose largest value is 65504), and values
//! near `f32::MAX` do not fit `Bf16`. Writing a value that does not fit is an
//! [`Error::OutOfRange`](crate::Error::OutOfRange) and writes nothing, as a
//! non-finite value is an [`Error::NonFinite`](crate::Error::NonFinite).
//! Values too small for the dtype round to its subnormals or to zero, as
//! IEEE rounding does.

use half::{bf16, f16};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// The number format of stored values: TFRA's `value_dtype`. Serialized
/// (in checkpoints' `index.json`) as its [name](Dtype::name).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    /// IEEE single precision, 4 bytes: values are stored exactly.
    #[default]
    F32,
    /// IEEE half precision, 2 bytes: 11 significant bits, largest value
    /// 65504.
    F16,
    /// bfloat16, 2 bytes: 8 significant bits, `f32`'s range.
    Bf16,
}

impl Dtype {
    /// Every dtype.
    pub const ALL: [Dtype; 3] = [Dtype::F32, Dtype::F16, Dtype::Bf16];

    /// Bytes per stored value.
    pub fn size_bytes(self) -> usize {
        match self {
            Dtype::F32 => 4,
            Dtype::F16 | Dtype::Bf16 => 2,
        }
    }

    /// The lower-case name (`"f32"`, `"f16"`, `"bf16"`), as
    /// [`FromStr`] reads it.
    pub fn name(self) -> &'static str {
        match self {
            Dtype::F32 => "f32",
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
        }
    }

    /// `value` rounded to the dtype, to nearest even, and widened back to
    /// `f32`: what storing `value` and reading it back gives. A value that
    /// does not [fit](Dtype::fits) rounds to an infinity.
    pub fn round(self, value: f32) -> f32 {
        match self {
            Dtype::F32 => value,
            Dtype::F16 => f16::from_f32(value).to_f32(),
            Dtype::Bf16 => bf16::from_f32(value).to_f32(),
        }
    }

    /// Rounds every element of `values` in place (see [`Dtype::round`]).
    pub fn round_slice(self, values: &mut [f32]) {
        match self {
            Dtype::F32 => {}
            Dtype::F16 => {
                for v in values {
                    *v = f16::from_f32(*v).to_f32();
                }
            }
            // bf16 is the top half of an f32: round the low half away, to
            // nearest even, with integer adds (NaN stays NaN: its rounding
            // keeps an exponent of all ones and is made quiet).
            Dtype::Bf16 => {
                for v in values {
                    let bits = v.to_bits();
                    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) & 0xffff_0000;
                    let quiet = bits | 0x0040_0000;
                    // A select, not a branch, so the loop vectorizes.
                    *v = f32::from_bits(if v.is_nan() { quiet } else { rounded });
                }
            }
        }
    }

    /// Whether `value` is finite and stays finite rounded to the dtype.
    pub fn fits(self, value: f32) -> bool {
        value.is_finite() && self.round(value).is_finite()
    }

    /// Whether `value` may start a slot column of this dtype: it
    /// [fits](Dtype::fits), and is 0 or stays nonzero rounded (1e-9 rounds
    /// to 0 in f16, which would silently start an accumulator at 0 and
    /// make Adagrad or FTRL divide by it).
    pub fn fits_initial(self, value: f32) -> bool {
        self.fits(value) && (value == 0.0 || self.round(value) != 0.0)
    }

    /// The first element of `values` that is finite but does not
    /// [fit](Dtype::fits) the dtype (non-finite elements are not looked
    /// at: they are another error).
    pub fn first_out_of_range(self, values: &[f32]) -> Option<usize> {
        if self == Dtype::F32 {
            return None;
        }
        let limit = self.unfit_magnitude();
        first_where(values, |v| v.is_finite() && v.abs() >= limit)
    }

    /// The first element of `values` that does not [fit](Dtype::fits) the
    /// dtype: not finite, or out of range. One pass.
    pub(crate) fn first_unfit(self, values: &[f32]) -> Option<usize> {
        let limit = self.unfit_magnitude();
        first_where(values, |v| !v.is_finite() || v.abs() >= limit)
    }

    /// The smallest magnitude that does not fit: half-way between the
    /// largest finite value and the next power of two (it rounds to
    /// infinity), or infinity for `f32`.
    fn unfit_magnitude(self) -> f32 {
        match self {
            Dtype::F32 => f32::INFINITY,
            Dtype::F16 => 65520.0,
            Dtype::Bf16 => f32::from_bits(0x7f7f_8000),
        }
    }
}

/// The first element of `values` that is `out`: blocks without an early
/// exit, which the compiler vectorizes; the block with one is searched.
#[inline]
fn first_where(values: &[f32], out: impl Fn(f32) -> bool) -> Option<usize> {
    const BLOCK: usize = 16;
    values.chunks(BLOCK).enumerate().find_map(|(b, block)| {
        block
            .iter()
            .fold(false, |any, &v| any | out(v))
            .then(|| b * BLOCK + block.iter().position(|&v| out(v)).unwrap_or(0))
    })
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Dtype {
    type Err = crate::Error;

    /// `"f32"`, `"f16"` or `"bf16"` (case-insensitive; `"float32"`,
    /// `"float16"`, `"half"` and `"bfloat16"` too).
    fn from_str(s: &str) -> crate::Result<Dtype> {
        match s.to_ascii_lowercase().as_str() {
            "f32" | "float32" => Ok(Dtype::F32),
            "f16" | "float16" | "half" => Ok(Dtype::F16),
            "bf16" | "bfloat16" => Ok(Dtype::Bf16),
            _ => Err(crate::Error::InvalidArgument(format!(
                "unknown dtype {s:?}: expected f32, f16 or bf16"
            ))),
        }
    }
}

/// How optimizer steps ([`Variable::update_rows`](crate::Variable::update_rows))
/// round what they write to a half-precision column.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Rounding {
    /// To nearest, ties to even: the same as every other write.
    #[default]
    NearestEven,
    /// bf16 columns round stochastically: up with a probability equal to
    /// the distance from the value below, so that small updates survive on
    /// average instead of rounding away (FBGEMM's default for bf16 tables).
    /// The random bits come from `seed`, the row's key, its version (how
    /// often the row id has been written) and the column, so a run repeated
    /// from the same start with the same seed stores the same bits, as long
    /// as each key gets the same row id (one thread, no removals or
    /// evictions). A checkpoint does not keep versions: a run resumed from
    /// one draws other bits than an uninterrupted run (alike in
    /// distribution). F16 and F32 columns, and writes other than optimizer
    /// steps, round to nearest even.
    Stochastic {
        /// Selects the random bits.
        seed: u64,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_is_to_nearest_even() {
        // 1 + 2^-11 is half-way between two f16 values: ties go to even.
        assert_eq!(Dtype::F16.round(1.0 + 2f32.powi(-11)), 1.0);
        assert_eq!(
            Dtype::F16.round(1.0 + 3.0 * 2f32.powi(-11)),
            1.0 + 2f32.powi(-9)
        );
        assert_eq!(Dtype::Bf16.round(1.0 + 2f32.powi(-8)), 1.0);
        assert_eq!(
            Dtype::Bf16.round(1.0 + 3.0 * 2f32.powi(-8)),
            1.0 + 2f32.powi(-6)
        );
        assert_eq!(Dtype::F32.round(0.1), 0.1);
    }

    #[test]
    fn range_limits_are_exact() {
        assert!(Dtype::F16.fits(65504.0));
        assert!(Dtype::F16.fits(65519.99));
        assert!(!Dtype::F16.fits(65520.0));
        assert!(!Dtype::F16.fits(70000.0));
        assert!(!Dtype::F16.fits(-70000.0));
        let below = f32::from_bits(0x7f7f_7fff);
        assert!(Dtype::Bf16.fits(below));
        assert!(!Dtype::Bf16.fits(f32::from_bits(0x7f7f_8000)));
        assert!(!Dtype::Bf16.fits(f32::MAX));
        assert!(Dtype::F32.fits(f32::MAX));
        for dtype in Dtype::ALL {
            assert!(!dtype.fits(f32::NAN));
            for v in [65519.99f32, 65520.0, below, f32::from_bits(0x7f7f_8000)] {
                let fits = dtype.first_out_of_range(&[v]).is_none();
                assert_eq!(fits, dtype.fits(v), "{dtype} {v}");
            }
        }
        assert_eq!(
            Dtype::F16.first_out_of_range(&[1.0, f32::NAN, -1e5]),
            Some(2)
        );
    }

    #[test]
    fn first_unfit_finds_the_first_value_that_does_not_fit() {
        let edges = [
            1.0,
            65504.0,
            65520.0,
            -7e4,
            65519.99,
            f32::MAX,
            f32::from_bits(0x7f7f_7fff),
            f32::from_bits(0x7f7f_8000),
            f32::NAN,
            f32::INFINITY,
            -0.0,
        ];
        for dtype in Dtype::ALL {
            for len in [0, 1, 15, 16, 17, 40] {
                for at in 0..len {
                    for &bad in &edges {
                        let mut values = vec![0.5f32; len];
                        values[at] = bad;
                        let naive = values.iter().position(|&v| !dtype.fits(v));
                        assert_eq!(dtype.first_unfit(&values), naive, "{dtype} {bad} at {at}");
                    }
                }
            }
        }
    }

    #[test]
    fn round_slice_rounds_as_round_does() {
        let mut bits: u32 = 0x1234_5678;
        let mut values: Vec<f32> = (0..20_000)
            .map(|_| {
                bits = bits.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                f32::from_bits(bits)
            })
            .collect();
        values.extend([
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            f32::MIN,
        ]);
        for dtype in Dtype::ALL {
            let mut rounded = values.clone();
            dtype.round_slice(&mut rounded);
            for (v, r) in values.iter().zip(&rounded) {
                let want = dtype.round(*v);
                assert!(
                    want.to_bits() == r.to_bits() || (want.is_nan() && r.is_nan()),
                    "{dtype} {v:e}: {r:e} vs {want:e}"
                );
            }
        }
    }

    #[test]
    fn names_parse_back() {
        for dtype in Dtype::ALL {
            assert_eq!(dtype.name().parse::<Dtype>().unwrap(), dtype);
            assert_eq!(dtype.to_string(), dtype.name());
        }
        assert_eq!("BFloat16".parse::<Dtype>().unwrap(), Dtype::Bf16);
        assert!("f64".parse::<Dtype>().is_err());
    }
}
